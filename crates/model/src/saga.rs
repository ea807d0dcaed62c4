//! The saga row: one per biz_id, the durable record of how far a message got.
//!
//! This is the domain form of the intermediate-state table; the store crate maps it to and
//! from the database. Times are milliseconds since the Unix epoch **by the database's clock**:
//! the model never reads a clock, the caller passes `now_ms` in.

use crate::ids::{self, Step};
use crate::order::{OrderEvent, PayloadError};
use crate::status::Status;

/// Where the message came from, kept so a saga can be traced back to Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Who may drive the saga, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The process that holds (or last held) the lease.
    pub owner_id: Option<String>,
    /// Fencing token: bumped by every takeover; a transition must name the current one.
    pub epoch: u64,
    /// The lease is live while the database clock is below this.
    pub until_ms: i64,
}

/// One saga, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saga {
    pub biz_id: String,
    pub order_no: String,
    pub event_type: String,
    pub source: Source,
    /// The message payload as received (JSON), so a saga can be resumed without Kafka.
    pub payload: String,
    pub status: Status,
    /// Bumped by every change to the row; a transition names the version it read.
    pub version: u64,
    pub wms_request_id: Option<String>,
    pub wms_voucher: Option<String>,
    /// When the WMS lock was recorded as confirmed (starts its reversal window).
    pub wms_locked_at_ms: Option<i64>,
    pub logistics_request_id: Option<String>,
    pub logistics_voucher: Option<String>,
    pub tracking_no: Option<String>,
    /// When the current intent state was entered (starts the downstream's in-flight window).
    pub intent_at_ms: Option<i64>,
    /// Failed attempts at the current step; reset when a step completes.
    pub attempts: u32,
    /// The row is not picked up for recovery before this.
    pub next_attempt_at_ms: i64,
    pub last_error: Option<String>,
    /// After this, no new forward step is started: the saga rolls back while it still can.
    pub deadline_ms: i64,
    pub lease: Lease,
    /// W3C `traceparent` of the message, so every actor's spans join one trace.
    pub trace_context: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl Saga {
    /// A new inbox row for a valid message: RECEIVED, version 0, leased by `owner_id` at epoch 1.
    pub fn received(event: &OrderEvent, source: Source, now_ms: i64, deadline_ms: i64) -> Saga {
        Saga::new(
            event.biz_id(),
            &event.order_no,
            &event.event_type,
            source,
            event.to_json(),
            Status::Received,
            now_ms,
            deadline_ms,
        )
    }

    /// A row for poison input, parked with its error. `biz_id` is synthetic (`parked:topic:partition:offset`)
    /// because a payload that does not parse has no trustworthy order number.
    pub fn parked(source: Source, payload: String, error: &PayloadError, now_ms: i64) -> Saga {
        let biz_id = format!("parked:{}:{}:{}", source.topic, source.partition, source.offset);
        let mut saga = Saga::new(biz_id, "", "", source, payload, Status::Parked, now_ms, now_ms);
        saga.last_error = Some(error.to_string());
        saga
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        biz_id: String,
        order_no: &str,
        event_type: &str,
        source: Source,
        payload: String,
        status: Status,
        now_ms: i64,
        deadline_ms: i64,
    ) -> Saga {
        Saga {
            biz_id,
            order_no: order_no.to_owned(),
            event_type: event_type.to_owned(),
            source,
            payload,
            status,
            version: 0,
            wms_request_id: None,
            wms_voucher: None,
            wms_locked_at_ms: None,
            logistics_request_id: None,
            logistics_voucher: None,
            tracking_no: None,
            intent_at_ms: None,
            attempts: 0,
            next_attempt_at_ms: 0,
            last_error: None,
            deadline_ms,
            lease: Lease { owner_id: None, epoch: 0, until_ms: 0 },
            trace_context: None,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        }
    }

    /// The order event, parsed again from the stored payload.
    pub fn order(&self) -> Result<OrderEvent, PayloadError> {
        OrderEvent::parse(self.payload.as_bytes())
    }

    /// The request id and voucher of a step, as stored, or as they will be stored.
    pub fn request_id(&self, step: Step) -> String {
        let stored = match step {
            Step::Wms => &self.wms_request_id,
            Step::Logistics => &self.logistics_request_id,
        };
        stored.clone().unwrap_or_else(|| ids::request_id(&self.biz_id, step))
    }

    pub fn voucher(&self, step: Step) -> String {
        let stored = match step {
            Step::Wms => &self.wms_voucher,
            Step::Logistics => &self.logistics_voucher,
        };
        stored.clone().unwrap_or_else(|| ids::voucher(&self.biz_id, step))
    }

    pub fn past_deadline(&self, now_ms: i64) -> bool {
        now_ms >= self.deadline_ms
    }

    pub fn lease_live(&self, now_ms: i64) -> bool {
        now_ms < self.lease.until_ms
    }
}
