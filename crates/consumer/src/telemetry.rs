//! What the consumer tells the outside world besides its logs: the receive span of each
//! message (whose context is stored on the saga row, so every later span of the saga, by
//! whichever process, joins the message's trace), arrivals counted as transitions, the
//! [`Counters`] as metrics (one field, one metric), and consumer lag from librdkafka's
//! statistics. Its saga store's counters are exported by the driver's telemetry.
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
/// A client's lag report older than this is dropped (its consumer stopped or lost its partitions).
const LAG_REPORT_TTL: Duration = Duration::from_millis(3 * STATISTICS_INTERVAL_MS);

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
/// (topic, partition, lag) of each partition a client reported.
type Lags = Vec<(String, i32, i64)>;
/// Per client: when it last reported, and its partitions' lag.
static LAG: Mutex<BTreeMap<String, (Instant, Lags)>> = Mutex::new(BTreeMap::new());

/// Exports `counters` (summed with every other live consumer of the process) as metrics.
pub(crate) fn observe(counters: &Arc<Counters>) {
    CONSUMERS.register(counters);
    observers();
}

/// Records the lag of each partition the client reports as assigned.
pub(crate) fn statistics(statistics: &Statistics) {
    let mut lags = Vec::new();
    for topic in statistics.topics.values() {
        for partition in topic.partitions.values() {
            // -1 is librdkafka's internal "unassigned" partition; `desired` marks assigned ones.
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
            lags.push((topic.topic.clone(), partition.partition, lag));
        }
    }
    lock(&LAG).insert(statistics.name.clone(), (Instant::now(), lags));
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
                let mut reports = lock(&LAG);
                reports.retain(|_, (at, _)| at.elapsed() < LAG_REPORT_TTL);
                for (_, lags) in reports.values() {
                    for (topic, partition, lag) in lags {
                        let attributes =
                            [KeyValue::new("topic", topic.clone()), KeyValue::new("partition", i64::from(*partition))];
                        observer.observe(*lag, &attributes);
                    }
                }
            })
            .build();
        Observers { _counters: counters, _gauges: gauges, _lag: lag }
    })
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
}
