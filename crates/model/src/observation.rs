//! What a driver learned from a downstream since it loaded or wrote the row.
//!
//! Answers are the downstream's definitive words about *our* request id; `Unreachable` is the
//! absence of an answer (timeout, connection refused, UNAVAILABLE). The distinction is the whole
//! point: an unreachable call's outcome is unknown and is resolved by asking again, never by
//! acting again under a new key.

use crate::ids::Step;

/// What the WMS said about our request id (to LockStock, QueryLock or ReverseLock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WmsAnswer {
    NotFound,
    Locked,
    Rejected { reason: String },
    Reversed,
    Tombstoned,
    NothingToReverse,
    Irreversible { reason: String },
    VoucherMismatch,
}

/// The longest tracking number the tables hold (`VARCHAR(64)`): a provider's longer one is not
/// an answer the saga can record (the downstream client refuses it as it would a malformed
/// answer, so the step is retried and, failing, goes to a person).
pub const TRACKING_NO_LEN_MAX: usize = 64;

/// Whether `tracking_no` is one the tables hold: 1..=[`TRACKING_NO_LEN_MAX`] visible ASCII
/// characters (a database whose character set is not Unicode holds those too).
pub fn tracking_no_fits(tracking_no: &str) -> bool {
    !tracking_no.is_empty()
        && tracking_no.len() <= TRACKING_NO_LEN_MAX
        && tracking_no.bytes().all(|byte| byte.is_ascii_graphic())
}

/// What the logistics provider said about our request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogisticsAnswer {
    NotFound,
    Created {
        tracking_no: String,
    },
    Rejected {
        reason: String,
    },
    Cancelled,
    Tombstoned,
    NothingToCancel,
    /// Picked up: the shipment stays live.
    Irreversible {
        tracking_no: String,
    },
    VoucherMismatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// Nothing learned since the row was loaded or last written.
    Nothing,
    Wms(WmsAnswer),
    Logistics(LogisticsAnswer),
    /// A call got no answer; its outcome is unknown.
    Unreachable {
        step: Step,
        error: String,
    },
}

impl Observation {
    /// Every kind of observation, with placeholder texts: the planner's tables iterate over these.
    pub fn examples() -> Vec<Observation> {
        let mut all = vec![Observation::Nothing];
        all.extend(
            [
                WmsAnswer::NotFound,
                WmsAnswer::Locked,
                WmsAnswer::Rejected { reason: "out of stock".into() },
                WmsAnswer::Reversed,
                WmsAnswer::Tombstoned,
                WmsAnswer::NothingToReverse,
                WmsAnswer::Irreversible { reason: "window passed".into() },
                WmsAnswer::VoucherMismatch,
            ]
            .into_iter()
            .map(Observation::Wms),
        );
        all.extend(
            [
                LogisticsAnswer::NotFound,
                LogisticsAnswer::Created { tracking_no: "TRK1".into() },
                LogisticsAnswer::Rejected { reason: "unserviceable".into() },
                LogisticsAnswer::Cancelled,
                LogisticsAnswer::Tombstoned,
                LogisticsAnswer::NothingToCancel,
                LogisticsAnswer::Irreversible { tracking_no: "TRK1".into() },
                LogisticsAnswer::VoucherMismatch,
            ]
            .into_iter()
            .map(Observation::Logistics),
        );
        all.push(Observation::Unreachable { step: Step::Wms, error: "timeout".into() });
        all.push(Observation::Unreachable { step: Step::Logistics, error: "timeout".into() });
        all
    }

    /// A short label for logs and tables.
    pub fn label(&self) -> String {
        match self {
            Observation::Nothing => "nothing".to_owned(),
            Observation::Wms(answer) => format!("wms {}", wms_label(answer)),
            Observation::Logistics(answer) => format!("logistics {}", logistics_label(answer)),
            Observation::Unreachable { step, .. } => format!("{} unreachable", step.as_str().to_ascii_lowercase()),
        }
    }
}

fn wms_label(answer: &WmsAnswer) -> &'static str {
    match answer {
        WmsAnswer::NotFound => "not-found",
        WmsAnswer::Locked => "locked",
        WmsAnswer::Rejected { .. } => "rejected",
        WmsAnswer::Reversed => "reversed",
        WmsAnswer::Tombstoned => "tombstoned",
        WmsAnswer::NothingToReverse => "nothing-to-reverse",
        WmsAnswer::Irreversible { .. } => "irreversible",
        WmsAnswer::VoucherMismatch => "voucher-mismatch",
    }
}

fn logistics_label(answer: &LogisticsAnswer) -> &'static str {
    match answer {
        LogisticsAnswer::NotFound => "not-found",
        LogisticsAnswer::Created { .. } => "created",
        LogisticsAnswer::Rejected { .. } => "rejected",
        LogisticsAnswer::Cancelled => "cancelled",
        LogisticsAnswer::Tombstoned => "tombstoned",
        LogisticsAnswer::NothingToCancel => "nothing-to-cancel",
        LogisticsAnswer::Irreversible { .. } => "irreversible",
        LogisticsAnswer::VoucherMismatch => "voucher-mismatch",
    }
}
