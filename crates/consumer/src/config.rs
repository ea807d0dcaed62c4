//! The consumer's configuration: the shared sections (Kafka, database, downstream clients,
//! telemetry), the driver's timing, the downstream contracts (the rules are configuration, not
//! code), and the consumer's own limits. Every default says why it is what it is, and
//! [`ConsumerConfig::problems`] checks every field once, at start-up.

use midflight_config::{Config, DatabaseSection, GrpcClientSection, KafkaSection, RuntimeSection, TelemetrySection};
use midflight_driver::DriverSettings;
use midflight_model::Rules;
use midflight_service::ServiceConfig;
use serde::{Deserialize, Serialize};

/// Highest `in_flight_max`: every saga in flight holds its row and a task in memory (a few KiB),
/// so this caps the process at a few hundred MiB whatever the configuration says.
pub const IN_FLIGHT_CEILING: usize = 100_000;
/// Longest `pause_after_ms`: a rebalance may wait for the consumer's next poll this long.
pub const PAUSE_AFTER_MS_MAX: u64 = 10_000;
/// Most batches made durable at once.
pub const BATCHES_IN_FLIGHT_MAX: usize = 16;
/// Longest batch linger: every message of a batch waits up to this long before it is durable.
pub const BATCH_LINGER_MS_MAX: u64 = 1_000;
/// Longest graceful-shutdown wait: beyond a minute an orchestrator kills the process anyway.
pub const SHUTDOWN_DEADLINE_MS_MAX: u64 = 60_000;
/// Longest delivery timeout for dead-letter copies and notifications.
pub const DELIVERY_TIMEOUT_MS_MAX: u64 = 300_000;

/// Everything the consumer reads at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerConfig {
    pub consumer: ConsumerSection,
    pub kafka: KafkaSection,
    pub database: DatabaseSection,
    /// The WMS client (LockStock and friends).
    pub wms: GrpcClientSection,
    /// The logistics client (CreateShipment and friends).
    pub logistics: GrpcClientSection,
    pub telemetry: TelemetrySection,
    pub runtime: RuntimeSection,
    pub driver: DriverSettings,
    /// What each downstream promises; the planner's roll-forward / roll-back rules read it.
    pub rules: Rules,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            consumer: ConsumerSection::default(),
            kafka: KafkaSection::default(),
            database: DatabaseSection::default(),
            // The mock downstreams' default ports, so the local stack needs no settings.
            wms: GrpcClientSection::with_endpoint("http://127.0.0.1:50061"),
            logistics: GrpcClientSection::with_endpoint("http://127.0.0.1:50062"),
            telemetry: TelemetrySection::default(),
            runtime: RuntimeSection::default(),
            driver: DriverSettings::default(),
            rules: Rules::default(),
        }
    }
}

/// The consumer's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerSection {
    /// Names this process in logs and in the lease owner id. A random suffix is added at every
    /// start, so two incarnations of one instance never share an owner id (the inbox tells a
    /// fresh row from a redelivered one by its owner).
    pub instance: String,
    /// Most messages made durable in one inbox transaction. 256 turns 4,000 msg/s into about
    /// 16 inbox commits per second at full batches; the store caps a batch at 500 rows.
    pub batch_max: usize,
    /// How long a batch waits for more messages after its first one while an earlier batch is
    /// still being written. 0 (the default) writes it at once with the messages already
    /// fetched: batches still grow under load without a timer, because while
    /// `batches_in_flight` batches are being written no message is taken, and the next batch
    /// takes everything fetched meanwhile. At 300 msg/s on the benchmark box, 20 ms here
    /// doubled the p99 added latency (62-65 ms against 32-36) for 4% fewer write transactions
    /// per message (BENCHMARKS.md).
    pub batch_linger_ms: u64,
    /// The same wait when no batch is being written (default 0).
    pub batch_linger_idle_ms: u64,
    /// Batches being made durable at once. While one batch's inbox transaction runs, the next
    /// is gathered and written beside it instead of waiting its turn; offsets are still
    /// committed, and sagas started, in the order of the batches. 1 writes one batch at a time.
    pub batches_in_flight: usize,
    /// Sagas accepted (running or queued behind an earlier saga of their order) at once; at
    /// this bound the consumer stops taking messages, and a batch never takes more than the
    /// room left. 2,000 is 4,000 msg/s x 0.5 s per saga, the user's peak.
    pub in_flight_max: usize,
    /// The consumer takes messages again once sagas in flight drop to this. A gap below
    /// `in_flight_max` keeps it from stopping and starting on every finished saga, and its
    /// batches full.
    pub resume_below: usize,
    /// How long the consumer may stop taking messages at `in_flight_max` before it pauses its
    /// partitions. Until then the messages librdkafka has fetched wait in its queue and are
    /// taken at once when room comes back; a pause throws that queue away, and after a resume
    /// librdkafka fetches again only at its broker thread's next wake-up, up to a second later
    /// (measured: the peak's consumers ran dry after every resume, BENCHMARKS.md). While
    /// the consumer takes nothing, a rebalance waits for its next poll, so the stop is
    /// bounded, and the pause serves rebalances through a long stop (a slow downstream).
    /// 1 s is longer than the peak's stops on a 2-core box (the 500 sagas between
    /// `in_flight_max` and `resume_below` end in about half a second) and far below
    /// `kafka.max_poll_interval_ms`. 0 pauses at once.
    pub pause_after_ms: u64,
    /// A saga not finished this long after it was received rolls back while it still can (a
    /// customer's order should not hang for hours). 15 minutes covers the longest outage the
    /// retry policy rides out.
    pub saga_deadline_ms: i64,
    /// How long a graceful shutdown waits for running sagas to reach their next durable point
    /// (a call in flight is at most `driver.rpc_timeout_ms`) before abandoning them to
    /// recovery. 10 s is well inside a typical 30 s termination grace period.
    pub shutdown_deadline_ms: u64,
    /// `message.timeout.ms` of the producer of dead-letter copies and notifications: how long
    /// one delivery may take before it counts as failed. 10 s rides out a leader election.
    pub delivery_timeout_ms: u64,
    /// Apply pending migrations at start-up. They are versioned and idempotent, so a fresh
    /// local stack needs no separate step; turn off where a deploy job owns the schema.
    pub migrate_on_start: bool,
    /// Write a fresh saga's first step (its business row and WMS intent) in the inbox
    /// transaction that inserts it, unless an earlier saga of its order is still unfinished:
    /// one transaction fewer per saga, and its first call leaves as soon as the batch is
    /// durable. Off, the drive writes that step in a transaction of its own, like every other.
    pub open_in_inbox: bool,
    pub relay: RelaySection,
}

impl Default for ConsumerSection {
    fn default() -> Self {
        ConsumerSection {
            instance: "consumer".to_owned(),
            batch_max: 256,
            batch_linger_ms: 0,
            batch_linger_idle_ms: 0,
            batches_in_flight: 4,
            in_flight_max: 2_000,
            resume_below: 1_500,
            pause_after_ms: 1_000,
            saga_deadline_ms: 15 * 60_000,
            shutdown_deadline_ms: 10_000,
            delivery_timeout_ms: 10_000,
            migrate_on_start: true,
            open_in_inbox: true,
            relay: RelaySection::default(),
        }
    }
}

/// The outbox relay: publishes outbox rows to the notification topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySection {
    /// Run the relay in this process. Several relays may run (a claim is a CAS with an
    /// expiry). Only consumers run one: turned off here, notifications wait for a consumer
    /// whose relay is on.
    pub enabled: bool,
    /// Rows claimed and published per round.
    pub batch_max: usize,
    /// How long a claim protects rows from other relays. At least `delivery_timeout_ms` plus
    /// [`RELAY_CLAIM_MARGIN_MS`] (the wait for room in the producer's queue and the statements
    /// around a delivery), so a claim does not run out under a delivery still in progress,
    /// which another relay would then make again. The outbox rows of the sagas this process
    /// finishes are written with a shorter claim for its relay (5 s, so those of a process
    /// that dies wait at most that long for a scan), extended to this one when a delivery of
    /// them runs long.
    pub claim_ms: i64,
    /// How often the relay scans for rows nobody holds: written by the recovery worker or an
    /// operator, released by a relay that stopped, or whose claim ran out. The rows of the
    /// sagas this process finishes are handed to it at once and do not wait for a scan.
    pub idle_ms: u64,
    /// How long the relay gathers rows before a round that follows a wake-up or a round that
    /// was not full. Without it a relay under a steady load publishes a row or two per round,
    /// and every round costs the database two statements and a commit (a read of the rows
    /// handed to it and their mark; a scan's round costs four and two commits); a full round
    /// (`batch_max` rows) is followed at once. A notification waits at most this much longer.
    pub linger_ms: u64,
}

/// What a relay claim must last beyond `delivery_timeout_ms`: up to a second waiting for room
/// in the producer's queue, and the claimed rows' read and the mark, with room to spare.
pub const RELAY_CLAIM_MARGIN_MS: u64 = 5_000;

/// Producer settings `kafka.properties` may not change: the dead-letter copies and the
/// notifications are delivered at least once only by an idempotent producer waiting for every
/// in-sync replica (`acks=all`, which idempotence implies), within `consumer.delivery_timeout_ms`,
/// which the relay's claims and the batch retries are sized by.
pub const PRODUCER_FIXED: [&str; 5] =
    ["enable.idempotence", "acks", "request.required.acks", "message.timeout.ms", "delivery.timeout.ms"];

/// librdkafka properties the consumer sets itself, each with why `kafka.properties` may not:
/// its offsets are committed by hand, only up to messages whose rows are durable, and a group
/// new to the topic starts at its earliest message; the others have keys of their own.
pub const CONSUMER_FIXED: [(&str, &str); 9] = [
    ("enable.auto.commit", "offsets are committed only up to messages whose rows are durable"),
    ("enable.auto.offset.store", "offsets are committed only up to messages whose rows are durable"),
    ("auto.offset.reset", "a group new to the topic starts at its earliest message, so none is skipped"),
    ("bootstrap.servers", "set kafka.bootstrap_servers"),
    ("group.id", "set kafka.group_id"),
    ("group.instance.id", "set kafka.group_instance_id"),
    ("group.protocol", "set kafka.group_protocol"),
    ("session.timeout.ms", "set kafka.session_timeout_ms"),
    ("max.poll.interval.ms", "set kafka.max_poll_interval_ms"),
];

/// Longest relay linger: notifications are late by up to this.
pub const RELAY_LINGER_MS_MAX: u64 = 1_000;

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection { enabled: true, batch_max: 256, claim_ms: 30_000, idle_ms: 250, linger_ms: 50 }
    }
}

impl ConsumerSection {
    fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.instance.is_empty()
            || self.instance.len() > 64
            || !self.instance.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            problems
                .push(format!("{at}.instance must be 1..=64 characters of A-Z a-z 0-9 - _ ., got {:?}", self.instance));
        }
        let rows_max = midflight_store::BATCH_ROWS_MAX;
        if !(1..=rows_max).contains(&self.batch_max) {
            problems.push(format!(
                "{at}.batch_max must be in 1..={rows_max} (one inbox transaction), got {}",
                self.batch_max
            ));
        }
        if self.batch_linger_ms > BATCH_LINGER_MS_MAX {
            problems.push(format!(
                "{at}.batch_linger_ms must be at most {BATCH_LINGER_MS_MAX}, got {}",
                self.batch_linger_ms
            ));
        }
        if self.batch_linger_idle_ms > BATCH_LINGER_MS_MAX {
            problems.push(format!(
                "{at}.batch_linger_idle_ms must be at most {BATCH_LINGER_MS_MAX}, got {}",
                self.batch_linger_idle_ms
            ));
        }
        if !(1..=BATCHES_IN_FLIGHT_MAX).contains(&self.batches_in_flight) {
            problems.push(format!(
                "{at}.batches_in_flight must be in 1..={BATCHES_IN_FLIGHT_MAX} (each holds a database connection), got {}",
                self.batches_in_flight
            ));
        }
        if !(1..=IN_FLIGHT_CEILING).contains(&self.in_flight_max) {
            problems.push(format!("{at}.in_flight_max must be in 1..={IN_FLIGHT_CEILING}, got {}", self.in_flight_max));
        }
        if self.pause_after_ms > PAUSE_AFTER_MS_MAX {
            problems.push(format!(
                "{at}.pause_after_ms must be at most {PAUSE_AFTER_MS_MAX} (a rebalance waits that long), got {}",
                self.pause_after_ms
            ));
        }
        if self.resume_below >= self.in_flight_max {
            problems.push(format!(
                "{at}.resume_below ({}) must be below in_flight_max ({}), or the consumer never resumes",
                self.resume_below, self.in_flight_max
            ));
        }
        if self.saga_deadline_ms <= 0 {
            problems.push(format!("{at}.saga_deadline_ms must be positive"));
        }
        if !(1..=SHUTDOWN_DEADLINE_MS_MAX).contains(&self.shutdown_deadline_ms) {
            problems.push(format!("{at}.shutdown_deadline_ms must be in 1..={SHUTDOWN_DEADLINE_MS_MAX}"));
        }
        if !(1..=DELIVERY_TIMEOUT_MS_MAX).contains(&self.delivery_timeout_ms) {
            problems.push(format!("{at}.delivery_timeout_ms must be in 1..={DELIVERY_TIMEOUT_MS_MAX}"));
        }
        problems.extend(self.relay.problems(&format!("{at}.relay"), self.delivery_timeout_ms));
        problems
    }
}

impl RelaySection {
    fn problems(&self, at: &str, delivery_timeout_ms: u64) -> Vec<String> {
        let mut problems = Vec::new();
        let rows_max = midflight_store::BATCH_ROWS_MAX;
        if !(1..=rows_max).contains(&self.batch_max) {
            problems.push(format!("{at}.batch_max must be in 1..={rows_max}, got {}", self.batch_max));
        }
        if u64::try_from(self.claim_ms).unwrap_or(0) < delivery_timeout_ms.saturating_add(RELAY_CLAIM_MARGIN_MS) {
            problems.push(format!(
                "{at}.claim_ms ({}) must be at least delivery_timeout_ms ({delivery_timeout_ms}) plus {RELAY_CLAIM_MARGIN_MS}, so a claim outlives a delivery",
                self.claim_ms
            ));
        }
        if self.idle_ms == 0 {
            problems.push(format!("{at}.idle_ms must be positive (0 would spin on an empty outbox)"));
        }
        if self.linger_ms > RELAY_LINGER_MS_MAX {
            problems.push(format!("{at}.linger_ms must be at most {RELAY_LINGER_MS_MAX}, got {}", self.linger_ms));
        }
        problems
    }
}

impl Config for ConsumerConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.consumer.problems("consumer");
        problems.extend(self.kafka.problems("kafka"));
        problems.extend(self.database.problems("database"));
        problems.extend(self.wms.problems("wms"));
        problems.extend(self.logistics.problems("logistics"));
        problems.extend(self.telemetry.problems("telemetry"));
        problems.extend(self.runtime.problems("runtime"));
        problems.extend(self.driver.problems("driver"));
        problems.extend(
            self.driver.shutdown_wait_problem("consumer.shutdown_deadline_ms", self.consumer.shutdown_deadline_ms),
        );
        if self.consumer.pause_after_ms >= self.kafka.max_poll_interval_ms {
            problems.push(format!(
                "consumer.pause_after_ms ({}) must be below kafka.max_poll_interval_ms ({}): the consumer does not poll while it waits to pause, and would leave its group",
                self.consumer.pause_after_ms, self.kafka.max_poll_interval_ms
            ));
        }
        problems.extend(self.rules.wms.problems("rules.wms"));
        problems.extend(self.rules.logistics.problems("rules.logistics"));
        problems.extend(self.rules.retry.problems("rules.retry"));
        for key in self.kafka.properties.keys().filter(|key| PRODUCER_FIXED.contains(&key.as_str())) {
            problems.push(format!(
                "kafka.properties.{key} may not be set for the consumer: its producer delivers dead-letter copies and notifications idempotently, to every in-sync replica, within consumer.delivery_timeout_ms (set that instead of a timeout)"
            ));
        }
        for (key, why) in CONSUMER_FIXED.iter().filter(|(key, _)| self.kafka.properties.contains_key(*key)) {
            problems.push(format!("kafka.properties.{key} may not be set for the consumer: {why}"));
        }
        problems
    }
}

impl ServiceConfig for ConsumerConfig {
    fn telemetry(&self) -> &TelemetrySection {
        &self.telemetry
    }

    fn runtime(&self) -> &RuntimeSection {
        &self.runtime
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(ConsumerConfig::default().problems(), Vec::<String>::new());
    }

    #[test]
    fn the_shutdown_waits_longer_than_a_call() {
        let mut config = ConsumerConfig::default();
        (config.driver.rpc_timeout_ms, config.driver.lease_ms) = (20_000, 60_000);
        assert_eq!(
            config.problems(),
            [
                "consumer.shutdown_deadline_ms (10000) must be longer than driver.rpc_timeout_ms (20000): a drive in the middle of a call would be abandoned with its lease"
            ]
        );
    }

    #[test]
    fn every_bad_limit_is_named() {
        let mut config = ConsumerConfig::default();
        config.consumer.in_flight_max = 0;
        config.consumer.batch_max = 501;
        config.consumer.batches_in_flight = 0;
        config.consumer.relay.claim_ms = 5_000;
        config.consumer.relay.linger_ms = 5_000;
        config.runtime.worker_threads = 257;
        config.consumer.pause_after_ms = 10_001;
        config.kafka.max_poll_interval_ms = 10_000;
        let problems = config.problems();
        let text = problems.join("\n");
        assert!(text.contains("consumer.in_flight_max must be in 1..=100000, got 0"), "{text}");
        assert!(text.contains("consumer.resume_below (1500) must be below in_flight_max (0)"), "{text}");
        assert!(text.contains("consumer.batch_max must be in 1..=500"), "{text}");
        assert!(text.contains("consumer.batches_in_flight must be in 1..=16"), "{text}");
        assert!(
            text.contains("consumer.relay.claim_ms (5000) must be at least delivery_timeout_ms (10000) plus 5000"),
            "{text}"
        );
        assert!(text.contains("consumer.relay.linger_ms must be at most 1000, got 5000"), "{text}");
        assert!(text.contains("runtime.worker_threads must be at most 256 (0: one per core), got 257"), "{text}");
        assert!(
            text.contains("consumer.pause_after_ms must be at most 10000 (a rebalance waits that long), got 10001"),
            "{text}"
        );
        assert!(
            text.contains("consumer.pause_after_ms (10001) must be below kafka.max_poll_interval_ms (10000)"),
            "{text}"
        );
        assert_eq!(problems.len(), 9, "{text}");

        // A claim just longer than a delivery is not enough: the wait for the producer's
        // queue and the statements around it come on top.
        let mut config = ConsumerConfig::default();
        config.consumer.relay.claim_ms = 14_999;
        assert_eq!(config.problems().len(), 1, "{:?}", config.problems());
        config.consumer.relay.claim_ms = 15_000;
        assert_eq!(config.problems(), Vec::<String>::new());
    }

    /// The problems of the default configuration given `properties`, asserting that exactly
    /// those of `refused` (and no other) are named as not to be set.
    fn refusing(properties: &[(&str, &str)], refused: &[&str]) -> Vec<String> {
        let mut config = ConsumerConfig::default();
        for (key, value) in properties {
            config.kafka.properties.insert((*key).to_owned(), (*value).to_owned());
        }
        let problems = config.problems();
        assert_eq!(problems.len(), refused.len(), "{problems:?}");
        for key in refused {
            let refusal = format!("kafka.properties.{key} may not be set");
            assert!(problems.iter().any(|p| p.starts_with(&refusal)), "{problems:?}");
        }
        problems
    }

    #[test]
    fn the_producers_guarantees_cannot_be_configured_away() {
        let properties = [
            ("acks", "0"),
            ("enable.idempotence", "false"),
            ("message.timeout.ms", "600000"),
            ("statistics.interval.ms", "0"),
        ];
        refusing(&properties, &["acks", "enable.idempotence", "message.timeout.ms"]);
    }

    #[test]
    fn the_consumers_offsets_cannot_be_configured_away() {
        let properties = [
            ("enable.auto.commit", "true"),
            ("auto.offset.reset", "latest"),
            ("group.id", "other"),
            ("fetch.wait.max.ms", "10"),
        ];
        let problems = refusing(&properties, &["enable.auto.commit", "auto.offset.reset", "group.id"]);
        assert!(
            problems
                .contains(&"kafka.properties.group.id may not be set for the consumer: set kafka.group_id".to_owned())
        );
    }
}
