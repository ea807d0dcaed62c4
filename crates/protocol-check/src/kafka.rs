//! Kafka and the consumers' inbox step: fetch, make the RECEIVED row durable, commit the
//! offset; plus the group coordinator's rebalance and what a crash does to a consumer.
//!
//! The rule under test (docs/design.md, "Offsets: committed once the RECEIVED row is durable"):
//! the offset is committed only once the RECEIVED row is durable, because the table, not the
//! offset, is the record of work. Planted bug (c) swaps the two steps. A redelivered message
//! whose row exists is left alone if the row is terminal or leased, and taken over (epoch
//! bumped) if its lease has expired.

use midflight_model::{Lease, Saga, Source};

use crate::drive;
use crate::model::{Action, DEADLINE_MS, ProtocolModel};
use crate::state::{Driver, Fetched, Row, Seen, Snapshot, State, Task};

/// The topic the model's messages come from (one partition).
const TOPIC: &str = "orders";

pub fn progress_actions(model: &ProtocolModel, state: &State, out: &mut Vec<Action>) {
    let bug = model.config.bugs.commit_before_insert;
    for c in Driver::CONSUMERS {
        let Some(consumer) = state.consumer(c) else { continue };
        match consumer.fetched {
            None if state.kafka.owner == c && consumer.position < state.messages() => {
                out.push(if bug { Action::PollCommit(c) } else { Action::PollInsert(c) });
            }
            None => {}
            Some(f) if !f.committed => out.push(Action::Commit(c)),
            Some(_) => out.push(Action::Insert(c)),
        }
    }
}

/// Fetches the message at the consumer's position. A crash between the fetch and the next
/// step loses nothing (the position is memory), so the fetch is fused with that step.
pub fn poll(state: &mut State, c: Driver) {
    if let Some(consumer) = state.consumer_mut(c) {
        consumer.fetched = Some(Fetched { msg: consumer.position, inserted: false, committed: false });
        consumer.position += 1;
    }
}

/// Insert-if-absent of the RECEIVED row, leased to `c` at epoch 1; or a takeover of an
/// abandoned row; or nothing.
pub fn insert(model: &ProtocolModel, state: &mut State, c: Driver) {
    let Some(fetched) = state.consumer(c).and_then(|consumer| consumer.fetched) else { return };
    let msg = fetched.msg;
    match state.row(msg) {
        None => insert_fresh(model, state, c, msg),
        Some(row) => {
            let abandoned = !row.saga.status.is_terminal() && !row.lease_live;
            // The consumer's in-flight set: it never drives one saga twice.
            if abandoned && state.task(c, msg).is_none() {
                drive::takeover(state, c, msg);
            }
        }
    }
    finish_fetched(state, c, Fetched { inserted: true, ..fetched });
}

fn insert_fresh(model: &ProtocolModel, state: &mut State, c: Driver, msg: u8) {
    let Some(event) = model.event(msg) else { return };
    let now_ms = ProtocolModel::now_ms(state);
    let source = Source { topic: TOPIC.to_owned(), partition: 0, offset: i64::from(msg) };
    let mut saga = Saga::received(event, source, now_ms, DEADLINE_MS);
    // The store's insert leases a fresh row to its inserter at epoch 1 (lease expiry is the
    // `lease_live` flag, so `until_ms` stays 0).
    saga.lease = Lease { owner_id: Some(c.owner_id().to_owned()), epoch: 1, until_ms: 0 };
    let snapshot = Snapshot::new(saga);
    if let Some(slot) = state.rows.get_mut(usize::from(msg)) {
        *slot = Some(Row { saga: snapshot.clone(), lease_live: true });
    }
    state.set_task(c, msg, Some(Task { row: snapshot, seen: Seen::Nothing, waiting: None, key: 0 }));
}

/// Commits the offset past the fetched message, if `c` still owns the partition. A refused
/// commit ends the consumer's work on that fetch: the new owner reads it again.
pub fn commit(state: &mut State, c: Driver) {
    let Some(fetched) = state.consumer(c).and_then(|consumer| consumer.fetched) else { return };
    if state.kafka.owner != c {
        if let Some(consumer) = state.consumer_mut(c) {
            consumer.fetched = None;
        }
        return;
    }
    state.kafka.committed = state.kafka.committed.max(fetched.msg + 1);
    finish_fetched(state, c, Fetched { committed: true, ..fetched });
}

fn finish_fetched(state: &mut State, c: Driver, fetched: Fetched) {
    if let Some(consumer) = state.consumer_mut(c) {
        consumer.fetched = (!(fetched.inserted && fetched.committed)).then_some(fetched);
    }
}

/// A rebalance: the partition moves to the other consumer, which starts from the committed
/// offset with a clean fetch state. The evicted consumer keeps driving the sagas it holds (the
/// row's lease, not the partition, decides who drives), but can no longer commit.
pub fn evict(state: &mut State, c: Driver) {
    let heir = c.other();
    state.kafka.owner = heir;
    let committed = state.kafka.committed;
    if let Some(consumer) = state.consumer_mut(heir) {
        consumer.position = committed;
        consumer.fetched = None;
    }
}

/// A crashed consumer forgets its fetch; if it owned the partition it restarts from the
/// committed offset (it rejoins and gets the partition back; a rebalance is `Evict`).
pub fn crash(state: &mut State, driver: Driver) {
    let committed = state.kafka.committed;
    let owns = state.kafka.owner == driver;
    if let Some(consumer) = state.consumer_mut(driver) {
        consumer.fetched = None;
        if owns {
            consumer.position = committed;
        }
    }
}
