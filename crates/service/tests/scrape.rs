//! The Prometheus endpoint during a small run of the real services, in-process: the consumer
//! (`run_with`), the recovery service (`run`, with its periodic reconciliation and table
//! sample) and the mock downstreams over gRPC, on SQLite and then on MySQL/MariaDB.
//!
//! The run is shaped so every metric has something to count: ordinary orders, one order the
//! logistics provider refuses (a compensation), one consumer that stalls mid-call and wakes up
//! after recovery finished its saga (a takeover, a query by request id, a lost CAS), and one
//! effect in the WMS ledger that no saga owns (a reconciler finding and an open ticket). The
//! scrape must then agree with the database: transitions by from/to equal the transition log's
//! rows, takeovers equal its takeover rows, rows per status and open tickets equal the table's.
//! Last, a saga aged past the purge's horizon is purged through the service's own loop, once
//! its periodic reconciliation has judged it.
//!
//! Metrics are process-wide, so the engines run one after the other in one test and every
//! comparison is between a scrape before and a scrape after.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use midflight_api::client::Downstreams;
use midflight_config::{DatabaseSection, TelemetrySection};
use midflight_consumer::{ConsumerConfig, Counters};
use midflight_driver::{Downstream, DriverSettings};
use midflight_model::{Call, Observation, OrderEvent, Saga, Source, Status};
use midflight_recovery::{PurgeSection, RecoveryConfig};
use midflight_service::metrics::{CATALOGUE, Kind};
use midflight_stack::kafka::{EmbeddedKafka, Record};
use midflight_stack::{MockDownstreams, MockOptions};
use midflight_store::Store;
use midflight_store::testing::{Engine, TestDb, execute, order_event};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const ORDERS: &str = "orders";
/// Ordinary orders per engine.
const ORDINARY: usize = 12;
/// Generous bound on any one wait: the box is small and shared.
const WAIT: Duration = Duration::from_secs(90);

/// The labels and value of one series.
type Series = (BTreeMap<String, String>, f64);

/// One scrape: family name -> its series.
#[derive(Debug, Default, Clone)]
struct Scrape(BTreeMap<String, Vec<Series>>);

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut families: BTreeMap<String, Vec<Series>> = BTreeMap::new();
        for line in text.lines().filter(|line| !line.starts_with('#') && !line.trim().is_empty()) {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("unparsable line {line:?}"));
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("unparsable value in {line:?}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, labels(rest.trim_end_matches('}'))),
                None => (series, BTreeMap::new()),
            };
            families.entry(name.to_owned()).or_default().push((labels, value));
        }
        Scrape(families)
    }

    /// The sum over the series of `name` whose labels include every pair of `matching`.
    fn sum(&self, name: &str, matching: &[(&str, &str)]) -> f64 {
        self.0
            .get(name)
            .into_iter()
            .flatten()
            .filter(|(labels, _)| matching.iter().all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, value)| value)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

fn labels(text: &str) -> BTreeMap<String, String> {
    // Label values here never contain `",`; good enough for the exposition of our own metrics.
    text.split("\",")
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| pair.split_once("=\""))
        .map(|(key, value)| (key.to_owned(), value.trim_end_matches('"').to_owned()))
        .collect()
}

/// GET `path`; returns the status code and the body.
async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect to the endpoint");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read response");
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("status line");
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

async fn scrape(address: std::net::SocketAddr) -> Scrape {
    let (status, body) = get(address, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    Scrape::parse(&body)
}

/// Polls `check` against a fresh scrape until it holds.
async fn scrape_until(
    address: std::net::SocketAddr,
    what: &str,
    check: impl Fn(&Scrape) -> Result<(), String>,
) -> Scrape {
    let deadline = Instant::now() + WAIT;
    loop {
        let scraped = scrape(address).await;
        match check(&scraped) {
            Ok(()) => return scraped,
            Err(state) if Instant::now() >= deadline => panic!("timed out waiting for {what}: {state}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Holds every call of the sagas in `stalled` until they leave the set (a paused consumer
/// that wakes up later: a zombie).
#[derive(Clone)]
struct Stalling {
    inner: Downstreams,
    stalled: Arc<Mutex<HashSet<String>>>,
}

impl Downstream for Stalling {
    async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        while self.stalled.lock().expect("stall list").contains(&saga.biz_id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.inner.call(call, saga, timeout).await
    }
}

fn event(order_no: &str, region: &str) -> OrderEvent {
    let mut event = order_event(order_no);
    event.address.region = region.into();
    event
}

async fn wait_for(store: &Store, biz_id: &str, done: impl Fn(Status) -> bool) -> Saga {
    let deadline = Instant::now() + WAIT;
    loop {
        match store.get(biz_id).await.expect("read saga") {
            Some(saga) if done(saga.status) => return saga,
            other if Instant::now() >= deadline => panic!("{biz_id} not there in time: {:?}", other.map(|s| s.status)),
            _ => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// The transition log: rows per (from, to) with arrivals as `NONE`, and the takeover rows.
async fn transition_log(store: &Store) -> (BTreeMap<(String, String), u64>, u64) {
    let (mut edges, mut takeovers) = (BTreeMap::new(), 0);
    let mut after: Option<(String, u64)> = None;
    loop {
        let page = store.transitions_page(after.as_ref().map(|(b, v)| (b.as_str(), *v)), 500).await.expect("log page");
        let Some(last) = page.last() else { break };
        after = Some((last.biz_id.clone(), last.version));
        for row in &page {
            if row.is_takeover() {
                takeovers += 1;
            } else {
                let from = row.from.map_or("NONE", Status::as_str).to_owned();
                *edges.entry((from, row.to.as_str().to_owned())).or_default() += 1;
            }
        }
    }
    (edges, takeovers)
}

/// One run on `db`, checked against the scrapes of `endpoint`.
async fn run(db: &TestDb, endpoint: std::net::SocketAddr) {
    let tag = format!("{:?}-{}", db.engine, std::process::id());
    let kafka = EmbeddedKafka::start().expect("embedded kafka");
    kafka.create_topic(ORDERS, 4).expect("orders topic");
    kafka.create_topic("notifications", 1).expect("notifications topic");
    kafka.create_topic("orders.dlt", 1).expect("dead-letter topic");
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let before = scrape(endpoint).await;
    // A lease short enough for a takeover within seconds, long enough that a healthy drive on a
    // busy box never loses its saga (which would add conflicts the counts below do not expect).
    let settings = DriverSettings::new(5_000, 1_000, 500);

    let stalled = Arc::new(Mutex::new(HashSet::new()));
    let zombie = event(&format!("SC-{tag}-zombie"), "CN-ZJ");
    stalled.lock().expect("stall list").insert(zombie.biz_id());
    let mut config = ConsumerConfig { kafka: kafka.section(&format!("scrape-{tag}")), ..ConsumerConfig::default() };
    config.kafka.properties.insert("statistics.interval.ms".to_owned(), "500".to_owned());
    config.consumer.instance = "scraped".to_owned();
    config.consumer.relay.idle_ms = 50;
    config.driver = settings.clone();
    let counters = Arc::new(Counters::default());
    let stop_consumer = CancellationToken::new();
    let consumer = tokio::spawn(midflight_consumer::run_with(
        config,
        db.store.clone(),
        Stalling { inner: mocks.client(), stalled: stalled.clone() },
        counters.clone(),
        stop_consumer.clone(),
    ));

    let (wms, logistics) = mocks.sections();
    let mut recovery = RecoveryConfig {
        database: DatabaseSection { url: db.url.clone(), max_connections: 4, ..DatabaseSection::default() },
        wms,
        logistics,
        driver: settings,
        // Metrics on: the recovery service samples the table for them.
        telemetry: TelemetrySection { metrics_listen: Some("127.0.0.1:0".to_owned()), ..TelemetrySection::default() },
        ..RecoveryConfig::default()
    };
    recovery.recovery.scan_interval_ms = 50;
    recovery.recovery.reconcile_interval_ms = 500;
    recovery.recovery.migrate_on_start = false;
    // A purge of a day (no kafka section: trusted as set), a round every 100 ms.
    recovery.purge = PurgeSection { after_hours: 24, pause_ms: 10, interval_ms: 100, ..PurgeSection::default() };
    let stop_recovery = CancellationToken::new();
    let recovery = tokio::spawn(midflight_recovery::run(recovery, stop_recovery.clone()));

    let mut events: Vec<OrderEvent> = (0..ORDINARY).map(|n| event(&format!("SC-{tag}-{n:03}"), "CN-ZJ")).collect();
    events.push(event(&format!("SC-{tag}-refused"), "XX"));
    events.push(zombie.clone());
    let records: Vec<Record> = events.iter().map(|e| Record::keyed(&e.order_no, e.to_json())).collect();
    kafka.produce(ORDERS, &records).await.expect("produce");

    // The zombie's saga is taken over and finished by recovery; then the zombie wakes up.
    let finished = wait_for(&db.store, &zombie.biz_id(), |s| s == Status::Done).await;
    assert_eq!(finished.lease.epoch, 2, "one takeover");
    stalled.lock().expect("stall list").clear();
    for event in &events {
        wait_for(&db.store, &event.biz_id(), Status::is_terminal).await;
    }
    // A lock no saga owns: the reconciler reports it and opens a ticket.
    let stray = event(&format!("SC-{tag}-stray"), "CN-ZJ");
    let source = Source { topic: "elsewhere".to_owned(), partition: 0, offset: 0 };
    let stray = Saga::received(&stray, source, 0, i64::MAX);
    let answer = mocks.client().call(Call::LockStock, &stray, Duration::from_secs(5)).await;
    assert_eq!(answer.label(), "wms locked");

    // Everything below is counted after the commits waited on above (a drive is booked when it
    // returns, the consumer's counters when it joins the drive's task): wait for all of it.
    let after = scrape_until(endpoint, "the zombie's lost CAS, the orphan found, zero lag, every drive booked", |s| {
        let delta = |name: &str, labels: &[(&str, &str)]| s.sum(name, labels) - before.sum(name, labels);
        let lost = delta("midflight_saga_cas_conflicts_total", &[("operation", "write")]);
        // The stray lock's ticket is opened by the first pass that finds it.
        let orphans = delta("midflight_reconciler_findings_total", &[("kind", "orphan"), ("ticket", "opened")]);
        let lag = s.0.get("midflight_consumer_lag").map(|series| series.iter().map(|(_, v)| v).sum::<f64>());
        let published = s.sum("midflight_consumer_published_total", &[]);
        let done_drives = delta("midflight_saga_drives_total", &[("outcome", "DONE")]);
        let driving = s.sum("midflight_sagas_in_flight", &[]);
        let consumer_holds = s.sum("midflight_consumer_in_flight", &[]);
        let claimed = delta("midflight_recovery_claimed_total", &[]);
        if lost >= 1.0
            && orphans >= 1.0
            && lag == Some(0.0)
            && published as usize > ORDINARY
            && done_drives >= (ORDINARY + 1) as f64
            && driving == 0.0
            && consumer_holds == 0.0
            && claimed >= 1.0
        {
            Ok(())
        } else {
            Err(format!(
                "lost CAS {lost}, orphans {orphans}, lag {lag:?}, published {published}, DONE drives {done_drives}, \
                 sagas being driven {driving}, consumer's sagas in flight {consumer_holds}, recovery claims {claimed}"
            ))
        }
    })
    .await;
    // What the consumer's store has written by now, after the scrape: at least its share of it.
    let consumer_wrote = db.store.stats();
    // The table sample is taken every 15 s; take one now that the run is quiet.
    midflight_recovery::telemetry::sample_table(&db.store).await.expect("sample the table");
    let after_sample = scrape(endpoint).await;
    let delta = |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);

    // Transitions by from/to are the transition log's rows, exactly; takeovers its takeover rows.
    let (log, takeover_rows) = transition_log(&db.store).await;
    for ((from, to), rows) in &log {
        let counted = delta("midflight_saga_transitions_total", &[("from", from), ("to", to)]);
        assert_eq!(counted, *rows as f64, "transitions {from} -> {to}: metric {counted}, log {rows}");
    }
    let counted_total = delta("midflight_saga_transitions_total", &[]);
    assert_eq!(counted_total, log.values().sum::<u64>() as f64, "no transition counted that the log lacks");
    assert_eq!(delta("midflight_saga_takeovers_total", &[]), takeover_rows as f64);
    assert!(takeover_rows >= 1);
    assert!(delta("midflight_saga_takeovers_total", &[("actor", "recovery")]) >= 1.0);

    // Calls: every call the driver made reached the mock (the stray lock was sent by the test).
    for (method, by_test) in [("LockStock", 1.0), ("CreateShipment", 0.0)] {
        let client = delta("rpc_client_duration_seconds_count", &[("rpc_method", method)]);
        let served = delta("rpc_server_duration_seconds_count", &[("rpc_method", method)]);
        assert!(client >= ORDINARY as f64, "{method}: {client} client calls");
        assert_eq!(client + by_test, served, "{method}: client calls {client}, served {served}");
    }
    // A lock per order, recovery's resend after its query found nothing, the zombie's late repeat.
    let locks = delta("rpc_client_duration_seconds_count", &[("rpc_method", "LockStock")]);
    assert!(locks >= (ORDINARY + 3) as f64, "{locks} LockStock calls");
    let not_found =
        delta("midflight_downstream_queries_total", &[("rpc_method", "QueryLock"), ("answer", "wms not-found")]);
    assert!(not_found >= 1.0, "recovery asked before it resent: {not_found}");
    assert!(delta("rpc_client_duration_seconds_sum", &[]) > 0.0);
    let steps = delta("midflight_saga_step_duration_seconds_count", &[("result", "applied")]);
    assert!(steps >= 3.0 * ORDINARY as f64, "three steps per ordinary order at least: {steps}");
    assert!(delta("midflight_saga_cas_conflicts_total", &[("actor", "consumer"), ("operation", "write")]) >= 1.0);
    assert_eq!(delta("midflight_saga_compensations_total", &[("step", "WMS")]), 1.0, "the refused order's reversal");
    assert!(delta("midflight_saga_drives_total", &[("actor", "consumer"), ("outcome", "lost")]) >= 1.0);
    assert_eq!(
        delta("midflight_saga_drives_total", &[("outcome", "DONE")]),
        (ORDINARY + 1) as f64,
        "one finished drive per saga that ended DONE"
    );
    assert_eq!(after.sum("midflight_sagas_in_flight", &[]), 0.0, "nothing is being driven");

    // The consumer's own counters, one metric per field, as its snapshot says.
    let snapshot = counters.snapshot();
    assert_eq!(after.sum("midflight_consumer_received_total", &[]), snapshot.received as f64);
    assert_eq!(after.sum("midflight_consumer_done_total", &[]), snapshot.done as f64);
    assert_eq!(after.sum("midflight_consumer_lost_total", &[]), snapshot.lost as f64);
    assert!(snapshot.lost >= 1, "the zombie lost its saga");
    // The one consumer holds the whole topic, and says how many partitions the topic has.
    assert_eq!(after.sum("midflight_consumer_partitions_assigned", &[]), 4.0);
    assert_eq!(after.sum("midflight_consumer_topic_partitions", &[("topic", ORDERS)]), 4.0);
    assert!(after.sum("midflight_recovery_claimed_total", &[]) >= 1.0);

    // The saga stores' counters: the consumer's store (this test's, registered after `before`
    // was scraped, so the delta holds all of its count) and the recovery worker's own, summed.
    // The worker wrote too (it took the zombie's saga over and finished it), so the sum exceeds
    // what the consumer's store had written even after the scrape.
    for (field, name) in
        [("write_txns", "midflight_store_write_txns_total"), ("transitions", "midflight_store_transitions_total")]
    {
        let value = |stats: &midflight_store::StoreStats| {
            stats.fields().into_iter().find(|(f, _)| *f == field).map_or(0, |(_, v)| v)
        };
        let consumer = value(&consumer_wrote);
        let exported = delta(name, &[]);
        assert!(
            consumer > 0 && exported > consumer as f64,
            "{name}: {exported} exported, the consumer's store alone {consumer}"
        );
    }
    assert_eq!(delta("midflight_store_refused_total", &[]), 0.0, "the server never refused a connection");
    assert!(delta("midflight_reconciler_runs_total", &[("result", "ok")]) >= 1.0);

    // The table sample agrees with the table, for the unfinished statuses; the finished ones,
    // whose count is the table's history, are not sampled.
    for (status, rows, _) in db.store.status_summary().await.expect("status summary") {
        let sampled = after_sample.0.get("midflight_sagas").into_iter().flatten();
        let sampled: Vec<f64> = sampled
            .filter(|(labels, _)| labels.get("status").map(String::as_str) == Some(status.as_str()))
            .map(|(_, v)| *v)
            .collect();
        if status.is_terminal() {
            assert!(sampled.is_empty(), "{status} sampled: {sampled:?}");
        } else {
            assert_eq!(sampled.iter().sum::<f64>(), rows as f64, "rows in {status}");
        }
    }
    for status in Status::ALL.into_iter().filter(|s| !s.is_terminal()) {
        let age = after_sample.sum("midflight_saga_oldest_age_seconds", &[("status", status.as_str())]);
        assert_eq!(age, 0.0, "no saga waits in {status}");
        assert_eq!(after_sample.sum("midflight_sagas", &[("status", status.as_str())]), 0.0);
    }
    let tickets = db.store.open_ticket_count().await.expect("open tickets");
    assert!(tickets >= 1, "the orphan's ticket");
    assert_eq!(after_sample.sum("midflight_tickets_open", &[]), tickets as f64);
    assert_eq!(after_sample.sum("midflight_outbox_oldest_age_seconds", &[]), 0.0, "every notification published");

    // A notification ten minutes old that a relay which went away holds: the sample says how
    // old the oldest one waiting is.
    let waiting = events[0].biz_id();
    execute(
        &db.store,
        &format!(
            "UPDATE outbox SET published_at_ms = NULL, relay_owner = 'gone', relay_until_ms = 9000000000000, \
             created_at_ms = created_at_ms - 600000 WHERE biz_id = '{waiting}'"
        ),
    )
    .await;
    let unpublished = midflight_recovery::telemetry::sample_table(&db.store).await;
    assert!(unpublished.is_ok(), "{unpublished:?}");
    scrape_until(endpoint, "the waiting notification's age", |s| {
        let age = s.sum("midflight_outbox_oldest_age_seconds", &[]);
        if age >= 600.0 { Ok(()) } else { Err(format!("{age} s")) }
    })
    .await;
    execute(&db.store, &format!("UPDATE outbox SET published_at_ms = 1 WHERE biz_id = '{waiting}'")).await;

    // Every metric the services claim to export is there.
    let mut families: Vec<(String, Kind)> =
        CATALOGUE.iter().map(|spec| (spec.prometheus.to_owned(), spec.kind)).collect();
    families.extend(midflight_consumer::telemetry::metric_names().into_iter().map(|name| (name, Kind::Counter)));
    families.extend(midflight_recovery::telemetry::metric_names().into_iter().map(|name| (name, Kind::Counter)));
    for (family, kind) in families {
        let series = if kind == Kind::Histogram { format!("{family}_count") } else { family.clone() };
        assert!(after_sample.has(&series), "{series} is not exported");
    }
    assert_eq!(after_sample.sum("midflight_sagas_unknown_status", &[]), 0.0);

    // A row whose status this version does not know (as a newer version might leave) is
    // counted by the next sample, which names its status.
    let finished = db.store.page("", 1).await.expect("page").remove(0).biz_id;
    execute(&db.store, &format!("UPDATE saga SET status = 'ARCHIVED' WHERE biz_id = '{finished}'")).await;
    let unknown = midflight_recovery::telemetry::sample_table(&db.store).await.expect("sample the table");
    assert_eq!(unknown, (vec![("ARCHIVED".to_owned(), 1)], false));
    // The recovery worker samples too: one it began before the update may record 0 after this
    // one; its next sample, within 15 s, records 1 again.
    midflight_store::testing::until("the scrape to count the row", || async {
        scrape(endpoint).await.sum("midflight_sagas_unknown_status", &[]) == 1.0
    })
    .await;

    // A saga last written two days ago is purged once a periodic pass has judged it (the
    // passes' checkpoint is past it from the first one on), and the purge's gauges say what
    // it purges by.
    let aged = events.iter().map(OrderEvent::biz_id).find(|id| *id != finished).expect("another saga");
    midflight_store::testing::age(&db.store, &aged, Status::Done, 48 * 3_600_000).await;
    let purged = scrape_until(endpoint, "the two-day-old saga purged", |s| {
        let purged = s.sum("midflight_recovery_purged_sagas_total", &[])
            - before.sum("midflight_recovery_purged_sagas_total", &[]);
        if purged >= 1.0 { Ok(()) } else { Err(format!("{purged} purged")) }
    })
    .await;
    assert_eq!(db.store.get(&aged).await.expect("read saga"), None, "{aged} purged");
    assert_eq!(purged.sum("midflight_purge_horizon_seconds", &[]), 86_400.0, "the horizon in force");
    assert_eq!(purged.sum("midflight_purge_topic_retention_seconds", &[]), 0.0, "no topic read");
    assert_eq!(purged.sum("midflight_reconciler_late_depth_ratio", &[]), 0.0, "no late ledger entry");

    assert_eq!(get(endpoint, "/readyz").await.0, 200, "consumer and recovery said they are ready");
    stop_recovery.cancel();
    recovery.await.expect("recovery task").expect("recovery stops cleanly");
    stop_consumer.cancel();
    consumer.await.expect("consumer task").expect("consumer stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_scrape_agrees_with_the_table() {
    let section = TelemetrySection {
        log_filter: "warn".to_owned(),
        metrics_listen: Some("127.0.0.1:0".to_owned()),
        ..TelemetrySection::default()
    };
    let telemetry = midflight_service::init_telemetry("scrape-test", &section).expect("telemetry");
    let endpoint = telemetry.endpoint_address().expect("the endpoint is served");
    assert_eq!(get(endpoint, "/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(get(endpoint, "/nope").await.0, 404);
    midflight_service::readiness().set_ready(false);
    assert_eq!(get(endpoint, "/readyz").await.0, 503);

    let sqlite = TestDb::fresh(Engine::Sqlite).await.expect("sqlite");
    run(&sqlite, endpoint).await;
    if let Some(mysql) = TestDb::fresh(Engine::MySql).await {
        run(&mysql, endpoint).await;
    }
    telemetry.shutdown().await;
}
