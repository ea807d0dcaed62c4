//! Operator actions on MANUAL_REVIEW sagas: close them as DONE or ROLLED_BACK after fixing
//! things by hand, or send them back to an intent state for automation to resolve by query.
//! Each is a CAS on the version the operator looked at, recorded in the transition log with
//! the operator's name, and resolves the saga's open tickets in the same transaction. A close
//! writes what automation's would in that transaction: DONE marks the business row SHIPPED
//! with the shipment's tracking number and queues the notification (I3); ROLLED_BACK marks
//! the business row REVERSED.

use midflight_model::{Change, Saga, Status};
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

use crate::error::{Context, Error};
use crate::row::{fit, signed};
use crate::{Cas, Store, dialect};

/// What an operator's writes are logged as, before the operator's name: `operator:<name>`.
pub const OPERATOR_ACTOR: &str = "operator:";

pub use midflight_model::TRACKING_NO_LEN_MAX;

impl Store {
    /// Moves a MANUAL_REVIEW saga to `to`, if it is still at `expected_version`. A move back to
    /// an intent state leaves the lease free and the backoff cleared, so the recovery worker
    /// picks it up at its next scan.
    ///
    /// A move back to an intent state is refused ([`Error::LaterSagaOfOrder`], nothing
    /// written) while a later saga of the order on its partition is in the table, unless that
    /// one is PARKED: a saga in MANUAL_REVIEW counts as finished for the order check, so the
    /// later one may have run already, and automation would then drive the earlier one after
    /// it (I5). Closing it as DONE or ROLLED_BACK is always allowed: it sends nothing.
    ///
    /// DONE needs the shipment's tracking number: `tracking_no`, or the one the saga has (a
    /// given one must be that one). A tracking number with any other target is refused.
    pub async fn resolve(
        &self,
        biz_id: &str,
        expected_version: u64,
        to: Status,
        tracking_no: Option<&str>,
        operator: &str,
        note: &str,
    ) -> Result<Cas<Saga>, Error> {
        let Some(before) = self.get(biz_id).await? else {
            return Err(Error::Invalid(format!("saga {biz_id} does not exist")));
        };
        if before.version != expected_version {
            return Ok(Cas::Conflict);
        }
        let change = Change {
            note: Some(format!("resolved by {operator}: {note}")),
            ..Change::to(&[to], format!("operator: {note}"))
        };
        let now_ms = self.now_ms().await?;
        let mut next = change.apply_by_operator(&before, now_ms)?;
        next.next_attempt_at_ms = 0;
        match (to, tracking_no) {
            (Status::Done, Some(given)) => {
                let given = given.trim();
                if given.is_empty() || given.chars().count() > TRACKING_NO_LEN_MAX {
                    return Err(Error::Invalid(format!(
                        "a tracking number is 1..={TRACKING_NO_LEN_MAX} characters; nothing was written"
                    )));
                }
                if let Some(known) = before.tracking_no.as_deref().filter(|known| *known != given) {
                    return Err(Error::Invalid(format!(
                        "saga {biz_id} has tracking number {known} from logistics, not {given}: closing it as DONE keeps it (leave --tracking-no out); nothing was written"
                    )));
                }
                next.tracking_no = Some(given.to_owned());
            }
            (Status::Done, None) if before.tracking_no.is_none() => {
                return Err(Error::Invalid(format!(
                    "saga {biz_id} has no tracking number: closing it as DONE needs the shipment's; nothing was written"
                )));
            }
            (Status::Done, None) => {}
            (_, Some(_)) => {
                return Err(Error::Invalid(format!(
                    "a tracking number is given only when closing as DONE, not {to}; nothing was written"
                )));
            }
            (_, None) => {}
        }
        let actor = format!("{OPERATOR_ACTOR}{operator}");
        let some = Some(biz_id);
        let txn = self.begin("begin resolve", some).await?;
        let now = dialect::now_ms(self.backend);
        let sql = format!(
            "UPDATE saga SET status = ?, version = ?, last_error = ?, next_attempt_at_ms = 0, attempts = 0, \
             tracking_no = ?, intent_at_ms = ?, updated_at_ms = ?, lease_until_ms = {now} WHERE biz_id = ? AND version = ?"
        );
        let values: Vec<Value> = vec![
            next.status.as_str().into(),
            signed(next.version).into(),
            next.last_error.as_deref().map(|e| fit(e, 1024)).into(),
            next.tracking_no.clone().into(),
            next.intent_at_ms.into(),
            next.updated_at_ms.into(),
            biz_id.into(),
            signed(expected_version).into(),
        ];
        let result = txn
            .execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("resolve saga", some)?;
        if result.rows_affected() == 0 {
            txn.rollback().await.during("roll back resolve", some)?;
            return Ok(Cas::Conflict);
        }
        let log = format!(
            "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?, {now})"
        );
        let values: Vec<Value> = vec![
            biz_id.into(),
            signed(next.version).into(),
            before.status.as_str().into(),
            to.as_str().into(),
            signed(before.lease.epoch).into(),
            fit(&actor, 160).into(),
            fit(&format!("operator: {note}"), 512).into(),
        ];
        txn.execute_raw(Statement::from_sql_and_values(self.backend, log, values)).await.during("log resolve", some)?;
        // The saga's review tickets only: a reconciliation finding under the same key (a
        // double effect the ledgers show) is closed by `close_ticket`, by a person who looked
        // at it, and a finding once resolved is never opened again.
        let close = format!(
            "UPDATE manual_ticket SET state = 'RESOLVED', resolved_by = ?, resolved_at_ms = {now}, resolution = ? \
             WHERE biz_id = ? AND state = 'OPEN' AND step NOT IN (?, ?)"
        );
        let values: Vec<Value> = vec![
            fit(operator, 160).into(),
            fit(note, 1024).into(),
            biz_id.into(),
            crate::WMS_LEDGER_STEP.into(),
            crate::LOGISTICS_LEDGER_STEP.into(),
        ];
        txn.execute_raw(Statement::from_sql_and_values(self.backend, close, values))
            .await
            .during("resolve tickets", some)?;
        // What automation's close would write beside the row: the business row, the notification.
        for step in self.closing_follow_ups(&next) {
            txn.execute_raw(step.statement).await.during(step.operation, Some(&step.biz_id))?;
        }
        // Read last, just before the commit, to keep the window it leaves on MySQL short.
        if !to.is_terminal()
            && let Some((later, later_status)) = later_of_order(&txn, self.backend, &before).await?
        {
            txn.rollback().await.during("roll back resolve", some)?;
            return Err(Error::LaterSagaOfOrder { biz_id: biz_id.to_owned(), later, later_status });
        }
        txn.commit().await.during("commit resolve", some)?;
        self.stats.write_committed();
        Ok(Cas::Applied(next))
    }

    /// The first saga of `saga`'s order on its partition after it that is not PARKED, with its
    /// status: what keeps a MANUAL_REVIEW saga from being sent back to automation.
    pub async fn later_saga_of_order(&self, saga: &Saga) -> Result<Option<(String, String)>, Error> {
        later_of_order(&self.db, self.backend, saga).await
    }
}

/// [`Store::later_saga_of_order`] on `db`; [`Store::resolve`] reads it in its transaction after
/// its writes: on SQLite the first of them took the one write lock, so no saga can be inserted
/// or started until the transaction ends. On MySQL this is a plain read, as is the order check
/// of a later saga's inbox transaction: when the two transactions overlap, neither may see the
/// other's write, and the later saga can start beside the earlier one (design.md, Gaps).
async fn later_of_order<C: ConnectionTrait>(
    db: &C,
    backend: DbBackend,
    saga: &Saga,
) -> Result<Option<(String, String)>, Error> {
    let sql = "SELECT biz_id, status FROM saga WHERE order_no = ? AND src_partition = ? AND src_offset > ? \
               AND src_topic = ? AND status <> ? ORDER BY src_offset LIMIT 1";
    let values: Vec<Value> = vec![
        saga.order_no.clone().into(),
        saga.source.partition.into(),
        saga.source.offset.into(),
        saga.source.topic.clone().into(),
        Status::Parked.as_str().into(),
    ];
    let some = Some(saga.biz_id.as_str());
    let row = db
        .query_one_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .during("look for a later saga of the order", some)?;
    let Some(row) = row else { return Ok(None) };
    let later = row.try_get::<String>("", "biz_id").during("read the later saga's id", some)?;
    let status = row.try_get::<String>("", "status").during("read the later saga's status", some)?;
    Ok(Some((later, status)))
}
