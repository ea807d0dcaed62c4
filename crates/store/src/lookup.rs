//! Reads for reconciliation: which saga owns a downstream request id, and a narrow pass over
//! the whole table.
//!
//! Request ids are one-way hashes of biz_id + step, so a ledger entry is mapped back to its saga
//! through the stored request-id columns (indexed by migration 0006). The table pass reads only
//! the columns a ledger comparison needs, not the payload, so a full pass stays cheap.

use midflight_model::{Saga, Status, Step};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter, QueryOrder, QuerySelect, Statement, Value,
};
use serde::Serialize;

use crate::entity::saga;
use crate::error::{Context, Error};
use crate::scan::Unreadable;
use crate::{BATCH_ROWS_MAX, Store, dialect, row};

/// The part of a saga row a ledger comparison reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerView {
    pub biz_id: String,
    pub order_no: String,
    pub status: Status,
    pub version: u64,
    pub wms_request_id: Option<String>,
    pub logistics_request_id: Option<String>,
    pub tracking_no: Option<String>,
    pub updated_at_ms: i64,
}

impl LedgerView {
    /// The stored request id of `step`, if its intent was ever recorded.
    pub fn request_id(&self, step: Step) -> Option<&str> {
        match step {
            Step::Wms => self.wms_request_id.as_deref(),
            Step::Logistics => self.logistics_request_id.as_deref(),
        }
    }
}

#[derive(Debug, FromQueryResult)]
pub(crate) struct ViewRow {
    biz_id: String,
    order_no: String,
    status: String,
    version: i64,
    wms_request_id: Option<String>,
    logistics_request_id: Option<String>,
    tracking_no: Option<String>,
    updated_at_ms: i64,
}

impl Store {
    /// The sagas whose stored request id of `step` is one of `request_ids` (any number; looked
    /// up in batches of [`BATCH_ROWS_MAX`]), and apart from them the rows found that cannot be
    /// read.
    pub async fn owners_of(&self, step: Step, request_ids: &[String]) -> Result<(Vec<Saga>, Vec<Unreadable>), Error> {
        let column = match step {
            Step::Wms => saga::Column::WmsRequestId,
            Step::Logistics => saga::Column::LogisticsRequestId,
        };
        let (mut out, mut unreadable) = (Vec::with_capacity(request_ids.len()), Vec::new());
        for batch in request_ids.chunks(BATCH_ROWS_MAX) {
            let operation = "look sagas up by request id";
            let rows = self
                .patiently(operation, || {
                    saga::Entity::find().filter(column.is_in(dialect::padded(batch.to_vec()))).all(&self.db)
                })
                .await
                .during(operation, None)?;
            Unreadable::split(rows, |model| model.biz_id.clone(), row::to_saga, &mut out, &mut unreadable);
        }
        Ok((out, unreadable))
    }

    /// The business rows of `order_nos` whose saga row is gone (purged), as (biz_id, business
    /// status); any number of order numbers, looked up in batches of [`BATCH_ROWS_MAX`] through
    /// `orders_order_no`. Business rows are never purged, so they name every saga that reached
    /// its first step: the reconciler derives their request ids to tell a purged saga's
    /// effects from orphans.
    pub async fn purged_business_rows(&self, order_nos: &[String]) -> Result<Vec<(String, String)>, Error> {
        let mut out = Vec::new();
        for batch in order_nos.chunks(BATCH_ROWS_MAX) {
            let batch = dialect::padded(batch.to_vec());
            let sql = format!(
                "SELECT o.biz_id, o.status FROM {} WHERE o.order_no IN ({}) \
                 AND NOT EXISTS (SELECT 1 FROM saga s WHERE s.biz_id = o.biz_id)",
                dialect::through_index(self.backend, "orders AS o", "orders_order_no"),
                dialect::placeholders(batch.len())
            );
            let statement = Statement::from_sql_and_values(self.backend, sql, batch.into_iter().map(Value::from));
            let operation = "look business rows of purged sagas up by order number";
            let rows =
                self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
            for row in rows {
                let biz_id = row.try_get::<String>("", "biz_id").during(operation, None)?;
                out.push((biz_id, row.try_get::<String>("", "status").during(operation, None)?));
            }
        }
        Ok(out)
    }

    /// Every saga in biz_id order, a page at a time, reduced to what a ledger comparison needs.
    /// Rows whose values do not convert are returned apart, so one of them does not stop a
    /// pass over every row after it.
    pub async fn ledger_view_page(&self, after_biz_id: &str, limit: u64) -> Result<ViewPage, Error> {
        let rows = view_columns()
            .filter(saga::Column::BizId.gt(after_biz_id))
            .order_by_asc(saga::Column::BizId)
            .limit(limit)
            .into_model::<ViewRow>()
            .all(&self.db)
            .await
            .during("page through sagas for reconciliation", None)?;
        let next_after = if rows.len() as u64 >= limit { rows.last().map(|row| row.biz_id.clone()) } else { None };
        let mut page = ViewPage { next_after, ..ViewPage::default() };
        page.take(rows);
        Ok(page)
    }

    /// The sagas `biz_ids` names (those that exist), reduced as [`Store::ledger_view_page`]
    /// reduces them, rows that cannot be read apart; looked up in batches of
    /// [`BATCH_ROWS_MAX`].
    pub async fn ledger_views_of(&self, biz_ids: &[String]) -> Result<ViewPage, Error> {
        let mut page = ViewPage::default();
        for batch in biz_ids.chunks(BATCH_ROWS_MAX) {
            let rows = view_columns()
                .filter(saga::Column::BizId.is_in(dialect::padded(batch.to_vec())))
                .into_model::<ViewRow>()
                .all(&self.db)
                .await
                .during("read sagas for reconciliation", None)?;
            page.take(rows);
        }
        Ok(page)
    }
}

/// One page of [`Store::ledger_view_page`].
#[derive(Debug, Default)]
pub struct ViewPage {
    pub views: Vec<LedgerView>,
    /// Rows read but not convertible (an unknown status, a negative version).
    pub unreadable: Vec<Unreadable>,
    /// Where the next page starts (the last row's biz_id, readable or not), when this one was
    /// full.
    pub next_after: Option<String>,
}

impl ViewPage {
    /// Adds `rows` to the page, those that do not convert apart.
    fn take(&mut self, rows: Vec<ViewRow>) {
        Unreadable::split(rows, |row| row.biz_id.clone(), to_view, &mut self.views, &mut self.unreadable);
    }
}

/// The saga table, selecting the columns of a [`ViewRow`].
fn view_columns() -> sea_orm::Select<saga::Entity> {
    saga::Entity::find().select_only().columns([
        saga::Column::BizId,
        saga::Column::OrderNo,
        saga::Column::Status,
        saga::Column::Version,
        saga::Column::WmsRequestId,
        saga::Column::LogisticsRequestId,
        saga::Column::TrackingNo,
        saga::Column::UpdatedAtMs,
    ])
}

pub(crate) fn to_view(row: ViewRow) -> Result<LedgerView, Error> {
    let status = Status::parse(&row.status).ok_or_else(|| {
        Error::Model(midflight_model::Error::UnknownStatus { biz_id: row.biz_id.clone(), text: row.status.clone() })
    })?;
    let version = u64::try_from(row.version).map_err(|_| Error::Corrupt {
        biz_id: row.biz_id.clone(),
        message: format!("negative version {}", row.version),
    })?;
    Ok(LedgerView {
        biz_id: row.biz_id,
        order_no: row.order_no,
        status,
        version,
        wms_request_id: row.wms_request_id,
        logistics_request_id: row.logistics_request_id,
        tracking_no: row.tracking_no,
        updated_at_ms: row.updated_at_ms,
    })
}
