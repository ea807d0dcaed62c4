//! Ownership: claiming (taking over) a saga whose lease is free or expired, renewing and
//! releasing a lease. A claim bumps `lease_epoch`, the fencing token: every later write by an
//! older holder names the old epoch and matches nothing.

use midflight_model::{Saga, Status};
use sea_orm::{ConnectionTrait, EntityTrait, Statement};

use crate::entity::saga;
use crate::error::{Context, Error};
use crate::row::{self, signed};
use crate::{Cas, Store, dialect};

impl Store {
    /// Takes over `biz_id` if it is not terminal, its lease has expired by the database clock,
    /// and its backoff is over. Consumer and recovery worker use this same claim: whoever wins
    /// drives, everyone else leaves the row alone. The takeover is logged.
    pub async fn claim(&self, biz_id: &str, owner: &str, lease_ms: i64, actor: &str) -> Result<Cas<Saga>, Error> {
        let now = dialect::now_ms(self.backend);
        let terminal = terminal_list();
        let sql = format!(
            "UPDATE saga SET owner_id = ?, lease_epoch = lease_epoch + 1, version = version + 1, \
             lease_until_ms = {now} + ?, updated_at_ms = {now} \
             WHERE biz_id = ? AND status NOT IN ({terminal}) AND lease_until_ms <= {now} AND next_attempt_at_ms <= {now}"
        );
        let some = Some(biz_id);
        let txn = self.begin("begin claim", some).await?;
        let result = txn
            .execute_raw(Statement::from_sql_and_values(
                self.backend,
                sql,
                [owner.into(), lease_ms.into(), biz_id.into()],
            ))
            .await
            .during("claim", some)?;
        if result.rows_affected() == 0 {
            txn.rollback().await.during("roll back claim", some)?;
            return Ok(Cas::Conflict);
        }
        let model = saga::Entity::find_by_id(biz_id.to_owned()).one(&txn).await.during("read claimed row", some)?;
        let claimed = row::to_saga(model.ok_or_else(|| Error::Corrupt {
            biz_id: biz_id.to_owned(),
            message: "claimed row vanished inside the transaction".to_owned(),
        })?)?;
        let log = format!(
            "INSERT INTO saga_transition (biz_id, version, from_status, to_status, lease_epoch, actor, reason, at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, 'takeover', {now})"
        );
        let values = [
            biz_id.into(),
            signed(claimed.version).into(),
            claimed.status.as_str().into(),
            claimed.status.as_str().into(),
            signed(claimed.lease.epoch).into(),
            actor.into(),
        ];
        txn.execute_raw(Statement::from_sql_and_values(self.backend, log, values))
            .await
            .during("log takeover", some)?;
        txn.commit().await.during("commit claim", some)?;
        self.stats.write_committed();
        Ok(Cas::Applied(claimed))
    }

    /// Extends the lease of a saga the caller holds, by `lease_ms` from the database clock.
    /// Conflict means the caller no longer holds it (taken over or changed) and must stop.
    pub async fn renew(&self, saga: &Saga, lease_ms: i64) -> Result<Cas<Saga>, Error> {
        self.set_lease(saga, Some(lease_ms), "renew lease").await
    }

    /// Gives the lease up (expires it now), so anyone may claim the saga.
    pub async fn release(&self, saga: &Saga) -> Result<Cas<Saga>, Error> {
        self.set_lease(saga, None, "release lease").await
    }

    async fn set_lease(&self, saga: &Saga, lease_ms: Option<i64>, operation: &'static str) -> Result<Cas<Saga>, Error> {
        let now = dialect::now_ms(self.backend);
        let until = if lease_ms.is_some() { format!("{now} + ?") } else { now.to_owned() };
        let sql = format!(
            "UPDATE saga SET version = version + 1, lease_until_ms = {until}, updated_at_ms = {now} \
             WHERE biz_id = ? AND version = ? AND lease_epoch = ?"
        );
        let mut values = Vec::with_capacity(4);
        if let Some(ms) = lease_ms {
            values.push(ms.into());
        }
        values.extend([saga.biz_id.clone().into(), signed(saga.version).into(), signed(saga.lease.epoch).into()]);
        let statement = Statement::from_sql_and_values(self.backend, sql, values);
        let result = self
            .patiently(operation, || self.db.execute_raw(statement.clone()))
            .await
            .during(operation, Some(&saga.biz_id))?;
        self.stats.write_committed();
        if result.rows_affected() == 0 {
            return Ok(Cas::Conflict);
        }
        let now_ms = self.now_ms().await?;
        let mut next = saga.clone();
        next.version += 1;
        next.lease.until_ms = now_ms + lease_ms.unwrap_or(0);
        next.updated_at_ms = now_ms;
        Ok(Cas::Applied(next))
    }
}

/// `'DONE', 'ROLLED_BACK', ...`: the terminal statuses as an SQL list (constants, not input).
pub(crate) fn terminal_list() -> String {
    quoted(&Status::TERMINAL)
}

/// The non-terminal statuses as an SQL list.
pub(crate) fn active_list() -> String {
    let active: Vec<Status> = Status::ALL.into_iter().filter(|s| !s.is_terminal()).collect();
    quoted(&active)
}

/// `statuses` as an SQL list (constants, not input).
pub(crate) fn quoted(statuses: &[Status]) -> String {
    statuses.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(", ")
}
