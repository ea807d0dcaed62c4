//! The durable inbox: a fetched batch becomes RECEIVED (or PARKED) rows in one transaction,
//! and only then may the consumer commit the batch's offsets. The table, not the offset, is
//! the record of work.

use midflight_model::{Saga, Status};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Statement, TransactionTrait, Value};

use crate::entity::saga;
use crate::error::{Context, Error};
use crate::row::{self, fit};
use crate::{BATCH_ROWS_MAX, Store, dialect};

/// What became of one message of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// The row is new and leased to the caller (epoch 1): the caller drives it.
    Fresh(Saga),
    /// The row existed already (a redelivery): the caller looks at it and usually leaves it.
    Existing(Saga),
}

impl Arrival {
    pub fn saga(&self) -> &Saga {
        match self {
            Arrival::Fresh(saga) | Arrival::Existing(saga) => saga,
        }
    }
}

const COLUMNS: &str = "biz_id, order_no, event_type, src_topic, src_partition, src_offset, payload, status, version, \
     attempts, next_attempt_at_ms, last_error, deadline_ms, owner_id, lease_epoch, lease_until_ms, trace_context, \
     created_at_ms, updated_at_ms";
const COLUMN_COUNT: usize = 19;

impl Store {
    /// Inserts new rows (RECEIVED ones leased to `owner` for `lease_ms`, PARKED ones unleased)
    /// and their arrival log rows, ignoring rows whose biz_id exists; returns every row as it now
    /// stands, in input order, marked fresh (ours to drive) or existing.
    ///
    /// A row counts as fresh when it is owned by `owner` at version 0, so an `owner` id must be
    /// unique per process incarnation, and a process must not pass the same biz_id twice while
    /// it still drives the first (the consumer keeps an in-flight set for that).
    pub async fn insert_arrivals(
        &self,
        sagas: &[Saga],
        owner: &str,
        lease_ms: i64,
        actor: &str,
    ) -> Result<Vec<Arrival>, Error> {
        if sagas.is_empty() {
            return Ok(Vec::new());
        }
        if sagas.len() > BATCH_ROWS_MAX {
            return Err(Error::Invalid(format!("batch of {} rows is over the limit of {BATCH_ROWS_MAX}", sagas.len())));
        }
        if let Some(bad) = sagas.iter().find(|s| !matches!(s.status, Status::Received | Status::Parked)) {
            return Err(Error::Invalid(format!(
                "saga {}: only RECEIVED or PARKED rows arrive, not {}",
                bad.biz_id, bad.status
            )));
        }
        // A power-of-two number of rows (the last one repeated: a repeat is a conflict, which
        // inserts nothing), so the two statements keep a few shapes that stay prepared on every
        // connection (`dialect::padded` says why). Splitting the batch into power-of-two chunks
        // instead cost a round trip per chunk, which on this box took longer than the padding.
        let (insert, log) = self.arrival_statements(&dialect::padded(sagas.iter().collect()), owner, lease_ms, actor);
        let txn = self.db.begin().await.during("begin inbox insert", None)?;
        txn.execute_raw(insert).await.during("insert inbox rows", None)?;
        txn.execute_raw(log).await.during("insert arrival log rows", None)?;
        txn.commit().await.during("commit inbox insert", None)?;
        self.stats.write_committed();
        self.classify(sagas, owner).await
    }

    /// The INSERT of `sagas`' rows and the INSERT of their arrival log rows.
    fn arrival_statements(&self, sagas: &[&Saga], owner: &str, lease_ms: i64, actor: &str) -> (Statement, Statement) {
        let now = dialect::now_ms(self.backend);
        let mut rows = Vec::with_capacity(sagas.len());
        let mut values: Vec<Value> = Vec::with_capacity(sagas.len() * COLUMN_COUNT);
        let mut log_rows = Vec::with_capacity(sagas.len());
        let mut log_values: Vec<Value> = Vec::with_capacity(sagas.len() * 6);
        for saga in sagas {
            let leased = saga.status == Status::Received;
            let lease = if leased { format!("{now} + ?") } else { "0".to_owned() };
            rows.push(format!("({}, {lease}, ?, ?, ?)", dialect::placeholders(COLUMN_COUNT - 4)));
            values.extend([
                saga.biz_id.clone().into(),
                saga.order_no.clone().into(),
                saga.event_type.clone().into(),
                saga.source.topic.clone().into(),
                saga.source.partition.into(),
                saga.source.offset.into(),
                saga.payload.clone().into(),
                saga.status.as_str().into(),
                0_i64.into(),
                0_i32.into(),
                0_i64.into(),
                saga.last_error.as_deref().map(|e| fit(e, 1024)).into(),
                saga.deadline_ms.into(),
                leased.then(|| owner.to_owned()).into(),
                i64::from(leased).into(),
            ]);
            if leased {
                values.push(lease_ms.into());
            }
            values.extend([saga.trace_context.clone().into(), saga.created_at_ms.into(), saga.updated_at_ms.into()]);
            log_rows.push(format!("(?, 0, NULL, ?, ?, ?, ?, {now})"));
            let reason = if leased { "received" } else { "parked: poison input" };
            log_values.extend([
                saga.biz_id.clone().into(),
                saga.status.as_str().into(),
                i64::from(leased).into(),
                actor.into(),
                reason.into(),
            ]);
        }
        let insert = format!(
            "INSERT INTO saga ({COLUMNS}) VALUES {}{}",
            rows.join(", "),
            dialect::on_conflict_do_nothing(self.backend, "biz_id")
        );
        let log = format!(
            "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms) VALUES {}{}",
            log_rows.join(", "),
            dialect::on_conflict_do_nothing(self.backend, "biz_id")
        );
        (
            Statement::from_sql_and_values(self.backend, insert, values),
            Statement::from_sql_and_values(self.backend, log, log_values),
        )
    }

    async fn classify(&self, sagas: &[Saga], owner: &str) -> Result<Vec<Arrival>, Error> {
        let ids = dialect::padded(sagas.iter().map(|s| s.biz_id.clone()).collect());
        let stored = saga::Entity::find()
            .filter(saga::Column::BizId.is_in(ids))
            .all(&self.db)
            .await
            .during("read inbox rows", None)?;
        let mut by_id = std::collections::HashMap::with_capacity(stored.len());
        for model in stored {
            by_id.insert(model.biz_id.clone(), row::to_saga(model)?);
        }
        let mut out = Vec::with_capacity(sagas.len());
        let mut seen = std::collections::HashSet::with_capacity(sagas.len());
        for wanted in sagas {
            let stored = by_id.get(&wanted.biz_id).cloned().ok_or_else(|| Error::Corrupt {
                biz_id: wanted.biz_id.clone(),
                message: "inserted row not found right after the insert".to_owned(),
            })?;
            // The same biz_id twice in one batch: only the first can be fresh.
            let first = seen.insert(wanted.biz_id.clone());
            let ours = stored.lease.owner_id.as_deref() == Some(owner)
                && stored.version == 0
                && stored.status == Status::Received;
            out.push(if ours && first { Arrival::Fresh(stored) } else { Arrival::Existing(stored) });
        }
        Ok(out)
    }
}
