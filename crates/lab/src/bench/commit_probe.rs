//! The database's own commit latency while a phase runs. The lab commits a one-row update every
//! `EVERY` on a database of its own beside the system's (a fresh database on the same server, or
//! a SQLite file on the same disk) and times each commit. A system's latency tail can then be
//! read against the database's: when the server's commits slow down (its log's flushes wait on
//! the disk), every client's do, the probe's too.
//!
//! The probe's updates reach the server's global counters; the phase takes them out of the
//! write statements it reports. Its commits stay in the server's log writes (10 a second) and
//! its work in the database server's CPU.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use sea_orm::{ConnectionTrait, Database, Statement};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::ceiling::Scratch;
use super::phase::percentile;

/// How often the probe commits: light beside a system's hundreds of commits a second.
pub const EVERY: Duration = Duration::from_millis(100);

/// What the probe saw over a phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CommitLatency {
    /// Commits timed (each one autocommitted single-row update).
    pub commits: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Why the probe stopped early, when it did (its commits until then are counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Each commit: seconds since loading started when it finished, microseconds it took.
    #[serde(skip)]
    pub timeline: Vec<(f64, i64)>,
}

impl CommitLatency {
    pub(crate) fn from_timeline(timeline: Vec<(f64, i64)>, error: Option<String>) -> CommitLatency {
        let mut micros: Vec<i64> = timeline.iter().map(|(_, us)| *us).collect();
        micros.sort_unstable();
        let ms = |q: f64| percentile(&micros, q).map(|us| us as f64 / 1000.0);
        CommitLatency { commits: micros.len(), p50_ms: ms(0.50), p99_ms: ms(0.99), max_ms: ms(1.0), error, timeline }
    }

    /// The slowest commit finished in each second since loading started, in ms (a commit counts
    /// when it finished, as a message counts when it finished).
    pub fn max_by_second(&self) -> BTreeMap<i64, f64> {
        let mut out: BTreeMap<i64, f64> = BTreeMap::new();
        for (t_s, us) in &self.timeline {
            let slowest = out.entry(t_s.floor() as i64).or_default();
            *slowest = slowest.max(*us as f64 / 1000.0);
        }
        out
    }
}

/// A probe whose database and table are ready, not yet committing.
pub struct Prepared {
    scratch: Scratch,
    db: sea_orm::DatabaseConnection,
}

/// Each commit (seconds since loading started when it finished, microseconds it took), and why
/// the probe stopped early if it did.
type Timeline = (Vec<(f64, i64)>, Option<String>);

/// A probe committing in the background until `stop`.
pub struct CommitProbe {
    scratch: Scratch,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Timeline>,
}

/// Creates the probe's database and its one row (before the phase reads the server's counters,
/// so that its setup stays out of them).
pub async fn prepare(mysql_url: Option<&str>, dir: &Path) -> anyhow::Result<Prepared> {
    let scratch = Scratch::create(mysql_url, dir, "probe").await?;
    let ready = async {
        let db = Database::connect(scratch.options(1)).await.context("commit probe: cannot connect")?;
        let setup = async {
            db.execute_unprepared("CREATE TABLE commit_probe (id INT NOT NULL PRIMARY KEY, n BIGINT NOT NULL)").await?;
            db.execute_unprepared("INSERT INTO commit_probe (id, n) VALUES (1, 0)").await
        };
        if let Err(error) = setup.await {
            db.close().await.ok();
            return Err(anyhow::Error::new(error).context("commit probe: cannot create its table"));
        }
        anyhow::Ok(db)
    };
    match ready.await {
        Ok(db) => Ok(Prepared { scratch, db }),
        Err(error) => {
            scratch.remove().await;
            Err(error)
        }
    }
}

impl Prepared {
    /// Drops the probe's database without having run it (the phase failed first).
    pub async fn discard(self) {
        self.db.close().await.ok();
        self.scratch.remove().await;
    }

    /// Starts committing every `EVERY`; times are taken from `started` (loading's start).
    pub fn start(self, started: Instant) -> CommitProbe {
        let (stop, mut stopped) = oneshot::channel();
        let db = self.db;
        let task = tokio::spawn(async move {
            let mut timeline = Vec::new();
            let mut ticks = tokio::time::interval(EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let update =
                Statement::from_string(db.get_database_backend(), "UPDATE commit_probe SET n = n + 1 WHERE id = 1");
            let error = loop {
                tokio::select! {
                    _ = &mut stopped => break None,
                    _ = ticks.tick() => {}
                }
                let at = Instant::now();
                if let Err(error) = db.execute_raw(update.clone()).await {
                    break Some(format!("commit probe: {error}"));
                }
                let done = Instant::now();
                let micros = i64::try_from(done.duration_since(at).as_micros()).unwrap_or(i64::MAX);
                timeline.push((done.duration_since(started).as_secs_f64(), micros));
            };
            db.close().await.ok();
            (timeline, error)
        });
        CommitProbe { scratch: self.scratch, stop, task }
    }
}

impl CommitProbe {
    /// Stops the probe and sums up what it saw. Its database stays until the caller removes it
    /// (after reading the server's counters, so that the drop stays out of them).
    pub async fn stop(self) -> (CommitLatency, Scratch) {
        let _ = self.stop.send(());
        let (timeline, error) = match self.task.await {
            Ok(done) => done,
            Err(error) => (Vec::new(), Some(format!("commit probe: its task failed: {error}"))),
        };
        (CommitLatency::from_timeline(timeline, error), self.scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_up_the_timeline_and_keeps_each_seconds_slowest() {
        let timeline = vec![(0.05, 900), (0.15, 1_100), (1.02, 37_000), (1.5, 800), (2.9, 1_000)];
        let latency = CommitLatency::from_timeline(timeline, None);
        assert_eq!(latency.commits, 5);
        assert_eq!(latency.p50_ms, Some(1.0));
        assert_eq!(latency.max_ms, Some(37.0));
        let by_second: Vec<_> = latency.max_by_second().into_iter().collect();
        assert_eq!(by_second, vec![(0, 1.1), (1, 37.0), (2, 1.0)]);
        assert_eq!(CommitLatency::from_timeline(Vec::new(), None).p99_ms, None);
    }

    /// Three commits at the probe's pace, then `stop` and `remove`: each timed in order,
    /// nothing left on the server.
    async fn times_commits_until_finished(mysql_url: Option<&str>) {
        let dir = std::env::temp_dir().join(format!("midflight-probe-{}", uuid::Uuid::new_v4()));
        let probe = prepare(mysql_url, &dir).await.expect("prepare the probe").start(Instant::now());
        // The probe's row, read over a connection of the test's own.
        let db = Database::connect(probe.scratch.url()).await.expect("connect to the probe's database");
        let count = Statement::from_string(db.get_database_backend(), "SELECT n FROM commit_probe");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let row = db.query_one_raw(count.clone()).await.expect("read the probe's row").expect("its row");
            if row.try_get::<i64>("", "n").expect("its count") >= 3 {
                break;
            }
            assert!(Instant::now() < deadline, "the probe did not commit three times in 30 s");
            tokio::time::sleep(EVERY).await;
        }
        db.close().await.ok();
        let database = probe.scratch.database().map(str::to_owned);
        assert_eq!(database.is_some(), mysql_url.is_some());
        let (latency, scratch) = probe.stop().await;
        scratch.remove().await;
        assert!(latency.commits >= 3, "{latency:?}");
        assert_eq!(latency.error, None);
        assert!(latency.timeline.windows(2).all(|w| w[0].0 <= w[1].0), "{latency:?}");
        assert!(latency.p50_ms.is_some_and(|p50| p50 > 0.0), "{latency:?}");
        if let (Some(server), Some(name)) = (mysql_url, database) {
            assert!(!crate::system::server_has_database(server, &name).await, "{name} was left on the server");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn times_commits_on_a_sqlite_file_until_finished() {
        times_commits_until_finished(None).await;
    }

    #[tokio::test]
    async fn times_commits_on_mysql_until_finished() {
        let Some(server) = midflight_store::testing::mysql_server_url() else { return };
        times_commits_until_finished(Some(&server)).await;
    }
}
