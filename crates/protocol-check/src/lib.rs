//! A model of the midflight protocol, checked exhaustively with stateright.
//!
//! Two consumers, a recovery worker, a Kafka group coordinator, the saga table with its CAS,
//! a WMS with tombstones and a lossy, reordering network, under bounded crashes, rebalances,
//! packet losses, early timeouts and pauses. Every driver decision is the real planner's
//! ([`midflight_model::plan`], [`midflight_model::Change::apply`]): this crate owns only the
//! environment, never a copy of the rules. It exists to show the protocol keeps ARCHITECTURE.md's
//! invariants under every interleaving within the bounds, and that four plausible mistakes
//! ([`Bugs`]) each break one of them. docs/protocol-check.md explains the abstractions, the
//! bounds and the measured state counts.

mod config;
mod downstream;
mod drive;
mod kafka;
mod model;
pub mod properties;
pub mod search;
mod state;
pub mod trace;

pub use config::{Bounds, Bugs, Config};
pub use model::{Action, DEADLINE_MS, NOW_AFTER_DEADLINE_MS, NOW_BEFORE_DEADLINE_MS, ProtocolModel};
pub use state::{Driver, Notable, Packet, State};
