//! `cargo xtask chaos`: a random fault campaign. The schedule (which fault, on whom, when, and
//! the load waves between faults) is drawn from one seed and printed, so a failing campaign is
//! replayed with `--seed`; process timing on the machine is the only thing the seed does not fix.

use std::path::PathBuf;
use std::time::Duration;

use midflight_mock::{FaultPlan, MethodFaults};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::run::{Action, Plan, Scheduled, Trigger, execute};
use crate::system::{GroupProtocol, SystemSpec};
use crate::workload::Workload;

#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Seed of the whole schedule; a random one is drawn (and printed) if absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Orders produced over the campaign (in waves between faults).
    #[arg(long, default_value_t = 2_000)]
    pub messages: usize,
    /// Fault events injected.
    #[arg(long, default_value_t = 100)]
    pub faults: usize,
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    #[arg(long, default_value_t = 2)]
    pub recovery_workers: usize,
    #[arg(long, env = "MIDFLIGHT_LAB_MYSQL_URL")]
    pub mysql_url: Option<String>,
    /// The consumers' group protocol. `consumer` (KIP-848) exists for long campaigns: the
    /// embedded broker's classic group coordinator can abort the whole lab (an assertion in
    /// librdkafka's mock, `rd_kafka_mock_cgrp_classic_member_add`) after some hundreds of faults.
    #[arg(long, value_enum, default_value_t = GroupProtocol::Classic)]
    pub group_protocol: GroupProtocol,
    /// An external Kafka's `bootstrap.servers` instead of the embedded cluster (topics and a
    /// group of this run's own there). The campaign then draws no broker faults (a broker down,
    /// a leader moved): the lab can do those only to the embedded cluster.
    #[arg(long)]
    pub kafka: Option<String>,
    #[arg(long, default_value = "run")]
    pub run_dir: PathBuf,
    #[arg(long)]
    pub report_json: Option<PathBuf>,
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<bool> {
    if args.consumers == 0 || args.messages == 0 {
        anyhow::bail!("--consumers and --messages must be at least 1");
    }
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    println!(
        "chaos: seed {seed} (replay with --seed {seed}), {} messages, {} faults, group protocol {}, Kafka {}",
        args.messages,
        args.faults,
        args.group_protocol.as_str(),
        args.kafka.as_deref().map_or("embedded".to_owned(), |bootstrap| format!("at {bootstrap} (no broker faults)"))
    );
    let run_dir = args.run_dir.join(format!("chaos-{seed}-{}", crate::timestamp()));
    let mut spec = SystemSpec::new("chaos", &run_dir);
    spec.consumers = args.consumers;
    spec.recovery_workers = args.recovery_workers;
    spec.mysql_url = args.mysql_url.clone();
    spec.lease_ms = 3_000;
    spec.group_protocol = args.group_protocol;
    spec.kafka_bootstrap = args.kafka.clone();
    spec.wms_faults = latency("LockStock", 60, 180, seed);
    spec.logistics_faults = latency("CreateShipment", 110, 320, seed + 1);
    let schedule = schedule(seed, &args);
    let first_wave = (args.messages / 10).max(1);
    let workload = Workload::orders(seed, first_wave, &format!("C{}", seed % 100_000));
    let mut report = execute(Plan { spec, workload, schedule, settle: Duration::from_secs(180) }).await?;
    report.notes.push(format!("seed {seed}"));
    report.print();
    let passed = report.passed();
    println!(
        "chaos: {} messages checked, {} faults injected -> {}",
        report.messages,
        report.faults_injected,
        if passed { "PASS" } else { "FAIL" }
    );
    if let Some(path) = &args.report_json {
        report.write_json(path)?;
    }
    Ok(passed)
}

/// The campaign: `faults` fault events, each maybe followed by its repair, the rest of the
/// messages produced in waves between them, and everything repaired at the end.
pub fn schedule(seed: u64, args: &ChaosArgs) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    let remaining = args.messages - (args.messages / 10).max(1).min(args.messages);
    let waves = (args.faults / 5).max(1);
    let per_wave = remaining / waves;
    let mut produced = 0;
    for index in 0..args.faults {
        if index % 5 == 0 && produced < remaining {
            let orders = if index / 5 + 1 == waves { remaining - produced } else { per_wave.min(remaining - produced) };
            produced += orders;
            steps
                .push(step(Trigger::AfterMs(0), Action::Produce { orders, seed: seed.wrapping_add(index as u64 + 1) }));
        }
        let gap = rng.random_range(100..1_000);
        steps.extend(fault(&mut rng, args, gap));
    }
    if produced < remaining {
        steps.push(step(
            Trigger::AfterMs(0),
            Action::Produce { orders: remaining - produced, seed: seed.wrapping_add(1_000_000) },
        ));
    }
    steps.extend(repair_everything(seed, args));
    steps
}

fn step(when: Trigger, action: Action) -> Scheduled {
    Scheduled { when, action }
}

/// The kinds of fault `fault` draws from: all nine on the embedded cluster; on an external
/// Kafka all but the broker faults (kinds 6 and 7).
const EVERY_KIND: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
const WITHOUT_BROKER_FAULTS: [u8; 7] = [0, 1, 2, 3, 4, 5, 8];

/// One fault event and, where it has one, its repair.
fn fault(rng: &mut StdRng, args: &ChaosArgs, gap_ms: u64) -> Vec<Scheduled> {
    let consumer = format!("consumer-{}", rng.random_range(1..=args.consumers));
    let recovery = format!("recovery-{}", rng.random_range(1..=args.recovery_workers.max(1)));
    let at = Trigger::AfterMs(gap_ms);
    let kinds: &[u8] = if args.kafka.is_some() { &WITHOUT_BROKER_FAULTS } else { &EVERY_KIND };
    match kinds[rng.random_range(0..kinds.len())] {
        0 => vec![
            step(at, Action::Kill { target: consumer.clone() }),
            step(Trigger::AfterMs(rng.random_range(300..2_000)), Action::Start { target: consumer }),
        ],
        1 => vec![
            step(at, Action::Pause { target: consumer.clone() }),
            step(Trigger::AfterMs(rng.random_range(500..8_000)), Action::Resume { target: consumer }),
        ],
        2 => vec![
            step(at, Action::Stop { target: consumer.clone() }),
            step(Trigger::AfterMs(rng.random_range(300..2_000)), Action::Start { target: consumer }),
        ],
        3 if args.recovery_workers > 0 => vec![
            step(at, Action::Kill { target: recovery.clone() }),
            step(Trigger::AfterMs(rng.random_range(300..3_000)), Action::Start { target: recovery }),
        ],
        4 => vec![step(at, Action::WmsFaults { plan: random_plan(rng, "LockStock", 60, 180) })],
        5 => vec![step(at, Action::LogisticsFaults { plan: random_plan(rng, "CreateShipment", 110, 320) })],
        6 => {
            let broker = rng.random_range(1..=3);
            vec![
                step(at, Action::BrokerDown { broker }),
                step(Trigger::AfterMs(rng.random_range(500..3_000)), Action::BrokerUp { broker }),
            ]
        }
        7 => {
            vec![step(at, Action::LeaderChange { partition: rng.random_range(0..16), broker: rng.random_range(1..=3) })]
        }
        _ => {
            let outage = FaultPlan {
                methods: [("LockStock".to_owned(), MethodFaults { unavailable: true, ..MethodFaults::default() })]
                    .into(),
                ..FaultPlan::default()
            };
            vec![
                step(at, Action::WmsFaults { plan: outage }),
                step(
                    Trigger::AfterMs(rng.random_range(500..4_000)),
                    Action::WmsFaults { plan: latency("LockStock", 60, 180, rng.random()) },
                ),
            ]
        }
    }
}

/// Lost answers and failures before apply at random rates, with the user's latencies.
fn random_plan(rng: &mut StdRng, method: &str, p50_ms: u32, p99_ms: u32) -> FaultPlan {
    let mut plan = latency(method, p50_ms, p99_ms, rng.random());
    if let Some(faults) = plan.methods.get_mut(method) {
        faults.drop_response = rng.random_range(0.0..0.3);
        faults.fail_before_apply = rng.random_range(0.0..0.2);
    }
    plan
}

fn latency(method: &str, p50_ms: u32, p99_ms: u32, seed: u64) -> FaultPlan {
    let mut plan = FaultPlan { seed: seed.max(1), ..FaultPlan::default() };
    plan.methods.insert(method.to_owned(), MethodFaults::with_latency(p50_ms, p99_ms));
    plan
}

/// After the campaign: every process running, every broker up, downstreams healthy.
fn repair_everything(seed: u64, args: &ChaosArgs) -> Vec<Scheduled> {
    let mut steps = vec![
        step(Trigger::AfterMs(500), Action::WmsFaults { plan: latency("LockStock", 60, 180, seed) }),
        step(Trigger::AfterMs(0), Action::LogisticsFaults { plan: latency("CreateShipment", 110, 320, seed + 1) }),
    ];
    if args.kafka.is_none() {
        for broker in 1..=3 {
            steps.push(step(Trigger::AfterMs(0), Action::BrokerUp { broker }));
        }
    }
    for index in 1..=args.consumers {
        steps.push(step(Trigger::AfterMs(0), Action::Resume { target: format!("consumer-{index}") }));
        steps.push(step(Trigger::AfterMs(0), Action::Start { target: format!("consumer-{index}") }));
    }
    for index in 1..=args.recovery_workers {
        steps.push(step(Trigger::AfterMs(0), Action::Start { target: format!("recovery-{index}") }));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(kafka: Option<&str>) -> ChaosArgs {
        ChaosArgs {
            seed: None,
            messages: 2_000,
            faults: 300,
            consumers: 4,
            recovery_workers: 2,
            mysql_url: None,
            group_protocol: GroupProtocol::Classic,
            kafka: kafka.map(str::to_owned),
            run_dir: PathBuf::from("run"),
            report_json: None,
        }
    }

    fn acts_on_brokers(steps: &[Scheduled]) -> bool {
        steps.iter().any(|s| {
            matches!(s.action, Action::BrokerDown { .. } | Action::BrokerUp { .. } | Action::LeaderChange { .. })
        })
    }

    fn produced(steps: &[Scheduled]) -> usize {
        steps.iter().map(|s| if let Action::Produce { orders, .. } = s.action { orders } else { 0 }).sum()
    }

    /// A seed replays the campaign it drew before: CI's seed, on the embedded cluster, begins as
    /// it always has (a change of the draws, or of the `rand` crate's, shows here).
    #[test]
    fn a_seed_replays_the_same_campaign() {
        // CI's campaign: 2,000 messages, 100 faults.
        let steps = schedule(20261130, &ChaosArgs { faults: 100, ..args(None) });
        let first: Vec<String> = steps
            .iter()
            .take(10)
            .map(|s| match s.when {
                Trigger::AfterMs(ms) => format!("+{ms} {}", s.action.describe()),
                _ => format!("? {}", s.action.describe()),
            })
            .collect();
        let expected = [
            "+0 produce 90 more orders",
            "+881 wms fault plan changed",
            "+3489 wms fault plan changed",
            "+943 kill -9 recovery-1",
            "+1607 start recovery-1",
            "+512 broker 3 down",
            "+1970 broker 3 up",
            "+904 logistics fault plan changed",
            "+882 kill -9 recovery-2",
            "+2584 start recovery-2",
        ];
        assert_eq!(first, expected);
    }

    #[test]
    fn on_an_external_kafka_the_campaign_leaves_the_brokers_alone() {
        let embedded = schedule(20261130, &args(None));
        assert!(acts_on_brokers(&embedded), "300 faults on the embedded cluster draw some broker faults");
        let external = schedule(20261130, &args(Some("127.0.0.1:19092")));
        assert!(!acts_on_brokers(&external), "no broker fault on an external Kafka");
        let kinds = |steps: &[Scheduled]| {
            steps.iter().filter(|s| matches!(s.action, Action::Kill { .. } | Action::Pause { .. })).count()
        };
        assert!(kinds(&external) > 0);
        // Both campaigns produce every message after the first wave.
        assert_eq!(produced(&embedded), 2_000 - 200);
        assert_eq!(produced(&external), 2_000 - 200);
    }
}
