//! The drivers (both consumers and the recovery worker) and the database's compare-and-set.
//!
//! Every decision is the real planner's: a driver holding a task calls
//! [`midflight_model::plan`] on its own copy of the row, turns a `Change` into the next row
//! with the real [`midflight_model::Change::apply`], writes it with a CAS on (version, lease
//! epoch), and only then sends the call the plan names, under the deterministic request id.
//! A CAS that matches nothing ends the task at once: the driver sends nothing more. A takeover
//! is a CAS on an expired lease that bumps epoch and version. Planted bug (a) turns the CAS
//! into a blind write; bug (d) makes a timed-out LockStock go out again under a new key.

use midflight_model::{Call, Change, Plan, Saga, plan};

use crate::downstream;
use crate::model::{Action, ProtocolModel};
use crate::state::{Driver, Notable, Packet, Row, Seen, Snapshot, State, Task, WmsCall};

pub fn progress_actions(model: &ProtocolModel, state: &State, out: &mut Vec<Action>) {
    for driver in Driver::ALL {
        for msg in 0..state.messages() {
            let Some(task) = state.task(driver, msg) else { continue };
            match task.waiting {
                None => out.push(Action::Step(driver, msg)),
                Some(call) if WmsCall::of(call).is_none() => out.push(Action::CallLogistics(driver, msg)),
                Some(_) if !state.exchange_in_flight(driver, msg) => out.push(Action::Timeout(driver, msg)),
                Some(_) => {}
            }
        }
    }
    for msg in 0..state.messages() {
        let Some(row) = state.row(msg) else { continue };
        let open = !row.saga.status.is_terminal();
        if open && !row.lease_live && state.task(Driver::Recovery, msg).is_none() {
            out.push(Action::Claim(msg));
        }
        if open && row.lease_live && holder(state, msg).is_none() {
            out.push(Action::LeaseRunsOut(msg));
        }
    }
    for (at, packet) in state.net.iter().enumerate() {
        // The net is a sorted multiset: deliver one copy of each distinct packet.
        if at > 0 && state.net.get(at - 1) == Some(packet) {
            continue;
        }
        out.push(Action::Deliver(*packet));
        if model.config.wms_may_reject
            && let Packet::Request { msg, key, call: WmsCall::Lock, .. } = *packet
            && state.lock(msg, key).is_none()
        {
            out.push(Action::DeliverRejecting(*packet));
        }
    }
}

pub fn fault_actions(model: &ProtocolModel, state: &State, out: &mut Vec<Action>) {
    let bounds = &model.config.bounds;
    if state.spent.drops < bounds.drops_max {
        for (at, packet) in state.net.iter().enumerate() {
            if at == 0 || state.net.get(at - 1) != Some(packet) {
                out.push(Action::Drop(*packet));
            }
        }
    }
    for driver in Driver::ALL {
        for msg in 0..state.messages() {
            let Some(task) = state.task(driver, msg) else { continue };
            let on_wms = task.waiting.and_then(WmsCall::of).is_some();
            if on_wms && state.spent.early_timeouts < bounds.early_timeouts_max && state.exchange_in_flight(driver, msg)
            {
                out.push(Action::EarlyTimeout(driver, msg));
            }
            if state.spent.pauses < bounds.pauses_max && holder(state, msg) == Some(driver) {
                out.push(Action::Pause(driver, msg));
            }
        }
    }
}

/// The driver that holds the current, live lease of `msg`'s row and is still running, if any.
fn holder(state: &State, msg: u8) -> Option<Driver> {
    let row = state.row(msg)?;
    if !row.lease_live || row.saga.status.is_terminal() {
        return None;
    }
    Driver::ALL.into_iter().find(|&d| state.task(d, msg).is_some_and(|t| t.row.lease.epoch == row.epoch()))
}

/// The lease runs out: nobody drives the row any more (or its holder stalled: `Pause`).
pub fn expire(state: &mut State, msg: u8) {
    if let Some(row) = state.row_mut(msg) {
        row.lease_live = false;
    }
}

/// A crashed driver loses every task; its calls in flight may still land, unanswered.
pub fn crash(state: &mut State, driver: Driver) {
    for msg in 0..state.messages() {
        if state.task(driver, msg).is_some() {
            state.abandon_exchange(driver, msg);
            state.set_task(driver, msg, None);
        }
    }
}

/// Takeover: `UPDATE ... SET lease_epoch = lease_epoch + 1, version = version + 1, owner_id = ?
/// WHERE lease expired AND status not terminal`. The caller has checked the WHERE clause.
pub fn takeover(state: &mut State, driver: Driver, msg: u8) {
    let now_ms = ProtocolModel::now_ms(state);
    let rpc_in_flight = state.net.iter().any(|p| p.msg() == msg)
        || Driver::ALL.into_iter().any(|d| state.task(d, msg).is_some_and(|t| t.waiting.is_some()));
    let Some(row) = state.row_mut(msg) else { return };
    let mut saga = Saga::clone(&row.saga);
    saga.lease.epoch += 1;
    saga.lease.owner_id = Some(driver.owner_id().to_owned());
    saga.version += 1;
    saga.updated_at_ms = now_ms;
    let snapshot = Snapshot::new(saga);
    *row = Row { saga: snapshot.clone(), lease_live: true };
    state.set_task(driver, msg, Some(Task { row: snapshot, seen: Seen::Nothing, waiting: None, key: 0 }));
    if rpc_in_flight {
        state.last = Some(Notable::TakeoverDuringRpc);
    }
}

/// One turn of a driver: ask the real planner, then do exactly what it says.
pub fn step(model: &ProtocolModel, state: &mut State, driver: Driver, msg: u8) {
    let Some(task) = state.task(driver, msg).cloned() else { return };
    let now_ms = ProtocolModel::now_ms(state);
    match plan(&task.row, &task.seen.observation(), now_ms, &model.rules) {
        Plan::Finished => state.set_task(driver, msg, None),
        Plan::Call(call) => send(model, state, driver, msg, call),
        Plan::Write { change, then } => write(model, state, driver, msg, &task, &change, then),
    }
}

/// The CAS: `UPDATE saga SET ... WHERE biz_id = ? AND version = ? AND lease_epoch = ?`.
fn write(
    model: &ProtocolModel,
    state: &mut State,
    driver: Driver,
    msg: u8,
    task: &Task,
    change: &Change,
    then: Option<Call>,
) {
    let now_ms = ProtocolModel::now_ms(state);
    let Ok(next) = change.apply(&task.row, now_ms) else {
        // The planner proposed an illegal edge: a model-crate bug, reported by a property.
        state.ghost.illegal_change = true;
        state.set_task(driver, msg, None);
        return;
    };
    let Some(stored) = state.row(msg) else { return };
    let matches = stored.saga.version == task.row.version && stored.epoch() == task.row.lease.epoch;
    let stale = task.row.lease.epoch < stored.epoch();
    let was_terminal = stored.saga.status.is_terminal();
    if !matches && !model.config.bugs.blind_writes {
        // Conflict: someone else owns the saga now. Stop at once, send nothing.
        state.set_task(driver, msg, None);
        if stale {
            state.last = Some(Notable::ZombieRefused);
        }
        return;
    }
    state.ghost.stale_write_accepted |= stale;
    state.ghost.terminal_overwritten |= was_terminal;
    let snapshot = Snapshot::new(next);
    if let Some(row) = state.row_mut(msg) {
        *row = Row { saga: snapshot.clone(), lease_live: !change.release_lease };
    }
    if change.release_lease {
        // The driver gives the saga up; whoever claims it later resumes from the row.
        state.set_task(driver, msg, None);
        return;
    }
    state.set_task(driver, msg, Some(Task { row: snapshot, seen: Seen::Nothing, waiting: None, key: task.key }));
    if let Some(call) = then {
        send(model, state, driver, msg, call);
    }
}

/// Sends `call` for the driver's task: only from the call's intent state, under the
/// deterministic request id recorded in the row.
fn send(model: &ProtocolModel, state: &mut State, driver: Driver, msg: u8, call: Call) {
    let Some(task) = state.task(driver, msg) else { return };
    let legal = task.row.status == call.intent() && model.records_deterministic_ids(&task.row, msg, call.step());
    let key = task.key;
    state.ghost.call_without_intent |= !legal;
    if let Some(task) = state.task_mut(driver, msg) {
        task.waiting = Some(call);
    }
    if let Some(wms_call) = WmsCall::of(call) {
        state.send(Packet::Request { msg, key, call: wms_call, reply_to: Some(driver) });
    }
}

/// The ideal logistics provider answers at once.
pub fn call_logistics(state: &mut State, driver: Driver, msg: u8) {
    let Some(call) = state.task(driver, msg).and_then(|t| t.waiting) else { return };
    let reply = match call {
        Call::CreateShipment => downstream::create_shipment(state, msg),
        Call::QueryShipment => downstream::query_shipment(state, msg),
        Call::CancelShipment => downstream::cancel_shipment(state, msg),
        Call::LockStock | Call::QueryLock | Call::ReverseLock => return,
    };
    if let Some(task) = state.task_mut(driver, msg) {
        task.seen = Seen::Logistics(reply);
        task.waiting = None;
    }
}

/// A WMS call got no answer. The correct driver hands "unreachable" to the planner (which
/// records the failure and resolves the outcome later by query). Bug (d) resends a LockStock
/// at once under a fresh key, as the incident's consumer effectively did.
pub fn timeout(model: &ProtocolModel, state: &mut State, driver: Driver, msg: u8) {
    let Some(waiting) = state.task(driver, msg).and_then(|t| t.waiting) else { return };
    if model.config.bugs.resend_new_key && waiting == Call::LockStock {
        state.fresh_keys += 1;
        let key = state.fresh_keys;
        if let Some(task) = state.task_mut(driver, msg) {
            task.key = key;
        }
        state.send(Packet::Request { msg, key, call: WmsCall::Lock, reply_to: Some(driver) });
        return;
    }
    if let Some(task) = state.task_mut(driver, msg) {
        task.seen = Seen::WmsUnreachable;
        task.waiting = None;
    }
}

/// The network hands over one packet: a request reaches the WMS (which answers the caller,
/// if it is still listening), or an answer reaches its caller.
pub fn deliver(model: &ProtocolModel, state: &mut State, packet: Packet, reject: bool) {
    if !state.take(&packet) {
        return;
    }
    match packet {
        Packet::Request { msg, key, call, reply_to } => {
            let no_tombstone = model.config.bugs.no_tombstone;
            let (reply, refused_by_tombstone) = downstream::wms(state, msg, key, call, reject, no_tombstone);
            if refused_by_tombstone {
                state.last = Some(Notable::TombstoneRefusedLock);
            }
            if let Some(to) = reply_to {
                state.send(Packet::Response { to, msg, reply });
            }
        }
        Packet::Response { to, msg, reply } => {
            if let Some(task) = state.task_mut(to, msg)
                && task.waiting.and_then(WmsCall::of).is_some()
            {
                task.seen = Seen::Wms(reply);
                task.waiting = None;
            }
        }
    }
}
