//! Purging finished sagas: the table keeps every saga until something deletes it, and at the
//! user's rates that is hundreds of millions of rows a day.
//!
//! What may go: sagas that are DONE or ROLLED_BACK (no transition leaves either, so a row seen
//! finished stays finished) and were last written longer ago than the caller's horizon by the
//! database clock, with their transition-log rows and their outbox row, unless the saga has an
//! open ticket or an outbox row not yet published (those wait). What stays: sagas that need a
//! person (MANUAL_REVIEW, PARKED), tickets (the evidence of what a person decided), and the
//! business `orders` rows, which are the business's own records (and tell the reconciler
//! which request ids belonged to a purged saga).
//!
//! The row is what turns a redelivered message into a no-op, so a message that can still be
//! read from the topic must find its row: the horizon has to be longer than the oldest message
//! the topic can hand out (the caller's configuration says how that is chosen).

use midflight_model::Status;
use sea_orm::{ConnectionTrait, DatabaseTransaction, IsolationLevel, Statement, Value};

use crate::error::{Context, Error};
use crate::{BATCH_ROWS_MAX, Store, dialect};

/// What one purge batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub sagas: u64,
    pub transitions: u64,
    pub outbox: u64,
    /// Batches rolled back because a listed saga no longer qualified when it was deleted (a
    /// ticket was opened for it, or its notification is to be published again; on SQLite also
    /// another purger deleting it first): nothing of them deleted.
    pub rolled_back: u64,
    /// Candidates the search listed for the batch (on MySQL up to twice its limit, on SQLite
    /// up to its limit). A batch that deleted sagas and listed at least its limit leaves more
    /// to purge at once, even one that came back short because another purger held some of
    /// what it listed. Summed over batches, it counts listings, not distinct sagas.
    pub listed: u64,
}

impl Purged {
    /// Whether the next batch should follow at once: this one deleted sagas and its search
    /// listed at least `limit` of them. Neither a rolled-back batch nor one that found every
    /// listed row held (it deleted nothing) counts, so those wait for the next round.
    pub fn more_after(&self, limit: u64) -> bool {
        self.sagas > 0 && self.listed >= limit
    }
}

impl std::ops::AddAssign for Purged {
    fn add_assign(&mut self, other: Purged) {
        self.sagas += other.sagas;
        self.transitions += other.transitions;
        self.outbox += other.outbox;
        self.rolled_back += other.rolled_back;
        self.listed += other.listed;
    }
}

/// What makes the saga row `alias` purgeable, its two parameters the horizon in milliseconds
/// and the judged bound (see [`Store::purge_finished`]): finished, last written before the
/// horizon, its last lease ended before the bound, no open ticket, no notification still to
/// publish.
fn purgeable(backend: sea_orm::DbBackend, alias: &str) -> String {
    format!(
        "{alias}.status IN ({finished}) AND {alias}.updated_at_ms < {now} - ? AND {alias}.lease_until_ms < ? \
         AND NOT EXISTS (SELECT 1 FROM manual_ticket m WHERE m.biz_id = {alias}.biz_id AND m.state = 'OPEN') \
         AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.biz_id = {alias}.biz_id AND o.published_at_ms IS NULL)",
        finished = crate::lease::quoted(&Status::FINISHED),
        now = dialect::now_ms(backend)
    )
}

/// How many candidates a purge lists on MySQL for each saga of its batch, so that purgers running
/// at once find a batch each among the same oldest sagas (two recovery workers, as deployed; a
/// third searching at the same moment finds what it listed held and waits for its next round).
const SEARCH_SPREAD: u64 = 2;

/// The bounds a purge deletes within: last written more than `older_than_ms` ago, last lease
/// ended before `judged_before_ms` (`i64::MAX`: no bound).
#[derive(Debug, Clone, Copy)]
struct Cutoff {
    older_than_ms: i64,
    judged_before_ms: i64,
}

impl Cutoff {
    /// The parameters of [`purgeable`]'s condition: the horizon, then the judged bound.
    fn values(self) -> [Value; 2] {
        [self.older_than_ms.into(), self.judged_before_ms.into()]
    }
}

impl Store {
    /// Deletes up to `limit` (at most [`BATCH_ROWS_MAX`]) sagas finished more than
    /// `older_than_ms` ago, with their transition-log and outbox rows, in one transaction.
    /// Returns what it deleted and how many candidates it listed; [`Purged::more_after`] says
    /// whether more are left. Fewer sagas than `limit` means none older are left, the batch
    /// was rolled back ([`Purged::rolled_back`]), or (MySQL) other purgers held some of the
    /// listed ones.
    ///
    /// `judged_before_ms` (database time), when given, keeps every saga whose last lease
    /// (`lease_until_ms`, its last write plus at most a lease) did not end before it: what a
    /// reconciliation has not yet compared with the ledgers, since a pass judges the sagas by
    /// that column (the `since_ms` of its checkpoint).
    ///
    /// The candidates are found through `saga_recovery` (status, then `lease_until_ms`, which a
    /// finished row's last write set at most one lease after its `updated_at_ms`), so the
    /// search reads the old finished rows only, and a row goes at most one lease later than
    /// its horizon. See [`Store::purge_listed`] for the deletes.
    ///
    /// On MySQL the search lists twice `limit` sagas, and the batch's transaction then locks
    /// up to `limit` of them by primary key, stepping over rows another transaction holds
    /// ([`Store::lock_listed`]): purgers running at once (one in each recovery worker) take
    /// different batches, where each used to list the same oldest sagas, all but one waiting on
    /// the first one's locks and then rolling back. A purger whose listed rows another held or
    /// took between its search and its lock comes back short; if it deleted some and listed a
    /// full batch, more follow at once ([`Purged::more_after`]).
    /// SQLite has one writer, so each purger lists `limit` and deletes them.
    pub async fn purge_finished(
        &self,
        older_than_ms: i64,
        judged_before_ms: Option<i64>,
        limit: u64,
    ) -> Result<Purged, Error> {
        let limit = limit.clamp(1, BATCH_ROWS_MAX as u64);
        let mysql = self.backend == sea_orm::DbBackend::MySql;
        let search_limit = if mysql { limit * SEARCH_SPREAD } else { limit };
        let cutoff = Cutoff { older_than_ms, judged_before_ms: judged_before_ms.unwrap_or(i64::MAX) };
        let operation = SEARCH;
        let values = [older_than_ms.into(), older_than_ms.into(), cutoff.judged_before_ms.into(), search_limit.into()];
        let statement =
            Statement::from_sql_and_values(self.backend, candidates_sql(self.backend, false), values.clone());
        let rows =
            self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
        let (mut listed, mut ids) = self.listed(&rows).await?;
        if ids.len() * 2 < listed as usize {
            // Most of the listing waits behind reviews, and would at every round: search again,
            // stepping over those in the search itself (slower: a subquery per candidate).
            let statement = Statement::from_sql_and_values(self.backend, candidates_sql(self.backend, true), values);
            let rows =
                self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
            listed = rows.len() as u64;
            ids = biz_ids(&rows).during(operation, None)?;
        }
        let purged =
            if mysql { self.lock_and_purge(cutoff, ids, limit).await } else { self.purge_listed(cutoff, ids).await };
        purged.map(|purged| Purged { listed, ..purged })
    }

    /// How many `rows` a search listed, and their ids less those behind a review.
    async fn listed(&self, rows: &[sea_orm::QueryResult]) -> Result<(u64, Vec<String>), Error> {
        let operation = SEARCH;
        let candidates = rows
            .iter()
            .map(|row| {
                Ok(Candidate {
                    biz_id: row.try_get("", "biz_id")?,
                    order: (
                        row.try_get("", "order_no")?,
                        row.try_get("", "src_topic")?,
                        row.try_get("", "src_partition")?,
                    ),
                    offset: row.try_get("", "src_offset")?,
                })
            })
            .collect::<Result<Vec<_>, sea_orm::DbErr>>()
            .during(operation, None)?;
        let listed = candidates.len() as u64;
        Ok((listed, self.behind_a_review(candidates).await?))
    }

    /// The ids of `candidates` less those with an earlier saga of their order (on their
    /// partition) not finished for good. Such an earlier saga is in MANUAL_REVIEW (or should
    /// not be there at all: I5): while it is, the later saga's row is what refuses sending it
    /// back to automation ([`Store::resolve`]), so the row stays until a person has closed the
    /// earlier one. One read of the candidates' orders through `saga_order` (a subquery per
    /// candidate in the search halved the purge's rate on MariaDB: BENCHMARKS.md); when more
    /// than half a listing is kept so, [`Store::purge_finished`] searches again with that
    /// subquery, so sagas kept at the head of its order cannot stop the purge. Checked
    /// here only: a finished saga's earlier sagas cannot become unfinished again while it is
    /// in the table, so the delete needs no second look.
    async fn behind_a_review(&self, candidates: Vec<Candidate>) -> Result<Vec<String>, Error> {
        let mut orders: Vec<String> =
            candidates.iter().map(|c| c.order.0.clone()).filter(|order| !order.is_empty()).collect();
        orders.sort_unstable();
        orders.dedup();
        if orders.is_empty() {
            return Ok(candidates.into_iter().map(|c| c.biz_id).collect());
        }
        let orders = dialect::padded(orders);
        let sql = first_open_sql(self.backend, orders.len());
        let statement = Statement::from_sql_and_values(self.backend, sql, orders.into_iter().map(Value::from));
        let operation = "find reviews before finished sagas";
        let rows =
            self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
        let mut first_open: std::collections::HashMap<(String, String, i32), i64> = std::collections::HashMap::new();
        for row in &rows {
            let order: (String, String, i32) = (
                row.try_get("", "order_no").during(operation, None)?,
                row.try_get("", "src_topic").during(operation, None)?,
                row.try_get("", "src_partition").during(operation, None)?,
            );
            first_open.insert(order, row.try_get("", "first_offset").during(operation, None)?);
        }
        let (kept, ids): (Vec<Candidate>, Vec<Candidate>) =
            candidates.into_iter().partition(|c| first_open.get(&c.order).is_some_and(|first| *first < c.offset));
        if !kept.is_empty() {
            tracing::debug!(kept = kept.len(), "finished sagas kept behind an earlier saga of their order in review");
        }
        Ok(ids.into_iter().map(|c| c.biz_id).collect())
    }

    /// The MySQL batch of [`Store::purge_finished`]: locks up to `limit` of the listed `ids`
    /// and deletes them.
    async fn lock_and_purge(&self, cutoff: Cutoff, ids: Vec<String>, limit: u64) -> Result<Purged, Error> {
        if ids.is_empty() {
            return Ok(Purged::default());
        }
        let txn = self.begin_purge().await?;
        let listed = ids.len();
        let ids = match self.lock_listed(&txn, cutoff, ids, limit).await {
            Ok(ids) => ids,
            Err(error) => {
                // The lock's error is the one to report; a failed rollback only means the
                // connection is gone, which ends the transaction too.
                let _ = txn.rollback().await;
                return Err(error);
            }
        };
        tracing::debug!(listed, locked = ids.len(), "purge batch locked");
        self.delete_batch(txn, cutoff, ids).await
    }

    /// Locks up to `limit` of the saga rows `ids` in `txn` that are still finished and past the
    /// cutoff, stepping over rows another transaction holds, and returns the ones it locked
    /// (MySQL only). The rows are read by primary key, and one that no longer matches (a saga
    /// opened again under a purged one's id) is not kept locked, so nothing else is: a locking
    /// search through `saga_recovery` would also lock the row after its range at READ
    /// COMMITTED (seen on MariaDB 10.11), which can be a saga in flight, and rows it examined
    /// without listing. The open-ticket and outbox conditions are left to the delete's check.
    async fn lock_listed(
        &self,
        txn: &DatabaseTransaction,
        cutoff: Cutoff,
        mut ids: Vec<String>,
        limit: u64,
    ) -> Result<Vec<String>, Error> {
        // Padded to a power of two (a statement shape kept prepared) with the empty biz_id,
        // which no saga has (each holds a ':'), so the padding matches no row.
        ids.resize(ids.len().next_power_of_two(), String::new());
        let sql = lock_listed_sql(ids.len());
        let mut values: Vec<Value> = ids.into_iter().map(Value::from).collect();
        values.extend(cutoff.values());
        values.push(limit.into());
        let operation = "lock finished sagas to purge";
        let rows = match txn.query_all_raw(Statement::from_sql_and_values(self.backend, sql, values)).await {
            Ok(rows) => rows,
            Err(source) if parse_error(&source) => {
                return Err(Error::Invalid(format!(
                    "purging needs SELECT ... FOR UPDATE SKIP LOCKED (MySQL 8.0.1 or later, MariaDB 10.6 \
                     or later), which this server rejected: {source}"
                )));
            }
            Err(source) => return Err(source).during(operation, None),
        };
        biz_ids(&rows).during(operation, None)
    }

    /// Deletes the sagas `ids` with their log and outbox rows if every one of them still
    /// qualifies when it is deleted; otherwise rolls back, deleting nothing. So a saga's log
    /// goes only in the transaction that deleted the saga, never beside a row another purger
    /// deleted first and a redelivered message opened again.
    async fn purge_listed(&self, cutoff: Cutoff, ids: Vec<String>) -> Result<Purged, Error> {
        if ids.is_empty() {
            return Ok(Purged::default());
        }
        let txn = self.begin_purge().await?;
        self.delete_batch(txn, cutoff, ids).await
    }

    /// Begins a purge batch's transaction. On MySQL it runs at READ COMMITTED: its lock and
    /// deletes lock the rows they return and delete and no gaps, so an insert of another saga or
    /// log row next to them (the consumer's inbox, a transition's log row) never waits on a
    /// purge, even one frozen mid-batch. The rows it locks are finished sagas, their log and
    /// published outbox rows, which nobody else writes.
    async fn begin_purge(&self) -> Result<DatabaseTransaction, Error> {
        let isolation = (self.backend == sea_orm::DbBackend::MySql).then_some(IsolationLevel::ReadCommitted);
        self.begin_isolated("begin purge", None, isolation).await
    }

    /// The deletes of [`Store::purge_listed`] in `txn`, which they commit or roll back.
    async fn delete_batch(
        &self,
        txn: DatabaseTransaction,
        cutoff: Cutoff,
        mut ids: Vec<String>,
    ) -> Result<Purged, Error> {
        // Primary-key order, so two purgers lock shared rows in the same order.
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            txn.rollback().await.during("end an empty purge", None)?;
            return Ok(Purged::default());
        }
        let distinct = ids.len() as u64;
        let ids = dialect::padded(ids);
        let sagas = self.delete_listed(&txn, "saga", &purgeable(self.backend, "t"), &cutoff.values(), &ids).await?;
        if sagas < distinct {
            txn.rollback().await.during("roll back purge", None)?;
            tracing::debug!(listed = distinct, qualified = sagas, "purge batch rolled back: a listed saga changed");
            return Ok(Purged { rolled_back: 1, ..Purged::default() });
        }
        let purged = Purged {
            sagas,
            transitions: self.delete_listed(&txn, "saga_transition", "", &[], &ids).await?,
            outbox: self.delete_listed(&txn, "outbox", "", &[], &ids).await?,
            ..Purged::default()
        };
        txn.commit().await.during("commit purge", None)?;
        self.stats.write_committed();
        Ok(purged)
    }

    /// Deletes the rows of `table` whose biz_id is in `ids` and that meet `condition` (on `t`,
    /// with `parameters` as its parameters); returns how many it deleted.
    async fn delete_listed(
        &self,
        txn: &DatabaseTransaction,
        table: &str,
        condition: &str,
        parameters: &[Value],
        ids: &[String],
    ) -> Result<u64, Error> {
        let sql = delete_listed_sql(self.backend, table, condition, ids.len());
        let mut values: Vec<Value> = ids.iter().cloned().map(Value::from).collect();
        values.extend_from_slice(parameters);
        let result = txn
            .execute_raw(Statement::from_sql_and_values(self.backend, sql, values))
            .await
            .during("purge finished sagas", None)?;
        Ok(result.rows_affected())
    }
}

/// `DELETE` of the rows of `table` (as `t`) whose biz_id is one of `n` parameters and that meet
/// `condition`, the list's parameters first.
///
/// On MySQL the rows are named by a join from the list to the table's primary key, in that
/// order. A `DELETE ... WHERE biz_id IN (...)` takes no index hint (single-table form), and
/// MariaDB ignored one in the one-table multi-table form, planning a scan of a small table
/// (seen with EXPLAIN on 10.11); a scanning DELETE reads every row, waits on each one another
/// transaction holds (rows of sagas in flight included) and, under REPEATABLE READ, keeps them
/// all locked until commit. The join reads (and locks) only the rows it names.
fn delete_listed_sql(backend: sea_orm::DbBackend, table: &str, condition: &str, n: usize) -> String {
    let and = |prefix: &str| if condition.is_empty() { String::new() } else { format!(" {prefix} {condition}") };
    match backend {
        sea_orm::DbBackend::MySql => format!(
            "DELETE t FROM ({}) AS k STRAIGHT_JOIN {table} AS t FORCE INDEX (PRIMARY) ON t.biz_id = k.biz_id{}",
            listed_rows(n),
            and("WHERE")
        ),
        _ => format!("DELETE FROM {table} AS t WHERE t.biz_id IN ({}){}", dialect::placeholders(n), and("AND")),
    }
}

/// The lock of [`Store::lock_listed`] (MySQL): `n` listed ids, then the horizon, the judged
/// bound and the limit. The list is joined to the primary key, as the deletes are.
fn lock_listed_sql(n: usize) -> String {
    format!(
        "SELECT t.biz_id FROM ({}) AS k STRAIGHT_JOIN saga AS t FORCE INDEX (PRIMARY) ON t.biz_id = k.biz_id \
         WHERE t.status IN ({}) AND t.updated_at_ms < {} - ? AND t.lease_until_ms < ? LIMIT ? FOR UPDATE SKIP LOCKED",
        listed_rows(n),
        crate::lease::quoted(&Status::FINISHED),
        dialect::now_ms(sea_orm::DbBackend::MySql)
    )
}

/// Whether MySQL refused a statement as one it cannot parse (error 1064), as a server older
/// than MySQL 8.0.1 or MariaDB 10.6 refuses `SKIP LOCKED`.
fn parse_error(error: &sea_orm::DbErr) -> bool {
    crate::error::statement_error(error)
        .and_then(|error| error.try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|mysql| mysql.number() == 1064)
}

/// The rows `SELECT ? AS biz_id UNION ALL ...` of `n` listed ids, which MySQL statements join
/// to a table's primary key.
fn listed_rows(n: usize) -> String {
    vec!["SELECT ? AS biz_id"; n].join(" UNION ALL ")
}

/// The `biz_id` column of `rows`.
fn biz_ids(rows: &[sea_orm::QueryResult]) -> Result<Vec<String>, sea_orm::DbErr> {
    rows.iter().map(|row| row.try_get::<String>("", "biz_id")).collect()
}

/// The first offset of each of `orders` order numbers' sagas not finished for good, by order
/// (topic and partition): what [`Store::behind_a_review`] keeps a candidate behind.
fn first_open_sql(backend: sea_orm::DbBackend, orders: usize) -> String {
    format!(
        "SELECT order_no, src_topic, src_partition, MIN(src_offset) AS first_offset FROM {} \
         WHERE order_no IN ({}) AND status NOT IN ({}) GROUP BY order_no, src_topic, src_partition",
        dialect::through_index(backend, "saga", "saga_order"),
        dialect::placeholders(orders),
        crate::lease::quoted(&FINISHED_FOR_GOOD),
    )
}

/// The search for candidates: [`purgeable`] rows, with what [`Store::behind_a_review`] needs;
/// with `skip_reviews`, only those with no earlier saga of their order not finished for good
/// (the same question asked in the search, of each candidate).
fn candidates_sql(backend: sea_orm::DbBackend, skip_reviews: bool) -> String {
    let hint = if backend == sea_orm::DbBackend::MySql { " FORCE INDEX (saga_recovery)" } else { "" };
    let skip = if skip_reviews {
        format!(
            " AND NOT EXISTS (SELECT 1 FROM saga e WHERE e.order_no = s.order_no AND e.src_partition = s.src_partition \
             AND e.src_offset < s.src_offset AND e.src_topic = s.src_topic AND e.status NOT IN ({}))",
            crate::lease::quoted(&FINISHED_FOR_GOOD)
        )
    } else {
        String::new()
    };
    format!(
        "SELECT s.biz_id, s.order_no, s.src_topic, s.src_partition, s.src_offset FROM saga AS s{hint} \
         WHERE s.lease_until_ms < {} - ? AND {}{skip} LIMIT ?",
        dialect::now_ms(backend),
        purgeable(backend, "s"),
    )
}

/// What the candidates' search is called in errors.
const SEARCH: &str = "find finished sagas to purge";

/// The statuses no saga leaves (MANUAL_REVIEW is left by a person's send-back): an earlier
/// saga of its order in any other keeps a finished saga from the purge.
const FINISHED_FOR_GOOD: [Status; 3] = [Status::Done, Status::RolledBack, Status::Parked];

/// A listed candidate's place in its order.
struct Candidate {
    biz_id: String,
    order: (String, String, i32),
    offset: i64,
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use midflight_model::Status;
    use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait, Value};

    use super::Purged;
    use crate::testing::{TestDb, age, arrive_orders, drive_to_done, hold_sagas, plan_of};
    use crate::{FindingTicket, WMS_LEDGER_STEP};

    const HOUR_MS: i64 = 3_600_000;

    async fn count(store: &crate::Store, sql: &str) -> i64 {
        let row = store.db.query_one_raw(Statement::from_string(store.backend, sql)).await.expect("count");
        row.expect("a row").try_get_by_index::<i64>(0).expect("count column")
    }

    /// Old DONE and ROLLED_BACK sagas go with their log and outbox rows, a batch at a time (the
    /// first one's list padded); recent ones, unfinished ones, ones that need a person, ones
    /// with an open ticket and ones whose notification is unpublished stay. A batch listing a
    /// saga that does not qualify when it is deleted (each clause of the condition in turn) is
    /// rolled back whole. The search goes through `saga_recovery` and, on MySQL, the deletes
    /// through the primary key.
    async fn purges_only_old_finished_sagas(db: &TestDb) {
        let store = &db.store;
        let names = [
            "OLD-DONE-1",
            "OLD-DONE-2",
            "OLD-DONE-3",
            "OLD-BACK",
            "OLD-DONE-UNPUBLISHED",
            "OLD-DONE-TICKET",
            "NEW-DONE",
            "OLD-REVIEW",
            "OLD-PARKED",
            "OLD-OPEN",
        ];
        let sagas = arrive_orders(store, &names).await;
        let ids: Vec<String> = sagas.iter().map(|s| s.biz_id.clone()).collect();
        for i in [0, 1, 2, 4, 5, 6] {
            drive_to_done(store, sagas[i].clone(), "consumer:c1", 30_000).await;
        }
        let publish = "UPDATE outbox SET published_at_ms = 1 WHERE biz_id <> ?";
        let statement = Statement::from_sql_and_values(store.backend, publish, [Value::from(ids[4].clone())]);
        store.db.execute_raw(statement).await.expect("publish");
        let ticket = FindingTicket {
            key: ids[5].clone(),
            step: WMS_LEDGER_STEP,
            reason: "a person looks at it".into(),
            fingerprint: "test".into(),
            evidence: serde_json::json!({}),
        };
        store.open_finding_ticket(&ticket, "test").await.expect("ticket");
        let statuses = [
            (0, Status::Done),
            (1, Status::Done),
            (2, Status::Done),
            (3, Status::RolledBack),
            (4, Status::Done),
            (5, Status::Done),
            (7, Status::ManualReview),
            (8, Status::Parked),
            (9, Status::WmsRequested),
        ];
        for (i, status) in statuses {
            age(store, &ids[i], status, 49 * HOUR_MS).await;
        }
        let transitions_before = count(store, "SELECT COUNT(*) FROM saga_transition").await;
        let mut purged_log = 0;
        for id in &ids[..4] {
            purged_log += count(store, &format!("SELECT COUNT(*) FROM saga_transition WHERE biz_id = '{id}'")).await;
        }

        // A list with one saga that does not qualify deletes nothing: too recent, unpublished,
        // a ticket open, not finished.
        let unbounded = super::Cutoff { older_than_ms: 48 * HOUR_MS, judged_before_ms: i64::MAX };
        for other in [6, 4, 5, 9] {
            let listed = vec![ids[0].clone(), ids[other].clone()];
            let purged = store.purge_listed(unbounded, listed).await.expect("purge");
            assert_eq!(purged, Purged { rolled_back: 1, ..Purged::default() }, "{}", ids[other]);
        }
        // Nor does one whose last lease ended at or after the judged bound.
        let old = ids[..4].iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(", ");
        let lease_end = |which: &str| format!("SELECT {which}(lease_until_ms) FROM saga WHERE biz_id IN ({old})");
        let (earliest, latest) = (count(store, &lease_end("MIN")).await, count(store, &lease_end("MAX")).await);
        let judged = super::Cutoff { judged_before_ms: earliest, ..unbounded };
        let purged = store.purge_listed(judged, vec![ids[1].clone()]).await.expect("purge");
        assert_eq!(purged, Purged { rolled_back: 1, ..Purged::default() }, "judged bound");
        assert_eq!(count(store, "SELECT COUNT(*) FROM saga").await, 10, "nothing deleted");
        // A reconciliation that has judged only sagas whose leases ended before the earliest of
        // the old ones keeps them all.
        assert_eq!(store.purge_finished(48 * HOUR_MS, Some(earliest), 500).await.expect("purge"), Purged::default());

        let first = store.purge_finished(48 * HOUR_MS, Some(latest + 1), 3).await.expect("purge");
        let second = store.purge_finished(48 * HOUR_MS, Some(latest + 1), 3).await.expect("purge");
        let third = store.purge_finished(48 * HOUR_MS, None, 3).await.expect("purge");
        assert_eq!((first.sagas, second.sagas, third), (3, 1, Purged::default()), "three a batch, then the last");
        let mut all = first;
        all += second;
        // MySQL lists up to twice the batch: the four old sagas, then the one left.
        let listed = if store.backend == DbBackend::MySql { 5 } else { 4 };
        assert_eq!(all, Purged { sagas: 4, transitions: purged_log as u64, outbox: 3, rolled_back: 0, listed });
        assert!(first.more_after(3) && !second.more_after(3), "a full batch, then the last: {first:?} {second:?}");

        let left: Vec<String> = store.page("", 100).await.expect("page").into_iter().map(|s| s.biz_id).collect();
        let mut kept = ids[4..].to_vec();
        kept.sort();
        assert_eq!(left, kept, "only the four old finished sagas with nothing pending went");
        assert_eq!(count(store, "SELECT COUNT(*) FROM saga_transition").await, transitions_before - purged_log);
        let outbox: Vec<String> = store.outbox_rows().await.expect("outbox").into_iter().map(|(id, _)| id).collect();
        let mut expected = vec![ids[4].clone(), ids[5].clone(), ids[6].clone()];
        expected.sort();
        assert_eq!(outbox, expected, "the kept sagas' outbox rows stay");

        // A horizon longer than every row's age deletes nothing.
        assert_eq!(store.purge_finished(50 * HOUR_MS, None, 500).await.expect("purge"), Purged::default());

        let values =
            vec![Value::from(48 * HOUR_MS), Value::from(48 * HOUR_MS), Value::from(i64::MAX), Value::from(500_u64)];
        let plan = plan_of(store, &super::candidates_sql(store.backend, false), values).await;
        assert!(plan.iter().any(|step| step.contains("saga_recovery")), "plan {plan:?} does not use saga_recovery");
        if store.backend == DbBackend::MySql {
            let saga_condition = super::purgeable(store.backend, "t");
            let bounds = [Value::from(48 * HOUR_MS), Value::from(i64::MAX)];
            for (table, condition, parameters) in
                [("saga", saga_condition.as_str(), &bounds[..]), ("saga_transition", "", &[]), ("outbox", "", &[])]
            {
                // A padded list of four, as a batch of three sends.
                let listed = [&kept[0], &kept[1], &kept[2], &kept[2]];
                let sql = super::delete_listed_sql(store.backend, table, condition, listed.len());
                let mut values: Vec<Value> = listed.iter().map(|id| Value::from((*id).clone())).collect();
                values.extend_from_slice(parameters);
                let plan = mysql_plan(store, &sql, values).await;
                let target = plan.iter().find(|(name, _, _)| name == "t").expect("a step for the table");
                assert_eq!(target.1, "PRIMARY", "{table}: plan {plan:?}");
                assert!(matches!(target.2.as_str(), "eq_ref" | "ref"), "{table}: plan {plan:?}");
            }
            // The batch's lock reads the listed rows by primary key too.
            let mut values: Vec<Value> = kept[..4].iter().map(|id| Value::from(id.clone())).collect();
            values.extend([Value::from(48 * HOUR_MS), Value::from(i64::MAX), Value::from(4_u64)]);
            let plan = mysql_plan(store, &super::lock_listed_sql(4), values).await;
            let target = plan.iter().find(|(name, _, _)| name == "t").expect("a step for the saga table");
            assert_eq!((target.1.as_str(), target.2.as_str()), ("PRIMARY", "eq_ref"), "lock: plan {plan:?}");
            // The read of the listed candidates' orders goes through saga_order for the longest
            // list a listing makes (twice the largest batch, padded), not a scan of the table.
            let listed = 2 * crate::BATCH_ROWS_MAX;
            let orders = crate::dialect::padded((0..listed).map(|n| format!("O-{n}")).collect::<Vec<_>>());
            assert_eq!(orders.len(), 1_024);
            let sql = super::first_open_sql(store.backend, orders.len());
            let plan = mysql_plan(store, &sql, orders.into_iter().map(Value::from).collect()).await;
            assert_eq!(plan.len(), 1, "orders: plan {plan:?}");
            assert_eq!((plan[0].1.as_str(), plan[0].2.as_str()), ("saga_order", "range"), "orders: plan {plan:?}");
        }
    }
    crate::both_engines!(purge_keeps_what_it_must, purges_only_old_finished_sagas);

    /// Makes saga `id` one of `order`'s, on `partition` of `topic`.
    async fn follow(store: &crate::Store, id: &str, order: &str, partition: i32, topic: &str) {
        let sql = "UPDATE saga SET order_no = ?, src_partition = ?, src_topic = ? WHERE biz_id = ?";
        let values: Vec<Value> = vec![order.into(), partition.into(), topic.into(), id.into()];
        store.db.execute_raw(Statement::from_sql_and_values(store.backend, sql, values)).await.expect("follow");
    }

    /// The first of `ids` in MANUAL_REVIEW two days ago, the others DONE then, in their order.
    async fn review_then_finish(store: &crate::Store, ids: &[String]) {
        age(store, &ids[0], Status::ManualReview, 49 * HOUR_MS).await;
        for id in &ids[1..] {
            age(store, id, Status::Done, 49 * HOUR_MS).await;
        }
    }

    /// A finished saga whose order has an earlier saga in MANUAL_REVIEW stays, however old:
    /// its row is what keeps that one from being sent back to automation after it. A later
    /// saga of the order on another partition or topic is not held, and once a person has
    /// closed the earlier saga, both go.
    async fn keeps_what_follows_a_review(db: &TestDb) {
        let store = &db.store;
        let sagas = arrive_orders(store, &["REVIEWED", "AFTER", "ELSEWHERE", "OTHER-TOPIC"]).await;
        let ids: Vec<String> = sagas.iter().map(|s| s.biz_id.clone()).collect();
        let order = &sagas[0].order_no;
        for (id, partition, topic) in [(&ids[1], 0, "orders"), (&ids[2], 1, "orders"), (&ids[3], 0, "orders-retry")] {
            follow(store, id, order, partition, topic).await;
        }
        review_then_finish(store, &ids).await;
        let purged = store.purge_finished(48 * HOUR_MS, None, 500).await.expect("purge");
        assert_eq!(purged.sagas, 2, "{purged:?}");
        let left: Vec<String> = store.page("", 100).await.expect("page").into_iter().map(|s| s.biz_id).collect();
        assert_eq!(left, vec![ids[1].clone(), ids[0].clone()], "the saga after the review and the review stay");
        // Listed again and kept again, and the search asked again stepping over it finds
        // nothing: nothing more to do this round.
        let again = store.purge_finished(48 * HOUR_MS, None, 500).await.expect("purge");
        assert_eq!(again, Purged::default());

        age(store, &ids[0], Status::RolledBack, 49 * HOUR_MS).await;
        let purged = store.purge_finished(48 * HOUR_MS, None, 500).await.expect("purge");
        assert_eq!(purged.sagas, 2, "{purged:?}");
        assert!(store.page("", 100).await.expect("page").is_empty());
    }
    crate::both_engines!(purge_keeps_what_follows_a_review, keeps_what_follows_a_review);

    /// A listing that is mostly sagas kept behind a review does not stop the purge: the
    /// search is asked again, stepping over them, and the saga behind them goes.
    async fn steps_over_a_listing_of_kept_sagas(db: &TestDb) {
        let store = &db.store;
        let names = ["REVIEWED", "AFTER-1", "AFTER-2", "AFTER-3", "AFTER-4", "FREE"];
        let sagas = arrive_orders(store, &names).await;
        let ids: Vec<String> = sagas.iter().map(|s| s.biz_id.clone()).collect();
        for id in &ids[1..5] {
            follow(store, id, &sagas[0].order_no, 0, "orders").await;
        }
        // Aged in this order, so the kept sagas come first in the purge's search.
        review_then_finish(store, &ids).await;
        // A batch of two lists two (SQLite) or four (MySQL), all kept.
        let purged = store.purge_finished(48 * HOUR_MS, None, 2).await.expect("purge");
        assert_eq!(purged.sagas, 1, "{purged:?}");
        assert_eq!(store.get(&ids[5]).await.expect("read"), None, "the free saga went");
        assert_eq!(store.page("", 100).await.expect("page").len(), 5, "the review and the four behind it stay");
    }
    crate::both_engines!(purge_steps_over_a_listing_of_kept_sagas, steps_over_a_listing_of_kept_sagas);

    /// Purgers running at once take different sagas. On MySQL a purge steps over the sagas
    /// another transaction holds (another purger's batch, here a transaction holding two of
    /// them) and takes a full batch among the others without waiting; before, it listed the
    /// held ones, waited on their locks and rolled back. A batch's lock holds the sagas it
    /// listed and nothing else: not a saga in flight (after the finished ones in
    /// `saga_recovery`), not a listed saga past its limit. On both engines, two purgers at once
    /// delete every old saga exactly once, with its log and outbox rows, and keep the saga in
    /// flight. A batch that came back short because most of what it listed was held says there
    /// is more to purge at once ([`Purged::more_after`]); one that found all of it held does not.
    async fn purgers_take_different_sagas(db: &TestDb) {
        let store = &db.store;
        let mut names: Vec<String> = (0..10).map(|n| format!("OLD-{n}")).collect();
        names.push("ACTIVE".into());
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let sagas = arrive_orders(store, &names).await;
        let (old, active) = (&sagas[..10], &sagas[10].biz_id);
        for saga in old {
            drive_to_done(store, saga.clone(), "consumer:c1", 30_000).await;
            age(store, &saga.biz_id, Status::RolledBack, 49 * HOUR_MS).await;
        }
        age(store, active, Status::WmsRequested, 0).await;
        store.db.execute_unprepared("UPDATE outbox SET published_at_ms = 1").await.expect("publish");
        let ids = |sagas: &[midflight_model::Saga]| sagas.iter().map(|saga| saga.biz_id.clone()).collect::<Vec<_>>();
        let mut left = 10;
        if store.backend == DbBackend::MySql {
            let held = ids(&old[..2]);
            let holder = hold_sagas(store, &held).await;
            let purge = store.purge_finished(48 * HOUR_MS, None, 4);
            let purged = tokio::time::timeout(std::time::Duration::from_secs(10), purge)
                .await
                .expect("the purge waits on no lock another batch holds")
                .expect("purge");
            assert_eq!((purged.sagas, purged.rolled_back), (4, 0), "a full batch beside the held rows: {purged:?}");
            let kept: Vec<String> = store.page("", 100).await.expect("page").into_iter().map(|s| s.biz_id).collect();
            assert!(held.iter().all(|id| kept.contains(id)), "the held sagas stay: {kept:?}");
            holder.release().await;

            let mut rest: Vec<String> = kept.into_iter().filter(|id| id != active).collect();
            rest.sort();
            assert_eq!(rest.len(), 6, "{rest:?}");
            // A batch's lock takes at most its limit of the listed rows, then (a limit above
            // the list) all of them, never a row it did not list, nor a listed saga in flight.
            let mut listed = rest[1..5].to_vec();
            listed.extend(["NO-SUCH-SAGA".to_owned(), active.clone()]);
            for limit in [3, 10] {
                let batch = store.begin_purge().await.expect("batch transaction");
                let unbounded = super::Cutoff { older_than_ms: 48 * HOUR_MS, judged_before_ms: i64::MAX };
                let locked = store.lock_listed(&batch, unbounded, listed.clone(), limit).await.expect("lock");
                assert_eq!(locked.len(), limit.min(4) as usize, "{locked:?}");
                let mut probed = vec![active.clone(), rest[0].clone(), rest[5].clone()];
                probed.extend(listed[..4].iter().filter(|id| !locked.contains(id)).cloned());
                let free = probed.len();
                probed.extend(locked.iter().cloned());
                let probe = store.db.begin().await.expect("probe transaction");
                let got = lock_each(&probe, &probed).await;
                let expected: Vec<bool> = (0..probed.len()).map(|n| n < free).collect();
                assert_eq!(got, expected, "the batch holds what it locked and nothing else ({probed:?})");
                probe.rollback().await.expect("probe ends");
                batch.rollback().await.expect("batch ends");
            }
            // What a server without SKIP LOCKED answers is told apart, for a clear error.
            let old_syntax = Statement::from_string(DbBackend::MySql, "SELECT 1 FOR UPDATE SKIP SKIP");
            let refused = store.db.query_all_raw(old_syntax).await.expect_err("a statement the server cannot parse");
            assert!(super::parse_error(&refused), "{refused}");

            // A batch short of its limit because another transaction holds most of what it
            // listed has more to do at once; one that finds every listed row held has not.
            let holder = hold_sagas(store, &rest[..4]).await;
            let short = store.purge_finished(48 * HOUR_MS, None, 3).await.expect("purge");
            assert_eq!((short.sagas, short.listed, short.rolled_back), (2, 6, 0), "{short:?}");
            assert!(short.more_after(3), "the held rows listed, the others deleted: {short:?}");
            let none = store.purge_finished(48 * HOUR_MS, None, 3).await.expect("purge");
            assert_eq!((none.sagas, none.listed, none.rolled_back), (0, 4, 0), "{none:?}");
            assert!(!none.more_after(3), "every listed row held: {none:?}");
            holder.release().await;
            left = 4;
        }
        let old_log = format!("SELECT COUNT(*) FROM saga_transition WHERE biz_id <> '{active}'");
        let transitions = count(store, &old_log).await;
        let purger = |store: crate::Store| async move {
            let mut all = Purged::default();
            loop {
                let batch = store.purge_finished(48 * HOUR_MS, None, 2).await.expect("purge");
                all += batch;
                if batch.sagas < 2 && batch.rolled_back == 0 {
                    return all;
                }
            }
        };
        let (first, second) = tokio::join!(purger(store.clone()), purger(store.clone()));
        let mut all = first;
        all += second;
        assert_eq!((all.sagas, all.transitions as i64, all.outbox), (left, transitions, left), "{all:?}");
        let kept: Vec<String> = store.page("", 100).await.expect("page").into_iter().map(|s| s.biz_id).collect();
        assert_eq!(kept, std::slice::from_ref(active), "the saga in flight stays");
        assert_eq!(count(store, &old_log).await, 0, "the old sagas' log went");
        assert_eq!(count(store, "SELECT COUNT(*) FROM outbox").await, 0, "their outbox rows went");
    }

    /// Tries to lock each saga row of `ids` by primary key in `txn` without waiting: whether
    /// it got each.
    async fn lock_each(txn: &sea_orm::DatabaseTransaction, ids: &[String]) -> Vec<bool> {
        let mut got = Vec::new();
        for id in ids {
            let sql = "SELECT biz_id FROM saga FORCE INDEX (PRIMARY) WHERE biz_id = ? FOR UPDATE NOWAIT";
            let statement = Statement::from_sql_and_values(DbBackend::MySql, sql, [Value::from(id.clone())]);
            got.push(txn.query_one_raw(statement).await.is_ok());
        }
        got
    }
    crate::both_engines!(purgers_take_different_sagas_at_once, purgers_take_different_sagas);

    /// MySQL's plan of `sql`: (table, key, access type) of each step.
    async fn mysql_plan(store: &crate::Store, sql: &str, values: Vec<Value>) -> Vec<(String, String, String)> {
        let statement = Statement::from_sql_and_values(store.backend, format!("EXPLAIN {sql}"), values);
        let rows = store.db.query_all_raw(statement).await.expect("explain");
        let text = |row: &sea_orm::QueryResult, column: &str| {
            row.try_get::<Option<String>>("", column).expect("plan column").unwrap_or_default()
        };
        rows.iter().map(|row| (text(row, "table"), text(row, "key"), text(row, "type"))).collect()
    }
}
