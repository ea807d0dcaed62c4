//! The metrics midflight's services export: one catalogue of names (OpenTelemetry semantic
//! conventions where one exists, `midflight.*` otherwise), the name each gets in the Prometheus
//! exposition, and the instruments the libraries record into.
//!
//! The catalogue is what the dashboard and the alerting rules may name; a test scrapes a real
//! run and finds every entry, and the deploy check refuses a dashboard query naming anything
//! else. Counters a crate derives from its own counter structs (the consumer's `Counters`, the
//! recovery worker's `Stats`, and the saga store's `StoreStats`, which the driver's telemetry
//! exports for both) are listed by those crates, from the same fields they export.
//!
//! Instruments come from the global meter provider the first time [`instruments`] is called, so
//! [`crate::init_telemetry`] must run before the service records anything (binaries do this in
//! `midflight_service::main`). Until a provider is installed the global one is a no-op, and so is
//! every instrument: with metrics off, recording costs a virtual call and nothing else.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, ObservableCounter, ObservableGauge, UpDownCounter};

/// The instrumentation scope of every midflight instrument.
pub const METER: &str = "midflight";

/// Histogram boundaries for latencies, in seconds. The user's P99s (WMS 180 ms, logistics
/// 320 ms) are edges, so a quantile near them is read without interpolating across a wide bucket.
pub const DURATION_BUCKETS_S: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.18, 0.25, 0.32, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];

/// What kind of series an entry produces in the Prometheus exposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic counter: `<family>` ends in `_total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// `<family>_bucket`, `<family>_sum` and `<family>_count`.
    Histogram,
}

/// One metric of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The OpenTelemetry instrument name (what OTLP carries).
    pub name: &'static str,
    /// The metric family as the Prometheus endpoint exposes it.
    pub prometheus: &'static str,
    pub kind: Kind,
    /// Attribute keys it is recorded with.
    pub attributes: &'static [&'static str],
    pub help: &'static str,
}

pub const SAGA_TRANSITIONS: Spec = Spec {
    name: "midflight.saga.transitions",
    prometheus: "midflight_saga_transitions_total",
    kind: Kind::Counter,
    attributes: &["from", "to"],
    help: "Status transitions written, one per transition-log row (from is NONE for an arrival).",
};
pub const SAGA_TAKEOVERS: Spec = Spec {
    name: "midflight.saga.takeovers",
    prometheus: "midflight_saga_takeovers_total",
    kind: Kind::Counter,
    attributes: &["actor"],
    help: "Sagas claimed after their owner's lease expired (the epoch was bumped).",
};
pub const SAGA_CAS_CONFLICTS: Spec = Spec {
    name: "midflight.saga.cas_conflicts",
    prometheus: "midflight_saga_cas_conflicts_total",
    kind: Kind::Counter,
    attributes: &["actor", "operation"],
    help: "Compare-and-set writes that matched no row: someone else owns the saga (write, renew) or won it (claim).",
};
pub const SAGA_STEP_DURATION: Spec = Spec {
    name: "midflight.saga.step.duration",
    prometheus: "midflight_saga_step_duration_seconds",
    kind: Kind::Histogram,
    attributes: &["status", "result"],
    help: "One saga step: the CAS write of a planned change and the downstream call it names.",
};
pub const RPC_CLIENT_DURATION: Spec = Spec {
    name: "rpc.client.duration",
    prometheus: "rpc_client_duration_seconds",
    kind: Kind::Histogram,
    attributes: &["rpc.system", "rpc.service", "rpc.method", "answer"],
    help: "Downstream calls made by the saga driver, by the answer they got.",
};
pub const RPC_SERVER_DURATION: Spec = Spec {
    name: "rpc.server.duration",
    prometheus: "rpc_server_duration_seconds",
    kind: Kind::Histogram,
    attributes: &["rpc.system", "rpc.service", "rpc.method"],
    help: "Calls served by a mock downstream.",
};
pub const DOWNSTREAM_QUERIES: Spec = Spec {
    name: "midflight.downstream.queries",
    prometheus: "midflight_downstream_queries_total",
    kind: Kind::Counter,
    attributes: &["rpc.method", "answer"],
    help: "Queries by our request id after an unknown outcome, by what the downstream said.",
};
pub const SAGA_COMPENSATIONS: Spec = Spec {
    name: "midflight.saga.compensations",
    prometheus: "midflight_saga_compensations_total",
    kind: Kind::Counter,
    attributes: &["step"],
    help: "Compensations started: transitions into WMS_REVERSING or LOGISTICS_CANCELLING.",
};
pub const SAGA_DRIVES: Spec = Spec {
    name: "midflight.saga.drives",
    prometheus: "midflight_saga_drives_total",
    kind: Kind::Counter,
    attributes: &["actor", "outcome"],
    help: "Drives of a saga by the shared driver, by how they ended.",
};
pub const SAGAS_IN_FLIGHT: Spec = Spec {
    name: "midflight.sagas.in_flight",
    prometheus: "midflight_sagas_in_flight",
    kind: Kind::Gauge,
    attributes: &["actor"],
    help: "Sagas this process is driving right now.",
};
pub const SAGAS: Spec = Spec {
    name: "midflight.sagas",
    prometheus: "midflight_sagas",
    kind: Kind::Gauge,
    attributes: &["status"],
    help: "Saga rows per unfinished status in the table (sampled by the recovery worker).",
};
pub const SAGAS_UNKNOWN_STATUS: Spec = Spec {
    name: "midflight.sagas.unknown_status",
    prometheus: "midflight_sagas_unknown_status",
    kind: Kind::Gauge,
    attributes: &[],
    help: "Saga rows whose status this version does not know (a newer version's, or an edit by hand): nothing resumes or reconciles them (sampled by the recovery worker; its log names the statuses).",
};
pub const SAGA_OLDEST_AGE: Spec = Spec {
    name: "midflight.saga.oldest_age",
    prometheus: "midflight_saga_oldest_age_seconds",
    kind: Kind::Gauge,
    attributes: &["status"],
    help: "Time since the least recently updated non-terminal saga of each status changed (sampled by the recovery worker).",
};
pub const SAGA_OLDEST_FINISHED_AGE: Spec = Spec {
    name: "midflight.saga.oldest_finished_age",
    prometheus: "midflight_saga_oldest_finished_age_seconds",
    kind: Kind::Gauge,
    attributes: &["status"],
    help: "Time since the oldest DONE or ROLLED_BACK saga still in the table last changed, give or take a lease (sampled by the recovery worker): about the purge's horizon while the purge keeps up (older while a saga waits on an open ticket or an unpublished notification), the table's whole history while it is off.",
};
pub const PURGE_HORIZON: Spec = Spec {
    name: "midflight.purge.horizon",
    prometheus: "midflight_purge_horizon_seconds",
    kind: Kind::Gauge,
    attributes: &[],
    help: "The recovery worker's purge horizon in force: purge.after_hours, or what the order topic keeps (retention.ms plus segment.ms plus how far ahead a producer may date a message, plus an hour) when that is longer; 0 when purging is off, or held (the topic keeps messages for ever, or its settings have not been read yet).",
};
pub const PURGE_TOPIC_RETENTION: Spec = Spec {
    name: "midflight.purge.topic_retention",
    prometheus: "midflight_purge_topic_retention_seconds",
    kind: Kind::Gauge,
    attributes: &[],
    help: "The longest the order topic keeps a message (retention.ms plus segment.ms plus how far ahead a producer may date a message), as the recovery worker's purge last read it; -1 when it keeps messages for ever (retention.ms or segment.ms -1, compaction without deletion, or no cleanup policy); 0 when not read (purging off, no kafka section, or no answer yet).",
};
pub const OUTBOX_OLDEST_AGE: Spec = Spec {
    name: "midflight.outbox.oldest_age",
    prometheus: "midflight_outbox_oldest_age_seconds",
    kind: Kind::Gauge,
    attributes: &[],
    help: "Age of the oldest notification in the outbox not yet published (0 when none waits; sampled by the recovery worker). The consumers' relays publish them.",
};
pub const TICKETS_OPEN: Spec = Spec {
    name: "midflight.tickets.open",
    prometheus: "midflight_tickets_open",
    kind: Kind::Gauge,
    attributes: &[],
    help: "Manual-review tickets waiting for a person (sampled by the recovery worker).",
};
pub const RECONCILER_FINDINGS: Spec = Spec {
    name: "midflight.reconciler.findings",
    prometheus: "midflight_reconciler_findings_total",
    kind: Kind::Counter,
    attributes: &["kind", "ticket"],
    help: "Mismatches between a downstream ledger and the saga table, counted at every reconciliation pass that finds them, by kind and by their ticket: opened, reopened, already_open, or resolved_before (a person accepted that finding).",
};
pub const RECONCILER_RUNS: Spec = Spec {
    name: "midflight.reconciler.runs",
    prometheus: "midflight_reconciler_runs_total",
    kind: Kind::Counter,
    attributes: &["result"],
    help: "Reconciliation passes, by result: ok, behind (completed at its bound, short of the present; the next starts at once), or error.",
};
pub const RECONCILER_LATE_ENTRIES: Spec = Spec {
    name: "midflight.reconciler.late_entries",
    prometheus: "midflight_reconciler_late_entries_total",
    kind: Kind::Counter,
    attributes: &[],
    help: "Ledger entries a periodic reconciliation met behind its checkpoint that were not there when the pass which set the checkpoint read that stretch (a downstream committed them after later ones); judged when met. Entries further than reconcile.ledger_reread_entries sequence numbers behind are not read again.",
};
pub const RECONCILER_LATE_DEPTH: Spec = Spec {
    name: "midflight.reconciler.late_depth_ratio",
    prometheus: "midflight_reconciler_late_depth_ratio",
    kind: Kind::Gauge,
    attributes: &[],
    help: "How far behind its checkpoint the deepest late ledger entry of the last periodic reconciliation was, as a share of reconcile.ledger_reread_entries (0 when none, or after a full pass): at 1 an entry that late was the last one read again, and a later one goes unjudged until a full pass.",
};
pub const CONSUMER_LAG: Spec = Spec {
    name: "midflight.consumer.lag",
    prometheus: "midflight_consumer_lag",
    kind: Kind::Gauge,
    attributes: &["topic", "partition"],
    help: "Messages between a partition's end and this consumer's committed offset (librdkafka statistics).",
};
pub const CONSUMER_TOPIC_PARTITIONS: Spec = Spec {
    name: "midflight.consumer.topic_partitions",
    prometheus: "midflight_consumer_topic_partitions",
    kind: Kind::Gauge,
    attributes: &["topic"],
    help: "Partitions a topic the consumer reads from has, held or not, as its latest metadata says (librdkafka statistics).",
};

/// Every metric recorded through [`instruments`] or named by the services' own observers.
pub const CATALOGUE: [Spec; 24] = [
    SAGA_TRANSITIONS,
    SAGA_TAKEOVERS,
    SAGA_CAS_CONFLICTS,
    SAGA_STEP_DURATION,
    RPC_CLIENT_DURATION,
    RPC_SERVER_DURATION,
    DOWNSTREAM_QUERIES,
    SAGA_COMPENSATIONS,
    SAGA_DRIVES,
    SAGAS_IN_FLIGHT,
    SAGAS,
    SAGAS_UNKNOWN_STATUS,
    SAGA_OLDEST_AGE,
    SAGA_OLDEST_FINISHED_AGE,
    PURGE_HORIZON,
    PURGE_TOPIC_RETENTION,
    OUTBOX_OLDEST_AGE,
    TICKETS_OPEN,
    RECONCILER_FINDINGS,
    RECONCILER_RUNS,
    RECONCILER_LATE_ENTRIES,
    RECONCILER_LATE_DEPTH,
    CONSUMER_LAG,
    CONSUMER_TOPIC_PARTITIONS,
];

/// The instruments of the catalogue that are recorded synchronously.
#[derive(Debug)]
pub struct Instruments {
    pub transitions: Counter<u64>,
    pub takeovers: Counter<u64>,
    pub cas_conflicts: Counter<u64>,
    pub step_duration: Histogram<f64>,
    pub rpc_client_duration: Histogram<f64>,
    pub rpc_server_duration: Histogram<f64>,
    pub queries: Counter<u64>,
    pub compensations: Counter<u64>,
    pub drives: Counter<u64>,
    pub in_flight: UpDownCounter<i64>,
    pub sagas: Gauge<u64>,
    pub sagas_unknown_status: Gauge<u64>,
    pub oldest_age: Gauge<f64>,
    pub oldest_finished_age: Gauge<f64>,
    pub purge_horizon: Gauge<f64>,
    pub purge_topic_retention: Gauge<f64>,
    pub outbox_oldest_age: Gauge<f64>,
    pub tickets_open: Gauge<u64>,
    pub reconciler_findings: Counter<u64>,
    pub reconciler_runs: Counter<u64>,
    pub reconciler_late_entries: Counter<u64>,
    pub reconciler_late_depth: Gauge<f64>,
}

/// The meter every midflight instrument belongs to (observers register on it too).
pub fn meter() -> Meter {
    opentelemetry::global::meter(METER)
}

/// The process's instruments, created from the global meter provider on first use.
pub fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = meter();
        let counter = |spec: Spec| meter.u64_counter(spec.name).with_description(spec.help).build();
        let seconds = |spec: Spec| {
            meter
                .f64_histogram(spec.name)
                .with_description(spec.help)
                .with_unit("s")
                .with_boundaries(DURATION_BUCKETS_S.to_vec())
                .build()
        };
        Instruments {
            transitions: counter(SAGA_TRANSITIONS),
            takeovers: counter(SAGA_TAKEOVERS),
            cas_conflicts: counter(SAGA_CAS_CONFLICTS),
            step_duration: seconds(SAGA_STEP_DURATION),
            rpc_client_duration: seconds(RPC_CLIENT_DURATION),
            rpc_server_duration: seconds(RPC_SERVER_DURATION),
            queries: counter(DOWNSTREAM_QUERIES),
            compensations: counter(SAGA_COMPENSATIONS),
            drives: counter(SAGA_DRIVES),
            in_flight: meter.i64_up_down_counter(SAGAS_IN_FLIGHT.name).with_description(SAGAS_IN_FLIGHT.help).build(),
            sagas: meter.u64_gauge(SAGAS.name).with_description(SAGAS.help).build(),
            sagas_unknown_status: meter
                .u64_gauge(SAGAS_UNKNOWN_STATUS.name)
                .with_description(SAGAS_UNKNOWN_STATUS.help)
                .build(),
            oldest_age: meter
                .f64_gauge(SAGA_OLDEST_AGE.name)
                .with_description(SAGA_OLDEST_AGE.help)
                .with_unit("s")
                .build(),
            oldest_finished_age: meter
                .f64_gauge(SAGA_OLDEST_FINISHED_AGE.name)
                .with_description(SAGA_OLDEST_FINISHED_AGE.help)
                .with_unit("s")
                .build(),
            purge_horizon: meter
                .f64_gauge(PURGE_HORIZON.name)
                .with_description(PURGE_HORIZON.help)
                .with_unit("s")
                .build(),
            purge_topic_retention: meter
                .f64_gauge(PURGE_TOPIC_RETENTION.name)
                .with_description(PURGE_TOPIC_RETENTION.help)
                .with_unit("s")
                .build(),
            outbox_oldest_age: meter
                .f64_gauge(OUTBOX_OLDEST_AGE.name)
                .with_description(OUTBOX_OLDEST_AGE.help)
                .with_unit("s")
                .build(),
            tickets_open: meter.u64_gauge(TICKETS_OPEN.name).with_description(TICKETS_OPEN.help).build(),
            reconciler_findings: counter(RECONCILER_FINDINGS),
            reconciler_runs: counter(RECONCILER_RUNS),
            reconciler_late_entries: counter(RECONCILER_LATE_ENTRIES),
            reconciler_late_depth: meter
                .f64_gauge(RECONCILER_LATE_DEPTH.name)
                .with_description(RECONCILER_LATE_DEPTH.help)
                .build(),
        }
    })
}

/// The Prometheus family of an OpenTelemetry instrument name, as the exporter derives it
/// (dots become underscores; counters get `_total`), for metrics named at run time.
pub fn prometheus_family(name: &str, kind: Kind) -> String {
    let base = name.replace('.', "_");
    match kind {
        Kind::Counter => format!("{base}_total"),
        Kind::Gauge | Kind::Histogram => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_names_are_unique_and_families_follow_the_exporters_rule() {
        let mut names: Vec<&str> = CATALOGUE.iter().map(|spec| spec.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOGUE.len());
        for spec in CATALOGUE {
            let derived = prometheus_family(spec.name, spec.kind);
            // Histograms and the age gauge carry a unit of seconds, which the exporter appends.
            let expected = if spec.prometheus.ends_with("_seconds") { format!("{derived}_seconds") } else { derived };
            assert_eq!(spec.prometheus, expected, "{}", spec.name);
        }
    }
}

/// The live instances of a service part whose counters the process exports summed (consumers,
/// recovery workers, saga stores). Held weakly: an instance that is dropped stops counting on
/// its own. An instance registered again (two services handed clones of one store) is counted
/// once.
#[derive(Debug)]
pub struct LiveSet<T> {
    members: Mutex<Vec<Weak<T>>>,
}

impl<T> LiveSet<T> {
    pub const fn new() -> LiveSet<T> {
        LiveSet { members: Mutex::new(Vec::new()) }
    }

    pub fn register(&self, member: &Arc<T>) {
        let weak = Arc::downgrade(member);
        let mut members = self.members();
        members.retain(|live| live.strong_count() > 0);
        if !members.iter().any(|live| live.ptr_eq(&weak)) {
            members.push(weak);
        }
    }

    /// `value` of every live member, summed.
    pub fn sum(&self, value: impl Fn(&T) -> u64) -> u64 {
        let mut members = self.members();
        members.retain(|weak| weak.strong_count() > 0);
        members.iter().filter_map(Weak::upgrade).map(|member| value(&member)).sum()
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Vec<Weak<T>>> {
        // Plain data behind the lock: usable after a panic elsewhere.
        self.members.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<T: Send + Sync + 'static> LiveSet<T> {
    /// An observable counter `name` that reports `value` summed over the live members at each
    /// collection. Keep it for the life of the process (a `OnceLock`): that keeps it registered.
    /// Its callback reads only this set, so a collection may run at any time.
    pub fn sum_counter(
        &'static self,
        name: String,
        help: Option<&'static str>,
        value: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> ObservableCounter<u64> {
        let meter = meter();
        let builder = meter.u64_observable_counter(name).with_callback(move |o| o.observe(self.sum(&value), &[]));
        match help {
            Some(help) => builder.with_description(help).build(),
            None => builder.build(),
        }
    }

    /// Like [`LiveSet::sum_counter`], for a value that goes up and down (a gauge).
    pub fn sum_gauge(
        &'static self,
        name: String,
        value: impl Fn(&T) -> u64 + Send + Sync + 'static,
    ) -> ObservableGauge<u64> {
        meter().u64_observable_gauge(name).with_callback(move |o| o.observe(self.sum(&value), &[])).build()
    }
}

/// The value of `field` among a counter struct's `(name, value)` fields; 0 if it has none.
pub fn field_value<N: AsRef<str>>(fields: impl IntoIterator<Item = (N, u64)>, field: &str) -> u64 {
    fields.into_iter().find(|(name, _)| name.as_ref() == field).map_or(0, |(_, value)| value)
}

impl<T> Default for LiveSet<T> {
    fn default() -> LiveSet<T> {
        LiveSet::new()
    }
}

#[cfg(test)]
mod live_set_tests {
    use super::*;

    #[test]
    fn members_are_summed_once_while_they_live() {
        let set = LiveSet::new();
        let (one, two) = (Arc::new(3_u64), Arc::new(4_u64));
        set.register(&one);
        set.register(&two);
        set.register(&one.clone());
        assert_eq!(set.sum(|n| *n), 7, "one registered twice counts once");
        drop(two);
        assert_eq!(set.sum(|n| *n), 3, "a dropped member stops counting");
        set.register(&Arc::new(5_u64));
        assert_eq!(set.sum(|n| *n), 3, "a member dropped at once is not counted");
        assert_eq!(set.members().len(), 1, "dead members are let go");
    }

    #[test]
    fn a_field_is_found_by_name() {
        let fields = [("write_txns", 3), ("refused", 0)];
        assert_eq!(field_value(fields, "write_txns"), 3);
        assert_eq!(field_value(vec![("n".to_owned(), 9)], "n"), 9);
        assert_eq!(field_value(fields, "missing"), 0, "a field the struct lacks reads 0");
    }
}
