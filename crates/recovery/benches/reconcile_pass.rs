//! What a reconciliation pass costs against a history: `MIDFLIGHT_BENCH_SAGAS` sagas (default
//! 20,000) driven to DONE in the table, each with its lock and shipment in the mocks' ledgers,
//! all three hours old; then a full pass (what `sagactl reconcile` and, before, every periodic
//! pass did), the first periodic pass (a full one that writes the checkpoint), a quiet periodic
//! pass, the first periodic pass of a fresh process (it reads the stretch of
//! `reconcile.ledger_reread_entries` sequence numbers behind the checkpoint again, and judges
//! only what the pass that set it did not see there), and one after
//! `MIDFLIGHT_BENCH_NEW` (default 1,000) new sagas finished with their effects: time and ledger
//! entries read by each. On SQLite and (with
//! `MIDFLIGHT_TEST_MYSQL_URL`) MariaDB, or only the one `MIDFLIGHT_BENCH_ENGINE` names
//! (`sqlite` or `mysql`); the mocks keep their ledgers in SQLite, in process.
//!
//! Not a test: it prints one table row per engine and pass. Run:
//! `MIDFLIGHT_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench -p midflight-recovery --bench reconcile_pass`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use midflight_api::client::Downstreams;
use midflight_config::DatabaseSection;
use midflight_model::{Call, Saga, Source};
use midflight_recovery::{ReconcileSection, Reconciler, Report};
use midflight_stack::{MockDownstreams, MockOptions};
use midflight_store::Store;
use midflight_store::testing::{Engine, TestDb, drive_all_to_done, execute, order_event};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

const HOUR_MS: i64 = 3_600_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (history, new) = (var("MIDFLIGHT_BENCH_SAGAS", 20_000), var("MIDFLIGHT_BENCH_NEW", 1_000));
    runtime.block_on(async {
        println!("| engine | sagas in history | pass | new sagas | ms | ledger entries read (wms + logistics) | new entries | judged again behind the checkpoint | sagas judged | findings |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let only = std::env::var("MIDFLIGHT_BENCH_ENGINE").ok();
        for (engine, name) in [(Engine::Sqlite, "sqlite"), (Engine::MySql, "mysql")] {
            if only.as_deref().is_some_and(|only| only != name) {
                continue;
            }
            let Some(db) = TestDb::fresh(engine).await else { continue };
            bench(&db, history, new).await;
        }
    });
}

async fn bench(db: &TestDb, history: usize, new: usize) {
    let max_connections = if db.engine == Engine::Sqlite { 4 } else { 16 };
    let section = DatabaseSection { url: db.url.clone(), max_connections, ..DatabaseSection::default() };
    let store = Store::connect(&section).await.expect("connect");
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let client = mocks.client();
    finish_with_effects(&store, &client, "H", history).await;
    let ago = store.now_ms().await.expect("clock") - 3 * HOUR_MS;
    execute(&store, &format!("UPDATE saga SET updated_at_ms = {ago}, lease_until_ms = {ago}")).await;

    let reconciler = Reconciler::new(store.clone(), client.clone(), ReconcileSection::default(), "bench".into());
    let engine = if db.engine == Engine::Sqlite { "sqlite" } else { "mariadb" };
    let row = |pass: &str, new: usize, ms: f64, report: &Report| {
        println!(
            "| {engine} | {history} | {pass} | {new} | {ms:.0} | {} | {} | {} | {} | {} |",
            report.wms_entries + report.logistics_entries,
            report.new_entries,
            report.late_entries + report.reread_entries,
            report.sagas_checked,
            report.findings_total()
        );
    };
    let (ms, report) = timed(reconciler.run_once()).await;
    row("full", 0, ms, &report);
    let (ms, report) = timed(reconciler.run_incremental()).await;
    row("first periodic (full, writes the checkpoint)", 0, ms, &report);
    let (ms, report) = timed(reconciler.run_incremental()).await;
    row("periodic, nothing new", 0, ms, &report);
    let restarted = Reconciler::new(store.clone(), client.clone(), ReconcileSection::default(), "bench".into());
    let (ms, report) = timed(restarted.run_incremental()).await;
    row("periodic, first of a fresh process", 0, ms, &report);
    finish_with_effects(&store, &client, "N", new).await;
    let (ms, report) = timed(reconciler.run_incremental()).await;
    row("periodic, after new sagas", new, ms, &report);
    let (ms, report) = timed(reconciler.run_once()).await;
    row("full, after new sagas", new, ms, &report);
}

async fn timed(pass: impl std::future::Future<Output = Result<Report, midflight_recovery::Error>>) -> (f64, Report) {
    let started = Instant::now();
    let report = pass.await.expect("pass");
    (started.elapsed().as_secs_f64() * 1_000.0, report)
}

/// Drives `count` sagas named `prefix-n` to DONE in the table and sends each its lock and its
/// shipment, 64 calls at a time, so table and ledgers agree.
async fn finish_with_effects(store: &Store, client: &Downstreams, prefix: &str, count: usize) {
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = (0..count)
        .map(|n| {
            let source = Source { topic: "orders".into(), partition: 0, offset: n as i64 };
            Saga::received(&order_event(&format!("{prefix}-{n}")), source, now, now + 600_000)
        })
        .collect();
    drive_all_to_done(store, &sagas, 256, 2_000, 60_000).await;
    let permits = Arc::new(Semaphore::new(64));
    let mut calls = JoinSet::new();
    for saga in &sagas {
        let row = store.get(&saga.biz_id).await.expect("get").expect("row");
        for call in [Call::LockStock, Call::CreateShipment] {
            let (client, row, permit) = (client.clone(), row.clone(), permits.clone().acquire_owned().await);
            calls.spawn(async move {
                client.call(call, &row, Duration::from_secs(10)).await;
                drop(permit);
            });
        }
    }
    while calls.join_next().await.is_some() {}
}
