//! What the consumer has done, as plain atomic counters: cheap to bump on the hot path, read
//! by tests and benchmarks through [`Counters::snapshot`], and exported as metrics later
//! (one field, one metric).

use std::sync::atomic::{AtomicU64, Ordering};

use midflight_driver::Outcome;
use midflight_model::Status;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Live counters, shared by the pipeline, the sagas, the rebalance callbacks and the relay.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// The counters at one instant.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl Snapshot {
            /// Every counter with its field name, in declaration order: what the metrics export.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

counters! {
    /// Messages taken from Kafka.
    received,
    /// Errors the Kafka client reported instead of a message (fetch and broker trouble,
    /// which it retries by itself, or a message it could not decode); each is logged, at most
    /// one line per 5 s.
    kafka_errors,
    /// Poison messages parked (and copied to the dead-letter topic).
    parked,
    /// Of `parked`, those whose dead-letter copy can never be delivered (too large for the
    /// producer or the topic, the topic missing or not writable): the row is the only copy.
    dead_letter_failed,
    /// Batches made durable in the inbox.
    batches,
    /// Messages whose row was new: this process drives them.
    fresh,
    /// Of `fresh`, the sagas whose first step the inbox transaction wrote (`open_in_inbox`).
    opened,
    /// Redelivered messages left alone: row terminal or leased by a live owner.
    skipped,
    /// Redelivered messages dropped because this process is driving them already.
    duplicates_in_flight,
    /// Redelivered messages whose row cannot be read (a value no saga can have): left, as the
    /// recovery scan leaves it, for a person to repair; the message is in the row.
    unreadable,
    /// Redelivered messages with an expired lease, handed to the claim path.
    claims,
    /// Claims someone else won (or that found the row no longer claimable).
    claims_lost,
    /// Sagas finished DONE by this process.
    done,
    /// Sagas finished ROLLED_BACK.
    rolled_back,
    /// Sagas finished MANUAL_REVIEW.
    manual_review,
    /// Sagas finished PARKED by the driver (payload invalid on resume).
    parked_by_driver,
    /// Sagas that wait (backoff, or an earlier saga of their order) with their lease released.
    handed_off,
    /// Sagas whose CAS failed: another owner has them.
    lost,
    /// Sagas stopped at a durable point by shutdown.
    stopped,
    /// Sagas whose drive failed on the store; their lease expires and recovery resumes them.
    failed,
    /// Drives that panicked or were abandoned at the shutdown deadline; their leases expire.
    aborted,
    /// Sagas accepted and not yet ended (running or queued behind their order): a gauge.
    in_flight,
    /// Times the consumer stopped taking messages because `in_flight_max` was reached.
    stalls,
    /// Times the partitions were paused because the consumer stayed at `in_flight_max`
    /// longer than `pause_after_ms`.
    pauses,
    /// Offset commits sent (librdkafka reports the outcome of an asynchronous commit only
    /// through its log: a failure is logged as COMMITFAIL).
    commits,
    /// Offset commits refused at once (a later commit carries the same or newer offsets).
    commit_failures,
    /// Partitions currently assigned: a gauge.
    partitions_assigned,
    /// Partitions ever revoked from this process.
    partitions_revoked,
    /// Notifications published by the relay.
    published,
    /// Of `published`, those of sagas this process finished, handed to the relay with their
    /// rows claimed at insert; the rest were found by its scans (rows written by the recovery
    /// worker or an operator, or left by a relay that stopped).
    relay_handed,
    /// Notifications the relay could not publish (retried after the claim expires).
    publish_failures,
    /// Finished sagas whose notification key found the relay's handoff full (`HANDOFF_MAX`
    /// keys waiting): the row, claimed at insert, is published by a scan once its short claim
    /// runs out (`HANDOFF_CLAIM_MS`, 5 s).
    relay_handoffs_dropped,
    /// Handed rows whose delivery outlasted a quarter of their short claim, claimed for
    /// `consumer.relay.claim_ms` meanwhile.
    relay_claims_extended,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(counter: &AtomicU64, value: u64) {
        counter.store(value, Ordering::Relaxed);
    }

    /// Counts how a drive ended.
    pub(crate) fn ended(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Finished(Status::Done) => &self.done,
            Outcome::Finished(Status::RolledBack) => &self.rolled_back,
            Outcome::Finished(Status::ManualReview) => &self.manual_review,
            Outcome::Finished(_) => &self.parked_by_driver,
            Outcome::Lost => &self.lost,
            Outcome::HandedOff => &self.handed_off,
            Outcome::Stopped => &self.stopped,
            Outcome::Failed(_) => &self.failed,
        };
        Counters::add(counter, 1);
    }
}

impl Snapshot {
    /// Sagas that ended in a terminal status in this process.
    pub fn finished(&self) -> u64 {
        self.done + self.rolled_back + self.manual_review + self.parked_by_driver
    }
}
