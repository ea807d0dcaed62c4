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
//! connect). After a refusal an operation queues for the store's one turn at asking again
//! ([`Patience::run`]): while the server keeps refusing, the turn's tries are 10, 20, 40 ... ms
//! apart (at most [`PAUSE_MAX`]), so a full server sees each store's first tries and one retry
//! at a time, not one from every waiting operation (without the queue, one run had 28,680
//! refusals and the database at three times its CPU per message: BENCHMARKS.md). An operation
//! gives up with the server's error once `database.acquire_timeout_ms` has passed since its
//! first try; meanwhile a connection of the pool's own may come free and serve it. The
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

/// The first pause after a retry that was refused; each further pause doubles, up to [`PAUSE_MAX`].
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
    /// The store's one turn at asking again, and the pause before the next turn's try: after
    /// a refusal an operation queues here, so a full server sees this store's first tries and
    /// one retry at a time, not one from every waiting operation.
    pub(crate) turn: Arc<tokio::sync::Mutex<Turn>>,
}

/// The state of the store's turn at asking again.
#[derive(Debug)]
pub(crate) struct Turn {
    /// How long the next try waits first; zero after a try that was served.
    pause: Duration,
}

impl Default for Turn {
    fn default() -> Turn {
        Turn { pause: Duration::ZERO }
    }
}

impl Patience {
    /// Runs `attempt`, and runs it again while the server refuses it a connection, until
    /// [`Patience::wait`] has passed since the first try (see the module's doc; an attempt's
    /// own wait for a pooled connection comes on top). `attempt` must be one statement, reads
    /// only, or the start of a transaction: a refusal comes before any of it has run.
    ///
    /// The first try is the operation's own. Each retry waits for the store's turn (first
    /// come, first served), pauses while holding it if the turn's last try was refused too
    /// (10 ms, doubling to [`PAUSE_MAX`]), and tries once. A try that is served resets the
    /// pause, so while connections come free the queue moves at the speed of the operations.
    pub(crate) async fn run<T, E, F, Fut>(&self, operation: &'static str, mut attempt: F) -> Result<T, E>
    where
        E: Refusal + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // tokio's clock, which the pauses and the wait for the turn run on.
        let started = tokio::time::Instant::now();
        let mut error = match attempt().await {
            Err(error) if error.refused() => error,
            result => return result,
        };
        loop {
            let total = self.stats.refused();
            let _warned = self.notice.refused(total, operation, &error);
            let left = self.wait.saturating_sub(started.elapsed());
            let turn = match tokio::time::timeout(left, self.turn.lock()).await {
                Ok(turn) if !left.is_zero() => Some(turn),
                _ => None,
            };
            let Some(mut turn) = turn else {
                // The caller logs the operation's failure; the notice has told of the refusals.
                tracing::debug!(operation, %error, "the database kept refusing new connections; giving up on this operation");
                return Err(error);
            };
            let left = self.wait.saturating_sub(started.elapsed());
            tokio::time::sleep(turn.pause.min(left)).await;
            tracing::debug!(operation, %error, "the database refused a new connection; asking again");
            match attempt().await {
                Err(refused) if refused.refused() => {
                    turn.pause = (turn.pause * 2).clamp(PAUSE_FIRST, PAUSE_MAX);
                    error = refused;
                }
                result => {
                    turn.pause = Duration::ZERO;
                    return result;
                }
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::{Patience, Refusal, RefusalNotice};

    /// A refusal, as a test's attempt reports it.
    #[derive(Debug)]
    struct Full;

    impl Refusal for Full {
        fn refused(&self) -> bool {
            true
        }
    }

    impl std::fmt::Display for Full {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("1040: Too many connections")
        }
    }

    /// A server that refuses while `full` is set, and what 20 operations asked of it.
    #[derive(Default)]
    struct Server {
        full: AtomicBool,
        tries: AtomicUsize,
        retrying: AtomicUsize,
        retrying_max: AtomicUsize,
    }

    /// Runs 20 operations at once against `server`; returns how many were served.
    async fn twenty(patience: &Patience, server: &Arc<Server>) -> usize {
        let operations = (0..20).map(|_| {
            let (patience, server) = (patience.clone(), server.clone());
            tokio::spawn(async move {
                let mut own = 0;
                patience
                    .run("test", || {
                        own += 1;
                        let (server, retry) = (server.clone(), own > 1);
                        async move {
                            server.tries.fetch_add(1, Ordering::SeqCst);
                            let now = if retry { server.retrying.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
                            server.retrying_max.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            if retry {
                                server.retrying.fetch_sub(1, Ordering::SeqCst);
                            }
                            if server.full.load(Ordering::SeqCst) { Err(Full) } else { Ok(()) }
                        }
                    })
                    .await
            })
        });
        let results = futures::future::join_all(operations).await;
        results.into_iter().filter(|result| matches!(result, Ok(Ok(())))).count()
    }

    fn patience(wait_ms: u64) -> Patience {
        Patience {
            wait: Duration::from_millis(wait_ms),
            stats: Arc::default(),
            notice: Arc::default(),
            turn: Arc::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn operations_ask_again_one_at_a_time_and_are_served_when_the_server_frees() {
        let server = Arc::new(Server::default());
        server.full.store(true, Ordering::SeqCst);
        let freed = tokio::spawn({
            let server = server.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                server.full.store(false, Ordering::SeqCst);
            }
        });
        let patience = patience(5_000);
        assert_eq!(twenty(&patience, &server).await, 20, "every operation is served once the server frees");
        freed.await.expect("join");
        assert_eq!(server.retrying_max.load(Ordering::SeqCst), 1, "one retry at a time");
        let tries = server.tries.load(Ordering::SeqCst);
        // 20 first tries; while full, about one retry per pause (10, 20 ... 250 ms: 6 in 500 ms);
        // then one try each for the 20 queued.
        assert!(tries <= 20 + 8 + 20, "{tries} tries");
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_stays_full_is_asked_a_bounded_number_of_times() {
        let server = Arc::new(Server::default());
        server.full.store(true, Ordering::SeqCst);
        let patience = patience(1_000);
        assert_eq!(twenty(&patience, &server).await, 0, "every operation gives up with the refusal");
        let tries = server.tries.load(Ordering::SeqCst);
        // 20 first tries and one retry per pause for the store in 1 s (0, 10, 20 ... 250 ms: 9).
        assert!(tries <= 20 + 10, "{tries} tries");
        assert_eq!(patience.stats.read().refused, tries as u64, "every refusal is counted");
    }

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
