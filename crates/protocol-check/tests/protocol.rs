//! The correct protocol, checked exhaustively within its bounds: no safety or liveness
//! property is violated, and every "sometimes" case is reached (so the faults did bite).
//! Each run prints its state counts; docs/protocol-check.md records them.

use std::time::Instant;

use midflight_protocol_check::{Bounds, Config, ProtocolModel, properties, search, trace};
use stateright::{Checker, Model};

/// Checker threads: the CI box has two cores.
const THREADS: usize = 2;

fn check(label: &str, config: Config) {
    let start = Instant::now();
    let checker = ProtocolModel::new(config).checker().threads(THREADS).spawn_bfs().join();
    println!(
        "{label}: {} unique states ({} generated), max depth {}, {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    checker.assert_properties();
}

/// Every behaviour of one message with at most one crash, one rebalance, one lost packet, one
/// early timeout and one pause, in any combination and order.
#[test]
fn one_message_survives_one_fault_of_each_kind() {
    check("1 message, one fault of each kind (<=5)", Config::one_message());
}

/// Two orders in one partition (offsets, redelivery of a half-committed batch), any one fault.
#[test]
fn two_messages_survive_any_single_fault() {
    let bounds = Bounds { faults_max: 1, ..Bounds::ONE_EACH };
    check("2 messages, <=1 fault", Config { messages: 2, bounds, ..Config::one_message() });
}

/// The full runs prove each interesting case is reachable; this prints a short example of each
/// (from a small search) so a person can see how it happens.
#[test]
fn interesting_cases_have_short_examples() {
    let config = Config { bounds: Bounds { faults_max: 2, ..Bounds::ONE_EACH }, ..Config::one_message() };
    for property in [
        properties::ZOMBIE_REFUSED,
        properties::TOMBSTONE_USED,
        properties::TAKEOVER_DURING_RPC,
        properties::ROLLED_BACK,
        properties::DONE,
    ] {
        let Some(found) = search::first_discovery(config, property) else {
            panic!("no example of \"{property}\" within {:?}", config.bounds);
        };
        println!("example, {property}:\n{}", trace::render(&found.path));
    }
}
