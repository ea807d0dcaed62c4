//! The logistics provider's bookkeeping: creating, cancelling and tombstoning shipments in the
//! database, and reading them back.
//!
//! As in the WMS, each write is one short transaction during this process's [`WriteTurn`], so
//! "is this request id known?" and the write that follows cannot interleave with another call.
//! CreateShipment calls are applied in groups (one transaction for every call queued while the
//! previous one committed, see [`midflight_mock::serial::Group`]), each call answered exactly as
//! if applied alone.

use std::sync::Arc;

use midflight_mock::database::ensure_table;
use midflight_mock::serial::{Group, Waiting, WriteTurn};
use midflight_mock::{Clock, SerialWriter};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionTrait,
};
use tonic::Status;

use crate::entity::{LedgerKind, ShipmentState, ledger, shipment};

/// Most CreateShipment calls applied in one group transaction; more wait for the next.
const GROUP_CALLS_MAX: usize = 256;
/// Rows per multi-row insert of a group (9 parameters a shipment row).
const INSERT_ROWS_MAX: usize = 64;

/// A validated CreateShipment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShipmentOrder {
    pub request_id: String,
    pub order_no: String,
    pub region: String,
    pub voucher: String,
}

/// A validated CancelShipment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelOrder {
    pub request_id: String,
    pub voucher: String,
    pub order_no: String,
}

/// What CancelShipment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelResult {
    Cancelled,
    Tombstoned,
    NothingToCancel,
    Irreversible,
    VoucherMismatch,
}

/// What CancelShipment answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelAnswer {
    pub result: CancelResult,
    pub tracking_no: String,
    pub reason: String,
}

/// The provider's database and the discipline for writing it.
#[derive(Debug)]
pub struct Ledger {
    db: DatabaseConnection,
    writer: SerialWriter,
    clock: Arc<dyn Clock>,
    /// Regions the provider does not serve; a shipment there is rejected.
    unserviceable: Vec<String>,
    /// CreateShipment calls waiting for the next group transaction.
    creates: Group<ShipmentOrder, Result<shipment::Model, Status>>,
}

impl Ledger {
    /// Creates missing tables and picks up the ledger where the last process left it.
    pub async fn open(
        db: DatabaseConnection,
        clock: Arc<dyn Clock>,
        unserviceable: Vec<String>,
    ) -> Result<Ledger, midflight_mock::Error> {
        ensure_table(&db, shipment::Entity).await?;
        ensure_table(&db, ledger::Entity).await?;
        let last = ledger::Entity::find().order_by_desc(ledger::Column::Seq).one(&db).await.map_err(startup)?;
        let last_seq = last.map_or(0, |entry| u64::try_from(entry.seq).unwrap_or(0));
        Ok(Ledger { db, writer: SerialWriter::new(last_seq), clock, unserviceable, creates: Group::default() })
    }

    /// CreateShipment, idempotent on the request id: a known id gets the row's answer.
    pub async fn create(&self, order: ShipmentOrder) -> Result<shipment::Model, Status> {
        self.creates
            .submit(&self.writer, order, |turn, batch| self.apply_creates(turn, batch))
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("shipment group abandoned; its outcome is unknown")))
    }

    /// Applies a group of CreateShipment calls in one transaction and answers each. A failed
    /// transaction fails every call of the group (none of them applied).
    async fn apply_creates(
        &self,
        mut turn: WriteTurn<'_>,
        mut batch: Vec<Waiting<ShipmentOrder, Result<shipment::Model, Status>>>,
    ) {
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(GROUP_CALLS_MAX));
            let group = std::mem::replace(&mut batch, rest);
            let orders: Vec<&ShipmentOrder> = group.iter().map(|w| &w.request).collect();
            match self.try_apply_creates(&mut turn, &orders).await {
                Ok(rows) => {
                    turn.commit_taken();
                    for (waiting, row) in group.into_iter().zip(rows) {
                        let _ = waiting.reply.send(Ok(row));
                    }
                }
                Err(status) => {
                    turn.return_taken();
                    for waiting in group {
                        let _ = waiting.reply.send(Err(status.clone()));
                    }
                }
            }
        }
    }

    async fn try_apply_creates(
        &self,
        turn: &mut WriteTurn<'_>,
        orders: &[&ShipmentOrder],
    ) -> Result<Vec<shipment::Model>, Status> {
        let ids: Vec<&str> = orders.iter().map(|order| order.request_id.as_str()).collect();
        let mut known: std::collections::HashMap<String, shipment::Model> = shipment::Entity::find()
            .filter(shipment::Column::RequestId.is_in(ids))
            .all(&self.db)
            .await
            .map_err(db_error)?
            .into_iter()
            .map(|row| {
                tracing::info!(request_id = %row.request_id, state = ?row.state, "shipment repeated, first answer returned");
                (row.request_id.clone(), row)
            })
            .collect();
        let now_ms = self.clock.now_ms();
        let (mut rows, mut entries, mut answers) = (Vec::new(), Vec::new(), Vec::with_capacity(orders.len()));
        for order in orders {
            if let Some(row) = known.get(&order.request_id) {
                answers.push(row.clone());
                continue;
            }
            let seq = turn.next_seq();
            let rejected = self.unserviceable.iter().any(|region| region == &order.region);
            let (state, tracking_no, reason) = if rejected {
                (ShipmentState::Rejected, String::new(), format!("region {:?} is not serviceable", order.region))
            } else {
                (ShipmentState::Created, format!("TRK{seq:012}"), String::new())
            };
            let row = shipment::Model {
                request_id: order.request_id.clone(),
                order_no: order.order_no.clone(),
                state,
                tracking_no,
                reason,
                voucher: order.voucher.clone(),
                region: order.region.clone(),
                created_at_ms: now_ms,
                updated_at_ms: now_ms,
            };
            let kind = if rejected { LedgerKind::Reject } else { LedgerKind::Create };
            entries.push(ledger_entry(seq, &row, kind));
            rows.push(shipment::ActiveModel::from(row.clone()));
            tracing::info!(request_id = %row.request_id, state = ?row.state, tracking_no = %row.tracking_no, "shipment applied");
            known.insert(row.request_id.clone(), row.clone());
            answers.push(row);
        }
        if rows.is_empty() {
            return Ok(answers);
        }
        let txn = self.db.begin().await.map_err(db_error)?;
        for chunk in rows.chunks(INSERT_ROWS_MAX) {
            shipment::Entity::insert_many(chunk.to_vec()).exec_without_returning(&txn).await.map_err(db_error)?;
        }
        for chunk in entries.chunks(INSERT_ROWS_MAX) {
            ledger::Entity::insert_many(chunk.to_vec()).exec_without_returning(&txn).await.map_err(db_error)?;
        }
        txn.commit().await.map_err(db_error)?;
        Ok(answers)
    }

    /// CancelShipment. `pickup_after_ms` is the pickup time in force (`None`: never picked up).
    pub async fn cancel(&self, order: CancelOrder, pickup_after_ms: Option<i64>) -> Result<CancelAnswer, Status> {
        let turn = self.writer.turn().await;
        let Some(row) = self.find(&order.request_id).await? else { return self.tombstone(turn, order).await };
        let now_ms = self.clock.now_ms();
        let answer = |result, reason: &str| {
            Ok(CancelAnswer { result, tracking_no: row.tracking_no.clone(), reason: reason.to_owned() })
        };
        if row.voucher != order.voucher {
            return answer(CancelResult::VoucherMismatch, "voucher does not match the one stored with the shipment");
        }
        match row.state {
            ShipmentState::Rejected => answer(CancelResult::NothingToCancel, "the shipment was rejected"),
            ShipmentState::Cancelled => answer(CancelResult::Cancelled, "already cancelled"),
            ShipmentState::Tombstoned => answer(CancelResult::Tombstoned, "already tombstoned"),
            ShipmentState::Created if !cancellable(&row, pickup_after_ms, now_ms) => {
                answer(CancelResult::Irreversible, "picked up already; the shipment stays live")
            }
            ShipmentState::Created => {
                let mut turn = turn;
                let seq = turn.next_seq();
                let cancelled =
                    shipment::Model { state: ShipmentState::Cancelled, updated_at_ms: now_ms, ..row.clone() };
                self.write(turn, seq, &cancelled, LedgerKind::Cancel, RowChange::Update).await?;
                tracing::info!(request_id = %row.request_id, tracking_no = %row.tracking_no, "shipment cancelled");
                answer(CancelResult::Cancelled, "")
            }
        }
    }

    /// QueryShipment: the row under `request_id`, if any.
    pub async fn find(&self, request_id: &str) -> Result<Option<shipment::Model>, Status> {
        shipment::Entity::find_by_id(request_id.to_owned()).one(&self.db).await.map_err(db_error)
    }

    /// ListLedger: up to `limit` entries after `cursor`, in order.
    /// With `request_ids`, only the entries under them.
    pub async fn list(&self, cursor: u64, limit: u64, request_ids: Vec<String>) -> Result<Vec<ledger::Model>, Status> {
        let after = i64::try_from(cursor).unwrap_or(i64::MAX);
        let mut find = ledger::Entity::find().filter(ledger::Column::Seq.gt(after));
        if !request_ids.is_empty() {
            find = find.filter(ledger::Column::RequestId.is_in(request_ids));
        }
        find.order_by_asc(ledger::Column::Seq).limit(limit).all(&self.db).await.map_err(db_error)
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    async fn tombstone(&self, mut turn: WriteTurn<'_>, order: CancelOrder) -> Result<CancelAnswer, Status> {
        let now_ms = self.clock.now_ms();
        let seq = turn.next_seq();
        let row = shipment::Model {
            request_id: order.request_id,
            order_no: order.order_no,
            state: ShipmentState::Tombstoned,
            tracking_no: String::new(),
            reason: "cancelled before any shipment was created".to_owned(),
            voucher: order.voucher,
            region: String::new(),
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        };
        self.write(turn, seq, &row, LedgerKind::Tombstone, RowChange::Insert).await?;
        tracing::info!(request_id = %row.request_id, "tombstone recorded");
        let reason = "no shipment existed; later creations are refused".to_owned();
        Ok(CancelAnswer { result: CancelResult::Tombstoned, tracking_no: String::new(), reason })
    }

    /// Writes `row` and appends its ledger entry, in one transaction.
    async fn write(
        &self,
        turn: WriteTurn<'_>,
        seq: u64,
        row: &shipment::Model,
        kind: LedgerKind,
        change: RowChange,
    ) -> Result<(), Status> {
        let txn = self.db.begin().await.map_err(db_error)?;
        if change == RowChange::Update {
            shipment::Entity::update_many()
                .col_expr(shipment::Column::State, Expr::value(row.state))
                .col_expr(shipment::Column::UpdatedAtMs, Expr::value(row.updated_at_ms))
                .filter(shipment::Column::RequestId.eq(row.request_id.as_str()))
                .exec(&txn)
                .await
                .map_err(db_error)?;
        } else {
            let active: shipment::ActiveModel = row.clone().into();
            shipment::Entity::insert(active).exec_without_returning(&txn).await.map_err(db_error)?;
        }
        ledger::Entity::insert(ledger_entry(seq, row, kind)).exec_without_returning(&txn).await.map_err(db_error)?;
        txn.commit().await.map_err(db_error)?;
        turn.committed();
        Ok(())
    }
}

/// The ledger entry of a write to `row`.
fn ledger_entry(seq: u64, row: &shipment::Model, kind: LedgerKind) -> ledger::ActiveModel {
    ledger::ActiveModel {
        seq: Set(i64::try_from(seq).unwrap_or(i64::MAX)),
        kind: Set(kind),
        request_id: Set(row.request_id.clone()),
        tracking_no: Set(row.tracking_no.clone()),
        order_no: Set(row.order_no.clone()),
        at_ms: Set(row.updated_at_ms),
    }
}

/// Whether a write creates the shipment row or changes the existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowChange {
    Insert,
    Update,
}

/// Whether CancelShipment can still succeed on `row`: created, and not yet picked up.
pub fn cancellable(row: &shipment::Model, pickup_after_ms: Option<i64>, now_ms: i64) -> bool {
    row.state == ShipmentState::Created
        && pickup_after_ms.is_none_or(|pickup| now_ms.saturating_sub(row.created_at_ms) < pickup)
}

/// A database failure: the caller cannot know whether a write committed.
fn db_error(error: DbErr) -> Status {
    Status::internal(format!("ledger database: {error}"))
}

fn startup(source: DbErr) -> midflight_mock::Error {
    midflight_mock::Error::Database { context: "cannot prepare the logistics ledger".to_owned(), source }
}
