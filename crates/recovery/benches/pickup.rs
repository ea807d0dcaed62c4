//! Pickup time of abandoned sagas: from the moment a saga's lease expires (by the database
//! clock) to the moment a recovery worker's takeover is logged, for a burst of 1,000 sagas left
//! behind by consumers that died, with 1 and 2 workers, on SQLite and (when
//! `MIDFLIGHT_TEST_MYSQL_URL` is set) MySQL/MariaDB.
//!
//! Not a test: it prints one line per case. The mocks answer with the user's latencies (WMS
//! p50/p99 60/180 ms, logistics 100/320 ms), so workers are busy driving while expiries keep
//! arriving, and pickup time includes waiting for a free drive slot (`concurrency_max`), as it
//! would after a real rebalance. Client, mocks, workers and database share the machine.
//!
//! Run: `cargo bench -p midflight-recovery --bench pickup` (optionally with
//! `MIDFLIGHT_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use midflight_driver::DriverSettings;
use midflight_model::{OrderEvent, Rules, Saga, Source};
use midflight_recovery::{RecoverySection, Worker};
use midflight_stack::{Faults, MethodFaults, MockDownstreams, MockOptions};
use midflight_store::Store;
use midflight_store::testing::{Engine, TestDb, order_event};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// One measured case.
#[derive(Debug, Clone, Copy)]
struct Case {
    /// Sagas abandoned: 1,000 is about what three of eight consumers hold in flight at
    /// 4,000 msg/s (the incident's rebalance); 100 is a trickle that never saturates a worker.
    sagas: usize,
    workers: usize,
    scan_interval_ms: u64,
    concurrency_max: usize,
}

/// Defaults first (1 s scans, 64 drives), then the two knobs that move pickup time.
const CASES: [Case; 7] = [
    Case { sagas: 1_000, workers: 1, scan_interval_ms: 1_000, concurrency_max: 64 },
    Case { sagas: 1_000, workers: 2, scan_interval_ms: 1_000, concurrency_max: 64 },
    Case { sagas: 1_000, workers: 1, scan_interval_ms: 100, concurrency_max: 64 },
    Case { sagas: 1_000, workers: 2, scan_interval_ms: 100, concurrency_max: 64 },
    Case { sagas: 1_000, workers: 1, scan_interval_ms: 100, concurrency_max: 256 },
    Case { sagas: 100, workers: 1, scan_interval_ms: 1_000, concurrency_max: 64 },
    Case { sagas: 100, workers: 1, scan_interval_ms: 100, concurrency_max: 64 },
];
/// Inserts per case, each batch with its own lease, so expiries spread over `EXPIRY_SPREAD_MS`
/// in this many steps.
const BATCHES: usize = 20;
/// Lease of the first batch: long enough for the whole insert to finish before any expiry.
const FIRST_LEASE_MS: i64 = 3_000;
/// Expiries are spread over this window (a rebalance kicks consumers out within a second or two).
const EXPIRY_SPREAD_MS: i64 = 2_000;
/// A case that has not finished by then is reported as failed.
const CASE_LIMIT: Duration = Duration::from_secs(300);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        println!(
            "| engine | sagas | workers | scan_interval_ms | concurrency_max | pickup p50 ms | pickup p99 ms | pickup max ms | all done after last expiry ms |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for engine in [Engine::Sqlite, Engine::MySql] {
            for case in CASES {
                let Some(db) = TestDb::fresh(engine).await else { break };
                run_case(&db, case).await;
            }
        }
    });
}

async fn run_case(db: &TestDb, case: Case) {
    let mocks = MockDownstreams::start(MockOptions {
        wms_faults: latency(&["LockStock", "QueryLock", "ReverseLock"], 60, 180),
        logistics_faults: latency(&["CreateShipment", "QueryShipment", "CancelShipment"], 100, 320),
        ..MockOptions::default()
    })
    .await;
    let expiries = abandon(&db.store, case.sagas).await;
    let shutdown = CancellationToken::new();
    let mut running = JoinSet::new();
    for index in 0..case.workers {
        let section = RecoverySection {
            instance: format!("bench{index}"),
            scan_interval_ms: case.scan_interval_ms,
            concurrency_max: case.concurrency_max,
            reconcile_interval_ms: 0,
            migrate_on_start: false,
            ..RecoverySection::default()
        };
        let store = db.another_store().await;
        let worker =
            Worker::new(store, mocks.client(), Rules::default(), DriverSettings::default(), section, shutdown.clone());
        running.spawn(worker.run());
    }
    let done_at_ms = wait_until_terminal(&db.store).await;
    shutdown.cancel();
    while running.join_next().await.is_some() {}
    let mut pickups = pickup_times(&db.store, &expiries).await;
    pickups.sort_unstable();
    let last_expiry = expiries.values().copied().max().unwrap_or(0);
    let engine = match db.engine {
        Engine::Sqlite => "sqlite",
        Engine::MySql => "mariadb",
    };
    println!(
        "| {engine} | {} | {} | {} | {} | {} | {} | {} | {} |",
        case.sagas,
        case.workers,
        case.scan_interval_ms,
        case.concurrency_max,
        percentile(&pickups, 50),
        percentile(&pickups, 99),
        pickups.last().copied().unwrap_or(0),
        done_at_ms - last_expiry,
    );
}

fn latency(methods: &[&str], p50_ms: u32, p99_ms: u32) -> Faults {
    let mut plan = Faults { seed: 1, ..Faults::default() };
    for method in methods {
        plan.methods.insert((*method).to_owned(), MethodFaults::with_latency(p50_ms, p99_ms));
    }
    plan
}

/// Inserts `sagas` RECEIVED rows leased to a consumer that never comes back; returns each
/// saga's lease expiry (database clock).
async fn abandon(store: &Store, sagas: usize) -> HashMap<String, i64> {
    let now = store.now_ms().await.expect("clock");
    let mut expiries = HashMap::with_capacity(sagas);
    let batch_rows = sagas.div_ceil(BATCHES);
    let batches = sagas.div_ceil(batch_rows);
    for batch in 0..batches {
        let lease_ms = FIRST_LEASE_MS + EXPIRY_SPREAD_MS * batch as i64 / batches as i64;
        let rows: Vec<Saga> = (batch * batch_rows..((batch + 1) * batch_rows).min(sagas))
            .map(|n| {
                let source = Source { topic: "orders".into(), partition: (n % 16) as i32, offset: n as i64 };
                Saga::received(&order(n), source, now, now + 600_000)
            })
            .collect();
        let arrivals = store.insert_arrivals(&rows, "dead-consumer", lease_ms, "consumer:dead").await.expect("insert");
        for arrival in arrivals {
            let saga = arrival.saga().expect("readable");
            expiries.insert(saga.biz_id.clone(), saga.lease.until_ms);
        }
    }
    expiries
}

fn order(n: usize) -> OrderEvent {
    let mut event = order_event(&format!("B-{n:06}"));
    event.lines[0].sku = format!("SKU-{:04}", n % 100 + 1);
    event
}

/// Database time when no saga is left unfinished.
async fn wait_until_terminal(store: &Store) -> i64 {
    let deadline = Instant::now() + CASE_LIMIT;
    loop {
        let summary = store.status_summary().await.expect("summary");
        if summary.iter().all(|(status, count, _)| status.is_terminal() || *count == 0) {
            return store.now_ms().await.expect("clock");
        }
        assert!(Instant::now() < deadline, "sagas still unfinished after {CASE_LIMIT:?}: {summary:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// First takeover minus lease expiry, per saga, in ms.
async fn pickup_times(store: &Store, expiries: &HashMap<String, i64>) -> Vec<i64> {
    let mut out = Vec::with_capacity(expiries.len());
    for (biz_id, expiry) in expiries {
        let log = store.transitions(biz_id).await.expect("log");
        let takeover = log.iter().find(|t| t.is_takeover()).expect("every abandoned saga is taken over");
        out.push(takeover.at_ms - expiry);
    }
    out
}

fn percentile(sorted: &[i64], p: usize) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}
