//! Purging finished sagas: the table keeps every saga until something deletes it, and at the
//! user's rates that is hundreds of millions of rows a day.
//!
//! What may go: sagas that are DONE or ROLLED_BACK (no transition leaves either, so a row seen
//! finished stays finished) and were last written longer ago than the caller's horizon by the
//! database clock, with their transition-log rows and their outbox row once it is published.
//! What stays: sagas that need a person (MANUAL_REVIEW, PARKED), tickets (the evidence of what a
//! person decided), an outbox row not yet published, and the business `orders` rows, which are
//! the business's own records.
//!
//! The row is what turns a redelivered message into a no-op, so a message that can still be
//! read from the topic must find its row: the horizon has to be longer than the oldest message
//! the topic can hand out (the caller's configuration says how that is chosen).

use sea_orm::{ConnectionTrait, DatabaseTransaction, Statement, Value};

use crate::error::{Context, Error};
use crate::{BATCH_ROWS_MAX, Store, dialect};

/// What one purge batch deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub sagas: u64,
    pub transitions: u64,
    pub outbox: u64,
}

impl std::ops::AddAssign for Purged {
    fn add_assign(&mut self, other: Purged) {
        self.sagas += other.sagas;
        self.transitions += other.transitions;
        self.outbox += other.outbox;
    }
}

/// The statuses a purge deletes.
const PURGED: &str = "'DONE', 'ROLLED_BACK'";

impl Store {
    /// Deletes up to `limit` (at most [`BATCH_ROWS_MAX`]) sagas finished more than
    /// `older_than_ms` ago, with their transition-log rows and published outbox rows, in one
    /// transaction. Returns what it deleted; fewer sagas than `limit` means none older are left
    /// (or another purger took some).
    ///
    /// The candidates are found through `saga_recovery` (status, then `lease_until_ms`, which a
    /// finished row's last write set at most one lease after its `updated_at_ms`), so the
    /// search reads the old finished rows only, and a row goes at most one lease later than
    /// its horizon. The deletes name rows by primary key and lock only those: rows nobody
    /// else writes (finished sagas, their log, published outbox rows).
    pub async fn purge_finished(&self, older_than_ms: i64, limit: u64) -> Result<Purged, Error> {
        let limit = limit.clamp(1, BATCH_ROWS_MAX as u64);
        let operation = "find finished sagas to purge";
        let statement = Statement::from_sql_and_values(
            self.backend,
            candidates_sql(self.backend),
            [older_than_ms.into(), older_than_ms.into(), limit.into()],
        );
        let rows =
            self.patiently(operation, || self.db.query_all_raw(statement.clone())).await.during(operation, None)?;
        let mut ids = rows
            .iter()
            .map(|row| row.try_get::<String>("", "biz_id"))
            .collect::<Result<Vec<_>, _>>()
            .during(operation, None)?;
        if ids.is_empty() {
            return Ok(Purged::default());
        }
        // Primary-key order, so two purgers lock shared rows in the same order.
        ids.sort_unstable();
        let ids = dialect::padded(ids);
        let txn = self.begin("begin purge", None).await?;
        let now = dialect::now_ms(self.backend);
        let finished = format!("t.status IN ({PURGED}) AND t.updated_at_ms < {now} - ?");
        let purged = Purged {
            sagas: self.delete_listed(&txn, "saga", &finished, Some(older_than_ms), &ids).await?,
            transitions: self.delete_listed(&txn, "saga_transition", "", None, &ids).await?,
            outbox: self.delete_listed(&txn, "outbox", "t.published_at_ms IS NOT NULL", None, &ids).await?,
        };
        txn.commit().await.during("commit purge", None)?;
        self.stats.write_committed();
        Ok(purged)
    }

    /// Deletes the rows of `table` whose biz_id is in `ids` and that meet `condition` (on `t`,
    /// with `first` as its one parameter); returns how many it deleted.
    async fn delete_listed(
        &self,
        txn: &DatabaseTransaction,
        table: &str,
        condition: &str,
        first: Option<i64>,
        ids: &[String],
    ) -> Result<u64, Error> {
        let sql = delete_listed_sql(self.backend, table, condition, ids.len());
        let mut values: Vec<Value> = ids.iter().cloned().map(Value::from).collect();
        values.extend(first.map(Value::from));
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
/// (seen with EXPLAIN on 10.11); under REPEATABLE READ a scanning DELETE locks every row it
/// reads until commit, rows of sagas in flight included, and the consumer's group transactions
/// would wait on it or deadlock with it. The join reads (and locks) only the rows it names.
fn delete_listed_sql(backend: sea_orm::DbBackend, table: &str, condition: &str, n: usize) -> String {
    let and = |prefix: &str| if condition.is_empty() { String::new() } else { format!(" {prefix} {condition}") };
    match backend {
        sea_orm::DbBackend::MySql => format!(
            "DELETE t FROM ({}) AS k STRAIGHT_JOIN {table} AS t FORCE INDEX (PRIMARY) ON t.biz_id = k.biz_id{}",
            vec!["SELECT ? AS biz_id"; n].join(" UNION ALL "),
            and("WHERE")
        ),
        _ => format!("DELETE FROM {table} AS t WHERE t.biz_id IN ({}){}", dialect::placeholders(n), and("AND")),
    }
}

fn candidates_sql(backend: sea_orm::DbBackend) -> String {
    let now = dialect::now_ms(backend);
    format!(
        "SELECT biz_id FROM {} WHERE status IN ({PURGED}) AND lease_until_ms < {now} - ? AND updated_at_ms < {now} - ? \
         LIMIT ?",
        dialect::through_index(backend, "saga", "saga_recovery")
    )
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use midflight_model::{Saga, Source, Status};
    use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

    use super::Purged;
    use crate::testing::{TestDb, age, drive_to_done, order_event, plan_of};

    const HOUR_MS: i64 = 3_600_000;

    async fn arrive(store: &crate::Store, names: &[&str]) -> Vec<Saga> {
        let now = store.now_ms().await.expect("clock");
        let sagas: Vec<Saga> = names
            .iter()
            .enumerate()
            .map(|(n, name)| {
                let source = Source { topic: "orders".into(), partition: 0, offset: n as i64 };
                Saga::received(&order_event(name), source, now, now + 600_000)
            })
            .collect();
        let arrived = store.insert_arrivals(&sagas, "c1", 60_000, "consumer:c1").await.expect("insert");
        arrived.into_iter().map(|arrival| arrival.saga().clone()).collect()
    }

    async fn count(store: &crate::Store, sql: &str) -> i64 {
        let row = store.db.query_one_raw(Statement::from_string(store.backend, sql)).await.expect("count");
        row.expect("a row").try_get_by_index::<i64>(0).expect("count column")
    }

    /// Old DONE and ROLLED_BACK sagas go with their log and their published outbox row; recent
    /// ones, unfinished ones and ones that need a person stay, and so does an unpublished
    /// outbox row. The search goes through `saga_recovery` and the deletes through the primary
    /// key.
    async fn purges_only_old_finished_sagas(db: &TestDb) {
        let store = &db.store;
        let names =
            ["OLD-DONE", "OLD-DONE-UNPUBLISHED", "NEW-DONE", "OLD-BACK", "OLD-REVIEW", "OLD-PARKED", "OLD-OPEN"];
        let sagas = arrive(store, &names).await;
        let mut done = Vec::new();
        for saga in &sagas[..3] {
            done.push(drive_to_done(store, saga.clone(), "consumer:c1", 30_000).await);
        }
        let publish = "UPDATE outbox SET published_at_ms = 1 WHERE biz_id IN (?, ?)";
        let values: Vec<Value> = vec![done[0].biz_id.clone().into(), done[2].biz_id.clone().into()];
        store.db.execute_raw(Statement::from_sql_and_values(store.backend, publish, values)).await.expect("publish");
        for (saga, status) in [
            (&sagas[0], Status::Done),
            (&sagas[1], Status::Done),
            (&sagas[3], Status::RolledBack),
            (&sagas[4], Status::ManualReview),
            (&sagas[5], Status::Parked),
            (&sagas[6], Status::WmsRequested),
        ] {
            age(store, &saga.biz_id, status, 49 * HOUR_MS).await;
        }
        let transitions_before = count(store, "SELECT COUNT(*) FROM saga_transition").await;
        let of = |biz_id: &str| format!("SELECT COUNT(*) FROM saga_transition WHERE biz_id = '{biz_id}'");
        let purged_log = count(store, &of(&sagas[0].biz_id)).await
            + count(store, &of(&sagas[1].biz_id)).await
            + count(store, &of(&sagas[3].biz_id)).await;

        let first = store.purge_finished(48 * HOUR_MS, 2).await.expect("purge");
        let second = store.purge_finished(48 * HOUR_MS, 2).await.expect("purge");
        let third = store.purge_finished(48 * HOUR_MS, 2).await.expect("purge");
        assert_eq!((first.sagas, second.sagas, third), (2, 1, Purged::default()), "two a batch, then the last");
        let mut all = first;
        all += second;
        assert_eq!(all, Purged { sagas: 3, transitions: purged_log as u64, outbox: 1 });

        let left: Vec<String> = store.page("", 100).await.expect("page").into_iter().map(|s| s.biz_id).collect();
        let mut kept: Vec<String> = [2, 4, 5, 6].iter().map(|&i| sagas[i].biz_id.clone()).collect();
        kept.sort();
        assert_eq!(left, kept, "the recent DONE, MANUAL_REVIEW, PARKED and the unfinished one stay");
        assert_eq!(count(store, "SELECT COUNT(*) FROM saga_transition").await, transitions_before - purged_log);
        let outbox: Vec<String> = store.outbox_rows().await.expect("outbox").into_iter().map(|(id, _)| id).collect();
        assert_eq!(
            outbox,
            [done[2].biz_id.clone(), done[1].biz_id.clone()],
            "the recent and the unpublished rows stay"
        );

        // A horizon longer than every row's age deletes nothing.
        assert_eq!(store.purge_finished(50 * HOUR_MS, 500).await.expect("purge"), Purged::default());

        let values = vec![Value::from(48 * HOUR_MS), Value::from(48 * HOUR_MS), Value::from(500_u64)];
        let plan = plan_of(store, &super::candidates_sql(store.backend), values).await;
        assert!(plan.iter().any(|step| step.contains("saga_recovery")), "plan {plan:?} does not use saga_recovery");
        if store.backend == DbBackend::MySql {
            for (table, condition, first) in [
                ("saga", "t.status IN ('DONE') AND t.updated_at_ms < ?", Some(Value::from(1_i64))),
                ("saga_transition", "", None),
                ("outbox", "t.published_at_ms IS NOT NULL", None),
            ] {
                let sql = super::delete_listed_sql(store.backend, table, condition, 2);
                let mut values: Vec<Value> = kept[..2].iter().cloned().map(Value::from).collect();
                values.extend(first);
                let plan = plan_of(store, &sql, values).await;
                let keys: Vec<&String> = plan.iter().filter(|key| !key.is_empty()).collect();
                assert_eq!(keys, ["PRIMARY"], "{table}: plan {plan:?}");
            }
        }
    }
    crate::both_engines!(purge_keeps_what_it_must, purges_only_old_finished_sagas);
}
