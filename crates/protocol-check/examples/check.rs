//! Runs the protocol model with bounds chosen on the command line and prints the state counts,
//! for runs too large for `cargo test` (docs/protocol-check.md records the numbers).
//!
//! `cargo run --release -p midflight-protocol-check --example check -- [messages] [faults_max]`

use std::time::Instant;

use midflight_protocol_check::{Bounds, Config, ProtocolModel};
use stateright::{Checker, Model};

fn main() {
    let args: Vec<u8> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let messages = args.first().copied().unwrap_or(1);
    let faults_max = args.get(1).copied().unwrap_or(5);
    let bounds = Bounds { faults_max, ..Bounds::ONE_EACH };
    let config = Config { messages, bounds, ..Config::one_message() };
    let start = Instant::now();
    let checker = ProtocolModel::new(config).checker().threads(2).spawn_bfs().join();
    println!(
        "{messages} message(s), <= {faults_max} faults: {} unique states ({} generated), max depth {}, {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    checker.assert_properties();
    println!("no property violated; every \"sometimes\" case reached");
}
