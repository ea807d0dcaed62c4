//! How fast a purge deletes finished sagas on this box: `MIDFLIGHT_BENCH_SAGAS` sagas (default
//! 20,000) are driven to DONE as the consumer does, moved 49 hours into the past, and purged
//! with a 48-hour horizon in batches of `MIDFLIGHT_BENCH_BATCH` (default 500), one after the
//! other, on SQLite and (when `MIDFLIGHT_TEST_MYSQL_URL` is set) MariaDB. A purge must keep up
//! with the rate sagas finish at, or the table grows.
//!
//! Then the purge beside the hot path: on a fresh database holding such a backlog, N more sagas
//! are driven to DONE as the consumer does, alone and then (on another fresh database) with a
//! purge running beside them at the recovery worker's defaults (batches of 500, 50 ms apart),
//! twice each, alternating: what the purge costs the consumer.
//!
//! Knobs: `MIDFLIGHT_BENCH_ENGINE` (`sqlite` or `mysql`: that engine only),
//! `MIDFLIGHT_BENCH_BESIDE=0` (the first table only), for runs with a large N, and
//! `MIDFLIGHT_BENCH_PURGERS` (default 1): purgers working through the first table at once, as
//! several recovery workers do, each on its own pool; batches rolled back are counted.
//!
//! Not a test: it prints one table row per engine and run. Run:
//! `MIDFLIGHT_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench -p midflight-store --bench purge`.

use std::time::Instant;

use midflight_config::DatabaseSection;
use midflight_model::{Saga, Source};
use midflight_store::testing::{Engine, TestDb, drive_all_to_done, execute, order_event};
use midflight_store::{Purged, Store};

const HOUR_MS: i64 = 3_600_000;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (count, batch) = (var("MIDFLIGHT_BENCH_SAGAS", 20_000), var("MIDFLIGHT_BENCH_BATCH", 500));
    let purgers = var("MIDFLIGHT_BENCH_PURGERS", 1).max(1);
    runtime.block_on(async {
        println!(
            "| engine | sagas | batch | purgers | log rows | sagas/s purged | rows/s deleted | ms a batch | batches rolled back | load avg |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let only = std::env::var("MIDFLIGHT_BENCH_ENGINE").ok();
        let engines: Vec<Engine> = [(Engine::Sqlite, "sqlite"), (Engine::MySql, "mysql")]
            .into_iter()
            .filter(|(_, name)| only.as_deref().is_none_or(|only| only == *name))
            .map(|(engine, _)| engine)
            .collect();
        for &engine in &engines {
            let Some(db) = TestDb::fresh(engine).await else { continue };
            println!("{}", bench(&db, count, batch, purgers).await);
        }
        if std::env::var("MIDFLIGHT_BENCH_BESIDE").is_ok_and(|v| v == "0") {
            return;
        }
        println!();
        println!("| engine | purge beside | sagas driven | sagas/s driven | sagas purged meanwhile | load avg |");
        println!("|---|---|---|---|---|---|");
        for &engine in &engines {
            for beside in [false, true, false, true] {
                let Some(db) = TestDb::fresh(engine).await else { continue };
                println!("{}", beside_the_hot_path(&db, count, beside).await);
            }
        }
    });
}

async fn connect(db: &TestDb) -> Store {
    let max_connections = if db.engine == Engine::Sqlite { 4 } else { 16 };
    let section = DatabaseSection { url: db.url.clone(), max_connections, ..DatabaseSection::default() };
    Store::connect(&section).await.expect("connect")
}

/// Drives `count` sagas named `prefix-n` to DONE, then moves every saga of the table 49 hours
/// into the past with its notification published.
async fn backlog(store: &Store, prefix: &str, count: usize) {
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = (0..count).map(|n| saga(prefix, n, now)).collect();
    drive_all_to_done(store, &sagas, 256, 2_000, 60_000).await;
    for sql in [
        format!("UPDATE saga SET updated_at_ms = {}, lease_until_ms = {}", now - 49 * HOUR_MS, now - 49 * HOUR_MS),
        "UPDATE outbox SET published_at_ms = 1".to_owned(),
    ] {
        execute(store, &sql).await;
    }
}

async fn bench(db: &TestDb, count: usize, batch: usize, purgers: usize) -> String {
    let store = connect(db).await;
    backlog(&store, "P", count).await;
    // Each purger on a pool of its own, as each recovery worker has.
    let mut stores = vec![store];
    for _ in 1..purgers {
        stores.push(connect(db).await);
    }
    let started = Instant::now();
    let tasks: Vec<_> = stores
        .into_iter()
        .map(|store| {
            tokio::spawn(async move {
                let (mut all, mut batches) = (Purged::default(), 0_u32);
                loop {
                    let purged = store.purge_finished(48 * HOUR_MS, None, batch as u64).await.expect("purge");
                    all += purged;
                    batches += 1;
                    // On after a batch with more to do, as a recovery worker's purge goes on; unlike
                    // the worker, which waits `interval_ms`, also after a rolled-back one at once.
                    // Otherwise nothing is left that this purger may take.
                    if !purged.more_after(batch as u64) && purged.rolled_back == 0 {
                        break;
                    }
                }
                (all, batches)
            })
        })
        .collect();
    let (mut all, mut batches) = (Purged::default(), 0_u32);
    for task in tasks {
        let (purged, n) = task.await.expect("purger");
        all += purged;
        batches += n;
    }
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(all.sagas, count as u64, "every saga purged");
    let rows = all.sagas + all.transitions + all.outbox;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "| {} | {count} | {batch} | {purgers} | {} | {:.0} | {:.0} | {:.1} | {} | {} |",
        if db.engine == Engine::Sqlite { "sqlite" } else { "mariadb" },
        all.transitions,
        count as f64 / seconds,
        rows as f64 / seconds,
        seconds * 1_000.0 * purgers as f64 / f64::from(batches),
        all.rolled_back,
        load.split_whitespace().next().unwrap_or("?"),
    )
}

/// The hot path's rate on a table holding a backlog of `count` purgeable sagas, with or without
/// a purge at the recovery worker's defaults running beside it.
async fn beside_the_hot_path(db: &TestDb, count: usize, beside: bool) -> String {
    let store = connect(db).await;
    backlog(&store, "OLD", count).await;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let purge = beside.then(|| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut purged = 0;
            while !*stopped.borrow() {
                let batch = store.purge_finished(48 * HOUR_MS, None, 500).await.expect("purge");
                purged += batch.sagas;
                let pause = if batch.more_after(500) { 50 } else { 60_000 };
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_millis(pause)) => {}
                    _ = stopped.changed() => {}
                }
            }
            purged
        })
    });
    let now = store.now_ms().await.expect("clock");
    let sagas: Vec<Saga> = (0..count).map(|n| saga("NEW", n, now)).collect();
    let started = Instant::now();
    drive_all_to_done(&store, &sagas, 256, 2_000, 60_000).await;
    let seconds = started.elapsed().as_secs_f64();
    stop.send_replace(true);
    let purged = match purge {
        Some(task) => task.await.expect("purge task").to_string(),
        None => "-".to_owned(),
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "| {} | {} | {count} | {:.0} | {purged} | {} |",
        if db.engine == Engine::Sqlite { "sqlite" } else { "mariadb" },
        if beside { "yes" } else { "no" },
        count as f64 / seconds,
        load.split_whitespace().next().unwrap_or("?"),
    )
}

fn saga(prefix: &str, n: usize, now_ms: i64) -> Saga {
    let event = order_event(&format!("{prefix}-{n:07}"));
    let source = Source { topic: "orders".into(), partition: (n % 16) as i32, offset: (n / 16) as i64 };
    Saga::received(&event, source, now_ms, now_ms + 600_000)
}
