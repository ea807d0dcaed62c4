//! What every midflight binary does around its service: parse the common flags, load the
//! configuration through the one layered loader, set up telemetry, turn SIGINT/SIGTERM into a
//! cancellation, run the service, and report a failure as one clear line and a non-zero exit.
//!
//! A binary's `main.rs` is then a few lines:
//!
//! ```ignore
//! fn main() -> std::process::ExitCode {
//!     midflight_service::main("midflight-consumer", |config: ConsumerConfig, shutdown| {
//!         midflight_consumer::run(config, shutdown)
//!     })
//! }
//! ```
//!
//! Telemetry lives here too, so every service has the same: [`init_telemetry`] (logs, traces and
//! metrics from the `telemetry` section), the `/metrics` `/healthz` `/readyz` [`Endpoint`] and the
//! process's [`Readiness`], [`trace`] (W3C trace context in and out of headers, metadata and the
//! saga row), [`grpc`] (the traced server layer of the mocks) and [`metrics`] (the catalogue of
//! names and the instruments).

mod endpoint;
pub mod grpc;
mod health;
pub mod metrics;
mod telemetry;
pub mod trace;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
pub use midflight_config::Config;
use midflight_config::Sources;
use tokio_util::sync::CancellationToken;

pub use endpoint::Endpoint;
pub use health::{Readiness, readiness};
pub use telemetry::{Telemetry, init_telemetry, init_telemetry_with_exporter};

/// A service's configuration: loadable by the one loader, and carrying a telemetry section and
/// the runtime's settings.
pub trait ServiceConfig: Config {
    fn telemetry(&self) -> &midflight_config::TelemetrySection;
    fn runtime(&self) -> &midflight_config::RuntimeSection;
}

/// The flags every midflight binary takes.
#[derive(Debug, Clone, Parser)]
pub struct Args {
    /// TOML configuration file (optional: every setting has a documented default).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one setting, e.g. `--set database.url=mysql://...` (repeatable; wins over file and environment).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print the configuration in force (defaults, file, environment and flags applied) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// Set by a supervising process (the lab) to its own process id: the service then shuts down,
/// as on SIGTERM, once that process is gone, instead of running on with nobody to stop it.
pub const PARENT_PID_VAR: &str = "MIDFLIGHT_PARENT_PID";

/// How often the service checks that its supervising process is still its parent.
const PARENT_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// Why a service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] midflight_config::Error),
    #[error("telemetry: {0}")]
    Telemetry(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs a service: flags, config, telemetry, signals, then `run(config, shutdown)`.
/// The exit code is 0 when the service returns `Ok`, 2 when its configuration or supervision
/// cannot be set up, 1 when it fails afterwards (after printing the error).
pub fn main<C, F, Fut, E>(service: &'static str, run: F) -> ExitCode
where
    C: ServiceConfig,
    F: FnOnce(C, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let args = Args::parse();
    let config: C = match midflight_config::load(&Sources::from_process(args.config.clone(), args.set.clone())) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{service}: {error}");
            return ExitCode::from(2);
        }
    };
    // The log filter is parsed by the logging library, so it is checked here with the rest of
    // the configuration (bad usage, exit 2), not found when telemetry starts.
    if let Err(error) = telemetry::check_log_filter(config.telemetry()) {
        eprintln!("{service}: {error}");
        return ExitCode::from(2);
    }
    let parent = match supervisor() {
        Ok(parent) => parent,
        Err(error) => {
            eprintln!("{service}: {error}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        print!("{}", midflight_config::to_toml(&config));
        return ExitCode::SUCCESS;
    }
    let runtime = match build_runtime(config.runtime()) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{service}: {}", Error::Runtime(error));
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let telemetry = match init_telemetry(service, config.telemetry()) {
            Ok(guard) => guard,
            Err(error) => {
                eprintln!("{service}: {error}");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = shutdown_on_signals();
        if let Some(parent) = parent {
            stop_with_parent(parent, shutdown.clone());
        }
        // Not ready from the first signal on, so an orchestrator stops counting on the process
        // while it drains; the service itself says when it became ready.
        let draining = shutdown.clone();
        tokio::spawn(async move {
            draining.cancelled().await;
            readiness().drain();
        });
        tracing::info!(service, "starting");
        let code = match run(config, shutdown).await {
            Ok(()) => {
                tracing::info!(service, "stopped");
                ExitCode::SUCCESS
            }
            Err(error) => {
                tracing::error!(service, %error, "stopped with an error");
                eprintln!("{service}: {error}");
                ExitCode::FAILURE
            }
        };
        readiness().set_ready(false);
        telemetry.shutdown().await;
        code
    })
}

/// The multi-thread runtime a service runs on, with `section`'s worker threads (0: tokio's
/// choice).
pub fn build_runtime(section: &midflight_config::RuntimeSection) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if section.worker_threads > 0 {
        builder.worker_threads(section.worker_threads);
    }
    builder.enable_all().build()
}

/// The supervising process named by [`PARENT_PID_VAR`], if any.
fn supervisor() -> Result<Option<u32>, String> {
    let Some(value) = std::env::var_os(PARENT_PID_VAR) else { return Ok(None) };
    let value = value.to_string_lossy();
    match value.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(Some(pid)),
        _ => Err(format!("{PARENT_PID_VAR} must be the process id of the supervising process, not {value:?}")),
    }
}

/// Cancels `shutdown` once this process's parent is no longer `parent` (it exited, and the
/// process was handed to another). Nothing else cancels on its behalf: a supervisor killed by
/// SIGKILL or by a crash cannot stop its children itself.
fn stop_with_parent(parent: u32, shutdown: CancellationToken) {
    #[cfg(unix)]
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PARENT_POLL);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if std::os::unix::process::parent_id() != parent {
                tracing::warn!(parent, "the supervising process is gone; shutting down");
                shutdown.cancel();
                return;
            }
        }
    });
    #[cfg(not(unix))]
    let _ = (parent, shutdown);
}

/// A token cancelled on the first SIGINT or SIGTERM. A second signal ends the process at once
/// (exit code 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM), for a shutdown that
/// hangs (a database that does not answer): nothing is lost by it, as nothing is by a crash
/// (rows are the record of work; leases expire, and offsets are committed only for rows
/// already durable).
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        // Registered once, so a second signal that comes at once is not missed.
        let mut signals = Signals::new();
        let first = signals.next().await;
        tracing::info!(signal = first.name, "shutdown requested; a second signal stops the process at once");
        cancel.cancel();
        let second = signals.next().await;
        tracing::warn!(
            signal = second.name,
            "second shutdown signal: stopping at once, without finishing the shutdown"
        );
        eprintln!("second shutdown signal ({}): stopping at once", second.name);
        std::process::exit(second.exit_code);
    });
    token
}

/// A shutdown signal that arrived.
#[derive(Debug, Clone, Copy)]
struct Arrived {
    name: &'static str,
    exit_code: i32,
}

const SIGINT: Arrived = Arrived { name: "SIGINT", exit_code: 130 };

/// SIGINT and SIGTERM, listened to from creation on.
struct Signals {
    #[cfg(unix)]
    listeners: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listeners = signal(SignalKind::interrupt()).and_then(|int| Ok((int, signal(SignalKind::terminate())?)));
            Signals { listeners: listeners.ok() }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    async fn next(&mut self) -> Arrived {
        #[cfg(unix)]
        if let Some((interrupt, terminate)) = &mut self.listeners {
            return tokio::select! {
                _ = interrupt.recv() => SIGINT,
                _ = terminate.recv() => Arrived { name: "SIGTERM", exit_code: 143 },
            };
        }
        // Without the listeners (or off unix), Ctrl-C alone.
        tokio::signal::ctrl_c().await.ok();
        SIGINT
    }
}

#[cfg(test)]
mod tests {
    use midflight_config::RuntimeSection;

    use super::build_runtime;

    #[test]
    fn the_runtime_has_the_configured_worker_threads() {
        let one = build_runtime(&RuntimeSection { worker_threads: 1 }).expect("runtime");
        assert_eq!(one.metrics().num_workers(), 1);
        let three = build_runtime(&RuntimeSection { worker_threads: 3 }).expect("runtime");
        assert_eq!(three.metrics().num_workers(), 3);
        // 0 leaves the choice to tokio: at least one worker.
        let chosen = build_runtime(&RuntimeSection::default()).expect("runtime");
        assert!(chosen.metrics().num_workers() >= 1);
    }
}
