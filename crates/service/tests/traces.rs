//! One message, one trace: a message produced with a `traceparent` is received, driven and
//! called downstream by the real consumer (`run_with`), and every span it causes, in the
//! consumer, the driver and the mock downstreams behind real gRPC, lands in the message's trace.
//! After a takeover, the recovery worker's spans land there too: the context travels on the saga
//! row, not in any process's memory.
//!
//! Spans are collected with OpenTelemetry's in-memory exporter, installed once for the test
//! process; each test reads only the traces of the messages it produced.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use midflight_api::client::Downstreams;
use midflight_config::TelemetrySection;
use midflight_consumer::{ConsumerConfig, Counters};
use midflight_driver::{Downstream, DriverSettings};
use midflight_model::{Call, Observation, OrderEvent, Rules, Saga, Status};
use midflight_recovery::{RecoverySection, Worker};
use midflight_service::trace::{TRACEPARENT, root_traceparent};
use midflight_stack::kafka::{EmbeddedKafka, Record};
use midflight_stack::{MockDownstreams, MockOptions};
use midflight_store::testing::{TestDb, order_event as event, until};
use midflight_store::{Store, both_engines};
use opentelemetry::trace::{SpanId, SpanKind, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
use tokio_util::sync::CancellationToken;

const ORDERS: &str = "orders";
/// Generous bound on any one wait: the box is small and shared.
const WAIT: Duration = Duration::from_secs(60);

/// The process's span exporter (and the telemetry guard that keeps it installed).
fn exporter() -> &'static InMemorySpanExporter {
    static INSTALLED: OnceLock<(InMemorySpanExporter, midflight_service::Telemetry)> = OnceLock::new();
    &INSTALLED
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            // Quiet logs: spans are exported whatever the log filter says.
            let section = TelemetrySection { log_filter: "warn".to_owned(), ..TelemetrySection::default() };
            let telemetry = midflight_service::init_telemetry_with_exporter("traces-test", &section, exporter.clone())
                .expect("telemetry installs once per test process");
            (exporter, telemetry)
        })
        .0
}

/// Stalls every call for the sagas named in `stalled`, like a consumer paused mid-call (the
/// incident's "RPC sent, response not received"); passes the rest to the mocks.
#[derive(Clone)]
struct Stalling {
    inner: Downstreams,
    stalled: Arc<Mutex<HashSet<String>>>,
}

impl Downstream for Stalling {
    async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        let stall = self.stalled.lock().expect("stall list").contains(&saga.biz_id);
        if stall {
            std::future::pending::<()>().await;
        }
        self.inner.call(call, saga, timeout).await
    }
}

/// A traced message: its record and the ids of the producer's span.
fn traced(event: &OrderEvent) -> (Record, TraceId, SpanId) {
    let (trace, span) = (uuid::Uuid::new_v4().as_u128(), uuid::Uuid::new_v4().as_u64_pair().0);
    let mut record = Record::keyed(&event.order_no, event.to_json());
    record.headers.push((TRACEPARENT.to_owned(), root_traceparent(trace, span)));
    (record, TraceId::from(trace.max(1)), SpanId::from(span.max(1)))
}

async fn wait_for_status(store: &Store, biz_id: &str, wanted: Status) -> Saga {
    let deadline = Instant::now() + WAIT;
    loop {
        let saga = store.get(biz_id).await.expect("read saga");
        match saga {
            Some(saga) if saga.status == wanted => return saga,
            other if Instant::now() >= deadline => {
                panic!("{biz_id} did not reach {wanted} in time; last seen {:?}", other.map(|s| s.status))
            }
            _ => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

fn trace(trace_id: TraceId) -> Vec<SpanData> {
    let spans = exporter().get_finished_spans().expect("finished spans");
    spans.into_iter().filter(|span| span.span_context.trace_id() == trace_id).collect()
}

/// The trace once `drives` drive spans have ended and every call of the one that finished the
/// saga has its server span.
///
/// The row turns DONE when its last write commits, which is before the step, the drive and the
/// mock's server span end and are exported: reading the trace at once races them. (A call the
/// test stalls on purpose never reaches the mock, so only the finishing drive's calls count.)
async fn settled_trace(trace_id: TraceId, drives: usize) -> Vec<SpanData> {
    let settled = || async {
        let spans = trace(trace_id);
        let drive_spans = named(&spans, "saga.drive");
        let done: Vec<&SpanData> = drive_spans
            .iter()
            .copied()
            .filter(|drive| attribute(drive, "saga.outcome").as_deref() == Some("DONE"))
            .collect();
        let served = |drive: &&SpanData| {
            children(&spans, drive, SpanKind::Client)
                .iter()
                .all(|call| !children(&spans, call, SpanKind::Server).is_empty())
        };
        drive_spans.len() >= drives && done.len() == 1 && done.iter().all(served)
    };
    let what = format!("trace {trace_id} to end {drives} drive(s), one DONE with every call served");
    until(&what, settled).await;
    trace(trace_id)
}

/// The spans of `kind` whose parent is `parent`.
fn children<'a>(spans: &'a [SpanData], parent: &SpanData, kind: SpanKind) -> Vec<&'a SpanData> {
    let id = parent.span_context.span_id();
    spans.iter().filter(|span| span.span_kind == kind && span.parent_span_id == id).collect()
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|span| span.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str, filter: impl Fn(&SpanData) -> bool) -> &'a SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|span| span.name == name && filter(span)).collect();
    assert_eq!(found.len(), 1, "one {name} span expected, found {}: {:#?}", found.len(), names(spans));
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|span| format!("{} ({:?})", span.name, span.span_kind)).collect()
}

/// Every client call of `drive` has the mock's server span as its child.
fn assert_calls_served(spans: &[SpanData], drive: &SpanData, methods: &[&str]) {
    let calls = children(spans, drive, SpanKind::Client);
    for method in methods {
        let client = calls
            .iter()
            .find(|span| span.name.ends_with(&format!("/{method}")))
            .unwrap_or_else(|| panic!("no client span for {method} under the drive: {:#?}", names(spans)));
        let server = children(spans, client, SpanKind::Server).into_iter().next();
        let server = server.unwrap_or_else(|| panic!("the mock's span for {method} is not a child of the call"));
        assert_eq!(server.name, client.name, "server and client name the same method");
    }
}

async fn one_message_one_trace(db: &TestDb) {
    exporter();
    let tag = format!("{:?}-{}", db.engine, std::process::id());
    let kafka = EmbeddedKafka::start().expect("embedded kafka");
    kafka.create_topic(ORDERS, 4).expect("orders topic");
    kafka.create_topic("notifications", 1).expect("notifications topic");
    kafka.create_topic("orders.dlt", 1).expect("dead-letter topic");
    let mocks = MockDownstreams::start(MockOptions::default()).await;
    let stalled = Arc::new(Mutex::new(HashSet::new()));
    let downstream = Stalling { inner: mocks.client(), stalled: stalled.clone() };
    // A short lease, so the takeover below happens within seconds.
    let settings = DriverSettings::new(2_000, 500, 200);
    let mut config = ConsumerConfig { kafka: kafka.section(&format!("traces-{tag}")), ..ConsumerConfig::default() };
    config.consumer.instance = "traced".to_owned();
    config.consumer.shutdown_deadline_ms = 1_000;
    config.consumer.relay.idle_ms = 50;
    config.driver = settings.clone();
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(midflight_consumer::run_with(
        config,
        db.store.clone(),
        downstream,
        Arc::new(Counters::default()),
        shutdown.clone(),
    ));

    // 1. A message the consumer finishes on its own.
    let first = event(&format!("TR-{tag}-1"));
    let (record, first_trace, producer_span) = traced(&first);
    kafka.produce(ORDERS, &[record]).await.expect("produce");
    wait_for_status(&db.store, &first.biz_id(), Status::Done).await;
    let spans = settled_trace(first_trace, 1).await;
    let receive = one(&spans, &format!("{ORDERS} receive"), |_| true);
    assert_eq!(receive.parent_span_id, producer_span, "the receive span continues the producer's");
    assert_eq!(receive.span_kind, SpanKind::Consumer);
    let drive = one(&spans, "saga.drive", |_| true);
    assert_eq!(drive.parent_span_id, receive.span_context.span_id(), "the drive hangs under the delivery");
    assert_eq!(attribute(drive, "biz_id"), Some(first.biz_id()));
    assert_eq!(attribute(drive, "messaging.destination.name").as_deref(), Some(ORDERS));
    assert!(attribute(drive, "messaging.kafka.offset").is_some());
    assert_eq!(attribute(drive, "saga.actor").as_deref(), Some("consumer"));
    assert_eq!(attribute(drive, "saga.outcome").as_deref(), Some("DONE"));
    let steps: Vec<&SpanData> = spans.iter().filter(|span| span.name.starts_with("saga.step ")).collect();
    assert!(steps.len() >= 3, "a step per write: {:#?}", names(&spans));
    assert!(steps.iter().all(|step| step.parent_span_id == drive.span_context.span_id()));
    assert!(steps.iter().all(|step| attribute(step, "saga.cas").as_deref() == Some("applied")));
    assert!(steps.iter().any(|step| step.name == "saga.step DONE"), "{:#?}", names(&spans));
    assert_calls_served(&spans, drive, &["LockStock", "CreateShipment"]);
    // Nothing of this saga was recorded outside its trace.
    let everything = exporter().get_finished_spans().expect("finished spans");
    let elsewhere: Vec<&SpanData> = everything
        .iter()
        .filter(|span| attribute(span, "biz_id") == Some(first.biz_id()) && span.span_context.trace_id() != first_trace)
        .collect();
    assert!(elsewhere.is_empty(), "spans of {} outside its trace: {elsewhere:#?}", first.biz_id());

    // 2. A message whose consumer stalls with its WMS call in flight; recovery takes it over.
    let second = event(&format!("TR-{tag}-2"));
    stalled.lock().expect("stall list").insert(second.biz_id());
    let (record, second_trace, _) = traced(&second);
    kafka.produce(ORDERS, &[record]).await.expect("produce");
    wait_for_status(&db.store, &second.biz_id(), Status::WmsRequested).await;
    let section = RecoverySection {
        instance: "traced-recovery".to_owned(),
        scan_interval_ms: 50,
        migrate_on_start: false,
        reconcile_interval_ms: 0,
        ..RecoverySection::default()
    };
    let stop_recovery = CancellationToken::new();
    let worker =
        Worker::new(db.store.clone(), mocks.client(), Rules::default(), settings, section, stop_recovery.clone());
    let recovery = tokio::spawn(worker.run());
    let done = wait_for_status(&db.store, &second.biz_id(), Status::Done).await;
    assert_eq!(done.lease.epoch, 2, "recovery drove it after one takeover");
    stop_recovery.cancel();
    recovery.await.expect("recovery worker stops");
    shutdown.cancel();
    consumer.await.expect("consumer task").expect("consumer stops cleanly");

    let spans = settled_trace(second_trace, 2).await;
    let receive = one(&spans, &format!("{ORDERS} receive"), |_| true);
    let by = |actor: &'static str| move |span: &SpanData| attribute(span, "saga.actor").as_deref() == Some(actor);
    let stalled_drive = one(&spans, "saga.drive", by("consumer"));
    let taken_over = one(&spans, "saga.drive", by("recovery"));
    assert_eq!(stalled_drive.parent_span_id, receive.span_context.span_id());
    assert_eq!(taken_over.parent_span_id, receive.span_context.span_id(), "recovery joins the message's trace");
    assert_eq!(attribute(taken_over, "saga.lease_epoch").as_deref(), Some("2"));
    assert_eq!(attribute(taken_over, "saga.status").as_deref(), Some("WMS_REQUESTED"));
    assert_eq!(attribute(taken_over, "saga.outcome").as_deref(), Some("DONE"));
    // Unknown outcome: recovery asks before it acts, and the mock's spans are in this trace too.
    assert_calls_served(&spans, taken_over, &["QueryLock", "LockStock", "CreateShipment"]);
    assert!(
        named(&spans, "saga.step DONE").iter().any(|step| step.parent_span_id == taken_over.span_context.span_id()),
        "recovery's steps are in the trace: {:#?}",
        names(&spans)
    );
}

both_engines!(one_message_one_trace_across_a_takeover, one_message_one_trace);
