//! Reads: one saga, its timeline, the recovery scan, the per-order check, listings and counts.
//! Reads take no locks; anything decided from a read is written back with a CAS.

use midflight_model::{Saga, Status};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Statement, Value};
use serde::Serialize;

use crate::entity::{orders, saga, saga_transition};
use crate::error::{Context, Error};
use crate::lease::{active_list, terminal_list};
use crate::row::{self};
use crate::{BATCH_ROWS_MAX, Store, dialect};
use std::collections::{HashMap, HashSet};

/// One row of the transition log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub biz_id: String,
    pub version: u64,
    pub from: Option<Status>,
    pub to: Status,
    pub lease_epoch: u64,
    pub actor: String,
    pub reason: String,
    pub at_ms: i64,
    /// How long the downstream call whose answer this transition records took (ms), as the
    /// writer measured it; `None` when the transition follows no call.
    pub call_ms: Option<u64>,
}

impl Transition {
    /// A takeover changes the owner, not the status.
    pub fn is_takeover(&self) -> bool {
        self.reason == "takeover"
    }
}

/// What [`Store::count_status_from`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeCount {
    /// Rows in the status whose lease expiry is at or after the range's start.
    pub from: u64,
    /// Of those, the rows whose lease expiry is before the bound given.
    pub below: u64,
    /// The database clock, in the same statement.
    pub now_ms: i64,
}

/// A row of the business table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderRow {
    pub biz_id: String,
    pub order_no: String,
    pub status: String,
    pub tracking_no: Option<String>,
}

impl Store {
    pub async fn get(&self, biz_id: &str) -> Result<Option<Saga>, Error> {
        let row = self
            .patiently("read saga", || saga::Entity::find_by_id(biz_id.to_owned()).one(&self.db))
            .await
            .during("read saga", Some(biz_id))?;
        row.map(row::to_saga).transpose()
    }

    /// Abandoned sagas: not terminal, lease expired and backoff over by the database clock,
    /// longest-expired first, at most `limit` (served by the `saga_recovery` index).
    pub async fn abandoned(&self, limit: u64) -> Result<Vec<Saga>, Error> {
        let now = dialect::now_ms(self.backend);
        let sql = format!(
            "SELECT * FROM saga WHERE status IN ({}) AND lease_until_ms <= {now} AND next_attempt_at_ms <= {now} \
             ORDER BY lease_until_ms LIMIT ?",
            active_list()
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.sagas_by_sql(sql, vec![limit.into()], "scan abandoned sagas").await
    }

    /// The biz_id of an earlier unfinished saga of the same order on the same partition, if
    /// any: a saga starts only when this is `None` (per-order order, I5).
    pub async fn earlier_unfinished(&self, saga: &Saga) -> Result<Option<String>, Error> {
        let sql = format!(
            "SELECT biz_id FROM saga WHERE order_no = ? AND src_partition = ? AND src_offset < ? AND src_topic = ? \
             AND status NOT IN ({}) ORDER BY src_offset LIMIT 1",
            terminal_list()
        );
        let values: Vec<Value> = vec![
            saga.order_no.clone().into(),
            saga.source.partition.into(),
            saga.source.offset.into(),
            saga.source.topic.clone().into(),
        ];
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        let operation = "check earlier sagas of the order";
        let row = self
            .patiently(operation, || self.db.query_one_raw(statement.clone()))
            .await
            .during(operation, Some(&saga.biz_id))?;
        row.map(|r| r.try_get::<String>("", "biz_id")).transpose().during("read earlier saga id", Some(&saga.biz_id))
    }

    /// Sagas in `status` (or any), least recently updated first: the oldest work is the most interesting.
    pub async fn list(&self, status: Option<Status>, limit: u64) -> Result<Vec<Saga>, Error> {
        let mut query = saga::Entity::find().order_by_asc(saga::Column::UpdatedAtMs).limit(limit);
        if let Some(status) = status {
            query = query.filter(saga::Column::Status.eq(status.as_str()));
        }
        let rows = query.all(&self.db).await.during("list sagas", None)?;
        rows.into_iter().map(row::to_saga).collect()
    }

    /// Non-terminal sagas not updated for `older_than_ms`: stuck candidates for an operator.
    pub async fn stuck(&self, older_than_ms: i64, limit: u64) -> Result<Vec<Saga>, Error> {
        let now = self.now_ms().await?;
        let active: Vec<&str> = Status::ALL.iter().filter(|s| !s.is_terminal()).map(|s| s.as_str()).collect();
        let rows = saga::Entity::find()
            .filter(saga::Column::Status.is_in(active))
            .filter(saga::Column::UpdatedAtMs.lt(now - older_than_ms))
            .order_by_asc(saga::Column::UpdatedAtMs)
            .limit(limit)
            .all(&self.db)
            .await
            .during("list stuck sagas", None)?;
        rows.into_iter().map(row::to_saga).collect()
    }

    /// Every saga, in biz_id order, a page at a time (for the invariant checker).
    pub async fn page(&self, after_biz_id: &str, limit: u64) -> Result<Vec<Saga>, Error> {
        let rows = saga::Entity::find()
            .filter(saga::Column::BizId.gt(after_biz_id))
            .order_by_asc(saga::Column::BizId)
            .limit(limit)
            .all(&self.db)
            .await
            .during("page through sagas", None)?;
        rows.into_iter().map(row::to_saga).collect()
    }

    /// The timeline of one saga.
    pub async fn transitions(&self, biz_id: &str) -> Result<Vec<Transition>, Error> {
        let rows = saga_transition::Entity::find()
            .filter(saga_transition::Column::BizId.eq(biz_id))
            .order_by_asc(saga_transition::Column::Version)
            .all(&self.db)
            .await
            .during("read transition log", Some(biz_id))?;
        rows.into_iter().map(to_transition).collect()
    }

    /// The whole transition log in (biz_id, version) order, a page at a time (for the checker).
    pub async fn transitions_page(&self, after: Option<(&str, u64)>, limit: u64) -> Result<Vec<Transition>, Error> {
        use sea_orm::Condition;
        let mut query = saga_transition::Entity::find()
            .order_by_asc(saga_transition::Column::BizId)
            .order_by_asc(saga_transition::Column::Version)
            .limit(limit);
        if let Some((biz_id, version)) = after {
            let version = i64::try_from(version).unwrap_or(i64::MAX);
            query = query.filter(
                Condition::any().add(saga_transition::Column::BizId.gt(biz_id)).add(
                    Condition::all()
                        .add(saga_transition::Column::BizId.eq(biz_id))
                        .add(saga_transition::Column::Version.gt(version)),
                ),
            );
        }
        let rows = query.all(&self.db).await.during("page through the transition log", None)?;
        rows.into_iter().map(to_transition).collect()
    }

    /// Business rows in biz_id order, a page at a time (for the checker).
    pub async fn orders_page(&self, after_biz_id: &str, limit: u64) -> Result<Vec<OrderRow>, Error> {
        let rows = orders::Entity::find()
            .filter(orders::Column::BizId.gt(after_biz_id))
            .order_by_asc(orders::Column::BizId)
            .limit(limit)
            .all(&self.db)
            .await
            .during("page through orders", None)?;
        Ok(rows
            .into_iter()
            .map(|r| OrderRow { biz_id: r.biz_id, order_no: r.order_no, status: r.status, tracking_no: r.tracking_no })
            .collect())
    }

    /// Number of takeovers recorded across all sagas.
    pub async fn takeover_count(&self) -> Result<u64, Error> {
        use sea_orm::PaginatorTrait;
        saga_transition::Entity::find()
            .filter(saga_transition::Column::Reason.eq("takeover"))
            .count(&self.db)
            .await
            .during("count takeovers", None)
    }

    /// Sagas per status, and the oldest `updated_at_ms` per status, over the whole table (for
    /// reports and tools: it reads every row, finished ones included).
    pub async fn status_summary(&self) -> Result<Vec<(Status, u64, i64)>, Error> {
        self.summary("SELECT status, COUNT(*) AS n, MIN(updated_at_ms) AS oldest FROM saga GROUP BY status").await
    }

    /// [`Store::status_summary`] of the unfinished statuses only, read through the
    /// `saga_recovery` index (status first): its cost follows the sagas in flight, not the
    /// table's history (every finished saga, until a purge deletes it), so it can run every
    /// few seconds.
    pub async fn unfinished_summary(&self) -> Result<Vec<(Status, u64, i64)>, Error> {
        self.summary(&unfinished_summary_sql(self.backend)).await
    }

    /// For each finished status (DONE, ROLLED_BACK), the earliest `lease_until_ms` of the
    /// table's rows (a finished row's last write plus at most one lease): how far back the
    /// finished sagas still kept go. Two reads of the first entry of `saga_recovery`, whatever
    /// the table holds.
    pub async fn oldest_finished(&self) -> Result<Vec<(Status, i64)>, Error> {
        let mut out = Vec::with_capacity(2);
        for status in Status::FINISHED {
            let sql = oldest_finished_sql(self.backend);
            let statement = Statement::from_sql_and_values(self.backend, sql, [status.as_str().into()]);
            let operation = "read the oldest finished saga";
            let row = self.db.query_one_raw(statement).await.during(operation, None)?;
            let oldest = row.map(|row| row.try_get::<Option<i64>>("", "oldest")).transpose().during(operation, None)?;
            if let Some(oldest) = oldest.flatten() {
                out.push((status, oldest));
            }
        }
        Ok(out)
    }

    /// Saga rows whose status is none this version knows (written by a newer version, or by
    /// hand), by status text (each count stops at [`UNKNOWN_COUNT_MAX`]), and whether more
    /// distinct statuses were left unread. The recovery scan and the reconciler select
    /// statuses by name, so they never meet such rows (the order check counts them as
    /// unfinished, so later sagas of their orders wait). The table's distinct statuses are
    /// walked one seek of `saga_recovery` (status first) each, at most
    /// [`STATUSES_WALKED_MAX`], and each unknown one counted on it: the cost follows the number
    /// of statuses, not of rows, so it can run with every sample.
    ///
    /// On MySQL the column compares case-insensitively (and, on MariaDB, ignoring trailing
    /// spaces), so `done` or `DONE ` is selected as DONE, met by the scan and the reconciler
    /// and stepped over as a row that cannot be read; such a text is not counted here.
    pub async fn unknown_statuses(&self) -> Result<(Vec<(String, u64)>, bool), Error> {
        let operation = "read the table's statuses";
        let (mut unknown, mut after) = (Vec::new(), None::<String>);
        for walked in 0..=STATUSES_WALKED_MAX {
            let next = Statement::from_sql_and_values(
                self.backend,
                next_status_sql(self.backend, after.is_some()),
                [after.take().unwrap_or_default().into()],
            );
            let Some(row) = self.db.query_one_raw(next).await.during(operation, None)? else {
                return Ok((unknown, false));
            };
            if walked == STATUSES_WALKED_MAX {
                return Ok((unknown, true));
            }
            let status = row.try_get::<String>("", "status").during(operation, None)?;
            if Status::parse(&status).is_none() && !self.selected_as_known(&status) {
                let count = Statement::from_sql_and_values(
                    self.backend,
                    format!(
                        "SELECT COUNT(*) AS n FROM (SELECT 1 AS one FROM {} WHERE status = ? LIMIT {UNKNOWN_COUNT_MAX}) counted",
                        dialect::through_index(self.backend, "saga", "saga_recovery")
                    ),
                    [status.clone().into()],
                );
                let row = self.db.query_one_raw(count).await.during(operation, None)?;
                let n = row.map(|row| row.try_get::<i64>("", "n")).transpose().during(operation, None)?.unwrap_or(0);
                unknown.push((status.clone(), u64::try_from(n).unwrap_or(0)));
            }
            after = Some(status);
        }
        Ok((unknown, true))
    }

    /// Whether the database selects `status` as one of the known statuses (see
    /// [`Store::unknown_statuses`]).
    fn selected_as_known(&self, status: &str) -> bool {
        self.backend == sea_orm::DbBackend::MySql && Status::parse(&status.trim_end().to_ascii_uppercase()).is_some()
    }

    async fn summary(&self, sql: &str) -> Result<Vec<(Status, u64, i64)>, Error> {
        let rows = self
            .db
            .query_all_raw(Statement::from_string(self.backend, sql))
            .await
            .during("summarise statuses", None)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let text: String = r.try_get("", "status").during("read status summary", None)?;
            let count: i64 = r.try_get("", "n").during("read status summary", None)?;
            let oldest: i64 = r.try_get("", "oldest").during("read status summary", None)?;
            let status = Status::parse(&text).ok_or_else(|| Error::Corrupt {
                biz_id: "(summary)".to_owned(),
                message: format!("unknown status {text:?} in the table"),
            })?;
            out.push((status, u64::try_from(count).unwrap_or(0), oldest));
        }
        Ok(out)
    }

    /// Of `sagas` (rows just inserted), the biz_ids that may have to wait for an earlier
    /// unfinished saga of their order on their partition: [`Store::earlier_unfinished`] for a
    /// whole batch in one query per chunk. A saga not returned has no such predecessor now.
    pub async fn maybe_blocked(&self, sagas: &[&Saga]) -> Result<HashSet<String>, Error> {
        self.patiently("check earlier sagas of a batch's orders", || self.maybe_blocked_on(&self.db, sagas)).await
    }

    /// [`Store::maybe_blocked`] on `conn` (inside the inbox transaction that inserted the rows).
    pub(crate) async fn maybe_blocked_on<C: ConnectionTrait>(
        &self,
        conn: &C,
        sagas: &[&Saga],
    ) -> Result<HashSet<String>, Error> {
        let first_unfinished = self.first_unfinished_on(conn, sagas).await?;
        Ok(held_back(sagas, &first_unfinished))
    }

    /// Per order, topic and partition of `sagas`, the lowest offset of an unfinished saga in
    /// the table as `conn` sees it; one query per chunk of [`BATCH_ROWS_MAX`] sagas.
    pub(crate) async fn first_unfinished_on<C: ConnectionTrait>(
        &self,
        conn: &C,
        sagas: &[&Saga],
    ) -> Result<FirstUnfinished, Error> {
        let mut first_unfinished = FirstUnfinished::new();
        for chunk in sagas.chunks(BATCH_ROWS_MAX) {
            let orders = padded_orders(chunk);
            let sql = first_unfinished_sql(self.backend, orders.len(), "");
            let rows = conn
                .query_all_raw(Statement::from_sql_and_values(self.backend, sql, orders))
                .await
                .during("check earlier sagas of a batch's orders", None)?;
            for row in rows {
                note_first_unfinished(&row, &mut first_unfinished, "read earlier sagas")?;
            }
        }
        Ok(first_unfinished)
    }

    /// For the inbox's first path, in one statement: `None` when any of `sagas`' rows is in
    /// the table, otherwise [`Self::first_unfinished_on`] of `fresh` (at most
    /// [`BATCH_ROWS_MAX`] of them, as a checked batch is). The two SELECTs of the two
    /// questions joined by `UNION ALL`, each row marked by which one it answers, so a batch
    /// pays one round trip for both; they read the same snapshot either way.
    pub(crate) async fn none_stored_then_first_unfinished<C: ConnectionTrait>(
        &self,
        conn: &C,
        sagas: &[Saga],
        fresh: &[&Saga],
    ) -> Result<Option<FirstUnfinished>, Error> {
        let ids = dialect::padded(sagas.iter().map(|s| Value::from(s.biz_id.clone())).collect());
        let mut values = padded_orders(fresh);
        let sql = stored_or_first_unfinished_sql(self.backend, values.len(), ids.len());
        values.extend(ids);
        let operation = "look for a batch's rows and earlier sagas of its orders";
        let rows = conn
            .query_all_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during(operation, None)?;
        let mut first_unfinished = FirstUnfinished::new();
        for row in rows {
            // Decoded as i64: the union's integer columns are INT or BIGINT depending on the server.
            let stored: i64 = row.try_get("", "stored").during(operation, None)?;
            if stored != 0 {
                return Ok(None);
            }
            note_first_unfinished(&row, &mut first_unfinished, operation)?;
        }
        Ok(Some(first_unfinished))
    }

    /// Sagas in `status` (served by the `saga_recovery` index: one range, no table rows read).
    pub async fn count_status(&self, status: Status) -> Result<u64, Error> {
        let sql = format!(
            "SELECT COUNT(*) AS n FROM {} WHERE status = ?",
            dialect::through_index(self.backend, "saga", "saga_recovery")
        );
        let row = self
            .db
            .query_one_raw(Statement::from_sql_and_values(self.backend, sql, [status.as_str().into()]))
            .await
            .during("count sagas in a status", None)?;
        let count: i64 = row.map(|r| r.try_get("", "n")).transpose().during("read saga count", None)?.unwrap_or(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Sagas in `status` whose `lease_until_ms` is at or after `from_ms`, how many of those lie
    /// before `below_ms`, and the database clock when they were counted: one range of
    /// `saga_recovery` (status, then lease expiry), no table rows read. A finished row's
    /// `lease_until_ms` is no earlier than the clock reading of the write that finished it, so a
    /// caller that moves `from_ms` forward as time passes counts finished sagas at a cost that
    /// follows how many finished since then, not how many the table holds.
    pub async fn count_status_from(&self, status: Status, from_ms: i64, below_ms: i64) -> Result<RangeCount, Error> {
        let sql = count_status_from_sql(self.backend);
        let values: [Value; 3] = [below_ms.into(), status.as_str().into(), from_ms.into()];
        let operation = "count sagas in a status from a lease expiry on";
        let row = self
            .db
            .query_one_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during(operation, None)?
            .ok_or_else(|| Error::Invalid("the database returned no row for a count".to_owned()))?;
        let count = |column: &str| -> Result<u64, Error> {
            let n: i64 = row.try_get("", column).during(operation, None)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let now_ms: i64 = row.try_get("", "now_ms").during(operation, None)?;
        Ok(RangeCount { from: count("n")?, below: count("below")?, now_ms })
    }

    /// Non-terminal sagas per lease owner: what each process has in flight (a benchmark gauge).
    pub async fn in_flight_by_owner(&self) -> Result<Vec<(String, u64)>, Error> {
        let sql = format!(
            "SELECT owner_id, COUNT(*) AS n FROM {} WHERE status IN ({}) GROUP BY owner_id",
            dialect::through_index(self.backend, "saga", "saga_recovery"),
            active_list()
        );
        let rows = self
            .db
            .query_all_raw(Statement::from_string(self.backend, sql))
            .await
            .during("count sagas in flight per owner", None)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let owner: Option<String> = row.try_get("", "owner_id").during("read in-flight owner", None)?;
            let count: i64 = row.try_get("", "n").during("read in-flight count", None)?;
            out.push((owner.unwrap_or_default(), u64::try_from(count).unwrap_or(0)));
        }
        Ok(out)
    }

    /// The business row of a saga.
    pub async fn order_row(&self, biz_id: &str) -> Result<Option<OrderRow>, Error> {
        let row =
            orders::Entity::find_by_id(biz_id.to_owned()).one(&self.db).await.during("read order row", Some(biz_id))?;
        Ok(row.map(|r| OrderRow {
            biz_id: r.biz_id,
            order_no: r.order_no,
            status: r.status,
            tracking_no: r.tracking_no,
        }))
    }

    async fn sagas_by_sql(&self, sql: String, values: Vec<Value>, operation: &'static str) -> Result<Vec<Saga>, Error> {
        use sea_orm::FromQueryResult;
        let rows = self
            .db
            .query_all_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during(operation, None)?;
        rows.iter()
            .map(|r| saga::Model::from_query_result(r, "").during(operation, None).and_then(row::to_saga))
            .collect()
    }
}

/// The lowest offset of an unfinished saga per order, topic and partition.
pub(crate) type FirstUnfinished = HashMap<(String, String, i32), i64>;

/// The key [`FirstUnfinished`] files `saga` under.
pub(crate) fn order_key(saga: &Saga) -> (String, String, i32) {
    (saga.order_no.clone(), saga.source.topic.clone(), saga.source.partition)
}

/// Of `sagas`, the biz_ids of those with an unfinished saga of their order at a lower offset
/// of their partition.
pub(crate) fn held_back(sagas: &[&Saga], first_unfinished: &FirstUnfinished) -> HashSet<String> {
    sagas
        .iter()
        .filter(|saga| first_unfinished.get(&order_key(saga)).is_some_and(|first| *first < saga.source.offset))
        .map(|saga| saga.biz_id.clone())
        .collect()
}

/// The distinct order numbers of `sagas`, sorted and padded ([`dialect::padded`]): the list of
/// the per-order question.
fn padded_orders(sagas: &[&Saga]) -> Vec<Value> {
    let mut orders: Vec<&str> = sagas.iter().map(|s| s.order_no.as_str()).collect();
    orders.sort_unstable();
    orders.dedup();
    dialect::padded(orders).into_iter().map(Value::from).collect()
}

/// One row of the per-order question (`first_unfinished_sql`), filed in `first_unfinished`.
/// The partition is read as i64, which an INT column and the union's INT or BIGINT both give.
fn note_first_unfinished(
    row: &sea_orm::QueryResult,
    first_unfinished: &mut FirstUnfinished,
    operation: &'static str,
) -> Result<(), Error> {
    let order: String = row.try_get("", "order_no").during(operation, None)?;
    let topic: String = row.try_get("", "src_topic").during(operation, None)?;
    let partition: i64 = row.try_get("", "src_partition").during(operation, None)?;
    let partition = i32::try_from(partition).map_err(|_| Error::Corrupt {
        biz_id: order.clone(),
        message: format!("source partition {partition} is out of range"),
    })?;
    let first: i64 = row.try_get("", "first_offset").during(operation, None)?;
    first_unfinished.insert((order, topic, partition), first);
    Ok(())
}

/// [`Store::none_stored_then_first_unfinished`]'s statement: the per-order question's rows
/// (`stored` 0), then a row for each of `ids` that is stored (`stored` 1). The first SELECT's
/// columns name the union's.
fn stored_or_first_unfinished_sql(backend: sea_orm::DbBackend, orders: usize, ids: usize) -> String {
    format!(
        "{} UNION ALL SELECT biz_id, '', 0, 0, 1 FROM {} WHERE biz_id IN ({})",
        first_unfinished_sql(backend, orders, ", 0 AS stored"),
        dialect::by_primary_key(backend, "saga"),
        dialect::placeholders(ids)
    )
}

/// The earliest unfinished saga of each of `orders` order numbers, per source partition, read
/// through the `saga_order` index (a batch's list is longer than MySQL plans from a look at the
/// index; see [`dialect::through_index`]), with `extra` appended to its columns.
fn first_unfinished_sql(backend: sea_orm::DbBackend, orders: usize, extra: &str) -> String {
    format!(
        "SELECT order_no, src_topic, src_partition, MIN(src_offset) AS first_offset{extra} FROM {} \
         WHERE order_no IN ({}) AND status NOT IN ({}) GROUP BY order_no, src_topic, src_partition",
        dialect::through_index(backend, "saga", "saga_order"),
        dialect::placeholders(orders),
        terminal_list()
    )
}

/// [`Store::count_status_from`]'s statement: the bound, the status, the range's start.
fn count_status_from_sql(backend: sea_orm::DbBackend) -> String {
    format!(
        "SELECT COUNT(*) AS n, COUNT(CASE WHEN lease_until_ms < ? THEN 1 END) AS below, {} AS now_ms \
         FROM {} WHERE status = ? AND lease_until_ms >= ?",
        dialect::now_ms(backend),
        dialect::through_index(backend, "saga", "saga_recovery")
    )
}

/// [`Store::oldest_finished`]'s statement, for one status.
fn oldest_finished_sql(backend: sea_orm::DbBackend) -> String {
    format!(
        "SELECT MIN(lease_until_ms) AS oldest FROM {} WHERE status = ?",
        dialect::through_index(backend, "saga", "saga_recovery")
    )
}

/// Distinct statuses [`Store::unknown_statuses`] walks at most: the twelve known ones and as
/// many unknown.
pub const STATUSES_WALKED_MAX: usize = 24;
/// Where [`Store::unknown_statuses`] stops counting the rows of one status.
pub const UNKNOWN_COUNT_MAX: u64 = 100_000;

/// The first status after `?` in the table (from `?` on, the empty status included, when not
/// `after`), from `saga_recovery`.
fn next_status_sql(backend: sea_orm::DbBackend, after: bool) -> String {
    format!(
        "SELECT status FROM {} WHERE status {} ? ORDER BY status LIMIT 1",
        dialect::through_index(backend, "saga", "saga_recovery"),
        if after { ">" } else { ">=" }
    )
}

/// [`Store::unfinished_summary`]'s statement.
fn unfinished_summary_sql(backend: sea_orm::DbBackend) -> String {
    format!(
        "SELECT status, COUNT(*) AS n, MIN(updated_at_ms) AS oldest FROM {} WHERE status IN ({}) GROUP BY status",
        dialect::through_index(backend, "saga", "saga_recovery"),
        crate::lease::active_list()
    )
}

fn to_transition(row: saga_transition::Model) -> Result<Transition, Error> {
    let parse = |text: &str| {
        Status::parse(text).ok_or_else(|| {
            Error::Model(midflight_model::Error::UnknownStatus { biz_id: row.biz_id.clone(), text: text.to_owned() })
        })
    };
    let from = row.from_status.as_deref().map(parse).transpose()?;
    let to = parse(&row.to_status)?;
    Ok(Transition {
        version: u64::try_from(row.version).unwrap_or(0),
        lease_epoch: u64::try_from(row.lease_epoch).unwrap_or(0),
        biz_id: row.biz_id,
        from,
        to,
        actor: row.actor,
        reason: row.reason,
        at_ms: row.at_ms,
        call_ms: row.call_ms.and_then(|ms| u64::try_from(ms).ok()),
    })
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use midflight_model::{Saga, Source};
    use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

    use crate::Store;
    use crate::testing::{TestDb, arrive_orders, order_event, plan_of};

    /// The inbox batch's order check on a young table (rows just inserted, statistics not yet
    /// recounted) with a list as long as a full batch pads to: the plan must go through the
    /// `saga_order` index, not over the whole table.
    async fn batch_order_check_reads_through_its_index(db: &TestDb) {
        let store = &db.store;
        let now = store.now_ms().await.expect("clock");
        let sagas: Vec<Saga> = (0..300)
            .map(|n| {
                let source = Source { topic: "orders".into(), partition: n % 16, offset: i64::from(n) };
                Saga::received(&order_event(&format!("ORD-{n:04}")), source, now, now + 600_000)
            })
            .collect();
        store.insert_arrivals(&sagas, "c1", 60_000, "consumer:c1").await.expect("insert");
        let values: Vec<Value> = sagas[..256].iter().map(|s| Value::from(s.order_no.clone())).collect();
        let sql = super::first_unfinished_sql(store.backend, values.len(), "");
        let plan = plan_of(store, &sql, values).await;
        assert!(plan.iter().any(|step| step.contains("saga_order")), "plan {plan:?} does not use saga_order");
    }
    crate::both_engines!(batch_order_check_uses_its_index, batch_order_check_reads_through_its_index);

    /// The inbox's one statement for both of its first questions: a stored row of the batch
    /// makes it `None`; otherwise each order's first unfinished offset per partition, counting
    /// only unfinished sagas. On MySQL its two halves go through `saga_order` and the primary
    /// key, not over the table.
    async fn stored_or_first_unfinished_answers_both(db: &TestDb) {
        let store = &db.store;
        let now = store.now_ms().await.expect("clock");
        let saga = |order: &str, event: &str, partition: i32, offset: i64| {
            let mut order = order_event(order);
            order.event_type = event.to_owned();
            let source = Source { topic: "orders".into(), partition, offset };
            Saga::received(&order, source, now, now + 600_000)
        };
        // Stored: ORD-A at offset 1 (finished) and 3 (unfinished) on partition 0 and at 9 on
        // partition 2; ORD-B at 5 on partition 1.
        let done = saga("ORD-A", "E1", 0, 1);
        let stored = [done.clone(), saga("ORD-A", "E3", 0, 3), saga("ORD-A", "E9", 2, 9), saga("ORD-B", "E5", 1, 5)];
        store.insert_arrivals(&stored, "c1", 60_000, "consumer:c1").await.expect("insert");
        store
            .db
            .execute_raw(Statement::from_sql_and_values(
                store.backend,
                "UPDATE saga SET status = 'DONE' WHERE biz_id = ?",
                [Value::from(done.biz_id.clone())],
            ))
            .await
            .expect("finish one");
        // A parked arrival (not stored yet) is looked for as a row but asks no order question.
        let mut parked = saga("ORD-B", "E22", 1, 22);
        parked.status = midflight_model::Status::Parked;
        let batch = [saga("ORD-A", "E20", 0, 20), saga("ORD-C", "E21", 0, 21), parked];
        let fresh: Vec<&Saga> = batch[..2].iter().collect();
        let answer = store.none_stored_then_first_unfinished(&store.db, &batch, &fresh).await.expect("query");
        let expected: super::FirstUnfinished =
            [(("ORD-A".to_owned(), "orders".to_owned(), 0), 3), (("ORD-A".to_owned(), "orders".to_owned(), 2), 9)]
                .into_iter()
                .collect();
        assert_eq!(answer, Some(expected), "ORD-B asks nothing and ORD-A's finished saga does not count");
        let with_stored = [batch[0].clone(), stored[3].clone(), batch[1].clone()];
        let fresh: Vec<&Saga> = with_stored.iter().collect();
        let answer = store.none_stored_then_first_unfinished(&store.db, &with_stored, &fresh).await.expect("query");
        assert_eq!(answer, None, "ORD-B's row is stored");

        if store.backend == DbBackend::MySql {
            let sql = super::stored_or_first_unfinished_sql(store.backend, 2, 4);
            let values: Vec<Value> = ["ORD-A", "ORD-C", "ORD-A:E20", "ORD-C:E21", "ORD-C:E21", "ORD-C:E21"]
                .into_iter()
                .map(Value::from)
                .collect();
            let rows = store
                .db
                .query_all_raw(Statement::from_sql_and_values(store.backend, format!("EXPLAIN {sql}"), values))
                .await
                .expect("explain");
            let keys: Vec<String> =
                rows.iter().filter_map(|row| row.try_get::<Option<String>>("", "key").expect("key column")).collect();
            assert_eq!(keys, ["saga_order", "PRIMARY"], "plan keys {keys:?}");
        }
    }
    crate::both_engines!(stored_or_first_unfinished, stored_or_first_unfinished_answers_both);

    /// The metrics' sample counts the unfinished statuses only, with their oldest row, and
    /// reads them through the `saga_recovery` index (status first), not the table's history.
    async fn unfinished_summary_leaves_finished_sagas_out(db: &TestDb) {
        let store = &db.store;
        let now = store.now_ms().await.expect("clock");
        let sagas = arrive_orders(store, &["SUM-0", "SUM-1", "SUM-2", "SUM-3", "SUM-4", "SUM-5"]).await;
        let set = |status: &str, updated_at_ms: i64, ids: &[&Saga]| {
            let list: Vec<String> = ids.iter().map(|s| format!("'{}'", s.biz_id)).collect();
            let sql = format!(
                "UPDATE saga SET status = '{status}', updated_at_ms = {updated_at_ms} WHERE biz_id IN ({})",
                list.join(", ")
            );
            store.db.execute_raw(Statement::from_string(store.backend, sql))
        };
        set("DONE", 1, &[&sagas[0], &sagas[1], &sagas[2]]).await.expect("finish three");
        set("WMS_REQUESTED", now - 5_000, &[&sagas[3]]).await.expect("one calling the WMS");
        set("WMS_REQUESTED", now - 1_000, &[&sagas[4]]).await.expect("another");
        set("RECEIVED", now - 2_000, &[&sagas[5]]).await.expect("one just arrived");
        let mut summary = store.unfinished_summary().await.expect("summary");
        summary.sort_by_key(|(status, _, _)| status.as_str());
        use midflight_model::Status::{Received, WmsRequested};
        assert_eq!(summary, [(Received, 1, now - 2_000), (WmsRequested, 2, now - 5_000)], "DONE left out");

        let plan = plan_of(store, &super::unfinished_summary_sql(store.backend), Vec::new()).await;
        assert!(plan.iter().any(|step| step.contains("saga_recovery")), "plan {plan:?} does not use saga_recovery");
    }
    crate::both_engines!(unfinished_summary_reads_only_unfinished, unfinished_summary_leaves_finished_sagas_out);

    /// Sets each saga's status and lease expiry by hand (states no transition writes directly).
    async fn set_status_and_expiry<const N: usize>(store: &Store, rows: [(&Saga, &str, i64); N]) {
        for (saga, status, lease_until_ms) in rows {
            let sql = format!(
                "UPDATE saga SET status = '{status}', lease_until_ms = {lease_until_ms} WHERE biz_id = '{}'",
                saga.biz_id
            );
            store.db.execute_raw(Statement::from_string(store.backend, sql)).await.expect("set");
        }
    }

    /// The oldest finished saga of each finished status, by lease expiry, read from the first
    /// entry of `saga_recovery`; nothing for a status with no row.
    async fn oldest_finished_reads_the_first_index_entry(db: &TestDb) {
        let store = &db.store;
        assert_eq!(store.oldest_finished().await.expect("oldest"), []);
        let sagas = arrive_orders(store, &["OLD-0", "OLD-1", "OLD-2", "OLD-3"]).await;
        set_status_and_expiry(
            store,
            [
                (&sagas[0], "DONE", 5_000),
                (&sagas[1], "DONE", 3_000),
                (&sagas[2], "ROLLED_BACK", 7_000),
                (&sagas[3], "WMS_REQUESTED", 1_000),
            ],
        )
        .await;
        use midflight_model::Status::{Done, RolledBack};
        assert_eq!(store.oldest_finished().await.expect("oldest"), [(Done, 3_000), (RolledBack, 7_000)]);
        let sql = super::oldest_finished_sql(store.backend);
        if store.backend == DbBackend::MySql {
            // The optimizer answers MIN from the index's first entry before running anything.
            let explain =
                Statement::from_sql_and_values(store.backend, format!("EXPLAIN {sql}"), [Value::from("DONE")]);
            let rows = store.db.query_all_raw(explain).await.expect("explain");
            let extra: Vec<String> = rows
                .iter()
                .map(|row| row.try_get::<Option<String>>("", "Extra").expect("Extra").unwrap_or_default())
                .collect();
            assert_eq!(extra, ["Select tables optimized away"], "{sql}");
        } else {
            let plan = plan_of(store, &sql, vec![Value::from("DONE")]).await;
            assert!(plan.iter().any(|step| step.contains("saga_recovery")), "plan {plan:?} does not use saga_recovery");
        }
    }
    crate::both_engines!(oldest_finished_is_an_index_read, oldest_finished_reads_the_first_index_entry);

    /// A status counted from a lease expiry on: the rows at or after the start, those of them
    /// before the bound, the database clock, all from one range of `saga_recovery`.
    async fn status_counted_from_a_lease_expiry(db: &TestDb) {
        use midflight_model::Status::{Done, RolledBack};
        let store = &db.store;
        let empty = store.count_status_from(Done, i64::MIN, i64::MIN).await.expect("count");
        assert_eq!((empty.from, empty.below), (0, 0), "an empty table");
        let sagas = arrive_orders(store, &["CNT-0", "CNT-1", "CNT-2", "CNT-3", "CNT-4"]).await;
        set_status_and_expiry(
            store,
            [
                (&sagas[0], "DONE", 1_000),
                (&sagas[1], "DONE", 2_000),
                (&sagas[2], "DONE", 3_000),
                (&sagas[3], "ROLLED_BACK", 2_500),
                (&sagas[4], "WMS_REQUESTED", 2_000),
            ],
        )
        .await;
        let before = store.now_ms().await.expect("clock");
        let all = store.count_status_from(Done, i64::MIN, i64::MIN).await.expect("count");
        assert_eq!((all.from, all.below), (3, 0), "every DONE row, none below the lowest bound");
        let range = store.count_status_from(Done, 2_000, 3_000).await.expect("count");
        assert_eq!((range.from, range.below), (2, 1), "2,000 and 3,000 from 2,000 on; 2,000 below 3,000");
        let past = store.count_status_from(Done, 3_001, 5_000).await.expect("count");
        assert_eq!((past.from, past.below), (0, 0), "nothing after the last");
        let other = store.count_status_from(RolledBack, 0, i64::MAX).await.expect("count");
        assert_eq!((other.from, other.below), (1, 1), "another status counts its own rows");
        // The store's clock is an estimate kept between readings; the statement's is read fresh.
        assert!((range.now_ms - before).abs() < 60_000, "clock {} against {before}", range.now_ms);

        let values = vec![Value::from(3_000_i64), Value::from("DONE"), Value::from(2_000_i64)];
        let plan = plan_of(store, &super::count_status_from_sql(store.backend), values).await;
        assert!(plan.iter().any(|step| step.contains("saga_recovery")), "plan {plan:?} does not use saga_recovery");
    }
    crate::both_engines!(status_count_from_a_lease_expiry, status_counted_from_a_lease_expiry);

    /// Rows whose status this version does not know are counted by status, whatever their
    /// place among the known ones; the walk seeks `saga_recovery` and stops at its bound.
    async fn unknown_statuses_are_counted(db: &TestDb) {
        let store = &db.store;
        assert_eq!(store.unknown_statuses().await.expect("read"), (vec![], false), "an empty table");
        let names: Vec<String> = (0..8).map(|n| format!("UNK-{n}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let sagas = arrive_orders(store, &refs).await;
        for (saga, status) in sagas.iter().zip(["DONE", "AAA_FIRST", "PAUSED", "PAUSED", "WMS_REQUESTED", "ZZZ"]) {
            let sql = format!("UPDATE saga SET status = '{status}' WHERE biz_id = '{}'", saga.biz_id);
            store.db.execute_raw(Statement::from_string(store.backend, sql)).await.expect("set");
        }
        // The empty status, first in any order, too; on MySQL a known status in lower case is
        // selected as that status, on SQLite it is a status of its own.
        for (saga, status) in sagas[6..].iter().zip(["", "done"]) {
            let sql = format!("UPDATE saga SET status = '{status}' WHERE biz_id = '{}'", saga.biz_id);
            store.db.execute_raw(Statement::from_string(store.backend, sql)).await.expect("set");
        }
        let mut expected = vec![("".to_owned(), 1), ("AAA_FIRST".to_owned(), 1), ("PAUSED".to_owned(), 2)];
        if store.backend == DbBackend::Sqlite {
            expected.push(("ZZZ".to_owned(), 1));
            expected.push(("done".to_owned(), 1));
        } else {
            expected.push(("ZZZ".to_owned(), 1));
        }
        assert_eq!(store.unknown_statuses().await.expect("read"), (expected, false));

        for after in [false, true] {
            let plan = plan_of(store, &super::next_status_sql(store.backend, after), vec![Value::from("")]).await;
            assert!(plan.iter().any(|step| step.contains("saga_recovery")), "plan {plan:?} does not use saga_recovery");
        }

        // Exactly as many distinct statuses as the walk takes: all read. One more: it says so.
        let distinct = Statement::from_string(store.backend, "SELECT COUNT(DISTINCT status) AS n FROM saga");
        let row = store.db.query_one_raw(distinct).await.expect("count").expect("a row");
        let distinct = usize::try_from(row.try_get::<i64>("", "n").expect("n")).expect("a count");
        for n in 0..super::STATUSES_WALKED_MAX - distinct {
            let biz = arrive_orders(store, &[format!("MANY-{n}").as_str()]).await.remove(0).biz_id;
            let sql = format!("UPDATE saga SET status = 'X{n:02}' WHERE biz_id = '{biz}'");
            store.db.execute_raw(Statement::from_string(store.backend, sql)).await.expect("set");
        }
        assert!(!store.unknown_statuses().await.expect("read").1, "exactly the walk's bound: all read");
        for n in 0..super::STATUSES_WALKED_MAX {
            let biz = arrive_orders(store, &[format!("MORE-{n}").as_str()]).await.remove(0).biz_id;
            let sql = format!("UPDATE saga SET status = 'Y{n:02}' WHERE biz_id = '{biz}'");
            store.db.execute_raw(Statement::from_string(store.backend, sql)).await.expect("set");
        }
        let (unknown, more) = store.unknown_statuses().await.expect("read");
        assert!(more && unknown.len() < super::STATUSES_WALKED_MAX, "{unknown:?}");
    }
    crate::both_engines!(unknown_statuses_counted, unknown_statuses_are_counted);
}
