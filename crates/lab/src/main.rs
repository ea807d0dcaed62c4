//! `midflight-lab`: runs midflight as separate OS processes on one machine. `cargo xtask`
//! builds it and forwards `demo`, `scenario`, `chaos`, `stack` and `bench` to it; the hidden
//! `legacy-consumer` (the old design's consumer: the demo's legacy run, baseline A) and
//! `nostate-consumer` (baseline B: midflight's pipeline without the saga table) commands are
//! started by the lab itself.

mod bench;
mod chaos;
mod demo;
mod legacy;
mod membership;
mod nostate;
mod process;
mod proxy;
mod report;
mod run;
mod scenario;
mod stack;
mod system;
mod timings;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "midflight-lab", about = "Runs midflight as separate processes and checks every run")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The incident, with the legacy design and with midflight.
    Demo(demo::DemoArgs),
    /// One scenario of the catalogue (`--list` to list them).
    Scenario(scenario::ScenarioArgs),
    /// A random fault campaign, fully determined by its seed.
    Chaos(chaos::ChaosArgs),
    /// Leave the local stack running (`up`), or stop it (`down`).
    Stack(stack::StackArgs),
    /// midflight and its baselines side by side; writes a report (Markdown, CSV, SVG, JSON).
    Bench(bench::BenchArgs),
    /// The legacy design's consumer process (started by the lab).
    #[command(hide = true)]
    LegacyConsumer {
        #[arg(long)]
        config: PathBuf,
    },
    /// The benchmark's baseline B consumer (started by the lab).
    #[command(hide = true)]
    NostateConsumer {
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("midflight-lab: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => {
                init_logs();
                demo::demo(args).await
            }
            Command::Scenario(args) => {
                init_logs();
                scenario::run(args).await
            }
            Command::Chaos(args) => {
                init_logs();
                chaos::run(args).await
            }
            Command::Stack(args) => stack::run(args).await,
            Command::Bench(args) => {
                init_logs();
                bench::run(args).await
            }
            Command::NostateConsumer { config } => nostate_consumer(config).await.map(|()| true),
            Command::LegacyConsumer { config } => legacy_consumer(config).await.map(|()| true),
        }
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("midflight-lab: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn legacy_consumer(path: PathBuf) -> anyhow::Result<()> {
    let sources = midflight_config::Sources { file: Some(path), ..Default::default() };
    let config: legacy::LegacyConfig = midflight_config::load(&sources)?;
    let _telemetry = midflight_service::init_telemetry("legacy-consumer", &config.telemetry)?;
    let shutdown = midflight_service::shutdown_on_signals();
    legacy::run(config, shutdown).await
}

async fn nostate_consumer(path: PathBuf) -> anyhow::Result<()> {
    let sources = midflight_config::Sources { file: Some(path), ..Default::default() };
    let config: nostate::NoStateConfig = midflight_config::load(&sources)?;
    let _telemetry = midflight_service::init_telemetry("nostate-consumer", &config.telemetry)?;
    let shutdown = midflight_service::shutdown_on_signals();
    nostate::run(config, shutdown).await
}

/// The lab's own log lines: warnings only, so the progress and the report stay readable.
fn init_logs() {
    let filter =
        tracing_subscriber::EnvFilter::try_new("warn").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_target(false).compact().init();
}

/// Seconds since the Unix epoch, to name run directories.
pub fn timestamp() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
