//! What must hold in every reachable state, and what must be reachable at all.
//!
//! Safety ("always") properties are the product's invariants (ARCHITECTURE.md I1, I3, I4) read off
//! the ghost counters. Liveness (I2, "every message ends terminal once faults stop") is stated
//! as an `always` over *quiescent* states, those where no progress action is enabled: if
//! the system ever stops by itself, every produced message has a terminal row. Together with
//! the absence of progress-only cycles (argued in docs/protocol-check.md) this is "eventually
//! terminal once faults stop". stateright's own `eventually` is not used because it is unsound
//! on cycles and DAG joins (see the FIXMEs in its bfs.rs), and this model has both.
//!
//! The "sometimes" properties prove the interesting cases were reached, so a green run is not
//! green because the faults never bit.

use midflight_model::Status;
use stateright::Property;

use crate::model::ProtocolModel;
use crate::state::{Notable, Shipment, State};

pub const AT_MOST_ONE_LOCK: &str = "at most one effective WMS lock per order";
pub const ROLLED_BACK_CLEAN: &str = "ROLLED_BACK means no effective lock and no live shipment";
pub const DONE_COMPLETE: &str = "DONE means exactly one lock and one shipment";
pub const NO_STALE_WRITE: &str = "no write under a stale epoch (or out of a terminal status) is accepted";
pub const PLANNER_LEGAL: &str = "the planner proposes only legal changes, calls leave only from their intent";
pub const QUIESCENT_TERMINAL: &str = "when the system stops by itself, every message has a terminal row";
pub const ZOMBIE_REFUSED: &str = "a zombie's write is refused";
pub const TOMBSTONE_USED: &str = "a reversal arrived before its lock (the tombstone refused the lock)";
pub const TAKEOVER_DURING_RPC: &str = "a takeover happened while a WMS call was in flight";
pub const ROLLED_BACK: &str = "a saga is rolled back";
pub const DONE: &str = "a saga is done";

pub fn all() -> Vec<Property<ProtocolModel>> {
    vec![
        Property::always(AT_MOST_ONE_LOCK, |_, s: &State| (0..s.messages()).all(|m| s.effective_locks(m) <= 1)),
        Property::always(ROLLED_BACK_CLEAN, |_, s: &State| (0..s.messages()).all(|m| rolled_back_clean(s, m))),
        Property::always(DONE_COMPLETE, |_, s: &State| (0..s.messages()).all(|m| done_complete(s, m))),
        Property::always(NO_STALE_WRITE, |_, s: &State| !s.ghost.stale_write_accepted && !s.ghost.terminal_overwritten),
        Property::always(PLANNER_LEGAL, |_, s: &State| !s.ghost.illegal_change && !s.ghost.call_without_intent),
        Property::always(QUIESCENT_TERMINAL, |model, s: &State| !model.is_quiescent(s) || all_terminal(s)),
        Property::sometimes(ZOMBIE_REFUSED, |_, s: &State| s.last == Some(Notable::ZombieRefused)),
        Property::sometimes(TOMBSTONE_USED, |_, s: &State| s.last == Some(Notable::TombstoneRefusedLock)),
        Property::sometimes(TAKEOVER_DURING_RPC, |_, s: &State| s.last == Some(Notable::TakeoverDuringRpc)),
        Property::sometimes(ROLLED_BACK, |_, s: &State| any_status(s, Status::RolledBack)),
        Property::sometimes(DONE, |_, s: &State| any_status(s, Status::Done)),
    ]
}

fn status(state: &State, msg: u8) -> Option<Status> {
    state.row(msg).map(|row| row.saga.status)
}

fn rolled_back_clean(state: &State, msg: u8) -> bool {
    status(state, msg) != Some(Status::RolledBack)
        || (state.effective_locks(msg) == 0 && state.shipment(msg) != Some(Shipment::Created))
}

fn done_complete(state: &State, msg: u8) -> bool {
    status(state, msg) != Some(Status::Done)
        || (state.effective_locks(msg) == 1 && state.shipment(msg) == Some(Shipment::Created))
}

/// Every produced message has a row, and the row is terminal.
pub fn all_terminal(state: &State) -> bool {
    (0..state.messages()).all(|m| status(state, m).is_some_and(Status::is_terminal))
}

fn any_status(state: &State, wanted: Status) -> bool {
    (0..state.messages()).any(|m| status(state, m) == Some(wanted))
}
