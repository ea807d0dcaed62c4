//! Counters of the store's own writes, so a benchmark counts write transactions per message
//! instead of assuming them (on SQLite nothing else can count them; on MySQL the server's
//! global counters also see every other client).
//!
//! Plain relaxed atomics: they are read for reports, never to decide anything.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What one [`crate::Store`] (and its clones) wrote since it connected, counted as it
/// happens; [`crate::Store::counters`] hands it out so a metrics exporter can read it at each
/// collection for as long as the store lives.
#[derive(Debug, Default)]
pub struct StoreCounters {
    write_txns: AtomicU64,
    transitions: AtomicU64,
    batches: AtomicU64,
    retried: AtomicU64,
    opened_on_insert: AtomicU64,
    gave_way: AtomicU64,
    refused: AtomicU64,
}

/// A reading of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// Committed transactions that wrote (an autocommit write statement counts as one).
    pub write_txns: u64,
    /// Saga transitions written: applied compare-and-sets of [`crate::Store::write`], and the
    /// first steps the inbox wrote with the rows it opened.
    pub transitions: u64,
    /// Of `write_txns`, the shared commits of the group writer (each carries many transitions).
    pub batches: u64,
    /// Transition transactions tried again because the database rolled them back on its own
    /// (a deadlock, a lock wait timeout, SQLite busy); each try that committed is counted above.
    pub retried: u64,
    /// Of `transitions`, the first steps the inbox wrote by inserting the row as that step
    /// leaves it, with no compare-and-set (MySQL, a batch none of whose rows existed).
    pub opened_on_insert: u64,
    /// Inbox transactions of that path that read back a row they had not inserted (another
    /// transaction inserted it meanwhile), were rolled back and took the general path.
    pub gave_way: u64,
    /// New connections a full server refused the store's operations: every try, the last one
    /// of an operation that gave up included
    /// (MySQL 1040, 1203 or 1226; see `database.acquire_timeout_ms`).
    pub refused: u64,
}

impl StoreStats {
    /// Every field by name, in declaration order (metrics are named after them).
    pub fn fields(&self) -> [(&'static str, u64); 7] {
        let StoreStats { write_txns, transitions, batches, retried, opened_on_insert, gave_way, refused } = *self;
        [
            ("write_txns", write_txns),
            ("transitions", transitions),
            ("batches", batches),
            ("retried", retried),
            ("opened_on_insert", opened_on_insert),
            ("gave_way", gave_way),
            ("refused", refused),
        ]
    }
}

impl StoreCounters {
    pub(crate) fn write_committed(&self) {
        self.write_txns.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn transitions_written(&self, count: u64) {
        self.transitions.fetch_add(count, Ordering::Relaxed);
    }

    pub(crate) fn batch_committed(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.write_committed();
    }

    pub(crate) fn opened_on_insert(&self, count: u64) {
        self.opened_on_insert.fetch_add(count, Ordering::Relaxed);
    }

    pub(crate) fn gave_way(&self) {
        self.gave_way.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn retried(&self) {
        self.retried.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused connection; returns the count with it.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The counters as they are now.
    pub fn read(&self) -> StoreStats {
        StoreStats {
            write_txns: self.write_txns.load(Ordering::Relaxed),
            transitions: self.transitions.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            opened_on_insert: self.opened_on_insert.load(Ordering::Relaxed),
            gave_way: self.gave_way.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_name_every_counter_as_serialised() {
        let counters = StoreCounters::default();
        counters.write_committed();
        counters.batch_committed();
        counters.transitions_written(5);
        counters.retried();
        counters.opened_on_insert(2);
        counters.gave_way();
        assert_eq!(counters.refused(), 1);
        let stats = counters.read();
        let serialised = serde_json::to_value(stats).expect("serialise");
        let serialised = serialised.as_object().expect("an object");
        let fields = stats.fields();
        assert_eq!(fields.len(), serialised.len(), "{serialised:?}");
        for (name, value) in fields {
            assert_eq!(serialised.get(name).and_then(serde_json::Value::as_u64), Some(value), "{name}");
        }
        let expected = [("write_txns", 2), ("transitions", 5), ("batches", 1), ("retried", 1)];
        assert_eq!(&fields[..4], &expected);
        assert_eq!(&fields[4..], &[("opened_on_insert", 2), ("gave_way", 1), ("refused", 1)]);
    }
}
