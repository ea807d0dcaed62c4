//! The HTTP endpoint every service serves on `telemetry.metrics_listen`: `/metrics` (the
//! Prometheus text format of everything the process records), `/healthz` (alive: the process
//! answers) and `/readyz` (the service says it is ready, see [`crate::Readiness`]).
//!
//! It is deliberately small: HTTP/1.1, GET only, three paths, a bounded number of connections,
//! a bound on how long a client may take to send its request head and one on how long any
//! connection lasts (a client that sends requests and never reads the answers blocks its
//! connection's writes), so a stuck scraper or a port scanner cannot pin the process's memory
//! or tasks, nor hold every connection and keep a liveness probe out.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::health::Readiness;

/// Connections served at once; more are closed on accept. A scraper, a kubelet and a person
/// with curl need a handful.
pub const CONNECTIONS_MAX: usize = 64;
/// How long a client may take to send its request head before the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may last, requests and answers included; a client keeping its
/// connection alive opens another after it.
pub const CONNECTION_TIME_MAX: Duration = Duration::from_secs(30);

/// What the endpoint answers from.
#[derive(Debug, Clone)]
struct State {
    /// `None` when only health is served (no metrics reader installed).
    registry: Option<prometheus::Registry>,
    readiness: Readiness,
}

/// A running endpoint; stops accepting when dropped or shut down.
#[derive(Debug)]
pub struct Endpoint {
    address: SocketAddr,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Serves on `listener` until stopped. `registry` is what `/metrics` renders.
    pub fn serve(listener: TcpListener, registry: Option<prometheus::Registry>, readiness: Readiness) -> Endpoint {
        Endpoint::serve_for(listener, registry, readiness, CONNECTION_TIME_MAX)
    }

    fn serve_for(
        listener: TcpListener,
        registry: Option<prometheus::Registry>,
        readiness: Readiness,
        connection_time_max: Duration,
    ) -> Endpoint {
        let address = listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let stop = CancellationToken::new();
        let state = Arc::new(State { registry, readiness });
        let task = tokio::spawn(accept_loop(listener, state, stop.clone(), connection_time_max));
        tracing::info!(%address, "metrics and health endpoint listening");
        Endpoint { address, stop, task: Some(task) }
    }

    /// The address it listens on (with the real port when bound to port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops accepting and waits for the accept loop to end (connections in progress finish on their own).
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.ok();
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, stop: CancellationToken, connection_time_max: Duration) {
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "metrics endpoint cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!("metrics endpoint at its connection limit; closing a new connection");
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let answer = answer(&state, &request);
                async move { Ok::<_, Infallible>(answer) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = tokio::time::sleep(connection_time_max) => {
                    // The answer in progress, if any, goes out with `Connection: close`; a client
                    // that does not read it is cut off a little later.
                    connection.as_mut().graceful_shutdown();
                    tracing::debug!("metrics endpoint connection open too long; closing");
                    tokio::time::timeout(HEADER_READ_TIMEOUT, connection.as_mut()).await.unwrap_or(Ok(()))
                }
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "metrics endpoint connection ended with an error");
            }
            drop(permit);
        });
    }
}

fn answer<B>(state: &State, request: &Request<B>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if state.readiness.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        "/metrics" => match &state.registry {
            Some(registry) => metrics(registry),
            None => text(StatusCode::NOT_FOUND, "metrics are not recorded in this process\n"),
        },
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n"),
    }
}

fn metrics(registry: &prometheus::Registry) -> Response<Full<Bytes>> {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    if let Err(error) = encoder.encode(&registry.gather(), &mut body) {
        tracing::warn!(%error, "cannot encode metrics");
        return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n");
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    if let Ok(value) = encoder.format_type().parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A connection is closed once it is older than its bound, whatever its client does: here
    /// it keeps asking, a request every 100 ms, so no idle or header timer would ever end it.
    #[tokio::test]
    async fn a_connection_lasts_at_most_its_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = Endpoint::serve_for(listener, None, Readiness::new(), Duration::from_millis(500));
        let mut client = tokio::net::TcpStream::connect(endpoint.address()).await.expect("connect");
        let asking = async {
            let mut answers = 0;
            loop {
                if client.write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n").await.is_err() {
                    return answers;
                }
                let mut answer = [0_u8; 1024];
                match client.read(&mut answer).await {
                    Ok(0) | Err(_) => return answers,
                    Ok(_) => answers += 1,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let answers = tokio::time::timeout(Duration::from_secs(4), asking).await;
        assert!(matches!(answers, Ok(n) if n >= 2), "the server did not end a connection past its bound: {answers:?}");
        endpoint.shutdown().await;
    }
}
