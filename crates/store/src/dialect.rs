//! The few places where MySQL and SQLite SQL differ, each behind one function.

use sea_orm::DbBackend;

/// The database clock in milliseconds since the Unix epoch, as an SQL expression.
/// Leases are compared against this inside the statements, never against a worker's clock.
pub fn now_ms(backend: DbBackend) -> &'static str {
    match backend {
        // The session time zone is UTC (sqlx sets +00:00), so there is no DST ambiguity.
        DbBackend::MySql => "CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)",
        _ => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

/// Suffix making an INSERT a no-op when the primary key exists. MySQL's `INSERT IGNORE` is
/// avoided on purpose: it also turns truncation and other errors into warnings.
pub fn on_conflict_do_nothing(backend: DbBackend, key_column: &str) -> String {
    match backend {
        DbBackend::MySql => format!(" ON DUPLICATE KEY UPDATE {key_column} = {key_column}"),
        _ => " ON CONFLICT DO NOTHING".to_owned(),
    }
}

/// `table` for an UPDATE whose WHERE names rows by a list of primary keys (`biz_id IN (...)`).
/// On MySQL the optimizer scans the whole index instead when the list is a large part of a
/// small table, and under REPEATABLE READ a scanning UPDATE keeps every row it read locked
/// until commit, rows of other sagas included: concurrent group transactions then wait for
/// each other and deadlock. Forcing the primary key makes it lock only the rows it names.
pub fn by_primary_key(backend: DbBackend, table: &str) -> String {
    match backend {
        DbBackend::MySql => format!("{table} FORCE INDEX (PRIMARY)"),
        _ => table.to_owned(),
    }
}

/// `?, ?, ?` with `n` placeholders.
pub fn placeholders(n: usize) -> String {
    let mut out = String::with_capacity(n * 3);
    for index in 0..n {
        if index > 0 {
            out.push_str(", ");
        }
        out.push('?');
    }
    out
}
