//! The recovery loop: scan for abandoned sagas, claim each through the same CAS takeover the
//! consumer uses, and drive it with the same [`Driver`].
//!
//! The worker has no rules of its own. What to do with a saga is the planner's; who may do it
//! is the row's lease (the claim bumps the epoch, and every later write names it); when to come
//! back is the row's `next_attempt_at_ms`, which the scan respects. So any number of workers
//! (and consumers) may run over one table: the loser of a claim just moves on.
//!
//! Bounded: one scan page in memory, at most `concurrency_max` drives at once, and a shutdown
//! that waits at most `drain_timeout_ms` for drives to reach a durable point.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use midflight_driver::{Downstream, Driver, DriverSettings, Outcome, Takeover};
use midflight_model::{Rules, Saga};
use midflight_store::{ScanCursor, Store};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::RecoverySection;

/// Longest one statement of the recovery scan may go unanswered before the scan counts as
/// failed (and is started again at the next interval).
const SCAN_DEADLINE: Duration = Duration::from_secs(30);

/// `statement`, failed as [`midflight_store::Error::Unanswered`] after [`SCAN_DEADLINE`].
pub(crate) async fn bounded<T>(
    operation: &'static str,
    statement: impl std::future::Future<Output = Result<T, midflight_store::Error>>,
) -> Result<T, midflight_store::Error> {
    let after_ms = u64::try_from(SCAN_DEADLINE.as_millis()).unwrap_or(u64::MAX);
    tokio::time::timeout(SCAN_DEADLINE, statement)
        .await
        .unwrap_or(Err(midflight_store::Error::Unanswered { operation, after_ms }))
}

/// What one worker did so far (a metrics exporter reads these later).
#[derive(Debug, Default)]
pub struct Stats {
    /// Scan pages read.
    pub scans: AtomicU64,
    /// Rows skipped because an earlier saga of their order is unfinished.
    pub skipped_blocked: AtomicU64,
    /// Rows the scan matched but could not read, counted at every scan that meets them: a
    /// rate above zero means sagas no one can drive until a person repairs their row.
    pub unreadable: AtomicU64,
    /// Claims won, and claims lost to someone faster.
    pub claimed: AtomicU64,
    pub claims_lost: AtomicU64,
    /// How claimed drives ended.
    pub finished: AtomicU64,
    pub handed_off: AtomicU64,
    pub lost: AtomicU64,
    pub stopped: AtomicU64,
    pub failed: AtomicU64,
    /// What the purge deleted (sagas, their log rows, their outbox rows), its failed batches,
    /// and its batches rolled back because a listed saga changed (a ticket opened for it; on
    /// SQLite also another purger taking it).
    pub purged_sagas: AtomicU64,
    pub purged_transitions: AtomicU64,
    pub purged_outbox: AtomicU64,
    pub purge_failures: AtomicU64,
    pub purge_rolled_back: AtomicU64,
    /// Purge rounds that deleted nothing because they may not (the order topic keeps messages
    /// for ever, or has not been read yet), and reads of the topic's retention that failed (the
    /// last reading, if any, stayed in force).
    pub purge_held: AtomicU64,
    pub purge_topic_unread: AtomicU64,
    /// Purge rounds that kept finished sagas past the horizon because no periodic
    /// reconciliation had judged them yet (none has completed, or the last is that far behind).
    pub purge_unreconciled: AtomicU64,
    /// Samples of the saga table (the gauges of rows, ages, tickets) that failed or did not
    /// answer in time: while they fail, those gauges keep their last values.
    pub table_sample_failures: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    pub scans: u64,
    pub skipped_blocked: u64,
    pub unreadable: u64,
    pub claimed: u64,
    pub claims_lost: u64,
    pub finished: u64,
    pub handed_off: u64,
    pub lost: u64,
    pub stopped: u64,
    pub failed: u64,
    pub purged_sagas: u64,
    pub purged_transitions: u64,
    pub purged_outbox: u64,
    pub purge_failures: u64,
    pub purge_rolled_back: u64,
    pub purge_held: u64,
    pub purge_topic_unread: u64,
    pub purge_unreconciled: u64,
    pub table_sample_failures: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StatsSnapshot {
            scans: get(&self.scans),
            skipped_blocked: get(&self.skipped_blocked),
            unreadable: get(&self.unreadable),
            claimed: get(&self.claimed),
            claims_lost: get(&self.claims_lost),
            finished: get(&self.finished),
            handed_off: get(&self.handed_off),
            lost: get(&self.lost),
            stopped: get(&self.stopped),
            failed: get(&self.failed),
            purged_sagas: get(&self.purged_sagas),
            purged_transitions: get(&self.purged_transitions),
            purged_outbox: get(&self.purged_outbox),
            purge_failures: get(&self.purge_failures),
            purge_rolled_back: get(&self.purge_rolled_back),
            purge_held: get(&self.purge_held),
            purge_topic_unread: get(&self.purge_topic_unread),
            purge_unreconciled: get(&self.purge_unreconciled),
            table_sample_failures: get(&self.table_sample_failures),
        }
    }

    /// `claimed` counts claims won; a claim whose statement failed counts as `failed` only.
    fn count(&self, takeover: &Takeover) {
        let counter = match takeover {
            Takeover::Lost => &self.claims_lost,
            Takeover::ClaimFailed(_) | Takeover::Drove(Outcome::Failed(_)) => &self.failed,
            Takeover::Drove(Outcome::Finished(_)) => &self.finished,
            Takeover::Drove(Outcome::HandedOff) => &self.handed_off,
            Takeover::Drove(Outcome::Lost) => &self.lost,
            Takeover::Drove(Outcome::Stopped) => &self.stopped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if matches!(takeover, Takeover::Drove(_)) {
            self.claimed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One recovery worker: a process incarnation with its own owner id.
#[derive(Debug)]
pub struct Worker<D> {
    driver: Driver<D>,
    section: RecoverySection,
    shutdown: CancellationToken,
    stats: Arc<Stats>,
}

/// A fresh owner id: unique per process incarnation, so a restarted worker never mistakes a
/// lease of its previous life for its own.
pub fn owner_id(instance: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{instance}-{}-{}", std::process::id(), &random[..12])
}

impl<D: Downstream> Worker<D> {
    /// A worker with a fresh owner id; drives stop at their next call once `shutdown` fires.
    pub fn new(
        store: Store,
        downstream: D,
        rules: Rules,
        driver_settings: DriverSettings,
        section: RecoverySection,
        shutdown: CancellationToken,
    ) -> Worker<D> {
        let owner = owner_id(&section.instance);
        let actor = format!("recovery:{owner}");
        let driver = Driver::new(store, downstream, rules, driver_settings, owner, actor, shutdown.clone());
        Worker { driver, section, shutdown, stats: Arc::new(Stats::default()) }
    }

    pub fn owner(&self) -> &str {
        self.driver.owner()
    }

    /// The worker's counters, shared: they keep counting while [`Worker::run`] runs.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Scans and drives until `shutdown`, then drains; returns what it did (the service logs it
    /// in its stop line with what its store wrote). Database errors during a scan are logged
    /// and retried at the next interval: the worker outlives a database restart.
    pub async fn run(self) -> StatsSnapshot {
        tracing::info!(owner = self.owner(), "recovery worker started");
        let permits = Arc::new(Semaphore::new(self.section.concurrency_max));
        let mut drives = JoinSet::new();
        let mut cursor: Option<ScanCursor> = None;
        let mut reported = Reported::default();
        let mut next_scan_at = Instant::now();
        while !self.shutdown.is_cancelled() {
            if cursor.is_none() {
                // A scan starts every interval, however long walking the last one took.
                next_scan_at = Instant::now() + millis(self.section.scan_interval_ms);
            }
            while drives.try_join_next().is_some() {}
            match self.scan_page(cursor.as_ref(), &permits, &mut drives, &mut reported).await {
                Ok(next) => {
                    cursor = next;
                    if cursor.is_none() {
                        reported.walk_ended();
                    }
                }
                Err(error) => {
                    // The walk starts over; what it met so far stays reported.
                    tracing::warn!(owner = self.owner(), %error, "recovery scan failed; retrying at the next interval");
                    cursor = None;
                }
            }
            // A full page means more backlog behind it: read on at once. Otherwise rest.
            if cursor.is_none() {
                tokio::select! {
                    _ = tokio::time::sleep_until(next_scan_at.into()) => {}
                    _ = self.shutdown.cancelled() => {}
                }
            }
        }
        self.drain(drives).await;
        self.stats.snapshot()
    }

    /// Reads one page after `cursor` and starts a drive for each claimable row (waiting for a
    /// free slot when `concurrency_max` drives run). Rows that cannot be read are counted and
    /// stepped over. Returns the cursor of the next page, or `None` when this page was the last.
    async fn scan_page(
        &self,
        cursor: Option<&ScanCursor>,
        permits: &Arc<Semaphore>,
        drives: &mut JoinSet<()>,
        reported: &mut Reported,
    ) -> Result<Option<ScanCursor>, midflight_store::Error> {
        // Bounded, so a statement that never answers (a black-holed connection) fails this scan
        // instead of stopping every later one.
        let scan = self.driver.store().abandoned_after(cursor, self.section.scan_batch);
        let page = bounded("the recovery scan", scan).await?;
        self.stats.scans.fetch_add(1, Ordering::Relaxed);
        for row in &page.unreadable {
            self.stats.unreadable.fetch_add(1, Ordering::Relaxed);
            if reported.first_time(&row.biz_id) {
                tracing::error!(
                    owner = self.owner(),
                    biz_id = %row.biz_id,
                    error = %row.error,
                    "saga row cannot be read; recovery steps over it until the row is repaired (logged once while it stays so)"
                );
            }
        }
        let next = page.next;
        for saga in page.sagas {
            // Nothing new is taken over once shutdown began: the drain only waits for drives
            // already running.
            if self.shutdown.is_cancelled() {
                return Ok(None);
            }
            if self.blocked(&saga).await? {
                continue;
            }
            let permit = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Ok(None),
                permit = permits.clone().acquire_owned() => permit,
            };
            let Ok(permit) = permit else { return Ok(None) };
            let (driver, stats, shutdown) = (self.driver.clone(), self.stats.clone(), self.shutdown.clone());
            drives.spawn(async move {
                if shutdown.is_cancelled() {
                    return;
                }
                stats.count(&driver.take_over(&saga.biz_id).await);
                drop(permit);
            });
        }
        Ok(next)
    }

    /// Whether the row waits for an earlier saga of its order; such rows are left alone
    /// (no claim, no log line) until that saga finishes.
    async fn blocked(&self, saga: &Saga) -> Result<bool, midflight_store::Error> {
        let blocked = bounded("the recovery scan's order check", self.driver.blocked_by(saga)).await?.is_some();
        if blocked {
            self.stats.skipped_blocked.fetch_add(1, Ordering::Relaxed);
        }
        Ok(blocked)
    }

    /// Waits for running drives (they stop before their next call and release their lease);
    /// past `drain_timeout_ms` the rest are aborted and their leases left to expire.
    async fn drain(&self, mut drives: JoinSet<()>) {
        let deadline = Instant::now() + millis(self.section.drain_timeout_ms);
        while !drives.is_empty() {
            match tokio::time::timeout_at(deadline.into(), drives.join_next()).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(owner = self.owner(), running = drives.len(), "drain timed out; aborting drives");
                    drives.abort_all();
                    while drives.join_next().await.is_some() {}
                }
            }
        }
    }
}

/// Which unreadable rows were logged, so each is logged once while it stays unreadable (the
/// counter still counts it at every scan). Bounded: past [`REPORTED_MAX`] rows a walk logs
/// no more of them.
#[derive(Debug, Default)]
struct Reported {
    /// Logged before this walk, and met again in this one.
    logged: HashSet<String>,
    this_walk: HashSet<String>,
}

/// Most unreadable rows one worker remembers having logged.
const REPORTED_MAX: usize = 1_000;

impl Reported {
    /// Whether `biz_id` is to be logged now: it was not met in the last walk, and the bound is
    /// not reached.
    fn first_time(&mut self, biz_id: &str) -> bool {
        if self.this_walk.len() >= REPORTED_MAX || !self.this_walk.insert(biz_id.to_owned()) {
            return false;
        }
        !self.logged.contains(biz_id)
    }

    /// A walk of the whole backlog ended (not one cut short by a failed scan, which starts
    /// over and keeps what it met): a row met again is not logged again; a row repaired and
    /// later unreadable once more is.
    fn walk_ended(&mut self) {
        self.logged = std::mem::take(&mut self.this_walk);
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each unreadable row is logged the first time a walk meets it, not again while later
    /// walks keep meeting it, and again if a walk passed without it (repaired, then broken again).
    #[test]
    fn an_unreadable_row_is_logged_once_while_it_stays() {
        let mut reported = Reported::default();
        assert!(reported.first_time("a"));
        assert!(!reported.first_time("a"), "met twice in one walk (a scan failed and the walk started over)");
        assert!(reported.first_time("b"));
        reported.walk_ended();
        assert!(!reported.first_time("a") && !reported.first_time("b"), "met again in the next walk");
        reported.walk_ended();
        assert!(!reported.first_time("a"));
        reported.walk_ended();
        // "b" was repaired: the walk above did not meet it.
        assert!(reported.first_time("b"), "broken again: logged again");
    }

    #[test]
    fn logging_unreadable_rows_is_bounded() {
        let mut reported = Reported::default();
        let logged = (0..REPORTED_MAX + 10).filter(|i| reported.first_time(&format!("r{i}"))).count();
        assert_eq!(logged, REPORTED_MAX);
        reported.walk_ended();
        assert_eq!(reported.logged.len(), REPORTED_MAX, "it remembers at most the bound");
        assert!(!reported.first_time("r0"), "a remembered row is not logged again");
    }

    /// A scan or purge statement that never answers (a black-holed connection) fails at the
    /// deadline, naming what it was, so the next interval tries again; one that answers passes
    /// its answer through.
    #[tokio::test(start_paused = true)]
    async fn a_statement_that_never_answers_fails_at_the_deadline() {
        let started = tokio::time::Instant::now();
        let never = std::future::pending::<Result<u32, midflight_store::Error>>();
        let error = bounded("the recovery scan", never).await.expect_err("cut off");
        assert_eq!(started.elapsed(), SCAN_DEADLINE);
        assert!(
            matches!(error, midflight_store::Error::Unanswered { operation: "the recovery scan", after_ms: 30_000 }),
            "{error:?}"
        );
        assert!(error.to_string().contains("the recovery scan"), "{error}");
        let answered = bounded("the recovery scan", async { Ok(7) }).await.expect("answered");
        assert_eq!(answered, 7);
    }
}
