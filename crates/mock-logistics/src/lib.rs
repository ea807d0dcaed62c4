//! The mock logistics provider: allocates tracking numbers for midflight's sagas.
//!
//! It is idempotent on the caller's request id, queryable by it, cancellable with the caller's
//! voucher until pickup (a cancel of an unknown id leaves a tombstone that refuses a late
//! creation), rejects unserviceable regions definitively, keeps a persistent ledger for
//! reconciliation, and injects the faults of the shared [`midflight_mock`] plan.
//!
//! `run` takes its listener and shutdown signal from outside, so tests bind port 0 and `main`
//! binds the configured address; both drive the same code.

pub mod config;
pub mod entity;
pub mod ledger;
pub mod service;

use std::future::Future;
use std::sync::Arc;

use midflight_api::faults::v1::fault_admin_server::FaultAdminServer;
use midflight_api::logistics::v1::logistics_server::LogisticsServer;
use midflight_config::Config;
use midflight_mock::{Clock, FaultAdminService, FaultInjector, SystemClock};
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

pub use config::{LogisticsConfig, ShippingSection};

use crate::ledger::Ledger;
use crate::service::LogisticsService;

/// The methods of `logistics.v1.Logistics`, as a fault plan names them.
pub const METHODS: &[&str] = &["CreateShipment", "QueryShipment", "CancelShipment", "ListLedger"];

/// Why the mock logistics provider could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration invalid: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error(transparent)]
    Mock(#[from] midflight_mock::Error),
}

/// Serves logistics (and its FaultAdmin and health services) on `listener` until `shutdown`.
pub async fn run(
    config: LogisticsConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    run_with_clock(config, listener, Arc::new(SystemClock), shutdown).await
}

/// [`run`] with an injected clock, so tests can move past pickup without waiting.
pub async fn run_with_clock(
    config: LogisticsConfig,
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(Error::Config(problems));
    }
    let db = midflight_mock::database::connect(&config.database).await?;
    let ledger = Ledger::open(db, clock, config.shipping.unserviceable_regions.clone()).await?;
    let injector = Arc::new(FaultInjector::new(config.faults.clone()));
    tracing::info!(seed = injector.plan().seed, "fault plan in force");
    let logistics = LogisticsService::new(Arc::new(ledger), Arc::clone(&injector)).into_server();
    let admin = FaultAdminService::new(injector, METHODS).into_server();
    let routes = Routes::new(logistics).add_service(admin);
    let names = [
        <LogisticsServer<LogisticsService> as NamedService>::NAME,
        <FaultAdminServer<FaultAdminService> as NamedService>::NAME,
    ];
    midflight_mock::server::serve(&config.server, listener, routes, &names, shutdown).await?;
    Ok(())
}
