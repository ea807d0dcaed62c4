//! The recovery worker's configuration: the shared sections (database, downstream clients,
//! telemetry, driver timing, planner rules) plus its own `recovery` and `reconcile` sections.
//! Every default says why it is what it is; [`Config::problems`] checks all of them at start-up.

use midflight_config::{Config, DatabaseSection, GrpcClientSection, KafkaSection, RuntimeSection, TelemetrySection};
use midflight_driver::DriverSettings;
use midflight_model::Rules;
use midflight_service::ServiceConfig;
use serde::{Deserialize, Serialize};

/// Longest shutdown drain: beyond a minute an orchestrator kills the process anyway.
pub const DRAIN_TIMEOUT_MS_MAX: u64 = 60_000;

/// Largest scan page: one page is one indexed query and its rows are held in memory.
pub const SCAN_BATCH_MAX: u64 = 10_000;
/// Most sagas one worker drives at once.
pub const CONCURRENCY_MAX: usize = 10_000;
/// Longest ledger page the mocks serve (`midflight_mock::input::LEDGER_PAGE_MAX`).
pub const LEDGER_PAGE_ENTRIES_MAX: u32 = 1_000;

/// Everything `recovery-worker` (and `sagactl`, which reads the same file) reads at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoveryConfig {
    pub database: DatabaseSection,
    pub wms: GrpcClientSection,
    pub logistics: GrpcClientSection,
    pub telemetry: TelemetrySection,
    pub runtime: RuntimeSection,
    /// Lease and call deadlines: the same settings the consumer's drivers use.
    pub driver: DriverSettings,
    /// The downstreams' contracts and the retry policy: the same rules the consumer plans with.
    pub rules: Rules,
    pub recovery: RecoverySection,
    pub reconcile: ReconcileSection,
    pub purge: PurgeSection,
    /// The order topic's Kafka, read only by the purge, for the topic's retention
    /// ([`PurgeSection`]); none by default. The consumer's `kafka` settings fit as they are
    /// (`bootstrap_servers`, `order_topic` and `properties` are used), but on a cluster with
    /// ACLs the principal also needs the DescribeConfigs permission on the topic, which reading
    /// it does not grant: until a first reading, nothing is purged.
    pub kafka: Option<KafkaSection>,
}

/// How the worker finds and drives abandoned sagas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoverySection {
    /// Names the process in owner ids (`<instance>-<pid>-<random>`) and in the transition log.
    pub instance: String,
    /// Pause between scans that reached the end of the backlog. Pickup time is lease expiry plus
    /// at most this; 1 s is small beside the 30 s default lease and one indexed query per second
    /// per worker costs the database nothing.
    pub scan_interval_ms: u64,
    /// Rows per scan page. A full page is followed at once by the next one, so a backlog is
    /// walked through without waiting; 200 keeps a page small in memory and quick to read.
    pub scan_batch: u64,
    /// Sagas driven at once by this worker. A saga holds no connection while its calls are in
    /// flight, so the bound is about downstream load: 64 sagas of ~0.5 s each are ~128 sagas/s
    /// per worker, well above what a few crashed consumers leave behind.
    pub concurrency_max: usize,
    /// On shutdown, how long to wait for drives to reach a durable point (they stop before their
    /// next call); longer than one call deadline. Drives still running are then abandoned: their
    /// leases expire and another worker resumes them.
    pub drain_timeout_ms: u64,
    /// Apply missing migrations at start-up, so the worker can come up first on an empty
    /// database. They are idempotent and recorded; turn off where a deploy job owns the schema.
    pub migrate_on_start: bool,
    /// Pause between two reconciliations; 0 turns the periodic run off (`sagactl reconcile`
    /// still runs one on demand). A periodic pass reads what changed since the last one
    /// (`reconcile.incremental`), so a minute keeps each pass small: at the user's peak of
    /// 4,000 messages a second, about 240,000 entries of each ledger, well inside
    /// `reconcile.ledger_entries_max`, and a finding reaches a person within minutes. While it
    /// is on, the purge deletes only the finished sagas a periodic pass has judged.
    pub reconcile_interval_ms: u64,
}

/// Deleting finished sagas (DONE, ROLLED_BACK) once nothing can ask for them again. Off by
/// default: how long a saga must be kept depends on the order topic.
///
/// A saga's row is what turns a redelivered message into a no-op, so the horizon, counted from
/// the saga's last write (after its message was read), must be longer than the order topic
/// keeps a message: its `retention.ms` plus its `segment.ms` (a segment is deleted whole, once
/// its newest message is past retention). A message read after its saga was purged is
/// processed again, with every external effect. With a `kafka` section the purge reads the
/// topic's settings and purges past the longer of `after_hours` and what the topic keeps plus
/// an hour, nothing until it has read them and nothing while the topic keeps messages for ever
/// (`crate::retention`). Not covered: the same event produced again by the upstream later (its
/// retention counts from then), and producers dating messages further ahead than the topic
/// bounds and the hour allow. Sagas with an open ticket or an unpublished
/// notification wait; with periodic reconciliation on (`recovery.reconcile_interval_ms`), so
/// do sagas no periodic pass has judged yet (all of them until one has completed); the
/// reconciler judges a purged saga's effects by its business row, which is kept. On MySQL a
/// purge batch runs at READ COMMITTED, which needs the binlog, if on, in ROW or MIXED format
/// (the defaults).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PurgeSection {
    /// Sagas last written more than this many hours ago (database clock) are deleted; 0 turns
    /// purging off. At least [`PURGE_AFTER_HOURS_MIN`] when on.
    pub after_hours: u64,
    /// Sagas per purge transaction (their log rows and outbox rows go in the same one).
    pub batch_rows: u64,
    /// Pause after a batch that deleted sagas and listed at least `batch_rows` candidates
    /// (on MySQL, also one that came back short because another worker held some of them),
    /// leaving the database to the hot path between batches: a backlog is worked through at
    /// about `batch_rows` per batch time plus this (500 every 80-86 ms, about 6,000 sagas a
    /// second, on the MariaDB of BENCHMARKS.md, Purge).
    pub pause_ms: u64,
    /// Pause after any other batch (fewer than `batch_rows` candidates: the old rows are gone;
    /// rolled back; every listed row held by another worker; failed). The order topic's
    /// retention is read again once the last reading is this old.
    pub interval_ms: u64,
    /// Longest the purge waits for the broker's answer when it reads the order topic's
    /// settings (with a `kafka` section); less than `interval_ms`.
    pub topic_check_timeout_ms: u64,
}

/// Shortest purge horizon accepted: a day. A shorter one is almost surely a unit mistake, and
/// a day is already shorter than any order topic's retention worth running.
pub const PURGE_AFTER_HOURS_MIN: u64 = 24;

/// How a reconciliation reads the ledgers and the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcileSection {
    /// Entries per ledger page: the most a downstream serves in one page.
    pub ledger_page_entries: u32,
    /// Most entries of one ledger a pass holds in memory; a pass holds both ledgers at once,
    /// each entry about 500 bytes of the process's memory (one lock or shipment per request id:
    /// 512 bytes measured at a million, BENCHMARKS.md), so the default's two full ledgers take
    /// about 1 GB. A larger ledger fails the pass with an error naming this limit rather than
    /// reconciling half of it (or the process running out of memory); size it with the
    /// process's memory limit.
    pub ledger_entries_max: u64,
    /// Deadline of one ledger page request; pages are large, so longer than a saga call.
    pub ledger_timeout_ms: u64,
    /// Saga rows per page of the table pass (narrow rows, no payload).
    pub table_page_rows: u64,
    /// Findings listed in one report; the counters always count all of them, and every finding
    /// gets its ticket regardless.
    pub findings_listed_max: usize,
    /// The periodic passes read only what changed since the last one (a checkpoint in the
    /// table): the ledger entries recorded since and the sagas finished since, with every
    /// entry of the request ids those name. The first pass, with no checkpoint yet, is a full
    /// one. Off: every periodic pass reads both ledgers whole and walks the whole table, which
    /// `ledger_entries_max` stops once the ledgers outgrow it. `sagactl reconcile` is always a
    /// full pass.
    pub incremental: bool,
    /// How many sequence numbers behind its checkpoint each periodic pass reads again, to meet
    /// the entries a downstream showed after later ones: a ledger numbered when a write begins
    /// (an auto-increment key) shows an entry only once its transaction commits, so a slow
    /// commit appears behind entries already read. The pass that sets a checkpoint keeps with
    /// it which numbers of that stretch it did not see, and the next pass (in any process)
    /// judges only the entries that appeared there since. Size it to the numbers a downstream
    /// hands out between an entry's numbering and its commit, plus a pass's read of the new
    /// entries: 10,000 is about 2.5 s of one ledger at the user's peak, if numbered without
    /// gaps. At most `ledger_entries_max` / 16; 0 reads nothing again.
    pub ledger_reread_entries: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            database: DatabaseSection::default(),
            // The ports the mock downstreams listen on by default.
            wms: GrpcClientSection::with_endpoint("http://127.0.0.1:50061"),
            logistics: GrpcClientSection::with_endpoint("http://127.0.0.1:50062"),
            telemetry: TelemetrySection::default(),
            runtime: RuntimeSection::default(),
            driver: DriverSettings::default(),
            rules: Rules::default(),
            recovery: RecoverySection::default(),
            reconcile: ReconcileSection::default(),
            purge: PurgeSection::default(),
            kafka: None,
        }
    }
}

impl Default for PurgeSection {
    fn default() -> Self {
        PurgeSection {
            after_hours: 0,
            batch_rows: midflight_store::BATCH_ROWS_MAX as u64,
            pause_ms: 50,
            interval_ms: 60_000,
            topic_check_timeout_ms: 10_000,
        }
    }
}

impl PurgeSection {
    /// The horizon, when purging is on.
    pub fn horizon(&self) -> Option<std::time::Duration> {
        (self.after_hours > 0).then(|| std::time::Duration::from_secs(self.after_hours.saturating_mul(3_600)))
    }

    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        // A hundred years: far beyond any retention, and far from overflowing milliseconds.
        if self.after_hours != 0 && !(PURGE_AFTER_HOURS_MIN..=876_000).contains(&self.after_hours) {
            problems.push(format!(
                "{at}.after_hours must be 0 (off) or in {PURGE_AFTER_HOURS_MIN}..=876000, and longer than the order \
                 topic's retention.ms plus segment.ms; got {}",
                self.after_hours
            ));
        }
        let batch_max = midflight_store::BATCH_ROWS_MAX as u64;
        if !(1..=batch_max).contains(&self.batch_rows) {
            problems.push(format!("{at}.batch_rows must be in 1..={batch_max}"));
        }
        if self.interval_ms == 0 || self.topic_check_timeout_ms == 0 {
            problems.push(format!("{at}.interval_ms and topic_check_timeout_ms must be positive"));
        }
        problems
    }
}

impl Default for RecoverySection {
    fn default() -> Self {
        RecoverySection {
            instance: "recovery".to_owned(),
            scan_interval_ms: 1_000,
            scan_batch: 200,
            concurrency_max: 64,
            drain_timeout_ms: 10_000,
            migrate_on_start: true,
            reconcile_interval_ms: 60_000,
        }
    }
}

impl Default for ReconcileSection {
    fn default() -> Self {
        ReconcileSection {
            ledger_page_entries: LEDGER_PAGE_ENTRIES_MAX,
            ledger_entries_max: 1_000_000,
            ledger_timeout_ms: 10_000,
            table_page_rows: 500,
            findings_listed_max: 1_000,
            incremental: true,
            ledger_reread_entries: 10_000,
        }
    }
}

impl RecoverySection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let instance_ok = !self.instance.is_empty()
            && self.instance.len() <= 64
            && self.instance.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !instance_ok {
            problems
                .push(format!("{at}.instance must be 1..=64 characters of [A-Za-z0-9._-], got {:?}", self.instance));
        }
        if self.scan_interval_ms == 0 {
            problems.push(format!("{at}.scan_interval_ms must be positive"));
        }
        // As the consumer's shutdown deadline: 0 would abandon every drive at once, and beyond
        // a minute an orchestrator kills the process anyway.
        if !(1..=DRAIN_TIMEOUT_MS_MAX).contains(&self.drain_timeout_ms) {
            problems.push(format!(
                "{at}.drain_timeout_ms must be in 1..={DRAIN_TIMEOUT_MS_MAX}, got {}",
                self.drain_timeout_ms
            ));
        }
        if !(1..=SCAN_BATCH_MAX).contains(&self.scan_batch) {
            problems.push(format!("{at}.scan_batch must be in 1..={SCAN_BATCH_MAX}"));
        }
        if !(1..=CONCURRENCY_MAX).contains(&self.concurrency_max) {
            problems.push(format!("{at}.concurrency_max must be in 1..={CONCURRENCY_MAX}"));
        }
        problems
    }
}

impl ReconcileSection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=LEDGER_PAGE_ENTRIES_MAX).contains(&self.ledger_page_entries) {
            problems.push(format!("{at}.ledger_page_entries must be in 1..={LEDGER_PAGE_ENTRIES_MAX}"));
        }
        if self.ledger_entries_max == 0 || self.ledger_timeout_ms == 0 || self.table_page_rows == 0 {
            problems.push(format!("{at}.ledger_entries_max, ledger_timeout_ms and table_page_rows must be positive"));
        }
        if self.table_page_rows > SCAN_BATCH_MAX {
            problems.push(format!("{at}.table_page_rows must be at most {SCAN_BATCH_MAX}"));
        }
        // Half a pass's share of new entries: what a pass folds stays inside ledger_entries_max.
        let reread_max = self.ledger_entries_max / (2 * crate::reconcile::PASS_SHARE);
        if self.ledger_reread_entries > reread_max {
            problems.push(format!(
                "{at}.ledger_reread_entries must be at most ledger_entries_max / {} ({reread_max}); got {}",
                2 * crate::reconcile::PASS_SHARE,
                self.ledger_reread_entries
            ));
        }
        problems
    }
}

impl Config for RecoveryConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.database.problems("database");
        problems.extend(self.wms.problems("wms"));
        problems.extend(self.logistics.problems("logistics"));
        problems.extend(self.telemetry.problems("telemetry"));
        problems.extend(self.runtime.problems("runtime"));
        problems.extend(self.driver.problems("driver"));
        problems.extend(self.driver.shutdown_wait_problem("recovery.drain_timeout_ms", self.recovery.drain_timeout_ms));
        problems.extend(self.rules.wms.problems("rules.wms"));
        problems.extend(self.rules.logistics.problems("rules.logistics"));
        problems.extend(self.rules.retry.problems("rules.retry"));
        problems.extend(self.recovery.problems("recovery"));
        problems.extend(self.reconcile.problems("reconcile"));
        problems.extend(self.purge.problems("purge"));
        if let Some(kafka) = &self.kafka {
            problems.extend(kafka.problems("kafka"));
            // A broker that never answers is asked once an interval, not for every batch.
            if self.purge.after_hours > 0 && self.purge.topic_check_timeout_ms >= self.purge.interval_ms {
                problems.push("purge.topic_check_timeout_ms must be less than purge.interval_ms".to_owned());
            }
        }
        problems
    }
}

impl ServiceConfig for RecoveryConfig {
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
        assert_eq!(RecoveryConfig::default().problems(), Vec::<String>::new());
    }

    #[test]
    fn the_optional_kafka_section_is_read_from_the_environment() {
        let env = |pairs: &[(&str, &str)]| midflight_config::Sources {
            env: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..midflight_config::Sources::default()
        };
        let given = [("MIDFLIGHT_KAFKA__BOOTSTRAP_SERVERS", "k:9092"), ("MIDFLIGHT_KAFKA__GROUP_ID", "42")];
        let config: RecoveryConfig = midflight_config::load(&env(&given)).expect("loads");
        let kafka = config.kafka.expect("a kafka section");
        assert_eq!((kafka.bootstrap_servers.as_str(), kafka.group_id.as_str()), ("k:9092", "42"));
        let err = midflight_config::load::<RecoveryConfig>(&env(&[("MIDFLIGHT_KAFKA_BOOTSTRAP_SERVERS", "k:9092")]))
            .expect_err("one underscore");
        assert!(err.to_string().contains("MIDFLIGHT_KAFKA__BOOTSTRAP_SERVERS"), "{err}");
        assert!(midflight_config::load::<RecoveryConfig>(&env(&[])).expect("defaults").kafka.is_none());
    }

    #[test]
    fn every_bad_value_is_named() {
        let mut config = RecoveryConfig::default();
        config.recovery.instance = "a b".to_owned();
        config.recovery.scan_interval_ms = 0;
        config.recovery.scan_batch = 0;
        config.recovery.concurrency_max = 0;
        config.reconcile.ledger_page_entries = 5_000;
        config.reconcile.ledger_reread_entries = 200_000;
        config.rules.retry.attempts_max = 0;
        config.driver.lease_ms = 10;
        config.purge.after_hours = 48;
        config.purge.topic_check_timeout_ms = config.purge.interval_ms;
        config.kafka = Some(KafkaSection { order_topic: " ".to_owned(), ..KafkaSection::default() });
        let problems = config.problems();
        for needle in [
            "topic_check_timeout_ms must be less than",
            "kafka.order_topic",
            "instance",
            "scan_interval_ms",
            "scan_batch",
            "concurrency_max",
            "ledger_page",
            "ledger_reread",
            "attempts_max",
        ] {
            assert!(problems.iter().any(|p| p.contains(needle)), "{needle} not reported in {problems:#?}");
        }
        assert!(problems.iter().any(|p| p.starts_with("driver.lease_ms")), "{problems:#?}");
        let mut slow_calls = RecoveryConfig::default();
        (slow_calls.driver.rpc_timeout_ms, slow_calls.driver.lease_ms) = (20_000, 60_000);
        let problems = slow_calls.problems();
        assert!(
            problems.iter().any(|p| p
                .starts_with("recovery.drain_timeout_ms (10000) must be longer than driver.rpc_timeout_ms (20000)")),
            "{problems:#?}"
        );
    }

    #[test]
    fn purge_is_off_until_given_a_horizon_of_a_day_or_more() {
        let mut purge = PurgeSection::default();
        assert_eq!(purge.horizon(), None);
        purge.after_hours = 336;
        assert_eq!(purge.horizon(), Some(std::time::Duration::from_secs(336 * 3_600)));
        assert_eq!(purge.problems("purge"), Vec::<String>::new());
        purge.after_hours = 12;
        purge.batch_rows = 0;
        purge.interval_ms = 0;
        let problems = purge.problems("purge");
        for needle in ["purge.after_hours", "purge.batch_rows", "purge.interval_ms"] {
            assert!(problems.iter().any(|p| p.starts_with(needle)), "{needle} not reported in {problems:#?}");
        }
        assert!(problems[0].contains("retention.ms"), "{problems:#?}");
    }

    #[test]
    fn loads_from_flags_and_environment() {
        let sources = midflight_config::Sources {
            file: None,
            env: vec![("MIDFLIGHT_RECOVERY__SCAN_BATCH".to_owned(), "50".to_owned())],
            overrides: vec!["database.url=sqlite://x.db".to_owned(), "recovery.instance=r7".to_owned()],
        };
        let config: RecoveryConfig = midflight_config::load(&sources).expect("valid");
        assert_eq!((config.recovery.scan_batch, config.recovery.instance.as_str()), (50, "r7"));
        assert_eq!(config.database.url, "sqlite://x.db");
    }
}
