//! Option sections shared by the services, so each is defined, defaulted and checked once.
//!
//! Durations are whole milliseconds with the unit in the name (`request_timeout_ms`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Connection to Kafka (or to the embedded mock cluster, which speaks the same protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSection {
    /// `bootstrap.servers`. The demo hosts an embedded cluster and passes its address here.
    pub bootstrap_servers: String,
    /// Consumer group shared by every consumer instance.
    pub group_id: String,
    /// Topic of order events.
    pub order_topic: String,
    /// Topic the outbox relay publishes notifications to.
    pub notification_topic: String,
    /// Topic poison messages are copied to, with their error in a header.
    pub dead_letter_topic: String,
    /// `session.timeout.ms`: 45 s is Kafka's default and what the incident ran with.
    /// A longer one only makes the window rarer (MISSION.md, attempt 1); correctness comes from the table.
    pub session_timeout_ms: u64,
    /// `max.poll.interval.ms`: the consumer polls continuously (sagas run on other tasks) but for a
    /// stop at its in-flight bound of at most `consumer.pause_after_ms`, so the default is fine.
    pub max_poll_interval_ms: u64,
    /// `group.instance.id` for static membership; `None` for dynamic membership.
    pub group_instance_id: Option<String>,
    /// `group.protocol`: `classic` (what Kafka 3.5 has) or `consumer` (KIP-848).
    pub group_protocol: String,
    /// Extra librdkafka properties, passed through unchanged (they win over the fields above).
    /// Names keep their dots: in TOML quoted (`"security.protocol" = "SASL_SSL"`) or as nested
    /// tables (`security.protocol = ...` unquoted), `--set kafka.properties.security.protocol=...`,
    /// or `MIDFLIGHT_KAFKA__PROPERTIES__SECURITY_PROTOCOL=...` (a variable's underscores are dots,
    /// but for librdkafka's own `log_level` and `enabled_events`). Values are text; a number or
    /// boolean in a file is taken as its text (see the loader, `crate::load`).
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSection {
    fn default() -> Self {
        KafkaSection {
            bootstrap_servers: "127.0.0.1:9092".to_owned(),
            group_id: "midflight-orders".to_owned(),
            order_topic: "orders".to_owned(),
            notification_topic: "notifications".to_owned(),
            dead_letter_topic: "orders.dlt".to_owned(),
            session_timeout_ms: 45_000,
            max_poll_interval_ms: 300_000,
            group_instance_id: None,
            group_protocol: "classic".to_owned(),
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaSection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, value) in [
            ("bootstrap_servers", &self.bootstrap_servers),
            ("group_id", &self.group_id),
            ("order_topic", &self.order_topic),
            ("notification_topic", &self.notification_topic),
            ("dead_letter_topic", &self.dead_letter_topic),
        ] {
            if value.trim().is_empty() {
                problems.push(format!("{at}.{name} must not be empty"));
            }
        }
        if !matches!(self.group_protocol.as_str(), "classic" | "consumer") {
            problems.push(format!(
                "{at}.group_protocol must be \"classic\" or \"consumer\", not {:?}",
                self.group_protocol
            ));
        }
        if self.group_instance_id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            problems.push(format!("{at}.group_instance_id must not be empty when set"));
        }
        if self.session_timeout_ms < 1_000 {
            problems.push(format!("{at}.session_timeout_ms must be at least 1000"));
        }
        problems
    }
}

/// Most sagas one group transaction carries: the store's cap on rows per batch statement.
pub const GROUP_COMMIT_MAX: usize = 500;
/// Most group transactions in flight; the store also leaves at least one pooled connection to
/// everything else (inbox, leases, relay), whatever this says.
pub const GROUP_COMMIT_CONCURRENCY_MAX: usize = 64;
/// Longest a group may wait for more transitions: every transition of it waits as long.
pub const GROUP_COMMIT_LINGER_MS_MAX: u64 = 100;
/// Bounds of `database.idle_timeout_ms`: at least a second, at most an hour.
pub const IDLE_TIMEOUT_MS_MIN: u64 = 1_000;
pub const IDLE_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// How long a pooled connection may sit idle before it is checked (pinged) before use.
pub const PING_AFTER_IDLE_MS: u64 = 30_000;
/// Shortest `database.session_idle_timeout_ms` (other than 0): twice [`PING_AFTER_IDLE_MS`], so
/// every connection the server may have closed for idling is checked before it is used.
pub const SESSION_IDLE_TIMEOUT_MS_MIN: u64 = 60_000;
/// Shortest `database.statement_timeout_ms` (other than 0): a second. Every statement of the
/// hot path takes milliseconds; a bound much shorter would cut off ordinary lock waits.
pub const STATEMENT_TIMEOUT_MS_MIN: u64 = 1_000;

/// The saga database (MySQL 8 / MariaDB, or SQLite).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSection {
    /// `mysql://user:pass@host:3306/db` or `sqlite://path.db?mode=rwc`.
    pub url: String,
    /// Pool size. Connections are only held for one statement or one short transaction,
    /// never across an RPC, so a few dozen serve thousands of sagas in flight. A pool fills at a
    /// peak and keeps idle connections open for `idle_timeout_ms`, so the pools of every
    /// instance on one server must fit its `max_connections` together (MySQL 8's default is
    /// 151): 8 consumers at 32 do not.
    pub max_connections: u32,
    /// How long to wait for a free connection before the operation fails. A server that
    /// refuses a new connection because it is full (MySQL 1040, or 1203 and 1226 for an
    /// account's limits) is waited out as long, at every transaction's begin and around the
    /// single statements of the consumer's and the recovery worker's hot paths: the store asks
    /// again, one operation at a time, 10 ms to 250 ms apart while it is refused.
    pub acquire_timeout_ms: u64,
    /// How long to wait for a new connection to be established.
    pub connect_timeout_ms: u64,
    /// How long a connection may sit idle in the pool before the pool closes it. A pool grows at
    /// a peak; this hands the server its connections back a minute after (the driver's own
    /// default is 10 minutes), so other instances and the recovery worker can open theirs.
    pub idle_timeout_ms: u64,
    /// Saga transitions of up to this many sagas share one transaction (group commit): each
    /// keeps its own compare-and-set, log rows and fused writes, and one commit (one log flush)
    /// serves them all. Transitions wait for nothing: a group is whatever queued while the
    /// previous groups committed, so at low load it is a single transition. 1 turns it off.
    /// 256 is far above what a commit's wait gathers at the user's peak (4,000 msg/s x 3
    /// transitions x a few ms) and keeps one group's statements small.
    pub group_commit_max: usize,
    /// Group transactions in flight at once, each on one pooled connection. Four overlap the
    /// next groups' statements with a commit's flush; SQLite (one writer at a time) uses one.
    pub group_commit_concurrency: usize,
    /// How long a group, from the moment its first transition is taken from the queue, waits
    /// for more to join before it is written (its wait for a free transaction slot counts
    /// toward it). 0: a group is what queued while the previous groups committed, which at a
    /// moderate rate is a single transition paying a whole transaction's round trips alone.
    /// Every transition of a group may wait this long, so it adds up to this much per step.
    pub group_commit_linger_ms: u64,
    /// MySQL and MariaDB: the server ends a session of ours that has sent nothing for this long
    /// inside a transaction (MariaDB's `idle_transaction_timeout`; MySQL has none, so there it
    /// is `wait_timeout` and ends any session idle this long), rolling the transaction back
    /// and releasing its row locks. Set for each pooled connection, in whole seconds. A
    /// transaction never waits on anything but its own statements, so one idle this long
    /// belongs to a client that is gone: a process frozen or cut off by the network
    /// mid-transaction, or a try abandoned at its deadline. Without it the server waits out
    /// its own `wait_timeout` (8 hours by default) while every write to those rows waits and
    /// fails. On MySQL the server also ends idle pooled connections: they are pinged before
    /// use after 30 s, so no operation fails, but the server logs an aborted connection and
    /// the pool a warning. 0 leaves the server's settings.
    pub session_idle_timeout_ms: u64,
    /// MySQL and MariaDB: the server stops any one statement of ours that runs this long
    /// (MariaDB's `max_statement_time`, for every statement; MySQL's `max_execution_time`,
    /// which bounds only SELECTs), so a statement that waits on a metadata lock (the server's
    /// `lock_wait_timeout` is a year by default) or runs a plan gone wrong fails instead of
    /// holding its task and its row locks. Set for each pooled connection. The default is
    /// above InnoDB's row lock wait (50 s), which still ends those first. Migrations run
    /// unbounded. 0 leaves the server's settings.
    pub statement_timeout_ms: u64,
}

impl Default for DatabaseSection {
    fn default() -> Self {
        DatabaseSection {
            url: "sqlite://midflight.db?mode=rwc".to_owned(),
            max_connections: 32,
            acquire_timeout_ms: 5_000,
            connect_timeout_ms: 5_000,
            idle_timeout_ms: 60_000,
            group_commit_max: 256,
            group_commit_concurrency: 4,
            group_commit_linger_ms: 0,
            session_idle_timeout_ms: 120_000,
            statement_timeout_ms: 60_000,
        }
    }
}

impl DatabaseSection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !(self.url.starts_with("mysql://") || self.url.starts_with("sqlite:")) {
            problems.push(format!("{at}.url must start with mysql:// or sqlite:, got {:?}", redact_url(&self.url)));
        }
        if self.max_connections == 0 || self.max_connections > 1_000 {
            problems.push(format!("{at}.max_connections must be in 1..=1000"));
        }
        if self.connect_timeout_ms == 0 {
            problems.push(format!("{at}.connect_timeout_ms must be positive"));
        }
        if self.acquire_timeout_ms == 0 {
            problems.push(format!("{at}.acquire_timeout_ms must be positive"));
        }
        if !(IDLE_TIMEOUT_MS_MIN..=IDLE_TIMEOUT_MS_MAX).contains(&self.idle_timeout_ms) {
            problems.push(format!(
                "{at}.idle_timeout_ms must be in {IDLE_TIMEOUT_MS_MIN}..={IDLE_TIMEOUT_MS_MAX}, got {}",
                self.idle_timeout_ms
            ));
        }
        if !(1..=GROUP_COMMIT_MAX).contains(&self.group_commit_max) {
            problems.push(format!("{at}.group_commit_max must be in 1..={GROUP_COMMIT_MAX}"));
        }
        if !(1..=GROUP_COMMIT_CONCURRENCY_MAX).contains(&self.group_commit_concurrency) {
            problems.push(format!("{at}.group_commit_concurrency must be in 1..={GROUP_COMMIT_CONCURRENCY_MAX}"));
        }
        if self.session_idle_timeout_ms != 0
            && !(SESSION_IDLE_TIMEOUT_MS_MIN..=IDLE_TIMEOUT_MS_MAX * 24).contains(&self.session_idle_timeout_ms)
        {
            problems.push(format!(
                "{at}.session_idle_timeout_ms must be 0 (the server's own) or in {SESSION_IDLE_TIMEOUT_MS_MIN}..={}, got {}",
                IDLE_TIMEOUT_MS_MAX * 24,
                self.session_idle_timeout_ms
            ));
        }
        if self.statement_timeout_ms != 0
            && !(STATEMENT_TIMEOUT_MS_MIN..=IDLE_TIMEOUT_MS_MAX).contains(&self.statement_timeout_ms)
        {
            problems.push(format!(
                "{at}.statement_timeout_ms must be 0 (the server's own) or in {STATEMENT_TIMEOUT_MS_MIN}..={IDLE_TIMEOUT_MS_MAX}, got {}",
                self.statement_timeout_ms
            ));
        }
        if self.group_commit_linger_ms > GROUP_COMMIT_LINGER_MS_MAX {
            problems.push(format!("{at}.group_commit_linger_ms must be at most {GROUP_COMMIT_LINGER_MS_MAX}"));
        }
        problems
    }
}

/// Removes a password from a database URL before it is printed.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}://{user}:***@{}", &url[..scheme], &url[at + 1..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// `server_url` (a MySQL URL) with its database name replaced by `name`.
pub fn with_database_name(server_url: &str, name: &str) -> String {
    let (base, query) = server_url.split_once('?').map_or((server_url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[authority_end..].find('/').map(|i| authority_end + i).unwrap_or(base.len());
    let mut url = format!("{}/{name}", &base[..path_start]);
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

/// A gRPC client of a downstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcClientSection {
    /// `http://host:port` of the downstream.
    pub endpoint: String,
    /// Deadline of one call. Must be shorter than the saga lease, so a call never outlives ownership.
    pub request_timeout_ms: u64,
    /// Deadline for establishing the connection.
    pub connect_timeout_ms: u64,
    /// Calls in flight at once on this client. A call beyond it waits for a turn, and the wait
    /// counts against its deadline: a call that waited too long ends unanswered, never late.
    pub concurrency_limit: usize,
    /// Sent as `authorization: Bearer <token>` when set.
    pub bearer_token: Option<String>,
}

impl GrpcClientSection {
    pub fn with_endpoint(endpoint: &str) -> Self {
        GrpcClientSection { endpoint: endpoint.to_owned(), ..GrpcClientSection::default() }
    }

    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            problems.push(format!("{at}.endpoint must start with http:// or https://, got {:?}", self.endpoint));
        }
        if self.request_timeout_ms == 0 {
            problems.push(format!("{at}.request_timeout_ms must be positive"));
        }
        if self.connect_timeout_ms == 0 {
            problems.push(format!("{at}.connect_timeout_ms must be positive"));
        }
        if self.concurrency_limit == 0 {
            problems.push(format!("{at}.concurrency_limit must be positive"));
        }
        problems.extend(token_problem(at, self.bearer_token.as_deref()));
        problems
    }
}

/// A bearer token goes into an HTTP header as it is: visible ASCII only. A secret file read with
/// its trailing newline, or a token with spaces, would otherwise be dropped or refused at every
/// call instead of at start.
fn token_problem(at: &str, token: Option<&str>) -> Option<String> {
    let token = token?;
    if token.is_empty() {
        return Some(format!("{at}.bearer_token must not be empty (leave it out for no token)"));
    }
    let bad = token.bytes().position(|byte| !byte.is_ascii_graphic())?;
    Some(format!(
        "{at}.bearer_token must be visible ASCII characters only (no spaces or line breaks); byte {bad} of {} is not",
        token.len()
    ))
}

impl Default for GrpcClientSection {
    fn default() -> Self {
        GrpcClientSection {
            endpoint: "http://127.0.0.1:50051".to_owned(),
            // The user's logistics P99 is about 320 ms; 2 s leaves room for a slow tail
            // while staying far below the 30 s default lease.
            request_timeout_ms: 2_000,
            connect_timeout_ms: 1_000,
            concurrency_limit: 4_096,
            bearer_token: None,
        }
    }
}

/// A gRPC or HTTP server of ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// Address to bind; loopback by default so nothing is exposed by accident.
    pub listen: String,
    /// Requests taking longer are cut off with DEADLINE_EXCEEDED.
    pub request_timeout_ms: u64,
    /// Requests served at once; more wait.
    pub concurrency_limit: usize,
    /// When set, requests must carry `authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            listen: "127.0.0.1:50051".to_owned(),
            request_timeout_ms: 10_000,
            concurrency_limit: 4_096,
            bearer_token: None,
        }
    }
}

impl ServerSection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!("{at}.listen must be host:port with an IP address, got {:?}", self.listen));
        }
        if self.request_timeout_ms == 0 || self.concurrency_limit == 0 {
            problems.push(format!("{at}.request_timeout_ms and {at}.concurrency_limit must be positive"));
        }
        problems.extend(token_problem(at, self.bearer_token.as_deref()));
        problems
    }
}

/// Most worker threads a service's runtime may be given.
pub const WORKER_THREADS_MAX: usize = 256;

/// The service's async runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeSection {
    /// Tokio worker threads. 0 (the default) leaves the choice to tokio: `TOKIO_WORKER_THREADS`
    /// when set, else one per core. For a service that should run fewer threads than its machine
    /// has cores; on the 2-core benchmark box one each showed no gain that held (BENCHMARKS.md).
    pub worker_threads: usize,
}

impl RuntimeSection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.worker_threads > WORKER_THREADS_MAX {
            problems.push(format!(
                "{at}.worker_threads must be at most {WORKER_THREADS_MAX} (0: one per core), got {}",
                self.worker_threads
            ));
        }
        problems
    }
}

/// Logs, traces and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySection {
    /// `pretty` for people, `json` for log shippers.
    pub log_format: String,
    /// `tracing` filter directives, e.g. `info,midflight_driver=debug`.
    pub log_filter: String,
    /// OTLP/gRPC collector endpoint; traces and metrics are exported only when set.
    pub otlp_endpoint: Option<String>,
    /// Address of the Prometheus scrape and health endpoint (`/metrics`, `/healthz`, `/readyz`); off when unset.
    pub metrics_listen: Option<String>,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        TelemetrySection {
            log_format: "pretty".to_owned(),
            log_filter: "info".to_owned(),
            otlp_endpoint: None,
            metrics_listen: None,
        }
    }
}

impl TelemetrySection {
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if !matches!(self.log_format.as_str(), "pretty" | "json") {
            problems.push(format!("{at}.log_format must be \"pretty\" or \"json\", not {:?}", self.log_format));
        }
        if let Some(listen) = &self.metrics_listen
            && listen.parse::<std::net::SocketAddr>().is_err()
        {
            problems.push(format!("{at}.metrics_listen must be host:port with an IP address, got {listen:?}"));
        }
        if let Some(endpoint) = &self.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            problems.push(format!("{at}.otlp_endpoint must start with http:// or https://, got {endpoint:?}"));
        }
        problems
    }
}
