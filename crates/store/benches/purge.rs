//! How fast a purge deletes finished sagas on this box: `MIDFLIGHT_BENCH_SAGAS` sagas (default
//! 20,000) are driven to DONE as the consumer does, moved 49 hours into the past, and purged
//! with a 48-hour horizon in batches of `MIDFLIGHT_BENCH_BATCH` (default 500), one after the
//! other, on SQLite and (when `MIDFLIGHT_TEST_MYSQL_URL` is set) MariaDB. A purge must keep up
//! with the rate sagas finish at, or the table grows.
//!
//! Not a test: it prints one table row per engine. Run:
//! `MIDFLIGHT_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench -p midflight-store --bench purge`.

use std::time::Instant;

use midflight_config::DatabaseSection;
use midflight_model::{Saga, Source};
use midflight_store::testing::{Engine, TestDb, drive_all_to_done, order_event};
use midflight_store::{Purged, Store};
use sea_orm::{ConnectionTrait, Statement};

const HOUR_MS: i64 = 3_600_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (count, batch) = (var("MIDFLIGHT_BENCH_SAGAS", 20_000), var("MIDFLIGHT_BENCH_BATCH", 500));
    runtime.block_on(async {
        println!("| engine | sagas | batch | log rows | sagas/s purged | rows/s deleted | ms a batch | load avg |");
        println!("|---|---|---|---|---|---|---|---|");
        for engine in [Engine::Sqlite, Engine::MySql] {
            let Some(db) = TestDb::fresh(engine).await else { continue };
            println!("{}", bench(&db, count, batch).await);
        }
    });
}

async fn bench(db: &TestDb, count: usize, batch: usize) -> String {
    let max_connections = if db.engine == Engine::Sqlite { 4 } else { 16 };
    let section = DatabaseSection { url: db.url.clone(), max_connections, ..DatabaseSection::default() };
    let store = Store::connect(&section).await.expect("connect");
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = (0..count).map(|n| saga(n, now)).collect();
    drive_all_to_done(&store, &sagas, 256, 2_000, 60_000).await;
    for sql in [
        format!("UPDATE saga SET updated_at_ms = {}, lease_until_ms = {}", now - 49 * HOUR_MS, now - 49 * HOUR_MS),
        "UPDATE outbox SET published_at_ms = 1".to_owned(),
    ] {
        store.connection().execute_raw(Statement::from_string(store.backend(), sql)).await.expect("age");
    }
    let started = Instant::now();
    let (mut all, mut batches) = (Purged::default(), 0_u32);
    loop {
        let purged = store.purge_finished(48 * HOUR_MS, batch as u64).await.expect("purge");
        all += purged;
        batches += 1;
        if purged.sagas < batch as u64 {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(all.sagas, count as u64, "every saga purged");
    let rows = all.sagas + all.transitions + all.outbox;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "| {} | {count} | {batch} | {} | {:.0} | {:.0} | {:.1} | {} |",
        if db.engine == Engine::Sqlite { "sqlite" } else { "mariadb" },
        all.transitions,
        count as f64 / seconds,
        rows as f64 / seconds,
        seconds * 1_000.0 / f64::from(batches),
        load.split_whitespace().next().unwrap_or("?"),
    )
}

fn saga(n: usize, now_ms: i64) -> Saga {
    let event = order_event(&format!("P-{n:07}"));
    let source = Source { topic: "orders".into(), partition: (n % 16) as i32, offset: (n / 16) as i64 };
    Saga::received(&event, source, now_ms, now_ms + 600_000)
}
