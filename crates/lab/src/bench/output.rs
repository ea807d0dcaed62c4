//! The benchmark's report: Markdown for people (with the targets of issue 8 checked), CSV for
//! spreadsheets, an SVG chart of throughput and latency over time (hand-written: one polyline
//! per phase), and JSON with the per-system numbers runs are compared by.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::cpu::CpuPerMsg;
use super::phase::Sample;
use super::{BenchReport, PhaseResult, SystemKind, SystemResult};

/// Targets of issue 8, on this machine.
const TARGET_MSGS_PER_S: f64 = 4_000.0;
const TARGET_VS_BASELINE_A: f64 = 100.0;
const TARGET_WRITE_TXNS_PER_MSG: f64 = 3.0;
const TARGET_SHARE_OF_CEILING: f64 = 0.5;
const TARGET_ADDED_P99_MS: i64 = 10;
const TARGET_RSS_MIB: f64 = 256.0;
/// Box busy share from which a peak's CPU per message is projected to the target rate.
const SATURATED_BUSY_PCT: f64 = 90.0;
/// Saga transitions per message without batching (one commit each): the unbatched ceiling's divisor.
const TRANSITIONS_PER_MSG: f64 = 3.0;

/// Where the numbers were taken.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub commit: String,
    /// MariaDB's version, `innodb_flush_log_at_trx_commit`, `log_bin` and `thread_handling`
    /// (when the server has that variable), when a server was given.
    pub mariadb: Option<String>,
    pub date_unix_s: u64,
}

impl Machine {
    pub async fn read(mysql_url: Option<&str>) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or("unknown".to_owned(), |m| m.trim().to_owned());
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<f64>().ok())
            })
            .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map_or("unknown".to_owned(), |o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        let dirty = std::process::Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .output()
            .ok()
            .is_some_and(|o| !o.stdout.is_empty());
        let commit = commit_label(&commit, dirty, env!("MIDFLIGHT_BUILD_COMMIT"));
        let mariadb = match mysql_url {
            Some(url) => mariadb_settings(url).await,
            None => None,
        };
        Machine { cpu, cores, memory_gib, commit, mariadb, date_unix_s: crate::timestamp() }
    }
}

/// The report's commit: the checkout's, marked when it has uncommitted changes or when the
/// binaries were built at another commit (`build.rs`), as when a commit was made after the
/// last build: the numbers are then the binaries', not the checkout's.
fn commit_label(checkout: &str, dirty: bool, built: &str) -> String {
    let mut label = checkout.to_owned();
    if dirty {
        label.push_str(" (with uncommitted changes)");
    }
    if built != checkout {
        label.push_str(&format!(" (but the binaries were built at {built})"));
    }
    label
}

async fn mariadb_settings(url: &str) -> Option<String> {
    use sea_orm::{ConnectionTrait, Statement};
    let db = sea_orm::Database::connect(url).await.ok()?;
    // The server variables are unsigned; cast so they read as i64.
    let sql =
        "SELECT VERSION() AS v, CAST(@@innodb_flush_log_at_trx_commit AS SIGNED) AS f, CAST(@@log_bin AS SIGNED) AS b";
    let row = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await.ok()??;
    let version: String = row.try_get("", "v").ok()?;
    let flush: i64 = row.try_get("", "f").ok()?;
    let binlog: i64 = row.try_get("", "b").ok()?;
    let mut line = format!("{version}, innodb_flush_log_at_trx_commit={flush}, log_bin={binlog}");
    // Asked apart: a server without the variable still reports the rest.
    let threads = "SELECT CAST(@@thread_handling AS CHAR) AS t";
    if let Ok(Some(row)) = db.query_one_raw(Statement::from_string(db.get_database_backend(), threads)).await
        && let Ok(handling) = row.try_get::<String>("", "t")
    {
        line.push_str(&format!(", thread_handling={handling}"));
    }
    db.close().await.ok();
    Some(line)
}

/// The per-system numbers of `--report-json`.
#[derive(Debug, Clone, Default, Serialize)]
struct SystemNumbers {
    msgs_per_s: Option<f64>,
    p50_ms: Option<i64>,
    p99_ms: Option<i64>,
    added_p99_ms: Option<i64>,
    /// The database's own commit p99 over the same phase as the latencies (`commit_probe`).
    db_commit_p99_ms: Option<f64>,
    write_txns_per_msg: Option<f64>,
    rss_mib: Option<f64>,
    duplicates: usize,
    /// The checker's violations and lost messages over the same phases as `duplicates`.
    violations: usize,
    lost: usize,
    /// Whether every one of those phases finished all its messages before its deadline.
    drained: bool,
    /// The longest a partition went without an owner (the rebalance phase only).
    #[serde(skip_serializing_if = "Option::is_none")]
    handover_max_ms: Option<i64>,
    /// CPU milliseconds per message by role, at the peak (or in the rebalance phase, there).
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_ms_per_msg: Option<CpuPerMsg>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rebalance: Option<Box<SystemNumbers>>,
}

fn numbers(result: &SystemResult) -> SystemNumbers {
    let mut out = SystemNumbers {
        msgs_per_s: result.peak.as_ref().map(|p| round(p.msgs_per_s, 1)),
        p50_ms: result.paced.as_ref().and_then(|p| p.p50_ms),
        p99_ms: result.paced.as_ref().and_then(|p| p.p99_ms),
        added_p99_ms: result.paced.as_ref().and_then(|p| p.added_p99_ms),
        db_commit_p99_ms: result.paced.as_ref().and_then(|p| p.db_commit.p99_ms).map(|v| round(v, 2)),
        write_txns_per_msg: result.peak.as_ref().and_then(|p| p.write_txns_per_msg).map(|v| round(v, 3)),
        rss_mib: result.peak.as_ref().map(|p| round(p.rss_mib, 1)),
        duplicates: [&result.peak, &result.paced].into_iter().flatten().map(|p| p.duplicates).sum(),
        violations: [&result.peak, &result.paced].into_iter().flatten().map(|p| p.violations).sum(),
        lost: [&result.peak, &result.paced].into_iter().flatten().map(|p| p.lost).sum(),
        drained: [&result.peak, &result.paced].into_iter().flatten().all(|p| p.drained),
        handover_max_ms: None,
        cpu_ms_per_msg: result.peak.as_ref().and_then(|p| p.cpu).map(rounded),
        rebalance: None,
    };
    if let Some(r) = &result.rebalance {
        out.rebalance = Some(Box::new(SystemNumbers {
            msgs_per_s: Some(round(r.msgs_per_s, 1)),
            p50_ms: r.p50_ms,
            p99_ms: r.p99_ms,
            added_p99_ms: r.added_p99_ms,
            db_commit_p99_ms: r.db_commit.p99_ms.map(|v| round(v, 2)),
            write_txns_per_msg: r.write_txns_per_msg.map(|v| round(v, 3)),
            rss_mib: Some(round(r.rss_mib, 1)),
            duplicates: r.duplicates,
            violations: r.violations,
            lost: r.lost,
            drained: r.drained,
            handover_max_ms: r.handover_max_ms,
            cpu_ms_per_msg: r.cpu.map(rounded),
            rebalance: None,
        }));
    }
    out
}

fn rounded(cpu: CpuPerMsg) -> CpuPerMsg {
    CpuPerMsg {
        consumers_ms: round(cpu.consumers_ms, 3),
        recovery_ms: cpu.recovery_ms.map(|v| round(v, 3)),
        mocks_ms: round(cpu.mocks_ms, 3),
        lab_ms: round(cpu.lab_ms, 3),
        database_ms: cpu.database_ms.map(|v| round(v, 3)),
        broker_ms: cpu.broker_ms.map(|v| round(v, 3)),
        box_ms: round(cpu.box_ms, 3),
        box_busy_pct: round(cpu.box_busy_pct, 1),
    }
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10_f64.powi(digits);
    (value * scale).round() / scale
}

pub fn write_json(path: &Path, report: &BenchReport) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    let mut systems = serde_json::Map::new();
    for (kind, result) in &report.systems {
        systems.insert(kind.name().to_owned(), serde_json::to_value(numbers(result))?);
    }
    for (engine, ceiling) in &report.ceilings {
        let midflight = if engine == "sqlite" { SystemKind::MidflightSqlite } else { SystemKind::MidflightMariadb };
        let txns = report.systems.get(&midflight).and_then(|r| r.peak.as_ref()).and_then(|p| p.write_txns_per_msg);
        systems.insert(
            format!("ceiling-{engine}"),
            serde_json::json!({
                "commits_per_s": round(ceiling.commits_per_s, 1),
                "connections": ceiling.connections,
                "msgs_per_s": txns.map(|t| round(ceiling.commits_per_s / t, 1)),
                "msgs_per_s_unbatched": round(ceiling.commits_per_s / TRANSITIONS_PER_MSG, 1),
            }),
        );
    }
    let json = serde_json::json!({
        "machine": report.machine,
        "command": report.command,
        "group_protocol": report.group_protocol,
        "kafka": report.kafka,
        "systems": systems,
        "phases": report.systems.values().flat_map(|r| [&r.peak, &r.paced, &r.rebalance]).flatten()
            .map(|p| { let mut p = p.clone(); p.series.clear(); p }).collect::<Vec<_>>(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

pub fn write(dir: &Path, report: &BenchReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.md"), markdown(report))?;
    std::fs::write(dir.join("phases.csv"), phases_csv(report))?;
    std::fs::write(dir.join("series.csv"), series_csv(report))?;
    std::fs::write(dir.join("chart.svg"), svg(report))?;
    write_json(&dir.join("report.json"), report)
}

fn phases(report: &BenchReport) -> impl Iterator<Item = &PhaseResult> {
    report.systems.values().flat_map(|r| [&r.peak, &r.paced, &r.rebalance]).flatten()
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or("-".to_owned(), |v| v.to_string())
}

fn opt_f(value: Option<f64>, digits: usize) -> String {
    value.map_or("-".to_owned(), |v| format!("{v:.digits$}"))
}

/// A system's duplicates, violations and lost messages, saying so when a phase did not drain.
fn checked(n: &SystemNumbers) -> String {
    let undrained = if n.drained { "" } else { " (not drained)" };
    format!("{} / {} / {}{undrained}", n.duplicates, n.violations, n.lost)
}

/// What makes a phase's numbers no result: effects doubled, the checker's violations, messages
/// lost, or a phase that did not finish its messages before its deadline.
pub fn failures(phase: &PhaseResult) -> Vec<String> {
    let mut out = Vec::new();
    for (count, what) in
        [(phase.duplicates, "duplicate effects"), (phase.violations, "violations"), (phase.lost, "lost messages")]
    {
        if count > 0 {
            out.push(format!("{} {}: {count} {what}", phase.system, phase.phase));
        }
    }
    if !phase.drained {
        out.push(format!(
            "{} {}: not drained ({} of {} finished)",
            phase.system, phase.phase, phase.finished, phase.messages
        ));
    }
    out
}

/// The summary table and the targets, also printed at the end of a run.
pub fn summary_markdown(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| system | msg/s (peak) | p50 ms | p99 ms | added p99 ms | write txns/msg | RSS MiB | duplicates / violations / lost | rebalance: msg/s, p99 ms, longest handover ms, duplicates / violations / lost |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for (kind, result) in &report.systems {
        let n = numbers(result);
        let rebalance = n.rebalance.as_ref().map_or("-".to_owned(), |r| {
            format!("{}, {}, {}, {}", opt_f(r.msgs_per_s, 0), opt(r.p99_ms), opt(r.handover_max_ms), checked(r))
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            kind.name(),
            opt_f(n.msgs_per_s, 0),
            opt(n.p50_ms),
            opt(n.p99_ms),
            opt(n.added_p99_ms),
            opt_f(n.write_txns_per_msg, 2),
            opt_f(n.rss_mib, 0),
            checked(&n),
            rebalance
        );
    }
    for (engine, ceiling) in &report.ceilings {
        let midflight = if engine == "sqlite" { SystemKind::MidflightSqlite } else { SystemKind::MidflightMariadb };
        let peak = report.systems.get(&midflight).and_then(|r| r.peak.as_ref());
        let txns = peak.and_then(|p| p.write_txns_per_msg);
        let _ = writeln!(
            out,
            "| ceiling ({engine}) | {} (÷ {} txns/msg); {:.0} unbatched (÷ 3) | | | | | | | |",
            opt_f(txns.map(|t| ceiling.commits_per_s / t), 0),
            opt_f(txns, 2),
            ceiling.commits_per_s / TRANSITIONS_PER_MSG
        );
    }
    out.push('\n');
    out.push_str(&targets(report));
    out
}

fn targets(report: &BenchReport) -> String {
    let mut out = String::from("Targets (issue 8), midflight on MariaDB:\n\n");
    let Some(ours) = report.systems.get(&SystemKind::MidflightMariadb) else {
        out.push_str("- midflight-mariadb was not run.\n");
        return out;
    };
    let peak = ours.peak.as_ref();
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    if let Some(peak) = peak {
        let phases = [&ours.peak, &ours.paced, &ours.rebalance].into_iter().flatten();
        let failed: Vec<String> = phases.flat_map(failures).collect();
        let dups: usize = [&ours.peak, &ours.paced, &ours.rebalance].into_iter().flatten().map(|p| p.duplicates).sum();
        let _ = writeln!(
            out,
            "- >= {TARGET_MSGS_PER_S:.0} msg/s with zero duplicates (and no violation, nothing lost, every phase drained): {:.0} msg/s, {dups} duplicates{}: {}",
            peak.msgs_per_s,
            if failed.is_empty() { String::new() } else { format!("; {}", failed.join("; ")) },
            verdict(peak.msgs_per_s >= TARGET_MSGS_PER_S && failed.is_empty())
        );
        if let Some(a) = report.systems.get(&SystemKind::BaselineA).and_then(|r| r.peak.as_ref()) {
            let ratio = peak.msgs_per_s / a.msgs_per_s.max(0.001);
            let _ = writeln!(
                out,
                "- >= {TARGET_VS_BASELINE_A:.0}x baseline A: {ratio:.1}x ({:.0} vs {:.0} msg/s): {}",
                peak.msgs_per_s,
                a.msgs_per_s,
                verdict(ratio >= TARGET_VS_BASELINE_A)
            );
        }
        if let Some(txns) = peak.write_txns_per_msg {
            let _ = writeln!(
                out,
                "- <= {TARGET_WRITE_TXNS_PER_MSG:.0} write transactions per message: {txns:.2}: {}",
                verdict(txns <= TARGET_WRITE_TXNS_PER_MSG)
            );
            if let Some(ceiling) = report.ceilings.get("mariadb") {
                let bound = ceiling.commits_per_s / txns;
                let _ = writeln!(
                    out,
                    "- >= 50% of the ceiling ({:.0} commits/s ÷ {txns:.2} = {bound:.0} msg/s): {:.0}%: {}",
                    ceiling.commits_per_s,
                    100.0 * peak.msgs_per_s / bound,
                    verdict(peak.msgs_per_s >= TARGET_SHARE_OF_CEILING * bound)
                );
            }
        }
        let _ = writeln!(
            out,
            "- consumer RSS <= {TARGET_RSS_MIB:.0} MiB (peak phase; most sagas one consumer held: {}): {:.0} MiB: {}",
            opt(peak.in_flight_per_consumer_max),
            peak.rss_mib,
            verdict(peak.rss_mib <= TARGET_RSS_MIB)
        );
    }
    if let Some(paced) = &ours.paced {
        let _ = writeln!(
            out,
            "- p99 added latency <= {TARGET_ADDED_P99_MS} ms at {:.0} msg/s: {} ms: {}",
            paced.offered_per_s.unwrap_or(0.0),
            opt(paced.added_p99_ms),
            verdict(paced.added_p99_ms.is_some_and(|v| v <= TARGET_ADDED_P99_MS))
        );
    }
    out
}

fn markdown(report: &BenchReport) -> String {
    let m = &report.machine;
    let mut out = String::from("# midflight benchmark\n\n");
    let _ = writeln!(out, "- Command: `{}`", report.command);
    let _ = writeln!(out, "- Commit: `{}`", m.commit);
    let _ = writeln!(out, "- Machine: {} cores ({}), {:.0} GiB", m.cores, m.cpu, m.memory_gib);
    let _ = writeln!(out, "- MariaDB: {}", opt(m.mariadb.as_ref()));
    let kafka = if report.kafka == "embedded" {
        "embedded (librdkafka's mock cluster, in the lab process)".to_owned()
    } else {
        format!("external, `{}`", report.kafka)
    };
    let _ = writeln!(out, "- Kafka: {kafka}; group protocol: {}", report.group_protocol);
    for (engine, c) in &report.ceilings {
        let _ = writeln!(
            out,
            "- Ceiling {engine}: {:.0} single-row commits/s with {} connections over {:.1} s ({})",
            c.commits_per_s, c.connections, c.seconds, c.durability
        );
    }
    out.push_str("\n## Summary\n\n");
    out.push_str(&summary_markdown(report));
    out.push_str("\n## Phases\n\n");
    out.push_str(
        "| system | phase | consumers | offered msg/s | messages | finished | msg/s | p50 ms | p99 ms | added p50 ms | added p99 ms | arrival p50 ms | arrival p99 ms | after arrival p50 ms | after arrival p99 ms | call mean ms | write txns/msg | transitions/msg | MariaDB commits/msg | MariaDB write stmts/msg | MariaDB log writes/msg | RSS MiB | in flight/consumer max | rebalances | longest handover ms | processed again | duplicates | violations | lost | drained | load avg |\n",
    );
    out.push_str(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in phases(report) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}-{:.1} |",
            p.system,
            p.phase,
            p.consumers,
            opt_f(p.offered_per_s, 0),
            p.messages,
            p.finished,
            p.msgs_per_s,
            opt(p.p50_ms),
            opt(p.p99_ms),
            opt(p.added_p50_ms),
            opt(p.added_p99_ms),
            opt(p.arrival_p50_ms),
            opt(p.arrival_p99_ms),
            opt(p.after_arrival_p50_ms),
            opt(p.after_arrival_p99_ms),
            opt_f(p.call_mean_ms, 0),
            opt_f(p.write_txns_per_msg, 3),
            opt_f(p.transitions_per_msg, 2),
            opt_f(p.mysql.map(|m| m.com_commit_per_msg), 3),
            opt_f(p.mysql.map(|m| m.write_statements_per_msg), 2),
            opt_f(p.mysql.map(|m| m.log_writes_per_msg), 3),
            p.rss_mib,
            opt(p.in_flight_per_consumer_max),
            p.rebalances,
            opt(p.handover_max_ms),
            opt(p.processed_again),
            p.duplicates,
            p.violations,
            p.lost,
            p.drained,
            p.load_avg_start,
            p.load_avg_end
        );
    }
    out.push_str(
        "\nmsg/s: completions per second after the warm-up while loading. Latencies: produce call to the \
         DONE commit (midflight: the transition log's database time; baselines: their own timings file), \
         added = end to end minus the time spent in downstream calls (the log's `call_ms`); arrival = \
         produce call to the consumer having the message (midflight: its inbox insert, the log's arrival \
         row; baselines: taken from Kafka), the part of the added latency spent before the consumer can \
         act; after arrival = per message, the added latency minus its arrival. Write txns/msg: \
         counted by the consumers' stores (baseline B: by its own counter). MariaDB columns: global server \
         counters (other clients of the server add noise). In flight/consumer max: the most sagas one \
         consumer held at a sample, from the saga table (midflight; a baseline keeps no such count). \
         Longest handover: the longest a partition went from its revocation by one consumer to its \
         next assignment, while loading and draining (from the consumers' logs; under the classic \
         protocol the embedded broker holds every join for `session.timeout.ms` - 1 s, 5 s with the \
         bench's 6 s session). Processed again (baselines): completions of a message already \
         completed, after a rebalance handed its partition on from an older commit; a baseline's \
         latencies count each message's first completion.\n",
    );
    out.push_str(&db_commit_markdown(report));
    out.push_str(&cpu_markdown(report));
    out.push_str("\n![throughput and latency over time](chart.svg)\n");
    out
}

/// The database's own commit latency in each phase, beside what the system added after arrival.
fn db_commit_markdown(report: &BenchReport) -> String {
    let mut out = String::from(
        "\n## The database's own commit latency\n\n\
         | system | phase | probe commits | p50 ms | p99 ms | max ms | slowest second | after arrival p99 ms |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for p in phases(report) {
        let c = &p.db_commit;
        let slowest = c
            .max_by_second()
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("-".to_owned(), |(second, ms)| format!("{second}-{} s: {ms:.1} ms", second + 1));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            p.system,
            p.phase,
            c.commits,
            opt_f(c.p50_ms, 2),
            opt_f(c.p99_ms, 2),
            opt_f(c.max_ms, 1),
            slowest,
            opt(p.after_arrival_p99_ms)
        );
    }
    for p in phases(report) {
        if let Some(error) = &p.db_commit.error {
            let _ = writeln!(out, "\n{} {}: {error}", p.system, p.phase);
        }
    }
    let _ = writeln!(
        out,
        "\nThe lab commits a one-row update every {} ms on a database of its own beside the system's (the \
         same MariaDB server, or a SQLite file in the system's directory) from loading's start until \
         drained, and times each commit. When the server's commits slow down (its log's flushes wait on \
         the disk), the system's and the probe's slow down together. The slowest second counts from \
         loading's start; the series' `db_commit_max_ms` is the slowest commit since the sample before. The probe's updates are taken out of the \
         MariaDB write statements above; its commits (10 a second) stay in the server's log writes, and its \
         work in the database server's CPU.",
        super::commit_probe::EVERY.as_millis()
    );
    out
}

/// CPU per message by role, and what the user's rate would need at those costs.
fn cpu_markdown(report: &BenchReport) -> String {
    let mut out = String::from("\n## CPU per message\n\n");
    out.push_str(
        "| system | phase | msg/s | consumers ms | recovery ms | mocks ms | lab ms | database ms | broker ms | box ms | box busy % |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for p in phases(report) {
        let Some(c) = p.cpu else { continue };
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.3} | {} | {:.3} | {:.3} | {} | {} | {:.3} | {:.0} |",
            p.system,
            p.phase,
            p.msgs_per_s,
            c.consumers_ms,
            opt_f(c.recovery_ms, 3),
            c.mocks_ms,
            c.lab_ms,
            opt_f(c.database_ms, 3),
            opt_f(c.broker_ms, 3),
            c.box_ms,
            c.box_busy_pct
        );
    }
    out.push_str(
        "\nCPU time (user + system) of each role's processes over the measured part (warm-up done to \
         drained), divided by the messages finished in it. Consumers: every consumer process, those \
         that joined or left included (read right after joining and right before leaving; midflight on SQLite: the database work is in here too); lab: the \
         producer and the phase's polling (with the embedded Kafka, its brokers too); database: the MariaDB server's process when it runs on this \
         machine (all of its clients); broker: an external Kafka's processes that listen on a bootstrap address of \
         this machine (`-` for the embedded Kafka, or a broker elsewhere); box: every core's busy time (every process and the kernel; a virtual machine's steal time is left out). On a \
         saturated box a process also spends time waiting for locks and being switched, so the peak's \
         numbers can be higher than the same work costs on a quiet one.\n\n",
    );
    for (kind, result) in &report.systems {
        let Some(c) = result.peak.as_ref().and_then(|p| p.cpu) else { continue };
        let _ = writeln!(out, "- {}", projection(*kind, &c));
    }
    out
}

/// What the user's rate would need at a peak's cost per message: a lower bound, since the peak
/// batches most (at lower rates a message costs more). Only for a peak that saturated the box;
/// below that, fixed costs spread over few messages say nothing about a higher rate.
fn projection(kind: SystemKind, c: &CpuPerMsg) -> String {
    if c.box_busy_pct < SATURATED_BUSY_PCT {
        return format!(
            "{}: the box was {:.0}% busy at the peak, so its cost per message is not projected.",
            kind.name(),
            c.box_busy_pct
        );
    }
    let cores = |ms: f64| ms * TARGET_MSGS_PER_S / 1_000.0;
    let database = match c.database_ms {
        Some(ms) => format!("{:.1} cores", cores(ms)),
        None if kind == SystemKind::MidflightSqlite => "inside the consumers (SQLite)".to_owned(),
        None => "not read (the server runs elsewhere)".to_owned(),
    };
    format!(
        "{}: {TARGET_MSGS_PER_S:.0} msg/s at the peak's cost per message (a lower bound: the peak batches \
         most) needs consumers {:.1} cores, database {database}, mocks {:.1}, box in all {:.1}.",
        kind.name(),
        cores(c.consumers_ms),
        cores(c.mocks_ms),
        cores(c.box_ms)
    )
}

fn phases_csv(report: &BenchReport) -> String {
    let mut out = String::from(
        "system,phase,consumers,offered_per_s,messages,finished,msgs_per_s,p50_ms,p99_ms,added_p50_ms,added_p99_ms,arrival_p50_ms,arrival_p99_ms,after_arrival_p50_ms,after_arrival_p99_ms,call_mean_ms,write_txns_per_msg,transitions_per_msg,mysql_commits_per_msg,mysql_write_statements_per_msg,mysql_log_writes_per_msg,rss_mib,in_flight_per_consumer_max,rebalances,handover_max_ms,processed_again,duplicates,violations,lost,drained,load_avg_start,load_avg_end,cpu_consumers_ms,cpu_recovery_ms,cpu_mocks_ms,cpu_lab_ms,cpu_database_ms,cpu_broker_ms,cpu_box_ms,box_busy_pct,db_commit_p50_ms,db_commit_p99_ms,db_commit_max_ms\n",
    );
    let csv = |v: Option<String>| v.unwrap_or_default();
    for p in phases(report) {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{:.2},{:.2},{},{},{},{}",
            p.system,
            p.phase,
            p.consumers,
            csv(p.offered_per_s.map(|v| format!("{v:.1}"))),
            p.messages,
            p.finished,
            p.msgs_per_s,
            csv(p.p50_ms.map(|v| v.to_string())),
            csv(p.p99_ms.map(|v| v.to_string())),
            csv(p.added_p50_ms.map(|v| v.to_string())),
            csv(p.added_p99_ms.map(|v| v.to_string())),
            csv(p.arrival_p50_ms.map(|v| v.to_string())),
            csv(p.arrival_p99_ms.map(|v| v.to_string())),
            csv(p.after_arrival_p50_ms.map(|v| v.to_string())),
            csv(p.after_arrival_p99_ms.map(|v| v.to_string())),
            csv(p.call_mean_ms.map(|v| format!("{v:.1}"))),
            csv(p.write_txns_per_msg.map(|v| format!("{v:.4}"))),
            csv(p.transitions_per_msg.map(|v| format!("{v:.3}"))),
            csv(p.mysql.map(|m| format!("{:.4}", m.com_commit_per_msg))),
            csv(p.mysql.map(|m| format!("{:.3}", m.write_statements_per_msg))),
            csv(p.mysql.map(|m| format!("{:.4}", m.log_writes_per_msg))),
            p.rss_mib,
            csv(p.in_flight_per_consumer_max.map(|v| v.to_string())),
            p.rebalances,
            csv(p.handover_max_ms.map(|v| v.to_string())),
            csv(p.processed_again.map(|v| v.to_string())),
            p.duplicates,
            p.violations,
            p.lost,
            p.drained,
            p.load_avg_start,
            p.load_avg_end,
            cpu_csv(p.cpu),
            csv(p.db_commit.p50_ms.map(|v| format!("{v:.2}"))),
            csv(p.db_commit.p99_ms.map(|v| format!("{v:.2}"))),
            csv(p.db_commit.max_ms.map(|v| format!("{v:.1}")))
        );
    }
    out
}

/// The CPU columns of a phase's CSV row (empty cells when nothing was read).
fn cpu_csv(cpu: Option<CpuPerMsg>) -> String {
    let Some(c) = cpu else { return ",,,,,,,".to_owned() };
    format!(
        "{:.4},{},{:.4},{:.4},{},{},{:.4},{:.1}",
        c.consumers_ms,
        c.recovery_ms.map(|v| format!("{v:.4}")).unwrap_or_default(),
        c.mocks_ms,
        c.lab_ms,
        c.database_ms.map(|v| format!("{v:.4}")).unwrap_or_default(),
        c.broker_ms.map(|v| format!("{v:.4}")).unwrap_or_default(),
        c.box_ms,
        c.box_busy_pct
    )
}

fn series_csv(report: &BenchReport) -> String {
    let mut out = String::from("system,phase,t_s,done,done_per_s,p50_ms,p99_ms,in_flight,db_commit_max_ms\n");
    for p in phases(report) {
        for s in &p.series {
            let _ = writeln!(
                out,
                "{},{},{:.2},{},{:.1},{},{},{},{}",
                p.system,
                p.phase,
                s.t_s,
                s.done,
                s.done_per_s,
                opt(s.p50_ms),
                opt(s.p99_ms),
                s.in_flight,
                s.db_commit_max_ms.map_or(String::new(), |v| format!("{v:.1}"))
            );
        }
    }
    out
}

/// Colours of the lines, one per phase, in order.
const PALETTE: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// The chart's panels: title, unit, and each sample's value (samples are about a second apart).
type Panel = (&'static str, &'static str, fn(&Sample) -> Option<f64>);

const PANELS: [Panel; 3] = [
    ("completions per second", "msg/s", |s| Some(s.done_per_s)),
    ("p99 end-to-end latency (paced phases)", "ms", |s| s.p99_ms.map(|v| v as f64)),
    ("the database's slowest probe commit since the sample before", "ms", |s| s.db_commit_max_ms),
];

/// Three panels against time: completions per second, p99 end-to-end latency and the
/// database's own slowest commit (`commit_probe`), each since the sample before.
fn svg(report: &BenchReport) -> String {
    let (width, panel, margin, legend_row) = (960.0, 260.0, 60.0, 16.0);
    let all: Vec<&PhaseResult> = phases(report).collect();
    let legend_h = legend_row * all.len() as f64 + 10.0;
    let panels = PANELS.len() as f64;
    let height = panels * panel + (panels + 1.0) * margin + legend_h;
    let t_max = all.iter().flat_map(|p| p.series.iter().map(|s| s.t_s)).fold(1.0_f64, f64::max);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let plot_w = width - 2.0 * margin;
    for (index, (title, unit, value_of)) in PANELS.into_iter().enumerate() {
        let max = all.iter().flat_map(|p| p.series.iter().filter_map(value_of)).fold(1.0_f64, f64::max);
        let top = margin + index as f64 * (panel + margin);
        let _ = writeln!(
            out,
            "<text x=\"{margin}\" y=\"{}\" font-size=\"13\">{title}</text>\n<rect x=\"{margin}\" y=\"{top}\" width=\"{plot_w}\" height=\"{panel}\" fill=\"none\" stroke=\"#999\"/>",
            top - 8.0
        );
        for tick in 0..=4 {
            let value = max * f64::from(tick) / 4.0;
            let y = top + panel - panel * f64::from(tick) / 4.0;
            let _ = writeln!(
                out,
                "<line x1=\"{margin}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{value:.0} {unit}</text>",
                margin + plot_w,
                margin - 4.0,
                y + 4.0
            );
        }
        for (n, phase) in all.iter().enumerate() {
            let points: Vec<String> = phase
                .series
                .iter()
                .filter_map(|s| {
                    value_of(s).map(|v| {
                        format!(
                            "{:.1},{:.1}",
                            margin + plot_w * s.t_s / t_max,
                            top + panel - panel * (v / max).min(1.0)
                        )
                    })
                })
                .collect();
            if points.len() > 1 {
                let _ = writeln!(
                    out,
                    "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
                    PALETTE[n % PALETTE.len()],
                    points.join(" ")
                );
            }
        }
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{t_max:.0} s</text>",
            margin + plot_w,
            top + panel + 14.0
        );
    }
    let legend_top = panels * panel + (panels + 0.5) * margin + 10.0;
    for (n, phase) in all.iter().enumerate() {
        let y = legend_top + legend_row * n as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{margin}\" y=\"{:.1}\" width=\"12\" height=\"3\" fill=\"{}\"/><text x=\"{}\" y=\"{:.1}\">{} {} ({:.0} msg/s)</text>",
            y - 4.0,
            PALETTE[n % PALETTE.len()],
            margin + 18.0,
            y,
            phase.system,
            phase.phase,
            phase.msgs_per_s
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::SystemResult;
    use std::collections::BTreeMap;

    fn report_with(peak: PhaseResult) -> BenchReport {
        let machine = Machine {
            cpu: "test".into(),
            cores: 2,
            memory_gib: 24.0,
            commit: "abc1234".into(),
            mariadb: None,
            date_unix_s: 0,
        };
        let systems = BTreeMap::from([(
            SystemKind::MidflightMariadb,
            SystemResult { peak: Some(peak), ..SystemResult::default() },
        )]);
        BenchReport {
            machine,
            command: "bench".into(),
            group_protocol: "classic",
            kafka: "embedded".into(),
            systems,
            ceilings: BTreeMap::new(),
        }
    }

    fn peak(msgs_per_s: f64) -> PhaseResult {
        PhaseResult {
            system: "midflight-mariadb".into(),
            phase: "peak".into(),
            messages: 1_000,
            finished: 1_000,
            msgs_per_s,
            drained: true,
            ..PhaseResult::default()
        }
    }

    #[test]
    fn the_throughput_target_needs_a_clean_drained_run() {
        let clean = summary_markdown(&report_with(peak(5_000.0)));
        assert!(clean.contains("0 duplicates: met"), "{clean}");
        assert!(clean.contains("| 0 / 0 / 0 |"), "{clean}");
        for flaw in [
            PhaseResult { lost: 10, ..peak(5_000.0) },
            PhaseResult { violations: 3, ..peak(5_000.0) },
            PhaseResult { drained: false, finished: 990, ..peak(5_000.0) },
            PhaseResult { duplicates: 1, ..peak(5_000.0) },
        ] {
            let failures = failures(&flaw);
            assert_eq!(failures.len(), 1, "{failures:?}");
            let text = summary_markdown(&report_with(flaw));
            assert!(text.contains(&format!("{}: NOT met", failures[0])), "{text}");
        }
        assert_eq!(
            failures(&PhaseResult { drained: false, finished: 990, ..peak(5_000.0) }),
            vec!["midflight-mariadb peak: not drained (990 of 1000 finished)".to_owned()]
        );
        assert!(
            summary_markdown(&report_with(PhaseResult { drained: false, ..peak(5_000.0) })).contains("(not drained)")
        );
    }

    #[test]
    fn the_commit_label_says_when_the_binaries_are_not_the_checkouts() {
        assert_eq!(commit_label("abc1234", false, "abc1234"), "abc1234");
        assert_eq!(commit_label("abc1234", true, "abc1234"), "abc1234 (with uncommitted changes)");
        assert_eq!(commit_label("def5678", false, "abc1234"), "def5678 (but the binaries were built at abc1234)");
        assert_eq!(commit_label("unknown", false, "unknown"), "unknown");
    }
}
