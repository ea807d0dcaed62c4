//! The six invariants (ARCHITECTURE.md, I1-I6), one function each, each adding violations to the
//! report.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use midflight_model::{Saga, Status, Step, request_id};
use midflight_store::{OPERATOR_ACTOR, TicketState, Transition};

use crate::effects::{Effects, replay};
use crate::{Expected, Report, Snapshot, Violation};

/// Both ledgers replayed.
pub struct LedgerEffects {
    pub wms: Effects,
    pub logistics: Effects,
}

fn violation(report: &mut Report, invariant: &'static str, biz_id: &str, message: String, evidence: String) {
    report.violations.push(Violation { invariant, biz_id: biz_id.to_owned(), message, evidence });
}

/// I1: for each biz_id at most one lock and one shipment made, in force or undone since (a
/// second one under its request id, held at once or made again after the first was undone,
/// is the effect repeated); no effect made under a request id that no saga sent, undone since
/// or not (the ids are derived from the biz_id, so such an effect is a step run again under a
/// key of its own, whatever the order's other sagas did); for each order no more effects in
/// force than it has sagas; no effect applied after its tombstone.
pub fn at_most_once(snapshot: &Snapshot, expected: &Expected, report: &mut Report) -> LedgerEffects {
    let effects = LedgerEffects { wms: replay(&snapshot.wms_ledger), logistics: replay(&snapshot.logistics_ledger) };
    let mut sagas_per_order: BTreeMap<&str, usize> = BTreeMap::new();
    for biz_id in &expected.orders {
        let order_no = biz_id.split_once(':').map_or(biz_id.as_str(), |(order, _)| order);
        *sagas_per_order.entry(order_no).or_default() += 1;
    }
    let sagas: BTreeSet<&str> =
        expected.orders.iter().map(String::as_str).chain(snapshot.sagas.iter().map(|s| s.biz_id.as_str())).collect();
    for (name, step, ledger) in
        [("wms lock", Step::Wms, &effects.wms), ("shipment", Step::Logistics, &effects.logistics)]
    {
        let sent: BTreeSet<String> = sagas.iter().map(|biz_id| request_id(biz_id, step)).collect();
        let mut unowned: BTreeSet<&str> = BTreeSet::new();
        // Every effect made under a request id no saga sent is one too many, undone since or not.
        for (request, &applied) in &ledger.applied {
            if sent.contains(request) {
                continue;
            }
            report.duplicate_effects += applied;
            let in_force = ledger.by_request.get(request).map(Vec::as_slice).unwrap_or_default();
            unowned.extend(in_force.iter().map(String::as_str));
            let message =
                format!("{applied} {name}(s) made under a request id no saga sent, {} in force", in_force.len());
            violation(report, "I1", request, message, format!("{request}: {in_force:?}"));
        }
        // Under one of ours, every effect after the first was made again: held at once, or
        // made again after it was undone.
        for biz_id in &expected.orders {
            let request = request_id(biz_id, step);
            let applied = ledger.applied(&request);
            if applied > 1 {
                report.duplicate_effects += applied - 1;
                let in_force = ledger.in_force(&request);
                let evidence = format!("{request}: {:?}", ledger.by_request.get(&request));
                let message = format!("{name} made {applied} times under one request id, {in_force} in force");
                violation(report, "I1", biz_id, message, evidence);
            }
        }
        // Repeats under one of our request ids, counted above, by order (one pass, not one
        // per order: a benchmark's run checks a hundred thousand orders).
        let mut repeats_per_order: HashMap<&str, usize> = HashMap::new();
        for biz_id in &expected.orders {
            if let Some((order_no, _)) = biz_id.split_once(':') {
                let repeats = ledger.in_force(&request_id(biz_id, step)).saturating_sub(1);
                *repeats_per_order.entry(order_no).or_default() += repeats;
            }
        }
        for (order_no, ids) in &ledger.by_order {
            let allowed = sagas_per_order.get(order_no.as_str()).copied().unwrap_or(0);
            // Repeats under one of our request ids, and effects under ids no saga sent, were
            // counted above; count only the rest.
            let counted = repeats_per_order.get(order_no.as_str()).copied().unwrap_or(0);
            let owned = ids.iter().filter(|id| !unowned.contains(id.as_str())).count();
            let excess = owned.saturating_sub(allowed).saturating_sub(counted);
            if excess > 0 {
                report.duplicate_effects += excess;
                let message = format!("{owned} {name}s in force for an order with {allowed} saga(s)");
                violation(report, "I1", order_no, message, format!("effects {ids:?}"));
            }
        }
        for request in &ledger.applied_after_tombstone {
            violation(report, "I4", request, format!("{name} applied after its tombstone"), request.clone());
        }
    }
    effects
}

/// I2: every accepted message has a row in a terminal state; MANUAL_REVIEW has an open ticket;
/// PARKED keeps its error, and only poison is parked.
pub fn nothing_lost(snapshot: &Snapshot, expected: &Expected, report: &mut Report) {
    let rows: BTreeMap<&str, &Saga> = snapshot.sagas.iter().map(|s| (s.biz_id.as_str(), s)).collect();
    let open_tickets: BTreeSet<&str> =
        snapshot.tickets.iter().filter(|t| t.state == TicketState::Open).map(|t| t.biz_id.as_str()).collect();
    for biz_id in &expected.orders {
        if let Some(saga) = rows.get(biz_id.as_str()).filter(|s| s.status == Status::Parked) {
            let evidence = saga.last_error.clone().unwrap_or_default();
            violation(report, "I2", biz_id, "a valid order was parked as poison".into(), evidence);
        }
    }
    for biz_id in expected.orders.iter().chain(&expected.poison) {
        match rows.get(biz_id.as_str()) {
            None => {
                report.lost += 1;
                violation(report, "I2", biz_id, "accepted message has no saga row".into(), "no row".into());
            }
            Some(saga) if !saga.status.is_terminal() => {
                report.lost += 1;
                let evidence = format!("status {} attempts {} error {:?}", saga.status, saga.attempts, saga.last_error);
                violation(report, "I2", biz_id, "saga not terminal at quiescence".into(), evidence);
            }
            Some(saga) if saga.status == Status::ManualReview && !open_tickets.contains(biz_id.as_str()) => {
                violation(report, "I2", biz_id, "MANUAL_REVIEW without an open ticket".into(), String::new());
            }
            Some(saga) if saga.status == Status::Parked && saga.last_error.as_deref().unwrap_or("").is_empty() => {
                violation(report, "I2", biz_id, "PARKED without its error".into(), String::new());
            }
            Some(_) => {}
        }
    }
}

/// I3: DONE and ROLLED_BACK mean what they say, in every system; only a DONE saga has an
/// outbox row or a published notification.
pub fn consistent_end_states(snapshot: &Snapshot, effects: &LedgerEffects, report: &mut Report) {
    let orders: BTreeMap<&str, &midflight_store::OrderRow> =
        snapshot.orders.iter().map(|o| (o.biz_id.as_str(), o)).collect();
    let outbox: BTreeSet<&str> = snapshot.outbox.iter().map(|(b, _)| b.as_str()).collect();
    let notified: Option<BTreeSet<&str>> =
        snapshot.notifications.as_ref().map(|n| n.iter().map(String::as_str).collect());
    // Sagas a person closed as DONE after settling them by hand, which may have been outside
    // the downstreams' ledgers we read: what the close writes is required of them, and a
    // shipment under our request id must be the one it names.
    let closed_by_hand: BTreeSet<&str> = snapshot
        .transitions
        .iter()
        .filter(|t| t.to == Status::Done && t.actor.starts_with(OPERATOR_ACTOR))
        .map(|t| t.biz_id.as_str())
        .collect();
    for saga in &snapshot.sagas {
        let id = saga.biz_id.as_str();
        let locks = effects.wms.in_force(&request_id(id, Step::Wms));
        let shipments = effects.logistics.in_force(&request_id(id, Step::Logistics));
        let order = orders.get(id);
        let evidence = format!("locks {locks} shipments {shipments} order {order:?}");
        match saga.status {
            Status::Done => {
                let shipped = order.is_some_and(|o| o.status == "SHIPPED" && o.tracking_no == saga.tracking_no);
                let tracked = effects
                    .logistics
                    .by_request
                    .get(&request_id(id, Step::Logistics))
                    .is_some_and(|ids| saga.tracking_no.as_ref().is_some_and(|t| ids.contains(t)));
                if closed_by_hand.contains(id) {
                    // A shipment under our request id must be the one the order names.
                    if !shipped || !outbox.contains(id) || (shipments > 0 && !tracked) {
                        let message = "DONE by an operator without a SHIPPED order (its tracking number, our shipment's if there is one) and an outbox row";
                        violation(
                            report,
                            "I3",
                            id,
                            message.into(),
                            format!("{evidence} outbox {}", outbox.contains(id)),
                        );
                    }
                } else if locks != 1 || shipments != 1 || !shipped || !tracked || !outbox.contains(id) {
                    let message = "DONE without exactly one lock, one shipment (its tracking number), a SHIPPED order and an outbox row";
                    violation(report, "I3", id, message.into(), format!("{evidence} outbox {}", outbox.contains(id)));
                }
                if let Some(notified) = &notified
                    && !notified.contains(id)
                {
                    violation(report, "I3", id, "DONE but no notification was published".into(), String::new());
                }
            }
            Status::RolledBack => {
                let reversed = order.is_none_or(|o| o.status == "REVERSED");
                if locks != 0 || shipments != 0 || !reversed {
                    let message = "ROLLED_BACK with an effect in force or the business row not reversed";
                    violation(report, "I3", id, message.into(), evidence);
                }
            }
            _ => {}
        }
        // A saga with no row at all is I2's.
        if saga.status != Status::Done {
            let status = saga.status;
            if outbox.contains(id) {
                violation(report, "I3", id, format!("an outbox row for a saga that is {status}"), String::new());
            }
            if notified.as_ref().is_some_and(|notified| notified.contains(id)) {
                violation(report, "I3", id, format!("a notification for a saga that is {status}"), String::new());
            }
        }
    }
}

/// I4: per saga, the log is one chain: versions increase, each edge is legal, a takeover
/// raises the epoch and every other write keeps it (the epoch changes only by a takeover, so a
/// write by an older epoch after a newer one is a zombie getting through, and a takeover that
/// did not raise it leaves the previous holder unfenced).
pub fn fenced_owners(snapshot: &Snapshot, report: &mut Report) {
    let logs = by_saga(&snapshot.transitions);
    // Every change of a row's status or epoch is logged with it, so a row's log ends where
    // the row is (a lease renewal bumps the version alone, unlogged).
    for saga in &snapshot.sagas {
        match logs.get(saga.biz_id.as_str()).and_then(|log| log.last()) {
            None => violation(report, "I4", &saga.biz_id, "a saga row without a log".into(), String::new()),
            Some(last) if last.to != saga.status || last.lease_epoch != saga.lease.epoch => {
                let evidence = format!(
                    "log ends at v{} {} epoch {}, the row is {} epoch {}",
                    last.version, last.to, last.lease_epoch, saga.status, saga.lease.epoch
                );
                violation(report, "I4", &saga.biz_id, "the log does not end where the row is".into(), evidence);
            }
            Some(_) => {}
        }
    }
    for (biz_id, log) in logs {
        let mut previous: Option<&Transition> = None;
        // Who wrote under each epoch: the holder that took it (or the arrival's), alone. An
        // operator's write names the epoch it found and leaves the lease free.
        let mut holders: BTreeMap<u64, &Transition> = BTreeMap::new();
        for row in log.iter().filter(|t| !t.actor.starts_with(OPERATOR_ACTOR)) {
            let holder = *holders.entry(row.lease_epoch).or_insert(row);
            if holder.actor != row.actor {
                let evidence = format!(
                    "epoch {}: {} at v{}, {} at v{}",
                    row.lease_epoch, holder.actor, holder.version, row.actor, row.version
                );
                violation(report, "I4", biz_id, "two actors wrote under one epoch".into(), evidence);
            }
        }
        for row in log {
            if let Some(before) = previous {
                let message = if row.lease_epoch < before.lease_epoch {
                    Some("a write with a stale epoch was accepted")
                } else if row.is_takeover() && row.lease_epoch == before.lease_epoch {
                    Some("a takeover that did not raise the epoch")
                } else if !row.is_takeover() && row.lease_epoch > before.lease_epoch {
                    Some("a write under an epoch no takeover gave")
                } else {
                    None
                };
                if let Some(message) = message {
                    let evidence = format!(
                        "v{} epoch {} after v{} epoch {}",
                        row.version, row.lease_epoch, before.version, before.lease_epoch
                    );
                    violation(report, "I4", biz_id, message.into(), evidence);
                }
                let chained = row.from == Some(before.to);
                let legal = row.is_takeover()
                    || row.from.is_some_and(|f| f.can_transition(row.to) || f.operator_can_transition(row.to));
                if !chained || !legal {
                    let evidence = format!("v{}: {:?} -> {} after {}", row.version, row.from, row.to, before.to);
                    violation(report, "I4", biz_id, "transition log is not one legal chain".into(), evidence);
                }
            }
            previous = Some(row);
        }
    }
}

/// I5: sagas of one order (on one partition) run one at a time, in offset order.
pub fn per_order_order(snapshot: &Snapshot, report: &mut Report) {
    let logs = by_saga(&snapshot.transitions);
    let mut by_order: BTreeMap<(&str, &str, i32), Vec<&Saga>> = BTreeMap::new();
    for saga in snapshot.sagas.iter().filter(|s| !s.order_no.is_empty()) {
        by_order.entry((&saga.order_no, &saga.source.topic, saga.source.partition)).or_default().push(saga);
    }
    for sagas in by_order.values_mut() {
        sagas.sort_by_key(|s| s.source.offset);
        // Each saga against every earlier one, not only the one before it: an earlier saga
        // that never started (parked) ends at once and would hide an overlap with the one
        // before it.
        let runs: Vec<Run> = sagas.iter().map(|saga| Run::of(logs.get(saga.biz_id.as_str()))).collect();
        for (n, &second) in sagas.iter().enumerate() {
            let started = logs.get(second.biz_id.as_str()).and_then(|log| {
                log.iter().find(|t| t.from == Some(Status::Received) && t.to != Status::Parked).map(|t| t.at_ms)
            });
            let Some(started) = started else { continue };
            let overlapping =
                sagas[..n].iter().zip(&runs).find(|(_, run)| run.ended.is_none_or(|ended| ended > started));
            if let Some((first, run)) = overlapping {
                let (message, evidence) = match run.sent_back {
                    Some(back) if back >= started => (
                        "an earlier saga of its order was sent back to automation after it started",
                        format!("{} started at {started}, {} sent back at {back}", second.biz_id, first.biz_id),
                    ),
                    _ => (
                        "started before an earlier saga of its order ended",
                        format!("{} started at {started}, {} ended at {:?}", second.biz_id, first.biz_id, run.ended),
                    ),
                };
                violation(report, "I5", &second.biz_id, message.into(), evidence);
            }
        }
    }
}

/// When a saga last ran, from its log.
struct Run {
    /// When it last reached a terminal state from a running one: its first terminal state,
    /// or, after an operator sent it back to automation, the one it reached after that.
    /// `None` while it runs (or without a log).
    ended: Option<i64>,
    /// When an operator last sent it back from a terminal state (MANUAL_REVIEW) to automation.
    sent_back: Option<i64>,
}

impl Run {
    fn of(log: Option<&Vec<&Transition>>) -> Run {
        let mut run = Run { ended: None, sent_back: None };
        for t in log.into_iter().flatten().filter(|t| !t.is_takeover()) {
            match (t.from.is_some_and(Status::is_terminal), t.to.is_terminal()) {
                (false, true) => run.ended = Some(t.at_ms),
                (true, false) => (run.ended, run.sent_back) = (None, Some(t.at_ms)),
                _ => {}
            }
        }
        run
    }
}

/// I6: poison is parked with its error (and copied to the dead-letter topic).
pub fn poison_parked(snapshot: &Snapshot, expected: &Expected, report: &mut Report) {
    let rows: BTreeMap<&str, &Saga> = snapshot.sagas.iter().map(|s| (s.biz_id.as_str(), s)).collect();
    let dead: Option<BTreeSet<&str>> = snapshot.dead_letters.as_ref().map(|d| d.iter().map(String::as_str).collect());
    for biz_id in &expected.poison {
        if rows.get(biz_id.as_str()).is_some_and(|s| s.status != Status::Parked) {
            violation(report, "I6", biz_id, "poison message not parked".into(), String::new());
        }
        if let Some(dead) = &dead
            && !dead.contains(biz_id.as_str())
        {
            violation(report, "I6", biz_id, "poison message not on the dead-letter topic".into(), String::new());
        }
    }
}

fn by_saga(transitions: &[Transition]) -> BTreeMap<&str, Vec<&Transition>> {
    let mut map: BTreeMap<&str, Vec<&Transition>> = BTreeMap::new();
    for row in transitions {
        map.entry(row.biz_id.as_str()).or_default().push(row);
    }
    for log in map.values_mut() {
        log.sort_by_key(|t| t.version);
    }
    map
}
