//! Helpers shared by the recovery tests: orders, settings, abandoned sagas, ledgers, and
//! polling with a deadline (tests wait on conditions, never on sleeps).

#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use midflight_api::client::{Downstreams, LedgerEntry, LedgerKind};
use midflight_driver::{Downstream, Driver, DriverSettings};
use midflight_model::{OrderEvent, RetryPolicy, Rules, Saga, Source, Status, Step};
use midflight_recovery::retention::TopicReader;
use midflight_recovery::{PurgeSection, RecoverySection, Stats};
use midflight_store::Store;
use midflight_store::testing::order_event;
use tokio_util::sync::CancellationToken;

/// Retries come back at once, so tests never wait on a backoff.
pub fn rules() -> Rules {
    Rules { retry: RetryPolicy { backoff_base_ms: 1, backoff_max_ms: 1, attempts_max: 20 }, ..Rules::default() }
}

/// Leases of 30 s: nobody loses a saga unless a test makes it.
pub fn settings() -> DriverSettings {
    DriverSettings::new(30_000, 2_000, 500)
}

/// A worker section that scans often and reconciles never (tests reconcile explicitly).
pub fn section(instance: &str) -> RecoverySection {
    RecoverySection {
        instance: instance.to_owned(),
        scan_interval_ms: 10,
        scan_batch: 20,
        concurrency_max: 16,
        drain_timeout_ms: 5_000,
        migrate_on_start: false,
        reconcile_interval_ms: 0,
    }
}

pub fn event(order_no: &str, event_type: &str, region: &str) -> OrderEvent {
    let mut event = OrderEvent { event_type: event_type.into(), amount_cents: 900, ..order_event(order_no) };
    event.address.region = region.into();
    event.lines[0].quantity = 2;
    event
}

/// RECEIVED rows for `events` (offsets from `first_offset`), leased to a consumer for
/// `lease_ms` (0: abandoned at once, as by a consumer that died right after the insert).
pub async fn arrive(store: &Store, events: &[OrderEvent], first_offset: i64, lease_ms: i64) -> Vec<Saga> {
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = events
        .iter()
        .enumerate()
        .map(|(i, event)| {
            let source = Source { topic: "orders".into(), partition: 0, offset: first_offset + i as i64 };
            Saga::received(event, source, now, now + 600_000)
        })
        .collect();
    let mut out = Vec::with_capacity(sagas.len());
    for chunk in sagas.chunks(midflight_store::BATCH_ROWS_MAX) {
        let arrivals = store.insert_arrivals(chunk, "dead-consumer", lease_ms, "consumer:dead-consumer").await;
        out.extend(arrivals.expect("insert arrivals").into_iter().map(|a| a.saga().expect("readable").clone()));
    }
    out
}

pub fn driver<D: Downstream>(store: &Store, downstream: D, name: &str, settings: DriverSettings) -> Driver<D> {
    Driver::new(
        store.clone(),
        downstream,
        rules(),
        settings,
        name.to_owned(),
        format!("consumer:{name}"),
        CancellationToken::new(),
    )
}

/// Polls `check` until it returns `Some`, failing with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every saga of `biz_ids` is terminal; returns their statuses.
pub async fn all_terminal(store: &Store, biz_ids: &[String], limit: Duration) -> Vec<Status> {
    eventually("every saga to finish", limit, || async {
        let mut statuses = Vec::with_capacity(biz_ids.len());
        for id in biz_ids {
            let saga = store.get(id).await.expect("get").expect("row");
            if !saga.status.is_terminal() {
                return None;
            }
            statuses.push(saga.status);
        }
        Some(statuses)
    })
    .await
}

/// Both ledgers in full.
pub async fn ledgers(client: &Downstreams) -> (Vec<LedgerEntry>, Vec<LedgerEntry>) {
    (read_all(client, Step::Wms).await, read_all(client, Step::Logistics).await)
}

async fn read_all(client: &Downstreams, step: Step) -> Vec<LedgerEntry> {
    let timeout = Duration::from_secs(5);
    let mut all = Vec::new();
    let mut cursor = 0;
    loop {
        let (page, next) = match step {
            Step::Wms => client.wms_ledger(cursor, 1_000, timeout).await.expect("wms ledger"),
            Step::Logistics => client.logistics_ledger(cursor, 1_000, timeout).await.expect("logistics ledger"),
        };
        if page.is_empty() {
            return all;
        }
        all.extend(page);
        cursor = next;
    }
}

/// Effects in force per request id: applied and not undone.
pub fn in_force(entries: &[LedgerEntry], request_id: &str) -> usize {
    let mut live: Vec<&str> = Vec::new();
    for entry in entries.iter().filter(|e| e.request_id == request_id) {
        match entry.kind {
            LedgerKind::Apply => live.push(&entry.effect_id),
            LedgerKind::Undo => live.retain(|id| *id != entry.effect_id),
            _ => {}
        }
    }
    live.len()
}

/// Every takeover names a new, higher epoch, and every other transition is written by the
/// holder of the epoch current at that point: one epoch holder per transition.
pub async fn assert_one_holder_per_transition(store: &Store, biz_id: &str) {
    let log = store.transitions(biz_id).await.expect("log");
    let mut epoch = log.first().map_or(0, |t| t.lease_epoch);
    let mut holder = log.first().map(|t| t.actor.clone()).unwrap_or_default();
    for t in log.iter().skip(1) {
        if t.is_takeover() {
            assert!(t.lease_epoch > epoch, "{biz_id}: takeover to epoch {} after {epoch}: {log:#?}", t.lease_epoch);
            (epoch, holder) = (t.lease_epoch, t.actor.clone());
        } else {
            assert_eq!(
                (t.lease_epoch, &t.actor),
                (epoch, &holder),
                "{biz_id}: transition v{} by a non-holder",
                t.version
            );
        }
    }
}

/// The forward path of a saga finished once: each status of the happy path entered exactly once.
pub async fn assert_finished_once(store: &Store, biz_id: &str) {
    use Status::*;
    let log = store.transitions(biz_id).await.expect("log");
    let entered: Vec<Status> = log.iter().filter(|t| !t.is_takeover()).map(|t| t.to).collect();
    assert_eq!(
        entered,
        vec![Received, DbWritten, WmsRequested, WmsConfirmed, LogisticsRequested, LogisticsConfirmed, Done],
        "{biz_id}: {log:#?}"
    );
}

/// How long [`purge_beside`]'s purge waits for the broker when it reads the order topic.
pub const PURGE_TOPIC_CHECK_TIMEOUT: Duration = Duration::from_millis(500);

/// A purge of 24 hours, a round every `interval_ms`, run beside the test on `store`: reading
/// the order topic through `reader` (if any), and purging only what the periodic
/// reconciliation has judged when `reconciled`.
pub fn purge_beside(
    store: &Store,
    reader: Option<TopicReader>,
    reconciled: bool,
    interval_ms: u64,
) -> (std::sync::Arc<Stats>, CancellationToken, tokio::task::JoinHandle<()>) {
    purge_in_batches(store, reader, reconciled, interval_ms, 500)
}

/// [`purge_beside`] in batches of `batch_rows`.
pub fn purge_in_batches(
    store: &Store,
    reader: Option<TopicReader>,
    reconciled: bool,
    interval_ms: u64,
    batch_rows: u64,
) -> (std::sync::Arc<Stats>, CancellationToken, tokio::task::JoinHandle<()>) {
    let timeout_ms = u64::try_from(PURGE_TOPIC_CHECK_TIMEOUT.as_millis()).expect("a short timeout");
    let section =
        PurgeSection { after_hours: 24, batch_rows, pause_ms: 1, interval_ms, topic_check_timeout_ms: timeout_ms };
    let stats = std::sync::Arc::new(Stats::default());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(midflight_recovery::purge::purge_periodically(
        store.clone(),
        section,
        reader,
        reconciled,
        stats.clone(),
        shutdown.clone(),
    ));
    (stats, shutdown, running)
}

/// The biz_ids of the sagas in `store` (at most ten), sorted.
pub async fn kept(store: &Store) -> Vec<String> {
    let mut ids: Vec<String> = store.page("", 10).await.expect("page").into_iter().map(|s| s.biz_id).collect();
    ids.sort();
    ids
}
