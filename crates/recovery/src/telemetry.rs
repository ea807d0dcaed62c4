//! What the recovery service tells the outside world besides its logs and the driver's spans
//! (and its saga store's counters, which the driver's telemetry exports):
//! the worker's [`Stats`] as metrics (one field, one metric), the reconciler's findings, and a
//! periodic sample of the saga table (rows and oldest untouched row per status, open tickets).
//!
//! The table is sampled here because the recovery worker is the one service that already reads
//! the whole table's state; with several workers each samples, and a dashboard takes the max.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use midflight_model::Status;
use midflight_service::metrics::{self, Kind, LiveSet, instruments};
use midflight_store::Store;
use opentelemetry::KeyValue;
use opentelemetry::metrics::ObservableCounter;
use tokio_util::sync::CancellationToken;

use crate::ledger::FindingKind;
use crate::reconcile::{Report, TICKET_OUTCOMES, ticket_outcome_name};
use crate::worker::{Stats, StatsSnapshot};

/// How often the table is sampled. One grouped count over the status index per interval; 15 s
/// matches Prometheus's default scrape interval, so every scrape sees a fresh sample.
pub const TABLE_SAMPLE_INTERVAL: Duration = Duration::from_secs(15);

/// The live workers of the process, whose stats the observers sum.
static WORKERS: LiveSet<Stats> = LiveSet::new();

/// The Prometheus families the recovery service's own observers export (besides the
/// catalogue's): the worker's stats and its saga store's counters.
pub fn metric_names() -> Vec<String> {
    let stats = fields(&StatsSnapshot::default())
        .into_iter()
        .map(|(field, _)| metrics::prometheus_family(&stat_name(&field), Kind::Counter));
    stats.chain(midflight_driver::telemetry::store_metric_names()).collect()
}

/// Exports `stats` (summed with every other live worker of the process) as metrics.
pub(crate) fn observe(stats: &Arc<Stats>) {
    WORKERS.register(stats);
    observers();
}

/// Samples the table once: rows per unfinished status, the oldest untouched row of each, the
/// oldest finished row still kept, rows with a status this version does not know, open
/// tickets, and the oldest notification not yet published. Finished statuses are not
/// counted: counting them reads the table's whole history (finished sagas are counted as they
/// finish, by `midflight_saga_transitions_total`).
/// Returns the unknown statuses with their rows, and whether there were more than were read.
pub async fn sample_table(store: &Store) -> Result<(Vec<(String, u64)>, bool), midflight_store::Error> {
    let summary = store.unfinished_summary().await?;
    let tickets = store.open_ticket_count().await?;
    let now_ms = store.now_ms().await?;
    let instruments = instruments();
    for status in Status::ALL.into_iter().filter(|status| !status.is_terminal()) {
        let found = summary.iter().find(|(s, _, _)| *s == status);
        let attributes = [KeyValue::new("status", status.as_str())];
        instruments.sagas.record(found.map_or(0, |(_, count, _)| *count), &attributes);
        instruments.oldest_age.record(seconds_since(now_ms, found.map(|(_, _, oldest_ms)| *oldest_ms)), &attributes);
    }
    // How far back the finished sagas go: the purge's horizon while it keeps up.
    let finished = store.oldest_finished().await?;
    for status in Status::FINISHED {
        let found = finished.iter().find(|(s, _)| *s == status);
        let age_s = seconds_since(now_ms, found.map(|(_, oldest_ms)| *oldest_ms));
        instruments.oldest_finished_age.record(age_s, &[KeyValue::new("status", status.as_str())]);
    }
    instruments.tickets_open.record(tickets, &[]);
    instruments.outbox_oldest_age.record(seconds_since(now_ms, store.oldest_unpublished_ms().await?), &[]);
    let unknown = store.unknown_statuses().await?;
    instruments.sagas_unknown_status.record(unknown.0.iter().map(|(_, rows)| rows).sum(), &[]);
    Ok(unknown)
}

/// Seconds from `then_ms` to `now_ms` (database time), 0 without a `then_ms` or before it.
fn seconds_since(now_ms: i64, then_ms: Option<i64>) -> f64 {
    then_ms.map_or(0, |then_ms| now_ms.saturating_sub(then_ms).max(0)) as f64 / 1_000.0
}

/// Exports the purge's horizon in force (0 when off or held), beside the oldest finished
/// saga's age, so an alert can tell a purge falling behind from none at all.
pub(crate) fn purge_horizon(horizon: Option<Duration>) {
    instruments().purge_horizon.record(horizon.map_or(0.0, |h| h.as_secs_f64()), &[]);
}

/// Exports what the order topic keeps, as the purge last read it (0 when not read, -1 for ever).
pub(crate) fn purge_topic_retention(retention: Option<crate::retention::Retention>) {
    instruments().purge_topic_retention.record(retention.map_or(0.0, |r| r.seconds()), &[]);
}

/// Samples the table every [`TABLE_SAMPLE_INTERVAL`] until `shutdown`. A sample that fails or
/// does not answer within the scan's deadline is counted (`table_sample_failures`), since the
/// gauges keep their last values meanwhile.
pub(crate) async fn sample_periodically(store: Store, stats: Arc<Stats>, shutdown: CancellationToken) {
    // The unknown statuses last logged: logged again only when they change.
    let mut logged = (Vec::new(), false);
    loop {
        match crate::worker::bounded("the saga table's sample", sample_table(&store)).await {
            Ok(unknown) if unknown != logged => {
                if unknown.0.is_empty() {
                    tracing::info!("no saga row has an unknown status any more");
                } else {
                    tracing::error!(
                        statuses = ?unknown.0,
                        more = unknown.1,
                        "saga rows have a status this version does not know, so nothing resumes or reconciles \
                         them, and later sagas of their orders wait: rows written by a newer version (roll it \
                         forward again) or edited by hand (repair them)"
                    );
                }
                logged = unknown;
            }
            Ok(_) => {}
            Err(error) => {
                stats.table_sample_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%error, "saga table sample failed; its gauges keep their last values until one succeeds");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(TABLE_SAMPLE_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Starts every (kind, ticket) series of the findings at zero, before the first pass: a series
/// that first appears with a value above zero shows no increase, and an alert on it would miss
/// the first findings.
pub(crate) fn reconciler_started() {
    let instruments = instruments();
    for kind in FindingKind::ALL {
        for outcome in TICKET_OUTCOMES {
            instruments.reconciler_findings.add(0, &finding_labels(kind.as_str(), ticket_outcome_name(outcome)));
        }
    }
    instruments.reconciler_late_entries.add(0, &[]);
    instruments.reconciler_late_depth.record(0.0, &[]);
}

/// Counts a finished reconciliation (`behind` when it stopped at its bound) and its findings by
/// kind and by what became of their ticket (`resolved_before`: a person accepted that very
/// finding before).
pub(crate) fn reconciled(report: &Report) {
    let instruments = instruments();
    let result = if report.behind { "behind" } else { "ok" };
    instruments.reconciler_runs.add(1, &[KeyValue::new("result", result)]);
    instruments.reconciler_late_entries.add(report.late_entries, &[]);
    instruments.reconciler_late_depth.record(late_depth_ratio(report), &[]);
    for ((kind, ticket), count) in &report.by_kind_and_ticket {
        instruments.reconciler_findings.add(*count, &finding_labels(kind, ticket));
    }
}

/// The deepest late entry of a pass as a share of the stretch read again (0 when none).
fn late_depth_ratio(report: &Report) -> f64 {
    if report.reread_stretch == 0 { 0.0 } else { report.late_depth_max as f64 / report.reread_stretch as f64 }
}

fn finding_labels(kind: &'static str, ticket: &'static str) -> [KeyValue; 2] {
    [KeyValue::new("kind", kind), KeyValue::new("ticket", ticket)]
}

/// Counts a reconciliation that could not complete.
pub(crate) fn reconcile_failed() {
    instruments().reconciler_runs.add(1, &[KeyValue::new("result", "error")]);
}

fn stat_name(field: &str) -> String {
    format!("midflight.recovery.{field}")
}

/// The snapshot's fields by name, from its serialised form, so a new field is exported without
/// a second list to keep in step.
fn fields(snapshot: &StatsSnapshot) -> Vec<(String, u64)> {
    match serde_json::to_value(snapshot) {
        Ok(serde_json::Value::Object(map)) => {
            map.into_iter().filter_map(|(name, value)| value.as_u64().map(|v| (name, v))).collect()
        }
        _ => Vec::new(),
    }
}

/// The observers, registered once per process and kept so they stay registered.
fn observers() -> &'static Vec<ObservableCounter<u64>> {
    static OBSERVERS: OnceLock<Vec<ObservableCounter<u64>>> = OnceLock::new();
    OBSERVERS.get_or_init(|| {
        fields(&StatsSnapshot::default())
            .into_iter()
            .map(|(field, _)| {
                let name = stat_name(&field);
                WORKERS.sum_counter(name, None, move |stats| metrics::field_value(fields(&stats.snapshot()), &field))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stat_becomes_a_counter() {
        let names = metric_names();
        assert!(names.contains(&"midflight_recovery_claimed_total".to_owned()), "{names:?}");
        assert!(names.contains(&"midflight_store_refused_total".to_owned()), "{names:?}");
        let store = midflight_driver::telemetry::store_metric_names().len();
        assert_eq!(names.len(), fields(&StatsSnapshot::default()).len() + store);
    }

    /// A sample that fails is counted: the gauges keep their last values meanwhile, and the
    /// count is what an alert can watch.
    #[tokio::test]
    async fn a_failed_table_sample_is_counted() {
        let db =
            midflight_store::testing::TestDb::fresh(midflight_store::testing::Engine::Sqlite).await.expect("sqlite");
        let stats = Arc::new(Stats::default());
        midflight_store::testing::execute(&db.store, "ALTER TABLE manual_ticket RENAME TO manual_ticket_gone").await;
        let shutdown = CancellationToken::new();
        let sampler = tokio::spawn(sample_periodically(db.store.clone(), stats.clone(), shutdown.clone()));
        midflight_store::testing::until("a failed sample counted", || async {
            stats.snapshot().table_sample_failures >= 1
        })
        .await;
        shutdown.cancel();
        sampler.await.expect("the sampler stops");
        midflight_store::testing::execute(&db.store, "ALTER TABLE manual_ticket_gone RENAME TO manual_ticket").await;
        assert!(sample_table(&db.store).await.is_ok(), "a sample of a sound table succeeds");
    }

    #[test]
    fn the_deepest_late_entry_is_a_share_of_the_stretch() {
        let pass = |late_depth_max, reread_stretch| Report { late_depth_max, reread_stretch, ..Report::default() };
        assert_eq!(late_depth_ratio(&pass(0, 10_000)), 0.0);
        assert_eq!(late_depth_ratio(&pass(5_000, 10_000)), 0.5);
        assert_eq!(late_depth_ratio(&pass(10_000, 10_000)), 1.0);
        // A full pass reads no stretch again.
        assert_eq!(late_depth_ratio(&pass(0, 0)), 0.0);
    }
}
