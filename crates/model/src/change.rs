//! What the planner asks its caller to do: a change to write with one CAS, and the call to
//! make once it is durable.
//!
//! A [`Change`] is declarative; [`Change::apply`] turns it into the next row, checking every
//! status edge against the legal transitions, so the store never writes a row the model did not
//! produce. Writes that must be atomic with the status (the business row, the outbox row, a
//! ticket) travel in the same change and are written in the same transaction.

use crate::error::Error;
use crate::ids::{self, Step};
use crate::saga::Saga;
use crate::status::Status;

/// A downstream call. Each is only legal while the row is in its intent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    LockStock,
    QueryLock,
    ReverseLock,
    CreateShipment,
    QueryShipment,
    CancelShipment,
}

impl Call {
    pub const fn step(self) -> Step {
        match self {
            Call::LockStock | Call::QueryLock | Call::ReverseLock => Step::Wms,
            Call::CreateShipment | Call::QueryShipment | Call::CancelShipment => Step::Logistics,
        }
    }

    /// The status the row must be in when this call is sent: the durable intent.
    pub const fn intent(self) -> Status {
        match self {
            Call::LockStock | Call::QueryLock => Status::WmsRequested,
            Call::ReverseLock => Status::WmsReversing,
            Call::CreateShipment | Call::QueryShipment => Status::LogisticsRequested,
            Call::CancelShipment => Status::LogisticsCancelling,
        }
    }

    /// Whether the call can change the downstream (a query cannot).
    pub const fn has_effect(self) -> bool {
        !matches!(self, Call::QueryLock | Call::QueryShipment)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Call::LockStock => "LockStock",
            Call::QueryLock => "QueryLock",
            Call::ReverseLock => "ReverseLock",
            Call::CreateShipment => "CreateShipment",
            Call::QueryShipment => "QueryShipment",
            Call::CancelShipment => "CancelShipment",
        }
    }
}

/// A write to the business table, in the same transaction as the status change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusinessWrite {
    /// Step 1: the order's status transition (insert; the unique biz_id absorbs a repeat).
    Write,
    /// Mark the order shipped, with its tracking number.
    Fulfil,
    /// Undo step 1.
    Reverse,
}

/// A manual-review ticket to open (idempotent per biz_id and step). The store adds the row,
/// its transition log and the voucher as evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketDraft {
    pub step: Step,
    /// What a person must decide, in one sentence.
    pub reason: String,
    /// The downstream's last answer (or error) that led here.
    pub evidence: String,
}

/// A failed attempt: counted, and retried no earlier than `retry_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: String,
    pub retry_at_ms: i64,
}

/// A change to one saga row, written with one CAS in one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// Statuses passed through, in order; each must be a legal edge from the one before.
    /// Empty when only fields change (a failure, a restarted in-flight window).
    pub path: Vec<Status>,
    /// Why, for the transition log.
    pub reason: String,
    pub record_wms_intent: bool,
    pub record_logistics_intent: bool,
    pub wms_locked: bool,
    pub tracking_no: Option<String>,
    /// Restart the in-flight window: a request is about to be sent again.
    pub restart_intent_clock: bool,
    pub failure: Option<Failure>,
    /// Kept in `last_error` without counting an attempt (e.g. a rejection's reason).
    pub note: Option<String>,
    pub business: Option<BusinessWrite>,
    /// Write the notification's outbox row.
    pub notify: bool,
    pub ticket: Option<TicketDraft>,
    /// Give the lease up after writing: someone (maybe the recovery worker) resumes later.
    pub release_lease: bool,
}

/// So a map of first steps may carry more beside each change (`Store::receive` takes any).
impl AsRef<Change> for Change {
    fn as_ref(&self) -> &Change {
        self
    }
}

impl Change {
    pub fn to(path: &[Status], reason: impl Into<String>) -> Change {
        Change { path: path.to_vec(), reason: reason.into(), ..Change::default() }
    }

    /// The status the row has after this change.
    pub fn status_after(&self, before: Status) -> Status {
        self.path.last().copied().unwrap_or(before)
    }

    /// The `(from, to)` edges this change writes to the transition log, with their versions.
    pub fn edges(&self, before: &Saga) -> Vec<(Status, Status, u64)> {
        let mut from = before.status;
        let mut edges = Vec::with_capacity(self.path.len());
        for (index, &to) in self.path.iter().enumerate() {
            edges.push((from, to, before.version + 1 + index as u64));
            from = to;
        }
        edges
    }

    /// The next row. Fails, naming the saga, on an illegal status edge.
    /// The lease columns are the store's: it sets them from the database clock.
    pub fn apply(&self, before: &Saga, now_ms: i64) -> Result<Saga, Error> {
        self.check_edges(before, Status::can_transition)?;
        Ok(self.build(before, now_ms))
    }

    /// Like [`Change::apply`], for an operator's resolution of a MANUAL_REVIEW saga.
    pub fn apply_by_operator(&self, before: &Saga, now_ms: i64) -> Result<Saga, Error> {
        self.check_edges(before, Status::operator_can_transition)?;
        Ok(self.build(before, now_ms))
    }

    fn check_edges(&self, before: &Saga, legal: fn(Status, Status) -> bool) -> Result<(), Error> {
        let mut from = before.status;
        for &to in &self.path {
            if !legal(from, to) {
                return Err(Error::IllegalTransition { biz_id: before.biz_id.clone(), from, to });
            }
            from = to;
        }
        Ok(())
    }

    fn build(&self, before: &Saga, now_ms: i64) -> Saga {
        let mut next = before.clone();
        next.status = self.status_after(before.status);
        // Every change bumps the version; a fused change bumps it once per edge so each log row
        // has its own version.
        next.version = before.version + (self.path.len() as u64).max(1);
        next.updated_at_ms = now_ms;
        if !self.path.is_empty() {
            next.attempts = 0;
            next.next_attempt_at_ms = 0;
            next.last_error = None;
            if next.status.is_intent() {
                next.intent_at_ms = Some(now_ms);
            }
        }
        if self.record_wms_intent {
            next.wms_request_id = Some(ids::request_id(&before.biz_id, Step::Wms));
            next.wms_voucher = Some(ids::voucher(&before.biz_id, Step::Wms));
        }
        if self.record_logistics_intent {
            next.logistics_request_id = Some(ids::request_id(&before.biz_id, Step::Logistics));
            next.logistics_voucher = Some(ids::voucher(&before.biz_id, Step::Logistics));
        }
        if self.wms_locked {
            next.wms_locked_at_ms = Some(now_ms);
        }
        if let Some(tracking_no) = &self.tracking_no {
            next.tracking_no = Some(tracking_no.clone());
        }
        if self.restart_intent_clock {
            next.intent_at_ms = Some(now_ms);
        }
        if let Some(note) = &self.note {
            next.last_error = Some(note.clone());
        }
        if let Some(failure) = &self.failure {
            next.attempts = before.attempts.saturating_add(1);
            next.next_attempt_at_ms = failure.retry_at_ms;
            next.last_error = Some(failure.error.clone());
        }
        next
    }
}
