//! The scenario catalogue: one TOML file per scenario under `crates/lab/scenarios/`, compiled
//! into the lab. Each file's header says the fault, the invariants checked and how; its body
//! is the system's shape, the workload, the fault schedule and what must be seen besides the
//! checker's verdict (so a scenario whose fault never bit cannot pass by doing nothing).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use midflight_mock::FaultPlan;
use serde::Deserialize;

use crate::report::RunReport;
use crate::run::{Action, Plan, Scheduled, Trigger, execute};
use crate::system::SystemSpec;
use crate::workload::Workload;

/// Every scenario, by file name.
pub const CATALOGUE: [(&str, &str); 11] = [
    ("incident", include_str!("../scenarios/incident.toml")),
    ("kill-after-lock-sent", include_str!("../scenarios/kill-after-lock-sent.toml")),
    ("zombie-consumer", include_str!("../scenarios/zombie-consumer.toml")),
    ("recovery-races-consumer", include_str!("../scenarios/recovery-races-consumer.toml")),
    ("logistics-rejection", include_str!("../scenarios/logistics-rejection.toml")),
    ("reversal-refused", include_str!("../scenarios/reversal-refused.toml")),
    ("wms-down", include_str!("../scenarios/wms-down.toml")),
    ("database-loss", include_str!("../scenarios/database-loss.toml")),
    ("broker-faults", include_str!("../scenarios/broker-faults.toml")),
    ("poison", include_str!("../scenarios/poison.toml")),
    ("rebalance-storm", include_str!("../scenarios/rebalance-storm.toml")),
];

#[derive(Debug, Clone, clap::Args)]
pub struct ScenarioArgs {
    /// The scenario to run, or `all`.
    pub name: Option<String>,
    /// List the catalogue with each scenario's header.
    #[arg(long)]
    pub list: bool,
    /// A MySQL server URL for the scenarios that need one (`database-loss`, `zombie-consumer`); the
    /// others run on SQLite files.
    #[arg(long, env = "MIDFLIGHT_LAB_MYSQL_URL")]
    pub mysql_url: Option<String>,
    /// An external Kafka's `bootstrap.servers` instead of the embedded cluster: each run
    /// creates topics and a consumer group of its own there (`lab.<run>.<system>.*`). The
    /// scenarios that take brokers down or move leaders need the embedded cluster.
    #[arg(long)]
    pub kafka: Option<String>,
    #[arg(long, default_value = "run")]
    pub run_dir: PathBuf,
    #[arg(long)]
    pub report_json: Option<PathBuf>,
}

/// One scenario file's body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub messages: usize,
    #[serde(default = "default_consumers")]
    pub consumers: usize,
    #[serde(default = "one")]
    pub recovery_workers: usize,
    #[serde(default)]
    pub lease_ms: Option<i64>,
    #[serde(default)]
    pub rpc_timeout_ms: Option<u64>,
    #[serde(default)]
    pub unserviceable: f64,
    #[serde(default)]
    pub second_events: f64,
    #[serde(default)]
    pub poison: usize,
    #[serde(default)]
    pub needs_mysql: bool,
    #[serde(default = "default_settle_s")]
    pub settle_s: u64,
    #[serde(default)]
    pub wms_faults: FaultPlan,
    #[serde(default)]
    pub logistics_faults: FaultPlan,
    #[serde(default)]
    pub schedule: Vec<Step>,
    #[serde(default)]
    pub expect: Expect,
}

/// One scheduled action as written in a file: one trigger key, then the action.
#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    pub at_ms: Option<u64>,
    pub at_progress: Option<f64>,
    pub after_ms: Option<u64>,
    pub at_held: Option<u64>,
    #[serde(flatten)]
    pub action: Action,
}

/// What must be seen besides the checker's verdict.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// At least this many sagas per status.
    #[serde(default)]
    pub min_status: BTreeMap<String, usize>,
    #[serde(default)]
    pub min_takeovers: usize,
    #[serde(default)]
    pub min_tickets: usize,
}

fn default_consumers() -> usize {
    3
}
fn one() -> usize {
    1
}
fn default_settle_s() -> u64 {
    90
}

impl Scenario {
    pub fn parse(name: &str, text: &str) -> anyhow::Result<Scenario> {
        let scenario: Scenario = toml::from_str(text).with_context(|| format!("scenario {name} does not parse"))?;
        for step in &scenario.schedule {
            let triggers =
                [step.at_ms.is_some(), step.at_progress.is_some(), step.after_ms.is_some(), step.at_held.is_some()];
            if triggers.iter().filter(|t| **t).count() != 1 {
                bail!("scenario {name}: every step needs exactly one of at_ms, at_progress, after_ms, at_held");
            }
            if step.at_held.is_some() && step.action.target().is_none_or(|target| !target.starts_with("consumer-")) {
                bail!(
                    "scenario {name}: at_held counts what a consumer holds; its step must name a consumer-<n> target"
                );
            }
        }
        if scenario.cuts_database() && !scenario.needs_mysql {
            bail!(
                "scenario {name}: database_outage cuts the services' connections to MySQL; it needs needs_mysql = true"
            );
        }
        Ok(scenario)
    }

    /// Whether a step acts on the brokers themselves, which the lab can do only to the
    /// embedded cluster.
    fn acts_on_brokers(&self) -> bool {
        self.schedule.iter().any(|step| {
            matches!(step.action, Action::BrokerDown { .. } | Action::BrokerUp { .. } | Action::LeaderChange { .. })
        })
    }

    /// Whether a step cuts the services' database connections (through the lab's proxy).
    fn cuts_database(&self) -> bool {
        self.schedule.iter().any(|step| matches!(step.action, Action::DatabaseOutage { .. }))
    }

    fn plan(&self, name: &str, args: &ScenarioArgs, run_dir: &std::path::Path) -> Plan {
        let mut spec = SystemSpec::new(name, run_dir);
        spec.consumers = self.consumers;
        spec.recovery_workers = self.recovery_workers;
        // The embedded default (SQLite) unless the scenario says it needs MySQL.
        spec.mysql_url = if self.needs_mysql { args.mysql_url.clone() } else { None };
        spec.wms_faults = self.wms_faults.clone();
        spec.logistics_faults = self.logistics_faults.clone();
        if let Some(lease_ms) = self.lease_ms {
            spec.lease_ms = lease_ms;
        }
        if let Some(rpc_timeout_ms) = self.rpc_timeout_ms {
            spec.rpc_timeout_ms = rpc_timeout_ms;
        }
        // Only a scenario that cuts the connection pays for the proxy in between.
        spec.database_proxy = self.cuts_database();
        spec.kafka_bootstrap = args.kafka.clone();
        let mut workload = Workload::orders(seed_of(name), self.messages, &format!("S{}", seed_of(name) % 1000));
        workload.unserviceable = self.unserviceable;
        workload.second_events = self.second_events;
        workload.poison = self.poison;
        let schedule = self
            .schedule
            .iter()
            .map(|step| {
                let when = match (step.at_ms, step.at_progress, step.after_ms, step.at_held) {
                    (Some(ms), ..) => Trigger::AtMs(ms),
                    (_, Some(share), ..) => Trigger::AtProgress(share),
                    (_, _, Some(ms), _) => Trigger::AfterMs(ms),
                    (.., Some(sagas)) => Trigger::AtHeld(sagas),
                    _ => Trigger::AfterMs(0),
                };
                Scheduled { when, action: step.action.clone() }
            })
            .collect();
        Plan { spec, workload, schedule, settle: Duration::from_secs(self.settle_s) }
    }

    /// Problems with the run beyond the checker's: expectations not met.
    fn unmet(&self, report: &RunReport) -> Vec<String> {
        let mut unmet = Vec::new();
        for (status, at_least) in &self.expect.min_status {
            let seen = report.by_status.get(status).copied().unwrap_or(0);
            if seen < *at_least {
                unmet.push(format!("expected at least {at_least} {status}, saw {seen}"));
            }
        }
        if report.takeovers < self.expect.min_takeovers {
            unmet.push(format!("expected at least {} takeovers, saw {}", self.expect.min_takeovers, report.takeovers));
        }
        if report.tickets < self.expect.min_tickets {
            unmet.push(format!("expected at least {} tickets, saw {}", self.expect.min_tickets, report.tickets));
        }
        unmet
    }
}

/// The header comment of a scenario file.
pub fn header(text: &str) -> String {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .join("\n    ")
}

fn seed_of(name: &str) -> u64 {
    name.bytes().fold(17_u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

pub async fn run(args: ScenarioArgs) -> anyhow::Result<bool> {
    if args.list || args.name.is_none() {
        for (name, text) in CATALOGUE {
            println!("{name}\n    {}\n", header(text));
        }
        return Ok(true);
    }
    let wanted = args.name.clone().unwrap_or_default();
    let selected: Vec<(&str, &str)> =
        CATALOGUE.iter().copied().filter(|(name, _)| wanted == "all" || *name == wanted).collect();
    if selected.is_empty() {
        bail!("no scenario named {wanted:?}; `scenario --list` lists them");
    }
    let scenarios = selected
        .iter()
        .map(|(name, text)| Ok((*name, *text, Scenario::parse(name, text)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Refused before any runs, so `all` does not stop halfway at the first one that needs it.
    let need_mysql: Vec<&str> = scenarios.iter().filter(|(_, _, s)| s.needs_mysql).map(|(name, _, _)| *name).collect();
    if !need_mysql.is_empty() && args.mysql_url.as_deref().is_none_or(str::is_empty) {
        bail!(
            "these scenarios run their saga store on MySQL (each header says why) and need --mysql-url \
             (or MIDFLIGHT_LAB_MYSQL_URL): {}; nothing was run",
            need_mysql.join(", ")
        );
    }
    let run_dir = args.run_dir.join(format!("scenarios-{}", crate::timestamp()));
    let mut reports = Vec::new();
    let mut all_passed = true;
    let mut skipped = Vec::new();
    for (name, text, scenario) in scenarios {
        if scenario.acts_on_brokers() && args.kafka.is_some() {
            let why =
                "it takes brokers down or moves partition leaders, which the lab can do only on the embedded Kafka";
            if wanted != "all" {
                bail!("scenario {name} cannot run with --kafka: {why}");
            }
            println!("scenario {name}: SKIPPED ({why})\n");
            skipped.push(name);
            continue;
        }
        println!("scenario {name}\n    {}", header(text));
        let mut report = execute(scenario.plan(name, &args, &run_dir)).await?;
        let unmet = scenario.unmet(&report);
        report.notes.extend(unmet.iter().map(|u| format!("unmet: {u}")));
        report.print();
        let passed = report.passed() && unmet.is_empty();
        println!("scenario {name}: {}\n", if passed { "PASS" } else { "FAIL" });
        all_passed &= passed;
        reports.push(report);
    }
    if !skipped.is_empty() {
        println!("not run on {}: {}", args.kafka.as_deref().unwrap_or_default(), skipped.join(", "));
    }
    if let Some(path) = &args.report_json {
        let text = serde_json::to_string_pretty(&reports)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(all_passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_parses_and_says_what_it_checks() {
        for (name, text) in CATALOGUE {
            let scenario = Scenario::parse(name, text).unwrap_or_else(|e| panic!("{e:#}"));
            let header = header(text);
            for key in ["Fault:", "Checks:", "How:"] {
                assert!(header.contains(key), "{name}: header lacks {key:?}");
            }
            assert!(scenario.messages > 0, "{name}");
        }
    }

    #[tokio::test]
    async fn all_without_a_mysql_url_is_refused_before_any_scenario_runs() {
        let run_dir = std::env::temp_dir().join(format!("midflight-scenario-refused-{}", std::process::id()));
        let args = ScenarioArgs {
            name: Some("all".to_owned()),
            list: false,
            mysql_url: None,
            kafka: None,
            run_dir: run_dir.clone(),
            report_json: None,
        };
        let error = run(args).await.expect_err("refused");
        let message = error.to_string();
        for needed in ["database-loss", "zombie-consumer", "nothing was run"] {
            assert!(message.contains(needed), "{message}");
        }
        assert!(!run_dir.exists(), "a scenario started in {}", run_dir.display());
    }

    #[test]
    fn a_held_trigger_needs_a_consumer_and_no_other_trigger() {
        let step = |trigger: &str, target: &str| {
            format!("messages = 10\n[[schedule]]\n{trigger}\ndo = \"kill\"\ntarget = \"{target}\"\n")
        };
        let parsed = Scenario::parse("t", &step("at_held = 5", "consumer-2")).expect("a consumer's held sagas");
        assert_eq!(parsed.schedule[0].at_held, Some(5));
        let error = Scenario::parse("t", &step("at_held = 5", "mock-wms")).expect_err("a mock holds no sagas");
        assert!(error.to_string().contains("consumer-<n>"), "{error}");
        let error = Scenario::parse("t", &step("at_held = 5\nat_ms = 10", "consumer-1")).expect_err("two triggers");
        assert!(error.to_string().contains("exactly one"), "{error}");
    }

    #[test]
    fn only_a_scenario_that_cuts_the_database_gets_the_proxy_and_it_needs_mysql() {
        let outage = "[[schedule]]\nat_ms = 100\ndo = \"database_outage\"\nms = 500\n";
        let error = Scenario::parse("t", &format!("messages = 10\n{outage}")).expect_err("an outage on SQLite");
        assert!(error.to_string().contains("needs needs_mysql = true"), "{error}");
        let args = ScenarioArgs {
            name: Some("t".into()),
            list: false,
            mysql_url: Some("mysql://root@127.0.0.1:3306/test".into()),
            kafka: None,
            run_dir: PathBuf::from("run"),
            report_json: None,
        };
        let cut = Scenario::parse("t", &format!("messages = 10\nneeds_mysql = true\n{outage}")).expect("cut");
        let plan = cut.plan("t", &args, &args.run_dir);
        assert!(plan.spec.database_proxy && plan.spec.mysql_url.is_some());
        let kept = Scenario::parse("t", "messages = 10\nneeds_mysql = true\n").expect("MySQL, no cut");
        let plan = kept.plan("t", &args, &args.run_dir);
        assert!(!plan.spec.database_proxy && plan.spec.mysql_url.is_some());
        let sqlite =
            Scenario::parse("t", "messages = 10\n").expect("the embedded default").plan("t", &args, &args.run_dir);
        assert!(!sqlite.spec.database_proxy && sqlite.spec.mysql_url.is_none());
    }

    #[test]
    fn the_scenarios_that_act_on_brokers_are_known() {
        let acting: Vec<&str> = CATALOGUE
            .iter()
            .filter(|(name, text)| Scenario::parse(name, text).expect("parses").acts_on_brokers())
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(acting, ["broker-faults"], "these need the embedded Kafka");
    }
}
