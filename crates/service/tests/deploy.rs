//! Static checks of the deployment files, so they cannot silently rot on machines without a
//! Docker engine or a cluster: `docker-compose.yml`, `deploy/Dockerfile`, the collector,
//! Prometheus and Grafana configuration, the dashboard, and the Kubernetes manifests.
//!
//! The strongest check: every `MIDFLIGHT_*` variable a container gets (from the Dockerfile, the
//! compose file, a ConfigMap, a Secret or a container's `env`) is loaded, together with the
//! others that container gets, through `midflight_config::load` into the real configuration type
//! of the binary the container runs, must be accepted, and must land on a key of it. Addresses
//! are then cross-checked: an endpoint names a service that listens on that port, probes and
//! healthchecks hit the port the metrics endpoint is configured on, the dashboard queries only
//! metrics the services export (the catalogue in `midflight_service::metrics`, which a scrape
//! test holds to what the services really export).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use midflight_config::{Config, Sources};
use midflight_consumer::ConsumerConfig;
use midflight_mock_logistics::LogisticsConfig;
use midflight_mock_wms::WmsConfig;
use midflight_recovery::RecoveryConfig;
use midflight_service::metrics::{CATALOGUE, Kind};
use serde::Serialize;
use serde_json::Value;

/// Images with no shell or HTTP client to run a healthcheck with; they must say so
/// (`healthcheck: { disable: true }`) rather than leave it out.
const SHELL_LESS_IMAGES: [&str; 1] = ["otel/opentelemetry-collector-contrib"];
/// The binaries the services run, and the configuration type each reads.
const SERVICE_BINARIES: [&str; 5] = ["consumer", "recovery-worker", "mock-wms", "mock-logistics", "sagactl"];
/// MySQL 8's default `max_connections`: what the saga database allows unless its operator
/// raised it.
const MYSQL_MAX_CONNECTIONS_DEFAULT: u64 = 151;
/// Connections left over for operators, the migrate Job, sagactl and monitoring.
const MYSQL_CONNECTIONS_HEADROOM: u64 = 25;
/// The compose file's consumers are counted at the user's scale (`--scale consumer=8`).
const COMPOSE_CONSUMERS_AT_SCALE: u64 = 8;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// YAML as JSON values, merge keys (`<<`) applied; one value per document.
fn yaml_documents(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| {
            let mut value = <serde_yaml::Value as serde::Deserialize>::deserialize(document)
                .unwrap_or_else(|e| panic!("{path} is not valid YAML: {e}"));
            value.apply_merge().unwrap_or_else(|e| panic!("{path}: bad merge key: {e}"));
            serde_json::to_value(value).unwrap_or_else(|e| panic!("{path}: not representable as JSON: {e}"))
        })
        .filter(|value| !value.is_null())
        .collect()
}

fn yaml(path: &str) -> Value {
    let mut documents = yaml_documents(path);
    assert_eq!(documents.len(), 1, "{path}: one document expected");
    documents.remove(0)
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items.iter().map(text).collect(),
        Value::Null => Vec::new(),
        other => vec![text(other)],
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration: variables into the real types
// ---------------------------------------------------------------------------------------------

/// A service's configuration, loaded from variables, as JSON (for cross-checks).
#[derive(Debug)]
struct Loaded {
    binary: String,
    config: Value,
}

impl Loaded {
    fn at(&self, pointer: &str) -> String {
        text(self.config.pointer(pointer).unwrap_or_else(|| panic!("{}: no {pointer}", self.binary)))
    }

    fn metrics_port(&self) -> u16 {
        port(&self.at("/telemetry/metrics_listen")).unwrap_or_else(|| panic!("{}: metrics endpoint off", self.binary))
    }
}

/// The most connections a service's pool opens to a MySQL saga database (`None`: SQLite).
fn mysql_pool(loaded: &Loaded) -> Option<u64> {
    loaded
        .at("/database/url")
        .starts_with("mysql://")
        .then(|| loaded.at("/database/max_connections").parse().expect("database.max_connections is a number"))
}

/// Fails unless the pools, each counted as many times as it runs, fit the server with room to
/// spare. `pools` holds (what runs, how many run at once, its pool size).
fn assert_pools_fit(what: &str, server_max: u64, pools: &[(String, u64, u64)]) {
    let total: u64 = pools.iter().map(|(_, count, pool)| count * pool).sum();
    let budget = server_max - MYSQL_CONNECTIONS_HEADROOM;
    assert!(
        total <= budget,
        "{what}: the saga database pools open up to {total} connections ({pools:?}: what, how many, \
         pool size), more than the {budget} a server with max_connections {server_max} leaves after \
         {MYSQL_CONNECTIONS_HEADROOM} for operators; at the peak the surplus gets \"Too many connections\" \
         and the sagas whose writes fail wait for their leases"
    );
}

/// Loads `env` into the configuration type of `binary`; `context` names the container.
fn load(binary: &str, env: &BTreeMap<String, String>, context: &str) -> Loaded {
    fn typed<T: Config>(sources: &Sources, context: &str) -> Value {
        match midflight_config::load::<T>(sources) {
            Ok(config) => json(&config),
            Err(error) => panic!("{context}: its MIDFLIGHT_* variables are refused by the service: {error}"),
        }
    }
    let sources = Sources { file: None, env: env.clone().into_iter().collect(), overrides: Vec::new() };
    let config = match binary {
        "consumer" => typed::<ConsumerConfig>(&sources, context),
        "recovery-worker" | "sagactl" => typed::<RecoveryConfig>(&sources, context),
        "mock-wms" => typed::<WmsConfig>(&sources, context),
        "mock-logistics" => typed::<LogisticsConfig>(&sources, context),
        other => panic!("{context}: runs {other:?}, which is none of {SERVICE_BINARIES:?}"),
    };
    // The loader ignores a MIDFLIGHT_ variable without a section (it may be another tool's):
    // here every one must name a section and land on a key of the configuration.
    for (name, value) in env.iter().filter(|(name, _)| name.starts_with("MIDFLIGHT_")) {
        let path: Vec<String> = name["MIDFLIGHT_".len()..].split("__").map(str::to_ascii_lowercase).collect();
        assert!(path.len() >= 2, "{context}: {name} names no section (MIDFLIGHT_SECTION__KEY); the service ignores it");
        let pointer = format!("/{}", path.join("/"));
        let landed = config
            .pointer(&pointer)
            .unwrap_or_else(|| panic!("{context}: {name} sets nothing in {binary}'s configuration"));
        assert_eq!(
            text(landed).to_ascii_lowercase(),
            value.to_ascii_lowercase(),
            "{context}: {name} did not take effect"
        );
    }
    Loaded { binary: binary.to_owned(), config }
}

fn json<T: Serialize>(config: &T) -> Value {
    serde_json::to_value(config).expect("a configuration serialises")
}

/// The port of `host:port` or `scheme://host:port/...`.
fn port(address: &str) -> Option<u16> {
    host_port(address).map(|(_, port)| port)
}

fn host_port(address: &str) -> Option<(String, u16)> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next()?;
    let (host, port) = authority.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile
// ---------------------------------------------------------------------------------------------

struct Dockerfile {
    /// Binaries `cargo build --bin` builds and the final image carries.
    binaries: BTreeSet<String>,
    /// `MIDFLIGHT_*` defaults set with ENV in the final image.
    env: BTreeMap<String, String>,
    text: String,
}

fn dockerfile() -> Dockerfile {
    let text = read("deploy/Dockerfile");
    // Continuation lines joined, so one instruction is one line.
    let joined = text.replace("\\\n", " ");
    let words: Vec<&str> = joined.split_whitespace().collect();
    let binaries: BTreeSet<String> =
        words.windows(2).filter(|pair| pair[0] == "--bin").map(|pair| pair[1].to_owned()).collect();
    let copied: BTreeSet<String> =
        words.iter().filter_map(|word| word.strip_prefix("target/release/")).map(str::to_owned).collect();
    assert_eq!(binaries, copied, "deploy/Dockerfile: every binary built is copied into the image, and only those");
    let final_stage = joined.rsplit_once("\nFROM ").map_or(joined.as_str(), |(_, last)| last);
    let mut env = BTreeMap::new();
    for line in final_stage.lines().filter_map(|line| line.trim().strip_prefix("ENV ")) {
        for pair in line.split_whitespace() {
            if let Some((name, value)) = pair.split_once('=') {
                env.insert(name.to_owned(), value.to_owned());
            }
        }
    }
    Dockerfile { binaries, env, text }
}

/// `[[bin]]` names of the workspace's crates.
fn workspace_binaries() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let manifest = entry.expect("entry").path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else { continue };
        for section in text.split("[[bin]]").skip(1) {
            let name = section.lines().find_map(|line| line.trim().strip_prefix("name = "));
            if let Some(name) = name {
                names.insert(name.trim_matches('"').to_owned());
            }
        }
    }
    names
}

#[test]
fn the_dockerfile_builds_every_service_binary() {
    let docker = dockerfile();
    assert!(docker.text.contains("FROM rust:1.95-bookworm AS builder"), "builder stage on rust:1.95-bookworm");
    for package in ["cmake", "build-essential"] {
        assert!(docker.text.contains(package), "the builder installs {package} for librdkafka's bundled build");
    }
    assert!(docker.text.contains("--locked"), "the image builds the locked dependency versions");
    let real = workspace_binaries();
    for binary in &docker.binaries {
        assert!(real.contains(binary), "deploy/Dockerfile builds {binary}, which no crate defines ({real:?})");
    }
    for binary in SERVICE_BINARIES {
        assert!(docker.binaries.contains(binary), "deploy/Dockerfile does not build {binary}");
    }
    // The image defaults must suit every binary it carries.
    for binary in SERVICE_BINARIES {
        load(binary, &docker.env, &format!("deploy/Dockerfile ENV for {binary}"));
    }
    let ignored = read(".dockerignore");
    assert!(ignored.lines().any(|line| line.trim() == "target/"), ".dockerignore keeps target/ out of the context");
}

// ---------------------------------------------------------------------------------------------
// docker-compose.yml
// ---------------------------------------------------------------------------------------------

struct Compose {
    services: BTreeMap<String, Value>,
}

impl Compose {
    fn load() -> Compose {
        let document = yaml("docker-compose.yml");
        let services = document["services"].as_object().expect("services").clone().into_iter().collect();
        Compose { services }
    }

    fn one_shot(service: &Value) -> bool {
        text(&service["restart"]) == "no"
    }

    fn ours(service: &Value) -> bool {
        text(&service["image"]).starts_with("midflight:")
    }

    fn env(service: &Value) -> BTreeMap<String, String> {
        match &service["environment"] {
            Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), text(v))).collect(),
            Value::Array(items) => items
                .iter()
                .map(|item| {
                    let item = text(item);
                    let (k, v) = item.split_once('=').unwrap_or((item.as_str(), ""));
                    (k.to_owned(), v.to_owned())
                })
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// Container ports a service listens on (`expose` and the container side of `ports`).
    fn ports(service: &Value) -> BTreeSet<u16> {
        let mut ports = BTreeSet::new();
        for entry in strings(&service["expose"]) {
            ports.extend(entry.parse::<u16>());
        }
        for entry in strings(&service["ports"]) {
            ports
                .extend(entry.rsplit(':').next().and_then(|p| p.split('/').next()).and_then(|p| p.parse::<u16>().ok()));
        }
        ports
    }

    /// Each of our services' configuration, loaded from the image's defaults and its variables.
    fn configs(&self, docker: &Dockerfile) -> BTreeMap<String, Loaded> {
        let mut configs = BTreeMap::new();
        for (name, service) in self.services.iter().filter(|(_, s)| Compose::ours(s)) {
            let command = strings(&service["command"]);
            let binary = command.first().unwrap_or_else(|| panic!("compose {name}: no command names its binary"));
            assert!(docker.binaries.contains(binary), "compose {name} runs {binary}, which the image does not carry");
            let mut env = docker.env.clone();
            env.extend(Compose::env(service));
            configs.insert(name.clone(), load(binary, &env, &format!("compose service {name}")));
        }
        configs
    }
}

#[test]
fn every_compose_service_is_complete_and_its_dependencies_exist() {
    let compose = Compose::load();
    for required in
        ["kafka-1", "kafka-2", "kafka-3", "mysql", "consumer", "recovery-worker", "mock-wms", "mock-logistics"]
    {
        assert!(compose.services.contains_key(required), "compose has no {required}");
    }
    for required in ["otel-collector", "jaeger", "prometheus", "grafana"] {
        assert!(compose.services.contains_key(required), "compose has no {required}");
    }
    for (name, service) in &compose.services {
        assert!(service.get("image").is_some() || service.get("build").is_some(), "compose {name}: no image or build");
        if Compose::ours(service) {
            assert!(service.get("build").is_some(), "compose {name}: our image is built here, not pulled");
            assert_eq!(text(&service["build"]["dockerfile"]), "deploy/Dockerfile", "compose {name}");
        }
        if !Compose::one_shot(service) {
            assert!(!Compose::ports(service).is_empty(), "compose {name}: declares no ports (ports or expose)");
            let healthcheck = &service["healthcheck"];
            assert!(healthcheck.is_object(), "compose {name}: no healthcheck");
            if healthcheck["disable"] == Value::Bool(true) {
                let image = text(&service["image"]);
                assert!(
                    SHELL_LESS_IMAGES.iter().any(|prefix| image.starts_with(prefix)),
                    "compose {name}: healthcheck disabled, but {image} is not known to lack a shell"
                );
            } else {
                assert!(!strings(&healthcheck["test"]).is_empty(), "compose {name}: healthcheck without a test");
            }
        }
        let Some(depends) = service.get("depends_on") else { continue };
        let depends = depends.as_object().unwrap_or_else(|| panic!("compose {name}: depends_on must name conditions"));
        for (target, how) in depends {
            let other =
                compose.services.get(target).unwrap_or_else(|| panic!("compose {name} depends on unknown {target}"));
            let condition = text(&how["condition"]);
            match condition.as_str() {
                "service_started" => {}
                "service_healthy" => {
                    let check = &other["healthcheck"];
                    assert!(
                        !strings(&check["test"]).is_empty() && check["disable"] != Value::Bool(true),
                        "compose {name} waits for {target} to be healthy, but {target} has no healthcheck"
                    );
                }
                "service_completed_successfully" => {
                    assert!(
                        Compose::one_shot(other),
                        "compose {name} waits for {target} to complete, but it is long-running"
                    )
                }
                other => panic!("compose {name} -> {target}: unknown condition {other:?}"),
            }
        }
    }
    // Bind-mounted files exist.
    for (name, service) in &compose.services {
        for volume in strings(&service["volumes"]) {
            if let Some(source) = volume.strip_prefix("./") {
                let source = source.split(':').next().unwrap_or_default();
                assert!(root().join(source).exists(), "compose {name} mounts ./{source}, which does not exist");
            }
        }
    }
    let consumers = compose.services["consumer"]["deploy"]["replicas"].as_u64().unwrap_or(1);
    assert!(consumers >= 2, "the consumer runs scaled to several replicas, not {consumers}");
}

#[test]
fn compose_pools_fit_the_databases_connection_limit_at_the_users_scale() {
    let compose = Compose::load();
    let docker = dockerfile();
    let mysql = &compose.services["mysql"];
    let server_max = strings(&mysql["command"])
        .iter()
        .find_map(|arg| arg.strip_prefix("--max-connections=").or_else(|| arg.strip_prefix("--max_connections=")))
        .map_or(MYSQL_MAX_CONNECTIONS_DEFAULT, |n| n.parse().expect("a number of connections"));
    let mut pools = Vec::new();
    for (name, loaded) in compose.configs(&docker) {
        let service = &compose.services[&name];
        if Compose::one_shot(service) {
            continue;
        }
        if let Some(pool) = mysql_pool(&loaded) {
            let replicas = service["deploy"]["replicas"].as_u64().unwrap_or(1);
            let replicas = if name == "consumer" { replicas.max(COMPOSE_CONSUMERS_AT_SCALE) } else { replicas };
            pools.push((name, replicas, pool));
        }
    }
    assert!(pools.iter().any(|(name, _, _)| name == "consumer"), "the consumers use the MySQL saga database");
    assert_pools_fit("docker-compose.yml", server_max, &pools);
}

#[test]
fn compose_variables_are_accepted_by_the_services_and_addresses_line_up() {
    let compose = Compose::load();
    let docker = dockerfile();
    let configs = compose.configs(&docker);
    let service_ports = |host: &str| -> BTreeSet<u16> {
        let service =
            compose.services.get(host).unwrap_or_else(|| panic!("an address names {host}, no compose service"));
        Compose::ports(service)
    };
    for (name, loaded) in &configs {
        let service = &compose.services[name];
        if Compose::one_shot(service) {
            continue;
        }
        // The healthcheck asks the metrics endpoint, on the port it is configured on.
        let metrics = loaded.metrics_port();
        let check = strings(&service["healthcheck"]["test"]).join(" ");
        assert!(
            check.contains(&format!(":{metrics}/readyz")),
            "compose {name}: healthcheck `{check}` misses /readyz on {metrics}"
        );
        assert!(Compose::ports(service).contains(&metrics), "compose {name}: metrics port {metrics} not exposed");
        if let Some(listen) = loaded.config.pointer("/server/listen") {
            let listen = port(&text(listen)).expect("server.listen has a port");
            assert!(Compose::ports(service).contains(&listen), "compose {name}: gRPC port {listen} not exposed");
            assert!(
                text(listen_host(&loaded.config)).starts_with("0.0.0.0"),
                "compose {name}: listens on loopback only"
            );
        }
        // Downstream endpoints name a mock that serves on that port.
        for section in ["/wms/endpoint", "/logistics/endpoint"] {
            let Some(endpoint) = loaded.config.pointer(section) else { continue };
            let (host, wanted) = host_port(&text(endpoint)).expect("endpoint host:port");
            let target = configs
                .get(&host)
                .unwrap_or_else(|| panic!("compose {name}: {section} names {host}, not a service of ours"));
            assert_eq!(
                port(&target.at("/server/listen")),
                Some(wanted),
                "compose {name}: {section} port is not where {host} listens"
            );
        }
        if let Some(endpoint) = loaded.config.pointer("/telemetry/otlp_endpoint").filter(|v| !v.is_null()) {
            let (host, port) = host_port(&text(endpoint)).expect("otlp endpoint host:port");
            assert!(service_ports(&host).contains(&port), "compose {name}: OTLP endpoint {host}:{port} not served");
        }
    }
    // The saga database: the MySQL service, with the credentials it was created with.
    let mysql = Compose::env(&compose.services["mysql"]);
    for (name, loaded) in configs.iter().filter(|(_, l)| l.binary != "mock-wms" && l.binary != "mock-logistics") {
        let url = loaded.at("/database/url");
        let expected = format!(
            "mysql://{}:{}@mysql:3306/{}",
            mysql["MYSQL_USER"], mysql["MYSQL_PASSWORD"], mysql["MYSQL_DATABASE"]
        );
        assert_eq!(url, expected, "compose {name}: database URL does not match the mysql service");
    }
    // Kafka: three KRaft brokers, and the topics the consumer reads and writes are created.
    let consumer = &configs["consumer"];
    for host in consumer.at("/kafka/bootstrap_servers").split(',') {
        let (host, port) = host_port(host).expect("bootstrap host:port");
        assert!(
            service_ports(&host).contains(&port) || kafka_listens(&compose.services[&host], port),
            "bootstrap {host}:{port}"
        );
    }
    let voters: BTreeSet<String> = (1..=3).map(|n| format!("{n}@kafka-{n}:9093")).collect();
    for n in 1..=3 {
        let env = Compose::env(&compose.services[&format!("kafka-{n}")]);
        assert_eq!(env["KAFKA_NODE_ID"], n.to_string());
        assert!(
            env["KAFKA_PROCESS_ROLES"].contains("broker") && env["KAFKA_PROCESS_ROLES"].contains("controller"),
            "KRaft"
        );
        let listed: BTreeSet<String> = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(',').map(str::to_owned).collect();
        assert_eq!(listed, voters, "kafka-{n}: the quorum is the three brokers");
    }
    let init = strings(&compose.services["kafka-init"]["command"]).join(" ");
    for (topic, partitions) in [
        (consumer.at("/kafka/order_topic"), Some(16)),
        (consumer.at("/kafka/notification_topic"), None),
        (consumer.at("/kafka/dead_letter_topic"), None),
    ] {
        let spec = init.split_whitespace().find(|word| word.split(':').next() == Some(topic.as_str()));
        let spec = spec.unwrap_or_else(|| panic!("kafka-init does not create {topic}"));
        if let Some(partitions) = partitions {
            assert_eq!(spec, format!("{topic}:{partitions}"), "the user's 16 partitions");
        }
    }
    for name in ["consumer", "recovery-worker"] {
        assert_eq!(
            configs[name]
                .at(&format!("/{}/migrate_on_start", if name == "consumer" { "consumer" } else { "recovery" })),
            "false",
            "compose {name}: the migrate job owns the schema"
        );
        let depends = &compose.services[name]["depends_on"]["migrate"]["condition"];
        assert_eq!(text(depends), "service_completed_successfully", "compose {name} starts after the migrations");
    }
    assert_eq!(strings(&compose.services["migrate"]["command"]), ["sagactl", "migrate"]);
}

fn listen_host(config: &Value) -> &Value {
    config.pointer("/server/listen").unwrap_or(&Value::Null)
}

fn kafka_listens(service: &Value, port: u16) -> bool {
    Compose::env(service).get("KAFKA_LISTENERS").is_some_and(|listeners| listeners.contains(&format!(":{port}")))
}

#[test]
fn prometheus_collector_and_grafana_point_at_the_services() {
    let compose = Compose::load();
    let configs = compose.configs(&dockerfile());
    // Prometheus scrapes every long-running service of ours on its metrics port.
    let prometheus = yaml("deploy/prometheus.yml");
    let mut scraped: BTreeMap<String, u16> = BTreeMap::new();
    for job in prometheus["scrape_configs"].as_array().expect("scrape_configs") {
        for sd in job["dns_sd_configs"].as_array().into_iter().flatten() {
            for name in strings(&sd["names"]) {
                scraped.insert(name, sd["port"].as_u64().and_then(|p| u16::try_from(p).ok()).expect("port"));
            }
        }
        for target in job["static_configs"].as_array().into_iter().flatten().flat_map(|s| strings(&s["targets"])) {
            let (host, port) = host_port(&target).expect("target host:port");
            scraped.insert(host, port);
        }
    }
    for (name, loaded) in configs.iter().filter(|(name, _)| !Compose::one_shot(&compose.services[*name])) {
        assert_eq!(
            scraped.get(name),
            Some(&loaded.metrics_port()),
            "prometheus does not scrape {name} on its metrics port"
        );
    }
    // The collector receives OTLP/gRPC where the services send it and forwards traces to Jaeger.
    let collector = yaml("deploy/otel-collector.yaml");
    let grpc = text(&collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]);
    for (name, loaded) in &configs {
        if let Some(endpoint) = loaded.config.pointer("/telemetry/otlp_endpoint").filter(|v| !v.is_null()) {
            assert_eq!(port(&text(endpoint)), port(&grpc), "compose {name}: OTLP port is not the collector's");
        }
    }
    let traces = &collector["service"]["pipelines"]["traces"];
    for exporter in strings(&traces["exporters"]) {
        assert!(
            collector["exporters"].get(&exporter).is_some(),
            "collector pipeline uses undefined exporter {exporter}"
        );
        let (host, _) = host_port(&text(&collector["exporters"][&exporter]["endpoint"])).expect("exporter endpoint");
        assert!(compose.services.contains_key(&host), "collector exports traces to {host}, not a compose service");
    }
    for receiver in strings(&traces["receivers"]) {
        assert!(collector["receivers"].get(&receiver).is_some(), "undefined receiver {receiver}");
    }
    for processor in strings(&traces["processors"]) {
        assert!(collector["processors"].get(&processor).is_some(), "undefined processor {processor}");
    }
    // Grafana reads that Prometheus and the mounted dashboards.
    let datasources = yaml("deploy/grafana/provisioning/datasources/prometheus.yaml");
    let url = text(&datasources["datasources"][0]["url"]);
    let (host, port) = host_port(&url).expect("datasource url");
    assert!(Compose::ports(&compose.services[&host]).contains(&port), "grafana's data source {url} is not served");
    let providers = yaml("deploy/grafana/provisioning/dashboards/midflight.yaml");
    let path = text(&providers["providers"][0]["options"]["path"]);
    let mounted = strings(&compose.services["grafana"]["volumes"])
        .into_iter()
        .any(|volume| volume == format!("./deploy/grafana/dashboards:{path}:ro"));
    assert!(mounted, "grafana does not mount deploy/grafana/dashboards at {path}");
}

// ---------------------------------------------------------------------------------------------
// The dashboard
// ---------------------------------------------------------------------------------------------

/// Every series name the services export.
fn exported_series() -> BTreeSet<String> {
    let mut series = BTreeSet::new();
    for spec in CATALOGUE {
        series.insert(spec.prometheus.to_owned());
        if spec.kind == Kind::Histogram {
            for suffix in ["_bucket", "_sum", "_count"] {
                series.insert(format!("{}{suffix}", spec.prometheus));
            }
        }
    }
    series.extend(midflight_consumer::telemetry::metric_names());
    series.extend(midflight_recovery::telemetry::metric_names());
    series
}

/// Metric names in a PromQL expression: identifiers outside label matchers, outside `by (...)`
/// style label lists, that are not keywords or function calls.
fn promql_metrics(expr: &str) -> Vec<String> {
    const KEYWORDS: [&str; 11] =
        ["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"];
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let chars: Vec<char> = expr.chars().collect();
    let (mut names, mut i, mut braces, mut parens) = (Vec::new(), 0, 0_i32, 0_i32);
    let mut label_list_at: Option<i32> = None;
    let mut last_word = String::new();
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && !(chars[i] == '"' && chars[i - 1] != '\\') {
                i += 1;
            }
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
        } else if c == '{' {
            braces += 1;
        } else if c == '}' {
            braces -= 1;
        } else if c == '(' {
            parens += 1;
            if LABEL_LISTS.contains(&last_word.as_str()) {
                label_list_at = Some(parens);
            }
        } else if c == ')' {
            if label_list_at == Some(parens) {
                label_list_at = None;
            }
            parens -= 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A function call, or an aggregation written `sum by (..) (..)`.
            let rest: String = chars[i..].iter().collect();
            let rest = rest.trim_start();
            let call = rest.starts_with('(')
                || ["by", "without"]
                    .iter()
                    .any(|k| rest.strip_prefix(k).is_some_and(|after| after.trim_start().starts_with('(')));
            if braces == 0 && label_list_at.is_none() && !call && !KEYWORDS.contains(&word.as_str()) {
                names.push(word.clone());
            }
            last_word = word;
            continue;
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !c.is_whitespace() && c != '(' {
            last_word.clear();
        }
        i += 1;
    }
    names
}

/// The metrics `expr` names, each checked to be exported; `what` names the query's owner in
/// the failure.
fn exported_metrics_of(what: &str, expr: &str, exported: &BTreeSet<String>) -> Vec<String> {
    let metrics = promql_metrics(expr);
    assert!(!metrics.is_empty(), "{what}: `{expr}` names no metric");
    for metric in &metrics {
        assert!(exported.contains(metric), "{what}: `{metric}` is not exported by any service");
    }
    metrics
}

#[test]
fn promql_metric_names_are_found_and_labels_are_not() {
    let expr = r#"histogram_quantile(0.99, sum by (le, rpc_method) (rate(rpc_client_duration_seconds_bucket{rpc_method=~"Lock.*"}[5m]))) / on (x) midflight_sagas"#;
    assert_eq!(promql_metrics(expr), ["rpc_client_duration_seconds_bucket", "midflight_sagas"]);
}

#[test]
fn the_dashboard_queries_only_exported_metrics_and_covers_the_issue() {
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/midflight.json")).expect("the dashboard is valid JSON");
    assert_eq!(text(&dashboard["uid"]), "midflight");
    let exported = exported_series();
    let mut used = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = text(&panel["title"]);
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("panel {title} has no queries"));
        assert!(!targets.is_empty(), "panel {title} has no queries");
        for target in targets {
            used.extend(exported_metrics_of(&format!("panel {title}"), &text(&target["expr"]), &exported));
        }
    }
    // What the issue asks the dashboard to show.
    for (what, metric) in [
        ("sagas in flight", "midflight_sagas"),
        ("state ages", "midflight_saga_oldest_age_seconds"),
        ("step latency", "midflight_saga_step_duration_seconds_bucket"),
        ("rpc latency", "rpc_client_duration_seconds_bucket"),
        ("conflicts", "midflight_saga_cas_conflicts_total"),
        ("takeovers", "midflight_saga_takeovers_total"),
        ("tickets", "midflight_tickets_open"),
        ("consumer lag", "midflight_consumer_lag"),
        ("reconciler findings", "midflight_reconciler_findings_total"),
    ] {
        assert!(used.contains(metric), "the dashboard shows no {what} ({metric})");
    }
}

#[test]
fn the_alert_rules_are_loaded_and_query_only_exported_metrics() {
    // The compose Prometheus loads the rules file from where compose mounts it.
    let prometheus = yaml("deploy/prometheus.yml");
    let compose = Compose::load();
    let volumes = strings(&compose.services["prometheus"]["volumes"]);
    for path in strings(&prometheus["rule_files"]) {
        let mounted = volumes.iter().any(|volume| volume == &format!("./deploy/alerts.yml:{path}:ro"));
        assert!(mounted, "prometheus loads {path}, which compose does not mount from deploy/alerts.yml");
    }
    assert!(!strings(&prometheus["rule_files"]).is_empty(), "prometheus loads no rules");

    let rules = yaml("deploy/alerts.yml");
    let exported = exported_series();
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let alert = text(&rule["alert"]);
            assert!(alerts.insert(alert.clone()), "alert {alert} is defined twice");
            used.extend(exported_metrics_of(&format!("alert {alert}"), &text(&rule["expr"]), &exported));
            let severity = text(&rule["labels"]["severity"]);
            assert!(
                ["critical", "warning", "ticket"].contains(&severity.as_str()),
                "alert {alert}: severity {severity}"
            );
            assert!(!text(&rule["annotations"]["summary"]).is_empty(), "alert {alert} has no summary");
            assert!(!text(&rule["annotations"]["description"]).is_empty(), "alert {alert} has no description");
        }
    }
    // What must page someone: a double effect, a saga nobody drives, recovery down, a stuck
    // group (holding nothing, or part of the topic), a person's ticket, a database out of
    // connections.
    for metric in [
        "midflight_reconciler_findings_total",
        "midflight_saga_oldest_age_seconds",
        "midflight_recovery_scans_total",
        "midflight_consumer_partitions_assigned",
        "midflight_consumer_topic_partitions",
        "midflight_tickets_open",
        "midflight_store_refused_total",
    ] {
        assert!(used.contains(metric), "no alert watches {metric}");
    }
}

/// Where promtool is, for the alerting rules' own tests (`.ci/run` fetches it).
const PROMTOOL_VAR: &str = "MIDFLIGHT_PROMTOOL";

#[test]
fn the_alert_rules_fire_as_their_tests_expect() {
    let Some(promtool) = midflight_store::testing::required_in_ci(
        PROMTOOL_VAR,
        "promtool's tests of the alerting rules",
        "promtool's tests of deploy/alerts.yml",
    ) else {
        return;
    };
    for args in [["check", "rules", "deploy/alerts.yml"], ["test", "rules", "deploy/alerts.test.yml"]] {
        let output = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(root())
            .output()
            .unwrap_or_else(|error| panic!("{PROMTOOL_VAR}={promtool} could not run: {error}"));
        assert!(
            output.status.success(),
            "promtool {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------------------------

struct Manifests {
    objects: Vec<(String, Value)>,
}

impl Manifests {
    fn load() -> Manifests {
        let mut objects = Vec::new();
        let dir = root().join("deploy/k8s");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("deploy/k8s")
            .filter_map(|entry| entry.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
            .collect();
        files.sort();
        let kustomization = yaml("deploy/k8s/kustomization.yaml");
        let listed: BTreeSet<String> = strings(&kustomization["resources"]).into_iter().collect();
        assert_eq!(listed, files.iter().cloned().collect(), "kustomization.yaml lists exactly the manifests");
        for file in files {
            for object in yaml_documents(&format!("deploy/k8s/{file}")) {
                assert!(
                    object["apiVersion"].is_string() && object["kind"].is_string(),
                    "{file}: object without apiVersion/kind"
                );
                assert!(object["metadata"]["name"].is_string(), "{file}: object without a name");
                objects.push((file.clone(), object));
            }
        }
        Manifests { objects }
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().map(|(_, object)| object).filter(move |object| object["kind"] == kind)
    }

    fn named<'a>(&'a self, kind: &'a str, name: &str) -> Option<&'a Value> {
        self.of_kind(kind).find(|object| object["metadata"]["name"] == name)
    }

    /// The variables a container gets, in Kubernetes order: image defaults, envFrom, env.
    fn env(&self, container: &Value, docker: &Dockerfile, context: &str) -> BTreeMap<String, String> {
        let mut env = docker.env.clone();
        for source in container["envFrom"].as_array().into_iter().flatten() {
            let (kind, name, field) = if source["configMapRef"].is_object() {
                ("ConfigMap", text(&source["configMapRef"]["name"]), "data")
            } else {
                ("Secret", text(&source["secretRef"]["name"]), "stringData")
            };
            let object =
                self.named(kind, &name).unwrap_or_else(|| panic!("{context}: envFrom names unknown {kind} {name}"));
            for (key, value) in object[field].as_object().into_iter().flatten() {
                env.insert(key.clone(), text(value));
            }
        }
        for item in container["env"].as_array().into_iter().flatten() {
            env.insert(text(&item["name"]), text(&item["value"]));
        }
        env
    }
}

/// Pods of a Deployment at once, a rolling update's surge included (Kubernetes' default surge
/// is 25%, rounded up). Pods still stopping during a rollout, the migrate Job and the init
/// containers (one short-lived connection each) are left to the headroom. Only Deployments run
/// services here; a StatefulSet or CronJob on the saga database would have to be counted too.
fn pods_at_most(deployment: &Value) -> u64 {
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
    let strategy = &deployment["spec"]["strategy"];
    if strategy["type"] == "Recreate" {
        return replicas;
    }
    let surge = match &strategy["rollingUpdate"]["maxSurge"] {
        Value::Number(n) => n.as_u64().expect("maxSurge is a count"),
        Value::String(percent) => {
            let percent: u64 = percent.trim_end_matches('%').parse().expect("maxSurge is a count or a percentage");
            (replicas * percent).div_ceil(100)
        }
        _ => replicas.div_ceil(4),
    };
    replicas + surge
}

#[test]
fn kubernetes_pools_fit_the_databases_connection_limit() {
    let manifests = Manifests::load();
    let docker = dockerfile();
    let mut pools = Vec::new();
    for deployment in manifests.of_kind("Deployment") {
        let name = text(&deployment["metadata"]["name"]);
        for container in deployment["spec"]["template"]["spec"]["containers"].as_array().expect("containers") {
            let context = format!("Deployment {name} container {}", text(&container["name"]));
            let binary = strings(&container["args"]).first().cloned().expect("args name the binary");
            let loaded = load(&binary, &manifests.env(container, &docker, &context), &context);
            if let Some(pool) = mysql_pool(&loaded) {
                pools.push((name.clone(), pods_at_most(deployment), pool));
            }
        }
    }
    let names: BTreeSet<&str> = pools.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["consumer", "recovery-worker"]), "the services on the saga database");
    assert_pools_fit("deploy/k8s", MYSQL_MAX_CONNECTIONS_DEFAULT, &pools);
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|selector| !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn container_port(container: &Value, port: &Value) -> Option<u16> {
    let ports = container["ports"].as_array()?;
    match port {
        Value::String(name) => ports.iter().find(|p| p["name"] == *name.as_str()),
        Value::Number(n) => ports.iter().find(|p| p["containerPort"].as_u64() == n.as_u64()),
        _ => None,
    }
    .and_then(|p| p["containerPort"].as_u64())
    .and_then(|p| u16::try_from(p).ok())
}

#[test]
fn kubernetes_manifests_run_the_services_with_variables_they_accept_and_probes_that_answer() {
    let manifests = Manifests::load();
    let docker = dockerfile();
    let mut workloads = 0;
    let mut loaded_services: BTreeMap<String, (Loaded, Value)> = BTreeMap::new();
    for kind in ["Deployment", "Job"] {
        for workload in manifests.of_kind(kind) {
            workloads += 1;
            let name = text(&workload["metadata"]["name"]);
            let template = &workload["spec"]["template"];
            if kind == "Deployment" {
                assert!(
                    labels_match(&workload["spec"]["selector"]["matchLabels"], &template["metadata"]["labels"]),
                    "Deployment {name}: the selector does not select its own pods"
                );
            }
            let pod = &template["spec"];
            for init in pod["initContainers"].as_array().into_iter().flatten() {
                let context = format!("{kind} {name} init container {}", text(&init["name"]));
                let script = strings(&init["command"]).join(" ");
                assert!(script.contains("sagactl "), "{context}: expected to wait with sagactl");
                load("sagactl", &manifests.env(init, &docker, &context), &context);
            }
            for container in pod["containers"].as_array().expect("containers") {
                let context = format!("{kind} {name} container {}", text(&container["name"]));
                assert_eq!(text(&container["image"]), "midflight", "{context}: the image kustomize sets");
                let args = strings(&container["args"]);
                let binary = args.first().unwrap_or_else(|| panic!("{context}: args name no binary"));
                assert!(docker.binaries.contains(binary), "{context}: runs {binary}, not in the image");
                let loaded = load(binary, &manifests.env(container, &docker, &context), &context);
                if kind == "Deployment" {
                    let metrics = loaded.metrics_port();
                    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
                        let get = &container[probe]["httpGet"];
                        assert_eq!(text(&get["path"]), path, "{context}: {probe} path");
                        assert_eq!(container_port(container, &get["port"]), Some(metrics), "{context}: {probe} port");
                    }
                    let annotations = &template["metadata"]["annotations"];
                    assert_eq!(text(&annotations["prometheus.io/port"]), metrics.to_string(), "{context}: scrape port");
                    if let Some(listen) = loaded.config.pointer("/server/listen") {
                        let listen = port(&text(listen));
                        let declared = container["ports"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|p| p["containerPort"].as_u64() == listen.map(u64::from));
                        assert!(declared, "{context}: gRPC port {listen:?} not declared");
                    }
                    loaded_services.insert(name.clone(), (loaded, container.clone()));
                }
            }
        }
    }
    assert!(workloads >= 5, "four Deployments and the migrate Job");
    for required in ["consumer", "recovery-worker", "mock-wms", "mock-logistics"] {
        assert!(loaded_services.contains_key(required), "no Deployment {required}");
    }
    assert!(
        manifests.of_kind("Job").any(|job| {
            strings(&job["spec"]["template"]["spec"]["containers"][0]["args"]) == ["sagactl", "migrate"]
        }),
        "a Job runs `sagactl migrate`"
    );
    // Services select pods and forward to ports those pods declare.
    for service in manifests.of_kind("Service") {
        let name = text(&service["metadata"]["name"]);
        let (_, container) =
            loaded_services.get(&name).unwrap_or_else(|| panic!("Service {name} has no Deployment of its name"));
        let deployment = manifests.named("Deployment", &name).expect("deployment");
        assert!(
            labels_match(&service["spec"]["selector"], &deployment["spec"]["template"]["metadata"]["labels"]),
            "Service {name} selects nothing"
        );
        for port in service["spec"]["ports"].as_array().expect("ports") {
            assert_eq!(
                container_port(container, &port["targetPort"]).map(u64::from),
                port["port"].as_u64(),
                "Service {name}: port and target differ"
            );
        }
    }
    // Endpoints the consumer and the recovery worker call name those Services and ports.
    for name in ["consumer", "recovery-worker"] {
        let (loaded, _) = &loaded_services[name];
        for section in ["/wms/endpoint", "/logistics/endpoint"] {
            let (host, port) = host_port(&loaded.at(section)).expect("endpoint");
            let service = manifests
                .named("Service", &host)
                .unwrap_or_else(|| panic!("{name}: {section} names no Service {host}"));
            let ports: Vec<u64> =
                service["spec"]["ports"].as_array().into_iter().flatten().filter_map(|p| p["port"].as_u64()).collect();
            assert!(ports.contains(&u64::from(port)), "{name}: Service {host} has no port {port}");
        }
        let section = if name == "consumer" { "consumer" } else { "recovery" };
        assert_eq!(loaded.at(&format!("/{section}/migrate_on_start")), "false", "{name}: the Job owns the schema");
    }
    // The consumer group is protected from draining all at once.
    let consumer = manifests.named("Deployment", "consumer").expect("consumer");
    let budget = manifests
        .of_kind("PodDisruptionBudget")
        .find(|pdb| {
            labels_match(&pdb["spec"]["selector"]["matchLabels"], &consumer["spec"]["template"]["metadata"]["labels"])
        })
        .expect("a PodDisruptionBudget selects the consumer's pods");
    assert!(
        budget["spec"]["maxUnavailable"].is_number() || budget["spec"]["minAvailable"].is_number(),
        "the budget sets a bound"
    );
}
