//! The mocks' notion of "now", injectable so tests move time instead of waiting for it.
//!
//! Only wall-clock facts go through here: ledger timestamps and the irreversibility window.
//! Injected latency uses `tokio::time::sleep`, which tests control with `tokio::time::pause`.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now_ms(&self) -> i64;
}

/// The machine's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        // A clock before 1970 is a broken machine; 0 keeps the ledger ordered by seq regardless.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to, for tests of time windows.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    /// A fixed, recognisable start (2023-11-14T22:13:20Z) so ledger timestamps in tests are stable.
    pub const START_MS: i64 = 1_700_000_000_000;

    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock { now_ms: AtomicI64::new(start_ms) }
    }

    pub fn advance(&self, by: Duration) {
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms.fetch_add(by_ms, Ordering::SeqCst);
    }

    pub fn set(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(ManualClock::START_MS)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::default();
        assert_eq!(clock.now_ms(), ManualClock::START_MS);
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now_ms(), ManualClock::START_MS + 1_500);
        clock.set(5);
        assert_eq!(clock.now_ms(), 5);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
