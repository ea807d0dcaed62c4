//! The `logistics.v1.Logistics` gRPC service: checks each request, runs its effect under the
//! fault plan, and converts between the proto messages and the ledger's types.

use std::sync::Arc;

use midflight_api::logistics::v1 as pb;
use midflight_api::logistics::v1::logistics_server::{Logistics, LogisticsServer};
use midflight_mock::FaultInjector;
use midflight_mock::input::{MESSAGE_BYTES_MAX, bounded, ledger_request_ids, page_limit, required};
use tonic::{Request, Response, Status};

use crate::entity::{LedgerKind, ShipmentState, ledger, shipment};
use crate::ledger::{CancelOrder, CancelResult, Ledger, ShipmentOrder, cancellable};

/// The Logistics service over one ledger and one fault plan.
#[derive(Debug, Clone)]
pub struct LogisticsService {
    ledger: Arc<Ledger>,
    injector: Arc<FaultInjector>,
}

impl LogisticsService {
    pub fn new(ledger: Arc<Ledger>, injector: Arc<FaultInjector>) -> LogisticsService {
        LogisticsService { ledger, injector }
    }

    /// The generated server, with the request size bounded.
    pub fn into_server(self) -> LogisticsServer<LogisticsService> {
        LogisticsServer::new(self).max_decoding_message_size(MESSAGE_BYTES_MAX)
    }
}

#[tonic::async_trait]
impl Logistics for LogisticsService {
    async fn create_shipment(
        &self,
        request: Request<pb::CreateShipmentRequest>,
    ) -> Result<Response<pb::ShipmentResponse>, Status> {
        let order = shipment_order(request.into_inner())?;
        let (ledger, pickup_ms) = (Arc::clone(&self.ledger), self.injector.irreversible_after_ms());
        let answer = self
            .injector
            .perform("CreateShipment", async move {
                let row = ledger.create(order).await?;
                Ok(shipment_answer(Some(&row), pickup_ms, ledger.now_ms()))
            })
            .await?;
        Ok(Response::new(answer))
    }

    async fn query_shipment(
        &self,
        request: Request<pb::QueryShipmentRequest>,
    ) -> Result<Response<pb::ShipmentResponse>, Status> {
        let request_id = request.into_inner().request_id;
        required("request_id", &request_id)?;
        let (ledger, pickup_ms) = (Arc::clone(&self.ledger), self.injector.irreversible_after_ms());
        let answer = self
            .injector
            .perform("QueryShipment", async move {
                let row = ledger.find(&request_id).await?;
                Ok(shipment_answer(row.as_ref(), pickup_ms, ledger.now_ms()))
            })
            .await?;
        Ok(Response::new(answer))
    }

    async fn cancel_shipment(
        &self,
        request: Request<pb::CancelShipmentRequest>,
    ) -> Result<Response<pb::CancelShipmentResponse>, Status> {
        let request = request.into_inner();
        required("request_id", &request.request_id)?;
        bounded("cancel_voucher", &request.cancel_voucher)?;
        bounded("order_no", &request.order_no)?;
        let order =
            CancelOrder { request_id: request.request_id, voucher: request.cancel_voucher, order_no: request.order_no };
        let (ledger, pickup_ms) = (Arc::clone(&self.ledger), self.injector.irreversible_after_ms());
        let answer =
            self.injector.perform("CancelShipment", async move { ledger.cancel(order, pickup_ms).await }).await?;
        Ok(Response::new(pb::CancelShipmentResponse {
            result: proto_result(answer.result).into(),
            tracking_no: answer.tracking_no,
            reason: answer.reason,
        }))
    }

    async fn list_ledger(
        &self,
        request: Request<pb::ListLedgerRequest>,
    ) -> Result<Response<pb::ListLedgerResponse>, Status> {
        let request = request.into_inner();
        ledger_request_ids(&request.request_ids)?;
        let (ledger, cursor, limit) = (Arc::clone(&self.ledger), request.cursor, page_limit(request.limit));
        let request_ids = request.request_ids;
        let entries =
            self.injector.perform("ListLedger", async move { ledger.list(cursor, limit, request_ids).await }).await?;
        let entries: Vec<pb::LedgerEntry> = entries.into_iter().map(proto_entry).collect();
        let next_cursor = entries.last().map_or(cursor, |entry| entry.seq);
        Ok(Response::new(pb::ListLedgerResponse { entries, next_cursor }))
    }
}

/// Checks a CreateShipment request; nothing is looked up or changed before it passes.
fn shipment_order(request: pb::CreateShipmentRequest) -> Result<ShipmentOrder, Status> {
    required("request_id", &request.request_id)?;
    required("order_no", &request.order_no)?;
    bounded("cancel_voucher", &request.cancel_voucher)?;
    let Some(address) = request.address else {
        return Err(Status::invalid_argument("address is required"));
    };
    required("address.region", &address.region)?;
    bounded("address.city", &address.city)?;
    bounded("address.line", &address.line)?;
    bounded("address.postal_code", &address.postal_code)?;
    Ok(ShipmentOrder {
        request_id: request.request_id,
        order_no: request.order_no,
        region: address.region,
        voucher: request.cancel_voucher,
    })
}

fn shipment_answer(row: Option<&shipment::Model>, pickup_ms: Option<i64>, now_ms: i64) -> pb::ShipmentResponse {
    let Some(row) = row else {
        return pb::ShipmentResponse { state: pb::ShipmentState::NotFound.into(), ..pb::ShipmentResponse::default() };
    };
    pb::ShipmentResponse {
        state: proto_state(row.state).into(),
        tracking_no: row.tracking_no.clone(),
        reason: row.reason.clone(),
        cancel_voucher: row.voucher.clone(),
        cancellable: cancellable(row, pickup_ms, now_ms),
    }
}

fn proto_entry(entry: ledger::Model) -> pb::LedgerEntry {
    let kind = match entry.kind {
        LedgerKind::Create => pb::LedgerKind::Create,
        LedgerKind::Reject => pb::LedgerKind::Reject,
        LedgerKind::Cancel => pb::LedgerKind::Cancel,
        LedgerKind::Tombstone => pb::LedgerKind::Tombstone,
    };
    pb::LedgerEntry {
        seq: u64::try_from(entry.seq).unwrap_or(0),
        kind: kind.into(),
        request_id: entry.request_id,
        tracking_no: entry.tracking_no,
        order_no: entry.order_no,
        at_ms: entry.at_ms,
    }
}

fn proto_state(state: ShipmentState) -> pb::ShipmentState {
    match state {
        ShipmentState::Created => pb::ShipmentState::Created,
        ShipmentState::Rejected => pb::ShipmentState::Rejected,
        ShipmentState::Cancelled => pb::ShipmentState::Cancelled,
        ShipmentState::Tombstoned => pb::ShipmentState::Tombstoned,
    }
}

fn proto_result(result: CancelResult) -> pb::CancelResult {
    match result {
        CancelResult::Cancelled => pb::CancelResult::Cancelled,
        CancelResult::Tombstoned => pb::CancelResult::Tombstoned,
        CancelResult::NothingToCancel => pb::CancelResult::NothingToCancel,
        CancelResult::Irreversible => pb::CancelResult::Irreversible,
        CancelResult::VoucherMismatch => pb::CancelResult::VoucherMismatch,
    }
}
