//! Manual-review tickets: one per (biz_id, step), opened in the same transaction as the
//! MANUAL_REVIEW transition, carrying the evidence a person needs to decide.

use midflight_model::{Saga, TicketDraft};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Statement,
    Value,
};
use serde::Serialize;

use crate::entity::{manual_ticket, saga_transition};
use crate::error::{Context, Error};
use crate::row::fit;
use crate::{Store, dialect};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TicketState {
    Open,
    Resolved,
}

impl TicketState {
    pub fn as_str(self) -> &'static str {
        match self {
            TicketState::Open => "OPEN",
            TicketState::Resolved => "RESOLVED",
        }
    }
}

/// A ticket as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ticket {
    pub biz_id: String,
    pub step: String,
    pub state: TicketState,
    pub reason: String,
    /// JSON: `saga`, `transitions`, `answer`, `request_id`, `voucher`.
    pub evidence: serde_json::Value,
    pub opened_by: String,
    pub opened_at_ms: i64,
    pub resolved_by: Option<String>,
    pub resolved_at_ms: Option<i64>,
    pub resolution: Option<String>,
}

/// Transition-log rows a review ticket's evidence keeps: the latest ones.
const EVIDENCE_TRANSITIONS_MAX: u64 = 200;

impl Store {
    /// Opens the ticket, or reopens a resolved one for the same (biz_id, step); an open one is
    /// left as it is, so a retry that reaches the same decision does not open a second ticket.
    pub(crate) async fn open_ticket(
        &self,
        txn: &DatabaseTransaction,
        saga: &Saga,
        draft: &TicketDraft,
        actor: &str,
    ) -> Result<(), Error> {
        let some = Some(saga.biz_id.as_str());
        // The latest rows, which say how the saga came to need a person; a long history (a
        // takeover at every released try) keeps its start out, not its end.
        let mut log = saga_transition::Entity::find()
            .filter(saga_transition::Column::BizId.eq(saga.biz_id.clone()))
            .order_by_desc(saga_transition::Column::Version)
            .limit(EVIDENCE_TRANSITIONS_MAX)
            .all(txn)
            .await
            .during("read transition log for ticket", some)?;
        log.reverse();
        let (request_id, voucher) = match draft.step {
            midflight_model::Step::Wms => (&saga.wms_request_id, &saga.wms_voucher),
            midflight_model::Step::Logistics => (&saga.logistics_request_id, &saga.logistics_voucher),
        };
        let evidence = serde_json::json!({
            "saga": saga_json(saga),
            "transitions": log,
            "answer": draft.evidence,
            "request_id": request_id,
            "voucher": voucher,
        });
        let reopen = match self.backend {
            sea_orm::DbBackend::MySql => " ON DUPLICATE KEY UPDATE \
                reason = IF(state = 'RESOLVED', VALUES(reason), reason), \
                evidence = IF(state = 'RESOLVED', VALUES(evidence), evidence), \
                opened_by = IF(state = 'RESOLVED', VALUES(opened_by), opened_by), \
                opened_at_ms = IF(state = 'RESOLVED', VALUES(opened_at_ms), opened_at_ms), \
                state = 'OPEN'"
                .to_owned(),
            _ => " ON CONFLICT (biz_id, step) DO UPDATE SET state = 'OPEN', reason = excluded.reason, \
                evidence = excluded.evidence, opened_by = excluded.opened_by, opened_at_ms = excluded.opened_at_ms \
                WHERE manual_ticket.state = 'RESOLVED'"
                .to_owned(),
        };
        let now = dialect::now_ms(self.backend);
        let sql = format!(
            "INSERT INTO manual_ticket (biz_id, step, state, reason, evidence, opened_by, opened_at_ms) \
             VALUES (?, ?, 'OPEN', ?, ?, ?, {now}){reopen}"
        );
        let values: Vec<Value> = vec![
            saga.biz_id.clone().into(),
            draft.step.as_str().into(),
            fit(&draft.reason, 1024).into(),
            evidence.to_string().into(),
            fit(actor, 160).into(),
        ];
        txn.execute_raw(Statement::from_sql_and_values(self.backend, sql, values)).await.during("open ticket", some)?;
        Ok(())
    }

    /// Tickets, newest first, optionally only those in `state`.
    pub async fn tickets(&self, state: Option<TicketState>, limit: u64) -> Result<Vec<Ticket>, Error> {
        let mut query = manual_ticket::Entity::find().order_by_desc(manual_ticket::Column::OpenedAtMs).limit(limit);
        if let Some(state) = state {
            query = query.filter(manual_ticket::Column::State.eq(state.as_str()));
        }
        let rows = query.all(&self.db).await.during("list tickets", None)?;
        rows.into_iter().map(to_ticket).collect()
    }

    /// The keys (a biz_id or `orphan:<request id>`) and steps of the open tickets at one of
    /// `steps`, newest first, at most `limit`: what a reconciliation pass judges again, without
    /// the evidence (each up to a saga row with its payload).
    pub async fn open_ticket_keys_at(&self, steps: &[&str], limit: u64) -> Result<Vec<(String, String)>, Error> {
        manual_ticket::Entity::find()
            .select_only()
            .column(manual_ticket::Column::BizId)
            .column(manual_ticket::Column::Step)
            .filter(manual_ticket::Column::State.eq(TicketState::Open.as_str()))
            .filter(manual_ticket::Column::Step.is_in(steps.iter().copied()))
            .order_by_desc(manual_ticket::Column::OpenedAtMs)
            .limit(limit)
            .into_tuple()
            .all(&self.db)
            .await
            .during("list open tickets", None)
    }

    /// The tickets of one saga.
    pub async fn tickets_of(&self, biz_id: &str) -> Result<Vec<Ticket>, Error> {
        let rows = manual_ticket::Entity::find()
            .filter(manual_ticket::Column::BizId.eq(biz_id))
            .order_by_asc(manual_ticket::Column::Step)
            .all(&self.db)
            .await
            .during("read tickets", Some(biz_id))?;
        rows.into_iter().map(to_ticket).collect()
    }

    /// Number of open tickets (a metric).
    pub async fn open_ticket_count(&self) -> Result<u64, Error> {
        use sea_orm::PaginatorTrait;
        manual_ticket::Entity::find()
            .filter(manual_ticket::Column::State.eq(TicketState::Open.as_str()))
            .count(&self.db)
            .await
            .during("count open tickets", None)
    }
}

fn to_ticket(row: manual_ticket::Model) -> Result<Ticket, Error> {
    let state = match row.state.as_str() {
        "OPEN" => TicketState::Open,
        "RESOLVED" => TicketState::Resolved,
        other => return Err(Error::Corrupt { biz_id: row.biz_id, message: format!("unknown ticket state {other:?}") }),
    };
    let evidence = serde_json::from_str(&row.evidence).unwrap_or(serde_json::Value::String(row.evidence.clone()));
    Ok(Ticket {
        biz_id: row.biz_id,
        step: row.step,
        state,
        reason: row.reason,
        evidence,
        opened_by: row.opened_by,
        opened_at_ms: row.opened_at_ms,
        resolved_by: row.resolved_by,
        resolved_at_ms: row.resolved_at_ms,
        resolution: row.resolution,
    })
}

/// The saga row as JSON, for evidence and for `--json` output.
pub fn saga_json(saga: &Saga) -> serde_json::Value {
    serde_json::json!({
        "biz_id": saga.biz_id,
        "order_no": saga.order_no,
        "event_type": saga.event_type,
        "source": {"topic": saga.source.topic, "partition": saga.source.partition, "offset": saga.source.offset},
        "status": saga.status.as_str(),
        "version": saga.version,
        "wms_request_id": saga.wms_request_id,
        "wms_voucher": saga.wms_voucher,
        "wms_locked_at_ms": saga.wms_locked_at_ms,
        "logistics_request_id": saga.logistics_request_id,
        "logistics_voucher": saga.logistics_voucher,
        "tracking_no": saga.tracking_no,
        "intent_at_ms": saga.intent_at_ms,
        "attempts": saga.attempts,
        "next_attempt_at_ms": saga.next_attempt_at_ms,
        "last_error": saga.last_error,
        "deadline_ms": saga.deadline_ms,
        "owner_id": saga.lease.owner_id,
        "lease_epoch": saga.lease.epoch,
        "lease_until_ms": saga.lease.until_ms,
        "trace_context": saga.trace_context,
        "created_at_ms": saga.created_at_ms,
        "updated_at_ms": saga.updated_at_ms,
        "payload": saga.payload,
    })
}
