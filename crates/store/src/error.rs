//! The store's error. A lost compare-and-set is not an error (see [`crate::Cas`]).

use sea_orm::{DbErr, RuntimeErr, sqlx};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database error during {operation}{}: {source}", biz_id.as_ref().map(|id| format!(" (saga {id})")).unwrap_or_default())]
    Db { operation: &'static str, biz_id: Option<String>, source: sea_orm::DbErr },
    #[error(transparent)]
    Model(#[from] midflight_model::Error),
    #[error("saga {biz_id}: stored row is corrupt: {message}")]
    Corrupt { biz_id: String, message: String },
    #[error("cannot connect to {url}: {source}")]
    Connect { url: String, source: sea_orm::DbErr },
    #[error("migration failed: {0}")]
    Migrate(sea_orm::DbErr),
    #[error("{0}")]
    Invalid(String),
    #[error("saga {biz_id}: {message}")]
    Group { biz_id: String, message: String },
    /// An operator's send-back of a MANUAL_REVIEW saga to automation, refused because a later
    /// saga of its order is in the table: driving the earlier one again would run it after
    /// (or beside) that one, out of the order's offset order (I5). Nothing was written.
    #[error(
        "saga {biz_id}: a later saga of its order is in the table, {later} ({later_status}); sending it back to automation would run it out of order, so nothing was written"
    )]
    LaterSagaOfOrder { biz_id: String, later: String, later_status: String },
    /// A caller's own deadline passed with no answer (the statement's outcome is unknown).
    #[error("no answer from the database within {after_ms} ms during {operation}")]
    Unanswered { operation: &'static str, after_ms: u64 },
}

impl Error {
    /// This error as one member of a failed group transaction sees it: the same failure,
    /// naming that member's saga.
    pub(crate) fn for_saga(&self, biz_id: &str) -> Error {
        match self {
            Error::Db { operation, source, .. } => {
                Error::Db { operation, biz_id: Some(biz_id.to_owned()), source: source.clone() }
            }
            other => {
                Error::Group { biz_id: biz_id.to_owned(), message: format!("its group transaction failed: {other}") }
            }
        }
    }

    /// The database gave up on the transaction on its own: a deadlock (MySQL 1213, which rolls
    /// the whole transaction back), a lock wait timeout (1205), a row changed since the
    /// transaction's snapshot (MariaDB 1020, with `innodb_snapshot_isolation`, on by default
    /// from 11.6.2, which rolls the whole transaction back) or SQLite's busy or locked (5, 6
    /// and their extended codes). The caller drops the transaction, which rolls back the rest,
    /// so nothing of it was written and the same transaction can be tried again. An error at
    /// COMMIT that could have left the outcome unknown (a lost connection) is not one of these.
    pub(crate) fn rolled_back(&self) -> bool {
        let Error::Db { source, .. } = self else { return false };
        let Some(error) = statement_error(source) else { return false };
        if let Some(mysql) = error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            return matches!(mysql.number(), 1020 | 1205 | 1213);
        }
        if error.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
            // The primary result code is the low byte of the extended one.
            let code = error.code().and_then(|code| code.parse::<i32>().ok()).unwrap_or(0);
            return matches!(code & 0xff, 5 | 6);
        }
        false
    }

    /// A statement of a transaction the server refused for its values, before the commit: a
    /// value a column cannot hold or a constraint (MySQL's SQLSTATE classes 22 and 23, or a
    /// trigger's 45000; SQLite's TOOBIG, CONSTRAINT and MISMATCH). Nothing of the transaction
    /// was written. Not a timeout, a lock wait or a deadlock: those are the server's state, not
    /// one statement's values.
    pub(crate) fn refused_before_commit(&self) -> bool {
        let Error::Db { operation, source, .. } = self else { return false };
        if operation.starts_with("commit") {
            return false;
        }
        let Some(error) = statement_error(source) else { return false };
        let code = error.code().unwrap_or_default();
        if error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some() {
            return code.starts_with("22") || code.starts_with("23") || code == "45000";
        }
        if error.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
            let code = code.parse::<i32>().unwrap_or(0);
            return matches!(code & 0xff, 18..=20);
        }
        false
    }
}

/// The server's own error behind a statement that failed (not the pool's, not the driver's).
pub(crate) fn statement_error(source: &DbErr) -> Option<&(dyn sqlx::error::DatabaseError + 'static)> {
    let (DbErr::Exec(RuntimeErr::SqlxError(error)) | DbErr::Query(RuntimeErr::SqlxError(error))) = source else {
        return None;
    };
    match error.as_ref() {
        sqlx::Error::Database(error) => Some(error.as_ref()),
        _ => None,
    }
}

/// Adds the operation (and saga) to a database error.
pub(crate) trait Context<T> {
    fn during(self, operation: &'static str, biz_id: Option<&str>) -> Result<T, Error>;
}

impl<T> Context<T> for Result<T, sea_orm::DbErr> {
    fn during(self, operation: &'static str, biz_id: Option<&str>) -> Result<T, Error> {
        self.map_err(|source| Error::Db { operation, biz_id: biz_id.map(str::to_owned), source })
    }
}
