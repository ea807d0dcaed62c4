//! The saga store: the intermediate-state table and its neighbours (transition log, manual
//! tickets, outbox, the business `orders` table) on MySQL 8 / MariaDB or SQLite, through sea-orm.
//!
//! Architecture invariants:
//! - Every operation is one statement or one short transaction. No row lock is held across a
//!   downstream call: callers write the intent, commit, and only then call.
//! - Every write by a saga's owner is a compare-and-set naming the version (and lease epoch) the
//!   caller read: `UPDATE saga SET ... WHERE biz_id = ? AND version = ? AND lease_epoch = ?`.
//!   A takeover ([`Store::claim`]) instead matches a row that is not terminal, whose lease has
//!   expired and whose retry is due, and bumps both. An operator's write (sagactl) names the
//!   version only, and bumps it. Zero rows affected is [`Cas::Conflict`], an ordinary outcome, not
//!   an error: the caller lost ownership (or the claim) and must stop. No `SELECT ... FOR UPDATE`
//!   on a saga's path: the one locking read is the purge's (`FOR UPDATE SKIP LOCKED` on MySQL,
//!   over finished sagas, inside its own short delete transaction).
//! - Leases are compared against the database clock inside the statements; a worker's clock
//!   never decides whether a lease is live.
//! - The transition-log row, and any business, outbox or ticket row, is written in the same
//!   transaction as the saga UPDATE it belongs to.
//! - A new connection the server refuses because it is full is asked for again, until
//!   `database.acquire_timeout_ms` has passed, at every transaction's begin and around the
//!   single statements of the hot paths (`refused.rs` says which); at connect the server's
//!   limit is logged beside the pool (`budget.rs`).

mod budget;
mod checkpoint;
mod clock;
mod dialect;
pub mod entity;
mod error;
mod finding;
mod group;
mod inbox;
mod lease;
mod lookup;
mod migrate;
mod operator;
mod outbox;
mod purge;
mod read;
mod refused;
mod row;
mod scan;
mod stats;
#[cfg(feature = "testing")]
pub mod testing;
mod ticket;
mod transition;

use std::time::Duration;

use midflight_config::DatabaseSection;
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbBackend};
use sea_orm_migration::MigratorTrait;

pub use budget::ConnectionBudget;
pub use checkpoint::{Checkpoint, FinishedPage};
pub use error::Error;
/// The session time zone of every MySQL connection.
const MYSQL_SESSION_TIME_ZONE: &str = "+00:00";

pub use finding::{FindingTicket, LOGISTICS_LEDGER_STEP, TicketOutcome, WMS_LEDGER_STEP};
pub use inbox::{Arrival, Received};
pub use lookup::{LedgerView, ViewPage};
pub use operator::{OPERATOR_ACTOR, TRACKING_NO_LEN_MAX};
pub use outbox::OutboxMessage;
pub use purge::Purged;
pub use read::{OrderRow, RangeCount, Transition};
pub use scan::{ScanCursor, ScanPage, Unreadable};
pub use stats::{StoreCounters, StoreStats};
pub use ticket::saga_json;
pub use ticket::{Ticket, TicketState};

/// Largest number of rows one batch operation writes; larger batches are split by the caller.
pub const BATCH_ROWS_MAX: usize = 500;

/// The outcome of a compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Cas<T> {
    /// The row was as expected and now holds the new values.
    Applied(T),
    /// The row changed underneath (another owner, a newer version, a live lease): nothing was written.
    Conflict,
}

impl<T> Cas<T> {
    pub fn applied(self) -> Option<T> {
        match self {
            Cas::Applied(value) => Some(value),
            Cas::Conflict => None,
        }
    }

    pub fn is_applied(&self) -> bool {
        matches!(self, Cas::Applied(_))
    }
}

/// A handle on the saga database. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Store {
    db: DatabaseConnection,
    backend: DbBackend,
    clock: clock::DbClock,
    stats: std::sync::Arc<stats::StoreCounters>,
    /// Where transitions go when they are grouped ([`DatabaseSection::group_commit_max`] > 1).
    group: Option<std::sync::Arc<group::GroupCommit>>,
    /// How operations wait out a server that refuses new connections (it is full).
    patience: refused::Patience,
    /// The relay whose claim the outbox rows written through this handle get, if any; it goes
    /// with each transition into a group. See [`Store::with_outbox_claim`].
    outbox_claim: Option<std::sync::Arc<outbox::InsertClaim>>,
}

impl Store {
    /// Connects with the pool settings of `section`; does not migrate.
    pub async fn connect(section: &DatabaseSection) -> Result<Store, Error> {
        let mut options = ConnectOptions::new(section.url.clone());
        options
            .max_connections(section.max_connections)
            .min_connections(1)
            .acquire_timeout(Duration::from_millis(section.acquire_timeout_ms))
            .connect_timeout(Duration::from_millis(section.connect_timeout_ms))
            .idle_timeout(Duration::from_millis(section.idle_timeout_ms))
            // Testing every connection before use halves the commit rate on this kind of box;
            // test only those idle long enough to have been cut off.
            .test_before_acquire(false)
            .test_before_acquire_if_idle_for(Duration::from_millis(midflight_config::PING_AFTER_IDLE_MS))
            .sqlx_logging(false)
            // The database clock (`dialect::now_ms`) reads the session's time as UTC: a zone
            // named in the URL (`?timezone=...`) is overridden, since in one with daylight
            // saving the hour that repeats would move leases and stamps by an hour.
            .map_sqlx_mysql_opts(|options| {
                options
                    .statement_cache_capacity(dialect::STATEMENT_CACHE)
                    .timezone(Some(MYSQL_SESSION_TIME_ZONE.to_owned()))
            })
            .map_sqlx_mysql_pool_opts(session_settings(section))
            .map_sqlx_sqlite_opts(|options| {
                options
                    .journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10))
                    .statement_cache_capacity(dialect::STATEMENT_CACHE)
                    .foreign_keys(false)
            });
        let db = Database::connect(options)
            .await
            .map_err(|source| Error::Connect { url: midflight_config::redact_url(&section.url), source })?;
        let mut store = Store::with_patience(db, Duration::from_millis(section.acquire_timeout_ms)).await?;
        store.log_connection_budget(section.max_connections).await;
        if section.group_commit_max > 1 {
            // SQLite has one writer at a time: concurrent groups would only wait on each other.
            // Everything else (inbox, leases, relay, reads) keeps at least one connection.
            let concurrency = match store.backend {
                DbBackend::Sqlite => 1,
                _ => section.group_commit_concurrency.min(section.max_connections.saturating_sub(1) as usize).max(1),
            };
            let group = group::GroupCommit::start(
                store.clone(),
                section.group_commit_max,
                concurrency,
                Duration::from_millis(section.group_commit_linger_ms),
            );
            store.group = Some(std::sync::Arc::new(group));
        }
        Ok(store)
    }

    /// Wraps an existing connection (tests, tools).
    pub async fn from_connection(db: DatabaseConnection) -> Result<Store, Error> {
        Store::with_patience(db, Duration::from_millis(DatabaseSection::default().acquire_timeout_ms)).await
    }

    /// Wraps `db`, waiting out refused connections for `wait` (`database.acquire_timeout_ms`).
    async fn with_patience(db: DatabaseConnection, wait: Duration) -> Result<Store, Error> {
        let backend = db.get_database_backend();
        if !matches!(backend, DbBackend::MySql | DbBackend::Sqlite) {
            return Err(Error::Invalid(format!("unsupported database backend {backend:?}: use MySQL or SQLite")));
        }
        let (patience, stats) = (refused::Patience::new(wait), std::sync::Arc::<stats::StoreCounters>::default());
        let operation = "read the database clock";
        let clock = patience.run(&stats, operation, || clock::DbClock::measure(&db, backend)).await?;
        Ok(Store { db, backend, clock, stats, group: None, patience, outbox_claim: None })
    }

    /// Applies any migration file the database does not have yet.
    pub async fn migrate(&self) -> Result<(), Error> {
        migrate::Migrator::up(&self.db, None).await.map_err(Error::Migrate)
    }

    /// The database clock (ms since the Unix epoch), estimated from a reading at most a few
    /// seconds old. Used for deadlines, backoff and timestamps; leases are always compared
    /// inside SQL against the real database clock.
    pub async fn now_ms(&self) -> Result<i64, Error> {
        self.patiently("read the database clock", || self.clock.now_ms(&self.db)).await
    }

    /// What this store (and its clones) wrote since it connected.
    pub fn stats(&self) -> StoreStats {
        self.stats.read()
    }

    /// The live counters behind [`Store::stats`], shared by every clone of this store: what a
    /// metrics exporter holds (weakly, so a dropped store stops being counted) and reads.
    pub fn counters(&self) -> std::sync::Arc<StoreCounters> {
        self.stats.clone()
    }

    pub fn backend(&self) -> DbBackend {
        self.backend
    }

    /// The underlying connection, for tools that read (the checker, the CLI).
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Closes the pool.
    pub async fn close(self) -> Result<(), Error> {
        self.db.close().await.map_err(|source| Error::Db { operation: "close", biz_id: None, source })
    }
}

/// What each new MySQL connection runs first: how long the server lets the session sit idle
/// (`database.session_idle_timeout_ms`) and how long it lets one statement run
/// (`database.statement_timeout_ms`); see [`session_sql`]. Nothing when both are 0.
fn session_settings(
    section: &DatabaseSection,
) -> impl Fn(MySqlPoolOptions) -> MySqlPoolOptions + Send + Sync + 'static {
    let (idle_ms, statement_ms) = (section.session_idle_timeout_ms, section.statement_timeout_ms);
    move |pool| {
        if idle_ms == 0 && statement_ms == 0 {
            return pool;
        }
        pool.after_connect(move |connection, _| {
            Box::pin(async move {
                use sea_orm::sqlx::Executor;
                let version: String =
                    sea_orm::sqlx::query_scalar("SELECT VERSION()").fetch_one(&mut *connection).await?;
                let Some(sql) = session_sql(version.contains("MariaDB"), idle_ms, statement_ms) else { return Ok(()) };
                // Our own text with numbers in it, not input.
                connection.execute(sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe(sql))).await.map(|_| ())
            })
        })
    }
}

/// The `SET SESSION` for a MariaDB (`mariadb`) or MySQL server, or `None` when both settings
/// are 0 (the server's own).
///
/// Idle: MariaDB ends a session idle `idle_ms` (rounded up to whole seconds) inside a
/// transaction (`idle_transaction_timeout`), and no other; MySQL, which has no such setting,
/// ends any session idle that long (`wait_timeout`), pooled idle connections included (they
/// are pinged before use, and the server logs an aborted connection).
///
/// Statements: MariaDB stops any statement that runs `statement_ms` (`max_statement_time`, in
/// seconds with a fraction); MySQL only SELECTs (`max_execution_time`, in milliseconds).
/// Migrations lift it for their own statements (`migrate`).
fn session_sql(mariadb: bool, idle_ms: u64, statement_ms: u64) -> Option<String> {
    let mut assignments = Vec::with_capacity(2);
    if idle_ms > 0 {
        let variable = if mariadb { "idle_transaction_timeout" } else { "wait_timeout" };
        assignments.push(format!("{variable} = {}", idle_ms.div_ceil(1_000)));
    }
    if statement_ms > 0 {
        assignments.push(if mariadb {
            format!("max_statement_time = {}.{:03}", statement_ms / 1_000, statement_ms % 1_000)
        } else {
            format!("max_execution_time = {statement_ms}")
        });
    }
    (!assignments.is_empty()).then(|| format!("SET SESSION {}", assignments.join(", ")))
}

type MySqlPoolOptions = sea_orm::sqlx::pool::PoolOptions<sea_orm::sqlx::MySql>;

/// The SQL of the migrations, in order, for tools and tests.
pub fn migration_files() -> &'static [(&'static str, &'static str)] {
    &migrate::FILES
}

/// Splits a migration file into statements (exposed for the tidy test).
pub fn migration_statements(sql: &str) -> Vec<String> {
    migrate::statements(sql)
}

#[cfg(test)]
mod tests {
    use super::session_sql;

    #[test]
    fn session_settings_name_each_servers_variables() {
        assert_eq!(session_sql(true, 0, 0), None, "both 0: the server's own");
        assert_eq!(session_sql(false, 0, 0), None);
        assert_eq!(
            session_sql(true, 120_000, 60_000).as_deref(),
            Some("SET SESSION idle_transaction_timeout = 120, max_statement_time = 60.000")
        );
        assert_eq!(
            session_sql(false, 120_000, 60_000).as_deref(),
            Some("SET SESSION wait_timeout = 120, max_execution_time = 60000")
        );
        assert_eq!(
            session_sql(true, 60_001, 0).as_deref(),
            Some("SET SESSION idle_transaction_timeout = 61"),
            "rounded up to whole seconds"
        );
        assert_eq!(session_sql(true, 0, 1_250).as_deref(), Some("SET SESSION max_statement_time = 1.250"));
        assert_eq!(session_sql(false, 0, 1_250).as_deref(), Some("SET SESSION max_execution_time = 1250"));
    }
}
