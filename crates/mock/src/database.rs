//! The ledger database of a mock: connection settings and table creation.
//!
//! SQLite runs in WAL mode with `synchronous=NORMAL`: every commit reaches the WAL file before it
//! returns, so a killed or restarted mock process loses nothing (only a power cut could lose the
//! last commits, which no scenario here simulates). MySQL/MariaDB is reached by URL. Tables are
//! created from the entities when missing, so a fresh database needs no migration step.

use std::time::Duration;

use midflight_config::DatabaseSection;
use sea_orm::sea_query::IndexCreateStatement;
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, EntityTrait, Schema};

use crate::Error;

/// How long SQLite waits on a lock held by another connection before failing a statement.
/// Writes of one mock are serialized in-process, so this only covers readers meeting a checkpoint.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the ledger database named by `section.url`.
pub async fn connect(section: &DatabaseSection) -> Result<DatabaseConnection, Error> {
    let mut options = ConnectOptions::new(section.url.clone());
    options
        .max_connections(section.max_connections)
        .acquire_timeout(Duration::from_millis(section.acquire_timeout_ms))
        .connect_timeout(Duration::from_millis(section.connect_timeout_ms))
        // Pinging every connection before use halves throughput on this box (see ENVIRONMENT.md);
        // a dead connection surfaces as an error on the statement instead.
        .test_before_acquire(false)
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|sqlite| {
            sqlite
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
        });
    let db = Database::connect(options).await.map_err(|source| Error::Database {
        context: format!("cannot connect to the {} ledger database", scheme(&section.url)),
        source,
    })?;
    tracing::info!(backend = scheme(&section.url), "ledger database connected");
    Ok(db)
}

/// Creates the table of `entity`, with its indexes, unless it exists already.
pub async fn ensure_table<E: EntityTrait>(db: &DatabaseConnection, entity: E) -> Result<(), Error> {
    let backend = db.get_database_backend();
    let schema = Schema::new(backend);
    let mut table = schema.create_table_from_entity(entity);
    table.if_not_exists();
    let indexes: Vec<IndexCreateStatement> = schema.create_index_from_entity(entity);
    let failed = |source| Error::Database { context: format!("cannot create table {}", entity.table_name()), source };
    if backend == DbBackend::Sqlite {
        db.execute(&table).await.map_err(failed)?;
        for mut index in indexes {
            db.execute(index.if_not_exists()).await.map_err(failed)?;
        }
    } else {
        // MySQL has no CREATE INDEX IF NOT EXISTS, so the indexes go inside the CREATE TABLE,
        // which IF NOT EXISTS then guards as a whole.
        for mut index in indexes {
            table.index(&mut index);
        }
        db.execute(&table).await.map_err(failed)?;
    }
    Ok(())
}

/// The URL's scheme only: the rest may hold a password, and the config crate keeps its
/// redaction helper private.
fn scheme(url: &str) -> &str {
    url.split_once(':').map_or("unknown", |(scheme, _)| scheme)
}
