//! The driver's timing settings and their rules.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest lease: a day. A dead owner's sagas wait this long before another takes them over,
/// and every lease end (the database clock plus this) stays far from overflowing.
pub const LEASE_MS_MAX: i64 = 86_400_000;

/// How long a driver may own a saga and wait for a downstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DriverSettings {
    /// Lease granted by every write and claim. A driver that stalls longer (a pause, a dead
    /// process) loses the saga to the next claimant. 30 s is far beyond the user's P99s
    /// (180 ms, 320 ms), so a healthy driver never loses a saga to a slow call.
    pub lease_ms: i64,
    /// Deadline of one downstream call. Must leave room within the lease.
    pub rpc_timeout_ms: u64,
    /// Safety margin kept between the end of a call's deadline and the end of the lease.
    pub lease_margin_ms: u64,
}

impl DriverSettings {
    pub fn new(lease_ms: i64, rpc_timeout_ms: u64, lease_margin_ms: u64) -> DriverSettings {
        DriverSettings { lease_ms, rpc_timeout_ms, lease_margin_ms }
    }

    pub fn rpc_timeout(&self) -> Duration {
        Duration::from_millis(self.rpc_timeout_ms)
    }

    pub fn lease_margin(&self) -> Duration {
        Duration::from_millis(self.lease_margin_ms)
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.lease_ms).unwrap_or(0))
    }

    /// The problem of a shutdown wait of `deadline_ms` (the setting `key`) that is no longer
    /// than a call's deadline: a drive in the middle of a call reaches its next durable point
    /// within that deadline, and a shorter wait aborts it holding its lease, which then has to
    /// run out for the next owner.
    pub fn shutdown_wait_problem(&self, key: &str, deadline_ms: u64) -> Option<String> {
        (deadline_ms <= self.rpc_timeout_ms).then(|| {
            format!(
                "{key} ({deadline_ms}) must be longer than driver.rpc_timeout_ms ({}): a drive in the middle of a call would be abandoned with its lease",
                self.rpc_timeout_ms
            )
        })
    }

    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=LEASE_MS_MAX).contains(&self.lease_ms) {
            problems.push(format!("{at}.lease_ms must be in 1..={LEASE_MS_MAX} (a day), got {}", self.lease_ms));
        }
        let needed = self.rpc_timeout_ms.saturating_add(self.lease_margin_ms).saturating_mul(2);
        if u64::try_from(self.lease_ms).unwrap_or(0) < needed {
            problems.push(format!(
                "{at}.lease_ms ({}) must be at least twice rpc_timeout_ms + lease_margin_ms ({}), so a call never outlives the lease",
                self.lease_ms,
                self.rpc_timeout_ms.saturating_add(self.lease_margin_ms)
            ));
        }
        if self.rpc_timeout_ms == 0 {
            problems.push(format!("{at}.rpc_timeout_ms must be positive"));
        }
        problems
    }
}

impl Default for DriverSettings {
    fn default() -> Self {
        DriverSettings::new(30_000, 2_000, 1_000)
    }
}
