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
use sea_orm::{ConnectionTrait, FromQueryResult, QueryResult, Statement, Value};

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

/// One page of the recovery scan: the sagas read, the rows that could not be read, and where
/// the next page starts (`None` when this page was the last).
#[derive(Debug, Default)]
pub struct ScanPage {
    pub sagas: Vec<Saga>,
    /// Rows the scan matched whose values do not convert (a negative version, a column that
    /// does not decode): no one can drive them until a person repairs the row. They are
    /// returned, not failed, so one such row does not stop the scan of every row behind it.
    pub unreadable: Vec<Unreadable>,
    pub next: Option<ScanCursor>,
}

/// A row the scan matched but could not read, and why.
#[derive(Debug)]
pub struct Unreadable {
    pub biz_id: String,
    pub error: Error,
}

impl Unreadable {
    /// Each of `rows` converted onto `read`, those that do not convert onto `unreadable` under
    /// the biz_id `biz_id` reads off them.
    pub(crate) fn split<R, T>(
        rows: impl IntoIterator<Item = R>,
        biz_id: impl Fn(&R) -> String,
        convert: impl Fn(R) -> Result<T, Error>,
        read: &mut Vec<T>,
        unreadable: &mut Vec<Unreadable>,
    ) {
        for row in rows {
            let id = biz_id(&row);
            match convert(row) {
                Ok(value) => read.push(value),
                Err(error) => unreadable.push(Unreadable { biz_id: id, error }),
            }
        }
    }
}

impl Store {
    /// Like [`Store::abandoned`], but only rows after `cursor` in (lease expiry, biz_id) order,
    /// at most `limit`, with the cursor of the next page when this one is full. The cursor is
    /// taken from the last row matched, readable or not.
    pub async fn abandoned_after(&self, cursor: Option<&ScanCursor>, limit: u64) -> Result<ScanPage, Error> {
        let now = dialect::now_ms(self.backend);
        let mut values: Vec<Value> = Vec::with_capacity(4);
        let after = keyset_after(cursor, &mut values);
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
        let (sagas, unreadable, next) = keyset_page(&rows, limit, operation, |r, biz_id| {
            saga::Model::from_query_result(r, "").during(operation, Some(biz_id)).and_then(row::to_saga)
        })?;
        Ok(ScanPage { sagas, unreadable, next })
    }
}

/// The condition (and its values, pushed on `values`) of the rows after `cursor` in
/// (lease expiry, biz_id) order.
pub(crate) fn keyset_after(cursor: Option<&ScanCursor>, values: &mut Vec<Value>) -> &'static str {
    let Some(cursor) = cursor else { return "" };
    values.extend([cursor.lease_until_ms.into(), cursor.lease_until_ms.into(), cursor.biz_id.clone().into()]);
    "AND (lease_until_ms > ? OR (lease_until_ms = ? AND biz_id > ?))"
}

/// What [`keyset_page`] returns: the rows read, those that do not convert, the next cursor.
pub(crate) type Keyed<T> = (Vec<T>, Vec<Unreadable>, Option<ScanCursor>);

/// A page of `rows` in (lease expiry, biz_id) order, read with `convert`: the rows read, those
/// that do not convert apart, and the cursor of the next page when `limit` rows came back. The
/// two columns the order and the cursor are made of are read first: a row without them cannot
/// be stepped over, and fails the page.
pub(crate) fn keyset_page<T>(
    rows: &[QueryResult],
    limit: u64,
    operation: &'static str,
    convert: impl Fn(&QueryResult, &str) -> Result<T, Error>,
) -> Result<Keyed<T>, Error> {
    let (mut read, mut unreadable, mut last) = (Vec::with_capacity(rows.len()), Vec::new(), None);
    for r in rows {
        let biz_id: String = r.try_get("", "biz_id").during(operation, None)?;
        let lease_until_ms: i64 = r.try_get("", "lease_until_ms").during(operation, Some(&biz_id))?;
        match convert(r, &biz_id) {
            Ok(value) => read.push(value),
            Err(error) => unreadable.push(Unreadable { biz_id: biz_id.clone(), error }),
        }
        last = Some(ScanCursor { lease_until_ms, biz_id });
    }
    let next = if rows.len() as u64 >= limit { last } else { None };
    Ok((read, unreadable, next))
}
