//! One layered configuration loader shared by every midflight service.
//!
//! Layers, later ones winning: compiled-in defaults -> TOML file -> environment
//! (`MIDFLIGHT_SECTION__KEY=value`) -> command-line overrides (`--set section.key=value`)
//! -> validation. [`load`] reads only the [`Sources`] it is given: a binary fills them from
//! its process ([`Sources::from_process`]), tests pass their own.
//!
//! Values from the environment and from flags are strings; the loader converts each one
//! to the type the compiled-in default has at that path (string, number, bool, list), so
//! `MIDFLIGHT_KAFKA__GROUP_ID=123` stays a string and `..._LEASE_MS=900` becomes a number.
//! Unknown keys are errors (every section denies unknown fields), so a typo in a file or a
//! variable name is reported at start-up instead of silently falling back to a default. The one
//! exception: a `MIDFLIGHT_` variable without a `__` section separator that names no top-level
//! key is taken to belong to another tool (e.g. `MIDFLIGHT_TEST_MYSQL_URL`) and ignored.

mod sections;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use sections::{
    DatabaseSection, GROUP_COMMIT_CONCURRENCY_MAX, GROUP_COMMIT_LINGER_MS_MAX, GROUP_COMMIT_MAX, GrpcClientSection,
    KafkaSection, PING_AFTER_IDLE_MS, RuntimeSection, SESSION_IDLE_TIMEOUT_MS_MIN, STATEMENT_TIMEOUT_MS_MIN,
    ServerSection, TelemetrySection, WORKER_THREADS_MAX, redact_url, with_database_name,
};

/// Prefix of the environment variables the loader reads.
pub const ENV_PREFIX: &str = "MIDFLIGHT_";
/// Separator between nesting levels in an environment variable name.
pub const ENV_NESTING: &str = "__";

/// A service's whole configuration.
pub trait Config: Serialize + DeserializeOwned + Default {
    /// Returns every cross-field problem; empty when the configuration can be used.
    fn problems(&self) -> Vec<String>;
}

/// Where the layers above the defaults come from.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    /// A TOML file, if one was named.
    pub file: Option<PathBuf>,
    /// Environment variables (name, value); only those starting with [`ENV_PREFIX`] are used.
    pub env: Vec<(String, String)>,
    /// `path.to.key=value` overrides, usually from repeated `--set` flags.
    pub overrides: Vec<String>,
}

impl Sources {
    /// The usual sources of a binary: an optional file, the process environment and flags.
    pub fn from_process(file: Option<PathBuf>, overrides: Vec<String>) -> Sources {
        Sources { file, env: std::env::vars().collect(), overrides }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML: {message}")]
    ParseFile { path: PathBuf, message: String },
    #[error("{origin}: {message}")]
    BadValue { origin: String, message: String },
    #[error("configuration rejected: {message}")]
    Shape { message: String },
    #[error("configuration invalid:\n  - {}", problems.join("\n  - "))]
    Invalid { problems: Vec<String> },
}

/// Loads `T` from its defaults and the given sources, then validates it.
pub fn load<T: Config>(sources: &Sources) -> Result<T, Error> {
    let defaults = serde_json::to_value(T::default()).map_err(|e| Error::Shape { message: e.to_string() })?;
    let mut merged = defaults.clone();
    if let Some(path) = &sources.file {
        merge(&mut merged, read_file(path)?);
        // Flat before the later layers, so that a flag's `linger.ms` replaces the file's.
        flatten_properties(&mut merged, &format!("config file {}", path.display()))?;
    }
    let mut env: Vec<&(String, String)> = sources.env.iter().filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect();
    // Sorted so the outcome never depends on the order the OS lists variables in.
    env.sort();
    for (name, raw) in env {
        let path: Vec<String> = name[ENV_PREFIX.len()..].split(ENV_NESTING).map(str::to_ascii_lowercase).collect();
        // A variable without a section (`MIDFLIGHT_TEST_MYSQL_URL`) that names no top-level key
        // belongs to a tool (the tests, the lab), not to this service: leave it alone. One that
        // names a section (`MIDFLIGHT_DATABSE__URL`) is configuration, and a typo there is an error.
        if path.len() == 1 && defaults.get(&path[0]).is_none() {
            continue;
        }
        let path = property_path(path, true);
        set_path(&mut merged, &defaults, &path, raw, &format!("environment variable {name}"))?;
    }
    for item in &sources.overrides {
        let Some((key, raw)) = item.split_once('=') else {
            return Err(Error::BadValue {
                origin: format!("override {item:?}"),
                message: "expected path.to.key=value".to_owned(),
            });
        };
        let path: Vec<String> = key.trim().split('.').map(str::to_owned).collect();
        let path = property_path(path, false);
        set_path(&mut merged, &defaults, &path, raw, &format!("override {key}"))?;
    }
    // A whole table given at once (`--set 'kafka.properties={"linger.ms": 5}'`).
    flatten_properties(&mut merged, "the environment or a flag")?;
    let config: T = serde_json::from_value(merged).map_err(|e| Error::Shape { message: e.to_string() })?;
    let problems = config.problems();
    if problems.is_empty() { Ok(config) } else { Err(Error::Invalid { problems }) }
}

/// Renders a configuration as TOML, for `--print-config` and the docs.
pub fn to_toml<T: Serialize>(config: &T) -> String {
    toml::to_string_pretty(config).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
}

fn read_file(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile { path: path.to_owned(), source })?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| Error::ParseFile { path: path.to_owned(), message: e.to_string() })?;
    serde_json::to_value(table).map_err(|e| Error::ParseFile { path: path.to_owned(), message: e.to_string() })
}

/// Deep-merges `layer` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut Value, layer: Value) {
    match (base, layer) {
        (Value::Object(base), Value::Object(layer)) => {
            for (key, value) in layer {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

/// Where librdkafka's own properties live in a service's configuration.
const KAFKA_PROPERTIES: [&str; 2] = ["kafka", "properties"];

/// librdkafka properties whose names have underscores (CONFIGURATION.md): a variable naming
/// one keeps them.
const UNDERSCORED_PROPERTIES: [&str; 2] = ["log_level", "enabled_events"];

/// A flag's or variable's path into `kafka.properties` names one librdkafka property, whose name
/// has dots of its own: the rest of the path is that name, joined by dots (a variable's
/// underscores are dots too, so `MIDFLIGHT_KAFKA__PROPERTIES__SECURITY_PROTOCOL` sets
/// `security.protocol`, but for [`UNDERSCORED_PROPERTIES`]).
fn property_path(path: Vec<String>, from_env: bool) -> Vec<String> {
    if path.len() <= KAFKA_PROPERTIES.len() || !in_properties(&path) || path.iter().any(String::is_empty) {
        // An empty part (`kafka.properties..x`) is refused as an empty key by `set_path`.
        return path;
    }
    let name = path[KAFKA_PROPERTIES.len()..].join(".");
    let name = if from_env && !UNDERSCORED_PROPERTIES.contains(&name.as_str()) { name.replace('_', ".") } else { name };
    let mut folded = path[..KAFKA_PROPERTIES.len()].to_vec();
    folded.push(name);
    folded
}

/// Whether `path` starts with `kafka.properties`.
fn in_properties(path: &[String]) -> bool {
    path.len() >= KAFKA_PROPERTIES.len() && path[..KAFKA_PROPERTIES.len()] == KAFKA_PROPERTIES
}

/// Rewrites `kafka.properties` in `merged` as librdkafka takes it: one dotted name per
/// property (a file's nested tables, `security.protocol = ...` unquoted, are joined) and text
/// values (a number or boolean as its text; a whole number written as a float, `1e3`, as
/// `1000`). Anything else (a list, a date) is refused with the property's name.
fn flatten_properties(merged: &mut Value, origin: &str) -> Result<(), Error> {
    fn flatten(
        prefix: &str,
        table: Map<String, Value>,
        out: &mut Map<String, Value>,
        origin: &str,
    ) -> Result<(), Error> {
        let bad = |name: &str, message: &str| Error::BadValue {
            origin: origin.to_owned(),
            message: format!("kafka.properties.{name}: {message}"),
        };
        for (key, value) in table {
            let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            let text = match value {
                // How a TOML date-time arrives here: a table with one private key.
                Value::Object(table) if table.keys().any(|k| k.starts_with("$__toml_private")) => {
                    return Err(bad(&name, "a date-time; write the value as a string"));
                }
                Value::Object(table) => {
                    flatten(&name, table, out, origin)?;
                    continue;
                }
                Value::String(text) => text,
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => match n.as_f64() {
                    Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 9.0e15 => format!("{f:.0}"),
                    _ => n.to_string(),
                },
                Value::Array(_) | Value::Null => return Err(bad(&name, "expected text, a number or true/false")),
            };
            if out.insert(name.clone(), Value::String(text)).is_some() {
                return Err(bad(&name, "given twice"));
            }
        }
        Ok(())
    }
    let Some(slot) = merged.get_mut(KAFKA_PROPERTIES[0]).and_then(|kafka| kafka.get_mut(KAFKA_PROPERTIES[1])) else {
        return Ok(());
    };
    let Value::Object(table) = std::mem::take(slot) else {
        return Err(Error::BadValue {
            origin: origin.to_owned(),
            message: "kafka.properties must be a table of librdkafka properties".to_owned(),
        });
    };
    let mut flat = Map::new();
    flatten("", table, &mut flat, origin)?;
    *slot = Value::Object(flat);
    Ok(())
}

fn set_path(merged: &mut Value, defaults: &Value, path: &[String], raw: &str, origin: &str) -> Result<(), Error> {
    let bad = |message: String| Error::BadValue { origin: origin.to_owned(), message };
    if path.is_empty() || path.iter().any(String::is_empty) {
        return Err(bad("empty key".to_owned()));
    }
    let shape = path.iter().try_fold(defaults, |node, key| node.get(key));
    // A librdkafka property's value is text as given: `12e5` is not a number to reformat.
    let is_property = path.len() == KAFKA_PROPERTIES.len() + 1 && in_properties(path);
    let value = if is_property { Value::String(raw.to_owned()) } else { typed(raw, shape).map_err(bad)? };
    let mut node = merged;
    for key in &path[..path.len() - 1] {
        if !node.is_object() {
            return Err(bad(format!("{key} is not a section")));
        }
        node = node
            .as_object_mut()
            .map(|object| object.entry(key.clone()).or_insert_with(|| Value::Object(Map::new())))
            .ok_or_else(|| bad(format!("{key} is not a section")))?;
    }
    let leaf = &path[path.len() - 1];
    node.as_object_mut().ok_or_else(|| bad("not a section".to_owned()))?.insert(leaf.clone(), value);
    Ok(())
}

/// Converts a string from the environment or a flag to the JSON type the default has.
fn typed(raw: &str, shape: Option<&Value>) -> Result<Value, String> {
    match shape {
        Some(Value::String(_)) => Ok(Value::String(raw.to_owned())),
        Some(Value::Bool(_)) => {
            raw.parse::<bool>().map(Value::Bool).map_err(|_| format!("expected true or false, got {raw:?}"))
        }
        Some(Value::Number(_)) => serde_json::from_str::<serde_json::Number>(raw.trim())
            .map(Value::Number)
            .map_err(|_| format!("expected a number, got {raw:?}")),
        Some(Value::Array(items)) => {
            if raw.trim_start().starts_with('[') {
                return serde_json::from_str(raw).map_err(|e| format!("expected a JSON list: {e}"));
            }
            let item_shape = items.first();
            raw.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| typed(s.trim(), item_shape))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        Some(Value::Object(_)) => serde_json::from_str(raw).map_err(|e| format!("expected a JSON table: {e}")),
        // No default to copy the type from (an optional value): JSON if it parses, else text.
        Some(Value::Null) | None => Ok(serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))),
    }
}

#[cfg(test)]
mod tests;
