//! Where the periodic reconciliation got to (`reconcile_checkpoint`, migrations 0008 and 0009), and the
//! read of what finished since: together they let a pass judge only what changed since the
//! last one instead of both ledgers and the whole table.

use midflight_model::Status;
use sea_orm::{ConnectionTrait, FromQueryResult, Statement, Value};

use crate::error::{Context, Error};
use crate::lookup::{LedgerView, ViewRow, to_view};
use crate::scan::{ScanCursor, Unreadable, keyset_after, keyset_page};
use crate::{Store, dialect, row::signed};

/// How far a reconciliation read: the ledgers up to these sequence numbers, and the sagas
/// finished before `since_ms` (database time).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub wms_seq: u64,
    pub logistics_seq: u64,
    pub since_ms: i64,
    /// What the pass read of the stretch of each ledger just behind its sequence number, as
    /// its reconciler wrote it (`None`: unknown). Kept with the checkpoint, not compared.
    pub wms_unseen: Option<String>,
    pub logistics_unseen: Option<String>,
}

/// One page of [`Store::finished_since`].
#[derive(Debug, Default)]
pub struct FinishedPage {
    pub views: Vec<LedgerView>,
    /// Rows read but not convertible (a negative version).
    pub unreadable: Vec<Unreadable>,
    /// Where the next page starts, when this one was full.
    pub next: Option<ScanCursor>,
}

impl Store {
    /// The checkpoint named `name`, if a pass has written one.
    pub async fn reconcile_checkpoint(&self, name: &str) -> Result<Option<Checkpoint>, Error> {
        let sql = "SELECT wms_seq, logistics_seq, since_ms, wms_unseen, logistics_unseen FROM reconcile_checkpoint \
                   WHERE name = ?";
        let statement = Statement::from_sql_and_values(self.backend, sql, [name.into()]);
        let operation = "read the reconciliation checkpoint";
        let Some(row) = self.db.query_one_raw(statement).await.during(operation, None)? else { return Ok(None) };
        let seq = |column: &str| -> Result<u64, Error> {
            let value: i64 = row.try_get("", column).during(operation, None)?;
            u64::try_from(value)
                .map_err(|_| Error::Invalid(format!("reconcile_checkpoint {name}: negative {column} {value}")))
        };
        let since_ms: i64 = row.try_get("", "since_ms").during(operation, None)?;
        let text = |column: &str| row.try_get::<Option<String>>("", column).during(operation, None);
        Ok(Some(Checkpoint {
            wms_seq: seq("wms_seq")?,
            logistics_seq: seq("logistics_seq")?,
            since_ms,
            wms_unseen: text("wms_unseen")?,
            logistics_unseen: text("logistics_unseen")?,
        }))
    }

    /// Moves the checkpoint `name` from `from` (`None`: there is none yet) to `to`. `false`
    /// when it was not at `from` any more (another pass moved it first): nothing is written.
    /// Only the sequence numbers and `since_ms` are compared; the unseen texts go with them.
    pub async fn advance_reconcile_checkpoint(
        &self,
        name: &str,
        from: Option<&Checkpoint>,
        to: &Checkpoint,
    ) -> Result<bool, Error> {
        let now = dialect::now_ms(self.backend);
        let (sql, values): (String, Vec<Value>) = match from {
            // Not ON DUPLICATE KEY UPDATE: the driver asks MySQL for found rows, so a row left
            // as it was would still count as one.
            None => (
                format!(
                    "INSERT {} INTO reconcile_checkpoint (name, wms_seq, logistics_seq, since_ms, wms_unseen, \
                     logistics_unseen, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, {now})",
                    if self.backend == sea_orm::DbBackend::MySql { "IGNORE" } else { "OR IGNORE" }
                ),
                vec![
                    name.into(),
                    signed(to.wms_seq).into(),
                    signed(to.logistics_seq).into(),
                    to.since_ms.into(),
                    to.wms_unseen.clone().into(),
                    to.logistics_unseen.clone().into(),
                ],
            ),
            Some(from) => (
                format!(
                    "UPDATE reconcile_checkpoint SET wms_seq = ?, logistics_seq = ?, since_ms = ?, wms_unseen = ?, \
                     logistics_unseen = ?, updated_at_ms = {now} \
                     WHERE name = ? AND wms_seq = ? AND logistics_seq = ? AND since_ms = ?"
                ),
                vec![
                    signed(to.wms_seq).into(),
                    signed(to.logistics_seq).into(),
                    to.since_ms.into(),
                    to.wms_unseen.clone().into(),
                    to.logistics_unseen.clone().into(),
                    name.into(),
                    signed(from.wms_seq).into(),
                    signed(from.logistics_seq).into(),
                    from.since_ms.into(),
                ],
            ),
        };
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        let result = self.db.execute_raw(statement).await.during("advance the reconciliation checkpoint", None)?;
        Ok(result.rows_affected() == 1)
    }

    /// Sagas in `status` (DONE or ROLLED_BACK) last written at or after `since_ms`, reduced to
    /// what a ledger comparison needs, a page after `after` in (lease expiry, biz_id) order.
    /// A finished row's `lease_until_ms` is its last write plus at most one lease, so this
    /// returns every saga finished since then (and some finished up to a lease before), read
    /// through `saga_recovery`: the cost follows what finished, not the table's history.
    pub async fn finished_since(
        &self,
        status: Status,
        since_ms: i64,
        after: Option<&ScanCursor>,
        limit: u64,
    ) -> Result<FinishedPage, Error> {
        let mut values: Vec<Value> = vec![status.as_str().into(), since_ms.into()];
        let keyset = keyset_after(after, &mut values);
        values.push(i64::try_from(limit).unwrap_or(i64::MAX).into());
        let sql = format!(
            "SELECT biz_id, order_no, status, version, wms_request_id, logistics_request_id, tracking_no, updated_at_ms, \
             lease_until_ms FROM {} WHERE status = ? AND lease_until_ms >= ? {keyset} ORDER BY lease_until_ms, biz_id LIMIT ?",
            dialect::through_index(self.backend, "saga", "saga_recovery")
        );
        let operation = "read the sagas finished since the last reconciliation";
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        let rows =
            self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
        let (views, unreadable, next) = keyset_page(&rows, limit, operation, |r, biz_id| {
            ViewRow::from_query_result(r, "").during(operation, Some(biz_id)).and_then(to_view)
        })?;
        Ok(FinishedPage { views, unreadable, next })
    }
}
