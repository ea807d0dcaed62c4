//! One function per subcommand: read or write through the store, then print a table or JSON.
//! Writes go through the store's operator CAS ([`Store::resolve`], [`Store::close_ticket`]);
//! a conflict is reported as a refusal, never retried: the operator must look again.

use anyhow::{Context as _, bail};
use midflight_api::client::Downstreams;
use midflight_config::Sources;
use midflight_model::{Saga, Status};
use midflight_recovery::reconcile::ticket_outcome_name;
use midflight_recovery::{Reconciler, RecoveryConfig, Report};
use midflight_store::{Cas, Store, Ticket, TicketState, Transition, saga_json};
use serde_json::json;

use crate::render::{Table, age, block, cut, or_dash};
use crate::{Cli, Command, WriteArgs};

/// How a command ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    Ok,
    /// A write was refused; the reason has been printed.
    Refused,
}

/// Where and how to print.
#[derive(Debug, Clone, Copy)]
struct Out {
    json: bool,
}

impl Out {
    fn json(&self, value: &serde_json::Value) -> anyhow::Result<()> {
        println!("{}", serde_json::to_string_pretty(value)?);
        Ok(())
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<Done> {
    let config: RecoveryConfig = midflight_config::load(&Sources::from_process(cli.config.clone(), cli.set.clone()))?;
    // A person runs these and can stop them, and a listing may read the whole table (no index
    // orders it by time): longer than the services' bound on one statement allows.
    let database = midflight_config::DatabaseSection { statement_timeout_ms: 0, ..config.database.clone() };
    let store = Store::connect(&database).await.context("cannot open the saga database")?;
    let out = Out { json: cli.json };
    let result = dispatch(&store, &config, out, cli.command).await;
    store.close().await.ok();
    result
}

/// The first `limit` of `rows` (read with one more, to know): when more exist, a line on stderr
/// says so, so a listing cut at its limit is not read as the whole (stdout keeps its shape).
fn shown<T>(mut rows: Vec<T>, limit: u64) -> Vec<T> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() > limit {
        rows.truncate(limit);
        eprintln!("sagactl: the first {limit} shown; more exist (raise --limit)");
    }
    rows
}

async fn dispatch(store: &Store, config: &RecoveryConfig, out: Out, command: Command) -> anyhow::Result<Done> {
    match command {
        Command::List { status, limit } => {
            let sagas = shown(store.list(status, limit.saturating_add(1)).await?, limit);
            list(store, out, sagas).await
        }
        Command::Stuck { older_than_ms, limit } => {
            let sagas = shown(store.stuck(older_than_ms, limit.saturating_add(1)).await?, limit);
            stuck(store, out, sagas).await
        }
        Command::Show { biz_id } => show(store, out, &biz_id).await,
        Command::Tickets { state, limit } => {
            let state = state.map(|s| if s == "open" { TicketState::Open } else { TicketState::Resolved });
            tickets(store, out, shown(store.tickets(state, limit.saturating_add(1)).await?, limit)).await
        }
        Command::Ticket { biz_id } => ticket(store, out, &biz_id).await,
        Command::Resolve { biz_id, to, tracking_no, write } => {
            resolve(store, out, &biz_id, to, tracking_no.as_deref(), &write).await
        }
        Command::Retry { biz_id, from, write } => resolve(store, out, &biz_id, from, None, &write).await,
        Command::CloseTicket { key, step, finding, operator, note } => {
            close_ticket(store, out, &key, &step, &finding, &operator, &note).await
        }
        Command::Reconcile => reconcile(store, config, out).await,
        Command::Migrate => {
            store.migrate().await.context("cannot apply the migrations")?;
            if out.json {
                out.json(&serde_json::json!({ "migrated": true }))?;
            } else {
                println!("schema up to date");
            }
            Ok(Done::Ok)
        }
    }
}

async fn list(store: &Store, out: Out, sagas: Vec<Saga>) -> anyhow::Result<Done> {
    if out.json {
        out.json(&json!(sagas.iter().map(saga_json).collect::<Vec<_>>()))?;
        return Ok(Done::Ok);
    }
    print_sagas(store, &sagas, None).await
}

/// Like `list`, with what each saga waits for: a saga that has not started waits without a
/// write while an earlier saga of its order is unfinished, so the row that holds it up is
/// named (`WAITS_FOR`, `waits_for` in JSON; one query per such saga, at most `--limit`).
async fn stuck(store: &Store, out: Out, sagas: Vec<Saga>) -> anyhow::Result<Done> {
    let mut waits_for = Vec::with_capacity(sagas.len());
    for saga in &sagas {
        let earlier = if saga.status == Status::Received { store.earlier_unfinished(saga).await? } else { None };
        waits_for.push(earlier);
    }
    if out.json {
        let rows: Vec<serde_json::Value> = sagas
            .iter()
            .zip(&waits_for)
            .map(|(saga, earlier)| {
                let mut row = saga_json(saga);
                row["waits_for"] = json!(earlier);
                row
            })
            .collect();
        out.json(&json!(rows))?;
        return Ok(Done::Ok);
    }
    print_sagas(store, &sagas, Some(&waits_for)).await
}

async fn print_sagas(store: &Store, sagas: &[Saga], waits_for: Option<&[Option<String>]>) -> anyhow::Result<Done> {
    let now = store.now_ms().await?;
    let mut headers = vec!["BIZ_ID", "STATUS", "VERSION", "EPOCH", "OWNER", "LEASE", "UPDATED", "ATTEMPTS"];
    if waits_for.is_some() {
        headers.push("WAITS_FOR");
    }
    headers.push("LAST_ERROR");
    let mut table = Table::new(&headers);
    for (i, saga) in sagas.iter().enumerate() {
        let mut row = vec![
            saga.biz_id.clone(),
            saga.status.to_string(),
            saga.version.to_string(),
            saga.lease.epoch.to_string(),
            or_dash(saga.lease.owner_id.as_deref()),
            lease(saga, now),
            age(saga.updated_at_ms, now),
            saga.attempts.to_string(),
        ];
        if let Some(waits_for) = waits_for {
            row.push(or_dash(waits_for.get(i).and_then(Option::as_deref)));
        }
        row.push(or_dash(saga.last_error.as_deref()));
        table.row(row);
    }
    print!("{}", table.render());
    if table.is_empty() {
        println!("(no sagas)");
    }
    Ok(Done::Ok)
}

async fn show(store: &Store, out: Out, biz_id: &str) -> anyhow::Result<Done> {
    let Some(saga) = store.get(biz_id).await? else { bail!("no saga {biz_id}") };
    let transitions = store.transitions(biz_id).await?;
    let tickets = store.tickets_of(biz_id).await?;
    if out.json {
        out.json(&json!({ "saga": saga_json(&saga), "transitions": transitions, "tickets": tickets }))?;
        return Ok(Done::Ok);
    }
    let now = store.now_ms().await?;
    println!("saga {biz_id}");
    print!("{}", block(&saga_fields(&saga, now)));
    println!("\ntimeline");
    print!("{}", timeline(&transitions, now).render());
    println!("\ntickets");
    if tickets.is_empty() {
        println!("  (none)");
    } else {
        print!("{}", ticket_table(&tickets, now).render());
    }
    if saga.status == Status::ManualReview {
        let done = if saga.tracking_no.is_some() { "DONE [--tracking-no T]" } else { "DONE --tracking-no T" };
        println!(
            "\nresolve: sagactl resolve {biz_id} --to {done}|ROLLED_BACK --version {v} --operator NAME --note TEXT",
            v = saga.version
        );
        match store.later_saga_of_order(&saga).await? {
            None => println!(
                "retry:   sagactl retry {biz_id} --from WMS_REQUESTED|LOGISTICS_REQUESTED|WMS_REVERSING|LOGISTICS_CANCELLING --version {v} --operator NAME --note TEXT",
                v = saga.version
            ),
            Some((later, status)) => println!(
                "retry:   not possible: a later saga of its order, {later} ({status}), is in the table; automation would run this one out of order"
            ),
        }
    }
    Ok(Done::Ok)
}

fn saga_fields(saga: &Saga, now: i64) -> Vec<(&'static str, String)> {
    let at = |ms: Option<i64>| ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms} ({})", age(ms, now)));
    vec![
        ("status", saga.status.to_string()),
        ("version", saga.version.to_string()),
        ("order", format!("{} {}", saga.order_no, saga.event_type)),
        ("source", format!("{}/{}@{}", saga.source.topic, saga.source.partition, saga.source.offset)),
        ("owner", or_dash(saga.lease.owner_id.as_deref())),
        ("lease_epoch", saga.lease.epoch.to_string()),
        ("lease", lease(saga, now)),
        ("attempts", saga.attempts.to_string()),
        ("next_attempt", at(Some(saga.next_attempt_at_ms).filter(|ms| *ms > 0))),
        ("last_error", or_dash(saga.last_error.as_deref())),
        ("deadline", at(Some(saga.deadline_ms))),
        ("wms_request_id", or_dash(saga.wms_request_id.as_deref())),
        ("wms_voucher", or_dash(saga.wms_voucher.as_deref())),
        ("wms_locked", at(saga.wms_locked_at_ms)),
        ("logistics_request_id", or_dash(saga.logistics_request_id.as_deref())),
        ("logistics_voucher", or_dash(saga.logistics_voucher.as_deref())),
        ("tracking_no", or_dash(saga.tracking_no.as_deref())),
        ("created", at(Some(saga.created_at_ms))),
        ("updated", at(Some(saga.updated_at_ms))),
    ]
}

fn lease(saga: &Saga, now: i64) -> String {
    if saga.status.is_terminal() {
        return "-".to_owned();
    }
    if saga.next_attempt_at_ms > now {
        // Released until its retry (a backoff, a wait for the in-flight window): the row is
        // leased to nobody until then, whatever OWNER still names.
        return format!("released, retry {}", age(saga.next_attempt_at_ms, now));
    }
    if saga.lease.until_ms > now {
        format!("live, ends {}", age(saga.lease.until_ms, now))
    } else {
        "expired".to_owned()
    }
}

fn timeline(transitions: &[Transition], now: i64) -> Table {
    let mut table = Table::new(&["VERSION", "FROM", "TO", "EPOCH", "ACTOR", "AT", "REASON"]);
    for t in transitions {
        table.row(vec![
            t.version.to_string(),
            or_dash(t.from),
            t.to.to_string(),
            t.lease_epoch.to_string(),
            t.actor.clone(),
            age(t.at_ms, now),
            t.reason.clone(),
        ]);
    }
    table
}

fn ticket_table(tickets: &[Ticket], now: i64) -> Table {
    let mut table = Table::new(&["KEY", "STEP", "STATE", "OPENED", "BY", "REASON"]);
    for t in tickets {
        table.row(vec![
            t.biz_id.clone(),
            t.step.clone(),
            t.state.as_str().to_owned(),
            age(t.opened_at_ms, now),
            t.opened_by.clone(),
            t.reason.clone(),
        ]);
    }
    table
}

async fn tickets(store: &Store, out: Out, tickets: Vec<Ticket>) -> anyhow::Result<Done> {
    if out.json {
        out.json(&serde_json::to_value(&tickets)?)?;
        return Ok(Done::Ok);
    }
    let table = ticket_table(&tickets, store.now_ms().await?);
    print!("{}", table.render());
    if table.is_empty() {
        println!("(no tickets)");
    }
    Ok(Done::Ok)
}

async fn ticket(store: &Store, out: Out, key: &str) -> anyhow::Result<Done> {
    let tickets = store.tickets_of(key).await?;
    if tickets.is_empty() {
        bail!("no tickets for {key}");
    }
    if out.json {
        out.json(&serde_json::to_value(&tickets)?)?;
        return Ok(Done::Ok);
    }
    let now = store.now_ms().await?;
    for t in &tickets {
        println!("ticket {} {}", t.biz_id, t.step);
        print!(
            "{}",
            block(&[
                ("state", t.state.as_str().to_owned()),
                ("reason", t.reason.clone()),
                ("opened", format!("{} by {}", age(t.opened_at_ms, now), t.opened_by)),
                (
                    "resolved",
                    or_dash(t.resolved_at_ms.map(|ms| format!(
                        "{} by {}",
                        age(ms, now),
                        or_dash(t.resolved_by.as_deref())
                    )))
                ),
                ("resolution", or_dash(t.resolution.as_deref())),
            ])
        );
        println!("  evidence\n{}\n", indent(&serde_json::to_string_pretty(&t.evidence)?, 4));
    }
    Ok(Done::Ok)
}

async fn resolve(
    store: &Store,
    out: Out,
    biz_id: &str,
    to: Status,
    tracking_no: Option<&str>,
    write: &WriteArgs,
) -> anyhow::Result<Done> {
    let result = store.resolve(biz_id, write.version, to, tracking_no, &write.operator, &write.note).await;
    match result {
        Ok(Cas::Applied(saga)) => {
            if out.json {
                out.json(&json!({ "result": "applied", "saga": saga_json(&saga) }))?;
            } else {
                println!(
                    "{biz_id}: MANUAL_REVIEW -> {} at version {} by operator:{}",
                    saga.status, saga.version, write.operator
                );
            }
            Ok(Done::Ok)
        }
        Ok(Cas::Conflict) => {
            let current = store.get(biz_id).await?;
            let (version, status) = current.map_or((None, None), |s| (Some(s.version), Some(s.status)));
            let reason = format!(
                "saga {biz_id} changed underneath: you looked at version {}, it is now at version {} ({}); nothing was written, look again with `sagactl show {biz_id}`",
                write.version,
                or_dash(version),
                or_dash(status)
            );
            refuse(out, biz_id, &reason, version, status)
        }
        Err(midflight_store::Error::Model(midflight_model::Error::IllegalTransition { from, .. })) => {
            let reason = format!(
                "saga {biz_id} is {from}: only a MANUAL_REVIEW saga can be resolved or retried; nothing was written"
            );
            refuse(out, biz_id, &reason, Some(write.version), Some(from))
        }
        Err(midflight_store::Error::LaterSagaOfOrder { later, later_status, .. }) => {
            let reason = format!(
                "saga {biz_id} cannot go back to automation: a later saga of its order, {later} ({later_status}), is in the table and may have run already, and this one would run after it, out of the order's offset order; nothing was written. Settle it by hand and close it with `sagactl resolve {biz_id} --to DONE|ROLLED_BACK`"
            );
            refuse(out, biz_id, &reason, Some(write.version), Some(Status::ManualReview))
        }
        Err(midflight_store::Error::Invalid(reason)) => match store.get(biz_id).await? {
            None => Err(anyhow::anyhow!("no saga {biz_id}")),
            Some(current) => refuse(out, biz_id, &reason, Some(current.version), Some(current.status)),
        },
        Err(error) => Err(error.into()),
    }
}

fn refuse(out: Out, key: &str, reason: &str, version: Option<u64>, status: Option<Status>) -> anyhow::Result<Done> {
    if out.json {
        out.json(&json!({
            "result": "refused",
            "key": key,
            "reason": reason,
            "current_version": version,
            "current_status": status,
        }))?;
    }
    eprintln!("sagactl: refused: {reason}");
    Ok(Done::Refused)
}

async fn close_ticket(
    store: &Store,
    out: Out,
    key: &str,
    step: &str,
    finding: &str,
    operator: &str,
    note: &str,
) -> anyhow::Result<Done> {
    match store.close_ticket(key, step, finding, operator, note).await? {
        Cas::Applied(()) => {
            if out.json {
                out.json(&json!({ "result": "applied", "key": key, "step": step }))?;
            } else {
                println!("{key} {step}: ticket closed by {operator}");
            }
            Ok(Done::Ok)
        }
        Cas::Conflict => {
            let why = match store.open_finding(key, step).await? {
                Some(held) => format!(
                    "the open {step} ticket for {key} holds finding {held:?}, not {finding:?}; look at it again (sagactl ticket {key}); nothing was written"
                ),
                None => format!("no open {step} ticket for {key}; nothing was written"),
            };
            refuse(out, key, &why, None, None)
        }
    }
}

async fn reconcile(store: &Store, config: &RecoveryConfig, out: Out) -> anyhow::Result<Done> {
    let downstreams = Downstreams::connect_lazy(&config.wms, &config.logistics)?;
    let reconciler = Reconciler::new(store.clone(), downstreams, config.reconcile.clone(), "sagactl:reconcile".into());
    let report = reconciler.run_once().await?;
    if out.json {
        out.json(&serde_json::to_value(&report)?)?;
    } else {
        print_report(&report);
    }
    Ok(Done::Ok)
}

fn print_report(report: &Report) {
    println!(
        "reconciled {} sagas against {} wms and {} logistics ledger entries",
        report.sagas_checked, report.wms_entries, report.logistics_entries
    );
    println!(
        "findings: {} (orphan {}, double_effect {}, missing_effect {}, effect_after_rollback {})",
        report.findings_total(),
        report.orphans,
        report.double_effects,
        report.missing_effects,
        report.effects_after_rollback
    );
    if report.owned_by_purged > 0 {
        println!("effects of purged sagas (not judged): {}", report.owned_by_purged);
    }
    if report.unreadable > 0 {
        println!(
            "saga rows that cannot be read (stepped over, their effects not judged; the log names them): {}",
            report.unreadable
        );
    }
    println!(
        "tickets:  {} opened, {} reopened, {} already open, {} resolved before",
        report.tickets_opened, report.tickets_reopened, report.tickets_already_open, report.tickets_resolved_before
    );
    if report.findings.is_empty() {
        return;
    }
    let mut table = Table::new(&["KIND", "STEP", "SAGA", "STATUS", "REQUEST_ID", "IN_FORCE", "TICKET"]);
    for f in &report.findings {
        table.row(vec![
            f.kind.as_str().to_owned(),
            f.step.as_str().to_owned(),
            or_dash(f.biz_id.as_deref()),
            or_dash(f.status),
            f.request_id.clone(),
            cut(&f.in_force.join(",")),
            ticket_outcome_name(f.ticket).to_owned(),
        ]);
    }
    println!();
    print!("{}", table.render());
}

fn indent(text: &str, spaces: usize) -> String {
    let pad = " ".repeat(spaces);
    text.lines().map(|line| format!("{pad}{line}")).collect::<Vec<_>>().join("\n")
}
