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
