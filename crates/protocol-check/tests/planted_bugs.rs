//! Each planted bug, alone, must make the checker find a counterexample to the property it
//! breaks. The counterexample is printed as a numbered list of actions with the state after
//! each, so a person can follow how the bug bites.

use midflight_protocol_check::properties::{AT_MOST_ONE_LOCK, NO_STALE_WRITE, QUIESCENT_TERMINAL, ROLLED_BACK_CLEAN};
use midflight_protocol_check::{Bounds, Bugs, Config, State, search, trace};

/// Small bounds keep the counterexamples short: BFS finds a shortest one first.
const BOUNDS: Bounds = Bounds { faults_max: 2, ..Bounds::ONE_EACH };

/// Runs the model with `bugs` until `property` has a counterexample; returns its last state.
fn counterexample(bugs: Bugs, property: &'static str) -> State {
    let config = Config { bounds: BOUNDS, ..Config::one_message() }.with_bugs(bugs);
    let Some(found) = search::first_discovery(config, property) else {
        panic!("{bugs:?}: no counterexample to \"{property}\" within {BOUNDS:?}");
    };
    let path = found.path;
    println!("{bugs:?} breaks \"{property}\" ({} states searched):\n{}", found.unique_states, trace::render(&path));
    println!("actions: {}", trace::actions(&path).join(" ; "));
    path.last_state().clone()
}

#[test]
fn blind_writes_let_a_zombie_overwrite_the_new_owner() {
    let last = counterexample(Bugs { blind_writes: true, ..Bugs::default() }, NO_STALE_WRITE);
    assert!(last.ghost.stale_write_accepted || last.ghost.terminal_overwritten);
}

#[test]
fn no_tombstone_lets_a_late_lock_land_after_the_rollback() {
    let last = counterexample(Bugs { no_tombstone: true, ..Bugs::default() }, ROLLED_BACK_CLEAN);
    assert_eq!(last.effective_locks(0), 1, "the late lock is in force");
}

#[test]
fn committing_before_the_row_is_durable_loses_the_message() {
    let last = counterexample(Bugs { commit_before_insert: true, ..Bugs::default() }, QUIESCENT_TERMINAL);
    assert!(last.row(0).is_none(), "no row: the message is gone");
    assert_eq!(last.kafka.committed, 1, "and its offset is committed");
}

#[test]
fn resending_under_a_new_key_deducts_twice() {
    let last = counterexample(Bugs { resend_new_key: true, ..Bugs::default() }, AT_MOST_ONE_LOCK);
    assert_eq!(last.effective_locks(0), 2);
}
