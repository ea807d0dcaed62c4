//! `sagactl`: the operator's view of the saga table. List and inspect sagas and their timelines,
//! list and read tickets, resolve MANUAL_REVIEW sagas (close them, or send them back to an
//! intent state for automation to settle by query), close reconciliation tickets, run the
//! reconciler once, and apply the schema's migrations (`migrate`).
//!
//! Every write is a compare-and-set on the version the operator looked at, recorded in the
//! transition log under `operator:<name>`; when the row changed underneath it is refused with
//! exit code 3 and nothing is written. The database comes from the same configuration as the
//! recovery worker (`--config`, `MIDFLIGHT_DATABASE__URL`, or `--set database.url=...`), except
//! `database.statement_timeout_ms`: its statements run as long as they take, since a listing
//! may read the whole table.

mod commands;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use midflight_model::Status;

/// Most rows one listing prints.
const LIST_LIMIT_MAX: u64 = 10_000;
/// Longest operator name or note accepted (the transition log's columns are wider).
const OPERATOR_LEN_MAX: usize = 64;
const NOTE_LEN_MAX: usize = 400;

/// Exit code of bad usage: a flag clap refuses, or a configuration that cannot be used.
const EXIT_USAGE: u8 = 2;
/// Exit code of a refused write (the row changed, or it is not in a state the action applies to).
const EXIT_REFUSED: u8 = 3;

/// Operate midflight sagas and their manual tickets.
#[derive(Debug, Parser)]
#[command(
    name = "sagactl",
    version,
    after_help = "Exit codes: 0 done, 1 error, 2 bad usage, 3 refused (the row changed underneath or is not in a state the action applies to)."
)]
struct Cli {
    /// TOML configuration file (the recovery worker's).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Override one setting, e.g. `--set database.url=mysql://...` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", global = true)]
    set: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List sagas, least recently updated first.
    List {
        #[arg(long, value_parser = parse_status)]
        status: Option<Status>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=LIST_LIMIT_MAX))]
        limit: u64,
    },
    /// One saga: its row, its timeline from the transition log, its tickets.
    Show { biz_id: String },
    /// Unfinished sagas not updated for a while; one that has not started names the earlier
    /// unfinished saga of its order it waits for (WAITS_FOR).
    Stuck {
        #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(i64).range(0..))]
        older_than_ms: i64,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=LIST_LIMIT_MAX))]
        limit: u64,
    },
    /// Manual tickets, newest first.
    Tickets {
        #[arg(long, value_parser = ["open", "resolved"])]
        state: Option<String>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=LIST_LIMIT_MAX))]
        limit: u64,
    },
    /// The tickets of one saga (or of an `orphan:<request id>` key), with their evidence.
    Ticket { biz_id: String },
    /// Close a MANUAL_REVIEW saga as DONE or ROLLED_BACK after fixing things by hand. DONE marks
    /// the order shipped and queues its notification; ROLLED_BACK marks the order reversed.
    Resolve {
        biz_id: String,
        /// DONE or ROLLED_BACK: what the saga really ended as, after the manual fix.
        #[arg(long, value_parser = parse_resolution)]
        to: Status,
        /// With DONE: the shipment's tracking number, for the order and the notification.
        /// Needed unless the saga has one (then it must be that one).
        #[arg(long, value_parser = parse_tracking_no)]
        tracking_no: Option<String>,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Send a MANUAL_REVIEW saga back to an intent state: automation asks the downstream again.
    /// Refused while a later saga of its order is in the table (it would run out of order).
    Retry {
        biz_id: String,
        /// The intent state to resume from: WMS_REQUESTED, LOGISTICS_REQUESTED, WMS_REVERSING or
        /// LOGISTICS_CANCELLING. Automation goes on as after any intent, its clock read at the
        /// retry: a downstream that can be queried is asked about our request id first; one that
        /// cannot but deduplicates is sent the step again under the same request id. For such a
        /// downstream check by hand that the first request did not apply (or is still within its
        /// deduplication window) before retrying; reversals are idempotent on our id.
        #[arg(long, value_parser = parse_retry)]
        from: Status,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Close a reconciliation ticket (step WMS_LEDGER or LOGISTICS_LEDGER) after dealing with it.
    CloseTicket {
        /// The ticket's key: a biz_id or `orphan:<request id>`.
        key: String,
        /// WMS_LEDGER or LOGISTICS_LEDGER.
        #[arg(long, value_parser = [midflight_store::WMS_LEDGER_STEP, midflight_store::LOGISTICS_LEDGER_STEP])]
        step: String,
        /// The finding dealt with: the ticket's evidence `fingerprint`, as `sagactl ticket KEY`
        /// shows it. Refused when the ticket holds another finding by now (a later pass
        /// reopened it): closing would accept that one unseen, for good.
        #[arg(long)]
        finding: String,
        #[arg(long, value_parser = parse_operator)]
        operator: String,
        #[arg(long, value_parser = parse_note)]
        note: String,
    },
    /// Compare the downstream ledgers with the table once and open tickets for mismatches.
    Reconcile,
    /// Apply the schema migrations the database lacks, then exit: the deploy job that owns the
    /// schema, run before the services start (which then need no `migrate_on_start`).
    Migrate,
}

/// What every write names: the version looked at, who, and why.
#[derive(Debug, clap::Args)]
struct WriteArgs {
    /// The version shown by `sagactl show`; the write is refused if the row moved on since.
    #[arg(long)]
    version: u64,
    /// Who decides (recorded in the transition log as `operator:<name>`).
    #[arg(long, value_parser = parse_operator)]
    operator: String,
    /// Why, for the transition log and the ticket's resolution.
    #[arg(long, value_parser = parse_note)]
    note: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sagactl: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(commands::Done::Ok) => ExitCode::SUCCESS,
        Ok(commands::Done::Refused) => ExitCode::from(EXIT_REFUSED),
        Err(error) => {
            eprintln!("sagactl: {error:#}");
            // A configuration that cannot be used is bad usage, as a bad flag is.
            if error.downcast_ref::<midflight_config::Error>().is_some() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn parse_status(text: &str) -> Result<Status, String> {
    Status::parse(&text.to_ascii_uppercase()).ok_or_else(|| {
        let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown status {text:?}; one of {}", names.join(", "))
    })
}

fn parse_resolution(text: &str) -> Result<Status, String> {
    match parse_status(text)? {
        status @ (Status::Done | Status::RolledBack) => Ok(status),
        other => Err(format!("resolve closes a saga as DONE or ROLLED_BACK, not {other}; use `retry` to resume it")),
    }
}

fn parse_retry(text: &str) -> Result<Status, String> {
    match parse_status(text)? {
        status if status.is_intent() => Ok(status),
        other => Err(format!(
            "retry resumes from an intent state (WMS_REQUESTED, LOGISTICS_REQUESTED, WMS_REVERSING, LOGISTICS_CANCELLING), not {other}"
        )),
    }
}

fn parse_operator(text: &str) -> Result<String, String> {
    let name = text.trim();
    if name.is_empty() || name.len() > OPERATOR_LEN_MAX || name.contains(char::is_whitespace) {
        return Err(format!("operator must be a name of 1..={OPERATOR_LEN_MAX} characters without spaces"));
    }
    Ok(name.to_owned())
}

fn parse_tracking_no(text: &str) -> Result<String, String> {
    let tracking_no = text.trim();
    let max = midflight_store::TRACKING_NO_LEN_MAX;
    if !midflight_model::tracking_no_fits(tracking_no) {
        return Err(format!("a tracking number is 1..={max} visible ASCII characters (no spaces)"));
    }
    Ok(tracking_no.to_owned())
}

fn parse_note(text: &str) -> Result<String, String> {
    let note = text.trim();
    if note.is_empty() || note.len() > NOTE_LEN_MAX {
        return Err(format!("note must say why, in 1..={NOTE_LEN_MAX} bytes"));
    }
    Ok(note.to_owned())
}
