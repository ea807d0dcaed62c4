//! What the downstream ledgers say is in effect: for each request id and each order, the
//! effects (locks, shipments) applied and not undone. A reversal or cancellation names the
//! effect it undid by its downstream id, so two locks under one request id (the legacy WMS)
//! are told apart.

use std::collections::BTreeMap;

use midflight_api::client::{LedgerEntry, LedgerKind};

/// Effects in force, by request id and by order number.
#[derive(Debug, Clone, Default)]
pub struct Effects {
    /// request_id -> effect ids (lock ids, tracking numbers) applied and not undone.
    pub by_request: BTreeMap<String, Vec<String>>,
    /// order_no -> effect ids in force.
    pub by_order: BTreeMap<String, Vec<String>>,
    /// request_id -> effects made under it, undone or not: a second one is the effect made
    /// again, even if only one (or none) is in force at the end.
    pub applied: BTreeMap<String, usize>,
    /// request ids that were applied after being tombstoned (a tombstone that did not hold).
    pub applied_after_tombstone: Vec<String>,
}

impl Effects {
    pub fn in_force(&self, request_id: &str) -> usize {
        self.by_request.get(request_id).map_or(0, Vec::len)
    }

    /// Effects made under `request_id`, undone or not.
    pub fn applied(&self, request_id: &str) -> usize {
        self.applied.get(request_id).copied().unwrap_or(0)
    }
}

/// Replays a ledger in sequence order.
pub fn replay(ledger: &[LedgerEntry]) -> Effects {
    let mut entries: Vec<&LedgerEntry> = ledger.iter().collect();
    entries.sort_by_key(|e| e.seq);
    let mut effects = Effects::default();
    let mut order_of: BTreeMap<&str, &str> = BTreeMap::new();
    let mut tombstoned: BTreeMap<&str, bool> = BTreeMap::new();
    for entry in entries {
        match entry.kind {
            LedgerKind::Apply => {
                if tombstoned.get(entry.request_id.as_str()).copied().unwrap_or(false) {
                    effects.applied_after_tombstone.push(entry.request_id.clone());
                }
                *effects.applied.entry(entry.request_id.clone()).or_default() += 1;
                effects.by_request.entry(entry.request_id.clone()).or_default().push(entry.effect_id.clone());
                effects.by_order.entry(entry.order_no.clone()).or_default().push(entry.effect_id.clone());
                order_of.insert(&entry.effect_id, &entry.order_no);
            }
            LedgerKind::Undo => {
                let undone = if entry.effect_id.is_empty() {
                    effects.by_request.get(&entry.request_id).and_then(|ids| ids.first().cloned())
                } else {
                    Some(entry.effect_id.clone())
                };
                if let Some(id) = undone {
                    if let Some(ids) = effects.by_request.get_mut(&entry.request_id)
                        && ids.contains(&id)
                    {
                        ids.retain(|x| *x != id);
                    }
                    let order =
                        order_of.get(id.as_str()).map(|o| o.to_string()).unwrap_or_else(|| entry.order_no.clone());
                    if let Some(ids) = effects.by_order.get_mut(&order) {
                        ids.retain(|x| *x != id);
                    }
                }
            }
            LedgerKind::Tombstone => {
                tombstoned.insert(&entry.request_id, true);
            }
            LedgerKind::Reject => {}
        }
    }
    effects
}

/// Effects in force per order number, for runs without a saga table (the legacy design).
pub fn effects_by_order(ledger: &[LedgerEntry]) -> BTreeMap<String, usize> {
    replay(ledger).by_order.into_iter().map(|(order, ids)| (order, ids.len())).collect()
}
