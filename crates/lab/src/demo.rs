//! `cargo xtask demo`: the user's incident, twice. First with the legacy design (status
//! PROCESSING/DONE, a fresh downstream key per attempt, the WMS deduplicating only on its own
//! key), which must show the double deduction; then with midflight, which must show none.
//!
//! The incident: 16 partitions, 8 consumers, LockStock answers lost now and then (the WMS
//! applies the lock, the caller sees a timeout), and a rolling restart that kills 3 of the 8
//! consumers while calls are in flight.

use std::path::PathBuf;
use std::time::Duration;

use midflight_mock::{FaultPlan, MethodFaults};

use crate::run::{Action, Plan, Scheduled, Trigger, execute};
use crate::system::SystemSpec;
use crate::workload::Workload;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Orders produced in each run.
    #[arg(long, default_value_t = 600)]
    pub messages: usize,
    /// Seed of the workload and of the mocks' fault draws.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Share of LockStock answers lost after the lock was applied.
    #[arg(long, default_value_t = 0.05)]
    pub drop_response: f64,
    /// A MySQL server URL to run on (a fresh database is created); SQLite files otherwise.
    #[arg(long)]
    pub mysql_url: Option<String>,
    /// An external Kafka's `bootstrap.servers` instead of the embedded cluster: each run
    /// creates topics and a consumer group of its own there (`lab.<run>.<system>.*`).
    #[arg(long)]
    pub kafka: Option<String>,
    /// Where runs keep their logs and databases.
    #[arg(long, default_value = "run")]
    pub run_dir: PathBuf,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub report_json: Option<PathBuf>,
}

/// Runs both halves; returns whether midflight kept every invariant.
pub async fn demo(args: DemoArgs) -> anyhow::Result<bool> {
    if !(0.0..=1.0).contains(&args.drop_response) {
        anyhow::bail!("--drop-response is a share of LockStock answers, 0 to 1; got {}", args.drop_response);
    }
    if args.messages == 0 {
        anyhow::bail!("--messages must be at least 1");
    }
    let run_dir = args.run_dir.join(format!("demo-{}", crate::timestamp()));
    let legacy = execute(plan(&args, &run_dir, true)).await?;
    let mut ours = execute(plan(&args, &run_dir, false)).await?;
    println!();
    legacy.print();
    println!();
    ours.print();
    println!();
    let verdict = ours.passed();
    println!(
        "legacy design: {} duplicate effect(s); midflight: {} duplicate effect(s), {} lost, {} violation(s) -> {}",
        legacy.duplicate_effects,
        ours.duplicate_effects,
        ours.lost,
        ours.violations.len(),
        if verdict { "PASS" } else { "FAIL" }
    );
    if legacy.duplicate_effects == 0 {
        println!(
            "note: the legacy run happened to show no double deduction this time; raise --drop-response or --messages"
        );
    }
    ours.legacy = Some(Box::new(legacy));
    if let Some(path) = &args.report_json {
        ours.write_json(path)?;
        println!("report written to {}", path.display());
    }
    Ok(verdict)
}

fn plan(args: &DemoArgs, run_dir: &std::path::Path, legacy: bool) -> Plan {
    let name = if legacy { "legacy" } else { "midflight" };
    let mut spec = SystemSpec::new(name, run_dir);
    spec.legacy = legacy;
    spec.mysql_url = args.mysql_url.clone();
    spec.kafka_bootstrap = args.kafka.clone();
    spec.wms_faults = wms_faults(args);
    spec.logistics_faults = latency("CreateShipment", 110, 320, args.seed + 1);
    let workload = Workload::orders(args.seed, args.messages, "ORD");
    Plan { spec, workload, schedule: rolling_restart(&[2, 5, 7]), settle: Duration::from_secs(120) }
}

/// The user's latencies, and lost LockStock answers.
fn wms_faults(args: &DemoArgs) -> FaultPlan {
    let mut plan = latency("LockStock", 60, 180, args.seed);
    if let Some(lock) = plan.methods.get_mut("LockStock") {
        lock.drop_response = args.drop_response;
    }
    plan.methods.insert("QueryLock".to_owned(), MethodFaults::with_latency(20, 60));
    plan
}

fn latency(method: &str, p50_ms: u32, p99_ms: u32, seed: u64) -> FaultPlan {
    let mut plan = FaultPlan { seed, ..FaultPlan::default() };
    plan.methods.insert(method.to_owned(), MethodFaults::with_latency(p50_ms, p99_ms));
    plan
}

/// Kill each consumer in turn once a tenth of the work is done, restarting it 1.5 s later.
fn rolling_restart(consumers: &[usize]) -> Vec<Scheduled> {
    let mut schedule = Vec::new();
    for (index, consumer) in consumers.iter().enumerate() {
        let target = format!("consumer-{consumer}");
        let when = if index == 0 { Trigger::AtProgress(0.1) } else { Trigger::AfterMs(500) };
        schedule.push(Scheduled { when, action: Action::Kill { target: target.clone() } });
        schedule.push(Scheduled { when: Trigger::AfterMs(1_500), action: Action::Start { target } });
    }
    schedule
}
