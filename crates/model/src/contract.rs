//! What each downstream promises, as data the planner reads.
//!
//! The roll-forward / roll-back rules depend on four facts about a downstream: can it be
//! queried by our request id, does it deduplicate on it (and for how long), how long can a sent
//! request still land, and can its effect be reversed (until when, and with a tombstone for an
//! unknown id). Stating them here, once, lets the rules be tested as one table and lets a
//! deployment describe its real downstreams instead of editing code.

use serde::{Deserialize, Serialize};

use crate::ids::Step;

/// A downstream's promises about calls carrying our request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// It answers "what happened to request X?" by our request id.
    pub queryable: bool,
    /// A repeat with the same request id returns the first answer instead of acting again, for
    /// this long after the first request (`None` or 0: it does not deduplicate on our id at all;
    /// a configuration file states it with 0, since a key left out takes the default).
    pub idempotent_for_ms: Option<i64>,
    /// How long after a request was sent it may still arrive and take effect.
    pub in_flight_window_ms: i64,
    /// How long after the effect a reversal is still accepted (`None` or 0: never).
    pub reversible_for_ms: Option<i64>,
    /// Reversing an unknown request id records a tombstone that refuses a late request.
    pub tombstones: bool,
}

/// Longest `in_flight_window_ms`: a day.
pub const IN_FLIGHT_WINDOW_MS_MAX: i64 = 86_400_000;
/// Longest `backoff_max_ms`: an hour.
pub const BACKOFF_MS_MAX: i64 = 3_600_000;

impl Contract {
    /// The careful downstream docs/design.md asks for (and the mocks implement).
    pub const CAREFUL: Contract = Contract {
        queryable: true,
        idempotent_for_ms: Some(i64::MAX),
        in_flight_window_ms: 60_000,
        reversible_for_ms: Some(i64::MAX),
        tombstones: true,
    };

    /// The user's WMS at the time of the incident: deduplicates on its own key only, cannot be
    /// queried by ours. After an unknown outcome nothing automatic is safe.
    pub const LEGACY: Contract = Contract {
        queryable: false,
        idempotent_for_ms: None,
        in_flight_window_ms: 60_000,
        reversible_for_ms: Some(i64::MAX),
        tombstones: false,
    };

    /// Whether a resend with the same request id, sent now, is absorbed by the downstream
    /// whichever of the two requests it sees first. The first may land up to the in-flight
    /// window after its intent, and the resend up to that window after now, and the downstream
    /// counts its deduplication window from the first it sees: so the resend is safe only while
    /// now plus the in-flight window is within the deduplication window of the intent (a
    /// window no longer than the in-flight window never makes a resend safe).
    pub fn deduplicates(&self, intent_at_ms: i64, now_ms: i64) -> bool {
        self.idempotent_for_ms
            .is_some_and(|window| now_ms.saturating_add(self.in_flight_window_ms) < intent_at_ms.saturating_add(window))
    }

    /// Whether an effect applied at `applied_at_ms` can still be reversed at `now_ms`.
    pub fn reversible(&self, applied_at_ms: i64, now_ms: i64) -> bool {
        self.reversible_for_ms.is_some_and(|window| now_ms < applied_at_ms.saturating_add(window))
    }

    /// When a request sent at `sent_at_ms` can no longer land.
    pub fn in_flight_until(&self, sent_at_ms: i64) -> i64 {
        sent_at_ms.saturating_add(self.in_flight_window_ms)
    }

    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let window_fits = (1..=IN_FLIGHT_WINDOW_MS_MAX).contains(&self.in_flight_window_ms);
        if !window_fits {
            // A saga waiting out the window is not looked at again before it ends.
            problems.push(format!("{at}.in_flight_window_ms must be in 1..={IN_FLIGHT_WINDOW_MS_MAX} (a day)"));
        }
        if self.idempotent_for_ms.is_some_and(|w| w < 0) || self.reversible_for_ms.is_some_and(|w| w < 0) {
            problems.push(format!("{at}: idempotent_for_ms and reversible_for_ms must be 0 (never) or positive"));
        }
        if let Some(window) = self.idempotent_for_ms
            && window_fits
            && window > 0
            && window <= self.in_flight_window_ms
        {
            problems.push(format!(
                "{at}.idempotent_for_ms ({window}) must be 0 (never) or longer than in_flight_window_ms ({}): a request may land that long after it is sent, so a shorter deduplication window never makes a resend safe",
                self.in_flight_window_ms
            ));
        }
        problems
    }
}

/// How failed attempts back off, and when automation gives up and opens a ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    /// After this many failed attempts at one step, the saga goes to MANUAL_REVIEW.
    pub attempts_max: u32,
}

impl RetryPolicy {
    /// Delay before attempt `attempts + 1`: exponential, capped, with up to a quarter of
    /// deterministic jitter drawn from the biz_id so that sagas failed by one outage do not all
    /// return at the same instant (and a test can predict the value).
    pub fn backoff_ms(&self, attempts: u32, biz_id: &str) -> i64 {
        let exponent = attempts.min(30);
        let raw = self.backoff_base_ms.saturating_mul(1_i64 << exponent).min(self.backoff_max_ms);
        let spread = raw / 4;
        if spread == 0 {
            return raw;
        }
        let hash = biz_id.bytes().fold(u64::from(attempts).wrapping_add(0x9e37_79b9), |h, b| {
            h.rotate_left(5) ^ u64::from(b).wrapping_mul(0x100_0000_01b3)
        });
        raw - spread + (hash % (spread as u64 + 1)) as i64
    }

    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.backoff_base_ms <= 0 || self.backoff_max_ms < self.backoff_base_ms {
            problems.push(format!("{at}: need 0 < backoff_base_ms <= backoff_max_ms"));
        }
        if self.backoff_max_ms > BACKOFF_MS_MAX {
            problems.push(format!("{at}.backoff_max_ms must be at most {BACKOFF_MS_MAX} (an hour)"));
        }
        if self.attempts_max == 0 {
            problems.push(format!("{at}.attempts_max must be positive"));
        }
        problems
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        // 0.5 s doubling to 30 s; 40 attempts keep a saga retrying for roughly 15 minutes of
        // outage before a person is asked, well past the 30 s WMS outage in the scenarios.
        RetryPolicy { backoff_base_ms: 500, backoff_max_ms: 30_000, attempts_max: 40 }
    }
}

/// Everything the planner needs besides the row, the observation and the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    pub wms: Contract,
    pub logistics: Contract,
    pub retry: RetryPolicy,
}

impl Rules {
    /// The contract of the downstream `step` calls.
    pub const fn contract(&self, step: Step) -> &Contract {
        match step {
            Step::Wms => &self.wms,
            Step::Logistics => &self.logistics,
        }
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules { wms: Contract::CAREFUL, logistics: Contract::CAREFUL, retry: RetryPolicy::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_of_zero_is_never() {
        let legacy = Contract { idempotent_for_ms: Some(0), reversible_for_ms: Some(0), ..Contract::CAREFUL };
        assert!(legacy.problems("rules.wms").is_empty());
        for contract in [legacy, Contract { idempotent_for_ms: None, reversible_for_ms: None, ..Contract::CAREFUL }] {
            assert!(!contract.deduplicates(1_000, 1_000), "{contract:?}");
            assert!(!contract.reversible(1_000, 1_000), "{contract:?}");
        }
        let negative = Contract { reversible_for_ms: Some(-1), ..Contract::CAREFUL };
        assert_eq!(
            negative.problems("rules.wms"),
            ["rules.wms: idempotent_for_ms and reversible_for_ms must be 0 (never) or positive"]
        );
    }

    #[test]
    fn a_resend_is_absorbed_only_if_both_requests_fall_in_the_window() {
        // Deduplicates for 100 s, requests land within 60 s of being sent.
        let contract = Contract { idempotent_for_ms: Some(100_000), ..Contract::CAREFUL };
        assert!(contract.problems("rules.wms").is_empty());
        assert!(contract.deduplicates(0, 39_999));
        // Sent at 40 s, the resend may land at 100 s, when the first (landed at 0) is forgotten.
        assert!(!contract.deduplicates(0, 40_000));
        // Forever stays forever, and never stays never.
        assert!(Contract::CAREFUL.deduplicates(0, i64::MAX / 2));
        assert!(!Contract::LEGACY.deduplicates(0, 0));
        // A window no longer than the in-flight window is refused: it never makes a resend safe.
        let short = Contract { idempotent_for_ms: Some(60_000), ..Contract::CAREFUL };
        assert!(!short.deduplicates(0, 0));
        assert_eq!(short.problems("rules.wms").len(), 1, "{:?}", short.problems("rules.wms"));
        let endless = Contract { in_flight_window_ms: i64::MAX, ..Contract::CAREFUL };
        assert_eq!(endless.problems("rules.wms"), ["rules.wms.in_flight_window_ms must be in 1..=86400000 (a day)"]);
    }

    #[test]
    fn the_retry_policy_is_bounded() {
        assert!(RetryPolicy::default().problems("rules.retry").is_empty());
        let huge = RetryPolicy { backoff_max_ms: i64::MAX, ..RetryPolicy::default() };
        assert_eq!(huge.problems("rules.retry"), ["rules.retry.backoff_max_ms must be at most 3600000 (an hour)"]);
        let none = RetryPolicy { attempts_max: 0, backoff_base_ms: 0, ..RetryPolicy::default() };
        assert_eq!(none.problems("rules.retry").len(), 2);
    }
}
