//! `mock-logistics`: the mock logistics provider as a process. Everything but flags, logging and signals is in the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use midflight_config::Sources;
use midflight_mock_logistics::LogisticsConfig;

/// A mock logistics provider: idempotent, queryable, cancellable until pickup, with fault injection.
#[derive(Debug, Parser)]
struct Args {
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one setting, e.g. `--set faults.irreversible_after_ms=60000` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Print the configuration in force and exit.
    #[arg(long)]
    print_config: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config: LogisticsConfig = midflight_config::load(&Sources::from_process(args.config, args.set))?;
    if args.print_config {
        print!("{}", midflight_config::to_toml(&config));
        return Ok(());
    }
    // Replaced by the shared telemetry crate once it exists.
    let filter = tracing_subscriber::EnvFilter::try_new(&config.telemetry.log_filter)?;
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    midflight_mock_logistics::run(config, listener, midflight_mock::server::shutdown_signal()).await?;
    Ok(())
}
