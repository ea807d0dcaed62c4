//! W3C trace context in and out of the carriers midflight uses: Kafka message headers, gRPC
//! metadata and the saga row's `trace_context` column all hold one `traceparent` string.
//!
//! Spans are ordinary `tracing` spans; the OpenTelemetry layer that [`crate::init_telemetry`]
//! installs (only when an exporter is configured) gives them trace and span ids. Without it
//! every helper here is a cheap no-op: [`traceparent`] returns `None` and callers keep whatever
//! context they already carry, so a message's `traceparent` still travels unchanged.
//!
//! The format is fixed (W3C Trace Context), so the propagator is used directly rather than
//! through a global: nothing can swap it for another format by accident.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header (Kafka) and metadata key (gRPC) carrying the context.
pub const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of `span`, when OpenTelemetry records it; `None` otherwise.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    // A disabled span (telemetry off) has no context: skip the lookups.
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// The `traceparent` of the current span, if any: what an outgoing message or call carries.
pub fn current_traceparent() -> Option<String> {
    traceparent(&tracing::Span::current())
}

/// Makes `span` a child of the remote span named by `traceparent`. Nothing happens when the
/// value is absent or malformed, when OpenTelemetry is off, or when the span has already been
/// entered (its parent is fixed by then): call it right after creating the span.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    let Some(context) = traceparent.and_then(remote_context) else { return };
    // An error only says the span is disabled or already started; either way it stays a root
    // of its own, which loses the link but nothing else.
    let _ = span.set_parent(context);
}

/// The trace id (32 hex digits) of a `traceparent`, if it is a valid one.
pub fn trace_id(traceparent: &str) -> Option<String> {
    remote_context(traceparent).map(|context| context.span().span_context().trace_id().to_string())
}

/// A sampled root `traceparent` with the given ids (a zero id, invalid in W3C, becomes 1): what a
/// traced producer would send, for producers that record no spans of their own (the lab's
/// workload, tests).
pub fn root_traceparent(trace_id: u128, span_id: u64) -> String {
    format!("00-{:032x}-{:016x}-01", trace_id.max(1), span_id.max(1))
}

fn remote_context(traceparent: &str) -> Option<opentelemetry::Context> {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    context.span().span_context().is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn trace_ids_are_read_from_valid_contexts_only() {
        assert_eq!(trace_id(SAMPLE).as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
        // An all-zero id is invalid in W3C; so is text that is not a traceparent at all.
        assert_eq!(trace_id("00-00000000000000000000000000000000-b7ad6b7169203331-01"), None);
        assert_eq!(trace_id("not a trace context"), None);
        assert_eq!(trace_id(""), None);
    }

    #[test]
    fn root_contexts_are_valid() {
        let root = root_traceparent(0xabc, 0);
        assert_eq!(root, "00-00000000000000000000000000000abc-0000000000000001-01");
        assert_eq!(trace_id(&root).as_deref(), Some("00000000000000000000000000000abc"));
    }

    #[test]
    fn without_an_opentelemetry_layer_spans_carry_no_context() {
        let span = tracing::info_span!("no layer");
        set_parent(&span, Some(SAMPLE));
        assert_eq!(traceparent(&span), None);
        assert_eq!(current_traceparent(), None);
    }
}
