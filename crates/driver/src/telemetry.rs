//! What the driver tells the outside world about its work: spans and metrics.
//!
//! Spans: one `saga.drive` per drive, a child of the context stored on the row (the message's
//! trace), so whoever drives the saga (the consumer that received it, or a recovery worker
//! after a takeover) adds to the same trace; one `saga.step` per loop iteration that writes
//! (the CAS write and the call it names); one `rpc.client` span per downstream call, whose
//! context the call carries so the downstream's spans nest under it.
//!
//! Metrics: the catalogue's saga and RPC instruments (`midflight_service::metrics`), and the
//! saga store's own counters ([`midflight_store::StoreStats`], one field, one counter named
//! `midflight.store.<field>`), which every service that drives sagas exports through
//! [`observe_store`].
//!
//! With telemetry off all of this is disabled spans and no-op instruments.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use midflight_model::{Call, Change, Observation, Saga, Status, Step};
use midflight_service::metrics::{self, Kind, LiveSet, instruments};
use midflight_store::{Store, StoreCounters, StoreStats};
use opentelemetry::KeyValue;
use opentelemetry::metrics::ObservableCounter;
use tracing::Span;

use crate::Outcome;

/// The span of one drive, joined to the trace stored on the row.
pub(crate) fn drive_span(saga: &Saga, actor: &str) -> Span {
    let span = tracing::info_span!(
        "saga.drive",
        otel.name = "saga.drive",
        biz_id = %saga.biz_id,
        saga.status = %saga.status,
        saga.version = saga.version,
        saga.lease_epoch = saga.lease.epoch,
        saga.actor = %actor_kind(actor),
        messaging.system = "kafka",
        messaging.destination.name = %saga.source.topic,
        messaging.destination.partition.id = saga.source.partition,
        messaging.kafka.offset = saga.source.offset,
        saga.outcome = tracing::field::Empty,
    );
    midflight_service::trace::set_parent(&span, saga.trace_context.as_deref());
    span
}

/// One step, traced and timed from its plan to its write: a `saga.step` span and the
/// `midflight.saga.step.duration` histogram. Ends when told how the write went, or, dropped
/// on an error, as an error.
pub(crate) struct StepTrace {
    span: Span,
    to: Status,
    started: Instant,
    done: bool,
}

impl StepTrace {
    pub(crate) fn start(saga: &Saga, change: &Change) -> StepTrace {
        let to = change.status_after(saga.status);
        let span = tracing::info_span!(
            "saga.step",
            otel.name = %format_args!("saga.step {to}"),
            biz_id = %saga.biz_id,
            saga.from = %saga.status,
            saga.to = %to,
            saga.version = saga.version,
            saga.lease_epoch = saga.lease.epoch,
            saga.reason = %change.reason,
            saga.cas = tracing::field::Empty,
        );
        StepTrace { span, to, started: Instant::now(), done: false }
    }

    /// The write applied: counts its transitions (and compensations started).
    pub(crate) fn applied(mut self, before: &Saga, change: &Change) {
        for (from, to, _) in change.edges(before) {
            transition(from.as_str(), to);
        }
        self.finish("applied");
    }

    /// The write matched no row: someone else owns the saga now.
    pub(crate) fn conflict(mut self, actor: &str) {
        conflict(actor, "write");
        self.finish("conflict");
    }

    fn finish(&mut self, result: &'static str) {
        self.done = true;
        self.span.record("saga.cas", result);
        let attributes = [KeyValue::new("status", self.to.as_str()), KeyValue::new("result", result)];
        instruments().step_duration.record(self.started.elapsed().as_secs_f64(), &attributes);
    }
}

impl Drop for StepTrace {
    fn drop(&mut self) {
        if !self.done {
            self.finish("error");
        }
    }
}

/// The `saga.step` span, under the current drive, of the first step the inbox transaction
/// wrote before the drive began (`Driver::drive_opened`), so a trace still shows every write;
/// its metrics were counted when the transaction committed ([`opened`]).
pub(crate) fn opened_step(saga: &Saga) {
    let span = tracing::info_span!(
        "saga.step",
        otel.name = %format_args!("saga.step {}", saga.status),
        biz_id = %saga.biz_id,
        saga.from = %Status::Received,
        saga.to = %saga.status,
        saga.version = saga.version,
        saga.lease_epoch = saga.lease.epoch,
        saga.reason = "written in the inbox transaction",
        saga.cas = "applied",
    );
    drop(span);
}

/// The span of one downstream call (a child of the current step or drive).
pub(crate) fn rpc_span(call: Call, saga: &Saga) -> Span {
    tracing::info_span!(
        "rpc.client",
        otel.name = %format_args!("{}/{}", rpc_service(call.step()), call.name()),
        otel.kind = "client",
        rpc.system = "grpc",
        rpc.service = rpc_service(call.step()),
        rpc.method = call.name(),
        biz_id = %saga.biz_id,
        saga.status = %saga.status,
        saga.lease_epoch = saga.lease.epoch,
        rpc.answer = tracing::field::Empty,
    )
}

/// The saga as the call should carry it: with the call span's context when that is recorded,
/// so the downstream's spans are children of the call rather than of the message. Unchanged
/// (and not copied) when tracing is off: the row's own context then travels as before.
pub(crate) fn carried<'a>(saga: &'a Saga, span: &Span) -> Cow<'a, Saga> {
    match midflight_service::trace::traceparent(span) {
        Some(traceparent) => {
            let mut carried = saga.clone();
            carried.trace_context = Some(traceparent);
            Cow::Owned(carried)
        }
        None => Cow::Borrowed(saga),
    }
}

/// A fresh saga's first step, written by the inbox transaction that inserted `before`
/// (`midflight_store::Store::receive`) in `elapsed`: counts its transitions and its step
/// duration as the drive's own write would.
pub fn opened(before: &Saga, change: &Change, elapsed: Duration) {
    for (from, to, _) in change.edges(before) {
        transition(from.as_str(), to);
    }
    let attributes =
        [KeyValue::new("status", change.status_after(before.status).as_str()), KeyValue::new("result", "applied")];
    instruments().step_duration.record(elapsed.as_secs_f64(), &attributes);
}

/// One transition-log row: `from` is `NONE` for an arrival.
pub fn transition(from: &'static str, to: Status) {
    instruments().transitions.add(1, &[KeyValue::new("from", from), KeyValue::new("to", to.as_str())]);
    let step = match to {
        Status::WmsReversing => Some(Step::Wms),
        Status::LogisticsCancelling => Some(Step::Logistics),
        _ => None,
    };
    if let Some(step) = step {
        instruments().compensations.add(1, &[KeyValue::new("step", step.as_str())]);
    }
}

/// Records a downstream call and what it answered.
pub(crate) fn called(call: Call, observation: &Observation, elapsed: Duration, span: &Span) {
    let answer = observation.label();
    span.record("rpc.answer", answer.as_str());
    let instruments = instruments();
    if matches!(call, Call::QueryLock | Call::QueryShipment) {
        instruments
            .queries
            .add(1, &[KeyValue::new("rpc.method", call.name()), KeyValue::new("answer", answer.clone())]);
    }
    let attributes = [
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", rpc_service(call.step())),
        KeyValue::new("rpc.method", call.name()),
        KeyValue::new("answer", answer),
    ];
    instruments.rpc_client_duration.record(elapsed.as_secs_f64(), &attributes);
}

/// A compare-and-set that matched no row.
pub(crate) fn conflict(actor: &str, operation: &'static str) {
    let attributes = [KeyValue::new("actor", actor_kind(actor)), KeyValue::new("operation", operation)];
    instruments().cas_conflicts.add(1, &attributes);
}

/// A saga taken over from an owner whose lease expired.
pub(crate) fn takeover(actor: &str) {
    instruments().takeovers.add(1, &[KeyValue::new("actor", actor_kind(actor))]);
}

/// Counts a drive as running until dropped, then counts how it ended.
pub(crate) struct Running {
    actor: &'static str,
}

impl Running {
    pub(crate) fn start(actor: &str) -> Running {
        let actor = actor_kind(actor);
        instruments().in_flight.add(1, &[KeyValue::new("actor", actor)]);
        Running { actor }
    }

    pub(crate) fn ended(&self, outcome: &Outcome, span: &Span) {
        let outcome = match outcome {
            Outcome::Finished(status) => status.as_str(),
            Outcome::Lost => "lost",
            Outcome::HandedOff => "handed_off",
            Outcome::Stopped => "stopped",
            Outcome::Failed(_) => "failed",
        };
        span.record("saga.outcome", outcome);
        let attributes = [KeyValue::new("actor", self.actor), KeyValue::new("outcome", outcome)];
        instruments().drives.add(1, &attributes);
    }
}

/// A takeover whose claim failed (not lost: the statement failed): counted as a failed drive.
pub(crate) fn claim_failed(actor: &str) {
    let attributes = [KeyValue::new("actor", actor_kind(actor)), KeyValue::new("outcome", "failed")];
    instruments().drives.add(1, &attributes);
}

impl Drop for Running {
    fn drop(&mut self) {
        instruments().in_flight.add(-1, &[KeyValue::new("actor", self.actor)]);
    }
}

/// `consumer` or `recovery` from `consumer:<owner>`: bounded label values, whatever the owner ids.
fn actor_kind(actor: &str) -> &'static str {
    match actor.split_once(':').map_or(actor, |(kind, _)| kind) {
        "consumer" => "consumer",
        "recovery" => "recovery",
        "operator" => "operator",
        _ => "other",
    }
}

/// The gRPC service a step's calls go to (the `package.Service` names in `proto/`).
fn rpc_service(step: Step) -> &'static str {
    match step {
        Step::Wms => "wms.v1.Wms",
        Step::Logistics => "logistics.v1.Logistics",
    }
}

/// The live saga stores of the process, whose counters the observers sum.
static STORES: LiveSet<StoreCounters> = LiveSet::new();

/// Exports the counters of `store` (and of its clones) as `midflight.store.<field>`, summed with
/// every other live store of the process. Calling it again for a clone of a registered store
/// changes nothing. Costs nothing until metrics are collected.
pub fn observe_store(store: &Store) {
    STORES.register(&store.counters());
    store_observers();
}

/// The Prometheus families of the store's counters (`midflight_store_<field>_total`).
pub fn store_metric_names() -> Vec<String> {
    StoreStats::default()
        .fields()
        .into_iter()
        .map(|(field, _)| metrics::prometheus_family(&store_metric(field), Kind::Counter))
        .collect()
}

fn store_metric(field: &str) -> String {
    format!("midflight.store.{field}")
}

/// The observers, registered once per process and kept so they stay registered.
fn store_observers() -> &'static Vec<ObservableCounter<u64>> {
    static OBSERVERS: OnceLock<Vec<ObservableCounter<u64>>> = OnceLock::new();
    OBSERVERS.get_or_init(|| {
        StoreStats::default()
            .fields()
            .into_iter()
            .map(|(field, _)| {
                STORES.sum_counter(store_metric(field), Some(store_help(field)), move |counters| {
                    metrics::field_value(counters.read().fields(), field)
                })
            })
            .collect()
    })
}

/// What each store counter counts (the fields' own documentation, shortened).
fn store_help(field: &str) -> &'static str {
    match field {
        "write_txns" => "Committed transactions that wrote to the saga database.",
        "transitions" => "Saga transitions written (applied compare-and-sets and first steps written on insert).",
        "batches" => "Of write_txns, the shared commits of the group writer.",
        "retried" => "Transition transactions tried again after the database rolled them back on its own.",
        "opened_on_insert" => "First steps written by inserting the row as that step leaves it.",
        "gave_way" => "Inbox transactions that found a row inserted meanwhile and took the general path.",
        "refused" => "New connections the full database server refused (MySQL 1040, 1203, 1226); each try counts.",
        _ => "A saga store counter.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_counter_has_a_metric_and_its_own_help() {
        let names = store_metric_names();
        assert!(names.contains(&"midflight_store_refused_total".to_owned()), "{names:?}");
        assert!(names.contains(&"midflight_store_write_txns_total".to_owned()), "{names:?}");
        assert_eq!(names.len(), StoreStats::default().fields().len());
        for (field, _) in StoreStats::default().fields() {
            assert_ne!(store_help(field), "A saga store counter.", "{field} has no help text");
        }
    }

    #[test]
    fn actor_labels_are_bounded() {
        assert_eq!(actor_kind("consumer:c1-abc"), "consumer");
        assert_eq!(actor_kind("recovery:r-1-2"), "recovery");
        assert_eq!(actor_kind("something else"), "other");
    }
}
