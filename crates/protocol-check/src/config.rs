//! What one model-checking run explores: how many messages, how many faults of each kind, and
//! which planted bugs are switched on.
//!
//! Every fault is bounded by a named budget so the state space is finite and the doc can say
//! exactly what was proven: "for every interleaving with at most N crashes, ...". The planted
//! bugs are flags so that the same model, with one line changed, shows the checker is not
//! vacuous: each bug must produce a counterexample.

/// Fault budgets: how many times each fault may happen in one behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Process crashes (consumer or recovery worker): local state lost, connections dropped.
    pub crashes_max: u8,
    /// Rebalances: the group coordinator evicts the partition's owner and hands the partition
    /// to the other consumer, which resumes from the committed offset.
    pub evictions_max: u8,
    /// Packets (WMS requests or responses) lost by the network.
    pub drops_max: u8,
    /// Timeouts that fire while the request or its response is still in flight (a slow
    /// network): the request may still land later, unanswered.
    pub early_timeouts_max: u8,
    /// Pauses: a driver stalls past its lease (GC pause, stop-the-world, VM migration) and
    /// resumes later as a zombie holding a stale row and epoch.
    pub pauses_max: u8,
    /// Faults of all kinds together, to keep the larger variants affordable.
    pub faults_max: u8,
}

impl Bounds {
    /// One of each fault: enough for every planted bug, and small enough for a fast check.
    pub const ONE_EACH: Bounds =
        Bounds { crashes_max: 1, evictions_max: 1, drops_max: 1, early_timeouts_max: 1, pauses_max: 1, faults_max: 5 };
}

/// Planted bugs. Each one, alone, must make the checker find a counterexample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bugs {
    /// (a) Transitions are written with `UPDATE ... WHERE biz_id = ?`: no version or epoch check.
    pub blind_writes: bool,
    /// (b) The WMS answers NOTHING_TO_REVERSE to a reversal of an unknown request id and
    /// records nothing, so a late lock can still land after the rollback.
    pub no_tombstone: bool,
    /// (c) The consumer commits the Kafka offset before the RECEIVED row is durable.
    pub commit_before_insert: bool,
    /// (d) After a LockStock timeout the driver resends at once under a new request id (what
    /// the incident did) instead of recording the unknown outcome and asking the WMS.
    pub resend_new_key: bool,
}

/// One run of the checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Messages produced to the (single) partition, each a distinct order (1 or 2).
    pub messages: u8,
    pub bounds: Bounds,
    pub bugs: Bugs,
    /// The WMS may reject a lock (out of stock): the business-rejection rollback path.
    pub wms_may_reject: bool,
    /// The clock may pass the sagas' deadline: the deadline rollback paths, and the only way
    /// the careful planner reverses an unknown outcome (which leaves a tombstone).
    pub deadline_may_pass: bool,
}

impl Config {
    /// Most messages the model supports: a driver holds one task slot per message.
    pub const MESSAGES_MAX: u8 = 2;

    /// The correct protocol, one message, one fault of each kind.
    pub fn one_message() -> Config {
        Config {
            messages: 1,
            bounds: Bounds::ONE_EACH,
            bugs: Bugs::default(),
            wms_may_reject: true,
            deadline_may_pass: true,
        }
    }

    pub fn with_bugs(self, bugs: Bugs) -> Config {
        Config { bugs, ..self }
    }
}
