//! What a downstream ledger says, folded per request id, and the rule that turns a ledger
//! view and a saga row into a finding. Pure: no I/O, tested as a table.
//!
//! A ledger is an append-only list of entries (apply, reject, undo, tombstone), each naming
//! the caller's request id and the downstream's own effect id (lock id, tracking number). An
//! effect is in force when it was applied and no undo names it since. Two effects in force
//! under one request id is what the incident looked like: a WMS that deduplicated on its own
//! key deducted twice for one request.

use std::collections::{BTreeSet, HashMap};

use midflight_api::client::{LedgerEntry, LedgerKind};
use midflight_model::Status;
use serde::Serialize;

/// Entries kept per request id as evidence; the fold itself counts them all.
pub const ENTRIES_KEPT_PER_REQUEST_MAX: usize = 16;

/// Everything a ledger recorded under one request id. A pass holds one per request id of each
/// ledger, so it is kept small: the request id is the map's key only, the order number is kept
/// once, and the evidence drops both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    pub order_no: String,
    /// Effect ids applied and not undone, in ledger order.
    pub in_force: Vec<String>,
    /// The first [`ENTRIES_KEPT_PER_REQUEST_MAX`] entries, for the evidence.
    pub entries: Vec<Evidence>,
    /// Some saga of the pass's walk names this request id.
    pub owned: bool,
}

/// A ledger entry as a finding's evidence shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub seq: u64,
    pub kind: LedgerKind,
    pub effect_id: String,
    pub at_ms: i64,
}

/// One downstream's ledger, folded by request id.
#[derive(Debug, Default)]
pub struct Ledger {
    pub by_request: HashMap<String, Effects>,
    pub entries: u64,
    /// The highest sequence number folded (0 when none).
    pub last_seq: u64,
}

impl Ledger {
    /// Folds `entries` (in ledger order) into the view.
    pub fn fold(&mut self, entries: &[LedgerEntry]) {
        for entry in entries {
            self.entries += 1;
            self.last_seq = self.last_seq.max(entry.seq);
            let effects = self.by_request.entry(entry.request_id.clone()).or_default();
            if effects.order_no.is_empty() {
                effects.order_no = entry.order_no.clone();
            }
            match entry.kind {
                LedgerKind::Apply => push_one(&mut effects.in_force, entry.effect_id.clone()),
                LedgerKind::Undo => effects.in_force.retain(|id| id != &entry.effect_id),
                LedgerKind::Reject | LedgerKind::Tombstone => {}
            }
            if effects.entries.len() < ENTRIES_KEPT_PER_REQUEST_MAX {
                let evidence = Evidence {
                    seq: entry.seq,
                    kind: entry.kind,
                    effect_id: entry.effect_id.clone(),
                    at_ms: entry.at_ms,
                };
                push_one(&mut effects.entries, evidence);
            }
        }
    }

    /// How many effects are in force under `request_id` (0 when the ledger never saw it).
    pub fn in_force(&self, request_id: &str) -> usize {
        self.by_request.get(request_id).map_or(0, |effects| effects.in_force.len())
    }

    /// Marks `request_id` as named by a saga; a request id the ledger never saw needs no mark.
    pub fn own(&mut self, request_id: &str) {
        if let Some(effects) = self.by_request.get_mut(request_id) {
            effects.owned = true;
        }
    }

    /// The heap this view holds, counted from capacities (strings, vectors, and the map's slots
    /// by its capacity, which is less than its buckets): a lower bound of what a pass's memory
    /// grows with, as a number a test can pin.
    pub fn heap_bytes(&self) -> usize {
        let slot = size_of::<(String, Effects)>() + 1;
        let effects = |e: &Effects| {
            e.order_no.capacity()
                + e.in_force.capacity() * size_of::<String>()
                + e.in_force.iter().map(String::capacity).sum::<usize>()
                + e.entries.capacity() * size_of::<Evidence>()
                + e.entries.iter().map(|x| x.effect_id.capacity()).sum::<usize>()
        };
        self.by_request.capacity() * slot
            + self.by_request.iter().map(|(id, e)| id.capacity() + effects(e)).sum::<usize>()
    }
}

/// Pushes one item, growing the vector by one: most request ids have one effect and one entry,
/// and a vector's first push would otherwise reserve room for four.
fn push_one<T>(items: &mut Vec<T>, item: T) {
    items.reserve_exact(1);
    items.push(item);
}

/// A mismatch between a ledger and the saga table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// An effect in force under a request id no saga owns.
    Orphan,
    /// More than one effect in force under one saga's request id (a double deduction).
    DoubleEffect,
    /// A DONE saga without its effect.
    MissingEffect,
    /// A ROLLED_BACK saga whose effect is still in force.
    EffectAfterRollback,
}

impl FindingKind {
    pub const ALL: [FindingKind; 4] =
        [FindingKind::Orphan, FindingKind::DoubleEffect, FindingKind::MissingEffect, FindingKind::EffectAfterRollback];

    pub const fn as_str(self) -> &'static str {
        match self {
            FindingKind::Orphan => "orphan",
            FindingKind::DoubleEffect => "double_effect",
            FindingKind::MissingEffect => "missing_effect",
            FindingKind::EffectAfterRollback => "effect_after_rollback",
        }
    }
}

/// The rule. `status` is the owning saga's (`None`: no saga owns the request id); `settled`
/// says the saga's row last changed before the ledger was read, so its effects (or their undo)
/// must be in what was read. Rows changing during the pass are only judged on what can never
/// be right: two effects in force under one request id.
pub fn classify(status: Option<Status>, settled: bool, in_force: usize) -> Option<FindingKind> {
    match status {
        None => (in_force > 0).then_some(FindingKind::Orphan),
        Some(_) if in_force > 1 => Some(FindingKind::DoubleEffect),
        Some(Status::Done) if settled && in_force == 0 => Some(FindingKind::MissingEffect),
        Some(Status::RolledBack) if settled && in_force > 0 => Some(FindingKind::EffectAfterRollback),
        Some(_) => None,
    }
}

/// What a finding is about, stable across runs: a resolved ticket is reopened only when it changes.
pub fn fingerprint(kind: FindingKind, in_force: &[String]) -> String {
    let ids: BTreeSet<&str> = in_force.iter().map(String::as_str).collect();
    format!("{}:{}", kind.as_str(), ids.into_iter().collect::<Vec<_>>().join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use FindingKind::*;
    use Status::*;

    fn entry(seq: u64, kind: LedgerKind, request_id: &str, effect_id: &str) -> LedgerEntry {
        LedgerEntry {
            seq,
            kind,
            request_id: request_id.into(),
            order_no: "O-1".into(),
            effect_id: effect_id.into(),
            at_ms: 0,
        }
    }

    #[test]
    fn fold_counts_effects_in_force() {
        let mut ledger = Ledger::default();
        ledger.fold(&[
            entry(1, LedgerKind::Apply, "a", "L1"),
            entry(2, LedgerKind::Apply, "b", "L2"),
            entry(3, LedgerKind::Undo, "b", "L2"),
            entry(4, LedgerKind::Tombstone, "c", ""),
            entry(5, LedgerKind::Apply, "d", "L5"),
            entry(6, LedgerKind::Apply, "d", "L6"),
            entry(7, LedgerKind::Reject, "e", ""),
        ]);
        let counts: Vec<usize> = ["a", "b", "c", "d", "e", "zz"].iter().map(|id| ledger.in_force(id)).collect();
        assert_eq!(counts, vec![1, 0, 0, 2, 0, 0]);
        assert_eq!((ledger.entries, ledger.by_request["d"].order_no.as_str()), (7, "O-1"));
    }

    #[test]
    fn the_fold_marks_owned_ids_it_saw_and_keeps_evidence_without_the_ids() {
        let mut ledger = Ledger::default();
        ledger.fold(&[entry(1, LedgerKind::Apply, "a", "L1"), entry(2, LedgerKind::Reject, "b", "")]);
        ledger.own("a");
        ledger.own("never-seen");
        let owned: Vec<(&str, bool)> = ["a", "b"].iter().map(|id| (*id, ledger.by_request[*id].owned)).collect();
        assert_eq!(owned, [("a", true), ("b", false)]);
        assert!(!ledger.by_request.contains_key("never-seen"), "a saga's id alone adds nothing");
        let kept = &ledger.by_request["a"].entries;
        assert_eq!(kept, &[Evidence { seq: 1, kind: LedgerKind::Apply, effect_id: "L1".into(), at_ms: 0 }]);
    }

    /// What a pass holds per ledger entry in the common case (one lock or shipment per request
    /// id), counted from capacities. The process's own growth, allocator included, is measured
    /// by `benches/ledger_memory.rs` (BENCHMARKS.md).
    #[test]
    fn a_hundred_thousand_entries_of_the_common_kind_cost_a_pass_at_most_340_heap_bytes_each() {
        const N: u64 = 100_000;
        let mut ledger = Ledger::default();
        // Ids as long as the driver's request ids and the mock's lock ids.
        let entries: Vec<LedgerEntry> = (0..N)
            .map(|n| entry(n + 1, LedgerKind::Apply, &format!("mf-wms-{n:032x}"), &format!("LCK{n:012}")))
            .collect();
        ledger.fold(&entries);
        let per_entry = ledger.heap_bytes() as f64 / N as f64;
        eprintln!(
            "{per_entry:.0} heap bytes a ledger entry ({N} entries, map capacity {})",
            ledger.by_request.capacity()
        );
        assert!(per_entry <= 340.0, "{per_entry:.0} bytes an entry");
        assert!(ledger.by_request.values().all(|e| e.in_force.capacity() == 1 && e.entries.capacity() == 1));
    }

    #[test]
    fn classification_table() {
        // (owner status, settled, effects in force) -> finding
        let table: &[(Option<Status>, bool, usize, Option<FindingKind>)] = &[
            (None, true, 0, None),
            (None, false, 1, Some(Orphan)),
            (None, true, 2, Some(Orphan)),
            (Some(Done), true, 1, None),
            (Some(Done), true, 0, Some(MissingEffect)),
            (Some(Done), false, 0, None),
            (Some(Done), false, 2, Some(DoubleEffect)),
            (Some(RolledBack), true, 0, None),
            (Some(RolledBack), true, 1, Some(EffectAfterRollback)),
            (Some(RolledBack), false, 1, None),
            (Some(WmsRequested), true, 1, None),
            (Some(WmsRequested), true, 2, Some(DoubleEffect)),
            (Some(ManualReview), true, 0, None),
            (Some(ManualReview), true, 1, None),
        ];
        for &(status, settled, in_force, expected) in table {
            assert_eq!(
                classify(status, settled, in_force),
                expected,
                "{status:?} settled={settled} in_force={in_force}"
            );
        }
    }

    #[test]
    fn fingerprint_ignores_order() {
        let a = fingerprint(DoubleEffect, &["L2".into(), "L1".into()]);
        assert_eq!(a, fingerprint(DoubleEffect, &["L1".into(), "L2".into()]));
        assert_eq!(a, "double_effect:L1,L2");
    }
}
