//! Deleting finished sagas past the horizon of [`PurgeSection`], a batch (one transaction) at a
//! time: batches follow each other `pause_ms` apart while each deletes sagas from a full
//! listing of candidates ([`Purged::more_after`]), then the purge waits `interval_ms`. Several
//! workers may purge at once: on MySQL each locks its batch among twice as many listed
//! candidates, stepping over the rows another worker holds, so two workers delete different
//! batches side by side ([`Store::purge_finished`]); one whose batch came back short because
//! the other held some of what it listed goes on after `pause_ms`. On SQLite (one
//! writer) they list the same oldest candidates: when two take the same batch, one deletes it
//! and the other's is rolled back (it deleted nothing) and waits `interval_ms`.
//!
//! With a reader of the order topic ([`crate::retention`]), the horizon in force is the longer
//! of `after_hours` and what the topic keeps plus an hour, read before the first batch and
//! again once the last reading is `interval_ms` old. Nothing is purged until the topic has been
//! read once, nor while it keeps messages for ever; a read that fails later leaves the last
//! reading in force.
//!
//! With periodic reconciliation on, the purge also keeps every saga the reconciliation has not
//! yet compared with the ledgers: those whose last lease ended at or after the `since_ms` of its
//! checkpoint (a pass judges the sagas finished since its checkpoint's `since_ms`), and all of
//! them while no pass has completed. A saga purged before it was judged would be judged by its
//! business row only, which knows less (no voucher, no lease history).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use midflight_store::{Purged, Store};
use tokio_util::sync::CancellationToken;

use crate::config::PurgeSection;
use crate::reconcile::CHECKPOINT;
use crate::retention::{Retention, RetentionError, TopicReader};
use crate::telemetry;
use crate::worker::{Stats, bounded};

/// Purges until `shutdown`; returns at once when purging is off. A batch cut off by shutdown
/// is rolled back whole: its rows are deleted by a later one. `topic` reads the order topic's
/// retention (none: `section.after_hours` is trusted as it is); with `reconciled`, only sagas
/// the periodic reconciliation has judged are purged.
pub async fn purge_periodically(
    store: Store,
    section: PurgeSection,
    topic: Option<TopicReader>,
    reconciled: bool,
    stats: Arc<Stats>,
    shutdown: CancellationToken,
) {
    let Some(configured) = section.horizon() else { return };
    tracing::info!(after_hours = section.after_hours, reconciled, "purging finished sagas past the horizon");
    if !reconciled {
        tracing::warn!(
            "periodic reconciliation is off (recovery.reconcile_interval_ms = 0): finished sagas are purged whether \
             or not a reconciliation compared them with the downstream ledgers"
        );
    }
    let mut horizon = Horizon::new(configured, topic, Duration::from_millis(section.interval_ms));
    let mut judged = reconciled.then(Judged::default);
    // The first batch comes soon after start: a backlog is worked off from the start.
    let mut pause = Duration::from_millis(section.pause_ms);
    let mut round = Purged::default();
    // Where the reconciliation got to, read once a round (full batches follow on it).
    let mut round_bound: Option<i64> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.cancelled() => return,
        }
        let in_force = tokio::select! {
            in_force = horizon.in_force(&stats) => in_force,
            () = shutdown.cancelled() => return,
        };
        let Some(in_force) = in_force else {
            stats.purge_held.fetch_add(1, Ordering::Relaxed);
            round_bound = None;
            pause = Duration::from_millis(section.interval_ms);
            continue;
        };
        let older_than_ms = i64::try_from(in_force.as_millis()).unwrap_or(i64::MAX);
        let judged_before_ms = match &mut judged {
            None => None,
            Some(_) if round_bound.is_some() => round_bound,
            Some(judged) => match tokio::select! {
                bound = judged.bound(&store, older_than_ms, &stats) => bound,
                () = shutdown.cancelled() => return,
            } {
                Ok(Some(since_ms)) => Some(since_ms),
                // No reconciliation has completed: nothing is judged yet.
                Ok(None) => {
                    pause = Duration::from_millis(section.interval_ms);
                    continue;
                }
                Err(error) => {
                    stats.purge_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%error, "cannot read where the reconciliation got to; purging at the next interval");
                    pause = Duration::from_millis(section.interval_ms);
                    continue;
                }
            },
        };
        let purge = store.purge_finished(older_than_ms, judged_before_ms, section.batch_rows);
        let batch = tokio::select! {
            result = bounded("purge finished sagas", purge) => result,
            () = shutdown.cancelled() => return,
        };
        let full = match batch {
            Ok(purged) => {
                stats.purged_sagas.fetch_add(purged.sagas, Ordering::Relaxed);
                stats.purged_transitions.fetch_add(purged.transitions, Ordering::Relaxed);
                stats.purged_outbox.fetch_add(purged.outbox, Ordering::Relaxed);
                stats.purge_rolled_back.fetch_add(purged.rolled_back, Ordering::Relaxed);
                round += purged;
                purged.more_after(section.batch_rows)
            }
            Err(error) => {
                stats.purge_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "purge batch failed; trying again at the next interval");
                false
            }
        };
        if full {
            round_bound = judged_before_ms;
            pause = Duration::from_millis(section.pause_ms);
            continue;
        }
        round_bound = None;
        if round.sagas > 0 {
            tracing::info!(
                sagas = round.sagas,
                transitions = round.transitions,
                outbox = round.outbox,
                "purged finished sagas past the horizon"
            );
        }
        round = Purged::default();
        pause = Duration::from_millis(section.interval_ms);
    }
}

/// The horizon in force: the configured one, checked against the order topic when there is a
/// reader of it.
struct Horizon {
    configured: Duration,
    topic: Option<TopicReader>,
    /// How old the last reading may get before the next batch reads again.
    read_every: Duration,
    /// The last reading that succeeded, and when the last try was made.
    retention: Option<Retention>,
    tried_at: Option<Instant>,
    /// What the last failed try said, so that a failure is logged when it starts or changes.
    failing: Option<String>,
    /// The horizon last exported and logged (`Some(None)`: nothing may be purged).
    exported: Option<Option<Duration>>,
}

impl Horizon {
    fn new(configured: Duration, topic: Option<TopicReader>, read_every: Duration) -> Horizon {
        if topic.is_none() {
            tracing::warn!(
                "the purge horizon is not checked against the order topic (no kafka section): purge.after_hours must \
                 be longer than the topic keeps a message (retention.ms plus segment.ms), or a message read again \
                 after its saga is purged is processed again"
            );
        }
        Horizon { configured, topic, read_every, retention: None, tried_at: None, failing: None, exported: None }
    }

    /// The horizon to purge past now, reading the topic again when the last try is old;
    /// `None` while nothing may be purged: the topic keeps messages for ever, or (with a
    /// reader) it has not been read yet.
    async fn in_force(&mut self, stats: &Stats) -> Option<Duration> {
        if let Some(reader) = &self.topic
            && self.tried_at.is_none_or(|at| at.elapsed() >= self.read_every)
        {
            let read = reader.read().await;
            // Counted from the answer: a broker that times out is not asked again at once.
            self.tried_at = Some(Instant::now());
            match read {
                Ok(retention) => {
                    if self.failing.take().is_some() {
                        tracing::info!(
                            topic = reader.topic(),
                            "the order topic's retention is read after failed tries"
                        );
                    }
                    self.retention = Some(retention);
                }
                Err(error) => {
                    stats.purge_topic_unread.fetch_add(1, Ordering::Relaxed);
                    let text = error.to_string();
                    if self.failing.as_deref() != Some(text.as_str()) {
                        let consequence = match self.retention {
                            Some(_) => "the last reading stays in force",
                            None => "nothing is purged until it is read",
                        };
                        let hint = match error {
                            RetentionError::Kafka(_) | RetentionError::Topic(_) => {
                                " (check the topic's name and the client's DescribeConfigs permission on it)"
                            }
                            _ => "",
                        };
                        tracing::warn!(
                            topic = reader.topic(),
                            error = %text,
                            last_reading = ?self.retention,
                            "cannot read the order topic's retention{hint}; {consequence}"
                        );
                        self.failing = Some(text);
                    }
                }
            }
        }
        let in_force = match (&self.topic, self.retention) {
            (None, _) => Some(self.configured),
            (Some(_), None) => None,
            (Some(_), Some(retention)) => retention.horizon(self.configured),
        };
        telemetry::purge_topic_retention(self.retention);
        if self.exported != Some(in_force) {
            self.exported = Some(in_force);
            self.announce(in_force);
        }
        in_force
    }

    /// Logs and exports a new horizon in force.
    fn announce(&self, in_force: Option<Duration>) {
        telemetry::purge_horizon(in_force);
        let hours = |d: Duration| d.as_secs().div_ceil(3_600);
        let topic = self.topic.as_ref().map(TopicReader::topic);
        match (in_force, self.retention) {
            // Not read yet: the failed read said so.
            (None, None) => {}
            (None, Some(_)) => tracing::error!(
                topic,
                "the order topic keeps messages for ever (retention.ms or segment.ms -1, or compaction without \
                 deletion): no finished saga is purged, since a message read again after its saga is gone is \
                 processed again"
            ),
            (Some(horizon), Some(Retention::Bounded(bound))) if horizon > self.configured => tracing::warn!(
                topic,
                after_hours = hours(self.configured),
                topic_keeps_hours = hours(bound),
                horizon_hours = hours(horizon),
                "purge.after_hours is shorter than the order topic keeps a message (retention.ms plus segment.ms, \
                 plus how far ahead a producer may date it): purging past that, plus an hour, instead"
            ),
            (Some(horizon), retention) => tracing::info!(
                topic,
                horizon_hours = hours(horizon),
                topic_keeps_hours = retention.map(|r| r.seconds() / 3_600.0),
                "purge horizon in force"
            ),
        }
    }
}

/// Where the periodic reconciliation got to, as a bound on what the purge may delete.
#[derive(Default)]
struct Judged {
    /// What was last logged.
    logged: Reconciled,
}

/// How the reconciliation's checkpoint stands against the purge's horizon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Reconciled {
    /// Past the horizon: the purge goes by the horizon alone.
    #[default]
    Ahead,
    /// No periodic pass has completed yet: nothing is purged.
    Never,
    /// Older than the horizon: finished sagas past it that no pass has judged are kept.
    Behind,
}

impl Judged {
    /// The bound to purge within for a round: the `since_ms` of the reconciliation's
    /// checkpoint, `None` while there is none (nothing judged yet). A round in which it keeps
    /// back sagas past the horizon (`older_than_ms` ago), or all of them, is counted; a change
    /// of that is logged.
    async fn bound(
        &mut self,
        store: &Store,
        older_than_ms: i64,
        stats: &Stats,
    ) -> Result<Option<i64>, midflight_store::Error> {
        let checkpoint = bounded("read the reconciliation checkpoint", store.reconcile_checkpoint(CHECKPOINT)).await?;
        let (bound, now) = match checkpoint {
            None => (None, Reconciled::Never),
            Some(checkpoint) => {
                let now_ms = bounded("read the database clock", store.now_ms()).await?;
                let behind = checkpoint.since_ms <= now_ms.saturating_sub(older_than_ms);
                (Some(checkpoint.since_ms), if behind { Reconciled::Behind } else { Reconciled::Ahead })
            }
        };
        if now != Reconciled::Ahead {
            stats.purge_unreconciled.fetch_add(1, Ordering::Relaxed);
        }
        if now != self.logged {
            self.logged = now;
            match now {
                Reconciled::Never => tracing::warn!(
                    "no periodic reconciliation has completed yet: no finished saga is purged before one has \
                     compared it with the downstream ledgers"
                ),
                Reconciled::Behind => tracing::warn!(
                    judged_before_ms = bound,
                    "the reconciliation is further behind than the purge's horizon: finished sagas it has not \
                     judged yet are kept (see the reconciler's errors)"
                ),
                Reconciled::Ahead => {
                    tracing::info!("the reconciliation has judged the sagas past the purge's horizon");
                }
            }
        }
        Ok(bound)
    }
}
