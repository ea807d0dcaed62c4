//! The invariant checker: what the tests, the demo, the scenarios and the chaos campaign all use
//! to decide whether a run kept the product's promise (ARCHITECTURE.md, I1-I6).
//!
//! It works on a [`Snapshot`] (everything durable a run left behind: saga rows, the transition
//! log, business rows, outbox rows, tickets, both downstream ledgers, and the notification and
//! dead-letter topics as the caller read them) and on [`Expected`] (what the run produced).
//! [`check`] is a pure function of the two, so every rule is unit-tested on planted violations;
//! [`Snapshot::collect`] gathers a snapshot from a live store and live downstreams.

mod collect;
mod effects;
mod rules;

use std::collections::BTreeMap;

use midflight_api::client::LedgerEntry;
use midflight_model::Saga;
use midflight_store::{OrderRow, Ticket, Transition};
use serde::Serialize;

pub use collect::Error;
pub use effects::{Effects, effects_by_order};

/// Everything durable a run left behind.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub sagas: Vec<Saga>,
    pub transitions: Vec<Transition>,
    pub orders: Vec<OrderRow>,
    /// (biz_id, published) per outbox row.
    pub outbox: Vec<(String, bool)>,
    pub tickets: Vec<Ticket>,
    pub wms_ledger: Vec<LedgerEntry>,
    pub logistics_ledger: Vec<LedgerEntry>,
    /// Keys (biz_ids) read back from the notification topic, when the caller read it.
    pub notifications: Option<Vec<String>>,
    /// Keys read back from the dead-letter topic (the parked biz_id), when the caller read it.
    pub dead_letters: Option<Vec<String>>,
}

/// What the run produced to the order topic.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    /// biz_ids of valid order events (a redelivered duplicate counts once).
    pub orders: Vec<String>,
    /// biz_ids the poison messages must be parked under (`parked:topic:partition:offset`).
    pub poison: Vec<String>,
}

impl Expected {
    pub fn messages(&self) -> usize {
        self.orders.len() + self.poison.len()
    }
}

/// One broken promise, with what a person needs to see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// `I1` .. `I6`.
    pub invariant: &'static str,
    pub biz_id: String,
    pub message: String,
    pub evidence: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {} [{}]", self.invariant, self.biz_id, self.message, self.evidence)
    }
}

/// The checker's verdict, in the shape the run reports use.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub messages: usize,
    /// Sagas per status (terminal and not).
    pub by_status: BTreeMap<String, usize>,
    /// Effects beyond the one allowed, summed over both downstreams (I1).
    pub duplicate_effects: usize,
    /// Accepted messages without a terminal row (I2).
    pub lost: usize,
    pub violations: Vec<Violation>,
    pub takeovers: usize,
    /// Tickets opened (open or resolved).
    pub tickets: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks every invariant of `snapshot` against what was produced.
pub fn check(snapshot: &Snapshot, expected: &Expected) -> Report {
    let mut report = Report { messages: expected.messages(), ..Report::default() };
    for saga in &snapshot.sagas {
        *report.by_status.entry(saga.status.as_str().to_owned()).or_default() += 1;
    }
    report.takeovers = snapshot.transitions.iter().filter(|t| t.is_takeover()).count();
    report.tickets = snapshot.tickets.len();
    let effects = rules::at_most_once(snapshot, expected, &mut report);
    rules::nothing_lost(snapshot, expected, &mut report);
    rules::consistent_end_states(snapshot, &effects, &mut report);
    rules::fenced_owners(snapshot, &mut report);
    rules::per_order_order(snapshot, &mut report);
    rules::poison_parked(snapshot, expected, &mut report);
    report
}
