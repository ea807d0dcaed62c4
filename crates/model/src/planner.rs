//! The planner: `(row, observation, now, rules) -> plan`. Roll forward or roll back, decided once.
//!
//! The consumer and the recovery worker both call [`plan`] after loading a row, after each write
//! and after each downstream answer; neither has rules of its own. The rules (docs/design.md, Q2):
//!
//! - An unknown outcome (a `*_REQUESTED` row with nothing learned) is resolved by **asking the
//!   downstream about our request id**, never by acting again under a new key. Where the
//!   downstream cannot be asked, the [`Contract`] decides: resend with the same key if it
//!   deduplicates, else stop and open a ticket.
//! - Default is roll forward: the business wants the order fulfilled.
//! - Roll back only on a definitive business rejection or an expired deadline, and only while
//!   every completed step is reversible. An unknown outcome is only rolled back through a
//!   reversal that leaves a tombstone, so a late request cannot land afterwards.
//! - The point of no return is the shipment (a tracking number the customer may see): from
//!   there, forward only.
//! - Transport errors back off (bounded, capped); past the attempt limit a person decides.

use crate::change::{BusinessWrite, Call, Change, Failure, TicketDraft};
use crate::contract::{Contract, Rules};
use crate::ids::Step;
use crate::observation::{LogisticsAnswer, Observation, WmsAnswer};
use crate::saga::Saga;
use crate::status::Status::*;

/// What to do next with a saga the caller holds the lease of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Write `change` with one CAS; if it applies, make `then` (the intent is now durable).
    Write { change: Change, then: Option<Call> },
    /// Make the call; the row already records the intent.
    Call(Call),
    /// Terminal: nothing to do.
    Finished,
}

/// Decides the next step for `saga` given what the caller just learned.
pub fn plan(saga: &Saga, observation: &Observation, now_ms: i64, rules: &Rules) -> Plan {
    let ctx = Ctx { saga, now_ms, rules };
    match saga.status {
        Received => ctx.received(),
        DbWritten => ctx.db_written(),
        WmsRequested => ctx.wms_requested(observation),
        WmsConfirmed => ctx.wms_confirmed(),
        LogisticsRequested => ctx.logistics_requested(observation),
        LogisticsConfirmed => ctx.done("shipment confirmed"),
        LogisticsCancelling => ctx.logistics_cancelling(observation),
        WmsReversing => ctx.wms_reversing(observation),
        Done | RolledBack | ManualReview | Parked => Plan::Finished,
    }
}

struct Ctx<'a> {
    saga: &'a Saga,
    now_ms: i64,
    rules: &'a Rules,
}

impl Ctx<'_> {
    fn received(&self) -> Plan {
        if let Err(error) = self.saga.order() {
            let change = Change { note: Some(error.to_string()), ..Change::to(&[Parked], "payload invalid") };
            return Plan::Write { change, then: None };
        }
        if self.past_deadline() {
            return write(Change::to(&[RolledBack], "deadline passed before the business write"), None);
        }
        let change = Change {
            business: Some(BusinessWrite::Write),
            record_wms_intent: true,
            ..Change::to(&[DbWritten, WmsRequested], "business row written; wms intent recorded")
        };
        write(change, Some(Call::LockStock))
    }

    fn db_written(&self) -> Plan {
        // Nothing left the process yet (intents are durable before calls), so either way is safe.
        if self.past_deadline() {
            let change =
                Change { business: Some(BusinessWrite::Reverse), ..Change::to(&[RolledBack], "deadline passed") };
            return write(change, None);
        }
        let change = Change { record_wms_intent: true, ..Change::to(&[WmsRequested], "wms intent recorded") };
        write(change, Some(Call::LockStock))
    }

    fn wms_requested(&self, observation: &Observation) -> Plan {
        match observation {
            Observation::Wms(WmsAnswer::Locked) => self.wms_locked(),
            Observation::Wms(WmsAnswer::Rejected { reason }) => {
                self.roll_back_before_wms(&format!("wms rejected: {reason}"))
            }
            Observation::Wms(answer @ (WmsAnswer::Reversed | WmsAnswer::Tombstoned | WmsAnswer::NothingToReverse)) => {
                // Nothing is effective under our id and nothing can become so: the lock is dead.
                self.roll_back_before_wms(&format!("wms reports {answer:?} for our request id"))
            }
            Observation::Wms(WmsAnswer::NotFound) => self.not_found(Step::Wms),
            Observation::Unreachable { step: Step::Wms, error } => self.retry_later(Step::Wms, error),
            // Nothing learned, or an answer that does not fit this state: ask again.
            _ => self.unknown_outcome(Step::Wms),
        }
    }

    fn wms_locked(&self) -> Plan {
        if self.past_deadline() && self.rules.wms.reversible(self.now_ms, self.now_ms) {
            let change = Change {
                wms_locked: true,
                ..Change::to(&[WmsConfirmed, WmsReversing], "wms locked after the deadline")
            };
            return write(change, Some(Call::ReverseLock));
        }
        let change = Change {
            wms_locked: true,
            record_logistics_intent: true,
            ..Change::to(&[WmsConfirmed, LogisticsRequested], "wms locked; logistics intent recorded")
        };
        write(change, Some(Call::CreateShipment))
    }

    fn wms_confirmed(&self) -> Plan {
        if self.past_deadline() && self.wms_reversible() {
            return write(Change::to(&[WmsReversing], "deadline passed"), Some(Call::ReverseLock));
        }
        let change =
            Change { record_logistics_intent: true, ..Change::to(&[LogisticsRequested], "logistics intent recorded") };
        write(change, Some(Call::CreateShipment))
    }

    fn logistics_requested(&self, observation: &Observation) -> Plan {
        match observation {
            Observation::Logistics(
                LogisticsAnswer::Created { tracking_no } | LogisticsAnswer::Irreversible { tracking_no },
            ) => self.shipped(tracking_no),
            Observation::Logistics(LogisticsAnswer::Rejected { reason }) => {
                self.compensate_wms(&format!("logistics rejected: {reason}"))
            }
            Observation::Logistics(
                answer @ (LogisticsAnswer::Cancelled | LogisticsAnswer::Tombstoned | LogisticsAnswer::NothingToCancel),
            ) => self.compensate_wms(&format!("logistics reports {answer:?} for our request id")),
            Observation::Logistics(LogisticsAnswer::NotFound) => self.not_found(Step::Logistics),
            Observation::Unreachable { step: Step::Logistics, error } => self.retry_later(Step::Logistics, error),
            _ => self.unknown_outcome(Step::Logistics),
        }
    }

    fn logistics_cancelling(&self, observation: &Observation) -> Plan {
        match observation {
            Observation::Logistics(
                LogisticsAnswer::Cancelled
                | LogisticsAnswer::Tombstoned
                | LogisticsAnswer::NothingToCancel
                | LogisticsAnswer::Rejected { .. },
            ) => self.compensate_wms("no live shipment"),
            // The late request landed and was picked up before our cancel: past the point of
            // no return, so finish the order instead of undoing it.
            Observation::Logistics(
                LogisticsAnswer::Irreversible { tracking_no } | LogisticsAnswer::Created { tracking_no },
            ) => {
                let mut plan = self.shipped(tracking_no);
                if let Plan::Write { change, .. } = &mut plan {
                    change.reason = "shipment could not be cancelled; rolling forward".to_owned();
                }
                plan
            }
            Observation::Logistics(LogisticsAnswer::VoucherMismatch) => self.ticket(
                Step::Logistics,
                "logistics refused our cancel voucher; check the shipment by hand",
                observation,
            ),
            Observation::Unreachable { step: Step::Logistics, error } => self.retry_later(Step::Logistics, error),
            // Cancel is idempotent on our id: repeating it is the way to learn its outcome.
            _ => Plan::Call(Call::CancelShipment),
        }
    }

    fn wms_reversing(&self, observation: &Observation) -> Plan {
        match observation {
            Observation::Wms(
                WmsAnswer::Reversed | WmsAnswer::Tombstoned | WmsAnswer::NothingToReverse | WmsAnswer::Rejected { .. },
            ) => {
                let change =
                    Change { business: Some(BusinessWrite::Reverse), ..Change::to(&[RolledBack], "wms reversed") };
                write(change, None)
            }
            Observation::Wms(WmsAnswer::Irreversible { reason }) => self.ticket(
                Step::Wms,
                &format!("wms can no longer reverse the lock ({reason}); reverse it by hand with the voucher or fulfil the order"),
                observation,
            ),
            Observation::Wms(WmsAnswer::VoucherMismatch) => {
                self.ticket(Step::Wms, "wms refused our reversal voucher; check the lock by hand", observation)
            }
            Observation::Unreachable { step: Step::Wms, error } => self.retry_later(Step::Wms, error),
            // Reverse is idempotent on our id: repeating it is the way to learn its outcome.
            _ => Plan::Call(Call::ReverseLock),
        }
    }

    /// The row says a call may be in flight and nothing is known about it.
    fn unknown_outcome(&self, step: Step) -> Plan {
        let contract = self.contract(step);
        if contract.queryable {
            return Plan::Call(query(step));
        }
        if contract.deduplicates(self.intent_at(), self.now_ms) {
            if self.past_deadline() && self.can_roll_back(step) {
                // The reversal settles both cases: it undoes a landed request or tombstones a missing one.
                return self.reverse_unknown(step, "outcome unknown after the deadline");
            }
            return Plan::Call(send(step));
        }
        self.ticket(
            step,
            "outcome unknown: the downstream can neither be queried by our request id nor deduplicates it, so any resend could apply twice",
            &Observation::Nothing,
        )
    }

    /// The downstream says it never saw our request (yet).
    fn not_found(&self, step: Step) -> Plan {
        let contract = self.contract(step);
        if self.past_deadline() && self.can_roll_back(step) {
            return self.reverse_unknown(step, "not found after the deadline");
        }
        if contract.deduplicates(self.intent_at(), self.now_ms) {
            return Plan::Call(send(step));
        }
        // Not deduplicated: only resend once the first request can no longer land.
        let in_flight_until = contract.in_flight_until(self.intent_at());
        if self.now_ms >= in_flight_until {
            let change = Change { restart_intent_clock: true, ..Change::default() };
            return write(Change { reason: "in-flight window passed; resending".into(), ..change }, Some(send(step)));
        }
        // Each wait counts as a failed attempt: a downstream that answers not found to every
        // send as well (an unknown SKU it reports so) would otherwise be sent one a window for ever.
        let attempts = self.saga.attempts.saturating_add(1);
        if attempts >= self.rules.retry.attempts_max {
            return self.ticket(
                step,
                &format!(
                    "not found, after {attempts} failed attempts at this step (unreachable, or waiting out the in-flight window); ask the downstream"
                ),
                &Observation::Nothing,
            );
        }
        let failure =
            Failure { error: "not found; waiting out the in-flight window".into(), retry_at_ms: in_flight_until };
        write(Change { failure: Some(failure), release_lease: true, ..Change::default() }, None)
    }

    /// Reverse a request whose outcome is unknown; only called when the reversal tombstones.
    fn reverse_unknown(&self, step: Step, reason: &str) -> Plan {
        match step {
            Step::Wms => write(Change::to(&[WmsReversing], reason), Some(Call::ReverseLock)),
            Step::Logistics => write(Change::to(&[LogisticsCancelling], reason), Some(Call::CancelShipment)),
        }
    }

    /// Undo the business write; nothing is effective at any downstream.
    fn roll_back_before_wms(&self, reason: &str) -> Plan {
        let change = Change {
            business: Some(BusinessWrite::Reverse),
            note: Some(reason.to_owned()),
            ..Change::to(&[RolledBack], reason)
        };
        write(change, None)
    }

    /// No live shipment and the order cannot go forward: release the stock if still possible.
    fn compensate_wms(&self, reason: &str) -> Plan {
        if self.wms_reversible() {
            let change = Change { note: Some(reason.to_owned()), ..Change::to(&[WmsReversing], reason) };
            return write(change, Some(Call::ReverseLock));
        }
        self.ticket(
            Step::Wms,
            &format!("{reason}, and the wms lock can no longer be reversed by contract"),
            &Observation::Nothing,
        )
    }

    fn shipped(&self, tracking_no: &str) -> Plan {
        let mut plan = self.done("shipment created");
        if let Plan::Write { change, .. } = &mut plan {
            change.path.insert(0, LogisticsConfirmed);
            change.tracking_no = Some(tracking_no.to_owned());
        }
        plan
    }

    fn done(&self, reason: &str) -> Plan {
        let change = Change { business: Some(BusinessWrite::Fulfil), notify: true, ..Change::to(&[Done], reason) };
        write(change, None)
    }

    fn retry_later(&self, step: Step, error: &str) -> Plan {
        let attempts = self.saga.attempts.saturating_add(1);
        if attempts >= self.rules.retry.attempts_max {
            return self.ticket(
                step,
                &format!("gave up after {attempts} failed attempts; the outcome is unknown, ask the downstream"),
                &Observation::Unreachable { step, error: error.to_owned() },
            );
        }
        let retry_at_ms =
            self.now_ms.saturating_add(self.rules.retry.backoff_ms(self.saga.attempts, &self.saga.biz_id));
        let failure =
            Failure { error: format!("{} unreachable: {error}", step.as_str().to_ascii_lowercase()), retry_at_ms };
        write(Change { failure: Some(failure), release_lease: true, ..Change::default() }, None)
    }

    fn ticket(&self, step: Step, reason: &str, observation: &Observation) -> Plan {
        let ticket = TicketDraft { step, reason: reason.to_owned(), evidence: format!("{observation:?}") };
        let change =
            Change { ticket: Some(ticket), note: Some(reason.to_owned()), ..Change::to(&[ManualReview], reason) };
        write(change, None)
    }

    /// Every completed step can still be undone, and the pending `step` can be settled by a
    /// reversal that tombstones (so a late request cannot land after the rollback).
    fn can_roll_back(&self, step: Step) -> bool {
        let wms_ok = self.saga.wms_locked_at_ms.is_none() || self.wms_reversible();
        wms_ok && self.contract(step).tombstones
    }

    fn wms_reversible(&self) -> bool {
        let locked_at = self.saga.wms_locked_at_ms.unwrap_or(self.now_ms);
        self.rules.wms.reversible(locked_at, self.now_ms)
    }

    fn past_deadline(&self) -> bool {
        self.saga.past_deadline(self.now_ms)
    }

    fn intent_at(&self) -> i64 {
        self.saga.intent_at_ms.unwrap_or(self.saga.updated_at_ms)
    }

    fn contract(&self, step: Step) -> &Contract {
        self.rules.contract(step)
    }
}

fn write(change: Change, then: Option<Call>) -> Plan {
    Plan::Write { change, then }
}

fn query(step: Step) -> Call {
    match step {
        Step::Wms => Call::QueryLock,
        Step::Logistics => Call::QueryShipment,
    }
}

fn send(step: Step) -> Call {
    match step {
        Step::Wms => Call::LockStock,
        Step::Logistics => Call::CreateShipment,
    }
}
