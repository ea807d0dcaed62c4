//! The database's own commit rate for single-row transactions: `connections` clients, each
//! updating its own row in autocommit mode as fast as the server lets it, for a few seconds.
//! Through a sea-orm pool with the store's settings (no test before acquire), so the number is
//! what our own client stack could get from the server with nothing else to do. Divided by
//! midflight's write transactions per message it bounds midflight's msg/s on this box.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, Statement};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub connections: u32,
    pub seconds: f64,
    pub commits: u64,
    pub commits_per_s: f64,
    /// `innodb_flush_log_at_trx_commit` (MariaDB), or SQLite's journal and sync mode.
    pub durability: String,
}

/// Measures on a fresh database of `mysql_url`'s server, or on a SQLite file in `dir`.
pub async fn measure(mysql_url: Option<&str>, dir: &Path, connections: u32, seconds: u64) -> anyhow::Result<Ceiling> {
    let scratch = Scratch::create(mysql_url, dir, "ceiling").await?;
    let measured = run(scratch.options(connections), connections, seconds).await;
    // Dropped whether or not the run succeeded, so a failed run leaves no database behind.
    let durability = scratch.durability.clone();
    scratch.remove().await;
    let (commits, elapsed) = measured?;
    Ok(Ceiling { connections, seconds: elapsed, commits, commits_per_s: commits as f64 / elapsed, durability })
}

/// A database of the lab's own beside a system's, to measure the server (or the disk) on: a
/// fresh database on the MySQL server, dropped again by `remove`, or a fresh SQLite file in
/// `dir`. The ceiling and the commit probe use one each.
pub struct Scratch {
    url: String,
    /// `innodb_flush_log_at_trx_commit` (MariaDB), or SQLite's journal and sync mode.
    pub durability: String,
    /// The server and the database created on it.
    created: Option<(String, String)>,
}

impl Scratch {
    pub async fn create(mysql_url: Option<&str>, dir: &Path, label: &str) -> anyhow::Result<Scratch> {
        std::fs::create_dir_all(dir)?;
        let Some(server) = mysql_url else {
            let path = dir.join(format!("{label}.db"));
            for suffix in ["", "-wal", "-shm"] {
                std::fs::remove_file(format!("{}{suffix}", path.display())).ok();
            }
            return Ok(Scratch {
                url: format!("sqlite://{}?mode=rwc", path.display()),
                durability: "WAL, synchronous=FULL (the store's)".to_owned(),
                created: None,
            });
        };
        let name = format!("midflight_{label}_{}", std::process::id());
        let admin = Database::connect(server).await.with_context(|| format!("cannot connect to {server}"))?;
        admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}")).await?;
        admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await?;
        let flush = admin
            .query_one_raw(Statement::from_string(
                admin.get_database_backend(),
                "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED) AS flush",
            ))
            .await?
            .and_then(|row| row.try_get::<i64>("", "flush").ok())
            .map_or("unknown".to_owned(), |flush| format!("innodb_flush_log_at_trx_commit={flush}"));
        admin.close().await.ok();
        Ok(Scratch {
            url: midflight_config::with_database_name(server, &name),
            durability: flush,
            created: Some((server.to_owned(), name)),
        })
    }

    /// A pool of `connections` with the store's settings (no test before acquire, SQLite in WAL).
    pub fn options(&self, connections: u32) -> ConnectOptions {
        let mut options = ConnectOptions::new(self.url.clone());
        options
            .max_connections(connections)
            .min_connections(connections)
            .test_before_acquire(false)
            .sqlx_logging(false)
            .map_sqlx_sqlite_opts(|sqlite| {
                sqlite.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal).busy_timeout(Duration::from_secs(10))
            });
        options
    }

    #[cfg(test)]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database created on the server (none for a SQLite file).
    #[cfg(test)]
    pub fn database(&self) -> Option<&str> {
        self.created.as_ref().map(|(_, name)| name.as_str())
    }

    /// Drops the database created on the server (a SQLite file stays in the run's directory).
    pub async fn remove(self) {
        if let Some((server, name)) = self.created {
            crate::system::drop_database(&server, &name).await.ok();
        }
    }
}

/// `connections` workers updating their own rows until `seconds` have passed: commits and
/// the seconds they took.
async fn run(options: ConnectOptions, connections: u32, seconds: u64) -> anyhow::Result<(u64, f64)> {
    let db = Database::connect(options).await.context("ceiling: cannot connect")?;
    db.execute_unprepared("CREATE TABLE ceiling_probe (id INT NOT NULL PRIMARY KEY, n BIGINT NOT NULL)").await?;
    for id in 0..connections {
        db.execute_unprepared(&format!("INSERT INTO ceiling_probe (id, n) VALUES ({id}, 0)")).await?;
    }
    let commits = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let workers: Vec<_> =
        (0..connections).map(|id| tokio::spawn(worker(db.clone(), id, until, commits.clone()))).collect();
    for worker in workers {
        worker.await.context("ceiling worker panicked")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    db.close().await.ok();
    Ok((commits.load(Ordering::Relaxed), elapsed))
}

async fn worker(db: DatabaseConnection, id: u32, until: Instant, commits: Arc<AtomicU64>) -> anyhow::Result<()> {
    let backend = db.get_database_backend();
    while Instant::now() < until {
        let update =
            Statement::from_sql_and_values(backend, "UPDATE ceiling_probe SET n = n + 1 WHERE id = ?", [id.into()]);
        db.execute_raw(update).await.context("ceiling update")?;
        commits.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
