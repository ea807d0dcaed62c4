//! The loader's layering, typing and error reporting.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Demo {
    kafka: KafkaSection,
    database: DatabaseSection,
    lease_ms: u64,
    owner: Option<String>,
    token: Option<String>,
    /// An optional section: no default to take its keys' types from.
    extra: Option<KafkaSection>,
}

impl Config for Demo {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.kafka.problems("kafka");
        problems.extend(self.database.problems("database"));
        problems
    }
}

fn sources(env: &[(&str, &str)], overrides: &[&str]) -> Sources {
    Sources {
        file: None,
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        overrides: overrides.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn layers_apply_in_order_and_keep_types() {
    let dir = std::env::temp_dir().join(format!("midflight-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("demo.toml");
    std::fs::write(&file, "lease_ms = 100\n[kafka]\ngroup_id = \"from-file\"\norder_topic = \"file-topic\"\n")
        .expect("write");
    let mut s = sources(
        &[("MIDFLIGHT_KAFKA__GROUP_ID", "123"), ("MIDFLIGHT_LEASE_MS", "200"), ("OTHER", "ignored")],
        &["lease_ms=300", "owner=me"],
    );
    s.file = Some(file);
    let demo: Demo = load(&s).expect("loads");
    assert_eq!(demo.kafka.group_id, "123", "env wins over file and a numeric-looking string stays a string");
    assert_eq!(demo.kafka.order_topic, "file-topic", "file wins over defaults");
    assert_eq!(demo.lease_ms, 300, "flags win over env");
    assert_eq!(demo.owner.as_deref(), Some("me"));
    assert_eq!(demo.database, DatabaseSection::default());
}

#[test]
fn unknown_keys_and_bad_values_are_named() {
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_KAFKA__GRUOP_ID", "x")], &[])).expect_err("typo");
    assert!(err.to_string().contains("gruop_id"), "{err}");
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_DATABSE__URL", "x")], &[])).expect_err("typo in a section");
    assert!(err.to_string().contains("databse"), "{err}");
    // Another tool's variable, with no section, is not this service's business.
    load::<Demo>(&sources(&[("MIDFLIGHT_TEST_MYSQL_URL", "mysql://x")], &[])).expect("ignored");
    let err = load::<Demo>(&sources(&[], &["lease_ms=soon"])).expect_err("not a number");
    assert!(err.to_string().contains("override lease_ms") && err.to_string().contains("number"), "{err}");
    let err = load::<Demo>(&sources(&[], &["lease_ms"])).expect_err("no value");
    assert!(err.to_string().contains("path.to.key=value"), "{err}");
}

#[test]
fn validation_reports_every_problem() {
    let err = load::<Demo>(&sources(&[], &["kafka.group_id=", "database.url=postgres://u:secret@h/db"]))
        .expect_err("invalid");
    let text = err.to_string();
    assert!(text.contains("kafka.group_id must not be empty"), "{text}");
    assert!(text.contains("database.url") && !text.contains("secret"), "password must be redacted: {text}");
    let err = load::<Demo>(&sources(&[], &["database.group_commit_linger_ms=101"])).expect_err("too long");
    assert!(err.to_string().contains("database.group_commit_linger_ms must be at most 100"), "{err}");
    load::<Demo>(&sources(&[], &["database.group_commit_linger_ms=100"])).expect("the bound itself is allowed");
    let err = load::<Demo>(&sources(&[], &["database.idle_timeout_ms=0"])).expect_err("a pool closing at once");
    assert!(err.to_string().contains("database.idle_timeout_ms must be in 1000..=3600000, got 0"), "{err}");
    load::<Demo>(&sources(&[], &["database.idle_timeout_ms=1000"])).expect("the lower bound itself is allowed");
    // A session the server may close before the pool would check it.
    let err = load::<Demo>(&sources(&[], &["database.session_idle_timeout_ms=30000"])).expect_err("under a minute");
    assert!(err.to_string().contains("database.session_idle_timeout_ms must be 0"), "{err}");
    for allowed in ["0", "60000"] {
        load::<Demo>(&sources(&[], &[&format!("database.session_idle_timeout_ms={allowed}")])).expect(allowed);
    }
    for refused in ["999", "3600001"] {
        let err =
            load::<Demo>(&sources(&[], &[&format!("database.statement_timeout_ms={refused}")])).expect_err(refused);
        let text = err.to_string();
        assert!(
            text.contains("database.statement_timeout_ms must be 0 (the server's own) or in 1000..=3600000"),
            "{text}"
        );
    }
    for allowed in ["0", "1000", "3600000"] {
        load::<Demo>(&sources(&[], &[&format!("database.statement_timeout_ms={allowed}")])).expect(allowed);
    }
}

#[test]
fn lists_parse_from_commas() {
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Lists {
        regions: Vec<String>,
    }
    impl Default for Lists {
        fn default() -> Self {
            Lists { regions: vec!["XX".into()] }
        }
    }
    impl Config for Lists {
        fn problems(&self) -> Vec<String> {
            Vec::new()
        }
    }
    let lists: Lists = load(&sources(&[("MIDFLIGHT_REGIONS", "A, B")], &[])).expect("loads");
    assert_eq!(lists.regions, vec!["A", "B"]);
}

#[test]
fn librdkafka_properties_keep_dotted_names_and_text_values() {
    let dir = std::env::temp_dir().join(format!("midflight-config-properties-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("demo.toml");
    // Quoted names are one key; an unquoted dotted name is a nested table in TOML.
    let toml = "[kafka.properties]\n\"fetch.wait.max.ms\" = 100\n\"socket.keepalive.enable\" = true\n\
                statistics.interval.ms = \"5000\"\nsecurity.protocol = \"PLAINTEXT\"\n\"queue.buffering.max.ms\" = 1e3\n";
    std::fs::write(&file, toml).expect("write");
    let mut s = sources(
        &[
            ("MIDFLIGHT_KAFKA__PROPERTIES__SECURITY_PROTOCOL", "SASL_SSL"),
            ("MIDFLIGHT_KAFKA__PROPERTIES__LOG_LEVEL", "7"),
        ],
        &["kafka.properties.sasl.password=12e5", "kafka.properties.linger.ms=5", "kafka.properties.debug=cgrp"],
    );
    s.file = Some(file);
    let demo: Demo = load(&s).expect("loads");
    let expected: BTreeMap<String, String> = [
        ("debug", "cgrp"),
        ("fetch.wait.max.ms", "100"),
        ("linger.ms", "5"),
        ("log_level", "7"),
        ("queue.buffering.max.ms", "1000"),
        ("sasl.password", "12e5"),
        ("security.protocol", "SASL_SSL"),
        ("socket.keepalive.enable", "true"),
        ("statistics.interval.ms", "5000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(demo.kafka.properties, expected, "a variable overrides the file's nested name; log_level keeps its _");
    // Rendered back, each is one quoted name: the file a service prints loads as the same.
    let rendered = to_toml(&demo);
    assert!(rendered.contains("\"fetch.wait.max.ms\" = \"100\""), "{rendered}");
    std::fs::write(dir.join("printed.toml"), &rendered).expect("write");
    let printed = Sources { file: Some(dir.join("printed.toml")), ..Sources::default() };
    assert_eq!(load::<Demo>(&printed).expect("reloads"), demo);
    // A whole table from a flag is flattened the same way.
    let table: Demo = load(&sources(&[], &[r#"kafka.properties={"linger": {"ms": 5}}"#])).expect("a table");
    assert_eq!(table.kafka.properties.get("linger.ms").map(String::as_str), Some("5"));

    let refused = |toml: &str, needle: &str| {
        std::fs::write(dir.join("bad.toml"), toml).expect("write");
        let bad = Sources { file: Some(dir.join("bad.toml")), ..Sources::default() };
        let err = load::<Demo>(&bad).expect_err(toml);
        assert!(err.to_string().contains(needle) && err.to_string().contains("bad.toml"), "{toml}: {err}");
    };
    refused("[kafka.properties]\n\"linger.ms\" = 5\nlinger.ms = 6\n", "kafka.properties.linger.ms: given twice");
    refused(
        "[kafka.properties]\n\"bootstrap.servers\" = [\"a\", \"b\"]\n",
        "kafka.properties.bootstrap.servers: expected text",
    );
    refused("[kafka.properties]\nt = 2026-12-04T10:00:00Z\n", "kafka.properties.t: a date-time");
    let err = load::<Demo>(&sources(&[], &["kafka.properties=x"])).expect_err("not a table");
    assert!(err.to_string().contains("expected a JSON table"), "{err}");
    let err = load::<Demo>(&sources(&[], &["kafka.properties..x=1"])).expect_err("an empty part");
    assert!(err.to_string().contains("empty key"), "{err}");
}

#[test]
fn a_missed_double_underscore_is_named() {
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_DATABASE_URL", "mysql://x")], &[])).expect_err("one underscore");
    let text = err.to_string();
    assert!(text.contains("MIDFLIGHT_DATABASE_URL") && text.contains("MIDFLIGHT_DATABASE__URL"), "{text}");
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_KAFKA_BOOTSTRAP_SERVERS", "k:9092")], &[])).expect_err("one");
    assert!(err.to_string().contains("MIDFLIGHT_KAFKA__BOOTSTRAP_SERVERS"), "{err}");
    // A top-level key with an underscore of its own is still a key.
    let demo: Demo = load(&sources(&[("MIDFLIGHT_LEASE_MS", "7")], &[])).expect("a key");
    assert_eq!(demo.lease_ms, 7);
}

#[test]
fn a_refused_value_names_where_it_came_from() {
    let err = load::<Demo>(&sources(&[], &["database.max_connections=-1"])).expect_err("negative");
    assert!(err.to_string().starts_with("override database.max_connections:"), "{err}");
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_DATABASE__MAX_CONNECTIONS", "1.5")], &[])).expect_err("a fraction");
    assert!(err.to_string().starts_with("environment variable MIDFLIGHT_DATABASE__MAX_CONNECTIONS:"), "{err}");
    // An optional key has no default to copy a type from: digits stay text where text is wanted.
    let demo: Demo = load(&sources(&[("MIDFLIGHT_OWNER", "123")], &["owner=456"])).expect("text");
    assert_eq!(demo.owner.as_deref(), Some("456"));
    let demo: Demo = load(&sources(&[("MIDFLIGHT_OWNER", "true")], &[])).expect("text");
    assert_eq!(demo.owner.as_deref(), Some("true"));
    let demo: Demo = load(&sources(&[("MIDFLIGHT_OWNER", "123"), ("MIDFLIGHT_TOKEN", "456")], &[])).expect("both");
    assert_eq!((demo.owner.as_deref(), demo.token.as_deref()), (Some("123"), Some("456")));
    // The flag's value is the one in force, and the one named.
    let env = [("MIDFLIGHT_DATABASE__MAX_CONNECTIONS", "10")];
    let err = load::<Demo>(&sources(&env, &["database.max_connections=-1"])).expect_err("negative");
    assert!(err.to_string().starts_with("override database.max_connections:"), "{err}");
    // An optional section's keys, typed by what the types want, text kept as given.
    let env = [
        ("MIDFLIGHT_EXTRA__GROUP_ID", "42"),
        ("MIDFLIGHT_EXTRA__ORDER_TOPIC", "2024"),
        ("MIDFLIGHT_EXTRA__SESSION_TIMEOUT_MS", "45000"),
        ("MIDFLIGHT_TOKEN", "1e3"),
    ];
    let demo: Demo = load(&sources(&env, &[])).expect("an optional section");
    let extra = demo.extra.expect("given");
    assert_eq!((extra.group_id.as_str(), extra.order_topic.as_str()), ("42", "2024"));
    assert_eq!(extra.session_timeout_ms, 45_000);
    assert_eq!(demo.token.as_deref(), Some("1e3"), "as given, not as a number would print");
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_EXTRA_BOOTSTRAP_SERVERS", "k:9092")], &[])).expect_err("one");
    assert!(err.to_string().contains("MIDFLIGHT_EXTRA__BOOTSTRAP_SERVERS"), "{err}");
    // An optional section, or key, missed by one underscore too.
    let err = load::<Demo>(&sources(&[("MIDFLIGHT_OWNER_NAME", "x")], &[])).expect_err("one underscore");
    assert!(err.to_string().contains("MIDFLIGHT_OWNER__NAME"), "{err}");
}

#[test]
fn tokens_and_connect_timeouts_are_checked() {
    let client = |token: Option<&str>| GrpcClientSection {
        bearer_token: token.map(str::to_owned),
        ..GrpcClientSection::default()
    };
    assert!(client(Some("s3cr3t-token.v1")).problems("wms").is_empty());
    let problems = client(Some("s3cr3t\n")).problems("wms");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("wms.bearer_token must be visible ASCII") && problems[0].contains("byte 6 of 7"));
    assert!(!problems[0].contains("s3cr3t"), "the token is not shown: {problems:?}");
    assert!(client(Some("")).problems("wms")[0].contains("must not be empty"));
    let server = ServerSection { bearer_token: Some("two words".into()), ..ServerSection::default() };
    assert!(server.problems("server")[0].contains("server.bearer_token must be visible ASCII"));
    let slow = GrpcClientSection { connect_timeout_ms: 0, ..GrpcClientSection::default() };
    assert_eq!(slow.problems("logistics"), ["logistics.connect_timeout_ms must be positive"]);
    let err = load::<Demo>(&sources(&[], &["database.connect_timeout_ms=0"])).expect_err("a connect failing at once");
    assert!(err.to_string().contains("database.connect_timeout_ms must be positive"), "{err}");
}
