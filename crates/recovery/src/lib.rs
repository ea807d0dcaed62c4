//! The recovery worker: finds sagas nobody drives any more (lease expired by the database
//! clock, backoff over) and drives them to a terminal state with the shared
//! [`midflight_driver::Driver`]; and the reconciler, which compares the downstream ledgers with
//! the saga table and opens tickets for what does not match.
//!
//! Architecture invariants:
//! - The worker and the consumer coordinate only through compare-and-set on the saga row: the
//!   same claim, the same driver, the same planner. There is no second copy of any rule here,
//!   and no message or lock between the two services.
//! - Any number of workers may run; a lost claim is an ordinary outcome.
//! - Everything is bounded and named in [`RecoveryConfig`]: scan page, drives in flight, drain
//!   time, ledger size of a reconciliation.
//!
//! [`run`] takes its configuration and shutdown token from outside, so the binary and the
//! tests start it the same way.

mod config;
mod ledger;
pub mod purge;
pub mod reconcile;
pub mod retention;
pub mod telemetry;
mod window;
mod worker;

use midflight_api::client::Downstreams;
use midflight_store::Store;
use tokio_util::sync::CancellationToken;

pub use config::{
    CONCURRENCY_MAX, LEDGER_PAGE_ENTRIES_MAX, PURGE_AFTER_HOURS_MIN, PurgeSection, ReconcileSection, RecoveryConfig,
    RecoverySection, SCAN_BATCH_MAX,
};
pub use ledger::{ENTRIES_KEPT_PER_REQUEST_MAX, FindingKind, Ledger};
pub use reconcile::{Finding, Reconciler, Report};
pub use worker::{Stats, StatsSnapshot, Worker, owner_id};

/// Why the recovery service, or one reconciliation, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] midflight_store::Error),
    #[error(transparent)]
    Downstream(#[from] midflight_api::client::Error),
    #[error("cannot create the Kafka client that reads the order topic's retention: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(
        "the {step} ledger has more than {limit} entries (reconcile.ledger_entries_max); raise the limit to reconcile it whole"
    )]
    LedgerTooLarge { step: &'static str, limit: u64 },
}

/// Runs the recovery service until `shutdown`: the scan-and-drive loop and, when configured,
/// a reconciliation every `recovery.reconcile_interval_ms` and the purge of finished sagas.
pub async fn run(config: RecoveryConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let store = Store::connect(&config.database).await?;
    if config.recovery.migrate_on_start {
        store.migrate().await?;
    }
    let downstreams = Downstreams::connect_lazy(&config.wms, &config.logistics)?;
    let worker = Worker::new(
        store.clone(),
        downstreams.clone(),
        config.rules,
        config.driver.clone(),
        config.recovery.clone(),
        shutdown.clone(),
    );
    let owner = worker.owner().to_owned();
    let actor = format!("recovery:{owner}");
    let reconciler = Reconciler::new(store.clone(), downstreams, config.reconcile.clone(), actor);
    telemetry::observe(&worker.stats());
    // Only a purge reads the order topic.
    let topic = match (&config.kafka, config.purge.horizon()) {
        (Some(kafka), Some(_)) => Some(retention::TopicReader::new(
            kafka,
            std::time::Duration::from_millis(config.purge.topic_check_timeout_ms),
        )?),
        _ => None,
    };
    // With a reader, nothing may be purged before its first reading.
    telemetry::purge_horizon(config.purge.horizon().filter(|_| topic.is_none()));
    telemetry::purge_topic_retention(None);
    midflight_driver::telemetry::observe_store(&store);
    // The table is sampled only for someone who reads metrics: off by default, it costs no query.
    let metrics_on = config.telemetry.metrics_listen.is_some() || config.telemetry.otlp_endpoint.is_some();
    let sampler = metrics_on
        .then(|| tokio::spawn(telemetry::sample_periodically(store.clone(), worker.stats(), shutdown.clone())));
    let periodic =
        tokio::spawn(reconcile_periodically(reconciler, config.recovery.reconcile_interval_ms, shutdown.clone()));
    let reconciled = config.recovery.reconcile_interval_ms > 0;
    let purging = tokio::spawn(purge::purge_periodically(
        store.clone(),
        config.purge,
        topic,
        reconciled,
        worker.stats(),
        shutdown,
    ));
    midflight_service::readiness().set_ready(true);
    let worker_stats = worker.run().await;
    // The reconciler stops at the same signal; a pass cut short only leaves tickets unopened.
    periodic.await.ok();
    purging.await.ok();
    if let Some(sampler) = sampler {
        sampler.await.ok();
    }
    let stats = store.stats();
    tracing::info!(
        owner,
        stats = ?worker_stats,
        write_txns = stats.write_txns,
        transitions = stats.transitions,
        retried = stats.retried,
        refused = stats.refused,
        "recovery worker stopped"
    );
    store.close().await?;
    Ok(())
}

/// One reconciliation every `interval_ms` (none when 0), the first one interval after start so
/// that a restarting fleet does not reconcile all at once.
async fn reconcile_periodically(reconciler: Reconciler, interval_ms: u64, shutdown: CancellationToken) {
    if interval_ms == 0 {
        return;
    }
    telemetry::reconciler_started();
    let interval = std::time::Duration::from_millis(interval_ms);
    let mut behind = false;
    loop {
        // A pass that stopped at its bound, short of the present, is followed at once.
        if !behind {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
        tokio::select! {
            result = reconciler.run_periodic() => match result {
                Ok(report) => {
                    behind = report.behind;
                    telemetry::reconciled(&report);
                }
                Err(error) => {
                    behind = false;
                    telemetry::reconcile_failed();
                    tracing::warn!(%error, "reconciliation failed; trying again at the next interval");
                }
            },
            _ = shutdown.cancelled() => return,
        }
    }
}
