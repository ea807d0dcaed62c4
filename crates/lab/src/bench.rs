//! `cargo xtask bench`: midflight and its baselines side by side, on this machine, in one
//! invocation, each as separate OS processes (the embedded Kafka in the lab, the mocks with the
//! user's latencies, consumers, a recovery worker), and a report of what was measured.
//!
//! The systems:
//! - `midflight-mariadb`, `midflight-sqlite`: the product, saga store on MariaDB or SQLite.
//! - `baseline-a`: the design the user has today, the lab's legacy consumer unchanged (one
//!   message at a time per consumer, a PROCESSING/DONE status row, a fresh key per attempt), one
//!   consumer per partition: one message at a time per partition.
//! - `baseline-b`: midflight's parallel pipeline without the saga table (`crate::nostate`):
//!   what durability costs.
//! - the ceiling: the database's own single-row commit rate at the consumers' concurrency
//!   (`ceiling`), divided by midflight's counted write transactions per message.
//!
//! The phases of each system, each on a fresh system (database, Kafka, mocks):
//! - `peak`: the producer keeps a backlog ahead of the consumers; msg/s is the completion rate
//!   after the warm-up. Write transactions per message, RSS and sagas in flight come from here.
//! - `paced`: messages at a fixed rate (half the peak unless `--rate`), for the latency a
//!   message sees when the system keeps up: end to end (produce call to DONE commit) and added
//!   (end to end minus the time the downstream calls took).
//! - `rebalance`: `paced`, with a consumer joining or leaving the group every 30 s; duplicates
//!   are counted by the checker (midflight) or from the downstream ledgers (baselines).
//!
//! Every phase also reads each role's CPU time from `/proc` (`cpu`): the consumers, the
//! recovery worker, the mocks, the lab, the database server and an external broker when they
//! run here, and the whole box, per finished message, so the report can say what a rate would
//! need. And it times the database's own commits beside the system's (`commit_probe`), so a
//! latency tail can be read against the server's (or the disk's) at the same seconds.
//!
//! Output: `report.md`, `phases.csv`, `series.csv`, `chart.svg` in the report directory, and
//! `--report-json`.

mod ceiling;
mod commit_probe;
mod cpu;
mod output;
mod phase;
mod tally;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use serde::Serialize;

pub use phase::PhaseResult;

use crate::system::GroupProtocol;

/// The warm-up excluded from a phase's throughput: consumers join, pools and caches fill.
const WARMUP_S_DEFAULT: u64 = 10;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// MariaDB/MySQL server for the MariaDB systems and baselines (a fresh database per run).
    #[arg(long, env = "MIDFLIGHT_LAB_MYSQL_URL")]
    pub mysql_url: Option<String>,
    /// An external Kafka's `bootstrap.servers` instead of the embedded cluster: each run
    /// creates topics and a consumer group of its own there (`lab.<run>.<system>.*`).
    #[arg(long)]
    pub kafka: Option<String>,
    /// Systems to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "midflight-mariadb,midflight-sqlite,baseline-a,baseline-b")]
    pub systems: Vec<SystemKind>,
    /// Phases to run for each system.
    #[arg(long, value_delimiter = ',', default_value = "peak,paced,rebalance")]
    pub phases: Vec<PhaseKind>,
    /// Producing time of each phase, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Start of a phase left out of its throughput.
    #[arg(long, default_value_t = WARMUP_S_DEFAULT)]
    pub warmup_seconds: u64,
    /// Consumer processes of midflight and baseline B (the user runs 8 on bigger machines).
    #[arg(long, default_value_t = 2)]
    pub consumers: usize,
    /// Legacy consumer processes of baseline A: one per partition by default.
    #[arg(long, default_value_t = 16)]
    pub baseline_a_consumers: usize,
    #[arg(long, default_value_t = 16)]
    pub partitions: i32,
    /// Rate of the paced phases (msg/s); by default half the system's measured peak.
    #[arg(long)]
    pub rate: Option<f64>,
    /// A consumer joins or leaves every this many seconds in the rebalance phase.
    #[arg(long, default_value_t = 30)]
    pub rebalance_every_s: u64,
    /// How long each ceiling measurement runs.
    #[arg(long, default_value_t = 5)]
    pub ceiling_seconds: u64,
    /// Extra `--set key=value` for every midflight consumer (variants, e.g. pool size).
    #[arg(long = "consumer-set")]
    pub consumer_set: Vec<String>,
    /// Recovery workers of midflight (the Kubernetes manifests run 2).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub recovery_workers: u64,
    /// Extra `--set key=value` for every midflight recovery worker (e.g. its pool size).
    #[arg(long = "recovery-set")]
    pub recovery_set: Vec<String>,
    /// `runtime.worker_threads` of every service of every system (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub worker_threads: usize,
    /// The consumers' Kafka group protocol, in every system: `classic` (the user's Kafka 3.5)
    /// or `consumer` (KIP-848: the broker assigns partitions through heartbeats, with no
    /// group-wide join).
    #[arg(long, value_enum, default_value_t = GroupProtocol::Classic)]
    pub group_protocol: GroupProtocol,
    /// Mocks answer without injected latency (to see the box's own limit).
    #[arg(long)]
    pub no_latency: bool,
    /// Where the systems keep their databases and logs.
    #[arg(long, default_value = "run")]
    pub run_dir: PathBuf,
    /// Where the report goes (default: a `report` directory inside this run's directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub report_json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemKind {
    MidflightMariadb,
    MidflightSqlite,
    BaselineA,
    BaselineB,
}

impl SystemKind {
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::MidflightMariadb => "midflight-mariadb",
            SystemKind::MidflightSqlite => "midflight-sqlite",
            SystemKind::BaselineA => "baseline-a",
            SystemKind::BaselineB => "baseline-b",
        }
    }

    /// The saga table (and the checker's full snapshot) exists only in midflight.
    pub fn is_midflight(self) -> bool {
        matches!(self, SystemKind::MidflightMariadb | SystemKind::MidflightSqlite)
    }

    pub fn uses_mysql(self) -> bool {
        self != SystemKind::MidflightSqlite
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PhaseKind {
    Peak,
    Paced,
    Rebalance,
}

/// One system's phases.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SystemResult {
    pub peak: Option<PhaseResult>,
    pub paced: Option<PhaseResult>,
    pub rebalance: Option<PhaseResult>,
}

/// Everything the report says.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub machine: output::Machine,
    pub command: String,
    /// The consumers' group protocol (`classic` or `consumer`).
    pub group_protocol: &'static str,
    /// Which Kafka: `embedded`, or the external one's bootstrap servers.
    pub kafka: String,
    pub systems: BTreeMap<SystemKind, SystemResult>,
    /// Per engine (`mariadb`, `sqlite`): the single-row commit rate measured.
    pub ceilings: BTreeMap<String, ceiling::Ceiling>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<bool> {
    if args.systems.iter().any(|s| s.uses_mysql()) && args.mysql_url.as_deref().is_none_or(str::is_empty) {
        bail!(
            "the MariaDB systems and baselines need --mysql-url (or MIDFLIGHT_LAB_MYSQL_URL); \
             run `--systems midflight-sqlite` alone without one"
        );
    }
    if args.seconds <= args.warmup_seconds {
        bail!("--seconds ({}) must exceed --warmup-seconds ({})", args.seconds, args.warmup_seconds);
    }
    if args.consumers == 0 || args.baseline_a_consumers == 0 || args.partitions < 1 {
        bail!("--consumers, --baseline-a-consumers and --partitions must be at least 1");
    }
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        bail!("--rate must be a positive number of messages a second, got {rate}");
    }
    let run_dir = args.run_dir.join(format!("bench-{}", crate::timestamp()));
    let out = args.out.clone().unwrap_or_else(|| run_dir.join("report"));
    std::fs::create_dir_all(&out)?;
    let machine = output::Machine::read(args.mysql_url.as_deref()).await;
    println!("bench: {} ({} cores); runs in {}", machine.cpu, machine.cores, run_dir.display());
    let mut ceilings = BTreeMap::new();
    let connections = u32::try_from(args.consumers).unwrap_or(1).saturating_mul(phase::MYSQL_POOL);
    if args.systems.iter().any(|s| s.uses_mysql())
        && let Some(url) = &args.mysql_url
    {
        ceilings.insert(
            "mariadb".to_owned(),
            ceiling::measure(Some(url), &run_dir, connections, args.ceiling_seconds).await?,
        );
    }
    if args.systems.contains(&SystemKind::MidflightSqlite) {
        let sqlite = u32::try_from(args.consumers).unwrap_or(1).saturating_mul(phase::SQLITE_POOL);
        ceilings.insert("sqlite".to_owned(), ceiling::measure(None, &run_dir, sqlite, args.ceiling_seconds).await?);
    }
    for (engine, ceiling) in &ceilings {
        println!(
            "bench: ceiling {engine}: {:.0} single-row commits/s at {} connections",
            ceiling.commits_per_s, ceiling.connections
        );
    }
    let mut report = BenchReport {
        machine,
        command: command_line(),
        group_protocol: args.group_protocol.as_str(),
        kafka: args.kafka.clone().unwrap_or_else(|| "embedded".to_owned()),
        systems: BTreeMap::new(),
        ceilings,
    };
    for &system in &args.systems {
        let mut result = SystemResult::default();
        if args.phases.contains(&PhaseKind::Peak) {
            result.peak = Some(phase::run(&args, &run_dir, system, phase::Load::Peak).await?);
        }
        let peak_rate = result.peak.as_ref().map(|p| p.msgs_per_s);
        let rate = args.rate.or(peak_rate.map(|r| (r / 2.0).max(1.0)));
        for (kind, slot) in [(PhaseKind::Paced, &mut result.paced), (PhaseKind::Rebalance, &mut result.rebalance)] {
            if !args.phases.contains(&kind) {
                continue;
            }
            let Some(rate) = rate else { bail!("the paced phases need --rate or the peak phase to derive it") };
            let rebalance_every_s = (kind == PhaseKind::Rebalance).then_some(args.rebalance_every_s);
            *slot = Some(phase::run(&args, &run_dir, system, phase::Load::Paced { rate, rebalance_every_s }).await?);
        }
        report.systems.insert(system, result);
        // Written after every system, so a long run that fails late still leaves a report.
        output::write(&out, &report)?;
    }
    output::write(&out, &report)?;
    if let Some(path) = &args.report_json {
        output::write_json(path, &report)?;
    }
    print!("{}", output::summary_markdown(&report));
    println!("bench: report in {}", out.display());
    // A midflight phase with a duplicate, a violation or a lost message, or one that did not
    // drain, fails the run: its numbers are no result.
    let failed: Vec<String> = report
        .systems
        .iter()
        .filter(|(kind, _)| kind.is_midflight())
        .flat_map(|(_, result)| [&result.peak, &result.paced, &result.rebalance].into_iter().flatten())
        .flat_map(output::failures)
        .collect();
    for failure in &failed {
        println!("bench: FAILED: {failure}");
    }
    Ok(failed.is_empty())
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("midflight-lab {}", args.join(" "))
}
