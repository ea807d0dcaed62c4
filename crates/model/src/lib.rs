//! The saga's state model: statuses, legal transitions, deterministic request ids and
//! vouchers, downstream contracts, and the roll-forward / roll-back planner.
//!
//! Architecture invariant: this crate does no I/O and reads no clock. It depends on no async
//! runtime, database, Kafka or gRPC crate (a tidy test in xtask enforces it). Callers load a row,
//! ask [`plan`] what to do, write the resulting [`Change`] with a CAS, then perform the [`Call`]
//! it names. Because the whole decision is a pure function, it is tested as a table and reused
//! unchanged by the consumer, the recovery worker and the model checker.

mod change;
mod contract;
mod error;
mod ids;
mod observation;
mod order;
mod planner;
mod saga;
mod status;

pub use change::{BusinessWrite, Call, Change, Failure, TicketDraft};
pub use contract::{Contract, RetryPolicy, Rules};
pub use error::Error;
pub use ids::{Step, request_id, voucher};
pub use observation::{LogisticsAnswer, Observation, TRACKING_NO_LEN_MAX, WmsAnswer, tracking_no_fits};
pub use order::{Address, Line, OrderEvent, PayloadError, biz_id};
pub use planner::{Plan, plan};
pub use saga::{Lease, Saga, Source};
pub use status::Status;

/// Limits on order events.
pub mod limits {
    pub use crate::order::{
        ADDRESS_FIELD_LEN_MAX, EVENT_TYPE_LEN_MAX, LINES_MAX, ORDER_NO_LEN_MAX, PAYLOAD_BYTES_MAX, QUANTITY_MAX,
        SKU_LEN_MAX,
    };
}

#[cfg(test)]
mod tests;
