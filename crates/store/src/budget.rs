//! The server's connection limit beside this pool's: read once when a store connects, so that a
//! pool that cannot fit is named in the log at start-up instead of at the first peak (when the
//! server refuses new connections and drives wait them out, `refused.rs`).
//!
//! One instance sees only itself and what is connected now: every instance's pool must fit the
//! server's `max_connections` together (README, "Size the saga database's connection pools
//! together"), which no single instance can check.

use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::Store;
use crate::error::{Context, Error};

/// What a MySQL server allows and has open, read when the store connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionBudget {
    /// The server's `max_connections`.
    pub server_max: u64,
    /// The server's `max_user_connections` (the limit of each account; 0 when unlimited).
    pub per_account_max: u64,
    /// Connections the server had open (`Threads_connected`), this store's first one included.
    pub connected: u64,
}

impl ConnectionBudget {
    /// Why a pool of `pool` connections (one of which is open already) may be refused new
    /// connections by this server, or `None` when it fits what is free now.
    pub fn shortfall(&self, pool: u32) -> Option<String> {
        let pool = u64::from(pool);
        if pool > self.server_max {
            return Some(format!(
                "database.max_connections is {pool}, more than the server allows in all (max_connections {})",
                self.server_max
            ));
        }
        if self.per_account_max > 0 && pool > self.per_account_max {
            return Some(format!(
                "database.max_connections is {pool}, more than the server allows one account (max_user_connections {})",
                self.per_account_max
            ));
        }
        // This store's first connection is among those connected, and is one of its pool's.
        let free = self.server_max.saturating_sub(self.connected) + 1;
        (pool > free).then(|| {
            format!(
                "database.max_connections is {pool}, and the server has {free} of its {} connections free \
                 ({} open, this pool's first one included)",
                self.server_max, self.connected
            )
        })
    }
}

impl Store {
    /// The server's connection limits and how many connections it has open now; `None` on
    /// SQLite, which has no server.
    pub async fn connection_budget(&self) -> Result<Option<ConnectionBudget>, Error> {
        if self.backend != DbBackend::MySql {
            return Ok(None);
        }
        let operation = "read the server's connection limits";
        let sql = "SELECT CAST(@@max_connections AS SIGNED) AS server_max, \
                   CAST(@@max_user_connections AS SIGNED) AS per_account_max";
        let row = self
            .patiently(operation, || self.db.query_one_raw(Statement::from_string(self.backend, sql)))
            .await
            .during(operation, None)?
            .ok_or_else(|| Error::Invalid("the server returned no connection limits".to_owned()))?;
        // MariaDB allows -1 in `max_user_connections`, which admits no new connection for the
        // accounts it applies to; this one is connected, so it is not one of them: read as 0.
        let server_max = u64::try_from(row.try_get::<i64>("", "server_max").during(operation, None)?).unwrap_or(0);
        let per_account_max =
            u64::try_from(row.try_get::<i64>("", "per_account_max").during(operation, None)?).unwrap_or(0);
        let sql = "SHOW GLOBAL STATUS LIKE 'Threads_connected'";
        let row = self
            .patiently(operation, || self.db.query_one_raw(Statement::from_string(self.backend, sql)))
            .await
            .during(operation, None)?
            .ok_or_else(|| Error::Invalid("the server returned no Threads_connected".to_owned()))?;
        let connected = row.try_get_by_index::<String>(1).during(operation, None)?;
        let connected = connected
            .trim()
            .parse::<u64>()
            .map_err(|_| Error::Invalid(format!("the server's Threads_connected is not a number: {connected:?}")))?;
        Ok(Some(ConnectionBudget { server_max, per_account_max, connected }))
    }

    /// Logs the server's connection limits beside `pool`, as a warning when the pool does not
    /// fit what the server has free. A failure to read them is logged and otherwise ignored:
    /// the limits inform, they decide nothing.
    pub(crate) async fn log_connection_budget(&self, pool: u32) {
        match self.connection_budget().await {
            Ok(Some(budget)) => match budget.shortfall(pool) {
                Some(shortfall) => tracing::warn!(
                    pool,
                    server_max = budget.server_max,
                    connected = budget.connected,
                    "{shortfall}: at a peak the server will refuse this pool new connections, and its \
                     operations wait them out for database.acquire_timeout_ms and then fail; size every \
                     instance's pool to fit the server together"
                ),
                None => tracing::info!(
                    pool,
                    server_max = budget.server_max,
                    connected = budget.connected,
                    "the saga database's connection limit"
                ),
            },
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "could not read the saga database's connection limits"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnectionBudget;

    const SERVER: ConnectionBudget = ConnectionBudget { server_max: 151, per_account_max: 0, connected: 21 };

    #[test]
    fn a_pool_that_fits_what_is_free_is_not_named() {
        // 151 - 21 free, plus this pool's own first connection among the 21.
        assert_eq!(SERVER.shortfall(131), None);
        assert_eq!(SERVER.shortfall(32), None);
    }

    #[test]
    fn a_pool_larger_than_what_is_free_is_named_with_the_numbers() {
        let shortfall = SERVER.shortfall(132).expect("one too many");
        assert!(shortfall.contains("131 of its 151 connections free"), "{shortfall}");
        assert!(shortfall.contains("21 open"), "{shortfall}");
    }

    #[test]
    fn a_pool_larger_than_the_server_is_named_as_such() {
        let shortfall = SERVER.shortfall(200).expect("too large");
        assert!(shortfall.contains("more than the server allows in all (max_connections 151)"), "{shortfall}");
    }

    #[test]
    fn an_accounts_own_limit_counts() {
        let capped = ConnectionBudget { per_account_max: 10, ..SERVER };
        let shortfall = capped.shortfall(12).expect("over the account's limit");
        assert!(shortfall.contains("max_user_connections 10"), "{shortfall}");
        assert_eq!(capped.shortfall(10), None);
    }
}
