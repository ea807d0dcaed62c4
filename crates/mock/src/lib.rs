//! What the mock WMS and the mock logistics provider share, so nothing is written twice.
//!
//! - [`plan`]: the fault plan as configuration and as the `faults.v1` message.
//! - [`injector`]: per-call fault decisions and the wrapper every handler runs its effect in.
//! - [`latency`]: log-normal latency fitted to a p50 and a p99.
//! - [`admin`]: the FaultAdmin gRPC service.
//! - [`server`] and [`auth`]: the gRPC server bootstrap (timeout, concurrency limit, bearer token,
//!   health, graceful shutdown).
//! - [`clock`]: injectable wall-clock time.
//! - [`database`] and [`serial`]: the ledger database and its single-writer discipline.
//! - [`input`]: request limits and their INVALID_ARGUMENT answers.

pub mod admin;
pub mod auth;
pub mod clock;
pub mod database;
pub mod injector;
pub mod input;
pub mod latency;
pub mod plan;
pub mod serial;
pub mod server;

pub use admin::FaultAdminService;
pub use clock::{Clock, ManualClock, SystemClock};
pub use injector::FaultInjector;
pub use plan::{FaultPlan, Latency, MethodFaults};
pub use serial::SerialWriter;

/// Why a mock could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Database { context: String, source: sea_orm::DbErr },
    #[error("cannot use the listener: {0}")]
    Listener(std::io::Error),
    #[error("grpc server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}
