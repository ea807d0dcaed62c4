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
        // Pinging every connection before use halves the commit rate on this kind of box;
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

#[cfg(test)]
mod tests {
    use sea_orm::{ConnectionTrait, Statement};

    use super::*;

    async fn pragma(db: &DatabaseConnection, name: &str) -> String {
        let row = db
            .query_one_raw(Statement::from_string(DbBackend::Sqlite, format!("PRAGMA {name}")))
            .await
            .expect("pragma query")
            .expect("pragma row");
        row.try_get_by_index::<String>(0)
            .or_else(|_| row.try_get_by_index::<i64>(0).map(|n| n.to_string()))
            .expect("pragma value")
    }

    #[tokio::test]
    async fn sqlite_runs_in_wal_mode_with_normal_sync() {
        let path = std::env::temp_dir().join(format!("midflight-mock-db-{}.db", std::process::id()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let db =
            connect(&DatabaseSection { url, max_connections: 1, ..DatabaseSection::default() }).await.expect("connect");
        assert_eq!(pragma(&db, "journal_mode").await, "wal");
        // 1 is NORMAL: the WAL is written at every commit and synced at checkpoints.
        assert_eq!(pragma(&db, "synchronous").await, "1");
        drop(db);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}
