//! Applies the numbered SQL files of `migrations/` through sea-orm-migration, so MySQL and
//! SQLite get the same schema and a database records which files it has.
//!
//! The files are the schema as a person reviews it; they are written in the SQL both engines
//! accept (types, `--` comments, separate `CREATE INDEX`), and split into statements at lines
//! ending with `;` (a tidy test keeps `;` out of comments). A file whose first line is
//! `-- engine: mysql` is for MySQL and MariaDB only (SQLite has no `ALTER TABLE ... MODIFY`, and
//! what such a file changes is already so there).

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use sea_orm_migration::prelude::*;

/// The migration files, in order: (name, SQL).
pub const FILES: [(&str, &str); 10] = [
    ("0001_saga", include_str!("../../../migrations/0001_saga.sql")),
    ("0002_saga_transition", include_str!("../../../migrations/0002_saga_transition.sql")),
    ("0003_manual_ticket", include_str!("../../../migrations/0003_manual_ticket.sql")),
    ("0004_outbox", include_str!("../../../migrations/0004_outbox.sql")),
    ("0005_orders", include_str!("../../../migrations/0005_orders.sql")),
    ("0006_request_id_lookup", include_str!("../../../migrations/0006_request_id_lookup.sql")),
    ("0007_transition_call_time", include_str!("../../../migrations/0007_transition_call_time.sql")),
    ("0008_reconcile_checkpoint", include_str!("../../../migrations/0008_reconcile_checkpoint.sql")),
    ("0009_reconcile_unseen", include_str!("../../../migrations/0009_reconcile_unseen.sql")),
    ("0010_binary_keys", include_str!("../../../migrations/0010_binary_keys.sql")),
];

/// First line of a file that only MySQL and MariaDB need; elsewhere it is recorded as applied
/// and does nothing.
const MYSQL_ONLY: &str = "-- engine: mysql";

pub struct Migrator;

impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        FILES.iter().map(|&(name, sql)| Box::new(SqlFile { name, sql }) as Box<dyn MigrationTrait>).collect()
    }
}

struct SqlFile {
    name: &'static str,
    sql: &'static str,
}

impl MigrationName for SqlFile {
    fn name(&self) -> &str {
        self.name
    }
}

#[async_trait::async_trait]
impl MigrationTrait for SqlFile {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let connection = manager.get_connection();
        if self.sql.starts_with(MYSQL_ONLY) && connection.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let mariadb = match connection.get_database_backend() {
            DbBackend::MySql => {
                let version =
                    connection.query_one_raw(Statement::from_string(DbBackend::MySql, "SELECT VERSION() AS v")).await?;
                version.map(|row| row.try_get::<String>("", "v")).transpose()?.is_some_and(|v| v.contains("MariaDB"))
            }
            _ => false,
        };
        for statement in statements(self.sql) {
            connection.execute_unprepared(&unbounded(&statement, mariadb)).await?;
        }
        Ok(())
    }

    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Err(DbErr::Migration(format!("{} cannot be undone automatically: restore from a backup", self.name)))
    }
}

/// `statement` free of the pooled connections' `database.statement_timeout_ms`: building an
/// index on a large table may take longer than any statement of the services. MariaDB's bound
/// covers every statement and is lifted for this one; MySQL's covers SELECTs only.
fn unbounded(statement: &str, mariadb: bool) -> String {
    if mariadb { format!("SET STATEMENT max_statement_time = 0 FOR {statement}") } else { statement.to_owned() }
}

/// Splits a file into statements at lines that end with `;`.
pub fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in sql.lines() {
        current.push_str(line);
        current.push('\n');
        if line.trim_end().ends_with(';') {
            let statement = current.trim().trim_end_matches(';').to_owned();
            if statement.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--")) {
                out.push(statement);
            }
            current.clear();
        }
    }
    out
}
