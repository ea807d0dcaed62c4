//! What the consumer tells the outside world besides its logs: the receive span of each
//! message (whose context is stored on the saga row, so every later span of the saga, by
//! whichever process, joins the message's trace), arrivals counted as transitions, the
//! [`Counters`] as metrics (one field, one metric), and from librdkafka's statistics the
//! consumer lag and how many partitions each topic it reads from has, held or not (so an alert
//! can compare the partitions held with the partitions there are). Its saga store's counters
//! are exported by the driver's telemetry.
//!
//! Several consumers may run in one process (tests do): their counters are summed and their lag
//! reports merged, so one series per name is exported however many there are.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use midflight_model::Status;
use midflight_service::metrics::{self, Kind, LiveSet};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{ObservableCounter, ObservableGauge};
use rdkafka::statistics::Statistics;

use crate::counters::{Counters, Snapshot};

/// Fields of [`Counters`] that go up and down; every other field only counts up.
pub const GAUGE_FIELDS: [&str; 2] = ["in_flight", "partitions_assigned"];
/// librdkafka statistics interval set on the consumer unless `kafka.properties` names one:
/// lag is reported this often. Each report is one JSON document per client, parsed off the
/// hot path.
pub const STATISTICS_INTERVAL_MS: u64 = 10_000;
/// A client's latest report is exported for this many of its statistics intervals, then
/// dropped (its consumer stopped reporting, so it stopped or hangs).
const REPORT_TTL_INTERVALS: u64 = 3;

/// How long a client's report is exported, given its `statistics.interval.ms` as configured
/// (`None`: the default). A value librdkafka would refuse gets the default's.
pub(crate) fn report_ttl(interval_ms: Option<&str>) -> Duration {
    let interval_ms = interval_ms.and_then(|ms| ms.trim().parse::<u64>().ok()).unwrap_or(STATISTICS_INTERVAL_MS);
    Duration::from_millis(REPORT_TTL_INTERVALS.saturating_mul(interval_ms))
}

/// The Prometheus families the consumer's own observers export (besides the catalogue's): its
/// counters and its saga store's.
pub fn metric_names() -> Vec<String> {
    let counters = Snapshot::default()
        .fields()
        .into_iter()
        .map(|(field, _)| metrics::prometheus_family(&counter_name(field), kind(field)));
    counters.chain(midflight_driver::telemetry::store_metric_names()).collect()
}

/// The `receive` span of a message, ended at once; returns the context the saga row keeps:
/// the span's when it is recorded (a child of the producer's `traceparent`), otherwise the
/// producer's own, unchanged.
pub(crate) fn received(topic: &str, partition: i32, offset: i64, traceparent: Option<String>) -> Option<String> {
    let span = tracing::info_span!(
        "kafka.receive",
        otel.name = %format_args!("{topic} receive"),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation = "receive",
        messaging.destination.name = %topic,
        messaging.destination.partition.id = partition,
        messaging.kafka.offset = offset,
    );
    midflight_service::trace::set_parent(&span, traceparent.as_deref());
    midflight_service::trace::traceparent(&span).or(traceparent)
}

/// Arrivals are transition-log rows too (`NONE -> RECEIVED` or `NONE -> PARKED`).
pub(crate) fn arrived(status: Status, count: usize) {
    for _ in 0..count {
        midflight_driver::telemetry::transition("NONE", status);
    }
}

/// The live consumers of the process, whose counters the observers sum.
static CONSUMERS: LiveSet<Counters> = LiveSet::new();
/// What one client's latest statistics said.
#[derive(Debug, Default, PartialEq)]
struct Report {
    /// (topic, partition, lag) of each partition the client holds.
    lags: Vec<(String, i32, i64)>,
    /// Per topic the client knows, the partitions its metadata lists.
    partitions: BTreeMap<String, i64>,
}
/// Per client: until when its latest report is exported, and what it said.
static REPORTS: Mutex<BTreeMap<String, (Instant, Report)>> = Mutex::new(BTreeMap::new());

/// Exports `counters` (summed with every other live consumer of the process) as metrics.
pub(crate) fn observe(counters: &Arc<Counters>) {
    CONSUMERS.register(counters);
    observers();
}

/// Records the lag of each partition the client reports as assigned, and the partition count
/// of each topic it knows, to be exported for `ttl`.
pub(crate) fn statistics(statistics: &Statistics, ttl: Duration) {
    lock(&REPORTS).insert(statistics.name.clone(), (Instant::now() + ttl, report(statistics)));
}

fn report(statistics: &Statistics) -> Report {
    let mut report = Report::default();
    for topic in statistics.topics.values() {
        // -1 is librdkafka's internal "unassigned" partition, and an `unknown` one is wanted
        // but missing from the metadata: neither is one of the topic's partitions.
        let listed = topic.partitions.values().filter(|p| p.partition >= 0 && !p.unknown).count();
        report.partitions.insert(topic.topic.clone(), listed as i64);
        for partition in topic.partitions.values() {
            // `desired` marks assigned ones.
            if partition.partition < 0 || !partition.desired {
                continue;
            }
            let lag = if partition.hi_offset >= 0 && partition.committed_offset >= 0 {
                (partition.hi_offset - partition.committed_offset).max(0)
            } else if partition.consumer_lag >= 0 {
                partition.consumer_lag
            } else {
                continue;
            };
            report.lags.push((topic.topic.clone(), partition.partition, lag));
        }
    }
    report
}

/// The reports still exported, the expired ones dropped.
fn live_reports() -> MutexGuard<'static, BTreeMap<String, (Instant, Report)>> {
    let mut reports = lock(&REPORTS);
    let now = Instant::now();
    reports.retain(|_, (until, _)| *until > now);
    reports
}

fn counter_name(field: &str) -> String {
    format!("midflight.consumer.{field}")
}

fn kind(field: &str) -> Kind {
    if GAUGE_FIELDS.contains(&field) { Kind::Gauge } else { Kind::Counter }
}

/// The observers, registered once per process and kept so they stay registered. Their
/// callbacks read only the statics above, never this lock, so a collection running while they
/// are being registered cannot wait on it.
struct Observers {
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: Vec<ObservableGauge<u64>>,
    _lag: ObservableGauge<i64>,
    _topic_partitions: ObservableGauge<i64>,
}

fn observers() -> &'static Observers {
    static OBSERVERS: OnceLock<Observers> = OnceLock::new();
    OBSERVERS.get_or_init(|| {
        let (mut counters, mut gauges) = (Vec::new(), Vec::new());
        for (field, _) in Snapshot::default().fields() {
            let value = move |counters: &Counters| metrics::field_value(counters.snapshot().fields(), field);
            match kind(field) {
                Kind::Gauge => gauges.push(CONSUMERS.sum_gauge(counter_name(field), value)),
                _ => counters.push(CONSUMERS.sum_counter(counter_name(field), None, value)),
            }
        }
        let lag = metrics::meter()
            .i64_observable_gauge(metrics::CONSUMER_LAG.name)
            .with_description(metrics::CONSUMER_LAG.help)
            .with_callback(|observer| {
                for (_, report) in live_reports().values() {
                    for (topic, partition, lag) in &report.lags {
                        let attributes =
                            [KeyValue::new("topic", topic.clone()), KeyValue::new("partition", i64::from(*partition))];
                        observer.observe(*lag, &attributes);
                    }
                }
            })
            .build();
        // One series per topic: the clients of a process see the same metadata, give or take a
        // refresh, and the largest count is the one a partition added last shows.
        let topic_partitions = metrics::meter()
            .i64_observable_gauge(metrics::CONSUMER_TOPIC_PARTITIONS.name)
            .with_description(metrics::CONSUMER_TOPIC_PARTITIONS.help)
            .with_callback(|observer| {
                for (topic, count) in most_partitions(live_reports().values().map(|(_, report)| report)) {
                    observer.observe(count, &[KeyValue::new("topic", topic)]);
                }
            })
            .build();
        Observers { _counters: counters, _gauges: gauges, _lag: lag, _topic_partitions: topic_partitions }
    })
}

/// Per topic, the most partitions any report lists.
fn most_partitions<'a>(reports: impl Iterator<Item = &'a Report>) -> BTreeMap<String, i64> {
    let mut most = BTreeMap::new();
    for report in reports {
        for (topic, count) in &report.partitions {
            let entry = most.entry(topic.clone()).or_insert(*count);
            *entry = (*entry).max(*count);
        }
    }
    most
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock: usable after a panic elsewhere.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauge_fields_exist_and_names_follow_the_catalogue_rule() {
        let fields: Vec<&str> = Snapshot::default().fields().into_iter().map(|(name, _)| name).collect();
        for gauge in GAUGE_FIELDS {
            assert!(fields.contains(&gauge), "{gauge} is not a field of Counters");
        }
        let names = metric_names();
        assert!(names.contains(&"midflight_consumer_received_total".to_owned()), "{names:?}");
        assert!(names.contains(&"midflight_consumer_in_flight".to_owned()), "{names:?}");
        assert!(names.contains(&"midflight_store_write_txns_total".to_owned()), "{names:?}");
    }

    /// The case the partition count is for: a client that holds some of a topic's partitions
    /// still reports how many the topic has, while its lag covers only what it holds.
    #[tokio::test]
    async fn a_client_holding_some_partitions_reports_them_all() {
        use rdkafka::consumer::Consumer;

        use crate::kafka::{Client, Context};

        const TOPIC: &str = "counted";
        let kafka = midflight_stack::kafka::EmbeddedKafka::start().expect("embedded kafka");
        kafka.create_topic(TOPIC, 4).expect("topic");
        let mut section = kafka.section("telemetry-count");
        section.properties.insert("statistics.interval.ms".to_owned(), "100".to_owned());
        let client = |owner: &str| -> Client {
            let client = crate::kafka::consumer(&section, owner, Context::new(owner, Arc::default())).expect("client");
            client.subscribe(&[TOPIC]).expect("subscribe");
            client
        };
        let clients = [client("count-a"), client("count-b")];
        let reported = |owner: &str| {
            let reports = lock(&REPORTS);
            let mut mine = reports.iter().filter(|(name, _)| name.starts_with(&format!("{owner}#")));
            mine.next().map(|(_, (_, report))| report.partitions.get(TOPIC).copied())
        };
        let held = |client: &Client| client.assignment().map_or(0, |list| list.count());
        let deadline = Instant::now() + Duration::from_secs(60);
        let poll = async || {
            // The clients' callbacks (rebalances, statistics) run while they are polled.
            for client in &clients {
                let _ = tokio::time::timeout(Duration::from_millis(20), client.recv()).await;
            }
            assert!(Instant::now() < deadline, "not within 60 s: held {:?}", clients.each_ref().map(held));
        };
        while !(held(&clients[0]) > 0 && held(&clients[1]) > 0 && held(&clients[0]) + held(&clients[1]) == 4) {
            poll().await;
        }
        // Only reports made while each holds part of the topic count.
        lock(&REPORTS).retain(|name, _| !name.starts_with("count-"));
        let split = clients.each_ref().map(held);
        while reported("count-a").is_none() || reported("count-b").is_none() {
            poll().await;
        }
        assert_eq!(clients.each_ref().map(held), split, "the assignment moved meanwhile");
        assert_eq!((reported("count-a"), reported("count-b")), (Some(Some(4)), Some(Some(4))), "holding {split:?}");
    }

    #[test]
    fn each_topic_is_exported_with_the_most_partitions_any_client_lists() {
        let report = |counts: &[(&str, i64)]| Report {
            lags: Vec::new(),
            partitions: counts.iter().map(|(topic, count)| (topic.to_string(), *count)).collect(),
        };
        // A client that has not yet seen a partition added to "orders" lists 16.
        let reports = [report(&[("orders", 16)]), report(&[("orders", 24), ("other", 2)]), report(&[])];
        let expected = BTreeMap::from([("orders".to_owned(), 24), ("other".to_owned(), 2)]);
        assert_eq!(most_partitions(reports.iter()), expected);
    }

    #[test]
    fn a_report_counts_the_partitions_the_metadata_lists_and_the_lag_of_those_held() {
        use rdkafka::statistics::{Partition, Topic};

        let partition = |partition: i32, desired: bool, unknown: bool| Partition {
            partition,
            desired,
            unknown,
            hi_offset: 10,
            committed_offset: 4,
            ..Partition::default()
        };
        // Partitions 0-2 in the metadata, 1 of them held; 7 held but missing from the
        // metadata (deleted, or not yet seen); -1 librdkafka's own.
        let listed = [partition(0, false, false), partition(1, true, false), partition(2, false, false)];
        let others = [partition(7, true, true), partition(-1, false, false)];
        let topic = Topic {
            topic: "orders".to_owned(),
            partitions: listed.into_iter().chain(others).map(|p| (p.partition, p)).collect(),
            ..Topic::default()
        };
        let statistics = Statistics { topics: [("orders".to_owned(), topic)].into(), ..Statistics::default() };
        let report = report(&statistics);
        assert_eq!(report.partitions, BTreeMap::from([("orders".to_owned(), 3)]));
        let mut lags = report.lags;
        lags.sort();
        assert_eq!(lags, [("orders".to_owned(), 1, 6), ("orders".to_owned(), 7, 6)]);
    }

    #[test]
    fn a_report_is_exported_for_three_of_its_clients_intervals() {
        assert_eq!(report_ttl(None), Duration::from_secs(30));
        assert_eq!(report_ttl(Some("60000")), Duration::from_secs(180));
        assert_eq!(report_ttl(Some("500")), Duration::from_millis(1_500));
        assert_eq!(report_ttl(Some("soon")), Duration::from_secs(30));
    }
}
