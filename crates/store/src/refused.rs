//! A server that is full refuses new connections: MySQL error 1040 ("Too many connections"),
//! 1203 when the server's `max_user_connections` is reached for the account, or 1226 when the
//! account's own `MAX_USER_CONNECTIONS` is. The pool passes that on at once, as the operation's
//! error, although nothing of the operation has run: the connection it would have run on was
//! never opened. Left so, every drive that needs a new connection while the server is full
//! fails, and its saga waits for its lease to expire.
//!
//! The operations of the hot paths wait instead, as they wait for a pooled connection that is
//! busy: every transaction's begin, and the single statements of the consumer's drives, inbox
//! and outbox relay and of the recovery worker's claims and scans (and the clock reading at
//! connect). They ask again after 10, 20, 40 ... ms (at most [`PAUSE_MAX`] apart) until
//! `database.acquire_timeout_ms` has passed since the first try, and then fail with the
//! server's error; meanwhile a connection of the pool's own may come free and serve them. The
//! operator's and reconciliation's reads and ticket writes are not wrapped: they fail at once,
//! and their callers try again later. Only a refusal is waited out; every other error is the
//! operation's, as before.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sea_orm::{DatabaseTransaction, DbErr, RuntimeErr, TransactionTrait, sqlx};

use crate::Store;
use crate::error::{Context, Error};
use crate::stats::Stats;

/// The first pause after a refusal; each further pause doubles, up to [`PAUSE_MAX`].
const PAUSE_FIRST: Duration = Duration::from_millis(10);
/// The longest pause between two tries.
const PAUSE_MAX: Duration = Duration::from_millis(250);

/// Refusals are logged as a warning at most this often per store (and as debug each time).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// MySQL's `ER_CON_COUNT_ERROR`: the server has `max_connections` connections open.
const TOO_MANY_CONNECTIONS: u16 = 1040;
/// MySQL's `ER_TOO_MANY_USER_CONNECTIONS`: the account has the server's `max_user_connections` open.
const TOO_MANY_USER_CONNECTIONS: u16 = 1203;
/// MySQL's `ER_USER_LIMIT_REACHED`: the account has reached one of its own resource limits, its
/// `MAX_USER_CONNECTIONS` among them. The hourly limits give it too; waiting those out fails
/// the same way, only later.
const USER_LIMIT_REACHED: u16 = 1226;

/// An error that may be the server refusing a new connection.
pub(crate) trait Refusal {
    /// The server refused to open a connection because it (or the account) has as many as it
    /// allows: nothing was run, and the same operation can be tried again.
    fn refused(&self) -> bool;
}

impl Refusal for DbErr {
    fn refused(&self) -> bool {
        // The pool's errors in opening a connection; a statement's own errors are `Exec` or `Query`.
        let DbErr::Conn(RuntimeErr::SqlxError(error)) = self else { return false };
        let sqlx::Error::Database(error) = error.as_ref() else { return false };
        error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|mysql| {
            matches!(mysql.number(), TOO_MANY_CONNECTIONS | TOO_MANY_USER_CONNECTIONS | USER_LIMIT_REACHED)
        })
    }
}

impl Refusal for Error {
    fn refused(&self) -> bool {
        match self {
            Error::Db { source, .. } => source.refused(),
            _ => false,
        }
    }
}

/// When refusals were last logged as a warning, and the store's count of them then.
#[derive(Debug, Default)]
pub(crate) struct RefusalNotice {
    last: Mutex<Option<(Instant, u64)>>,
}

impl RefusalNotice {
    /// Warns of a refusal, `total` the store's count of them so far, unless a warning was
    /// logged less than [`WARN_EVERY`] ago; returns whether it warned.
    fn refused(&self, total: u64, operation: &'static str, error: &dyn std::fmt::Display) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.is_some_and(|(at, _)| at.elapsed() < WARN_EVERY) {
            return false;
        }
        let since = total.saturating_sub(last.map_or(0, |(_, then)| then));
        *last = Some((Instant::now(), total));
        tracing::warn!(operation, refused = since, %error,
            "the database refused new connections (it is full); operations wait and ask again for up to \
             database.acquire_timeout_ms (refused is the count since the last such warning)");
        true
    }
}

/// What waiting out refusals needs: how long, and where each refusal is counted and told.
#[derive(Debug, Clone)]
pub(crate) struct Patience {
    /// `database.acquire_timeout_ms`.
    pub(crate) wait: Duration,
    pub(crate) stats: Arc<Stats>,
    pub(crate) notice: Arc<RefusalNotice>,
}

impl Patience {
    /// Runs `attempt`, and runs it again while the server refuses it a connection, until
    /// [`Patience::wait`] has passed since the first try (see the module's doc; an attempt's
    /// own wait for a pooled connection comes on top). `attempt` must be one statement, reads
    /// only, or the start of a transaction: a refusal comes before any of it has run.
    pub(crate) async fn run<T, E, F, Fut>(&self, operation: &'static str, mut attempt: F) -> Result<T, E>
    where
        E: Refusal + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let mut pause = PAUSE_FIRST;
        loop {
            match attempt().await {
                Err(error) if error.refused() => {
                    let waited = started.elapsed();
                    if waited >= self.wait {
                        // The caller logs the operation's failure; the notice has told of the refusals.
                        tracing::debug!(operation, waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                            %error, "the database kept refusing new connections; giving up on this operation");
                        return Err(error);
                    }
                    let total = self.stats.refused();
                    let _warned = self.notice.refused(total, operation, &error);
                    tracing::debug!(operation, %error, "the database refused a new connection; asking again");
                    tokio::time::sleep(pause.min(self.wait - waited)).await;
                    pause = (pause * 2).min(PAUSE_MAX);
                }
                result => return result,
            }
        }
    }
}

impl Store {
    /// [`Patience::run`] with this store's patience.
    pub(crate) async fn patiently<T, E, F, Fut>(&self, operation: &'static str, attempt: F) -> Result<T, E>
    where
        E: Refusal + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.patience.run(operation, attempt).await
    }

    /// Begins a transaction, waiting out a server that refuses new connections.
    pub(crate) async fn begin(
        &self,
        operation: &'static str,
        biz_id: Option<&str>,
    ) -> Result<DatabaseTransaction, Error> {
        self.patiently(operation, || self.db.begin()).await.during(operation, biz_id)
    }
}

#[cfg(test)]
mod tests {
    use super::RefusalNotice;

    #[test]
    fn refusals_are_warned_of_once_in_a_while() {
        let notice = RefusalNotice::default();
        assert!(notice.refused(1, "read saga", &"1040"), "the first refusal is warned of");
        assert!(!notice.refused(2, "read saga", &"1040"), "the next one, right after, is not");
        assert!(!notice.refused(3, "begin transition", &"1040"), "nor is another operation's");
        *notice.last.lock().expect("lock") =
            Some((std::time::Instant::now().checked_sub(super::WARN_EVERY).expect("up 10 s"), 3));
        assert!(notice.refused(4, "read saga", &"1040"), "once the interval has passed, it is again");
    }
}
