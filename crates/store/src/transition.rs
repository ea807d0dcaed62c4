//! Transitions: one compare-and-set on (version, lease epoch), the transition-log rows, and the
//! writes that must be atomic with the status (business row, outbox row, ticket), in one
//! short transaction.

use midflight_model::{BusinessWrite, Change, Saga};
use sea_orm::{ConnectionTrait, DatabaseTransaction, Statement, TransactionTrait, Value};

use crate::error::{Context, Error};
use crate::row::{fit, signed};
use crate::{Cas, Store, dialect};

/// Who writes, for the transition log: `consumer:<id>`, `recovery:<id>`, `operator:<name>`.
pub type Actor<'a> = &'a str;

impl Store {
    /// Writes `change` to a saga the caller holds at `before.version` / `before.lease.epoch`.
    /// `now_ms` is the caller's database-clock reading (see [`Store::now_ms`]); the lease is
    /// renewed for `lease_ms` from the database clock, or released if the change says so.
    /// An illegal status edge is an error naming the saga; a lost race is [`Cas::Conflict`].
    pub async fn write(
        &self,
        before: &Saga,
        change: &Change,
        now_ms: i64,
        lease_ms: i64,
        actor: Actor<'_>,
    ) -> Result<Cas<Saga>, Error> {
        let next = change.apply(before, now_ms)?;
        self.write_next(before, next, change, lease_ms, actor).await
    }

    pub(crate) async fn write_next(
        &self,
        before: &Saga,
        mut next: Saga,
        change: &Change,
        lease_ms: i64,
        actor: Actor<'_>,
    ) -> Result<Cas<Saga>, Error> {
        let some = Some(before.biz_id.as_str());
        let txn = self.db.begin().await.during("begin transition", some)?;
        if !self.update_row(&txn, before, &next, if change.release_lease { 0 } else { lease_ms }).await? {
            txn.rollback().await.during("roll back transition", some)?;
            return Ok(Cas::Conflict);
        }
        self.log_edges(&txn, before, change, actor, next.lease.epoch).await?;
        if let Some(business) = change.business {
            self.business_write(&txn, &next, business).await?;
        }
        if change.notify {
            self.insert_outbox(&txn, &next).await?;
        }
        if let Some(ticket) = &change.ticket {
            self.open_ticket(&txn, &next, ticket, actor).await?;
        }
        txn.commit().await.during("commit transition", some)?;
        next.lease.until_ms = if change.release_lease { next.updated_at_ms } else { next.updated_at_ms + lease_ms };
        Ok(Cas::Applied(next))
    }

    /// The compare-and-set itself. Returns whether the row matched.
    async fn update_row(
        &self,
        txn: &DatabaseTransaction,
        before: &Saga,
        next: &Saga,
        lease_ms: i64,
    ) -> Result<bool, Error> {
        let now = dialect::now_ms(self.backend);
        let sql = format!(
            "UPDATE saga SET status = ?, version = ?, wms_request_id = ?, wms_voucher = ?, wms_locked_at_ms = ?, \
             logistics_request_id = ?, logistics_voucher = ?, tracking_no = ?, intent_at_ms = ?, attempts = ?, \
             next_attempt_at_ms = ?, last_error = ?, updated_at_ms = ?, lease_until_ms = {now} + ? \
             WHERE biz_id = ? AND version = ? AND lease_epoch = ?"
        );
        let values: Vec<Value> = vec![
            next.status.as_str().into(),
            signed(next.version).into(),
            next.wms_request_id.clone().into(),
            next.wms_voucher.clone().into(),
            next.wms_locked_at_ms.into(),
            next.logistics_request_id.clone().into(),
            next.logistics_voucher.clone().into(),
            next.tracking_no.clone().into(),
            next.intent_at_ms.into(),
            i32::try_from(next.attempts).unwrap_or(i32::MAX).into(),
            next.next_attempt_at_ms.into(),
            next.last_error.as_deref().map(|e| fit(e, 1024)).into(),
            next.updated_at_ms.into(),
            lease_ms.into(),
            before.biz_id.clone().into(),
            signed(before.version).into(),
            signed(before.lease.epoch).into(),
        ];
        let result = txn
            .execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("compare-and-set saga", Some(&before.biz_id))?;
        Ok(result.rows_affected() == 1)
    }

    async fn log_edges(
        &self,
        txn: &DatabaseTransaction,
        before: &Saga,
        change: &Change,
        actor: Actor<'_>,
        epoch: u64,
    ) -> Result<(), Error> {
        let edges = change.edges(before);
        if edges.is_empty() {
            return Ok(());
        }
        let now = dialect::now_ms(self.backend);
        let rows = vec![format!("(?, ?, ?, ?, ?, ?, ?, {now})"); edges.len()].join(", ");
        let sql = format!(
            "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms) VALUES {rows}"
        );
        let mut values: Vec<Value> = Vec::with_capacity(edges.len() * 7);
        for (from, to, version) in edges {
            values.extend([
                before.biz_id.clone().into(),
                signed(version).into(),
                from.as_str().into(),
                to.as_str().into(),
                signed(epoch).into(),
                fit(actor, 160).into(),
                fit(&change.reason, 512).into(),
            ]);
        }
        txn.execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("append transition log", Some(&before.biz_id))?;
        Ok(())
    }

    async fn business_write(&self, txn: &DatabaseTransaction, saga: &Saga, write: BusinessWrite) -> Result<(), Error> {
        let (sql, values): (String, Vec<Value>) = match write {
            BusinessWrite::Write => {
                let amount_cents = saga.order().map(|order| order.amount_cents).unwrap_or(0);
                (
                    format!(
                        "INSERT INTO orders (biz_id, order_no, event_type, status, amount_cents, tracking_no, created_at_ms, updated_at_ms) \
                         VALUES (?, ?, ?, 'FULFILLING', ?, NULL, ?, ?){}",
                        dialect::on_conflict_do_nothing(self.backend, "biz_id")
                    ),
                    vec![
                        saga.biz_id.clone().into(),
                        saga.order_no.clone().into(),
                        saga.event_type.clone().into(),
                        amount_cents.into(),
                        saga.updated_at_ms.into(),
                        saga.updated_at_ms.into(),
                    ],
                )
            }
            BusinessWrite::Fulfil => (
                "UPDATE orders SET status = 'SHIPPED', tracking_no = ?, updated_at_ms = ? WHERE biz_id = ?".to_owned(),
                vec![saga.tracking_no.clone().into(), saga.updated_at_ms.into(), saga.biz_id.clone().into()],
            ),
            BusinessWrite::Reverse => (
                "UPDATE orders SET status = 'REVERSED', updated_at_ms = ? WHERE biz_id = ?".to_owned(),
                vec![saga.updated_at_ms.into(), saga.biz_id.clone().into()],
            ),
        };
        txn.execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("write business row", Some(&saga.biz_id))?;
        Ok(())
    }

    async fn insert_outbox(&self, txn: &DatabaseTransaction, saga: &Saga) -> Result<(), Error> {
        let payload = serde_json::json!({
            "kind": "ORDER_SHIPPED",
            "biz_id": saga.biz_id,
            "order_no": saga.order_no,
            "event_type": saga.event_type,
            "tracking_no": saga.tracking_no,
        })
        .to_string();
        let sql = format!(
            "INSERT INTO outbox (biz_id, payload, trace_context, created_at_ms, relay_owner, relay_until_ms, published_at_ms) \
             VALUES (?, ?, ?, ?, NULL, 0, NULL){}",
            dialect::on_conflict_do_nothing(self.backend, "biz_id")
        );
        let values: Vec<Value> = vec![
            saga.biz_id.clone().into(),
            payload.into(),
            saga.trace_context.clone().into(),
            saga.updated_at_ms.into(),
        ];
        txn.execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("write outbox row", Some(&saga.biz_id))?;
        Ok(())
    }
}
