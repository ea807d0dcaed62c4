//! End-to-end throughput of the consumer: order events in Kafka -> DONE sagas with one lock,
//! one shipment and a published notification each, through the real run loop (`run_with`),
//! the embedded Kafka (librdkafka's mock cluster, 3 brokers, 16 partitions), the mock WMS and
//! logistics over loopback gRPC with the user's latencies injected (LockStock p50 60 / p99 180
//! ms, CreateShipment p50 110 / p99 320 ms), and the saga store on SQLite and, when
//! `MIDFLIGHT_TEST_MYSQL_URL` is set, MariaDB. Everything shares one process and the box's cores.
//!
//! Not a test: it prints one table row per backend and scenario.
//! - `backlog`: the whole backlog is produced first; msg/s is the most this box sustains.
//! - `paced`: messages arrive at a fixed rate below that, and the end-to-end percentiles (from
//!   the produce call to the DONE commit) are the latency a message sees when the system keeps up.
//!
//! "saga" percentiles run from a row's insert to its DONE commit (both by the database clock).
//!
//! Run: `MIDFLIGHT_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo bench -p midflight-consumer`.
//! Knobs for diagnosis (defaults are what BENCHMARKS.md records): `MIDFLIGHT_BENCH_MESSAGES`
//! (backlog size, 10,000), `MIDFLIGHT_BENCH_RATE` (paced msg/s, 150), `MIDFLIGHT_BENCH_POOL`
//! (database pool, the production default 32), `MIDFLIGHT_BENCH_LATENCY=off` (no injected latency).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use midflight_config::DatabaseSection;
use midflight_consumer::{ConsumerConfig, Counters, Snapshot};
use midflight_model::Status;
use midflight_stack::kafka::{EmbeddedKafka, Record};
use midflight_stack::{MethodFaults, MockDownstreams, MockOptions, fault};
use midflight_store::Store;
use midflight_store::testing::{Engine, TestDb, order_event};
use sea_orm::{ConnectionTrait, Statement};
use tokio_util::sync::CancellationToken;

const BACKLOG_DEFAULT: usize = 10_000;
const RATE_DEFAULT: usize = 150;
/// How long the paced scenario produces.
const PACED_FOR: Duration = Duration::from_secs(20);
/// The paced producer sends a burst this often.
const PACE_TICK: Duration = Duration::from_millis(100);
/// As many partitions as the user's topic.
const PARTITIONS: i32 = 16;
/// Messages produced per awaited burst of the backlog.
const PRODUCE_CHUNK: usize = 5_000;
/// Longest a run may take before the bench gives up.
const RUN_MAX: Duration = Duration::from_secs(900);
/// How often progress is sampled.
const SAMPLE: Duration = Duration::from_millis(100);
/// Rows read per page when collecting saga durations.
const PAGE: u64 = 1_000;

#[derive(Debug, Clone, Copy)]
enum Scenario {
    Backlog { messages: usize },
    Paced { rate: usize },
}

impl Scenario {
    fn messages(self) -> usize {
        match self {
            Scenario::Backlog { messages } => messages,
            Scenario::Paced { rate } => rate * PACED_FOR.as_secs() as usize,
        }
    }

    fn name(self) -> String {
        match self {
            Scenario::Backlog { .. } => "backlog".to_owned(),
            Scenario::Paced { rate } => format!("paced {rate}/s"),
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let scenarios = [
        Scenario::Backlog { messages: knob("MIDFLIGHT_BENCH_MESSAGES").unwrap_or(BACKLOG_DEFAULT) },
        Scenario::Paced { rate: knob("MIDFLIGHT_BENCH_RATE").unwrap_or(RATE_DEFAULT) },
    ];
    runtime.block_on(async {
        println!(
            "| backend | scenario | messages | msg/s | saga p50 ms | saga p99 ms | end-to-end p50 ms | end-to-end p99 ms | in flight max | mean batch | write txns/msg | write statements/msg |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        for engine in [Engine::Sqlite, Engine::MySql] {
            for scenario in scenarios {
                if let Some(db) = TestDb::fresh(engine).await {
                    println!("{}", bench(&db, scenario).await);
                }
            }
        }
    });
}

fn knob(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

struct Report {
    backend: &'static str,
    scenario: Scenario,
    wall: Duration,
    saga: Histogram<u64>,
    /// Produce call to DONE commit (paced only).
    end_to_end: Option<Histogram<u64>>,
    in_flight_max: u64,
    end: Snapshot,
    /// MariaDB's global statement counters over the run (all clients of the server).
    mysql: Option<MysqlCounts>,
}

#[derive(Debug, Clone, Copy, Default)]
struct MysqlCounts {
    commits: u64,
    writes: u64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.scenario.messages() as f64;
        let (txns, statements) = match self.mysql {
            Some(counts) => (format!("{:.2}", counts.commits as f64 / n), format!("{:.2}", counts.writes as f64 / n)),
            None => ("n/a".to_owned(), "n/a".to_owned()),
        };
        let (e2e_p50, e2e_p99) = match &self.end_to_end {
            Some(h) => (h.value_at_quantile(0.50).to_string(), h.value_at_quantile(0.99).to_string()),
            None => ("-".to_owned(), "-".to_owned()),
        };
        write!(
            f,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.0} | {} | {} |",
            self.backend,
            self.scenario.name(),
            self.scenario.messages(),
            n / self.wall.as_secs_f64(),
            self.saga.value_at_quantile(0.50),
            self.saga.value_at_quantile(0.99),
            e2e_p50,
            e2e_p99,
            self.in_flight_max,
            self.end.received as f64 / self.end.batches.max(1) as f64,
            txns,
            statements,
        )
    }
}

async fn bench(db: &TestDb, scenario: Scenario) -> Report {
    let kafka = Arc::new(EmbeddedKafka::start().expect("embedded kafka"));
    for (topic, partitions) in [("orders", PARTITIONS), ("notifications", PARTITIONS), ("orders.dlt", 1)] {
        kafka.create_topic(topic, partitions).expect("create topic");
    }
    let mocks = MockDownstreams::start(mock_options()).await;
    let mut section = DatabaseSection { url: db.url.clone(), ..DatabaseSection::default() };
    if let Some(pool) = knob("MIDFLIGHT_BENCH_POOL") {
        section.max_connections = u32::try_from(pool).expect("pool size");
    }
    let store = Store::connect(&section).await.expect("connect to the bench database");
    let records = records(scenario.messages());
    let produced_at = Arc::new(Mutex::new(HashMap::with_capacity(records.len())));
    let producer = match scenario {
        Scenario::Backlog { .. } => {
            for chunk in records.chunks(PRODUCE_CHUNK) {
                kafka.produce("orders", chunk).await.expect("produce backlog");
            }
            None
        }
        Scenario::Paced { rate } => Some(tokio::spawn(paced(kafka.clone(), records, rate, produced_at.clone()))),
    };

    let before = mysql_counts(db).await;
    let counters = Arc::new(Counters::default());
    let shutdown = CancellationToken::new();
    let config = ConsumerConfig { kafka: kafka.section("bench"), ..ConsumerConfig::default() };
    let task = tokio::spawn(midflight_consumer::run_with(
        config,
        store.clone(),
        mocks.client(),
        counters.clone(),
        shutdown.clone(),
    ));
    let (wall, in_flight_max) = watch(&counters, scenario.messages() as u64).await;
    let after = mysql_counts(db).await;
    shutdown.cancel();
    task.await.expect("consumer task").expect("consumer ends cleanly");
    if let Some(producer) = producer {
        producer.await.expect("paced producer");
    }
    let end = counters.snapshot();
    assert_eq!(end.done, scenario.messages() as u64, "every saga DONE: {end:?}");
    let produced_at = std::mem::take(&mut *produced_at.lock().expect("produce times"));
    let (saga, end_to_end) = durations(&store, &produced_at).await;

    Report {
        backend: match db.engine {
            Engine::Sqlite => "sqlite",
            Engine::MySql => "mariadb",
        },
        scenario,
        wall,
        saga,
        end_to_end: matches!(scenario, Scenario::Paced { .. }).then_some(end_to_end),
        in_flight_max,
        end,
        mysql: before
            .zip(after)
            .map(|(b, a)| MysqlCounts { commits: a.commits - b.commits, writes: a.writes - b.writes }),
    }
}

/// The user's latencies, unless `MIDFLIGHT_BENCH_LATENCY=off`.
fn mock_options() -> MockOptions {
    let off = std::env::var("MIDFLIGHT_BENCH_LATENCY").is_ok_and(|v| v == "off");
    let ((wms_p50, wms_p99), (lgx_p50, lgx_p99)) = if off { ((0, 0), (0, 0)) } else { ((60, 180), (110, 320)) };
    MockOptions {
        wms_faults: fault("LockStock", MethodFaults::with_latency(wms_p50, wms_p99)),
        logistics_faults: fault("CreateShipment", MethodFaults::with_latency(lgx_p50, lgx_p99)),
        ..MockOptions::default()
    }
}

/// Distinct orders, spread over the mock's 100 SKUs.
fn records(messages: usize) -> Vec<Record> {
    (0..messages)
        .map(|n| {
            let mut event = order_event(&format!("B-{n:07}"));
            event.lines[0].sku = format!("SKU-{:04}", n % 100 + 1);
            Record::keyed(&event.order_no, event.to_json())
        })
        .collect()
}

/// Produces `records` at `rate` per second, a burst every [`PACE_TICK`], noting when each
/// order was produced (wall clock, ms: the same clock the database on this box reads).
async fn paced(kafka: Arc<EmbeddedKafka>, records: Vec<Record>, rate: usize, produced_at: ProduceTimes) {
    let per_tick = (rate * PACE_TICK.as_millis() as usize / 1_000).max(1);
    let mut ticks = tokio::time::interval(PACE_TICK);
    for burst in records.chunks(per_tick) {
        ticks.tick().await;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let orders = burst.iter().filter_map(|r| r.key.clone()).map(|order_no| (order_no, now_ms));
        produced_at.lock().expect("produce times").extend(orders);
        kafka.produce("orders", burst).await.expect("produce paced burst");
    }
}

/// Order number -> when it was produced (ms since the Unix epoch).
type ProduceTimes = Arc<Mutex<HashMap<String, i64>>>;

/// Waits until every saga and notification is done; returns the time from the first message
/// received to the last notification published, and the most sagas in flight seen.
async fn watch(counters: &Counters, messages: u64) -> (Duration, u64) {
    let deadline = Instant::now() + RUN_MAX;
    let mut first = None;
    let mut in_flight_max = 0;
    loop {
        let s = counters.snapshot();
        in_flight_max = in_flight_max.max(s.in_flight);
        if first.is_none() && s.received > 0 {
            first = Some(Instant::now());
        }
        if s.done == messages && s.published == messages {
            break;
        }
        assert!(Instant::now() < deadline, "bench did not finish: {s:?}");
        assert_eq!(
            s.finished() - s.done + s.handed_off + s.failed + s.lost + s.aborted,
            0,
            "a saga went astray: {s:?}"
        );
        tokio::time::sleep(SAMPLE).await;
    }
    (first.map(|t| t.elapsed()).unwrap_or_default(), in_flight_max)
}

/// Insert-to-DONE and produce-to-DONE times of every saga, in milliseconds.
async fn durations(store: &Store, produced_at: &HashMap<String, i64>) -> (Histogram<u64>, Histogram<u64>) {
    let mut saga = Histogram::<u64>::new(3).expect("histogram");
    let mut end_to_end = Histogram::<u64>::new(3).expect("histogram");
    let mut after = String::new();
    loop {
        let page = store.page(&after, PAGE).await.expect("page through sagas");
        let Some(last) = page.last() else { break };
        after = last.biz_id.clone();
        for row in page.iter().filter(|s| s.status == Status::Done) {
            saga.record(u64::try_from(row.updated_at_ms - row.created_at_ms).unwrap_or(0)).expect("record");
            if let Some(produced) = produced_at.get(&row.order_no) {
                end_to_end.record(u64::try_from(row.updated_at_ms - produced).unwrap_or(0)).expect("record");
            }
        }
    }
    (saga, end_to_end)
}

/// MariaDB's global commit and write-statement counters (`None` on SQLite).
async fn mysql_counts(db: &TestDb) -> Option<MysqlCounts> {
    if db.engine != Engine::MySql {
        return None;
    }
    let sql = "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Com_insert', 'Com_update')";
    let rows = db
        .store
        .connection()
        .query_all_raw(Statement::from_string(db.store.backend(), sql))
        .await
        .expect("read global status");
    let mut counts = MysqlCounts::default();
    for row in rows {
        let name: String = row.try_get_by_index(0).expect("name");
        let value: String = row.try_get_by_index(1).expect("value");
        let value: u64 = value.parse().expect("counter");
        match name.as_str() {
            "Com_commit" => counts.commits = value,
            _ => counts.writes += value,
        }
    }
    Some(counts)
}
