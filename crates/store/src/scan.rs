//! The recovery scan, a page at a time: abandoned sagas in (lease expiry, biz_id) order after
//! a cursor.
//!
//! [`Store::abandoned`] always returns the longest-expired rows first. A recovery worker skips
//! some of those without claiming them (a RECEIVED saga waiting for an earlier saga of its
//! order), and skipped rows keep their place at the head of that order: with a full batch of
//! them, every scan would return the same rows and nothing behind them would ever be picked
//! up. Paging with a keyset cursor walks past them to the end of the backlog, and the next
//! scan starts from the beginning again.

use midflight_model::Saga;
use sea_orm::{ConnectionTrait, FromQueryResult, Statement, Value};

use crate::entity::saga;
use crate::error::{Context, Error};
use crate::lease::active_list;
use crate::{Store, dialect, row};

/// Where a page of the recovery scan ended: its last row's lease expiry and biz_id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanCursor {
    pub lease_until_ms: i64,
    pub biz_id: String,
}

impl ScanCursor {
    /// The cursor just past `saga`.
    pub fn after(saga: &Saga) -> ScanCursor {
        ScanCursor { lease_until_ms: saga.lease.until_ms, biz_id: saga.biz_id.clone() }
    }
}

impl Store {
    /// Like [`Store::abandoned`], but only rows after `cursor` in (lease expiry, biz_id) order,
    /// at most `limit`. `None` starts from the longest-expired row.
    pub async fn abandoned_after(&self, cursor: Option<&ScanCursor>, limit: u64) -> Result<Vec<Saga>, Error> {
        let now = dialect::now_ms(self.backend);
        let mut values: Vec<Value> = Vec::with_capacity(4);
        let after = match cursor {
            Some(cursor) => {
                values.extend([
                    cursor.lease_until_ms.into(),
                    cursor.lease_until_ms.into(),
                    cursor.biz_id.clone().into(),
                ]);
                "AND (lease_until_ms > ? OR (lease_until_ms = ? AND biz_id > ?))"
            }
            None => "",
        };
        let sql = format!(
            "SELECT * FROM saga WHERE status IN ({}) AND lease_until_ms <= {now} AND next_attempt_at_ms <= {now} \
             {after} ORDER BY lease_until_ms, biz_id LIMIT ?",
            active_list()
        );
        values.push(i64::try_from(limit).unwrap_or(i64::MAX).into());
        let operation = "scan abandoned sagas after a cursor";
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        let rows =
            self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
        rows.iter()
            .map(|r| saga::Model::from_query_result(r, "").during(operation, None).and_then(row::to_saga))
            .collect()
    }
}
