//! The few places where MySQL and SQLite SQL differ, each behind one function.

use sea_orm::DbBackend;

/// The database clock in milliseconds since the Unix epoch, as an SQL expression.
/// Leases are compared against this inside the statements, never against a worker's clock.
pub fn now_ms(backend: DbBackend) -> &'static str {
    match backend {
        // The session time zone is UTC (`Store::connect` sets +00:00 whatever the URL says), so
        // there is no DST ambiguity.
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

/// `table` for a statement whose WHERE names rows by a list of primary keys (`biz_id IN
/// (...)`). On MySQL the optimizer scans the whole index instead when the list is a large part
/// of a small table (or is long, see [`through_index`]); a scanning SELECT reads every row, and
/// under REPEATABLE READ a scanning UPDATE keeps every row it read locked until commit, rows of
/// other sagas included: concurrent group transactions then wait for each other and deadlock.
/// Forcing the primary key makes it read and lock only the rows it names.
pub fn by_primary_key(backend: DbBackend, table: &str) -> String {
    through_index(backend, table, "PRIMARY")
}

/// `table`, read through `index` on MySQL. A statement whose WHERE names rows by a long list
/// (`col IN (...)`, more values than the server's `eq_range_index_dive_limit`, 200 by default)
/// is planned from the index statistics instead of a look at the index; while a table is
/// young those statistics count next to no rows, and MySQL then scans the whole table: on the
/// consumer's hot path that was a full scan of the saga table for every inbox batch. SQLite
/// plans these from the index on its own.
pub fn through_index(backend: DbBackend, table: &str, index: &str) -> String {
    match backend {
        DbBackend::MySql => format!("{table} FORCE INDEX ({index})"),
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

/// `values` (the list of an `IN (...)`) lengthened to the next power of two by repeating its
/// last value, which changes nothing a query selects or updates.
///
/// Why: every statement shape is prepared once per connection and kept in a cache of
/// [`STATEMENT_CACHE`] shapes. When a new shape pushes an old one out, sqlx closes the old one
/// with a packet the server does not answer, and on TCP the next request then waits for the
/// server's delayed acknowledgement (about 40 ms on Linux). With a list of any length each
/// batch was a new shape: every inbox statement took about 45 ms (BENCHMARKS.md). Powers of two
/// keep the shapes few enough to stay prepared.
pub fn padded<T: Clone>(mut values: Vec<T>) -> Vec<T> {
    if let Some(last) = values.last().cloned() {
        values.resize(values.len().next_power_of_two(), last);
    }
    values
}

/// [`padded`], repeating the value of least `weight` instead of the last: for rows whose sizes
/// differ, so a large row is never the one repeated (the inbox's rows, by payload: a batch of
/// 129 rows whose last is 64 KiB would otherwise send 127 more copies of it).
pub fn padded_by_least<T: Clone>(mut values: Vec<T>, weight: impl Fn(&T) -> usize) -> Vec<T> {
    if let Some(least) = values.iter().min_by_key(|value| weight(value)).cloned() {
        values.resize(values.len().next_power_of_two(), least);
    }
    values
}

/// Prepared statements kept per connection. The store's statements have a bounded set of
/// shapes (power-of-two row counts and list lengths), about 140 in all (the inbox's first read
/// pads two lists, up to 45 pairs of lengths within a batch of 256); this keeps
/// every one a connection uses prepared. The server's `max_prepared_stmt_count` (16,382 by
/// default) bounds the total over all connections of all processes.
pub const STATEMENT_CACHE: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_lists_have_power_of_two_lengths_and_the_same_values() {
        for n in 0..=70_usize {
            let values: Vec<usize> = (0..n).collect();
            let padded = padded(values.clone());
            assert!(padded.is_empty() || padded.len().is_power_of_two(), "{n}: {}", padded.len());
            assert!(padded.len() >= n && padded.len() < 2 * n.max(1));
            assert_eq!(&padded[..n], &values[..]);
            assert!(padded[n..].iter().all(|v| Some(v) == values.last()), "{n}: only the last value repeats");
        }
    }

    #[test]
    fn padding_by_least_repeats_the_lightest_value() {
        for n in 1..=70_usize {
            // Weights fall, then rise: the lightest value is in the middle, never first or last.
            let values: Vec<usize> = (0..n).map(|i| i.abs_diff(n / 2) + 1).collect();
            let padded = padded_by_least(values.clone(), |v| *v);
            assert!(padded.len().is_power_of_two() && padded.len() < 2 * n, "{n}: {}", padded.len());
            assert_eq!(&padded[..n], &values[..]);
            assert!(padded[n..].iter().all(|v| *v == 1), "{n}: only the lightest repeats: {padded:?}");
        }
        assert!(padded_by_least(Vec::<usize>::new(), |v| *v).is_empty());
    }
}
