//! The `wms.v1.Wms` gRPC service: checks each request, runs its effect under the fault plan,
//! and converts between the proto messages and the ledger's types.

use std::collections::HashSet;
use std::sync::Arc;

use midflight_api::wms::v1 as pb;
use midflight_api::wms::v1::wms_server::{Wms, WmsServer};
use midflight_mock::FaultInjector;
use midflight_mock::input::{MESSAGE_BYTES_MAX, bounded, ledger_request_ids, page_limit, required};
use tonic::{Request, Response, Status};

use crate::entity::{LedgerKind, Line, LockState, ledger, lock};
use crate::ledger::{Ledger, LockOrder, ReverseOrder, ReverseResult, reversible};

/// Most lines in one LockStock request: an order, not a warehouse transfer.
pub const LINES_MAX: usize = 100;
/// Largest quantity of one line; keeps every stock sum far from overflow.
pub const QUANTITY_MAX: i64 = 1_000_000_000;

/// The Wms service over one ledger and one fault plan.
#[derive(Debug, Clone)]
pub struct WmsService {
    ledger: Arc<Ledger>,
    injector: Arc<FaultInjector>,
}

impl WmsService {
    pub fn new(ledger: Arc<Ledger>, injector: Arc<FaultInjector>) -> WmsService {
        WmsService { ledger, injector }
    }

    /// The generated server, with the request size bounded.
    pub fn into_server(self) -> WmsServer<WmsService> {
        WmsServer::new(self).max_decoding_message_size(MESSAGE_BYTES_MAX)
    }
}

#[tonic::async_trait]
impl Wms for WmsService {
    async fn lock_stock(
        &self,
        request: Request<pb::LockStockRequest>,
    ) -> Result<Response<pb::LockStockResponse>, Status> {
        let order = lock_order(request.into_inner())?;
        let (ledger, legacy) = (Arc::clone(&self.ledger), self.injector.legacy_mode());
        let answer = self.injector.perform("LockStock", async move { ledger.lock(order, legacy).await }).await?;
        Ok(Response::new(pb::LockStockResponse {
            state: proto_state(answer.state).into(),
            lock_id: answer.lock_id,
            reason: answer.reason,
        }))
    }

    async fn query_lock(
        &self,
        request: Request<pb::QueryLockRequest>,
    ) -> Result<Response<pb::QueryLockResponse>, Status> {
        let request_id = request.into_inner().request_id;
        required("request_id", &request_id)?;
        if self.injector.legacy_mode() {
            return Err(Status::unimplemented("legacy mode: locks cannot be queried by the caller's request id"));
        }
        let (ledger, window_ms) = (Arc::clone(&self.ledger), self.injector.irreversible_after_ms());
        let answer = self
            .injector
            .perform("QueryLock", async move {
                let row = ledger.find(&request_id).await?;
                Ok(query_answer(row.as_ref(), window_ms, ledger.now_ms()))
            })
            .await?;
        Ok(Response::new(answer))
    }

    async fn reverse_lock(
        &self,
        request: Request<pb::ReverseLockRequest>,
    ) -> Result<Response<pb::ReverseLockResponse>, Status> {
        let request = request.into_inner();
        required("request_id", &request.request_id)?;
        bounded("reversal_voucher", &request.reversal_voucher)?;
        bounded("order_no", &request.order_no)?;
        let order = ReverseOrder {
            request_id: request.request_id,
            voucher: request.reversal_voucher,
            order_no: request.order_no,
        };
        let (ledger, legacy) = (Arc::clone(&self.ledger), self.injector.legacy_mode());
        let window_ms = self.injector.irreversible_after_ms();
        let answer =
            self.injector.perform("ReverseLock", async move { ledger.reverse(order, window_ms, legacy).await }).await?;
        Ok(Response::new(pb::ReverseLockResponse { result: proto_result(answer.result).into(), reason: answer.reason }))
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
        let entries = entries.into_iter().map(proto_entry).collect::<Result<Vec<_>, Status>>()?;
        let next_cursor = entries.last().map_or(cursor, |entry| entry.seq);
        Ok(Response::new(pb::ListLedgerResponse { entries, next_cursor }))
    }
}

/// Checks a LockStock request; nothing is looked up or changed before it passes.
fn lock_order(request: pb::LockStockRequest) -> Result<LockOrder, Status> {
    required("request_id", &request.request_id)?;
    required("order_no", &request.order_no)?;
    bounded("reversal_voucher", &request.reversal_voucher)?;
    if request.lines.is_empty() || request.lines.len() > LINES_MAX {
        return Err(Status::invalid_argument(format!(
            "lines must hold 1 to {LINES_MAX} entries, got {}",
            request.lines.len()
        )));
    }
    let mut seen = HashSet::new();
    for (index, line) in request.lines.iter().enumerate() {
        required(&format!("lines[{index}].sku"), &line.sku)?;
        if !(1..=QUANTITY_MAX).contains(&line.quantity) {
            return Err(Status::invalid_argument(format!(
                "lines[{index}].quantity must be in 1..={QUANTITY_MAX}, got {}",
                line.quantity
            )));
        }
        if !seen.insert(line.sku.as_str()) {
            return Err(Status::invalid_argument(format!("sku {:?} appears in more than one line", line.sku)));
        }
    }
    let lines = request.lines.into_iter().map(|line| Line { sku: line.sku, quantity: line.quantity }).collect();
    Ok(LockOrder {
        request_id: request.request_id,
        order_no: request.order_no,
        lines,
        voucher: request.reversal_voucher,
    })
}

fn query_answer(row: Option<&lock::Model>, window_ms: Option<i64>, now_ms: i64) -> pb::QueryLockResponse {
    let Some(row) = row else {
        return pb::QueryLockResponse { state: pb::LockState::NotFound.into(), ..pb::QueryLockResponse::default() };
    };
    pb::QueryLockResponse {
        state: proto_state(row.state).into(),
        lock_id: row.lock_id.clone(),
        reason: row.reason.clone(),
        reversal_voucher: row.voucher.clone(),
        reversible: reversible(row, window_ms, now_ms),
    }
}

fn proto_entry(entry: ledger::Model) -> Result<pb::LedgerEntry, Status> {
    let lines: Vec<Line> = serde_json::from_str(&entry.lines)
        .map_err(|e| Status::internal(format!("ledger entry {} has unreadable lines: {e}", entry.seq)))?;
    let kind = match entry.kind {
        LedgerKind::Lock => pb::LedgerKind::Lock,
        LedgerKind::Reject => pb::LedgerKind::Reject,
        LedgerKind::Reverse => pb::LedgerKind::Reverse,
        LedgerKind::Tombstone => pb::LedgerKind::Tombstone,
    };
    Ok(pb::LedgerEntry {
        seq: u64::try_from(entry.seq).unwrap_or(0),
        kind: kind.into(),
        request_id: entry.request_id,
        lock_id: entry.lock_id,
        order_no: entry.order_no,
        lines: lines.into_iter().map(|line| pb::SkuLine { sku: line.sku, quantity: line.quantity }).collect(),
        at_ms: entry.at_ms,
    })
}

fn proto_state(state: LockState) -> pb::LockState {
    match state {
        LockState::Locked => pb::LockState::Locked,
        LockState::Rejected => pb::LockState::Rejected,
        LockState::Reversed => pb::LockState::Reversed,
        LockState::Tombstoned => pb::LockState::Tombstoned,
    }
}

fn proto_result(result: ReverseResult) -> pb::ReverseResult {
    match result {
        ReverseResult::Reversed => pb::ReverseResult::Reversed,
        ReverseResult::Tombstoned => pb::ReverseResult::Tombstoned,
        ReverseResult::NothingToReverse => pb::ReverseResult::NothingToReverse,
        ReverseResult::Irreversible => pb::ReverseResult::Irreversible,
        ReverseResult::VoucherMismatch => pb::ReverseResult::VoucherMismatch,
    }
}
