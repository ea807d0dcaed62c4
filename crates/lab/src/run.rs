//! Running a system through a workload and a fault schedule, waiting for quiescence, and
//! checking the result: the one loop behind the demo, every scenario and the chaos campaign.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use midflight_checker::{Expected, Snapshot, check, effects_by_order};
use midflight_mock::FaultPlan;
use midflight_stack::kafka::EmbeddedKafka;
use serde::Deserialize;

use crate::process::{Signal, Supervisor};
use crate::report::RunReport;
use crate::system::{System, SystemSpec};
use crate::workload::Workload;

/// How often the runner looks at the clock, the table and the schedule.
const TICK: Duration = Duration::from_millis(100);
/// How long any run may take beyond twice its schedule's own length (see [`run_deadline`]): a
/// run that cannot settle is reported as not quiescent instead of hanging the campaign.
const RUN_DEADLINE: Duration = Duration::from_secs(15 * 60);
/// How long reading back a topic may wait for its last messages.
const TOPIC_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// When an action fires. Actions fire in the order they are listed; each waits for its trigger
/// after the one before it has fired.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Milliseconds after the workload was produced.
    AtMs(u64),
    /// Once this share (0..1) of the messages reached a terminal state.
    AtProgress(f64),
    /// Milliseconds after the previous action fired.
    AfterMs(u64),
    /// Once the action's target (a consumer) holds at least this many unfinished sagas under
    /// its lease: a crash that must leave work behind waits until there is some, however long
    /// the consumer took to join its group.
    AtHeld(u64),
}

/// Something the lab does to the running system.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", tag = "do")]
pub enum Action {
    /// SIGKILL a process (a crash mid-flight).
    Kill {
        target: String,
    },
    /// SIGSTOP a process (it keeps its state and wakes as a zombie).
    Pause {
        target: String,
    },
    /// SIGCONT a paused process.
    Resume {
        target: String,
    },
    /// SIGTERM a process and wait for it (graceful stop).
    Stop {
        target: String,
    },
    /// Start a process again (or a new consumer, `consumer-<n>`).
    Start {
        target: String,
    },
    WmsFaults {
        plan: FaultPlan,
    },
    LogisticsFaults {
        plan: FaultPlan,
    },
    BrokerDown {
        broker: i32,
    },
    BrokerUp {
        broker: i32,
    },
    /// Move the leadership of an order-topic partition to another broker.
    LeaderChange {
        partition: i32,
        broker: i32,
    },
    /// Cut every service's database connections for `ms` (needs the database proxy).
    DatabaseOutage {
        ms: u64,
    },
    /// Produce more orders (a new wave, with order numbers of its own).
    Produce {
        orders: usize,
        seed: u64,
    },
}

impl Action {
    /// The process the action is aimed at, if any.
    pub(crate) fn target(&self) -> Option<&str> {
        match self {
            Action::Kill { target }
            | Action::Pause { target }
            | Action::Resume { target }
            | Action::Stop { target }
            | Action::Start { target } => Some(target),
            _ => None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Action::Kill { target } => format!("kill -9 {target}"),
            Action::Pause { target } => format!("SIGSTOP {target}"),
            Action::Resume { target } => format!("SIGCONT {target}"),
            Action::Stop { target } => format!("SIGTERM {target}"),
            Action::Start { target } => format!("start {target}"),
            Action::WmsFaults { .. } => "wms fault plan changed".to_owned(),
            Action::LogisticsFaults { .. } => "logistics fault plan changed".to_owned(),
            Action::BrokerDown { broker } => format!("broker {broker} down"),
            Action::BrokerUp { broker } => format!("broker {broker} up"),
            Action::LeaderChange { partition, broker } => format!("partition {partition} leader -> broker {broker}"),
            Action::DatabaseOutage { ms } => format!("database unreachable for {ms} ms"),
            Action::Produce { orders, .. } => format!("produce {orders} more orders"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    pub when: Trigger,
    pub action: Action,
}

impl Action {
    /// Whether the action is a fault (counted in the report) rather than a repair or more load.
    fn is_fault(&self) -> bool {
        match self {
            Action::Resume { .. } | Action::Start { .. } | Action::BrokerUp { .. } | Action::Produce { .. } => false,
            Action::WmsFaults { plan } | Action::LogisticsFaults { plan } => *plan != FaultPlan::default(),
            _ => true,
        }
    }
}

/// A run: the system, the workload, the schedule and how long to wait.
#[derive(Debug, Clone)]
pub struct Plan {
    pub spec: SystemSpec,
    pub workload: Workload,
    pub schedule: Vec<Scheduled>,
    /// After the last action, how long the system may take to settle.
    pub settle: Duration,
}

/// The deadline of a whole run: the fixed allowance plus twice the time its schedule's delays add
/// up to, so a long chaos campaign is not cut off while it is still injecting faults.
pub fn run_deadline(schedule: &[Scheduled]) -> Duration {
    let mut at_ms = 0;
    let mut after_ms = 0u64;
    for scheduled in schedule {
        match scheduled.when {
            Trigger::AtMs(ms) => at_ms = at_ms.max(ms),
            Trigger::AfterMs(ms) => after_ms = after_ms.saturating_add(ms),
            Trigger::AtProgress(_) | Trigger::AtHeld(_) => {}
        }
    }
    RUN_DEADLINE + Duration::from_millis(at_ms.saturating_add(after_ms).saturating_mul(2))
}

pub async fn execute(plan: Plan) -> anyhow::Result<RunReport> {
    let name = plan.spec.name.clone();
    let deadline = run_deadline(&plan.schedule);
    let legacy = plan.spec.legacy;
    println!("{name}: starting {} process(es)", plan.spec.consumers + plan.spec.recovery_workers + 2);
    let mut system = System::start(plan.spec.clone()).await?;
    let mut expected =
        plan.workload.produce(&system.kafka, &system.names.order_topic).await.context("cannot produce the workload")?;
    println!("{name}: produced {} message(s); running", expected.messages());
    let started = Instant::now();
    let progress = progress_bar(&name, expected.messages());
    let mut pending: std::collections::VecDeque<Scheduled> = plan.schedule.iter().cloned().collect();
    let mut last_fired = Instant::now();
    let mut faults_injected = 0;
    // Each process's incarnation the schedule ended on purpose (killed or stopped); a later
    // incarnation of the same name that dies is a crash.
    let mut intentional: BTreeMap<String, u32> = BTreeMap::new();
    // How long the system must have been left alone before it counts as quiescent: a process
    // thawed or started by the last step gets a lease and a call's time to do what it will
    // (a zombie's stale writes and calls), so the checker sees it.
    let grace = Duration::from_millis(u64::try_from(plan.spec.lease_ms).unwrap_or(0) + plan.spec.rpc_timeout_ms);
    let mut settle_from = Instant::now();
    let mut quiescent = false;
    // When everything last became settled (reset when work appears again): the time to
    // quiescence reported, not the end of the grace that confirmed it.
    let mut settled_at: Option<Duration> = None;
    let mut last_line = Instant::now();
    let mut waves: Vec<tokio::task::JoinHandle<anyhow::Result<Expected>>> = Vec::new();
    let mut unfired = Vec::new();
    loop {
        for finished in take_finished(&mut waves) {
            expected.orders.extend(finished.await.context("produce task")??.orders);
            progress.set_length(expected.messages() as u64);
        }
        let done = settled(&system, &expected, legacy).await?;
        progress.set_position(done as u64);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let share = done as f64 / expected.messages().max(1) as f64;
        while let Some(next) = pending.front() {
            let since_last_ms = last_fired.elapsed().as_millis() as u64;
            let held = match (next.when, next.action.target()) {
                (Trigger::AtHeld(_), Some(target)) => held_by(&system.store.in_flight_by_owner().await?, target),
                _ => 0,
            };
            if !is_due(next.when, elapsed_ms, share, since_last_ms, held) {
                if matches!(next.when, Trigger::AtHeld(_)) && waves.is_empty() && done >= expected.messages() {
                    // Everything settled: nothing is left for the target to hold, so the step
                    // can never fire, nor can any after it.
                    for step in pending.drain(..) {
                        unfired.push(format!("never fired: {} ({:?})", step.action.describe(), step.when));
                    }
                }
                break;
            }
            let Some(scheduled) = pending.pop_front() else { break };
            let line = format!("{name}: t={:.1}s {}", started.elapsed().as_secs_f64(), scheduled.action.describe());
            say(&progress, line);
            if let Action::Produce { orders, seed } = &scheduled.action {
                // Produced on a task of its own: a produce that waits for a downed broker must
                // not hold up the schedule that will bring the broker back.
                let wave = Workload::orders(*seed, *orders, &format!("{}-W{seed}", plan.workload.prefix));
                let kafka = EmbeddedKafka::connect(system.kafka.bootstrap_servers())?;
                let topic = system.names.order_topic.clone();
                waves.push(tokio::spawn(async move { wave.produce(&kafka, &topic).await }));
            } else if apply(&mut system, &scheduled.action, &mut intentional).await? {
                faults_injected += usize::from(scheduled.action.is_fault());
            }
            last_fired = Instant::now();
            settle_from = Instant::now();
        }
        if pending.is_empty() && waves.is_empty() && done >= expected.messages() && drained(&system, legacy).await? {
            // Settled since this moment; quiescent once it held for the grace after the last step.
            settled_at.get_or_insert_with(|| started.elapsed());
            if last_fired.elapsed() >= grace {
                quiescent = true;
                break;
            }
        } else {
            settled_at = None;
        }
        if pending.is_empty() && settle_from.elapsed() > plan.settle {
            break;
        }
        if started.elapsed() > deadline {
            say(&progress, format!("{name}: run deadline of {} s hit", deadline.as_secs()));
            break;
        }
        // A child that died on its own (a crash, or a configuration it refused) ends the run:
        // waiting for work it will never do helps nobody.
        let crashed = crashed(&mut system.processes, &intentional);
        if !crashed.is_empty() {
            for line in &crashed {
                say(&progress, format!("{name}: {line}"));
            }
            break;
        }
        if !std::io::stderr().is_terminal() && last_line.elapsed() > Duration::from_secs(5) {
            println!("{name}: {done}/{} settled after {:.0} s", expected.messages(), started.elapsed().as_secs_f64());
            last_line = Instant::now();
        }
        tokio::time::sleep(TICK).await;
    }
    progress.finish_and_clear();
    let seconds = settled_at.filter(|_| quiescent).unwrap_or_else(|| started.elapsed()).as_secs_f64();
    let mut notes = crashed(&mut system.processes, &intentional);
    notes.append(&mut unfired);
    if !quiescent {
        notes.extend(unheld_partitions(&mut system).await);
    }
    // The services under test stop before the checker reads, so nothing they still do (a
    // thawed zombie, a shutdown's last writes) happens after it looked.
    notes.extend(stop_services(&mut system)?);
    let mut report = if legacy {
        legacy_report(&system, &expected, &name).await?
    } else {
        let mut snapshot = Snapshot::collect(&system.store, &system.downstreams()?, Duration::from_secs(30)).await?;
        snapshot.notifications = Some(keys(&system, &system.names.notification_topic).await?);
        snapshot.dead_letters = Some(dead_letter_ids(&system).await?);
        RunReport::from_check(&name, check(&snapshot, &expected))
    };
    system.shutdown();
    report.faults_injected = faults_injected;
    report.seconds_to_quiescence = seconds;
    report.quiescent = quiescent;
    report.notes.append(&mut notes);
    report.notes.push(format!("logs and databases: {}", system.dir.display()));
    if let Some(database) = &system.server_database {
        report.notes.push(format!("saga database on the MySQL server: {database}"));
    }
    Ok(report)
}

/// For a run that ended unsettled: the order topic's partitions that no running consumer held
/// at the end, by the assignment lines of their logs, each with the messages past the group's
/// commit there. A group that hands partitions to nobody (a rebalance that never completes)
/// leaves those messages in Kafka, where the checker counts them as lost (docs/campaigns.md
/// has such a campaign).
async fn unheld_partitions(system: &mut System) -> Option<String> {
    let consumers: Vec<String> = system.processes.names().into_iter().filter(|n| n.starts_with("consumer-")).collect();
    let mut logs = Vec::new();
    for name in consumers {
        if system.processes.is_running(&name)
            && let Some(path) = system.processes.current_log(&name)
        {
            logs.push(std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    let held = crate::membership::held_at_end(&logs);
    let topic = system.names.order_topic.clone();
    let unheld: Vec<i32> = (0..system.spec.partitions).filter(|p| !held.contains(&format!("{topic}/{p}"))).collect();
    if unheld.is_empty() {
        return None;
    }
    // What waits there, if the broker answers; the partitions alone say enough if it does not.
    let committed = system.kafka.committed(&system.names.group, &topic).await.ok();
    let ends = system.kafka.end_offsets(&topic).await.ok();
    // Per partition: its text, and how many messages at most wait there past the group's commit.
    let describe = |partition: &i32| -> (String, Option<i64>) {
        let name = format!("{topic}/{partition}");
        let end = ends.as_ref().and_then(|ends| ends.get(partition));
        match (committed.as_ref().map(|c| c.get(partition)), end) {
            (Some(Some(commit)), Some(end)) => {
                (format!("{name} ({} past the group's commit)", end - commit), Some(end - commit))
            }
            (Some(None), Some(end)) => (format!("{name} (no commit; end offset {end})"), Some(*end)),
            _ => (name, None),
        }
    };
    let described: Vec<(String, Option<i64>)> = unheld.iter().map(describe).collect();
    let waiting = described.iter().map(|(_, n)| *n).sum::<Option<i64>>();
    Some(format!(
        "at the end {} of the {} partitions had no owner among the {} running consumer(s), by their logs: {}{}",
        unheld.len(),
        system.spec.partitions,
        logs.len(),
        described.into_iter().map(|(text, _)| text).collect::<Vec<_>>().join(", "),
        match waiting {
            Some(0) => "; nothing waits there past the group's commits".to_owned(),
            Some(n) => format!(
                "; at most {n} message(s) wait there in Kafka, unread by the group (one that hands partitions to \
                 nobody shows this way)"
            ),
            None => String::new(),
        }
    ))
}

/// The produce tasks that have finished, removed from `waves`.
fn take_finished<T>(waves: &mut Vec<tokio::task::JoinHandle<T>>) -> Vec<tokio::task::JoinHandle<T>> {
    let (finished, running): (Vec<_>, Vec<_>) = waves.drain(..).partition(|task| task.is_finished());
    *waves = running;
    finished
}

fn is_due(trigger: Trigger, elapsed_ms: u64, share: f64, since_last_ms: u64, held: u64) -> bool {
    match trigger {
        Trigger::AtMs(at) => elapsed_ms >= at,
        Trigger::AtProgress(at) => share >= at,
        Trigger::AfterMs(after) => since_last_ms >= after,
        Trigger::AtHeld(at) => held >= at,
    }
}

/// The unfinished sagas `target` holds, from the per-owner counts: its lease owner ids are its
/// name, a dash and a suffix of its incarnation.
fn held_by(owners: &[(String, u64)], target: &str) -> u64 {
    owners
        .iter()
        .filter(|(owner, _)| owner.strip_prefix(target).is_some_and(|rest| rest.starts_with('-')))
        .map(|(_, count)| count)
        .sum()
}

/// Carries out `action`; false when it was skipped (a signal to a process that is not running).
async fn apply(system: &mut System, action: &Action, intentional: &mut BTreeMap<String, u32>) -> anyhow::Result<bool> {
    let mut end_on_purpose = |system: &mut System, target: &str| {
        if let Some(generation) = system.processes.generation(target) {
            intentional.insert(target.to_owned(), generation);
        }
    };
    match action {
        // Signals to a process that is not running (already killed by an earlier fault) are
        // skipped: a random schedule may well pick the same victim twice.
        Action::Kill { target } if system.processes.is_running(target) => {
            end_on_purpose(system, target);
            system.signal(target, Signal::Kill)?;
        }
        Action::Pause { target } if system.processes.is_running(target) => system.signal(target, Signal::Stop)?,
        Action::Resume { target } if system.processes.is_running(target) => system.signal(target, Signal::Cont)?,
        Action::Stop { target } if system.processes.is_running(target) => {
            end_on_purpose(system, target);
            system.processes.stop(target)?;
        }
        Action::Kill { .. } | Action::Pause { .. } | Action::Resume { .. } | Action::Stop { .. } => return Ok(false),
        Action::Start { target } => {
            if system.processes.is_running(target) {
                return Ok(false);
            }
            start(system, target)?;
        }
        Action::WmsFaults { plan } => system.set_wms_faults(plan).await?,
        Action::LogisticsFaults { plan } => system.set_logistics_faults(plan).await?,
        Action::BrokerDown { broker } => system.kafka.broker_down(*broker)?,
        Action::BrokerUp { broker } => system.kafka.broker_up(*broker)?,
        Action::LeaderChange { partition, broker } => {
            system.kafka.set_leader(&system.names.order_topic, *partition, *broker)?;
        }
        Action::DatabaseOutage { ms } => {
            let proxy = system.proxy.as_ref().context("database_outage needs the database proxy (needs_mysql)")?;
            proxy.outage(Duration::from_millis(*ms));
        }
        Action::Produce { .. } => {}
    }
    Ok(true)
}

fn start(system: &mut System, target: &str) -> anyhow::Result<()> {
    if let Some(index) = target.strip_prefix("consumer-").and_then(|n| n.parse().ok()) {
        return system.start_consumer(index);
    }
    if let Some(index) = target.strip_prefix("recovery-").and_then(|n| n.parse().ok()) {
        return system.start_recovery(index);
    }
    system.processes.restart(target).map(|_| ())
}

/// Messages settled: terminal saga rows (ours) or DONE business rows (legacy).
async fn settled(system: &System, expected: &Expected, legacy: bool) -> anyhow::Result<usize> {
    if legacy {
        let statuses = crate::legacy::statuses(&system.database_url).await?;
        let done = statuses.iter().find(|(s, _)| s == "DONE").map_or(0, |(_, n)| *n);
        return Ok(done + expected.poison.len());
    }
    let summary = system.store.status_summary().await?;
    Ok(summary.iter().filter(|(status, _, _)| status.is_terminal()).map(|(_, n, _)| *n as usize).sum())
}

/// Nothing left in flight: no non-terminal saga and no unpublished notification.
async fn drained(system: &System, legacy: bool) -> anyhow::Result<bool> {
    if legacy {
        return Ok(true);
    }
    let summary = system.store.status_summary().await?;
    let active = summary.iter().any(|(status, n, _)| !status.is_terminal() && *n > 0);
    Ok(!active && system.store.outbox_pending().await? == 0)
}

/// The incarnations in `children` that exited without the schedule killing or stopping them
/// (those in `intentional`).
fn crashed(children: &mut Supervisor, intentional: &BTreeMap<String, u32>) -> Vec<String> {
    children
        .exited_incarnations()
        .into_iter()
        .filter(|(name, generation, _)| intentional.get(name) != Some(generation))
        .map(|(name, _, code)| format!("crash: {name} exited on its own (status {code:?}); see its log"))
        .collect()
}

/// Stops the consumers and recovery workers (not the mocks the checker reads, nor the
/// brokers), all at once, and names each that did not exit cleanly: a service stopped with
/// SIGTERM exits 0 once its shutdown is done.
fn stop_services(system: &mut System) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = system
        .processes
        .names()
        .into_iter()
        .filter(|name| name.starts_with("consumer-") || name.starts_with("recovery-"))
        .collect();
    let stopped = system.processes.stop_together(&names)?;
    Ok(stopped
        .into_iter()
        .filter(|(_, code)| *code != Some(0))
        .map(|(name, code)| format!("crash: {name} did not stop cleanly on SIGTERM (status {code:?}); see its log"))
        .collect())
}

async fn keys(system: &System, topic: &str) -> anyhow::Result<Vec<String>> {
    let records = system.kafka.read_topic(topic, TOPIC_READ_TIMEOUT).await?;
    Ok(records.into_iter().filter_map(|r| r.key).collect())
}

/// The parked biz_ids the dead-letter copies name in their header.
async fn dead_letter_ids(system: &System) -> anyhow::Result<Vec<String>> {
    let records = system.kafka.read_topic(&system.names.dead_letter_topic, TOPIC_READ_TIMEOUT).await?;
    Ok(records.into_iter().filter_map(|r| r.headers.get(midflight_consumer::BIZ_ID_HEADER).cloned()).collect())
}

/// The legacy design has no saga table: report what its business table and the ledgers say.
async fn legacy_report(system: &System, expected: &Expected, name: &str) -> anyhow::Result<RunReport> {
    let statuses = crate::legacy::statuses(&system.database_url).await?;
    let client = system.downstreams()?;
    let wms = midflight_checker::Snapshot::collect_ledgers(&client, Duration::from_secs(30)).await?;
    let mut report = RunReport { name: name.to_owned(), messages: expected.orders.len(), ..RunReport::default() };
    report.by_status = statuses.iter().cloned().collect();
    let done = statuses.iter().find(|(s, _)| s == "DONE").map_or(0, |(_, n)| *n);
    report.lost = expected.orders.len().saturating_sub(done);
    for (what, ledger) in [("wms lock", &wms.0), ("shipment", &wms.1)] {
        for (order_no, count) in effects_by_order(ledger) {
            if count > 1 {
                report.duplicate_effects += count - 1;
                report.violations.push(midflight_checker::Violation {
                    invariant: "I1",
                    biz_id: order_no,
                    message: format!("{count} {what}s in force for one order"),
                    evidence: "legacy design: a fresh key per attempt".to_owned(),
                });
            }
        }
    }
    Ok(report)
}

/// A line above the progress bar, or on its own when there is no terminal to draw one on.
fn say(progress: &ProgressBar, line: String) {
    if progress.is_hidden() { println!("{line}") } else { progress.println(line) }
}

fn progress_bar(name: &str, total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{elapsed_precise}] {bar:40} {pos}/{len} settled") {
        bar.set_style(style);
    }
    bar.set_prefix(name.to_owned());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_grows_with_the_schedule() {
        let kill = |when| Scheduled { when, action: Action::Kill { target: "consumer-1".to_owned() } };
        assert_eq!(run_deadline(&[]), RUN_DEADLINE);
        let schedule = [kill(Trigger::AtMs(10_000)), kill(Trigger::AfterMs(1_000)), kill(Trigger::AtProgress(0.5))];
        assert_eq!(run_deadline(&schedule), RUN_DEADLINE + Duration::from_secs(22));
        // A campaign injecting faults for an hour keeps two hours beyond the fixed allowance.
        let long: Vec<_> = (0..3_600).map(|_| kill(Trigger::AfterMs(1_000))).collect();
        assert_eq!(run_deadline(&long), RUN_DEADLINE + Duration::from_secs(7_200));
        assert_eq!(run_deadline(&[kill(Trigger::AtHeld(20))]), RUN_DEADLINE);
    }

    #[test]
    fn a_held_trigger_counts_only_its_targets_incarnations() {
        let owners: Vec<(String, u64)> =
            [("consumer-1-aa11", 7), ("consumer-10-bb22", 50), ("consumer-1-cc33", 5), ("", 3)]
                .iter()
                .map(|(owner, n)| ((*owner).to_owned(), *n))
                .collect();
        assert_eq!(held_by(&owners, "consumer-1"), 12);
        assert_eq!(held_by(&owners, "consumer-10"), 50);
        assert_eq!(held_by(&owners, "consumer-2"), 0);
        assert!(is_due(Trigger::AtHeld(12), 0, 0.0, 0, 12));
        assert!(!is_due(Trigger::AtHeld(13), 1_000_000, 1.0, 1_000_000, 12), "only what it holds counts");
    }

    #[test]
    fn a_crash_after_a_restart_is_a_crash() {
        use crate::process::testing::{spec, supervisor, wait_exited};
        let mut run = supervisor("crashed");
        let children = &mut run.supervisor;
        children.start("consumer-1", spec("sleep", &["30"])).expect("start");
        // The schedule kills the first incarnation: not a crash.
        let mut intentional = BTreeMap::from([("consumer-1".to_owned(), 0)]);
        children.signal("consumer-1", Signal::Kill).expect("kill");
        assert_eq!(crashed(children, &intentional), Vec::<String>::new());
        // Its restart dies on its own: a crash, though the name was killed on purpose before.
        children.start("consumer-1", spec("false", &[])).expect("restart");
        wait_exited(children, "consumer-1");
        let crashes = crashed(children, &intentional);
        assert_eq!(crashes.len(), 1, "{crashes:?}");
        assert!(crashes[0].starts_with("crash: consumer-1 exited on its own (status Some(1))"), "{crashes:?}");
        intentional.insert("consumer-1".to_owned(), 1);
        assert_eq!(crashed(children, &intentional), Vec::<String>::new());
    }
}
