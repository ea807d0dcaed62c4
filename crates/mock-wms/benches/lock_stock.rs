//! LockStock throughput of the mock WMS over loopback gRPC, with latency injection off.
//!
//! Not a test: it prints calls per second and latency percentiles at a few concurrencies, on
//! SQLite (WAL, synchronous=NORMAL) and, when `MIDFLIGHT_TEST_MYSQL_URL` is set, on a fresh
//! MySQL/MariaDB database. Client and server share this process and the machine's cores, so the
//! numbers are what one box can do end to end, not the server alone.
//!
//! Run: `cargo bench -p midflight-mock-wms` (optionally `MIDFLIGHT_TEST_MYSQL_URL=mysql://...`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use midflight_api::wms::v1 as pb;
use midflight_api::wms::v1::wms_client::WmsClient;
use midflight_config::DatabaseSection;
use midflight_mock::FaultPlan;
use midflight_mock_wms::WmsConfig;
use sea_orm::ConnectionTrait;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Concurrent callers at each measured point.
const CONCURRENCIES: [usize; 3] = [1, 16, 64];
/// How long each point is measured, after its warm-up.
const MEASURE: Duration = Duration::from_secs(5);
/// Calls made before measuring, so connections, caches and the WAL are warm.
const WARMUP_CALLS: usize = 200;
/// SKUs the calls spread over; enough that no single stock row is the only thing written.
const SKUS: usize = 100;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async {
        let path = std::env::temp_dir().join(format!("midflight-bench-wms-{}.db", std::process::id()));
        bench_backend("sqlite", &format!("sqlite://{}?mode=rwc", path.display())).await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        if let Ok(base) = std::env::var("MIDFLIGHT_TEST_MYSQL_URL") {
            bench_mysql(&base).await;
        }
    });
}

async fn bench_mysql(base: &str) {
    let name = format!("mock_bench_{}", std::process::id());
    let server = sea_orm::Database::connect(base).await.expect("connect to MIDFLIGHT_TEST_MYSQL_URL");
    server.execute_unprepared(&format!("CREATE DATABASE {name}")).await.expect("create bench database");
    let (server_part, _) = base.rsplit_once('/').expect("MIDFLIGHT_TEST_MYSQL_URL ends in /database");
    bench_backend("mysql", &format!("{server_part}/{name}")).await;
    server.execute_unprepared(&format!("DROP DATABASE {name}")).await.expect("drop bench database");
}

async fn bench_backend(backend: &str, url: &str) {
    let config = WmsConfig {
        database: DatabaseSection { url: url.to_owned(), ..DatabaseSection::default() },
        faults: FaultPlan { seed: 1, ..FaultPlan::default() },
        stock: midflight_mock_wms::StockSection {
            generated_skus: SKUS,
            generated_quantity: i64::MAX / 2,
            ..Default::default()
        },
        ..WmsConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(midflight_mock_wms::run(config, listener, async move {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
    let client = WmsClient::new(channel);
    measure(backend, "new ids", &client, 1, WARMUP_CALLS, false).await;
    for concurrency in CONCURRENCIES {
        let point = measure(backend, "new ids", &client, concurrency, usize::MAX, false).await;
        println!("{point}");
    }
    println!("{}", measure(backend, "repeats", &client, 16, usize::MAX, true).await);
    drop(client);
    stop.send(()).expect("server running");
    server.await.expect("server task").expect("server stops cleanly");
}

/// Runs `concurrency` callers until [`MEASURE`] passes (or `calls_max` calls), and reports.
async fn measure(
    backend: &str,
    kind: &str,
    client: &WmsClient<Channel>,
    concurrency: usize,
    calls_max: usize,
    repeat: bool,
) -> String {
    let run = Arc::new(format!("{kind}-{concurrency}-{}", rand::random::<u32>()));
    let started = Instant::now();
    let callers = (0..concurrency).map(|caller| {
        let (mut client, run) = (client.clone(), Arc::clone(&run));
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let per_caller = calls_max / concurrency.max(1);
            while started.elapsed() < MEASURE && latencies.len() < per_caller {
                let n = if repeat { 0 } else { latencies.len() };
                let request = request(&format!("{run}-{caller}-{n}"), caller + n);
                let call = Instant::now();
                let answer = client.lock_stock(request).await.expect("lock succeeds").into_inner();
                assert_eq!(answer.state(), pb::LockState::Locked);
                latencies.push(call.elapsed());
            }
            latencies
        })
    });
    let mut latencies: Vec<Duration> =
        futures::future::join_all(callers).await.into_iter().flat_map(|joined| joined.expect("caller")).collect();
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |p: f64| latencies.get(((latencies.len() as f64) * p) as usize).copied().unwrap_or_default();
    format!(
        "| {backend} | {kind} | {concurrency} | {} | {:.0} | {:.1} | {:.1} |",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.50).as_secs_f64() * 1_000.0,
        at(0.99).as_secs_f64() * 1_000.0,
    )
}

fn request(request_id: &str, sku_index: usize) -> pb::LockStockRequest {
    pb::LockStockRequest {
        request_id: request_id.to_owned(),
        order_no: format!("order-{request_id}"),
        lines: vec![pb::SkuLine { sku: format!("SKU-{:04}", sku_index % SKUS + 1), quantity: 1 }],
        reversal_voucher: format!("voucher-{request_id}"),
    }
}
