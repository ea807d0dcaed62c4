//! Counterexamples and examples as a person reads them: one line per action, followed by the
//! parts of the state that matter (rows, drivers' tasks, packets in flight, WMS ledger).

use std::fmt::Write as _;

use stateright::Path;

use crate::model::Action;
use crate::state::{Driver, Packet, Seen, State, Task};

/// A path as numbered lines: `action  => state after`.
pub fn render(path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = String::new();
    if let Some((first, _)) = steps.first() {
        let _ = writeln!(out, " 0. (initial)  => {}", describe(first));
    }
    for (index, pair) in steps.windows(2).enumerate() {
        if let [(_, Some(action)), (after, _)] = pair {
            let _ = writeln!(out, "{:>2}. {:<28} => {}", index + 1, action_label(action), describe(after));
        }
    }
    out
}

/// The actions alone, one per line (what the tests print first).
pub fn actions(path: &Path<State, Action>) -> Vec<String> {
    path.clone().into_actions().iter().map(action_label).collect()
}

pub fn action_label(action: &Action) -> String {
    match action {
        Action::PollInsert(c) => format!("PollInsert({c:?})"),
        Action::PollCommit(c) => format!("PollCommit({c:?})"),
        Action::Insert(c) => format!("Insert({c:?})"),
        Action::Commit(c) => format!("Commit({c:?})"),
        Action::Step(d, m) => format!("Step({d:?}, m{m})"),
        Action::CallLogistics(d, m) => format!("CallLogistics({d:?}, m{m})"),
        Action::Timeout(d, m) => format!("Timeout({d:?}, m{m})"),
        Action::Claim(m) => format!("Claim(Recovery, m{m})"),
        Action::Deliver(p) => format!("Deliver {}", packet_label(p)),
        Action::DeliverRejecting(p) => format!("DeliverRejecting {}", packet_label(p)),
        Action::LeaseRunsOut(m) => format!("LeaseRunsOut(m{m})"),
        Action::DeadlinePasses => "DeadlinePasses".to_owned(),
        Action::Crash(d) => format!("FAULT Crash({d:?})"),
        Action::Evict(c) => format!("FAULT Evict({c:?})"),
        Action::Drop(p) => format!("FAULT Drop {}", packet_label(p)),
        Action::EarlyTimeout(d, m) => format!("FAULT EarlyTimeout({d:?}, m{m})"),
        Action::Pause(d, m) => format!("FAULT Pause({d:?}, m{m})"),
    }
}

fn packet_label(packet: &Packet) -> String {
    match packet {
        Packet::Request { msg, key, call, reply_to } => {
            let to = reply_to.map_or_else(|| "nobody".to_owned(), |d| format!("{d:?}"));
            format!("{call:?}(m{msg} key{key})->WMS reply-to {to}")
        }
        Packet::Response { to, msg, reply } => format!("{reply:?}(m{msg})->{to:?}"),
    }
}

/// The state in one line.
pub fn describe(state: &State) -> String {
    let mut out = String::new();
    let _ = write!(out, "{}", if state.after_deadline { "after-deadline" } else { "before-deadline" });
    let _ = write!(out, " | kafka owner={:?} committed={}", state.kafka.owner, state.kafka.committed);
    for msg in 0..state.messages() {
        match state.row(msg) {
            Some(row) => {
                let saga = &row.saga;
                let lease = if row.lease_live { "live" } else { "expired" };
                let _ = write!(out, " | m{msg} row {} v{} e{} {lease}", saga.status, saga.version, saga.lease.epoch);
            }
            None => {
                let _ = write!(out, " | m{msg} no row");
            }
        }
        for driver in Driver::ALL {
            if let Some(task) = state.task(driver, msg) {
                let _ = write!(out, "; {driver:?}:{}", task_label(task));
            }
        }
    }
    if !state.net.is_empty() {
        let packets: Vec<String> = state.net.iter().map(packet_label).collect();
        let _ = write!(out, " | net [{}]", packets.join(", "));
    }
    if !state.wms.is_empty() {
        let records: Vec<String> = state.wms.iter().map(|r| format!("m{} key{} {:?}", r.msg, r.key, r.state)).collect();
        let _ = write!(out, " | wms [{}]", records.join(", "));
    }
    out
}

fn task_label(task: &Task) -> String {
    let saga = &task.row;
    let mut label = format!("{} v{} e{}", saga.status, saga.version, saga.lease.epoch);
    if let Some(call) = task.waiting {
        let _ = write!(label, " waiting {}", call.name());
    } else if task.seen != Seen::Nothing {
        let _ = write!(label, " saw {:?}", task.seen);
    }
    label
}
