//! The saga's status enum and the legal transitions between statuses.
//!
//! The `*_REQUESTED` and compensation statuses are *intent* states: the row says, durably,
//! "a call with this request id may be in flight". Every call to a downstream is sent only
//! while the row is in the matching intent state, so after a crash the row tells recovery
//! exactly which question to ask the downstream.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a saga is. Stored as the upper-case name in the `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// The message is durable in the inbox; nothing else has happened.
    Received,
    /// The business row is written; nothing has been sent to the WMS.
    DbWritten,
    /// Intent: a `LockStock` with our request id and voucher may be in flight.
    WmsRequested,
    /// The WMS answered LOCKED for our request id.
    WmsConfirmed,
    /// Intent: a `CreateShipment` with our request id may be in flight.
    LogisticsRequested,
    /// The logistics provider allocated a tracking number: the point of no return.
    LogisticsConfirmed,
    /// Business row, one stock lock, one shipment and one outbox row exist.
    Done,
    /// Compensation intent: a `CancelShipment` (tombstoning an unknown id) may be in flight.
    LogisticsCancelling,
    /// Compensation intent: a `ReverseLock` (tombstoning an unknown id) may be in flight.
    WmsReversing,
    /// Business row reversed or never written, no effective lock, no live shipment.
    RolledBack,
    /// Automation stopped; a ticket holds the evidence a person needs.
    ManualReview,
    /// Poison input: the payload cannot be processed; the error is kept with it.
    Parked,
}

impl Status {
    /// Every status, in pipeline order.
    pub const ALL: [Status; 12] = [
        Status::Received,
        Status::DbWritten,
        Status::WmsRequested,
        Status::WmsConfirmed,
        Status::LogisticsRequested,
        Status::LogisticsConfirmed,
        Status::Done,
        Status::LogisticsCancelling,
        Status::WmsReversing,
        Status::RolledBack,
        Status::ManualReview,
        Status::Parked,
    ];

    /// The statuses no automated actor moves a saga out of.
    pub const TERMINAL: [Status; 4] = [Status::Done, Status::RolledBack, Status::ManualReview, Status::Parked];

    /// The terminal statuses that need nobody: nothing leaves them, not even an operator's
    /// action, so their rows are what a purge may delete.
    pub const FINISHED: [Status; 2] = [Status::Done, Status::RolledBack];

    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Received => "RECEIVED",
            Status::DbWritten => "DB_WRITTEN",
            Status::WmsRequested => "WMS_REQUESTED",
            Status::WmsConfirmed => "WMS_CONFIRMED",
            Status::LogisticsRequested => "LOGISTICS_REQUESTED",
            Status::LogisticsConfirmed => "LOGISTICS_CONFIRMED",
            Status::Done => "DONE",
            Status::LogisticsCancelling => "LOGISTICS_CANCELLING",
            Status::WmsReversing => "WMS_REVERSING",
            Status::RolledBack => "ROLLED_BACK",
            Status::ManualReview => "MANUAL_REVIEW",
            Status::Parked => "PARKED",
        }
    }

    /// Parses the stored name; `None` for anything else (the caller names the row in its error).
    pub fn parse(text: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.as_str() == text)
    }

    pub const fn is_terminal(self) -> bool {
        matches!(self, Status::Done | Status::RolledBack | Status::ManualReview | Status::Parked)
    }

    /// Intent states: a downstream call may be in flight while the row is here.
    pub const fn is_intent(self) -> bool {
        matches!(
            self,
            Status::WmsRequested | Status::LogisticsRequested | Status::LogisticsCancelling | Status::WmsReversing
        )
    }

    /// Whether an automated actor (consumer or recovery worker) may move a saga from `self` to `to`.
    pub fn can_transition(self, to: Status) -> bool {
        use Status::*;
        let allowed: &[Status] = match self {
            Received => &[DbWritten, RolledBack, Parked],
            DbWritten => &[WmsRequested, RolledBack],
            WmsRequested => &[WmsConfirmed, WmsReversing, RolledBack, ManualReview],
            WmsConfirmed => &[LogisticsRequested, WmsReversing],
            LogisticsRequested => &[LogisticsConfirmed, LogisticsCancelling, WmsReversing, ManualReview],
            LogisticsConfirmed => &[Done],
            LogisticsCancelling => &[WmsReversing, LogisticsConfirmed, ManualReview],
            WmsReversing => &[RolledBack, ManualReview],
            Done | RolledBack | ManualReview | Parked => &[],
        };
        allowed.contains(&to)
    }

    /// Whether an operator resolving a ticket may move a saga from `self` to `to`: close a
    /// MANUAL_REVIEW saga as DONE or ROLLED_BACK after fixing things by hand, or send it back
    /// to an intent state so automation resolves it again by query (never by a blind resend).
    pub fn operator_can_transition(self, to: Status) -> bool {
        use Status::*;
        match self {
            ManualReview => {
                matches!(to, Done | RolledBack | WmsRequested | LogisticsRequested | WmsReversing | LogisticsCancelling)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
