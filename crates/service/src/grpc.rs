//! The server side of a traced gRPC call: a tower layer for tonic servers that continues the
//! caller's trace from the `traceparent` metadata, opens one `rpc.server` span per call (the
//! handler's logs and spans nest inside it), and records `rpc.server.duration`.
//!
//! Health checks are served untraced: an orchestrator probing every few seconds would otherwise
//! fill the trace store with spans nobody reads.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use opentelemetry::KeyValue;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::metrics::instruments;
use crate::trace::{TRACEPARENT, set_parent};

/// Services that are not traced (`grpc.health.v1.Health`, reflection).
const UNTRACED_PREFIX: &str = "grpc.";

/// Traces every call of the server it wraps.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTraceLayer;

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> ServerTrace<S> {
        ServerTrace { inner }
    }
}

/// The service [`ServerTraceLayer`] makes.
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
}

impl<S, B, R> Service<http::Request<B>> for ServerTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (service, method) = split_path(request.uri().path());
        if service.starts_with(UNTRACED_PREFIX) {
            return Box::pin(self.inner.call(request));
        }
        let (service, method) = (service.to_owned(), method.to_owned());
        let span = tracing::info_span!(
            "rpc.server",
            otel.name = %format_args!("{service}/{method}"),
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
        );
        set_parent(&span, request.headers().get(TRACEPARENT).and_then(|value| value.to_str().ok()));
        let started = Instant::now();
        let call = self.inner.call(request);
        Box::pin(async move {
            let result = call.instrument(span).await;
            let attributes = [
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service),
                KeyValue::new("rpc.method", method),
            ];
            instruments().rpc_server_duration.record(started.elapsed().as_secs_f64(), &attributes);
            result
        })
    }
}

/// `("wms.v1.Wms", "LockStock")` from `/wms.v1.Wms/LockStock`.
fn split_path(path: &str) -> (&str, &str) {
    let trimmed = path.trim_start_matches('/');
    trimmed.split_once('/').unwrap_or((trimmed, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_paths_split_into_service_and_method() {
        assert_eq!(split_path("/wms.v1.Wms/LockStock"), ("wms.v1.Wms", "LockStock"));
        assert_eq!(split_path("/grpc.health.v1.Health/Check"), ("grpc.health.v1.Health", "Check"));
        assert_eq!(split_path("/odd"), ("odd", ""));
    }
}
