//! One run of the system as separate OS processes: the embedded Kafka hosted by the lab process,
//! the mock WMS and mock logistics, N consumers and M recovery workers (or, for the legacy
//! design, N legacy consumers), all talking over loopback. Each child gets a TOML file written
//! from the service's own configuration type, so the lab cannot pass a key a service does not
//! know.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use midflight_api::client::Downstreams;
use midflight_api::faults::v1::fault_admin_client::FaultAdminClient;
use midflight_config::{
    DatabaseSection, GrpcClientSection, KafkaSection, RuntimeSection, ServerSection, TelemetrySection,
};
use midflight_consumer::ConsumerConfig;
use midflight_driver::DriverSettings;
use midflight_mock::FaultPlan;
use midflight_mock_logistics::LogisticsConfig;
use midflight_mock_wms::WmsConfig;
use midflight_model::{RetryPolicy, Rules};
use midflight_recovery::RecoveryConfig;
use midflight_stack::kafka::EmbeddedKafka;
use midflight_store::Store;
use serde::Serialize;

use crate::process::{Signal, Spec, Supervisor};

const ORDER_TOPIC: &str = "orders";
const NOTIFICATION_TOPIC: &str = "notifications";
const DEAD_LETTER_TOPIC: &str = "orders.dlt";
const GROUP: &str = "midflight-orders";
/// Copies of each topic the lab creates on an external Kafka: one is enough for a run.
const EXTERNAL_REPLICATION: i32 = 1;
/// Heartbeats well inside the session timeout, whichever side sets them.
const HEARTBEAT_INTERVAL_MS: i32 = 500;

/// How to assemble a run.
#[derive(Debug, Clone)]
pub struct SystemSpec {
    /// A name for the run (a subdirectory of the run directory).
    pub name: String,
    pub run_dir: PathBuf,
    /// A MySQL server URL to create a fresh database on; SQLite files in the run directory if `None`.
    pub mysql_url: Option<String>,
    pub partitions: i32,
    pub consumers: usize,
    pub recovery_workers: usize,
    /// The legacy design (status PROCESSING/DONE, a fresh key per attempt) instead of midflight.
    pub legacy: bool,
    /// The benchmark's baseline B instead of midflight: the same parallel pipeline without the
    /// saga table (`crate::nostate`).
    pub nostate: bool,
    /// Legacy and baseline-B consumers append one line per finished message to a timings file
    /// in the run directory (the benchmark's latencies for designs without a transition log).
    pub timings: bool,
    /// Extra `--set key=value` flags for every midflight consumer (benchmark variants).
    pub consumer_set: Vec<String>,
    /// The same for every recovery worker.
    pub recovery_set: Vec<String>,
    pub lease_ms: i64,
    pub rpc_timeout_ms: u64,
    pub session_timeout_ms: u64,
    /// The consumers' `group.protocol`: `classic` (the user's Kafka) or `consumer` (KIP-848,
    /// where the embedded broker owns the session: it is given `session_timeout_ms`).
    pub group_protocol: GroupProtocol,
    pub saga_deadline_ms: i64,
    pub retry: RetryPolicy,
    pub wms_faults: FaultPlan,
    pub logistics_faults: FaultPlan,
    pub stock: BTreeMap<String, i64>,
    pub recovery_scan_interval_ms: u64,
    pub log_filter: String,
    /// `pretty` or `json` (the benchmark reads the consumers' final counters from JSON lines).
    pub log_format: String,
    /// Services reach MySQL through a proxy the lab can cut (MySQL only).
    pub database_proxy: bool,
    /// `runtime.worker_threads` of every service the lab starts (0: one per core).
    pub worker_threads: usize,
    /// An external Kafka's `bootstrap.servers` instead of the embedded cluster. The lab creates
    /// topics and a group named for this run there, and cannot take that cluster's brokers down.
    pub kafka_bootstrap: Option<String>,
}

impl SystemSpec {
    /// The demo's shape: the user's 16 partitions and 8 consumers, one recovery worker.
    pub fn new(name: &str, run_dir: &Path) -> SystemSpec {
        SystemSpec {
            name: name.to_owned(),
            run_dir: run_dir.to_path_buf(),
            mysql_url: None,
            partitions: 16,
            consumers: 8,
            recovery_workers: 1,
            legacy: false,
            nostate: false,
            timings: false,
            consumer_set: Vec::new(),
            recovery_set: Vec::new(),
            // Short enough that a crashed consumer's sagas are picked up within seconds.
            lease_ms: 5_000,
            rpc_timeout_ms: 1_000,
            session_timeout_ms: 6_000,
            group_protocol: GroupProtocol::Classic,
            saga_deadline_ms: 10 * 60_000,
            retry: RetryPolicy { backoff_base_ms: 200, backoff_max_ms: 2_000, attempts_max: 60 },
            wms_faults: FaultPlan::default(),
            logistics_faults: FaultPlan::default(),
            stock: BTreeMap::new(),
            recovery_scan_interval_ms: 250,
            log_filter: "info".to_owned(),
            log_format: "pretty".to_owned(),
            database_proxy: false,
            worker_threads: 0,
            kafka_bootstrap: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupProtocol {
    Classic,
    Consumer,
}

impl GroupProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

/// The topics and the consumer group of a system's services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaNames {
    pub order_topic: String,
    pub notification_topic: String,
    pub dead_letter_topic: String,
    pub group: String,
}

impl KafkaNames {
    /// The user's names, on the embedded cluster (a fresh cluster for every system).
    fn fixed() -> KafkaNames {
        KafkaNames {
            order_topic: ORDER_TOPIC.to_owned(),
            notification_topic: NOTIFICATION_TOPIC.to_owned(),
            dead_letter_topic: DEAD_LETTER_TOPIC.to_owned(),
            group: GROUP.to_owned(),
        }
    }

    /// Names of one run's own on an external Kafka, which keeps every earlier run's topics,
    /// messages and committed offsets: `lab.<run>.<system>.<name>`, in the characters Kafka
    /// allows in a topic name.
    fn unique(run: &str, system: &str) -> KafkaNames {
        let clean = |text: &str| -> String {
            text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect()
        };
        let prefix = format!("lab.{}.{}", clean(run), clean(system));
        KafkaNames {
            order_topic: format!("{prefix}.{ORDER_TOPIC}"),
            notification_topic: format!("{prefix}.{NOTIFICATION_TOPIC}"),
            dead_letter_topic: format!("{prefix}.{DEAD_LETTER_TOPIC}"),
            group: format!("{prefix}.{GROUP}"),
        }
    }
}

/// The embedded cluster with the user's topics, or a client of `spec.kafka_bootstrap` with this
/// run's own topics created there.
async fn start_kafka(spec: &SystemSpec) -> anyhow::Result<(EmbeddedKafka, KafkaNames)> {
    let (kafka, names, replication) = match &spec.kafka_bootstrap {
        None => {
            let kafka = EmbeddedKafka::start().context("cannot start the embedded Kafka")?;
            if spec.group_protocol == GroupProtocol::Consumer {
                let session_ms = i32::try_from(spec.session_timeout_ms).context("session timeout too large")?;
                kafka.set_consumer_protocol_session(session_ms, HEARTBEAT_INTERVAL_MS);
            }
            (kafka, KafkaNames::fixed(), midflight_stack::kafka::REPLICATION)
        }
        Some(bootstrap) => {
            let kafka = EmbeddedKafka::connect(bootstrap)
                .with_context(|| format!("cannot create a Kafka client for {bootstrap}"))?;
            let run = spec.run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            (kafka, KafkaNames::unique(&run, &spec.name), EXTERNAL_REPLICATION)
        }
    };
    let topics = [
        (names.order_topic.as_str(), spec.partitions),
        (names.notification_topic.as_str(), 4),
        (names.dead_letter_topic.as_str(), 1),
    ];
    kafka.create_topics(&topics, replication).await.with_context(|| {
        let list: Vec<&str> = topics.iter().map(|(topic, _)| *topic).collect();
        format!("cannot create the topics {} on {}", list.join(", "), kafka.bootstrap_servers())
    })?;
    Ok((kafka, names))
}

/// A running system.
pub struct System {
    pub spec: SystemSpec,
    pub dir: PathBuf,
    pub kafka: EmbeddedKafka,
    pub names: KafkaNames,
    pub processes: Supervisor,
    pub database_url: String,
    pub wms_endpoint: String,
    pub logistics_endpoint: String,
    /// The lab's own connection (direct, never through the proxy): polling and checking.
    pub store: Store,
    /// What the services connect to when the database is proxied.
    services_database_url: String,
    /// The database this system created on the MySQL server (`spec.mysql_url`), if any.
    pub server_database: Option<String>,
    pub proxy: Option<crate::proxy::Proxy>,
    configs: PathBuf,
}

impl System {
    /// Starts the system. If any part fails to start, what did start is stopped and the database
    /// it created on the MySQL server is dropped before the error is returned (topics it created
    /// on an external Kafka stay, as after every run: their names are the run's own).
    pub async fn start(spec: SystemSpec) -> anyhow::Result<System> {
        let dir = spec.run_dir.join(&spec.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let configs = dir.join("config");
        std::fs::create_dir_all(&configs)?;
        let (kafka, names) = start_kafka(&spec).await?;
        let (database_url, server_database) = database_url(&spec, &dir).await?;
        let server = spec.mysql_url.clone();
        // The children started so far are killed when `system` drops on an error, inside this block.
        let started = async {
            let store = connect(&database_url).await?;
            store.migrate().await.context("cannot migrate the saga database")?;
            let (proxy, services_database_url) = proxied(&spec, &database_url).await?;
            let processes = Supervisor::new(Supervisor::sibling_binaries()?, dir.join("logs"))?;
            let [wms_port, logistics_port] = free_ports()?;
            let mut system = System {
                wms_endpoint: format!("http://127.0.0.1:{wms_port}"),
                logistics_endpoint: format!("http://127.0.0.1:{logistics_port}"),
                spec,
                dir,
                kafka,
                names,
                processes,
                database_url,
                store,
                services_database_url,
                server_database: server_database.clone(),
                proxy,
                configs,
            };
            system.start_mocks(wms_port, logistics_port).await?;
            for index in 1..=system.spec.consumers {
                system.start_consumer(index)?;
            }
            if !system.spec.legacy && !system.spec.nostate {
                for index in 1..=system.spec.recovery_workers {
                    system.start_recovery(index)?;
                }
            }
            anyhow::Ok(system)
        }
        .await;
        match (started, &server_database, &server) {
            (Err(error), Some(name), Some(server)) => match drop_database(server, name).await {
                Ok(()) => Err(error),
                Err(drop_error) => Err(error.context(format!("and {drop_error:#}: it is left on the server"))),
            },
            (started, _, _) => started,
        }
    }

    async fn start_mocks(&mut self, wms_port: u16, logistics_port: u16) -> anyhow::Result<()> {
        let mut wms = WmsConfig { faults: self.spec.wms_faults.clone(), ..WmsConfig::default() };
        wms.faults.legacy_mode |= self.spec.legacy;
        wms.server = ServerSection { listen: format!("127.0.0.1:{wms_port}"), ..ServerSection::default() };
        wms.database = self.sqlite("mock-wms");
        wms.telemetry = self.telemetry();
        wms.runtime = self.runtime();
        wms.stock.skus.extend(self.spec.stock.clone());
        let mut logistics =
            LogisticsConfig { faults: self.spec.logistics_faults.clone(), ..LogisticsConfig::default() };
        logistics.server = ServerSection { listen: format!("127.0.0.1:{logistics_port}"), ..ServerSection::default() };
        logistics.database = self.sqlite("mock-logistics");
        logistics.telemetry = self.telemetry();
        logistics.runtime = self.runtime();
        let wms_config = self.write_config("mock-wms", &wms)?;
        let logistics_config = self.write_config("mock-logistics", &logistics)?;
        self.processes
            .start("mock-wms", Spec { binary: "mock-wms", args: config_args(&wms_config), env: Vec::new() })?;
        self.processes.start(
            "mock-logistics",
            Spec { binary: "mock-logistics", args: config_args(&logistics_config), env: Vec::new() },
        )?;
        self.wait_for_mocks().await
    }

    async fn wait_for_mocks(&self) -> anyhow::Result<()> {
        let client = self.downstreams()?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let wms = client.wms_ledger(0, 1, Duration::from_secs(1)).await;
            let logistics = client.logistics_ledger(0, 1, Duration::from_secs(1)).await;
            if wms.is_ok() && logistics.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "mocks did not start within 30 s (see {}): {wms:?} {logistics:?}",
                    self.dir.join("logs").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts consumer number `index` (`consumer-<index>`), or restarts it if it ran before.
    pub fn start_consumer(&mut self, index: usize) -> anyhow::Result<()> {
        let name = format!("consumer-{index}");
        if self.processes.names().contains(&name) {
            self.processes.restart(&name)?;
            return Ok(());
        }
        let spec = if self.spec.legacy {
            let path = self.write_config(&name, &self.legacy_config(&name))?;
            Spec {
                binary: "midflight-lab",
                args: vec!["legacy-consumer".into(), "--config".into(), path.display().to_string()],
                env: Vec::new(),
            }
        } else if self.spec.nostate {
            let path = self.write_config(&name, &self.nostate_config(&name))?;
            Spec {
                binary: "midflight-lab",
                args: vec!["nostate-consumer".into(), "--config".into(), path.display().to_string()],
                env: Vec::new(),
            }
        } else {
            let path = self.write_config(&name, &self.consumer_config(&name))?;
            Spec { binary: "consumer", args: service_args(&path, &self.spec.consumer_set), env: Vec::new() }
        };
        self.processes.start(&name, spec)?;
        Ok(())
    }

    pub fn start_recovery(&mut self, index: usize) -> anyhow::Result<()> {
        let name = format!("recovery-{index}");
        if self.processes.names().contains(&name) {
            self.processes.restart(&name)?;
            return Ok(());
        }
        let path = self.write_config(&name, &self.recovery_config(&name))?;
        let args = service_args(&path, &self.spec.recovery_set);
        self.processes.start(&name, Spec { binary: "recovery-worker", args, env: Vec::new() })?;
        Ok(())
    }

    pub fn signal(&mut self, name: &str, signal: Signal) -> anyhow::Result<()> {
        self.processes.signal(name, signal)
    }

    fn consumer_config(&self, name: &str) -> ConsumerConfig {
        let mut config = ConsumerConfig::default();
        config.consumer.instance = name.to_owned();
        config.consumer.saga_deadline_ms = self.spec.saga_deadline_ms;
        config.consumer.migrate_on_start = false;
        config.kafka = self.kafka_section();
        config.database = self.database();
        config.wms = self.grpc(&self.wms_endpoint);
        config.logistics = self.grpc(&self.logistics_endpoint);
        config.telemetry = self.telemetry();
        config.runtime = self.runtime();
        config.driver = self.driver();
        config.rules = self.rules();
        config
    }

    fn recovery_config(&self, name: &str) -> RecoveryConfig {
        let mut config = RecoveryConfig::default();
        config.recovery.instance = name.to_owned();
        config.recovery.scan_interval_ms = self.spec.recovery_scan_interval_ms;
        config.recovery.migrate_on_start = false;
        config.database = self.database();
        config.wms = self.grpc(&self.wms_endpoint);
        config.logistics = self.grpc(&self.logistics_endpoint);
        config.telemetry = self.telemetry();
        config.runtime = self.runtime();
        config.driver = self.driver();
        config.rules = self.rules();
        config
    }

    fn legacy_config(&self, name: &str) -> crate::legacy::LegacyConfig {
        crate::legacy::LegacyConfig {
            instance: name.to_owned(),
            kafka: self.kafka_section(),
            database: self.database(),
            wms: self.grpc(&self.wms_endpoint),
            logistics: self.grpc(&self.logistics_endpoint),
            telemetry: self.telemetry(),
            runtime: self.runtime(),
            timings_path: self.timings_path(name),
        }
    }

    fn nostate_config(&self, name: &str) -> crate::nostate::NoStateConfig {
        crate::nostate::NoStateConfig {
            instance: name.to_owned(),
            kafka: self.kafka_section(),
            database: self.database(),
            wms: self.grpc(&self.wms_endpoint),
            logistics: self.grpc(&self.logistics_endpoint),
            telemetry: self.telemetry(),
            runtime: self.runtime(),
            timings_path: self.timings_path(name),
            ..crate::nostate::NoStateConfig::default()
        }
    }

    /// Where a legacy or baseline-B consumer appends its timings (a restart appends too).
    pub fn timings_path(&self, name: &str) -> Option<PathBuf> {
        self.spec.timings.then(|| self.dir.join("timings").join(format!("{name}.csv")))
    }

    pub fn kafka_section(&self) -> KafkaSection {
        let mut section = KafkaSection {
            bootstrap_servers: self.kafka.bootstrap_servers().to_owned(),
            group_id: self.names.group.clone(),
            order_topic: self.names.order_topic.clone(),
            notification_topic: self.names.notification_topic.clone(),
            dead_letter_topic: self.names.dead_letter_topic.clone(),
            session_timeout_ms: self.spec.session_timeout_ms,
            group_protocol: self.spec.group_protocol.as_str().to_owned(),
            ..KafkaSection::default()
        };
        if self.spec.group_protocol == GroupProtocol::Classic {
            // Under KIP-848 the broker sets the interval (see `System::start`).
            section.properties.insert("heartbeat.interval.ms".to_owned(), HEARTBEAT_INTERVAL_MS.to_string());
        }
        // The embedded mock broker, and Tansu 0.6, answer a fetch that found no data only after
        // its whole wait (Apache Kafka answers when data arrives): a short wait keeps that out of
        // every latency, and costs a real Kafka only more empty fetches while idle.
        section
            .properties
            .insert("fetch.wait.max.ms".to_owned(), midflight_stack::kafka::TEST_FETCH_WAIT_MAX_MS.to_owned());
        section
    }

    pub fn database(&self) -> DatabaseSection {
        // SQLite allows one writer at a time across all processes; a few connections each suffice.
        let max_connections = if self.database_url.starts_with("sqlite") { 4 } else { 16 };
        DatabaseSection { url: self.services_database_url.clone(), max_connections, ..DatabaseSection::default() }
    }

    fn sqlite(&self, name: &str) -> DatabaseSection {
        DatabaseSection {
            url: format!("sqlite://{}?mode=rwc", self.dir.join(format!("{name}.db")).display()),
            ..DatabaseSection::default()
        }
    }

    fn grpc(&self, endpoint: &str) -> GrpcClientSection {
        GrpcClientSection { request_timeout_ms: self.spec.rpc_timeout_ms, ..GrpcClientSection::with_endpoint(endpoint) }
    }

    fn telemetry(&self) -> TelemetrySection {
        TelemetrySection {
            log_filter: self.spec.log_filter.clone(),
            log_format: self.spec.log_format.clone(),
            ..TelemetrySection::default()
        }
    }

    fn runtime(&self) -> RuntimeSection {
        RuntimeSection { worker_threads: self.spec.worker_threads }
    }

    fn driver(&self) -> DriverSettings {
        DriverSettings::new(self.spec.lease_ms, self.spec.rpc_timeout_ms, 500)
    }

    fn rules(&self) -> Rules {
        Rules { retry: self.spec.retry, ..Rules::default() }
    }

    /// Writes a child's configuration, refusing one the child would refuse itself.
    fn write_config<T: Serialize + midflight_config::Config>(&self, name: &str, config: &T) -> anyhow::Result<PathBuf> {
        let problems = config.problems();
        if !problems.is_empty() {
            bail!("the configuration of {name} is invalid:\n  - {}", problems.join("\n  - "));
        }
        let path = self.configs.join(format!("{name}.toml"));
        let text = toml::to_string_pretty(config).with_context(|| format!("cannot render the config of {name}"))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }

    /// A client of both mocks (ledgers, and calls for planted faults).
    pub fn downstreams(&self) -> anyhow::Result<Downstreams> {
        Ok(Downstreams::connect_lazy(
            &GrpcClientSection::with_endpoint(&self.wms_endpoint),
            &GrpcClientSection::with_endpoint(&self.logistics_endpoint),
        )?)
    }

    pub async fn set_wms_faults(&self, plan: &FaultPlan) -> anyhow::Result<()> {
        set_faults(&self.wms_endpoint, plan).await
    }

    pub async fn set_logistics_faults(&self, plan: &FaultPlan) -> anyhow::Result<()> {
        set_faults(&self.logistics_endpoint, plan).await
    }

    /// Stops every child: SIGTERM first (consumers leave the group, sagas release leases).
    pub fn shutdown(&mut self) {
        for name in self.processes.names() {
            if self.processes.is_running(&name) {
                self.processes.stop(&name).ok();
            }
        }
    }

    /// Drops the database this system created on the MySQL server (after [`System::shutdown`];
    /// nothing to do on SQLite, whose files stay in the run directory).
    pub async fn drop_server_database(&mut self) -> anyhow::Result<()> {
        let (Some(name), Some(server)) = (self.server_database.take(), self.spec.mysql_url.as_ref()) else {
            return Ok(());
        };
        drop_database(server, &name).await
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.processes.kill_all();
    }
}

async fn set_faults(endpoint: &str, plan: &FaultPlan) -> anyhow::Result<()> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_owned())?.connect().await?;
    FaultAdminClient::new(channel).set_faults(plan.to_proto()).await.context("set faults")?;
    Ok(())
}

fn config_args(path: &Path) -> Vec<String> {
    vec!["--config".to_owned(), path.display().to_string()]
}

/// A midflight service's arguments: its configuration file, then a `--set` for each setting.
fn service_args(path: &Path, settings: &[String]) -> Vec<String> {
    let mut args = config_args(path);
    for setting in settings {
        args.extend(["--set".to_owned(), setting.clone()]);
    }
    args
}

/// `N` distinct ports free right now on loopback (children bind them a moment later). The
/// listeners are held until all are chosen: a port let go at once can be handed out again, as
/// once gave both mocks the same port.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// The saga database's URL, and the name of the database created for it on the MySQL server.
async fn database_url(spec: &SystemSpec, dir: &Path) -> anyhow::Result<(String, Option<String>)> {
    let Some(server) = spec.mysql_url.as_ref().filter(|url| !url.is_empty()) else {
        return Ok((format!("sqlite://{}?mode=rwc", dir.join("saga.db").display()), None));
    };
    let name = server_database_name(&spec.name);
    on_server(server, &[format!("DROP DATABASE IF EXISTS {name}"), format!("CREATE DATABASE {name}")]).await?;
    Ok((midflight_config::with_database_name(server, &name), Some(name)))
}

/// The database a system named `system` creates on the MySQL server: this lab process's own.
fn server_database_name(system: &str) -> String {
    format!("midflight_{}_{}", system.replace('-', "_"), std::process::id())
}

/// Drops the database `name` on the MySQL server at `server`.
pub(crate) async fn drop_database(server: &str, name: &str) -> anyhow::Result<()> {
    on_server(server, &[format!("DROP DATABASE IF EXISTS {name}")])
        .await
        .with_context(|| format!("cannot drop the database {name}"))
}

/// Runs `statements` in order on a connection of their own to the MySQL server at `server`.
pub(crate) async fn on_server(server: &str, statements: &[String]) -> anyhow::Result<()> {
    use sea_orm::ConnectionTrait;
    let db = sea_orm::Database::connect(server).await.with_context(|| format!("cannot connect to {server}"))?;
    let mut result = Ok(());
    for statement in statements {
        result = db.execute_unprepared(statement).await.map(drop);
        if result.is_err() {
            break;
        }
    }
    db.close().await.ok();
    Ok(result?)
}

/// Whether the MySQL server at `server` holds a database named `name` (tests: nothing left behind).
#[cfg(test)]
pub(crate) async fn server_has_database(server: &str, name: &str) -> bool {
    use sea_orm::{ConnectionTrait, Statement};
    let db = sea_orm::Database::connect(server).await.expect("connect to the server");
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM information_schema.schemata WHERE schema_name = ?",
            [name.into()],
        ))
        .await
        .expect("list the databases")
        .expect("a count");
    db.close().await.ok();
    row.try_get::<i64>("", "n").expect("the count") > 0
}

/// Starts the proxy when the spec asks for one: services get a URL through it.
async fn proxied(spec: &SystemSpec, url: &str) -> anyhow::Result<(Option<crate::proxy::Proxy>, String)> {
    if !spec.database_proxy {
        return Ok((None, url.to_owned()));
    }
    let Some(rest) = url.strip_prefix("mysql://") else { bail!("the database proxy needs a MySQL URL") };
    let (credentials, tail) = rest.rsplit_once('@').map_or(("", rest), |(c, t)| (c, t));
    let (host_port, path) = tail.split_once('/').unwrap_or((tail, ""));
    let host_port = if host_port.contains(':') { host_port.to_owned() } else { format!("{host_port}:3306") };
    let upstream = tokio::net::lookup_host(&host_port).await?.next().context("cannot resolve the MySQL host")?;
    let proxy = crate::proxy::Proxy::start(upstream).await?;
    let at = if credentials.is_empty() { String::new() } else { format!("{credentials}@") };
    let through = format!("mysql://{at}{}/{path}", proxy.address);
    Ok((Some(proxy), through))
}

pub async fn connect(url: &str) -> anyhow::Result<Store> {
    let section = DatabaseSection { url: url.to_owned(), max_connections: 8, ..DatabaseSection::default() };
    Store::connect(&section).await.with_context(|| format!("cannot connect to {}", midflight_config::redact_url(url)))
}

#[cfg(test)]
mod tests {
    use super::{KafkaNames, System, SystemSpec, free_ports, server_database_name, server_has_database};

    /// A system that fails to start after its database was created leaves no database behind.
    /// (Here its children cannot start: the services' binaries are not beside a test binary, and
    /// the session timeout is one no consumer would accept.)
    #[tokio::test]
    async fn a_system_that_fails_to_start_drops_its_database() {
        let Some(server) = midflight_store::testing::mysql_server_url() else { return };
        let run_dir = std::env::temp_dir().join(format!("midflight-start-{}", uuid::Uuid::new_v4()));
        let mut spec = SystemSpec::new("failed-start", &run_dir);
        spec.mysql_url = Some(server.clone());
        spec.session_timeout_ms = 10;
        let name = server_database_name("failed-start");
        let Err(error) = System::start(spec).await else { panic!("the system started") };
        // It failed after creating the database: at its children, not before.
        let error = format!("{error:#}");
        assert!(
            error.contains("is not built") || error.contains("session_timeout_ms must be at least 1000"),
            "{error}"
        );
        assert!(!server_has_database(&server, &name).await, "{name} was left on the server after: {error}");
        std::fs::remove_dir_all(&run_dir).ok();
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports::<32>().expect("loopback ports");
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(!distinct.contains(&0), "{ports:?}");
    }

    #[test]
    fn names_on_an_external_kafka_are_the_runs_own_and_valid_topic_names() {
        let names = KafkaNames::unique("bench-1796275411", "midflight mariadb/peak");
        assert_eq!(names.order_topic, "lab.bench-1796275411.midflight-mariadb-peak.orders");
        assert_eq!(names.dead_letter_topic, "lab.bench-1796275411.midflight-mariadb-peak.orders.dlt");
        assert_eq!(names.group, "lab.bench-1796275411.midflight-mariadb-peak.midflight-orders");
        for topic in [&names.order_topic, &names.notification_topic, &names.dead_letter_topic] {
            assert!(topic.len() <= 249, "Kafka's limit: {topic}");
            assert!(topic.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{topic}");
        }
        assert_ne!(names, KafkaNames::unique("bench-1796275411", "baseline-b-peak"), "one system's names each");
        assert_eq!(KafkaNames::fixed().order_topic, "orders", "the embedded cluster keeps the user's names");
    }
}
