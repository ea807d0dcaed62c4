//! The mock WMS: a small but careful warehouse system that midflight's sagas lock stock in.
//!
//! It is idempotent on the caller's request id, queryable by it, reversible with the caller's
//! voucher (a reversal of an unknown id leaves a tombstone that refuses a late lock), keeps a
//! persistent ledger for reconciliation, and injects the faults of the shared
//! [`midflight_mock`] plan. Its legacy mode behaves like the user's real WMS at the time of the
//! incident: it deduplicates only on keys of its own.
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
use midflight_api::wms::v1::wms_server::WmsServer;
use midflight_config::Config;
use midflight_mock::{Clock, FaultAdminService, FaultInjector, SystemClock};
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

pub use config::{StockSection, WmsConfig};

use crate::ledger::Ledger;
use crate::service::WmsService;

/// The methods of `wms.v1.Wms`, as a fault plan names them.
pub const METHODS: &[&str] = &["LockStock", "QueryLock", "ReverseLock", "ListLedger"];

/// Why the mock WMS could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration invalid: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error(transparent)]
    Mock(#[from] midflight_mock::Error),
}

/// Serves the WMS (and its FaultAdmin and health services) on `listener` until `shutdown`.
pub async fn run(config: WmsConfig, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    run_with_clock(config, listener, Arc::new(SystemClock), shutdown).await
}

/// [`run`] with an injected clock, so tests can move past the reversal window without waiting.
pub async fn run_with_clock(
    config: WmsConfig,
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(Error::Config(problems));
    }
    let db = midflight_mock::database::connect(&config.database).await?;
    let ledger = Ledger::open(db, clock).await?;
    let seeded = ledger.seed_stock(&config.stock.levels()).await?;
    tracing::info!(seeded, "stock seeded");
    let injector = Arc::new(FaultInjector::new(config.faults.clone()));
    tracing::info!(seed = injector.plan().seed, legacy_mode = injector.legacy_mode(), "fault plan in force");
    let wms = WmsService::new(Arc::new(ledger), Arc::clone(&injector)).into_server();
    let admin = FaultAdminService::new(injector, METHODS).into_server();
    let routes = Routes::new(wms).add_service(admin);
    let names =
        [<WmsServer<WmsService> as NamedService>::NAME, <FaultAdminServer<FaultAdminService> as NamedService>::NAME];
    midflight_mock::server::serve(&config.server, listener, routes, &names, shutdown).await?;
    Ok(())
}
