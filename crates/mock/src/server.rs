//! The gRPC server bootstrap both mocks share: timeouts, a global concurrency limit, the optional
//! bearer token, the health service and graceful shutdown, around the routes a mock brings.
//!
//! The listener and the shutdown signal come from outside (mini-redis style), so tests bind port 0
//! and stop the server with a channel, exactly as `main` binds the configured address and stops
//! on a signal.

use std::future::Future;
use std::time::Duration;

use midflight_config::ServerSection;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tower::limit::GlobalConcurrencyLimitLayer;

use crate::Error;
use crate::auth::BearerAuthLayer;

/// Serving starts once the listener is bound and the routes are built: the mock is ready then.
fn ready(ready: bool) {
    midflight_service::readiness().set_ready(ready);
}

/// Serves `routes` on `listener` until `shutdown` completes, then drains calls in flight.
///
/// `service_names` are the fully qualified names of the services in `routes` (e.g. `wms.v1.Wms`);
/// the health service reports each of them as serving.
pub async fn serve(
    section: &ServerSection,
    listener: TcpListener,
    routes: Routes,
    service_names: &[&str],
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in service_names {
        reporter.set_service_status(name, ServingStatus::Serving).await;
    }
    let local_addr = listener.local_addr().map_err(Error::Listener)?;
    // Without TCP_NODELAY small HTTP/2 frames wait on Nagle's algorithm and delayed ACKs, which
    // adds tens of milliseconds to calls that should take one.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tracing::info!(%local_addr, services = ?service_names, auth = section.bearer_token.is_some(), "serving");
    ready(true);
    // Tracing first, so a call refused by the token check or the limit still shows in its trace.
    let served = Server::builder()
        .timeout(Duration::from_millis(section.request_timeout_ms))
        .layer(midflight_service::grpc::ServerTraceLayer)
        .layer(BearerAuthLayer::new(section.bearer_token.as_deref()))
        .layer(GlobalConcurrencyLimitLayer::new(section.concurrency_limit))
        .add_routes(routes.add_service(health))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    ready(false);
    served?;
    tracing::info!(%local_addr, "stopped");
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM, whichever comes first: the shutdown signal of the mock
/// binaries.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for sigterm");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown requested");
}
