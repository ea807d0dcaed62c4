//! A server that is full refuses new connections: MySQL error 1040 ("Too many connections"),
//! 1203 when the server's `max_user_connections` is reached for the account, or 1226 when the
//! account's own `MAX_USER_CONNECTIONS` is. The pool passes that on at once, as the operation's
//! error, although nothing of the operation has run: the connection it would have run on was
//! never opened. Left so, every drive that needs a new connection while the server is full
//! fails, and its saga waits for its lease to expire.
//!
//! The operations of the hot paths wait instead, as they wait for a pooled connection that is
//! busy: every transaction's begin (an operator's resolve included), and the single statements
//! of the consumer's drives, inbox and outbox relay, of the recovery worker's claims, scans and
//! lookups by request id, the clock reading and the connection-limit reading at connect. After
//! a refusal an operation queues for the store's one turn at asking again ([`Patience::run`]):
//! while the server keeps refusing, the turn's tries are 10, 20, 40 ... ms apart (at most
//! [`PAUSE_MAX`]), each holding the turn until it is answered or for at most
//! [`TURN_HELD_MAX`], so a full server sees each store's first tries and then one retry at a
//! time (more only when refusals take longer than that to come back, and then at most one
//! started per [`TURN_HELD_MAX`] and pause), not
//! one from every waiting operation (without the queue, one run had 28,680 refusals and the
//! database at three times its CPU per message: BENCHMARKS.md). Once a retry is served, the
//! queue's operations try side by side again. An operation gives up with the server's error
//! once `database.acquire_timeout_ms` has passed since its first try. sagactl's listings and
//! reconciliation's ledger pages and tickets are not wrapped: they fail at once, and their
//! callers try again later. Only a refusal is waited out; every other error is the
//! operation's, as before.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sea_orm::{DatabaseTransaction, DbErr, RuntimeErr, TransactionTrait, sqlx};

use crate::Store;
use crate::error::{Context, Error};
use crate::stats::StoreCounters;

/// The pause after a retry that was refused; each further refused retry doubles it, up to [`PAUSE_MAX`].
const PAUSE_FIRST: Duration = Duration::from_millis(10);
/// The longest pause between two tries.
const PAUSE_MAX: Duration = Duration::from_millis(250);
/// The longest a retry holds the store's turn while it runs: a refusal comes back within a
/// connection's handshake, so a retry still running by then has most likely been served and is
/// running its statement (which may wait on a lock), and the queue need not wait for it. It may
/// also still be waiting for a pooled connection or a slow handshake, and be refused late; the
/// next retry has then started beside it.
const TURN_HELD_MAX: Duration = Duration::from_millis(100);

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

/// How a store waits out refusals: for how long, and the queue its operations share (a clone
/// shares it too). The refusals are counted in the store's [`StoreCounters`].
#[derive(Debug, Clone)]
pub(crate) struct Patience {
    /// `database.acquire_timeout_ms`.
    wait: Duration,
    queue: Arc<Queue>,
}

/// What the operations of one store that wait out refusals share.
#[derive(Debug, Default)]
struct Queue {
    notice: RefusalNotice,
    /// The store's one turn at asking again while the server refuses: after a refusal an
    /// operation queues here, so a full server sees this store's first tries and one retry at
    /// a time, not one from every waiting operation.
    turn: tokio::sync::Mutex<()>,
    /// How long the turn's next try waits first (ms): at least 10 after a refusal, zero once
    /// a retry was not refused.
    pause_ms: AtomicU64,
}

impl Patience {
    /// Waits out refusals for `wait` (`database.acquire_timeout_ms`).
    pub(crate) fn new(wait: Duration) -> Patience {
        Patience { wait, queue: Arc::default() }
    }

    /// Runs `attempt`, and runs it again while the server refuses it a connection (each
    /// refusal counted in `stats`), until
    /// [`Patience::wait`] has passed since the first try (see the module's doc). An attempt
    /// may run past that by its own length: its wait for a pooled connection, and its
    /// statement's. `attempt` must be reads only, one statement, or the start of a
    /// transaction, so that running it again after a refusal repeats no write.
    ///
    /// The first try is the operation's own. Each retry waits for the store's turn (first
    /// come, first served). After a refusal the turn's holder pauses (10 ms, doubling with each
    /// refused retry to [`PAUSE_MAX`]) and tries holding it until the try is answered, or for
    /// at most [`TURN_HELD_MAX`] (a served retry's statement, which may wait on a lock, does
    /// not hold up the queue), so the queue asks one at a time, or, while refusals take longer
    /// than that to come back, starts one retry per turn. Once a retry is not refused,
    /// the pause is zero and each queued operation passes the turn on at once and tries
    /// alongside the others, until the next refusal.
    pub(crate) async fn run<T, E, F, Fut>(
        &self,
        stats: &StoreCounters,
        operation: &'static str,
        mut attempt: F,
    ) -> Result<T, E>
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
        // The server is refusing: the queue asks one at a time until a retry is served.
        let first = u64::try_from(PAUSE_FIRST.as_millis()).unwrap_or(u64::MAX);
        let queue = &*self.queue;
        queue.pause_ms.fetch_max(first, Ordering::Relaxed);
        loop {
            let _warned = queue.notice.refused(stats.refused(), operation, &error);
            let left = self.wait.saturating_sub(started.elapsed());
            let turn = match tokio::time::timeout(left, queue.turn.lock()).await {
                Ok(turn) if !left.is_zero() => turn,
                _ => {
                    // The caller logs the operation's failure; the notice has told of the refusals.
                    tracing::debug!(operation, %error, "the database kept refusing new connections; giving up on this operation");
                    return Err(error);
                }
            };
            let seen_ms = queue.pause_ms.load(Ordering::Relaxed);
            let pause = Duration::from_millis(seen_ms);
            let held = if pause.is_zero() {
                drop(turn);
                None
            } else {
                tokio::time::sleep(pause.min(self.wait.saturating_sub(started.elapsed()))).await;
                Some(turn)
            };
            tracing::debug!(operation, %error, "the database refused a new connection; asking again");
            let mut retry = std::pin::pin!(attempt());
            // The turn is held until the retry is answered (and the pause set from the answer,
            // below), or for at most TURN_HELD_MAX.
            let (answer, _held, late) = match held {
                Some(turn) => match tokio::time::timeout(TURN_HELD_MAX, &mut retry).await {
                    Ok(answer) => (answer, Some(turn), false),
                    Err(_) => {
                        drop(turn);
                        (retry.await, None, true)
                    }
                },
                None => (retry.await, None, false),
            };
            match answer {
                Err(refused) if refused.refused() => {
                    let next = |ms: u64| {
                        let doubled = Duration::from_millis(ms) * 2;
                        Some(u64::try_from(doubled.clamp(PAUSE_FIRST, PAUSE_MAX).as_millis()).unwrap_or(u64::MAX))
                    };
                    let _ = queue.pause_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, next);
                    error = refused;
                }
                result => {
                    if late {
                        // Later retries may have been refused meanwhile: an answer from before
                        // theirs does not end their pauses.
                        let _ = queue.pause_ms.compare_exchange(seen_ms, 0, Ordering::Relaxed, Ordering::Relaxed);
                    } else {
                        queue.pause_ms.store(0, Ordering::Relaxed);
                    }
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
        self.patience.run(&self.stats, operation, attempt).await
    }

    /// Begins a transaction, waiting out a server that refuses new connections.
    pub(crate) async fn begin(
        &self,
        operation: &'static str,
        biz_id: Option<&str>,
    ) -> Result<DatabaseTransaction, Error> {
        self.begin_isolated(operation, biz_id, None).await
    }

    /// [`Store::begin`] at `isolation` (`None`: the server's default).
    pub(crate) async fn begin_isolated(
        &self,
        operation: &'static str,
        biz_id: Option<&str>,
        isolation: Option<sea_orm::IsolationLevel>,
    ) -> Result<DatabaseTransaction, Error> {
        self.patiently(operation, || self.db.begin_with_config(isolation, None)).await.during(operation, biz_id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::{Patience, Refusal, RefusalNotice};
    use crate::stats::StoreCounters;

    /// What a test's attempt fails with: a refusal, or any other error.
    #[derive(Debug, PartialEq)]
    enum Failure {
        Full,
        Other,
    }

    impl Refusal for Failure {
        fn refused(&self) -> bool {
            *self == Failure::Full
        }
    }

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(if self.refused() { "1040: Too many connections" } else { "1146: Table doesn't exist" })
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

    /// Runs 20 operations at once against `server`, each try answered after 1 ms; returns how
    /// many were served.
    async fn twenty(patience: &Patience, stats: &Arc<StoreCounters>, server: &Arc<Server>) -> usize {
        twenty_answered_after(Duration::from_millis(1), patience, stats, server).await
    }

    /// [`twenty`] with tries answered after `latency`.
    async fn twenty_answered_after(
        latency: Duration,
        patience: &Patience,
        stats: &Arc<StoreCounters>,
        server: &Arc<Server>,
    ) -> usize {
        let operations = (0..20).map(|_| {
            let (patience, stats, server) = (patience.clone(), stats.clone(), server.clone());
            tokio::spawn(async move {
                let mut own = 0;
                patience
                    .run(&stats, "test", || {
                        own += 1;
                        // Retries are counted while the server is full: that is when they must
                        // come one at a time.
                        let (server, retry) = (server.clone(), own > 1);
                        async move {
                            server.tries.fetch_add(1, Ordering::SeqCst);
                            let counted = retry && server.full.load(Ordering::SeqCst);
                            let now = if counted { server.retrying.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
                            server.retrying_max.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(latency).await;
                            if counted {
                                server.retrying.fetch_sub(1, Ordering::SeqCst);
                            }
                            if server.full.load(Ordering::SeqCst) { Err(Failure::Full) } else { Ok(()) }
                        }
                    })
                    .await
            })
        });
        let results = futures::future::join_all(operations).await;
        results.into_iter().filter(|result| matches!(result, Ok(Ok(())))).count()
    }

    /// A server that is full now and frees after `full` (when the returned task ends).
    fn full_for(full: Duration) -> (Arc<Server>, tokio::task::JoinHandle<()>) {
        let server = Arc::new(Server::default());
        server.full.store(true, Ordering::SeqCst);
        let freed = tokio::spawn({
            let server = server.clone();
            async move {
                tokio::time::sleep(full).await;
                server.full.store(false, Ordering::SeqCst);
            }
        });
        (server, freed)
    }

    fn patience(wait_ms: u64) -> Patience {
        Patience::new(Duration::from_millis(wait_ms))
    }

    #[tokio::test(start_paused = true)]
    async fn operations_ask_again_one_at_a_time_and_are_served_when_the_server_frees() {
        let (server, freed) = full_for(Duration::from_millis(500));
        let patience = patience(5_000);
        assert_eq!(
            twenty(&patience, &Arc::default(), &server).await,
            20,
            "every operation is served once the server frees"
        );
        freed.await.expect("join");
        assert_eq!(server.retrying_max.load(Ordering::SeqCst), 1, "one retry at a time while the server is full");
        let tries = server.tries.load(Ordering::SeqCst);
        // 20 first tries; while full, one retry per pause (10, 20 ... 250 ms: 6 in 500 ms);
        // then one try each for the 20 queued, side by side once the first was served.
        assert!(tries <= 20 + 8 + 20, "{tries} tries");
    }

    #[tokio::test(start_paused = true)]
    async fn slow_refusals_still_come_one_at_a_time_or_two_past_the_turns_hold() {
        for (latency_ms, at_once) in [(50, 1), (150, 2)] {
            let (server, freed) = full_for(Duration::from_millis(1_000));
            let latency = Duration::from_millis(latency_ms);
            let served = twenty_answered_after(latency, &patience(5_000), &Arc::default(), &server).await;
            assert_eq!(served, 20, "every operation is served once the server frees ({latency_ms} ms)");
            freed.await.expect("join");
            let most = server.retrying_max.load(Ordering::SeqCst);
            assert_eq!(most, at_once, "retries at once while full, refusals taking {latency_ms} ms");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_served_retry_that_runs_long_does_not_hold_up_the_queue() {
        // The server is full for its first 100 ms. The first try it serves then runs for 3 s
        // (a statement waiting on a lock); the operations queued behind it have 1 s in all.
        let (server, freed) = full_for(Duration::from_millis(100));
        let (patience, stats, slow) =
            (patience(1_000), Arc::<StoreCounters>::default(), Arc::new(AtomicBool::new(false)));
        let operations = (0..20).map(|_| {
            let (patience, stats, server, slow) = (patience.clone(), stats.clone(), server.clone(), slow.clone());
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                let result = patience
                    .run(&stats, "test", || {
                        let (server, slow) = (server.clone(), slow.clone());
                        async move {
                            server.tries.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            if server.full.load(Ordering::SeqCst) {
                                return Err(Failure::Full);
                            }
                            if !slow.swap(true, Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_secs(3)).await;
                            }
                            Ok(())
                        }
                    })
                    .await;
                (result, started.elapsed())
            })
        });
        let results = futures::future::join_all(operations).await;
        freed.await.expect("join");
        let served: Vec<Duration> = results
            .into_iter()
            .filter_map(|joined| joined.ok())
            .filter_map(|(r, took)| r.ok().map(|()| took))
            .collect();
        assert_eq!(served.len(), 20, "every operation is served, the slow one's queue included");
        let quick = served.iter().filter(|took| **took < Duration::from_secs(1)).count();
        assert_eq!(quick, 19, "all but the slow one within their wait: {served:?}");
        assert!(stats.read().refused >= 20, "every first try was refused");
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_stays_full_is_asked_a_bounded_number_of_times() {
        let server = Arc::new(Server::default());
        server.full.store(true, Ordering::SeqCst);
        let (patience, stats) = (patience(1_000), Arc::<StoreCounters>::default());
        let started = tokio::time::Instant::now();
        assert_eq!(twenty(&patience, &stats, &server).await, 0, "every operation gives up with the refusal");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1_000), "they asked for the whole wait: {took:?}");
        // At most one pause and one try past the wait.
        assert!(took <= Duration::from_millis(1_000) + super::PAUSE_MAX + Duration::from_millis(2), "{took:?}");
        let tries = server.tries.load(Ordering::SeqCst);
        // 20 first tries and one retry per pause for the store in 1 s (10, 20 ... 250 ms: 8).
        assert!(tries <= 20 + 10, "{tries} tries");
        assert_eq!(stats.read().refused, tries as u64, "every refusal is counted");
    }

    #[tokio::test(start_paused = true)]
    async fn any_other_error_is_the_operations_at_once() {
        let (patience, stats) = (patience(5_000), StoreCounters::default());
        let mut tries = 0;
        let result: Result<(), Failure> = patience
            .run(&stats, "test", || {
                tries += 1;
                async { Err(Failure::Other) }
            })
            .await;
        assert_eq!((result, tries), (Err(Failure::Other), 1));
        assert_eq!(stats.read().refused, 0);
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
