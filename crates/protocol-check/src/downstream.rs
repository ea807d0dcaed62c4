//! The downstreams as the careful contract describes them (and the mocks implement):
//! idempotent on the caller's request id, queryable by it, reversible, and a reversal of an
//! unknown id leaves a tombstone that refuses a later lock.
//!
//! The WMS is reached over the lossy network ([`crate::drive::deliver`]); the logistics
//! provider is ideal (synchronous, never loses a request, never rejects) to keep the state
//! space small: the protocol's hard case is the WMS step, and the logistics step uses the same
//! planner rules. Planted bug (b) removes the tombstone.

use crate::state::{LockState, LogisticsReply, Shipment, State, WmsCall, WmsReply};

/// What the WMS does with one request; returns its answer and whether a tombstone refused a lock.
pub fn wms(state: &mut State, msg: u8, key: u8, call: WmsCall, reject: bool, no_tombstone: bool) -> (WmsReply, bool) {
    let record = state.lock(msg, key);
    match call {
        WmsCall::Lock => lock(state, msg, key, record, reject),
        WmsCall::Query => (record.map_or(WmsReply::NotFound, reply_of), false),
        WmsCall::Reverse => (reverse(state, msg, key, record, no_tombstone), false),
    }
}

fn lock(state: &mut State, msg: u8, key: u8, record: Option<LockState>, reject: bool) -> (WmsReply, bool) {
    match record {
        // Idempotent: a repeat gets the first answer and deducts nothing.
        Some(existing) => (reply_of(existing), existing == LockState::Tombstoned),
        None if reject => {
            state.set_lock(msg, key, LockState::Rejected);
            (WmsReply::Rejected, false)
        }
        None => {
            state.set_lock(msg, key, LockState::Locked);
            (WmsReply::Locked, false)
        }
    }
}

fn reverse(state: &mut State, msg: u8, key: u8, record: Option<LockState>, no_tombstone: bool) -> WmsReply {
    match record {
        None if no_tombstone => WmsReply::NothingToReverse,
        None => {
            state.set_lock(msg, key, LockState::Tombstoned);
            WmsReply::Tombstoned
        }
        Some(LockState::Locked) => {
            state.set_lock(msg, key, LockState::Reversed);
            WmsReply::Reversed
        }
        Some(LockState::Rejected) => WmsReply::NothingToReverse,
        Some(LockState::Reversed) => WmsReply::Reversed,
        Some(LockState::Tombstoned) => WmsReply::Tombstoned,
    }
}

const fn reply_of(record: LockState) -> WmsReply {
    match record {
        LockState::Locked => WmsReply::Locked,
        LockState::Rejected => WmsReply::Rejected,
        LockState::Reversed => WmsReply::Reversed,
        LockState::Tombstoned => WmsReply::Tombstoned,
    }
}

/// CreateShipment: idempotent per order; refused by a tombstone.
pub fn create_shipment(state: &mut State, msg: u8) -> LogisticsReply {
    match state.shipment(msg) {
        None => {
            state.set_shipment(msg, Shipment::Created);
            LogisticsReply::Created
        }
        Some(existing) => shipment_reply(existing),
    }
}

pub fn query_shipment(state: &State, msg: u8) -> LogisticsReply {
    state.shipment(msg).map_or(LogisticsReply::NotFound, shipment_reply)
}

/// CancelShipment: cancels a live shipment, tombstones an unknown one.
pub fn cancel_shipment(state: &mut State, msg: u8) -> LogisticsReply {
    match state.shipment(msg) {
        None => {
            state.set_shipment(msg, Shipment::Tombstoned);
            LogisticsReply::Tombstoned
        }
        Some(Shipment::Created) => {
            state.set_shipment(msg, Shipment::Cancelled);
            LogisticsReply::Cancelled
        }
        Some(existing) => shipment_reply(existing),
    }
}

const fn shipment_reply(shipment: Shipment) -> LogisticsReply {
    match shipment {
        Shipment::Created => LogisticsReply::Created,
        Shipment::Cancelled => LogisticsReply::Cancelled,
        Shipment::Tombstoned => LogisticsReply::Tombstoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::model::ProtocolModel;
    use stateright::Model;

    /// A sequence of calls, each with "the WMS is out of stock" if it is a fresh lock.
    type Calls = &'static [(WmsCall, bool)];

    /// Applies `calls` in order to a fresh WMS and returns the answers and the final record.
    fn run(calls: &[(WmsCall, bool)], no_tombstone: bool) -> String {
        let model = ProtocolModel::new(Config::one_message());
        let Some(mut state) = model.init_states().into_iter().next() else { panic!("no initial state") };
        let answers: Vec<String> = calls
            .iter()
            .map(|&(call, reject)| format!("{:?}", wms(&mut state, 0, 0, call, reject, no_tombstone).0))
            .collect();
        format!("{} => {:?}", answers.join(" "), state.lock(0, 0))
    }

    #[test]
    fn wms_behaves_like_the_careful_mock() {
        use WmsCall::{Lock, Query, Reverse};
        let cases: &[(Calls, bool, &str)] = &[
            (&[(Query, false)], false, "NotFound => None"),
            (&[(Lock, false), (Lock, false)], false, "Locked Locked => Some(Locked)"),
            (&[(Lock, true), (Lock, false)], false, "Rejected Rejected => Some(Rejected)"),
            (&[(Lock, false), (Reverse, false), (Lock, false)], false, "Locked Reversed Reversed => Some(Reversed)"),
            (
                &[(Reverse, false), (Lock, false), (Query, false)],
                false,
                "Tombstoned Tombstoned Tombstoned => Some(Tombstoned)",
            ),
            (&[(Lock, true), (Reverse, false)], false, "Rejected NothingToReverse => Some(Rejected)"),
            // Planted bug (b): the empty reversal leaves nothing, so the late lock lands.
            (&[(Reverse, false), (Lock, false)], true, "NothingToReverse Locked => Some(Locked)"),
        ];
        for (calls, no_tombstone, expected) in cases {
            assert_eq!(run(calls, *no_tombstone), *expected, "calls {calls:?}, no_tombstone {no_tombstone}");
        }
    }
}
