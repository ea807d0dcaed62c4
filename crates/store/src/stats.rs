//! Counters of the store's own writes, so a benchmark counts write transactions per message
//! instead of assuming them (on SQLite nothing else can count them; on MySQL the server's
//! global counters also see every other client).
//!
//! Plain relaxed atomics: they are read for reports, never to decide anything.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What one [`crate::Store`] (and its clones) wrote since it connected.
#[derive(Debug, Default)]
pub(crate) struct Stats {
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
    /// Saga transitions written (applied compare-and-sets of [`crate::Store::write`]).
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

impl Stats {
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

    pub(crate) fn read(&self) -> StoreStats {
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
