//! One phase of one system: start it fresh, warm it up, load it (a backlog kept ahead of the
//! consumers, or a fixed rate, with forced rebalances or without), let it drain, stop it, and
//! measure: completion rate, latencies, write transactions, memory, duplicates.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use midflight_checker::{Expected, Snapshot, check, effects_by_order};
use midflight_mock::{FaultPlan, MethodFaults};
use midflight_model::Status;
use midflight_stack::kafka::Record;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use serde::Serialize;

use super::commit_probe::{self, CommitLatency};
use super::cpu::{CpuMeter, CpuPerMsg, Role};
use super::tally::DoneTally;
use super::{BenchArgs, SystemKind};
use crate::process::Signal;
use crate::system::{System, SystemSpec};
use crate::workload::Workload;

/// Each midflight or baseline-B consumer's pool on MariaDB (`System::database`).
pub const MYSQL_POOL: u32 = 16;
/// Each consumer's pool on SQLite (`System::database`).
pub const SQLITE_POOL: u32 = 4;
/// Messages that warm a fresh system up (group joined, connections open) before measuring.
const WARMUP_MESSAGES: usize = 200;
/// How long the warm-up may take: joins of 16 legacy consumers take a while.
const WARMUP_DEADLINE: Duration = Duration::from_secs(120);
/// How often progress, sagas in flight and memory are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often the paced producer sends.
const PACE_TICK: Duration = Duration::from_millis(10);
/// The peak producer keeps this many seconds of consumption ahead of the consumers, on top of
/// what they can hold in flight, so they never run dry between two samples.
const LEAD_S: f64 = 3.0;
/// Largest batch the peak producer sends at once.
const PRODUCE_CHUNK_MAX: usize = 5_000;
/// After loading stops, how long the system may take to finish what it was given.
const DRAIN_DEADLINE: Duration = Duration::from_secs(180);
/// How long reading the snapshot and the ledgers may take per page.
const COLLECT_TIMEOUT: Duration = Duration::from_secs(60);
/// The user's latencies (MISSION.md): LockStock p50/p99, CreateShipment p50/p99, in ms.
const WMS_LATENCY_MS: (u32, u32) = (60, 180);
const LOGISTICS_LATENCY_MS: (u32, u32) = (110, 320);

/// How a phase loads the system.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// A backlog kept ahead of the consumers: the most they sustain.
    Peak,
    /// A fixed rate; with a consumer joining or leaving every `rebalance_every_s`.
    Paced { rate: f64, rebalance_every_s: Option<u64> },
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Peak => "peak",
            Load::Paced { rebalance_every_s: None, .. } => "paced",
            Load::Paced { rebalance_every_s: Some(_), .. } => "rebalance",
        }
    }
}

/// One point of a phase's series (about a second apart), for the chart.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since loading started.
    pub t_s: f64,
    pub done: u64,
    pub done_per_s: f64,
    /// End-to-end latency of the messages finished since the sample before (paced phases);
    /// none at a sample that came less than half a second after the one before, whose
    /// messages count in the next (`Latencies::series`).
    pub p50_ms: Option<i64>,
    pub p99_ms: Option<i64>,
    /// Sagas in flight, summed over processes (midflight: from the table).
    pub in_flight: u64,
    /// The database's slowest probe commit finished since the sample before (as the latencies).
    pub db_commit_max_ms: Option<f64>,
}

/// What one phase measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseResult {
    pub system: String,
    pub phase: String,
    pub consumers: usize,
    /// The paced rate asked for (msg/s).
    pub offered_per_s: Option<f64>,
    /// Messages produced after the warm-up, and how many of them finished.
    pub messages: usize,
    pub finished: usize,
    /// Completion rate after the warm-up, while loading.
    pub msgs_per_s: f64,
    pub p50_ms: Option<i64>,
    pub p99_ms: Option<i64>,
    pub added_p50_ms: Option<i64>,
    pub added_p99_ms: Option<i64>,
    /// Produce call to the consumer having the message (midflight: its inbox insert; the
    /// baselines: taken from Kafka): the part of the added latency spent before the consumer
    /// could act (the producer's linger, the broker, the fetch wait).
    pub arrival_p50_ms: Option<i64>,
    pub arrival_p99_ms: Option<i64>,
    /// Per message, the added latency minus its arrival: what the consumer itself added, from
    /// having the message to finishing it, beyond its calls.
    pub after_arrival_p50_ms: Option<i64>,
    pub after_arrival_p99_ms: Option<i64>,
    /// Mean time in downstream calls per message.
    pub call_mean_ms: Option<f64>,
    /// Counted by the consumers' stores (or the baseline's own counter), per finished message.
    pub write_txns_per_msg: Option<f64>,
    /// Saga transitions written per finished message (midflight).
    pub transitions_per_msg: Option<f64>,
    /// MariaDB's global counters over the measured part, per finished message.
    pub mysql: Option<MysqlDeltas>,
    /// CPU time per finished message over the measured part, by role.
    pub cpu: Option<CpuPerMsg>,
    /// Highest VmHWM of any consumer process, MiB.
    pub rss_mib: f64,
    /// Most sagas one consumer held in flight at a sample (midflight, from the table; `None`
    /// for a baseline, whose consumers keep no such count the lab could read).
    pub in_flight_per_consumer_max: Option<u64>,
    /// Baselines: how many times a message already finished was finished again (its latency
    /// counts its first completion). `None` for midflight, whose inbox skips redeliveries.
    pub processed_again: Option<usize>,
    pub duplicates: usize,
    pub violations: usize,
    pub lost: usize,
    pub rebalances: usize,
    /// The longest a partition went from its revocation by one consumer to its assignment to
    /// the next, while loading and draining (from the consumers' logs; `None`: no handover).
    pub handover_max_ms: Option<i64>,
    pub drained: bool,
    pub load_avg_start: f64,
    pub load_avg_end: f64,
    /// The database's own commit latency over the measured part (`commit_probe`).
    pub db_commit: CommitLatency,
    pub series: Vec<Sample>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MysqlDeltas {
    pub com_commit_per_msg: f64,
    pub write_statements_per_msg: f64,
    /// InnoDB log writes (each followed by a flush at flush=1; MariaDB groups commits itself).
    pub log_writes_per_msg: f64,
}

/// The global status counters read before and after.
#[derive(Debug, Clone, Copy, Default)]
struct MysqlCounters {
    commits: u64,
    writes: u64,
    log_writes: u64,
}

pub async fn run(args: &BenchArgs, run_dir: &Path, kind: SystemKind, load: Load) -> anyhow::Result<PhaseResult> {
    let name = format!("{}-{}", kind.name(), load.name());
    let spec = spec(args, run_dir, kind, &name);
    let consumers = spec.consumers;
    println!("{name}: starting");
    let mut system = System::start(spec).await?;
    let result = measure(args, kind, load, consumers, &name, &mut system).await;
    // Whether the phase was measured or failed part way: the children stopped, and the database
    // dropped (a phase leaves tens of thousands of rows; what was measured is in the report).
    system.shutdown();
    system.store.clone().close().await.ok();
    if let Err(error) = system.drop_server_database().await {
        println!("{name}: {error:#}");
    }
    result
}

/// The phase on a started system: warm-up, load, drain, and what was measured.
async fn measure(
    args: &BenchArgs,
    kind: SystemKind,
    load: Load,
    consumers: usize,
    name: &str,
    system: &mut System,
) -> anyhow::Result<PhaseResult> {
    let progress = Progress::connect(system, kind).await?;
    let prefix = format!("B{}", crate::timestamp() % 100_000);
    let mut expected = Expected::default();
    let warm = produce(system, &format!("{prefix}W"), 0, WARMUP_MESSAGES, &mut expected).await?;
    wait_until(&progress, warm.len() as u64, WARMUP_DEADLINE).await.context("the warm-up did not finish")?;
    let load_avg_start = load_average();
    // The database's own commit latency beside the system's, on the same server (or disk).
    let probe = commit_probe::prepare(system.spec.mysql_url.as_deref(), &system.dir).await?;
    let mysql_before = match progress.mysql_counters().await {
        Ok(counters) => counters,
        Err(error) => {
            probe.discard().await;
            return Err(error);
        }
    };
    let mut cpu = CpuMeter::new(system.spec.mysql_url.as_deref(), system.spec.kafka_bootstrap.as_deref());
    cpu.read(children(system));
    let mut run = Running { system, progress: &progress, kind, produced_at: HashMap::new(), samples: Vec::new(), cpu };
    let started = Instant::now();
    let probe = probe.start(started);
    let loading_from_ms = crate::timings::now_ms();
    let loaded = async {
        let (messages, rebalances) = match load {
            Load::Peak => (run.peak(args, &prefix, &mut expected, consumers).await?, 0),
            Load::Paced { rate, rebalance_every_s } => {
                run.paced(args, &prefix, &mut expected, rate, rebalance_every_s, consumers).await?
            }
        };
        let loaded_s = started.elapsed().as_secs_f64();
        let drained = run.drain((warm.len() + messages) as u64, started).await?;
        anyhow::Ok((messages, rebalances, loaded_s, drained))
    }
    .await;
    // Stopped and its database dropped whatever happened, that after the server's counters
    // are read, so that the drop stays out of them.
    let (db_commit, probe_database) = probe.stop().await;
    if let Some(error) = &db_commit.error {
        println!("{name}: {error}");
    }
    let mysql_after = progress.mysql_counters().await;
    probe_database.remove().await;
    let (messages, rebalances, loaded_s, drained) = loaded?;
    let mysql_after = mysql_after?;
    run.cpu.read(children(run.system));
    let load_avg_end = load_average();
    let Running { produced_at, samples, cpu, .. } = run;
    let rss_mib = rss_hwm_mib(system);
    let stopping_at_ms = crate::timings::now_ms();
    stop_consumers(system);
    let logs = consumer_logs(&system.dir.join("logs"))?;
    let handover_max_ms = crate::membership::longest_handover_ms(&logs, loading_from_ms, stopping_at_ms);
    let stopped = stopped_counters(&logs);
    println!("{name}: collecting");
    let outcome = collect(system, kind, &expected).await?;

    let msgs_per_s = rate_after(&samples, args.warmup_seconds as f64, loaded_s);
    let mut latencies = Latencies::default();
    for timing in &outcome.timings {
        if let Some(produced) = produced_at.get(&timing.biz_id) {
            latencies.push(timing, *produced, started_ms(started));
        }
    }
    let finished = latencies.e2e.len();
    // The consumers count from their start, so their totals are divided by every message they
    // finished, warm-up included (a few hundred against tens of thousands).
    let all = finished + warm.len();
    let per_msg = |count: u64| (finished > 0).then(|| count as f64 / all as f64);
    let series = latencies.series(&samples, &db_commit);
    let (e2e, added) = (latencies.sorted_e2e(), latencies.sorted_added());
    let (arrival, after_arrival) = (sorted(latencies.arrival.clone()), sorted(latencies.after_arrival.clone()));
    let result = PhaseResult {
        system: kind.name().to_owned(),
        phase: load.name().to_owned(),
        consumers,
        offered_per_s: match load {
            Load::Peak => None,
            Load::Paced { rate, .. } => Some(rate),
        },
        messages,
        finished,
        msgs_per_s,
        p50_ms: percentile(&e2e, 0.50),
        p99_ms: percentile(&e2e, 0.99),
        added_p50_ms: percentile(&added, 0.50),
        added_p99_ms: percentile(&added, 0.99),
        arrival_p50_ms: percentile(&arrival, 0.50),
        arrival_p99_ms: percentile(&arrival, 0.99),
        after_arrival_p50_ms: percentile(&after_arrival, 0.50),
        after_arrival_p99_ms: percentile(&after_arrival, 0.99),
        call_mean_ms: (finished > 0).then(|| latencies.call_ms_sum as f64 / finished as f64),
        write_txns_per_msg: stopped.write_txns.and_then(per_msg),
        transitions_per_msg: stopped.transitions.and_then(per_msg),
        mysql: mysql_before.zip(mysql_after).and_then(|(b, a)| {
            let finished = finished.max(1) as f64;
            Some(MysqlDeltas {
                com_commit_per_msg: a.commits.checked_sub(b.commits)? as f64 / finished,
                // The probe's updates are the lab's, not the system's.
                write_statements_per_msg: a.writes.checked_sub(b.writes)?.saturating_sub(db_commit.commits as u64)
                    as f64
                    / finished,
                log_writes_per_msg: a.log_writes.checked_sub(b.log_writes)? as f64 / finished,
            })
        }),
        cpu: cpu.per_msg(finished),
        rss_mib,
        in_flight_per_consumer_max: kind.is_midflight().then(|| samples_in_flight_max(&progress)),
        processed_again: outcome.processed_again,
        duplicates: outcome.duplicates,
        violations: outcome.violations,
        lost: outcome.lost,
        rebalances,
        handover_max_ms,
        drained,
        load_avg_start,
        load_avg_end,
        db_commit,
        series,
    };
    println!(
        "{name}: {:.0} msg/s, p50 {:?} ms, p99 {:?} ms, added p99 {:?} ms (arrival p99 {:?} ms, after arrival p99 {:?} ms), write txns/msg {:?}, rss {:.0} MiB, duplicates {}, violations {}",
        result.msgs_per_s,
        result.p50_ms,
        result.p99_ms,
        result.added_p99_ms,
        result.arrival_p99_ms,
        result.after_arrival_p99_ms,
        result.write_txns_per_msg.map(|v| (v * 100.0).round() / 100.0),
        result.rss_mib,
        result.duplicates,
        result.violations
    );
    Ok(result)
}

fn started_ms(started: Instant) -> i64 {
    crate::timings::now_ms() - i64::try_from(started.elapsed().as_millis()).unwrap_or(0)
}

fn spec(args: &BenchArgs, run_dir: &Path, kind: SystemKind, name: &str) -> SystemSpec {
    let mut spec = SystemSpec::new(name, run_dir);
    spec.partitions = args.partitions;
    spec.mysql_url = kind.uses_mysql().then(|| args.mysql_url.clone()).flatten();
    spec.legacy = kind == SystemKind::BaselineA;
    spec.nostate = kind == SystemKind::BaselineB;
    spec.timings = !kind.is_midflight();
    spec.consumers = if kind == SystemKind::BaselineA { args.baseline_a_consumers } else { args.consumers };
    spec.recovery_workers = if kind.is_midflight() { usize::try_from(args.recovery_workers).unwrap_or(1) } else { 0 };
    // The production defaults (DriverSettings), not the scenario catalogue's short lease.
    spec.lease_ms = 30_000;
    spec.rpc_timeout_ms = 2_000;
    spec.recovery_scan_interval_ms = 1_000;
    spec.log_filter = "warn,midflight_consumer=info,midflight_lab=info".to_owned();
    spec.log_format = "json".to_owned();
    spec.worker_threads = args.worker_threads;
    spec.group_protocol = args.group_protocol;
    spec.kafka_bootstrap = args.kafka.clone();
    if kind.is_midflight() {
        spec.consumer_set = args.consumer_set.clone();
        spec.recovery_set = args.recovery_set.clone();
    }
    if !args.no_latency {
        spec.wms_faults = latency_plan("LockStock", WMS_LATENCY_MS);
        spec.logistics_faults = latency_plan("CreateShipment", LOGISTICS_LATENCY_MS);
    }
    spec
}

fn latency_plan(method: &str, (p50_ms, p99_ms): (u32, u32)) -> FaultPlan {
    let mut plan = FaultPlan::default();
    plan.methods.insert(method.to_owned(), MethodFaults::with_latency(p50_ms, p99_ms));
    plan
}

/// Produces `count` orders numbered from `first`; returns their biz_ids and notes them as expected.
async fn produce(
    system: &System,
    prefix: &str,
    first: usize,
    count: usize,
    expected: &mut Expected,
) -> anyhow::Result<Vec<String>> {
    let workload = Workload::orders(first as u64 + 1, count, &format!("{prefix}-{first}"));
    let records: Vec<Record> = workload.records();
    system.kafka.produce(&system.names.order_topic, &records).await.context("cannot produce")?;
    let ids: Vec<String> = records.iter().filter_map(|r| r.key.as_ref().map(|order| format!("{order}:PAID"))).collect();
    expected.orders.extend(ids.iter().cloned());
    Ok(ids)
}

/// What a phase is doing while it loads the system.
struct Running<'a> {
    system: &'a mut System,
    progress: &'a Progress,
    kind: SystemKind,
    /// biz_id -> when the producer sent it (ms since the Unix epoch).
    produced_at: HashMap<String, i64>,
    samples: Vec<Sample>,
    cpu: CpuMeter,
}

impl Running<'_> {
    async fn peak(
        &mut self,
        args: &BenchArgs,
        prefix: &str,
        expected: &mut Expected,
        consumers: usize,
    ) -> anyhow::Result<usize> {
        let started = Instant::now();
        let capacity = if self.kind == SystemKind::BaselineA {
            consumers
        } else {
            consumers * midflight_consumer::ConsumerSection::default().in_flight_max
        };
        let (mut produced, mut done) = (0_usize, 0_u64);
        let mut next_sample = Instant::now();
        while started.elapsed() < Duration::from_secs(args.seconds) {
            if Instant::now() >= next_sample {
                done = self.sample(started).await?;
                next_sample += SAMPLE_EVERY;
            }
            let rate = recent_rate(&self.samples).max(100.0);
            let lead = capacity + (rate * LEAD_S) as usize;
            let backlog = (WARMUP_MESSAGES + produced).saturating_sub(usize::try_from(done).unwrap_or(0));
            if backlog < lead {
                let count = (lead - backlog).min(PRODUCE_CHUNK_MAX);
                let at = crate::timings::now_ms();
                let ids = produce(self.system, prefix, produced, count, expected).await?;
                self.produced_at.extend(ids.into_iter().map(|id| (id, at)));
                produced += count;
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.check_children()?;
        }
        Ok(produced)
    }

    async fn paced(
        &mut self,
        args: &BenchArgs,
        prefix: &str,
        expected: &mut Expected,
        rate: f64,
        rebalance_every_s: Option<u64>,
        consumers: usize,
    ) -> anyhow::Result<(usize, usize)> {
        let started = Instant::now();
        let mut produced = 0_usize;
        let mut next_sample = Instant::now();
        let every = rebalance_every_s.map(Duration::from_secs);
        let mut next_toggle = every.map(|every| started + every);
        let mut rebalances = 0;
        let extra = consumers + 1;
        let mut ticks = tokio::time::interval(PACE_TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while started.elapsed() < Duration::from_secs(args.seconds) {
            ticks.tick().await;
            let due = (started.elapsed().as_secs_f64() * rate) as usize;
            if due > produced {
                let at = crate::timings::now_ms();
                let ids = produce(self.system, prefix, produced, due - produced, expected).await?;
                self.produced_at.extend(ids.into_iter().map(|id| (id, at)));
                produced = due;
            }
            if Instant::now() >= next_sample {
                self.sample(started).await?;
                next_sample += SAMPLE_EVERY;
            }
            if let (Some(at), Some(every)) = (next_toggle, every)
                && Instant::now() >= at
            {
                self.toggle(extra, started)?;
                rebalances += 1;
                next_toggle = Some(at + every);
            }
            self.check_children()?;
        }
        Ok((produced, rebalances))
    }

    /// A consumer joins the group (or, if it is running, leaves it gracefully): one rebalance.
    fn toggle(&mut self, index: usize, started: Instant) -> anyhow::Result<()> {
        let name = format!("consumer-{index}");
        let joining = !self.system.processes.is_running(&name);
        println!(
            "{}: t={:.0}s {name} {}",
            self.kind.name(),
            started.elapsed().as_secs_f64(),
            if joining { "joins" } else { "leaves" }
        );
        if joining {
            self.system.start_consumer(index)?;
        } else {
            self.cpu.read(children(self.system));
            self.system.signal(&name, Signal::Term)?;
        }
        self.cpu.read(children(self.system));
        Ok(())
    }

    /// Until every message produced is finished, or the deadline.
    async fn drain(&mut self, target: u64, started: Instant) -> anyhow::Result<bool> {
        let deadline = Instant::now() + DRAIN_DEADLINE;
        let (mut last_done, mut told) = (None, false);
        loop {
            // Loading sampled moments ago: a point now would hold a rate over a few ms.
            let just_sampled =
                self.samples.last().is_some_and(|last| too_soon_after(last.t_s, started.elapsed().as_secs_f64()));
            let done = if just_sampled { self.progress.done().await? } else { self.sample(started).await? };
            let late = Instant::now() > deadline;
            let stalled = last_done.replace(done) == Some(done);
            if done >= target || late || stalled {
                // The samples' count is bounded (`tally`); the verdict is a full one, also
                // taken when the count stands still, in case the bounded one missed a row.
                let full = self.progress.done_in_full().await?;
                if full != done && !told {
                    told = true;
                    println!(
                        "{}: the samples' bounded count read {done} finished, a full count {full}; the series is off by the difference",
                        self.kind.name()
                    );
                }
                if full >= target {
                    return Ok(true);
                }
                if late {
                    println!("{}: {full}/{target} finished when the drain deadline passed", self.kind.name());
                    return Ok(false);
                }
            }
            self.check_children()?;
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    async fn sample(&mut self, started: Instant) -> anyhow::Result<u64> {
        let t_s = started.elapsed().as_secs_f64();
        let done = self.progress.done().await?;
        let in_flight = self.progress.in_flight().await?;
        let done_per_s = self.samples.last().map_or(0.0, |last| {
            let dt = t_s - last.t_s;
            if dt > 0.0 { done.saturating_sub(last.done) as f64 / dt } else { 0.0 }
        });
        self.samples.push(Sample {
            t_s,
            done,
            done_per_s,
            p50_ms: None,
            p99_ms: None,
            in_flight,
            db_commit_max_ms: None,
        });
        self.cpu.read(children(self.system));
        Ok(done)
    }

    /// A child that died on its own ends the phase with an error (the toggled consumer may
    /// come and go).
    fn check_children(&mut self) -> anyhow::Result<()> {
        for (name, code) in self.system.processes.exited() {
            if code != Some(0) {
                bail!("{name} exited on its own (status {code:?}); see {}", self.system.dir.join("logs").display());
            }
        }
        Ok(())
    }
}

/// Completion rate of the last few samples (msg/s).
fn recent_rate(samples: &[Sample]) -> f64 {
    let recent = &samples[samples.len().saturating_sub(3)..];
    match (recent.first(), recent.last()) {
        (Some(a), Some(b)) if b.t_s > a.t_s => b.done.saturating_sub(a.done) as f64 / (b.t_s - a.t_s),
        _ => 0.0,
    }
}

/// Completion rate between `from_s` and `to_s` after loading started.
fn rate_after(samples: &[Sample], from_s: f64, to_s: f64) -> f64 {
    let first = samples.iter().find(|s| s.t_s >= from_s);
    let last = samples.iter().rev().find(|s| s.t_s <= to_s);
    match (first, last) {
        (Some(a), Some(b)) if b.t_s > a.t_s => b.done.saturating_sub(a.done) as f64 / (b.t_s - a.t_s),
        _ => 0.0,
    }
}

async fn wait_until(progress: &Progress, target: u64, deadline: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + deadline;
    loop {
        if progress.done_in_full().await? >= target {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("fewer than {target} messages finished after {} s", deadline.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How a phase reads progress from a running system, per design.
struct Progress {
    kind: SystemKind,
    store: midflight_store::Store,
    /// The lab's own connection for the baselines' tables and the server's counters.
    db: DatabaseConnection,
    mysql: bool,
    in_flight_per_owner_max: std::sync::atomic::AtomicU64,
    /// midflight's DONE count between samples.
    tally: std::sync::Mutex<DoneTally>,
}

impl Progress {
    async fn connect(system: &System, kind: SystemKind) -> anyhow::Result<Progress> {
        let mut options = sea_orm::ConnectOptions::new(system.database_url.clone());
        options.max_connections(2).sqlx_logging(false);
        let db = Database::connect(options).await.context("cannot connect to the bench database")?;
        if kind == SystemKind::BaselineA {
            // The legacy consumers may still be starting when the warm-up is first counted.
            db.execute_unprepared(crate::legacy::TABLE).await.context("cannot create the legacy table")?;
        }
        Ok(Progress {
            kind,
            store: system.store.clone(),
            db,
            mysql: system.database_url.starts_with("mysql"),
            in_flight_per_owner_max: std::sync::atomic::AtomicU64::new(0),
            tally: std::sync::Mutex::new(DoneTally::default()),
        })
    }

    /// Messages finished: DONE sagas, DONE legacy rows, SHIPPED business rows of baseline B.
    /// midflight's are counted from where the last count left them (`tally`); the baselines'
    /// tables have no index that would let them be, and are counted in full.
    async fn done(&self) -> anyhow::Result<u64> {
        if self.kind.is_midflight() {
            let (from_ms, below_ms) = self.lock_tally().range();
            let read = self.store.count_status_from(Status::Done, from_ms, below_ms).await?;
            return Ok(self.lock_tally().add(read));
        }
        self.done_in_full().await
    }

    /// [`Self::done`] from a count of every finished row.
    async fn done_in_full(&self) -> anyhow::Result<u64> {
        let sql = match self.kind {
            SystemKind::BaselineA => "SELECT COUNT(*) AS n FROM legacy_orders WHERE status = 'DONE'",
            SystemKind::BaselineB => "SELECT COUNT(*) AS n FROM orders WHERE status = 'SHIPPED'",
            _ => return Ok(self.store.count_status(Status::Done).await?),
        };
        self.count(sql).await
    }

    fn lock_tally(&self) -> std::sync::MutexGuard<'_, DoneTally> {
        self.tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Messages started and not finished (midflight: non-terminal sagas, per owner too).
    async fn in_flight(&self) -> anyhow::Result<u64> {
        let sql = match self.kind {
            SystemKind::BaselineA => "SELECT COUNT(*) AS n FROM legacy_orders WHERE status <> 'DONE'",
            SystemKind::BaselineB => "SELECT COUNT(*) AS n FROM orders WHERE status <> 'SHIPPED'",
            _ => {
                let owners = self.store.in_flight_by_owner().await?;
                let per_owner = owners.iter().map(|(_, n)| *n).max().unwrap_or(0);
                self.in_flight_per_owner_max.fetch_max(per_owner, std::sync::atomic::Ordering::Relaxed);
                return Ok(owners.iter().map(|(_, n)| n).sum());
            }
        };
        self.count(sql).await
    }

    async fn count(&self, sql: &str) -> anyhow::Result<u64> {
        let backend = self.db.get_database_backend();
        let row = self.db.query_one_raw(Statement::from_string(backend, sql)).await?;
        let count: i64 = row.map(|r| r.try_get("", "n")).transpose()?.unwrap_or(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// MariaDB's global counters (every client of the server: other users add noise).
    async fn mysql_counters(&self) -> anyhow::Result<Option<MysqlCounters>> {
        if !self.mysql {
            return Ok(None);
        }
        let sql =
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Com_insert', 'Com_update', 'Innodb_log_writes')";
        let rows = self.db.query_all_raw(Statement::from_string(self.db.get_database_backend(), sql)).await?;
        let mut counters = MysqlCounters::default();
        for row in rows {
            let name: String = row.try_get_by_index(0)?;
            let value: String = row.try_get_by_index(1)?;
            let value: u64 = value.parse().unwrap_or(0);
            match name.as_str() {
                "Com_commit" => counters.commits = value,
                "Innodb_log_writes" => counters.log_writes = value,
                _ => counters.writes += value,
            }
        }
        Ok(Some(counters))
    }
}

fn samples_in_flight_max(progress: &Progress) -> u64 {
    progress.in_flight_per_owner_max.load(std::sync::atomic::Ordering::Relaxed)
}

/// The lab's children that still run, with their roles and pids, for the CPU readings.
fn children(system: &mut System) -> Vec<(Role, u32)> {
    let mut out = Vec::new();
    for name in system.processes.names() {
        let Some(role) = Role::of_child(&name) else { continue };
        if system.processes.is_running(&name)
            && let Some(pid) = system.processes.pid(&name)
        {
            out.push((role, pid));
        }
    }
    out
}

/// The highest VmHWM (peak resident set) of the running consumer processes, in MiB.
fn rss_hwm_mib(system: &mut System) -> f64 {
    let mut max_kib = 0_u64;
    for (_, pid) in children(system).into_iter().filter(|(role, _)| *role == Role::Consumers) {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        for line in status.lines().filter(|l| l.starts_with("VmHWM:")) {
            let kib = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            max_kib = max_kib.max(kib);
        }
    }
    max_kib as f64 / 1024.0
}

/// SIGTERM every consumer (they log their counters on the way out), oldest first.
fn stop_consumers(system: &mut System) {
    for name in system.processes.names().into_iter().filter(|n| n.starts_with("consumer-")) {
        if system.processes.is_running(&name)
            && let Err(error) = system.processes.stop(&name)
        {
            println!("note: stopping {name}: {error}");
        }
    }
}

/// What the consumers' last log lines said they wrote (summed over every incarnation).
#[derive(Debug, Default)]
struct Stopped {
    write_txns: Option<u64>,
    transitions: Option<u64>,
}

/// The text of every consumer's log file in `dir` (every incarnation of every consumer).
fn consumer_logs(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut texts = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("consumer-")) {
            continue;
        }
        texts.push(std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?);
    }
    Ok(texts)
}

fn stopped_counters(logs: &[String]) -> Stopped {
    let mut stopped = Stopped::default();
    for text in logs {
        for line in text.lines().filter(|l| l.contains("consumer stopped")) {
            let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            for (key, slot) in [("write_txns", &mut stopped.write_txns), ("transitions", &mut stopped.transitions)] {
                if let Some(value) = find_u64(&json, key) {
                    *slot = Some(slot.unwrap_or(0) + value);
                }
            }
        }
    }
    stopped
}

/// The first number under `key` anywhere in a JSON log line (fields may be nested).
fn find_u64(value: &serde_json::Value, key: &str) -> Option<u64> {
    match value {
        serde_json::Value::Object(map) => {
            map.get(key).and_then(serde_json::Value::as_u64).or_else(|| map.values().find_map(|v| find_u64(v, key)))
        }
        _ => None,
    }
}

/// What the run left behind, checked.
struct Outcome {
    timings: Vec<crate::timings::Timing>,
    /// Baselines: completions of messages already completed once (see `first_completions`).
    processed_again: Option<usize>,
    duplicates: usize,
    violations: usize,
    lost: usize,
}

async fn collect(system: &System, kind: SystemKind, expected: &Expected) -> anyhow::Result<Outcome> {
    let downstreams = system.downstreams()?;
    if kind.is_midflight() {
        let snapshot = Snapshot::collect(&system.store, &downstreams, COLLECT_TIMEOUT).await?;
        let report = check(&snapshot, expected);
        for violation in report.violations.iter().take(5) {
            println!("  violation: {violation}");
        }
        // Per saga: its arrival (the inbox insert's log row), its DONE, its time in calls.
        let mut by_saga: BTreeMap<&str, (Option<i64>, Option<i64>, u64)> = BTreeMap::new();
        for t in &snapshot.transitions {
            let entry = by_saga.entry(t.biz_id.as_str()).or_default();
            if t.from.is_none() {
                entry.0 = Some(t.at_ms);
            }
            if t.to == Status::Done && t.from != Some(Status::Done) {
                entry.1 = Some(t.at_ms);
            }
            entry.2 += t.call_ms.unwrap_or(0);
        }
        let timings = by_saga
            .into_iter()
            .filter_map(|(biz_id, (received_at_ms, done, call_ms))| {
                done.map(|done_at_ms| crate::timings::Timing {
                    biz_id: biz_id.to_owned(),
                    received_at_ms,
                    done_at_ms,
                    call_ms,
                })
            })
            .collect();
        return Ok(Outcome {
            timings,
            processed_again: None,
            duplicates: report.duplicate_effects,
            violations: report.violations.len(),
            lost: report.lost,
        });
    }
    let (wms, logistics) = Snapshot::collect_ledgers(&downstreams, COLLECT_TIMEOUT).await?;
    let duplicates: usize = [&wms, &logistics]
        .into_iter()
        .flat_map(|ledger| effects_by_order(ledger).into_values())
        .map(|count| count.saturating_sub(1))
        .sum();
    let (timings, processed_again) = first_completions(crate::timings::read_dir(&system.dir.join("timings"))?);
    let finished: std::collections::HashSet<&str> = timings.iter().map(|t| t.biz_id.as_str()).collect();
    let lost = expected.orders.iter().filter(|id| !finished.contains(id.as_str())).count();
    Ok(Outcome { timings, processed_again: Some(processed_again), duplicates, violations: duplicates, lost })
}

/// A baseline records a message each time it finishes it: a rebalance hands a partition on
/// from its last committed offset, and its new owner runs again what the old one had finished
/// (the downstreams absorb the repeated calls, since the keys are the same). Each message's
/// latency is that of its first completion; the later ones are counted and returned.
fn first_completions(records: Vec<crate::timings::Timing>) -> (Vec<crate::timings::Timing>, usize) {
    let total = records.len();
    let mut first: BTreeMap<String, crate::timings::Timing> = BTreeMap::new();
    for record in records {
        match first.entry(record.biz_id.clone()) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(record);
            }
            std::collections::btree_map::Entry::Occupied(mut slot) => {
                if record.done_at_ms < slot.get().done_at_ms {
                    slot.insert(record);
                }
            }
        }
    }
    let again = total - first.len();
    (first.into_values().collect(), again)
}

/// End-to-end and added latencies, with when each message finished.
#[derive(Debug, Default)]
struct Latencies {
    /// (seconds after loading started when it finished, end to end ms)
    e2e: Vec<(f64, i64)>,
    added: Vec<i64>,
    /// Produce call to arrival at the consumer, where known...
    arrival: Vec<i64>,
    /// ...and the added latency after it, of the same messages.
    after_arrival: Vec<i64>,
    call_ms_sum: i64,
}

impl Latencies {
    /// One finished message produced at `produced_ms`; `started_ms` is when loading began.
    fn push(&mut self, timing: &crate::timings::Timing, produced_ms: i64, started_ms: i64) {
        let call_ms = i64::try_from(timing.call_ms).unwrap_or(i64::MAX);
        let e2e_ms = timing.done_at_ms - produced_ms;
        self.e2e.push(((timing.done_at_ms - started_ms) as f64 / 1_000.0, e2e_ms));
        self.added.push(e2e_ms - call_ms);
        self.call_ms_sum += call_ms;
        if let Some(received_at_ms) = timing.received_at_ms {
            self.arrival.push(received_at_ms - produced_ms);
            self.after_arrival.push(timing.done_at_ms - received_at_ms - call_ms);
        }
    }

    fn sorted_e2e(&self) -> Vec<i64> {
        let mut values: Vec<i64> = self.e2e.iter().map(|(_, v)| *v).collect();
        values.sort_unstable();
        values
    }

    fn sorted_added(&self) -> Vec<i64> {
        sorted(self.added.clone())
    }

    /// The samples, each with the latency percentiles of the messages finished since the sample
    /// before (in the second before the first) and the database's slowest probe commit finished
    /// then. The drain's first sample can come moments after loading's last, so a second of
    /// wall time is not a sample's key: each message and commit counts in one sample only. A
    /// sample less than half a second after the one before gets no percentiles (a handful of
    /// messages would make a point of their own); what finished by then counts in the next.
    fn series(&self, samples: &[Sample], db_commit: &CommitLatency) -> Vec<Sample> {
        let mut e2e = self.e2e.clone();
        e2e.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut from = samples.first().map_or(0.0, |first| first.t_s - SAMPLE_EVERY.as_secs_f64());
        let (mut messages, mut commits) = (e2e.as_slice(), db_commit.timeline.as_slice());
        // Before the first sample's second: in no sample.
        take_until(&mut messages, from);
        take_until(&mut commits, from);
        samples
            .iter()
            .map(|sample| {
                let mut sample = sample.clone();
                if too_soon_after(from, sample.t_s) {
                    return sample;
                }
                let mut values: Vec<i64> = take_until(&mut messages, sample.t_s).iter().map(|(_, v)| *v).collect();
                values.sort_unstable();
                sample.p50_ms = percentile(&values, 0.50);
                sample.p99_ms = percentile(&values, 0.99);
                sample.db_commit_max_ms =
                    take_until(&mut commits, sample.t_s).iter().map(|(_, us)| *us as f64 / 1_000.0).reduce(f64::max);
                from = sample.t_s;
                sample
            })
            .collect()
    }
}

/// What finished up to `t_s`, split off the front of `items` (in time order).
fn take_until<'a>(items: &mut &'a [(f64, i64)], t_s: f64) -> &'a [(f64, i64)] {
    let (past, rest) = items.split_at(items.iter().position(|(at, _)| *at > t_s).unwrap_or(items.len()));
    *items = rest;
    past
}

/// Whether a sample at `t_s` would come too soon after one at `previous_s` to be a point of
/// its own (less than half of `SAMPLE_EVERY`).
fn too_soon_after(previous_s: f64, t_s: f64) -> bool {
    t_s - previous_s < SAMPLE_EVERY.as_secs_f64() / 2.0
}

fn sorted(mut values: Vec<i64>) -> Vec<i64> {
    values.sort_unstable();
    values
}

/// The `q` quantile of sorted `values` (nearest rank).
pub fn percentile(values: &[i64], q: f64) -> Option<i64> {
    if values.is_empty() {
        return None;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

/// The 1-minute load average, as the report notes it with every number.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timings::Timing;

    fn timing(received_at_ms: Option<i64>, done_at_ms: i64, call_ms: u64) -> Timing {
        Timing { biz_id: "order-1:created".to_owned(), received_at_ms, done_at_ms, call_ms }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(flags: &[&str]) -> Result<BenchArgs, clap::Error> {
        use clap::Parser as _;
        Cli::try_parse_from([&["bench"], flags].concat()).map(|cli| cli.bench)
    }

    #[test]
    fn recovery_workers_and_their_settings_go_to_midflight_only() {
        let args = args(&["--recovery-workers", "2", "--recovery-set", "database.max_connections=6"]).expect("flags");
        let midflight = spec(&args, Path::new("run"), SystemKind::MidflightMariadb, "m");
        assert_eq!(
            (midflight.recovery_workers, midflight.recovery_set.as_slice()),
            (2, &["database.max_connections=6".to_owned()][..])
        );
        let baseline = spec(&args, Path::new("run"), SystemKind::BaselineB, "b");
        assert_eq!(
            (baseline.recovery_workers, baseline.recovery_set.len()),
            (0, 0),
            "a baseline has no recovery worker"
        );
        let default = spec(&self::args(&[]).expect("no flags"), Path::new("run"), SystemKind::MidflightSqlite, "s");
        assert_eq!(default.recovery_workers, 1);
        assert!(self::args(&["--recovery-workers", "0"]).is_err(), "midflight needs a recovery worker");
    }

    #[test]
    fn only_the_window_counts_and_only_consumer_logs_are_read() {
        let line = |at: &str, message: &str, field: &str, partitions: &str| {
            serde_json::json!({"timestamp": at, "level": "INFO", "message": message, field: partitions}).to_string()
        };
        let (revoked, assigned) = ("partitions revoked", "partitions assigned");
        let dir = std::env::temp_dir().join(format!("midflight-phase-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let consumer = [
            line("2026-12-02T10:00:00.000Z", revoked, "revoked", "orders/5"),
            line("2026-12-02T10:00:03.000Z", assigned, "assigned", "orders/5"),
            line("2026-12-02T10:00:10.000Z", revoked, "revoked", "orders/6"),
        ];
        std::fs::write(dir.join("consumer-1.0.log"), consumer.join("\n")).expect("consumer-1 log");
        let other = [line("2026-12-02T10:00:11.000Z", assigned, "assigned", "orders/6")];
        std::fs::write(dir.join("consumer-2.0.log"), other.join("\n")).expect("consumer-2 log");
        // A mock's log is not a consumer's, whatever it says.
        std::fs::write(dir.join("mock-wms.0.log"), line("2026-12-02T10:00:30.000Z", assigned, "assigned", "orders/6"))
            .expect("mock log");
        let logs = consumer_logs(&dir).expect("read logs");
        std::fs::remove_dir_all(&dir).expect("remove scratch directory");
        // 2026-12-02T10:00:00Z is 1,796,205,600 s after the epoch.
        let at = |s_after_ten: i64| (1_796_205_600 + s_after_ten) * 1_000;
        let handover = |from_ms, until_ms| crate::membership::longest_handover_ms(&logs, from_ms, until_ms);
        assert_eq!(handover(at(-3_600), at(3_600)), Some(3_000));
        assert_eq!(handover(at(5), at(3_600)), Some(1_000));
        assert_eq!(handover(at(5), at(10) + 500), None);
    }

    #[test]
    fn a_message_finished_twice_counts_once_at_its_first_completion() {
        let at = |biz_id: &str, done_at_ms| Timing {
            biz_id: biz_id.to_owned(),
            received_at_ms: None,
            done_at_ms,
            call_ms: 0,
        };
        let records = vec![at("a:PAID", 9_000), at("b:PAID", 2_000), at("a:PAID", 1_000), at("a:PAID", 5_000)];
        let (firsts, again) = first_completions(records);
        assert_eq!(again, 2);
        let done: Vec<(&str, i64)> = firsts.iter().map(|t| (t.biz_id.as_str(), t.done_at_ms)).collect();
        assert_eq!(done, [("a:PAID", 1_000), ("b:PAID", 2_000)]);
        assert_eq!(first_completions(Vec::new()).1, 0);
    }

    /// A sample covers the time since the one before: the drain's first sample, moments after
    /// loading's last, repeats no message or commit of the second before it, and what finished
    /// by then counts in the sample after it.
    #[test]
    fn each_message_and_commit_counts_in_one_sample() {
        let sample = |t_s: f64| Sample {
            t_s,
            done: 0,
            done_per_s: 0.0,
            p50_ms: None,
            p99_ms: None,
            in_flight: 0,
            db_commit_max_ms: None,
        };
        // Before the first sample's second (dropped), at a sample's time (counts in it), after
        // the last sample (no sample covers it).
        let e2e = vec![(1.5, 40), (0.2, 10), (2.01, 90), (1.9, 30), (2.03, 70), (-0.5, 500), (2.0, 35), (4.2, 800)];
        let latencies = Latencies { e2e, ..Latencies::default() };
        let timeline = vec![(0.5, 2_000), (1.2, 9_000), (2.02, 4_000), (2.9, 1_000), (3.5, 50_000)];
        let commits = CommitLatency::from_timeline(timeline, None);
        let series = latencies.series(&[sample(1.0), sample(2.0), sample(2.05), sample(3.0), sample(4.0)], &commits);
        let p99: Vec<Option<i64>> = series.iter().map(|s| s.p99_ms).collect();
        assert_eq!(p99, [Some(10), Some(40), None, Some(90), None]);
        assert_eq!(series[1].p50_ms, Some(35), "1.5, 1.9 and 2.0 count at 2.0: {series:?}");
        assert_eq!(series[3].p50_ms, Some(70), "2.01 and 2.03 count at 3.0: {series:?}");
        let slowest: Vec<Option<f64>> = series.iter().map(|s| s.db_commit_max_ms).collect();
        assert_eq!(slowest, [Some(2.0), Some(9.0), None, Some(4.0), Some(50.0)]);
    }

    #[test]
    fn added_latency_splits_at_arrival() {
        let mut latencies = Latencies::default();
        // Produced at 1,000, taken at 1,012, done at 1,230 after 200 ms of calls.
        latencies.push(&timing(Some(1_012), 1_230, 200), 1_000, 0);
        // A message whose arrival is unknown counts in the added latency only.
        latencies.push(&timing(None, 1_250, 200), 1_000, 0);
        assert_eq!(latencies.sorted_e2e(), vec![230, 250]);
        assert_eq!(latencies.sorted_added(), vec![30, 50]);
        assert_eq!(latencies.arrival, vec![12]);
        assert_eq!(latencies.after_arrival, vec![18]);
    }
}
