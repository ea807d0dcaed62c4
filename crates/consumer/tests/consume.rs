//! The consumer end to end: the real run loop (`run_with`) against librdkafka's mock cluster
//! (and, for the tests whose names contain `_on_an_external_kafka`, the broker
//! `MIDFLIGHT_TEST_KAFKA` names, e.g. Tansu), the mock WMS and logistics over gRPC on loopback,
//! and the real store on SQLite and MariaDB.
//! Every test checks the effects that really happened (the downstreams' ledgers, the calls
//! sent, the committed offsets, the topics), not only the rows.
//!
//! Waits poll a condition against a deadline; nothing sleeps hoping something has happened.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use midflight_api::client::{Downstreams, LedgerEntry, LedgerKind};
use midflight_consumer::{ConsumerConfig, Counters, Error, Snapshot};
use midflight_driver::{Downstream, Driver, DriverSettings, Outcome};
use midflight_model::{Call, Observation, OrderEvent, Rules, Saga, Source, Status, Step};
use midflight_stack::kafka::{EmbeddedKafka, Record};
use midflight_stack::{MethodFaults, MockDownstreams, MockOptions, fault};
use midflight_store::testing::{TestDb, order_event, required_in_ci};
use midflight_store::{Store, both_engines};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const ORDERS: &str = "orders";
const PARTITIONS: i32 = 8;
/// Generous bound on any one wait: the box is small and shared.
const WAIT: Duration = Duration::from_secs(60);

/// The variable naming an external Kafka (its `bootstrap.servers`) for the tests that also run
/// against one, e.g. a Tansu broker (`.ci/run` starts one).
const TEST_KAFKA_VAR: &str = "MIDFLIGHT_TEST_KAFKA";

/// The external Kafka for tests, `None` (with a note) when [`TEST_KAFKA_VAR`] is unset outside
/// CI, where a missing variable fails the test instead.
fn test_external_kafka() -> Option<String> {
    required_in_ci(TEST_KAFKA_VAR, "the tests against an external Kafka", "the run against an external Kafka")
}

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// Every effectful and querying call any consumer in a test sent, in order.
#[derive(Clone)]
struct Recorded {
    inner: Downstreams,
    calls: Arc<Mutex<Vec<(Call, String)>>>,
}

impl Downstream for Recorded {
    async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        self.calls.lock().expect("call log").push((call, saga.biz_id.clone()));
        self.inner.call(call, saga, timeout).await
    }
}

impl Recorded {
    /// How many times `call` was sent for each biz_id.
    fn count(&self, call: Call) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (sent, biz_id) in self.calls.lock().expect("call log").iter() {
            if *sent == call {
                *counts.entry(biz_id.clone()).or_default() += 1;
            }
        }
        counts
    }
}

/// Which Kafka a test runs on.
enum Broker {
    /// librdkafka's mock cluster, fresh for the test: the user's topic names.
    Embedded,
    /// A broker another process runs (`bootstrap.servers`), shared with other tests and runs:
    /// topics and groups named for this test alone.
    External(String),
}

/// A cluster with the three topics, the mocks, and a recorder around their client.
struct Harness {
    kafka: EmbeddedKafka,
    /// What this test's topic and group names start with ("" on the embedded cluster).
    prefix: String,
    orders: String,
    notifications: String,
    dead_letters: String,
    /// Per partition of the order topic, the offset after the last message this test produced.
    produced: Mutex<BTreeMap<i32, i64>>,
    mocks: MockDownstreams,
    downstream: Recorded,
}

impl Harness {
    async fn start(options: MockOptions) -> Harness {
        Harness::start_on(Broker::Embedded, options).await
    }

    async fn start_on(broker: Broker, options: MockOptions) -> Harness {
        let (kafka, prefix) = match broker {
            Broker::Embedded => (EmbeddedKafka::start().expect("embedded kafka"), String::new()),
            Broker::External(bootstrap) => {
                let kafka = EmbeddedKafka::connect(&bootstrap).expect("a client of the external Kafka");
                (kafka, format!("t-{}.", uuid::Uuid::new_v4().simple()))
            }
        };
        let (orders, notifications, dead_letters) =
            (format!("{prefix}{ORDERS}"), format!("{prefix}notifications"), format!("{prefix}orders.dlt"));
        let topics = [(orders.as_str(), PARTITIONS), (notifications.as_str(), 4), (dead_letters.as_str(), 1)];
        kafka.create_topics(&topics, 1).await.expect("the order, notification and dead-letter topics");
        let mocks = MockDownstreams::start(options).await;
        let downstream = Recorded { inner: mocks.client(), calls: Arc::default() };
        Harness { kafka, prefix, orders, notifications, dead_letters, produced: Mutex::default(), mocks, downstream }
    }

    /// This test's name for `group`.
    fn group(&self, group: &str) -> String {
        format!("{}{group}", self.prefix)
    }

    fn config(&self, group: &str, instance: &str) -> ConsumerConfig {
        let mut config = ConsumerConfig { kafka: self.kafka.section(&self.group(group)), ..ConsumerConfig::default() };
        config.kafka.order_topic = self.orders.clone();
        config.kafka.notification_topic = self.notifications.clone();
        config.kafka.dead_letter_topic = self.dead_letters.clone();
        config.consumer.instance = instance.to_owned();
        config.consumer.relay.idle_ms = 50;
        config
    }

    fn start_consumer(&self, config: ConsumerConfig, store: &Store) -> Running {
        let counters = Arc::new(Counters::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(midflight_consumer::run_with(
            config,
            store.clone(),
            self.downstream.clone(),
            counters.clone(),
            shutdown.clone(),
        ));
        Running { task, counters, shutdown }
    }

    async fn produce(&self, records: &[Record]) -> Vec<(i32, i64)> {
        let placed = self.kafka.produce(&self.orders, records).await.expect("produce order events");
        let mut produced = self.produced.lock().expect("produced offsets");
        for (partition, offset) in &placed {
            let end = produced.entry(*partition).or_default();
            *end = (*end).max(offset + 1);
        }
        placed
    }

    async fn produce_events(&self, events: &[OrderEvent]) -> Vec<(i32, i64)> {
        self.produce(&events.iter().map(record).collect::<Vec<_>>()).await
    }

    async fn ledgers(&self) -> (Vec<LedgerEntry>, Vec<LedgerEntry>) {
        let client = self.mocks.client();
        let timeout = Duration::from_secs(5);
        let wms = client.wms_ledger(0, 10_000, timeout).await.expect("wms ledger").0;
        let logistics = client.logistics_ledger(0, 10_000, timeout).await.expect("logistics ledger").0;
        (wms, logistics)
    }

    /// Every partition of the order topic committed up to the end of what the test produced
    /// (known from the produce answers: not every broker lists a partition's end right, see
    /// `midflight_stack::kafka`'s `read_topic`).
    async fn assert_all_committed(&self, group: &str) {
        let ends = self.produced.lock().expect("produced offsets").clone();
        let committed = self.kafka.committed(&self.group(group), &self.orders).await.expect("committed offsets");
        assert_eq!(committed, ends, "committed offsets must reach the end of every partition");
    }
}

/// A consumer running the real loop in a task.
struct Running {
    task: JoinHandle<Result<(), Error>>,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
}

impl Running {
    fn snapshot(&self) -> Snapshot {
        self.counters.snapshot()
    }

    /// The counters, and whether the run has already ended (for a failed wait's message).
    fn report(&self) -> String {
        let ended = if self.task.is_finished() { " (its run has ended)" } else { "" };
        format!("{:?}{ended}", self.snapshot())
    }

    /// Graceful shutdown; the run must end cleanly.
    async fn stop(self) -> Snapshot {
        self.shutdown.cancel();
        let result = tokio::time::timeout(WAIT, self.task).await.expect("consumer stops in time");
        result.expect("consumer task").expect("consumer ends cleanly");
        self.counters.snapshot()
    }
}

/// Waits until the group moved partitions from `first` to `second`, which joined after it.
async fn partitions_moved(first: &Running, second: &Running) {
    eventually("partitions moved from the first consumer to the second", || async {
        let (a, b) = (first.snapshot(), second.snapshot());
        if a.partitions_revoked > 0 && b.partitions_assigned > 0 {
            Ok(())
        } else {
            Err(format!("first {a:?}\nsecond {b:?}"))
        }
    })
    .await;
}

/// Polls `check` until it holds, failing with `what` and the last state after [`WAIT`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match check().await {
            Ok(()) => return,
            Err(state) if Instant::now() >= deadline => panic!("timed out waiting for {what}: {state}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

fn event(order_no: &str, event_type: &str) -> OrderEvent {
    OrderEvent { event_type: event_type.into(), ..order_event(order_no) }
}

fn record(event: &OrderEvent) -> Record {
    Record::keyed(&event.order_no, event.to_json())
}

/// `record`, sent to partition 0.
fn on_zero(mut record: Record) -> Record {
    record.partition = Some(0);
    record
}

fn orders(prefix: &str, count: usize) -> Vec<OrderEvent> {
    (0..count).map(|n| event(&format!("{prefix}-{n:04}"), "PAID")).collect()
}

async fn statuses(store: &Store) -> BTreeMap<Status, u64> {
    store.status_summary().await.expect("status summary").into_iter().map(|(s, n, _)| (s, n)).collect()
}

async fn saga(store: &Store, biz_id: &str) -> Saga {
    store.get(biz_id).await.expect("read saga").unwrap_or_else(|| panic!("no row for {biz_id}"))
}

/// One effect per biz_id in a ledger, all under our deterministic request ids.
fn assert_one_apply_each(ledger: &[LedgerEntry], events: &[OrderEvent], step: Step) {
    let wanted: BTreeSet<String> = events.iter().map(|e| midflight_model::request_id(&e.biz_id(), step)).collect();
    let applied: Vec<&str> =
        ledger.iter().filter(|e| e.kind == LedgerKind::Apply).map(|e| e.request_id.as_str()).collect();
    assert_eq!(applied.len(), wanted.len(), "one {step:?} effect per saga: {ledger:?}");
    assert_eq!(applied.iter().map(|id| id.to_string()).collect::<BTreeSet<_>>(), wanted);
    assert!(ledger.iter().all(|e| e.kind == LedgerKind::Apply), "nothing but effects: {ledger:?}");
}

/// Each biz_id was sent `call` exactly once, across every consumer and recovery in the test.
fn assert_sent_once(downstream: &Recorded, call: Call, events: &[OrderEvent]) {
    let counts = downstream.count(call);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "{call:?} sent more than once: {twice:?}");
    assert_eq!(counts.len(), events.len(), "{call:?} sent for every saga");
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Forty orders through one consumer, their first steps written in the inbox transaction
/// (`open_in_inbox`) or by their drives.
async fn orders_complete_with(db: &TestDb, open_in_inbox: bool, broker: Broker) {
    let harness = Harness::start_on(broker, MockOptions::default()).await;
    let events = orders("E", 40);
    let records: Vec<Record> = events.iter().map(record).collect();
    harness.produce(&records).await;
    let mut config = harness.config("g1", "c1");
    config.consumer.open_in_inbox = open_in_inbox;
    let consumer = harness.start_consumer(config, &db.store);
    eventually("every saga DONE and its notification published", || async {
        let snapshot = consumer.snapshot();
        if snapshot.done == 40 && snapshot.published == 40 { Ok(()) } else { Err(format!("{snapshot:?}")) }
    })
    .await;
    let snapshot = consumer.stop().await;
    assert_eq!((snapshot.received, snapshot.fresh, snapshot.skipped, snapshot.parked), (40, 40, 0, 0));
    // Written claimed for this consumer's relay and handed to it: no scan took any of them.
    assert_eq!(snapshot.relay_handed, 40, "{snapshot:?}");
    // Forty different orders with nothing before them: every one is opened, or none.
    assert_eq!(snapshot.opened, if open_in_inbox { 40 } else { 0 });

    assert_eq!(statuses(&db.store).await, BTreeMap::from([(Status::Done, 40)]));
    let (wms, logistics) = harness.ledgers().await;
    assert_one_apply_each(&wms, &events, Step::Wms);
    assert_one_apply_each(&logistics, &events, Step::Logistics);
    assert_sent_once(&harness.downstream, Call::LockStock, &events);
    assert_sent_once(&harness.downstream, Call::CreateShipment, &events);
    let outbox = db.store.outbox_rows().await.expect("outbox");
    assert_eq!(outbox.len(), 40);
    assert!(outbox.iter().all(|(_, published)| *published), "every outbox row published: {outbox:?}");
    let notifications = harness.kafka.read_topic(&harness.notifications, WAIT).await.expect("notifications");
    let keys: BTreeSet<String> = notifications.iter().filter_map(|n| n.key.clone()).collect();
    assert_eq!(keys, events.iter().map(OrderEvent::biz_id).collect::<BTreeSet<_>>());
    harness.assert_all_committed("g1").await;

    // A consumer of another group reads everything again: every row exists and is terminal,
    // so nothing is driven and nothing is sent.
    let calls_before = harness.downstream.calls.lock().expect("call log").len();
    let again = harness.start_consumer(harness.config("g2", "c2"), &db.store);
    eventually("the redelivered messages skipped", || async {
        let snapshot = again.snapshot();
        if snapshot.skipped == 40 { Ok(()) } else { Err(format!("{snapshot:?}")) }
    })
    .await;
    let snapshot = again.stop().await;
    assert_eq!((snapshot.fresh, snapshot.claims), (0, 0));
    assert_eq!(harness.downstream.calls.lock().expect("call log").len(), calls_before, "no call for a redelivery");
}
async fn orders_complete(db: &TestDb) {
    orders_complete_with(db, true, Broker::Embedded).await;
}
both_engines!(orders_complete_once_each, orders_complete);

/// The same on a second implementation of the Kafka protocol (`MIDFLIGHT_TEST_KAFKA`).
async fn orders_complete_on_external(db: &TestDb) {
    if let Some(bootstrap) = test_external_kafka() {
        orders_complete_with(db, true, Broker::External(bootstrap)).await;
    }
}
both_engines!(orders_complete_once_each_on_an_external_kafka, orders_complete_on_external);

async fn orders_complete_opened_by_drives(db: &TestDb) {
    orders_complete_with(db, false, Broker::Embedded).await;
}
both_engines!(orders_complete_without_opening_in_the_inbox, orders_complete_opened_by_drives);

/// Sagas finished by another process (the recovery worker, here a store handle of the test)
/// leave their outbox rows unclaimed: a consumer's relay finds them by its scan and publishes
/// them, though it finished none of them.
async fn notifications_written_elsewhere(db: &TestDb) {
    let harness = Harness::start(MockOptions::default()).await;
    let names: Vec<String> = (0..12).map(|n| format!("X-{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut finished = BTreeSet::new();
    for saga in midflight_store::testing::arrive_orders(&db.store, &names).await {
        let done = midflight_store::testing::drive_to_done(&db.store, saga, "recovery:test", 60_000).await;
        finished.insert(done.biz_id);
    }
    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("the notifications written elsewhere published", || async {
        let snapshot = consumer.snapshot();
        if snapshot.published == 12 { Ok(()) } else { Err(format!("{snapshot:?}")) }
    })
    .await;
    let snapshot = consumer.stop().await;
    assert_eq!((snapshot.done, snapshot.relay_handed), (0, 0), "{snapshot:?}");
    assert!(db.store.outbox_rows().await.expect("outbox").iter().all(|(_, published)| *published));
    let notifications = harness.kafka.read_topic(&harness.notifications, WAIT).await.expect("notifications");
    let keys: BTreeSet<String> = notifications.iter().filter_map(|n| n.key.clone()).collect();
    assert_eq!(keys, finished);
}
both_engines!(notifications_written_elsewhere_are_published_by_a_scan, notifications_written_elsewhere);

/// Stands in for the recovery worker (same driver, same claim): resumes every abandoned saga.
async fn recover_abandoned(store: &Store, downstream: &Recorded) {
    let recovery = Driver::new(
        store.clone(),
        downstream.clone(),
        Rules::default(),
        DriverSettings::default(),
        "recovery-test".to_owned(),
        "recovery:test".to_owned(),
        CancellationToken::new(),
    );
    for saga in store.abandoned(1_000).await.expect("abandoned sagas") {
        let outcome = recovery.claim_and_drive(&saga.biz_id).await;
        assert!(matches!(outcome, Some(Outcome::Finished(Status::Done))), "{}: {outcome:?}", saga.biz_id);
    }
}

/// How a rebalance test's consumers stop at the in-flight bound.
#[derive(Clone, Copy, PartialEq)]
enum AtTheBound {
    /// Pause the partitions at once (`pause_after_ms=0`).
    Pause,
    /// Only stop taking messages, never long enough to pause: a rebalance that comes during a
    /// stop is served when the stop ends.
    Stop,
}

async fn rebalance_on(db: &TestDb, broker: Broker, at_the_bound: AtTheBound) {
    // The user's downstream latencies, and a small in-flight bound, so that a backlog waits in
    // Kafka and sagas are mid-flight while partitions move, the consumers mostly stopped at the
    // bound.
    let mut options =
        MockOptions { wms_faults: fault("LockStock", MethodFaults::with_latency(60, 180)), ..MockOptions::default() };
    options.logistics_faults = fault("CreateShipment", MethodFaults::with_latency(110, 320));
    let harness = Harness::start_on(broker, options).await;
    let config = |instance: &str| {
        let mut config = harness.config("g", instance);
        (config.consumer.in_flight_max, config.consumer.resume_below) = (16, 8);
        config.consumer.pause_after_ms = match at_the_bound {
            AtTheBound::Pause => 0,
            AtTheBound::Stop => midflight_consumer::PAUSE_AFTER_MS_MAX,
        };
        config
    };
    let waves: Vec<Vec<OrderEvent>> =
        [200, 100, 100].iter().enumerate().map(|(w, n)| orders(&format!("W{w}"), *n)).collect();
    let total = waves.iter().map(Vec::len).sum::<usize>() as u64;
    let produce = |wave: usize| harness.produce_events(&waves[wave]);

    let first = harness.start_consumer(config("first"), &db.store);
    produce(0).await;
    eventually("the first consumer owns every partition and is working", || async {
        let s = first.snapshot();
        if s.partitions_assigned == PARTITIONS as u64 && s.done >= 10 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;

    // A second instance joins: cooperative-sticky moves some partitions to it.
    let second = harness.start_consumer(config("second"), &db.store);
    partitions_moved(&first, &second).await;
    let before = first.snapshot().fresh;
    produce(1).await;
    eventually("both consumers take new messages", || async {
        let (a, b) = (first.snapshot(), second.snapshot());
        if a.fresh > before && b.fresh > 0 { Ok(()) } else { Err(format!("first {a:?}\nsecond {b:?}")) }
    })
    .await;

    // The first leaves with work in flight: running sagas stop at a durable point, queued ones
    // are released, and what is durable is committed.
    let left = first.stop().await;
    eventually("the second consumer owns every partition", || async {
        let s = second.snapshot();
        if s.partitions_assigned == PARTITIONS as u64 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    produce(2).await;
    eventually("every message has a row and the second consumer is idle", || async {
        let s = second.snapshot();
        let rows: u64 = statuses(&db.store).await.values().sum();
        if rows == total && s.in_flight == 0 { Ok(()) } else { Err(format!("rows {rows}, {s:?}")) }
    })
    .await;
    let kept = second.stop().await;
    eprintln!("first consumer: {left:?}\nsecond consumer: {kept:?}");
    match at_the_bound {
        AtTheBound::Pause => assert!(left.pauses > 0, "the backlog hit the in-flight bound: {left:?}"),
        AtTheBound::Stop => {
            assert!(left.stalls > 0 && kept.stalls > 0, "the backlog hit the bound: first {left:?}\nsecond {kept:?}");
            assert_eq!(left.pauses + kept.pauses, 0, "no stop lasted pause_after_ms: first {left:?}\nsecond {kept:?}");
        }
    }
    assert_eq!(left.fresh + kept.fresh, total, "every message inserted once: first {left:?}\nsecond {kept:?}");

    // Whatever the first left mid-way is in the table, resumable by recovery: nothing lost.
    recover_abandoned(&db.store, &harness.downstream).await;
    assert_eq!(statuses(&db.store).await, BTreeMap::from([(Status::Done, total)]), "first {left:?}\nsecond {kept:?}");
    let all: Vec<OrderEvent> = waves.concat();
    let (wms, logistics) = harness.ledgers().await;
    assert_one_apply_each(&wms, &all, Step::Wms);
    assert_one_apply_each(&logistics, &all, Step::Logistics);
    // Not only one effect: one request. Nothing was sent twice, by anyone.
    assert_sent_once(&harness.downstream, Call::LockStock, &all);
    assert_sent_once(&harness.downstream, Call::CreateShipment, &all);
    harness.assert_all_committed("g").await;
}
async fn rebalance(db: &TestDb) {
    rebalance_on(db, Broker::Embedded, AtTheBound::Pause).await;
}
both_engines!(rebalance_moves_partitions_without_loss_or_repeat, rebalance);

/// The same with the consumers stopped at the bound and never paused: the rebalance waits for
/// the stop to end, and nothing is lost or repeated.
async fn rebalance_while_stopped(db: &TestDb) {
    rebalance_on(db, Broker::Embedded, AtTheBound::Stop).await;
}
both_engines!(a_rebalance_during_a_stop_at_the_bound_loses_and_repeats_nothing, rebalance_while_stopped);

/// At `in_flight_max` the consumer stops taking messages and takes them again at
/// `resume_below` without pausing its partitions while the stop is shorter than
/// `pause_after_ms`: what librdkafka fetched waits in its queue, and nothing is lost or taken
/// twice.
async fn short_stops_at_the_bound(db: &TestDb) {
    let options =
        MockOptions { wms_faults: fault("LockStock", MethodFaults::with_latency(20, 60)), ..MockOptions::default() };
    let harness = Harness::start(options).await;
    let events = orders("S", 120);
    harness.produce_events(&events).await;
    let mut config = harness.config("g", "c");
    (config.consumer.in_flight_max, config.consumer.resume_below) = (16, 8);
    // Far longer than any stop here lasts (16 sagas of one call of at most 60 ms each).
    config.consumer.pause_after_ms = midflight_consumer::PAUSE_AFTER_MS_MAX;
    let consumer = harness.start_consumer(config, &db.store);
    eventually("every saga DONE", || async {
        let s = consumer.snapshot();
        if s.done == 120 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let s = consumer.stop().await;
    assert!(s.stalls > 0, "the backlog reached the in-flight bound: {s:?}");
    assert_eq!(s.pauses, 0, "no stop lasted pause_after_ms: {s:?}");
    assert_eq!((s.received, s.fresh, s.skipped), (120, 120, 0), "each message taken once: {s:?}");
    assert_eq!(statuses(&db.store).await, BTreeMap::from([(Status::Done, 120)]));
    assert_sent_once(&harness.downstream, Call::LockStock, &events);
    harness.assert_all_committed("g").await;
}
both_engines!(a_short_stop_at_the_in_flight_bound_does_not_pause, short_stops_at_the_bound);

/// The same on a second implementation of the Kafka protocol, with a group coordinator of its
/// own (`MIDFLIGHT_TEST_KAFKA`).
async fn rebalance_on_external(db: &TestDb) {
    if let Some(bootstrap) = test_external_kafka() {
        rebalance_on(db, Broker::External(bootstrap), AtTheBound::Pause).await;
    }
}
both_engines!(rebalance_on_an_external_kafka_without_loss_or_repeat, rebalance_on_external);

async fn dropped_lock_answer(db: &TestDb) {
    let drop_all = MethodFaults { drop_response: 1.0, ..MethodFaults::default() };
    let harness =
        Harness::start(MockOptions { wms_faults: fault("LockStock", drop_all), ..MockOptions::default() }).await;
    let order = event("D-1", "PAID");
    harness.produce(&[record(&order)]).await;
    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("the saga handed off", || async {
        let s = consumer.snapshot();
        if s.handed_off == 1 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let snapshot = consumer.stop().await;
    assert_eq!(snapshot.finished(), 0, "not failed, not rolled back: {snapshot:?}");

    // The WMS applied the lock; the consumer heard nothing and left the intent for recovery.
    let row = saga(&db.store, &order.biz_id()).await;
    assert_eq!((row.status, row.attempts), (Status::WmsRequested, 1), "{row:?}");
    assert!(row.last_error.is_some(), "the transport error is kept: {row:?}");
    // Released for recovery: leased to nobody until its retry time, then claimable.
    assert!(row.next_attempt_at_ms > 0, "{row:?}");
    assert!(row.lease.until_ms.abs_diff(row.next_attempt_at_ms) < 1_000, "leased until its retry: {row:?}");
    let (wms, logistics) = harness.ledgers().await;
    assert_one_apply_each(&wms, std::slice::from_ref(&order), Step::Wms);
    assert!(logistics.is_empty(), "no shipment without a confirmed lock");
    let calls = harness.downstream.calls.lock().expect("call log").clone();
    assert_eq!(calls, vec![(Call::LockStock, order.biz_id())], "one LockStock, under the one deterministic key");
    harness.assert_all_committed("g").await;
}
both_engines!(apply_then_drop_on_lock_stays_requested, dropped_lock_answer);

/// Two events of order `order_no`, produced back to back, consumed with `config` adjusted by
/// `tune`, until both sagas are DONE; checks that the second saga waited for the first, and
/// returns what the consumer counted.
async fn same_order_twice(db: &TestDb, order_no: &str, tune: impl FnOnce(&mut ConsumerConfig)) -> Snapshot {
    // Every lock takes ~80 ms, so overlapping sagas of one order would show in the log.
    let options =
        MockOptions { wms_faults: fault("LockStock", MethodFaults::with_latency(80, 80)), ..MockOptions::default() };
    let harness = Harness::start(options).await;
    let (paid, changed) = (event(order_no, "PAID"), event(order_no, "ADDRESS_CHANGED"));
    let placed = harness.produce(&[record(&paid), record(&changed)]).await;
    assert_eq!(placed[0].0, placed[1].0, "one order, one partition");
    assert_eq!(placed[0].1 + 1, placed[1].1, "consecutive offsets");
    let mut config = harness.config("g", "c1");
    tune(&mut config);
    let consumer = harness.start_consumer(config, &db.store);
    eventually("both sagas DONE", || async {
        let s = consumer.snapshot();
        if s.done == 2 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let snapshot = consumer.stop().await;
    second_waited_for_first(&db.store, &paid, &changed).await;
    snapshot
}

/// The second saga of an order started only once the first was DONE, and ran in this process.
async fn second_waited_for_first(store: &Store, first: &OrderEvent, second: &OrderEvent) {
    let first = store.transitions(&first.biz_id()).await.expect("first log");
    let second = store.transitions(&second.biz_id()).await.expect("second log");
    let first_done = first.iter().find(|t| t.to == Status::Done).expect("first finished").at_ms;
    let second_started = second.iter().find(|t| t.to != Status::Received).expect("second started").at_ms;
    assert!(second_started >= first_done, "second started at {second_started}, first finished at {first_done}");
    assert!(second.iter().all(|t| !t.is_takeover()), "the second ran straight through, in this process: {second:?}");
}

async fn same_order_in_one_batch(db: &TestDb) {
    let snapshot = same_order_twice(db, "S-1", |_| {}).await;
    assert_eq!((snapshot.received, snapshot.batches), (2, 1), "both events in one batch: {snapshot:?}");
    assert_eq!(snapshot.opened, 1, "the first is opened in the inbox, the second waits: {snapshot:?}");
}
both_engines!(same_order_runs_one_at_a_time, same_order_in_one_batch);

async fn same_order_in_batches_written_side_by_side(db: &TestDb) {
    // One message per batch and two batches written at once: the second event's batch is
    // written beside the first's, yet its saga must still wait for the first to finish.
    let snapshot = same_order_twice(db, "W-1", |config| {
        (config.consumer.batch_max, config.consumer.batches_in_flight) = (1, 2);
    })
    .await;
    assert_eq!((snapshot.received, snapshot.batches), (2, 2), "one event per batch: {snapshot:?}");
    assert_eq!(snapshot.opened, 1, "the second is not opened beside the first: {snapshot:?}");
}
both_engines!(same_order_across_overlapping_batches, same_order_in_batches_written_side_by_side);

async fn poison_between_good(db: &TestDb) {
    let harness = Harness::start(MockOptions::default()).await;
    let goods = orders("P", 3);
    let mut invalid = serde_json::to_value(event("P-bad", "PAID")).expect("json");
    invalid["lines"][0]["quantity"] = (-1).into();
    let mut traced = on_zero(Record { payload: b"\xff not json".to_vec(), ..Record::default() });
    traced.headers.push(("traceparent".into(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()));
    let records = vec![
        on_zero(record(&goods[0])),
        traced,
        on_zero(record(&goods[1])),
        on_zero(Record::keyed("P-bad", serde_json::to_vec(&invalid).expect("json"))),
        on_zero(record(&goods[2])),
    ];
    let placed = harness.produce(&records).await;
    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("good sagas DONE, poison parked", || async {
        let s = consumer.snapshot();
        if s.done == 3 && s.parked == 2 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    consumer.stop().await;

    for good in &goods {
        assert_eq!(saga(&db.store, &good.biz_id()).await.status, Status::Done);
    }
    let parked_ids = [placed[1], placed[3]].map(|(p, o)| format!("parked:{ORDERS}:{p}:{o}"));
    let garbage = saga(&db.store, &parked_ids[0]).await;
    assert_eq!(garbage.status, Status::Parked);
    assert!(garbage.last_error.as_deref().is_some_and(|e| e.contains("not a valid order event")), "{garbage:?}");
    assert!(garbage.trace_context.is_some(), "trace context kept with the parked row");
    let invalid_row = saga(&db.store, &parked_ids[1]).await;
    assert!(invalid_row.last_error.as_deref().is_some_and(|e| e.contains("lines[0].quantity")), "{invalid_row:?}");

    let dead = harness.kafka.read_topic(&harness.dead_letters, WAIT).await.expect("dead-letter topic");
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].payload, records[1].payload, "the copy carries the original payload");
    assert_eq!(dead[1].key.as_deref(), Some("P-bad"), "and the original key");
    assert!(dead[0].headers[midflight_consumer::ERROR_HEADER].contains("not a valid order event"), "{dead:?}");
    assert_eq!(dead[1].headers[midflight_consumer::SOURCE_HEADER], format!("{ORDERS}/0@{}", placed[3].1));
    assert_eq!(dead[1].headers[midflight_consumer::BIZ_ID_HEADER], parked_ids[1]);
    harness.assert_all_committed("g").await;
}
both_engines!(poison_is_parked_and_the_partition_moves_on, poison_between_good);

/// A message with a header whose name is not UTF-8 (any producer may send one; the Rust
/// binding's header iterator panics on it) is an order like any other: it completes, its trace
/// context is read from its `traceparent` header, and the partition moves on past it.
async fn header_name_not_utf8(db: &TestDb) {
    use rdkafka::message::{BorrowedHeaders, Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let harness = Harness::start(MockOptions::default()).await;
    let goods = orders("H", 2);
    let mut headers = OwnedHeaders::new().insert(Header { key: "before", value: Some("x") });
    // SAFETY: `as_borrowed` is the headers' native pointer (how the binding itself reads them);
    // the name and value are copied by librdkafka.
    #[allow(unsafe_code)]
    unsafe {
        let raw = std::ptr::from_ref::<BorrowedHeaders>(headers.as_borrowed()).cast_mut().cast();
        let (name, value) = (b"\xff\xfename", b"value");
        let error = rdkafka::bindings::rd_kafka_header_add(
            raw,
            name.as_ptr().cast(),
            name.len() as isize,
            value.as_ptr().cast(),
            value.len() as isize,
        );
        assert_eq!(error, rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    headers = headers.insert(Header { key: "traceparent", value: Some(traceparent) });
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", harness.kafka.bootstrap_servers())
        .create()
        .expect("producer");
    let payload = serde_json::to_vec(&goods[0]).expect("json");
    let raw = FutureRecord::to(&harness.orders)
        .key(goods[0].order_no.as_str())
        .payload(&payload)
        .partition(0)
        .headers(headers);
    let (partition, offset) = producer.send(raw, WAIT).await.map(|d| (d.partition, d.offset)).expect("delivered");
    harness.produced.lock().expect("produced offsets").insert(partition, offset + 1);
    harness.produce(&[on_zero(record(&goods[1]))]).await;

    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("both sagas DONE", || async {
        let s = consumer.snapshot();
        if s.done == 2 { Ok(()) } else { Err(consumer.report()) }
    })
    .await;
    consumer.stop().await;
    let first = saga(&db.store, &goods[0].biz_id()).await;
    assert_eq!(first.status, Status::Done);
    assert!(
        first.trace_context.as_deref().is_some_and(|t| t.contains("0af7651916cd43dd8448eb211c80319c")),
        "the trace context is read past the header: {:?}",
        first.trace_context
    );
    harness.assert_all_committed("g").await;
}
both_engines!(a_header_name_that_is_not_utf8_does_not_hold_the_partition, header_name_not_utf8);

/// A poison message whose dead-letter copy can never be delivered (here larger than the
/// producer's `message.max.bytes`) does not hold its partition: its row is parked, saying so
/// and keeping only the first 64 KiB of the payload, it is counted, and the messages after it
/// are processed and committed.
async fn undeliverable_copy(db: &TestDb) {
    let harness = Harness::start(MockOptions::default()).await;
    let goods = orders("U", 2);
    let huge = on_zero(Record { payload: vec![0xff; 100_000], ..Record::default() });
    let records = vec![on_zero(record(&goods[0])), huge, on_zero(record(&goods[1]))];
    let placed = harness.produce(&records).await;
    let mut config = harness.config("g", "c1");
    config.kafka.properties.insert("message.max.bytes".into(), "50000".into());
    let consumer = harness.start_consumer(config, &db.store);
    eventually("good sagas DONE, the huge poison parked", || async {
        let s = consumer.snapshot();
        if s.done == 2 && s.parked == 1 { Ok(()) } else { Err(consumer.report()) }
    })
    .await;
    let counted = consumer.snapshot();
    consumer.stop().await;
    assert_eq!(counted.dead_letter_failed, 1, "{counted:?}");

    let parked = saga(&db.store, &format!("parked:{ORDERS}:{}:{}", placed[1].0, placed[1].1)).await;
    assert_eq!(parked.status, Status::Parked);
    let error = parked.last_error.clone().unwrap_or_default();
    for needle in ["over the limit", "first 65535 bytes of the payload as text (100000 bytes", "cannot be delivered"] {
        assert!(error.contains(needle), "lacks {needle:?}: {error}");
    }
    assert_eq!(parked.payload, "\u{fffd}".repeat(65_536 / 3), "the payload's first 64 KiB as text, whole characters");
    let copies = harness.kafka.read_topic(&harness.dead_letters, WAIT).await.expect("read the dead-letter topic");
    assert!(copies.is_empty(), "no copy: {copies:?}");
    harness.assert_all_committed("g").await;
}
both_engines!(an_undeliverable_dead_letter_copy_does_not_hold_the_partition, undeliverable_copy);

/// Order topics written by producers with each of Kafka's compression codecs are read: the
/// client is built with every codec (zstd needs its own library).
async fn compressed(db: &TestDb) {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let harness = Harness::start(MockOptions::default()).await;
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    let events = orders("Z", codecs.len() * 3);
    for (codec, chunk) in codecs.iter().zip(events.chunks(3)) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", harness.kafka.bootstrap_servers())
            .set("compression.type", *codec)
            .set("linger.ms", "20")
            .create()
            .unwrap_or_else(|error| panic!("a producer compressing with {codec}: {error}"));
        let sends = chunk.iter().map(|event| {
            let payload = event.to_json();
            let producer = producer.clone();
            let (topic, key) = (harness.orders.clone(), event.order_no.clone());
            async move {
                let record = FutureRecord::to(&topic).key(&key).payload(&payload);
                producer.send(record, Duration::from_secs(5)).await.map_err(|(error, _)| error)
            }
        });
        for delivered in futures::future::join_all(sends).await {
            let delivered = delivered.unwrap_or_else(|error| panic!("{codec}: {error}"));
            let mut produced = harness.produced.lock().expect("produced offsets");
            let end = produced.entry(delivered.partition).or_default();
            *end = (*end).max(delivered.offset + 1);
        }
    }
    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("every saga DONE", || async {
        let s = consumer.snapshot();
        if s.done == events.len() as u64 { Ok(()) } else { Err(consumer.report()) }
    })
    .await;
    let snapshot = consumer.stop().await;
    assert_eq!((snapshot.received, snapshot.parked, snapshot.kafka_errors), (events.len() as u64, 0, 0));
    harness.assert_all_committed("g").await;
}
both_engines!(compressed_order_topics_are_read, compressed);

async fn expired_lease_redelivered(db: &TestDb) {
    let harness = Harness::start(MockOptions::default()).await;
    let order = event("X-1", "PAID");
    let placed = harness.produce(&[record(&order)]).await;
    // A consumer that died before committing: its row is in the table, its lease expired.
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: ORDERS.into(), partition: placed[0].0, offset: placed[0].1 };
    let row = Saga::received(&order, source, now, now + 600_000);
    db.store.insert_arrivals(&[row], "dead-consumer", 0, "consumer:dead-consumer").await.expect("insert");

    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("the redelivered saga claimed and finished", || async {
        let s = consumer.snapshot();
        if s.done == 1 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    let snapshot = consumer.stop().await;
    assert_eq!((snapshot.fresh, snapshot.claims), (0, 1), "{snapshot:?}");
    let log = db.store.transitions(&order.biz_id()).await.expect("log");
    let takeover = log.iter().find(|t| t.is_takeover()).expect("a takeover in the log");
    assert!(takeover.actor.starts_with("consumer:c1-"), "claimed by the consumer: {takeover:?}");
    assert_eq!(takeover.lease_epoch, 2, "the claim bumped the fencing epoch");
    assert_sent_once(&harness.downstream, Call::LockStock, std::slice::from_ref(&order));
}
both_engines!(redelivered_expired_lease_is_claimed, expired_lease_redelivered);

/// A redelivered message whose row cannot be read (edited by hand into a negative version) is
/// left, counted and committed past; the messages around it on its partition are driven, and
/// the consumer goes on. Before, the inbox write failed on that row at every try until the
/// consumer stopped, and again after every restart.
async fn unreadable_row_redelivered(db: &TestDb) {
    let harness = Harness::start(MockOptions::default()).await;
    let events = [event("U-1", "PAID"), event("U-2", "PAID"), event("U-3", "PAID")];
    // One partition for all three, so the unreadable row sits between the other two.
    let records: Vec<Record> = events.iter().map(|e| Record { partition: Some(0), ..record(e) }).collect();
    let placed = harness.produce(&records).await;
    let now = db.store.now_ms().await.expect("clock");
    let source = Source { topic: ORDERS.into(), partition: placed[1].0, offset: placed[1].1 };
    let row = Saga::received(&events[1], source, now, now + 600_000);
    db.store.insert_arrivals(&[row], "dead-consumer", 0, "consumer:dead-consumer").await.expect("insert");
    let broken = events[1].biz_id();
    midflight_store::testing::execute(&db.store, &format!("UPDATE saga SET version = -1 WHERE biz_id = '{broken}'"))
        .await;

    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    eventually("the readable sagas finished", || async {
        let s = consumer.snapshot();
        if s.done == 2 && s.unreadable == 1 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    harness.assert_all_committed("g").await;
    let snapshot = consumer.stop().await;
    assert_eq!((snapshot.fresh, snapshot.claims, snapshot.unreadable), (2, 0, 1), "{snapshot:?}");
    let sent = harness.downstream.count(Call::LockStock);
    assert!(!sent.contains_key(&broken), "nothing sent for the unreadable row: {sent:?}");
    assert_sent_once(&harness.downstream, Call::LockStock, &[events[0].clone(), events[2].clone()]);
    let log = db.store.transitions(&broken).await.expect("log");
    assert_eq!(log.len(), 1, "the unreadable row is left as it was: {log:?}");
}
both_engines!(redelivered_unreadable_row_is_left, unreadable_row_redelivered);

async fn static_restart(db: &TestDb) {
    let harness = Harness::start(MockOptions::default()).await;
    // Static membership is honoured under KIP-848 (`group.protocol=consumer`); the classic
    // protocol of the user's Kafka 3.5 has it too, but the mock cluster ignores it there.
    let config = |instance: &str| {
        let mut config = harness.config("g", instance);
        config.kafka.group_protocol = "consumer".to_owned();
        config.kafka.group_instance_id = Some(instance.to_owned());
        // The broker owns the session and heartbeat under this protocol.
        config.kafka.properties.clear();
        config
    };
    let started = Instant::now();
    let a = harness.start_consumer(config("a"), &db.store);
    let b = harness.start_consumer(config("b"), &db.store);
    eventually("the partitions split between the two members", || async {
        let (sa, sb) = (a.snapshot(), b.snapshot());
        let split = sa.partitions_assigned > 0 && sb.partitions_assigned > 0;
        if split && sa.partitions_assigned + sb.partitions_assigned == PARTITIONS as u64 {
            Ok(())
        } else {
            Err(format!("a {sa:?}\nb {sb:?}"))
        }
    })
    .await;
    eprintln!("two static members split the partitions after {:?}", started.elapsed());
    let first = orders("R", 40);
    harness.produce_events(&first).await;
    eventually("the first wave DONE", || async {
        let done = a.snapshot().done + b.snapshot().done;
        if done == 40 { Ok(()) } else { Err(format!("{done} done\na {}\nb {}", a.report(), b.report())) }
    })
    .await;
    let (a_owned, b_before) = (a.snapshot().partitions_assigned, b.snapshot());

    // A rolling restart of `a`: same instance id, new process incarnation.
    let started = Instant::now();
    a.stop().await;
    let a_again = harness.start_consumer(config("a"), &db.store);
    eventually("the restarted member gets its partitions back", || async {
        let s = a_again.snapshot();
        if s.partitions_assigned == a_owned { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    eprintln!("static member back with its {a_owned} partitions after {:?}", started.elapsed());
    let second = orders("T", 40);
    harness.produce_events(&second).await;
    eventually("the second wave DONE", || async {
        let done = statuses(&db.store).await;
        if done == BTreeMap::from([(Status::Done, 80)]) {
            Ok(())
        } else {
            Err(format!("{done:?}\na {}\nb {}", a_again.report(), b.report()))
        }
    })
    .await;
    let b_mid = b.snapshot();
    assert_eq!(b_mid.partitions_revoked, b_before.partitions_revoked, "the restart moved nothing away from b");
    assert_eq!(b_mid.partitions_assigned, b_before.partitions_assigned, "nor to b");
    let (a_after, b_after) = (a_again.stop().await, b.stop().await);
    assert_eq!(b_after.fresh - b_before.fresh + a_after.fresh, 40, "a {a_after:?}\nb {b_after:?}");
    assert_eq!(statuses(&db.store).await, BTreeMap::from([(Status::Done, 80)]));
    harness.assert_all_committed("g").await;
}
both_engines!(static_member_restart_keeps_the_assignment, static_restart);

/// Partitions a paused consumer lost in a rebalance and got back later, after it had resumed
/// what it held then, are fetched again: librdkafka keeps an application's pause on a
/// partition across its revocation and reassignment, so resuming only the assignment of the
/// day would leave them paused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_given_back_after_a_pause_are_consumed() {
    let db = TestDb::fresh(midflight_store::testing::Engine::Sqlite).await.expect("sqlite");
    // Locks slow enough (8 s; the mock server cuts a call off at 10 s) that the first consumer
    // stays paused, its sixteen sagas waiting, for much longer than the second's join takes
    // (about 2 s on the embedded cluster).
    let options = MockOptions {
        wms_faults: fault("LockStock", MethodFaults::with_latency(8_000, 8_000)),
        ..MockOptions::default()
    };
    let harness = Harness::start(options).await;
    let (mut wms, mut logistics) = harness.mocks.sections();
    (wms.request_timeout_ms, logistics.request_timeout_ms) = (20_000, 20_000);
    let patient = Downstreams::connect_lazy(&wms, &logistics).expect("loopback endpoints");
    let start = |instance: &str| {
        let mut config = harness.config("g", instance);
        (config.consumer.in_flight_max, config.consumer.resume_below) = (16, 8);
        (config.driver.rpc_timeout_ms, config.driver.lease_ms) = (20_000, 60_000);
        config.consumer.shutdown_deadline_ms = 30_000;
        let counters = Arc::new(Counters::default());
        let shutdown = CancellationToken::new();
        let run =
            midflight_consumer::run_with(config, db.store.clone(), patient.clone(), counters.clone(), shutdown.clone());
        Running { task: tokio::spawn(run), counters, shutdown }
    };
    let first = start("first");
    harness.produce_events(&orders("B", 32)).await;
    eventually("the first consumer holds every partition and has paused them", || async {
        let s = first.snapshot();
        if s.partitions_assigned == PARTITIONS as u64 && s.pauses > 0 { Ok(()) } else { Err(first.report()) }
    })
    .await;
    // A second member takes some partitions while the first has them paused.
    let second = start("second");
    partitions_moved(&first, &second).await;
    assert!(first.snapshot().in_flight >= 8, "still paused when its partitions moved: {:?}", first.snapshot());
    harness.mocks.set_wms_faults(midflight_stack::Faults::default()).await;
    eventually("the backlog DONE", || async {
        let rows = statuses(&db.store).await;
        if rows == BTreeMap::from([(Status::Done, 32)]) { Ok(()) } else { Err(format!("{rows:?}")) }
    })
    .await;
    // The second leaves: its partitions go back to the first, which has resumed meanwhile.
    second.stop().await;
    eventually("the first consumer holds every partition again", || async {
        let s = first.snapshot();
        if s.partitions_assigned == PARTITIONS as u64 { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    harness.produce_events(&orders("A", 32)).await;
    eventually("every order DONE, on every partition", || async {
        let rows = statuses(&db.store).await;
        if rows == BTreeMap::from([(Status::Done, 64)]) { Ok(()) } else { Err(format!("{rows:?}\n{}", first.report())) }
    })
    .await;
    first.stop().await;
    harness.assert_all_committed("g").await;
}

/// A fatal error of the client (here the group refusing the member for good on a KIP-848
/// heartbeat, as it fences a static member whose id another process took) ends the run with
/// an error, so the process is restarted, instead of idling on with nothing assigned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fatal_group_error_ends_the_run() {
    use rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
    /// KIP-848's ConsumerGroupHeartbeat.
    const CONSUMER_GROUP_HEARTBEAT: i16 = 68;

    let db = TestDb::fresh(midflight_store::testing::Engine::Sqlite).await.expect("sqlite");
    let harness = Harness::start(MockOptions::default()).await;
    harness.kafka.set_consumer_protocol_session(6_000, 200);
    let mut config = harness.config("g", "c1");
    config.kafka.group_protocol = "consumer".to_owned();
    config.kafka.properties.clear();
    let consumer = harness.start_consumer(config, &db.store);
    let first = orders("F", 4);
    harness.produce_events(&first).await;
    eventually("the orders DONE", || async {
        let s = consumer.snapshot();
        if s.done == 4 { Ok(()) } else { Err(consumer.report()) }
    })
    .await;
    harness.kafka.fail_requests(CONSUMER_GROUP_HEARTBEAT, &[RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; 4]);
    let ended = tokio::time::timeout(WAIT, consumer.task).await.expect("the run ends").expect("consumer task");
    match ended {
        Err(Error::KafkaFatal { reason }) => assert!(reason.contains("GroupAuthorizationFailed"), "{reason}"),
        other => panic!("expected a fatal Kafka error, got {other:?}"),
    }
}

/// A fatal error of the producer (an idempotent producer whose sequence a broker no longer
/// agrees with) stops the relay, which can publish nothing more, and ends the run with an
/// error, so the process is restarted; the outbox rows wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fatal_producer_error_ends_the_run() {
    use rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER;
    /// The Produce API.
    const PRODUCE: i16 = 0;

    let db = TestDb::fresh(midflight_store::testing::Engine::Sqlite).await.expect("sqlite");
    let harness = Harness::start(MockOptions::default()).await;
    let events = orders("N", 4);
    // On one partition, so the consumer reads the four in one fetch before the run ends.
    harness.produce(&events.iter().map(|e| on_zero(record(e))).collect::<Vec<_>>()).await;
    // The orders are on the topic; the next Produce requests any client sends are the
    // consumer's notifications.
    harness.kafka.fail_requests(PRODUCE, &[RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER; 4]);
    let consumer = harness.start_consumer(harness.config("g", "c1"), &db.store);
    let Running { task, counters, .. } = consumer;
    let ended = tokio::time::timeout(WAIT, task).await.expect("the run ends").expect("consumer task");
    match ended {
        Err(Error::KafkaFatal { reason }) => assert!(reason.starts_with("producer"), "{reason}"),
        other => panic!("expected a fatal Kafka error of the producer, got {other:?}"),
    }
    // Nothing is lost: the sagas are DONE, and the notifications not published wait in the
    // outbox for the next process.
    assert_eq!(statuses(&db.store).await, BTreeMap::from([(Status::Done, 4)]));
    assert_eq!(counters.snapshot().published, 0, "{:?}", counters.snapshot());
    assert_eq!(db.store.outbox_pending().await.expect("outbox"), 4);
}

#[tokio::test]
async fn bad_config_is_refused_with_its_reason() {
    let db = TestDb::fresh(midflight_store::testing::Engine::Sqlite).await.expect("sqlite");
    let mut config = ConsumerConfig::default();
    config.consumer.in_flight_max = 0;
    let downstreams = MockDownstreams::start(MockOptions::default()).await.client();
    let result = midflight_consumer::run_with(
        config,
        db.store.clone(),
        downstreams,
        Arc::new(Counters::default()),
        CancellationToken::new(),
    )
    .await;
    let message = result.expect_err("in_flight_max = 0 must be refused").to_string();
    assert!(message.contains("consumer.in_flight_max must be in 1..=100000, got 0"), "{message}");

    // The same through the loader a binary uses.
    let sources = midflight_config::Sources {
        overrides: vec![
            "consumer.in_flight_max=0".into(),
            "consumer.batch_linger_ms=5000".into(),
            "consumer.batch_linger_idle_ms=1001".into(),
        ],
        ..Default::default()
    };
    let message = midflight_config::load::<ConsumerConfig>(&sources).expect_err("refused").to_string();
    assert!(message.contains("consumer.in_flight_max must be in 1..=100000, got 0"), "{message}");
    assert!(message.contains("consumer.batch_linger_ms must be at most 1000, got 5000"), "{message}");
    assert!(message.contains("consumer.batch_linger_idle_ms must be at most 1000, got 1001"), "{message}");
}
