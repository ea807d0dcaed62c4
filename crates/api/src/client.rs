//! The saga driver's view of the downstreams: a [`Call`] on a [`Saga`] in, an [`Observation`]
//! out. This is where prost types become domain types, so nothing outside this crate sees them.
//!
//! The mapping is where "outcome unknown" is decided, so it is deliberately conservative: only
//! an answer in the response body is a definitive answer; every gRPC error (timeout,
//! unavailable, internal, unauthenticated...) is [`Observation::Unreachable`], to be resolved by
//! asking again with the same request id. The one exception is INVALID_ARGUMENT to a request
//! that would have had an effect: a careful downstream validates before applying, so it is a
//! definitive rejection of this order (an unknown SKU, say) and nothing was applied.

use std::sync::Arc;
use std::time::Duration;

use midflight_config::GrpcClientSection;
use midflight_model::{
    Call, LogisticsAnswer, Observation, Saga, Step, TRACKING_NO_LEN_MAX, WmsAnswer, tracking_no_fits,
};
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::logistics::v1 as lgx;
use crate::logistics::v1::logistics_client::LogisticsClient;
use crate::wms::v1 as wms;
use crate::wms::v1::wms_client::WmsClient;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid endpoint {endpoint:?}: {source}")]
    Endpoint { endpoint: String, source: tonic::transport::Error },
    #[error("{downstream} {method} failed: {status}")]
    Call { downstream: &'static str, method: &'static str, status: Status },
}

/// One entry of a downstream's ledger, for reconciliation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub seq: u64,
    pub kind: LedgerKind,
    pub request_id: String,
    pub order_no: String,
    /// The downstream's own id: WMS lock id or tracking number.
    pub effect_id: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerKind {
    /// WMS lock or shipment creation: an effect.
    Apply,
    Reject,
    /// WMS reversal or shipment cancellation: the effect undone.
    Undo,
    Tombstone,
}

impl TryFrom<wms::LedgerEntry> for LedgerEntry {
    type Error = Status;

    /// An entry of a kind this version does not know (a newer downstream's, or none) fails the
    /// page: taken for a tombstone, an apply or an undo would be judged wrong.
    fn try_from(entry: wms::LedgerEntry) -> Result<LedgerEntry, Status> {
        let kind = match entry.kind() {
            wms::LedgerKind::Lock => LedgerKind::Apply,
            wms::LedgerKind::Reject => LedgerKind::Reject,
            wms::LedgerKind::Reverse => LedgerKind::Undo,
            wms::LedgerKind::Tombstone => LedgerKind::Tombstone,
            wms::LedgerKind::Unspecified => return Err(unknown_kind(entry.seq, entry.kind)),
        };
        Ok(LedgerEntry {
            seq: entry.seq,
            kind,
            request_id: entry.request_id,
            order_no: entry.order_no,
            effect_id: entry.lock_id,
            at_ms: entry.at_ms,
        })
    }
}

impl TryFrom<lgx::LedgerEntry> for LedgerEntry {
    type Error = Status;

    /// As the WMS's: an entry of a kind this version does not know fails the page.
    fn try_from(entry: lgx::LedgerEntry) -> Result<LedgerEntry, Status> {
        let kind = match entry.kind() {
            lgx::LedgerKind::Create => LedgerKind::Apply,
            lgx::LedgerKind::Reject => LedgerKind::Reject,
            lgx::LedgerKind::Cancel => LedgerKind::Undo,
            lgx::LedgerKind::Tombstone => LedgerKind::Tombstone,
            lgx::LedgerKind::Unspecified => return Err(unknown_kind(entry.seq, entry.kind)),
        };
        Ok(LedgerEntry {
            seq: entry.seq,
            kind,
            request_id: entry.request_id,
            order_no: entry.order_no,
            effect_id: entry.tracking_no,
            at_ms: entry.at_ms,
        })
    }
}

fn unknown_kind(seq: u64, kind: i32) -> Status {
    Status::internal(format!("ledger entry {seq} has a kind this version does not know ({kind})"))
}

/// Clients of both downstreams, with a bound on calls in flight to each.
#[derive(Debug, Clone)]
pub struct Downstreams {
    wms: Side<WmsClient<Channel>>,
    logistics: Side<LogisticsClient<Channel>>,
}

#[derive(Debug, Clone)]
struct Side<C> {
    client: C,
    token: Option<String>,
    permits: Arc<Semaphore>,
}

impl Downstreams {
    /// Clients that connect on first use, so a service starts before its downstreams do.
    pub fn connect_lazy(wms: &GrpcClientSection, logistics: &GrpcClientSection) -> Result<Downstreams, Error> {
        Ok(Downstreams {
            wms: Side::new(WmsClient::new(channel(wms)?), wms),
            logistics: Side::new(LogisticsClient::new(channel(logistics)?), logistics),
        })
    }

    /// Makes `call` for `saga` with its stored request id and voucher, within `timeout`.
    pub async fn call(&self, call: Call, saga: &Saga, timeout: Duration) -> Observation {
        let step = call.step();
        let outcome = match call {
            Call::LockStock => self.lock_stock(saga, timeout).await.map(Observation::Wms),
            Call::QueryLock => self.query_lock(saga, timeout).await.map(Observation::Wms),
            Call::ReverseLock => self.reverse_lock(saga, timeout).await.map(Observation::Wms),
            Call::CreateShipment => self.create_shipment(saga, timeout).await.map(Observation::Logistics),
            Call::QueryShipment => self.query_shipment(saga, timeout).await.map(Observation::Logistics),
            Call::CancelShipment => self.cancel_shipment(saga, timeout).await.map(Observation::Logistics),
        };
        outcome.unwrap_or_else(|status| {
            let rejected = status.code() == Code::InvalidArgument;
            match (call, rejected) {
                (Call::LockStock, true) => {
                    Observation::Wms(WmsAnswer::Rejected { reason: status.message().to_owned() })
                }
                (Call::CreateShipment, true) => {
                    Observation::Logistics(LogisticsAnswer::Rejected { reason: status.message().to_owned() })
                }
                _ => Observation::Unreachable { step, error: describe(&status) },
            }
        })
    }

    async fn lock_stock(&self, saga: &Saga, timeout: Duration) -> Result<WmsAnswer, Status> {
        let order = saga.order().map_err(unsendable)?;
        let message = wms::LockStockRequest {
            request_id: saga.request_id(Step::Wms),
            order_no: saga.order_no.clone(),
            lines: order.lines.iter().map(|l| wms::SkuLine { sku: l.sku.clone(), quantity: l.quantity }).collect(),
            reversal_voucher: saga.voucher(Step::Wms),
        };
        let response = self
            .wms
            .send(message, saga, timeout, |mut client, request| async move { client.lock_stock(request).await })
            .await?;
        lock_answer(response.state(), response.reason)
    }

    async fn query_lock(&self, saga: &Saga, timeout: Duration) -> Result<WmsAnswer, Status> {
        let message = wms::QueryLockRequest { request_id: saga.request_id(Step::Wms) };
        let response = self
            .wms
            .send(message, saga, timeout, |mut client, request| async move { client.query_lock(request).await })
            .await?;
        lock_answer(response.state(), response.reason)
    }

    async fn reverse_lock(&self, saga: &Saga, timeout: Duration) -> Result<WmsAnswer, Status> {
        let message = wms::ReverseLockRequest {
            request_id: saga.request_id(Step::Wms),
            reversal_voucher: saga.voucher(Step::Wms),
            order_no: saga.order_no.clone(),
        };
        let response = self
            .wms
            .send(message, saga, timeout, |mut client, request| async move { client.reverse_lock(request).await })
            .await?;
        Ok(match response.result() {
            wms::ReverseResult::Reversed => WmsAnswer::Reversed,
            wms::ReverseResult::Tombstoned => WmsAnswer::Tombstoned,
            wms::ReverseResult::NothingToReverse => WmsAnswer::NothingToReverse,
            wms::ReverseResult::Irreversible => WmsAnswer::Irreversible { reason: response.reason },
            wms::ReverseResult::VoucherMismatch => WmsAnswer::VoucherMismatch,
            wms::ReverseResult::Unspecified => return Err(Status::internal("wms answered without a reverse result")),
        })
    }

    async fn create_shipment(&self, saga: &Saga, timeout: Duration) -> Result<LogisticsAnswer, Status> {
        let order = saga.order().map_err(unsendable)?;
        let message = lgx::CreateShipmentRequest {
            request_id: saga.request_id(Step::Logistics),
            order_no: saga.order_no.clone(),
            address: Some(lgx::Address {
                region: order.address.region,
                city: order.address.city,
                line: order.address.line,
                postal_code: order.address.postal_code,
            }),
            cancel_voucher: saga.voucher(Step::Logistics),
        };
        let response = self
            .logistics
            .send(message, saga, timeout, |mut client, request| async move { client.create_shipment(request).await })
            .await?;
        shipment_answer(response)
    }

    async fn query_shipment(&self, saga: &Saga, timeout: Duration) -> Result<LogisticsAnswer, Status> {
        let message = lgx::QueryShipmentRequest { request_id: saga.request_id(Step::Logistics) };
        let response = self
            .logistics
            .send(message, saga, timeout, |mut client, request| async move { client.query_shipment(request).await })
            .await?;
        shipment_answer(response)
    }

    async fn cancel_shipment(&self, saga: &Saga, timeout: Duration) -> Result<LogisticsAnswer, Status> {
        let message = lgx::CancelShipmentRequest {
            request_id: saga.request_id(Step::Logistics),
            cancel_voucher: saga.voucher(Step::Logistics),
            order_no: saga.order_no.clone(),
        };
        let response = self
            .logistics
            .send(message, saga, timeout, |mut client, request| async move { client.cancel_shipment(request).await })
            .await?;
        Ok(match response.result() {
            lgx::CancelResult::Cancelled => LogisticsAnswer::Cancelled,
            lgx::CancelResult::Tombstoned => LogisticsAnswer::Tombstoned,
            lgx::CancelResult::NothingToCancel => LogisticsAnswer::NothingToCancel,
            lgx::CancelResult::Irreversible => {
                LogisticsAnswer::Irreversible { tracking_no: tracking_no(response.tracking_no)? }
            }
            lgx::CancelResult::VoucherMismatch => LogisticsAnswer::VoucherMismatch,
            lgx::CancelResult::Unspecified => {
                return Err(Status::internal("logistics answered without a cancel result"));
            }
        })
    }

    /// A page of the WMS ledger after `cursor`; the second value is the next cursor.
    pub async fn wms_ledger(
        &self,
        cursor: u64,
        limit: u32,
        timeout: Duration,
    ) -> Result<(Vec<LedgerEntry>, u64), Error> {
        self.wms_ledger_of(&[], cursor, limit, timeout).await
    }

    /// [`Downstreams::wms_ledger`], only the entries under `request_ids` (all when empty; the
    /// WMS takes at most 500).
    pub async fn wms_ledger_of(
        &self,
        request_ids: &[String],
        cursor: u64,
        limit: u32,
        timeout: Duration,
    ) -> Result<(Vec<LedgerEntry>, u64), Error> {
        let message = wms::ListLedgerRequest { cursor, limit, request_ids: request_ids.to_vec() };
        let request = self.wms.plain_request(message, timeout);
        let response = bounded(timeout, self.wms.client.clone().list_ledger(request))
            .await
            .map_err(|status| Error::Call { downstream: "wms", method: "ListLedger", status })?;
        let entries = response.entries.into_iter().map(LedgerEntry::try_from).collect::<Result<_, _>>();
        let entries = entries.map_err(|status| Error::Call { downstream: "wms", method: "ListLedger", status })?;
        Ok((entries, response.next_cursor))
    }

    /// A page of the logistics ledger after `cursor`; the second value is the next cursor.
    pub async fn logistics_ledger(
        &self,
        cursor: u64,
        limit: u32,
        timeout: Duration,
    ) -> Result<(Vec<LedgerEntry>, u64), Error> {
        self.logistics_ledger_of(&[], cursor, limit, timeout).await
    }

    /// [`Downstreams::logistics_ledger`], only the entries under `request_ids` (all when
    /// empty; the logistics provider takes at most 500).
    pub async fn logistics_ledger_of(
        &self,
        request_ids: &[String],
        cursor: u64,
        limit: u32,
        timeout: Duration,
    ) -> Result<(Vec<LedgerEntry>, u64), Error> {
        let message = lgx::ListLedgerRequest { cursor, limit, request_ids: request_ids.to_vec() };
        let request = self.logistics.plain_request(message, timeout);
        let response = bounded(timeout, self.logistics.client.clone().list_ledger(request))
            .await
            .map_err(|status| Error::Call { downstream: "logistics", method: "ListLedger", status })?;
        let entries = response.entries.into_iter().map(LedgerEntry::try_from).collect::<Result<_, _>>();
        let entries =
            entries.map_err(|status| Error::Call { downstream: "logistics", method: "ListLedger", status })?;
        Ok((entries, response.next_cursor))
    }
}

impl<C> Side<C> {
    fn new(client: C, section: &GrpcClientSection) -> Side<C> {
        Side {
            client,
            token: section.bearer_token.clone(),
            permits: Arc::new(Semaphore::new(section.concurrency_limit)),
        }
    }

    /// One call for `saga`: waits for a permit, then sends, both within `timeout`, so a call
    /// that queued behind others still ends by the deadline the driver planned its lease with;
    /// the request carries as its deadline what is left once the permit is held.
    async fn send<M, T, F>(
        &self,
        message: M,
        saga: &Saga,
        timeout: Duration,
        call: impl FnOnce(C, Request<M>) -> F,
    ) -> Result<T, Status>
    where
        C: Clone,
        F: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = tokio::time::Instant::now();
        let sent = async {
            let _permit = self.permits.acquire().await.map_err(|_| Status::cancelled("client is shutting down"))?;
            let left = timeout.saturating_sub(started.elapsed());
            if left < SEND_TIME_MIN {
                return Err(Status::deadline_exceeded(format!(
                    "not sent: waited {} ms for one of the client's concurrency_limit permits",
                    started.elapsed().as_millis()
                )));
            }
            call(self.client.clone(), self.request(message, saga, left)).await
        };
        bounded(timeout, sent).await
    }

    /// A request carrying the deadline, the bearer token and the saga's trace context.
    fn request<T>(&self, message: T, saga: &Saga, timeout: Duration) -> Request<T> {
        let mut request = self.plain_request(message, timeout);
        if let Some(traceparent) = saga.trace_context.as_deref().and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("traceparent", traceparent);
        }
        request
    }

    fn plain_request<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(timeout);
        if let Some(value) = self.token.as_deref().and_then(|t| format!("Bearer {t}").parse().ok()) {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }
}

fn channel(section: &GrpcClientSection) -> Result<Channel, Error> {
    let endpoint = Endpoint::from_shared(section.endpoint.clone())
        .map_err(|source| Error::Endpoint { endpoint: section.endpoint.clone(), source })?
        .connect_timeout(Duration::from_millis(section.connect_timeout_ms))
        .timeout(Duration::from_millis(section.request_timeout_ms))
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

/// Least time a call is sent with: one that waited for a permit until less is left is not sent.
const SEND_TIME_MIN: Duration = Duration::from_millis(5);

/// The call, cut off at `timeout` even if the transport does not enforce the deadline itself.
async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!("no answer within {} ms", timeout.as_millis()))),
    }
}

fn lock_answer(state: wms::LockState, reason: String) -> Result<WmsAnswer, Status> {
    Ok(match state {
        wms::LockState::Locked => WmsAnswer::Locked,
        wms::LockState::Rejected => WmsAnswer::Rejected { reason },
        wms::LockState::Reversed => WmsAnswer::Reversed,
        wms::LockState::Tombstoned => WmsAnswer::Tombstoned,
        wms::LockState::NotFound => WmsAnswer::NotFound,
        // An answer without a state is not an answer: treat it like no answer at all.
        wms::LockState::Unspecified => return Err(Status::internal("wms answered without a lock state")),
    })
}

fn shipment_answer(response: lgx::ShipmentResponse) -> Result<LogisticsAnswer, Status> {
    Ok(match response.state() {
        lgx::ShipmentState::Created => LogisticsAnswer::Created { tracking_no: tracking_no(response.tracking_no)? },
        lgx::ShipmentState::Rejected => LogisticsAnswer::Rejected { reason: response.reason },
        lgx::ShipmentState::Cancelled => LogisticsAnswer::Cancelled,
        lgx::ShipmentState::Tombstoned => LogisticsAnswer::Tombstoned,
        lgx::ShipmentState::NotFound => LogisticsAnswer::NotFound,
        lgx::ShipmentState::Unspecified => return Err(Status::internal("logistics answered without a state")),
    })
}

/// A shipment's tracking number as the tables hold it ([`tracking_no_fits`]). Any other is
/// treated like an answer without a state (no answer at all): the saga could not record it, and
/// a write failing at every try would hold the saga without counting an attempt.
fn tracking_no(tracking_no: String) -> Result<String, Status> {
    if !tracking_no_fits(&tracking_no) {
        let chars = tracking_no.chars().count();
        return Err(Status::internal(format!(
            "logistics answered with a tracking number of {chars} characters; 1..={TRACKING_NO_LEN_MAX} visible ASCII characters fit"
        )));
    }
    Ok(tracking_no)
}

fn describe(status: &Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// A stored order this process cannot turn into a request (a newer release validating more
/// strictly than the one that stored it). Nothing was sent, and no downstream refused it, so it
/// is no rejection, which would roll the saga back while an earlier send may have applied: it
/// fails like an unreachable downstream, and a person gets it once the attempts run out.
fn unsendable(error: impl std::fmt::Display) -> Status {
    Status::internal(format!("the stored order cannot be sent: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(tracking_no: &str) -> lgx::ShipmentResponse {
        lgx::ShipmentResponse {
            state: lgx::ShipmentState::Created.into(),
            tracking_no: tracking_no.to_owned(),
            ..lgx::ShipmentResponse::default()
        }
    }

    #[tokio::test]
    async fn an_order_that_cannot_be_sent_is_no_rejection() {
        let nowhere = GrpcClientSection::with_endpoint("http://127.0.0.1:1");
        let client = Downstreams::connect_lazy(&nowhere, &nowhere).expect("client");
        let source = midflight_model::Source { topic: "orders".into(), partition: 0, offset: 0 };
        let order = midflight_model::OrderEvent {
            order_no: "O-1".into(),
            event_type: "PAID".into(),
            lines: vec![midflight_model::Line { sku: "SKU-1".into(), quantity: 1 }],
            address: midflight_model::Address {
                region: "CN-ZJ".into(),
                city: "Hangzhou".into(),
                line: "1 West Lake Rd".into(),
                postal_code: String::new(),
            },
            amount_cents: 100,
        };
        let mut saga = Saga::received(&order, source, 0, i64::MAX);
        saga.payload = "{}".into();
        for call in [Call::LockStock, Call::CreateShipment] {
            match client.call(call, &saga, Duration::from_secs(1)).await {
                Observation::Unreachable { error, .. } => {
                    assert!(error.contains("the stored order cannot be sent"), "{call:?}: {error}");
                }
                other => panic!("{call:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_ledger_entry_of_an_unknown_kind_is_refused() {
        let entry =
            |kind: wms::LedgerKind| wms::LedgerEntry { seq: 7, kind: kind.into(), ..wms::LedgerEntry::default() };
        let known = LedgerEntry::try_from(entry(wms::LedgerKind::Tombstone)).expect("known");
        assert_eq!(known.kind, LedgerKind::Tombstone);
        let refused = LedgerEntry::try_from(entry(wms::LedgerKind::Unspecified)).expect_err("unknown");
        assert!(refused.message().contains("ledger entry 7"), "{refused:?}");
        let newer = wms::LedgerEntry { seq: 8, kind: 99, ..wms::LedgerEntry::default() };
        assert!(LedgerEntry::try_from(newer).is_err(), "a kind from a newer downstream");
        let shipment = lgx::LedgerEntry { seq: 9, kind: 99, ..lgx::LedgerEntry::default() };
        assert!(LedgerEntry::try_from(shipment).is_err());
    }

    #[test]
    fn a_tracking_number_the_tables_cannot_hold_is_no_answer() {
        let fits = "T".repeat(TRACKING_NO_LEN_MAX);
        let answer = shipment_answer(created(&fits)).expect("fits");
        assert_eq!(answer, LogisticsAnswer::Created { tracking_no: fits.clone() });
        let bad =
            ["T".repeat(TRACKING_NO_LEN_MAX + 1), String::new(), "TRK 1".into(), "TRK-1\n".into(), "运单1".into()];
        for bad in bad {
            let refused = shipment_answer(created(&bad)).expect_err("refused");
            assert_eq!(refused.code(), tonic::Code::Internal, "{bad:?}");
            assert!(refused.message().contains("tracking number"), "{refused:?}");
        }
    }
}
