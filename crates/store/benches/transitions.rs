//! How many sagas a second the saga store alone sustains on this box: inbox batches, then each
//! saga's three transitions (business row + WMS intent, WMS answer + logistics intent,
//! shipment + DONE + outbox), written by up to `IN_FLIGHT_DEFAULT` concurrent drivers as the consumer
//! does, with the downstream answers canned (no calls, no Kafka). Once with every transition in
//! a transaction of its own, once with group commit, on SQLite and (when
//! `MIDFLIGHT_TEST_MYSQL_URL` is set) MariaDB.
//!
//! Not a test: it prints one table row per engine and setting. Run:
//! `MIDFLIGHT_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench -p midflight-store --bench transitions`.
//! Knobs for diagnosis: `MIDFLIGHT_BENCH_SAGAS` (default 20,000), `MIDFLIGHT_BENCH_ENGINE`
//! (`sqlite` or `mysql`: that engine only), `MIDFLIGHT_BENCH_GROUP` (that `group_commit_max` only),
//! `MIDFLIGHT_BENCH_IN_FLIGHT` (default 2,000): with few sagas in flight the groups stay small,
//! as at a paced rate, and sagas/s is set by how long one transition takes (Little's law).

use std::time::Instant;

use midflight_config::DatabaseSection;
use midflight_model::{Saga, Source};
use midflight_store::Store;
use midflight_store::testing::{Engine, TestDb, drive_all_to_done, order_event};

const SAGAS_DEFAULT: usize = 20_000;
/// Sagas in flight at once by default: the consumer's default `in_flight_max`.
const IN_FLIGHT_DEFAULT: usize = 2_000;
/// Rows per inbox transaction: the consumer's default `batch_max`.
const INBOX_BATCH: usize = 256;
const LEASE_MS: i64 = 60_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let sagas = std::env::var("MIDFLIGHT_BENCH_SAGAS").ok().and_then(|v| v.parse().ok()).unwrap_or(SAGAS_DEFAULT);
    let in_flight = std::env::var("MIDFLIGHT_BENCH_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(IN_FLIGHT_DEFAULT)
        .max(1);
    runtime.block_on(async {
        println!(
            "| engine | group_commit_max | in flight | sagas | sagas/s | transitions/s | write txns/saga | load avg |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let only_engine = std::env::var("MIDFLIGHT_BENCH_ENGINE").ok();
        let only_group: Option<usize> = std::env::var("MIDFLIGHT_BENCH_GROUP").ok().and_then(|v| v.parse().ok());
        for engine in [Engine::Sqlite, Engine::MySql] {
            let name = if engine == Engine::Sqlite { "sqlite" } else { "mysql" };
            if only_engine.as_deref().is_some_and(|only| only != name) {
                continue;
            }
            for group in [1, 256].into_iter().filter(|g| only_group.is_none_or(|only| only == *g)) {
                let Some(db) = TestDb::fresh(engine).await else { continue };
                println!("{}", bench(&db, group, in_flight, sagas).await);
            }
        }
    });
}

async fn bench(db: &TestDb, group_commit_max: usize, in_flight: usize, count: usize) -> String {
    let max_connections = if db.engine == Engine::Sqlite { 4 } else { 16 };
    let section =
        DatabaseSection { url: db.url.clone(), max_connections, group_commit_max, ..DatabaseSection::default() };
    let store = Store::connect(&section).await.expect("connect");
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = (0..count).map(|n| saga(n, now)).collect();
    let started = Instant::now();
    drive_all_to_done(&store, &sagas, INBOX_BATCH, in_flight, LEASE_MS).await;
    let seconds = started.elapsed().as_secs_f64();
    let stats = store.stats();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "| {} | {group_commit_max} | {in_flight} | {count} | {:.0} | {:.0} | {:.3} | {} |",
        if db.engine == Engine::Sqlite { "sqlite" } else { "mariadb" },
        count as f64 / seconds,
        stats.transitions as f64 / seconds,
        stats.write_txns as f64 / count as f64,
        load.split_whitespace().next().unwrap_or("?"),
    )
}

fn saga(n: usize, now_ms: i64) -> Saga {
    let mut event = order_event(&format!("S-{n:07}"));
    event.lines[0].sku = format!("SKU-{:04}", n % 100 + 1);
    let source = Source { topic: "orders".into(), partition: (n % 16) as i32, offset: (n / 16) as i64 };
    Saga::received(&event, source, now_ms, now_ms + 600_000)
}
