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
//! key is taken to belong to another tool (e.g. `MIDFLIGHT_TEST_MYSQL_URL`) and ignored, unless
//! it starts with a section's name and one underscore (`MIDFLIGHT_DATABASE_URL`: an error that
//! names `MIDFLIGHT_DATABASE__URL`). A value the service's types refuse is reported with the
//! variable or flag that gave it; an optional key has no default to take its type from, so a
//! value that looks like a number is taken as text where text is wanted (a numeric token).

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
    /// Variables of other programs are not read: one whose name or value is not Unicode would
    /// otherwise stop every service at start. A `MIDFLIGHT_` value that is not Unicode is read
    /// with U+FFFD in place of the bad bytes, which validation or the value's use then shows.
    pub fn from_process(file: Option<PathBuf>, overrides: Vec<String>) -> Sources {
        let env = std::env::vars_os()
            .filter_map(|(name, value)| {
                let name = name.into_string().ok().filter(|name| name.starts_with(ENV_PREFIX))?;
                Some((name, value.to_string_lossy().into_owned()))
            })
            .collect();
        Sources { file, env, overrides }
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
    // What the environment and the flags set, in order, to name the one a type error comes from.
    let mut given: Vec<Given> = Vec::new();
    let mut env: Vec<&(String, String)> = sources.env.iter().filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect();
    // Sorted so the outcome never depends on the order the OS lists variables in.
    env.sort();
    for (name, raw) in env {
        let path: Vec<String> = name[ENV_PREFIX.len()..].split(ENV_NESTING).map(str::to_ascii_lowercase).collect();
        let origin = format!("environment variable {name}");
        // A variable without a section (`MIDFLIGHT_TEST_MYSQL_URL`) that names no top-level key
        // belongs to a tool (the tests, the lab), not to this service: leave it alone. One that
        // names a section (`MIDFLIGHT_DATABSE__URL`) is configuration, and a typo there is an error.
        if path.len() == 1 && defaults.get(&path[0]).is_none() {
            // Unless it starts with a section's name and one underscore: a missed `__`.
            if let Some(section) = section_prefix(&defaults, &path[0]) {
                let key = path[0][section.len() + 1..].to_ascii_uppercase();
                return Err(Error::BadValue {
                    origin,
                    message: format!(
                        "a section and its key are separated by two underscores: {ENV_PREFIX}{}{ENV_NESTING}{key}",
                        section.to_ascii_uppercase()
                    ),
                });
            }
            continue;
        }
        let path = property_path(path, true);
        set_path(&mut merged, &defaults, &path, raw, &origin)?;
        given.push(Given { path, origin, raw: raw.clone() });
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
        let origin = format!("override {key}");
        set_path(&mut merged, &defaults, &path, raw, &origin)?;
        given.push(Given { path, origin, raw: raw.to_owned() });
    }
    // A whole table given at once (`--set 'kafka.properties={"linger.ms": 5}'`).
    flatten_properties(&mut merged, "the environment or a flag")?;
    let config: T = deserialize(merged, &defaults, &given)?;
    let problems = config.problems();
    if problems.is_empty() { Ok(config) } else { Err(Error::Invalid { problems }) }
}

/// A value the environment or a flag set: where it went and where it came from.
struct Given {
    path: Vec<String>,
    origin: String,
    /// The value as given, put back as text where a guess took it for a number.
    raw: String,
}

/// The section (a table among `defaults`' top-level keys) that `name` starts with, followed by
/// one underscore, if any: `database_url` for `database`.
fn section_prefix<'a>(defaults: &'a Value, name: &str) -> Option<&'a str> {
    // An optional section (the recovery worker's `kafka`) has no table among the defaults.
    let sections = defaults.as_object()?.iter().filter(|(_, value)| value.is_object() || value.is_null());
    sections.map(|(key, _)| key.as_str()).find(|key| name.len() > key.len() + 1 && name.starts_with(&format!("{key}_")))
}

/// `merged` as `T`. A value the environment or a flag gave that `T` refuses is named: a value
/// with no default to copy its type from (an optional key, e.g. a token) was guessed to be a
/// number or a boolean if it looked like one, and is taken as text when `T` wants text there;
/// otherwise the first given value without which `T` accepts the rest is the one reported.
fn deserialize<T: DeserializeOwned>(merged: Value, defaults: &Value, given: &[Given]) -> Result<T, Error> {
    let error = match serde_json::from_value::<T>(merged.clone()) {
        Ok(config) => return Ok(config),
        Err(error) => error,
    };
    // Values guessed to be numbers or booleans where no default gave a type, the last given
    // at each path: each is put back as text as given, and kept so when that is what the types
    // want (the refusal then moves on to another value, or there is none).
    let mut current = merged.clone();
    let mut refusal = error.to_string();
    for item in last_given(given) {
        let guessed = matches!(lookup(defaults, &item.path), None | Some(Value::Null));
        if !guessed || !lookup(&current, &item.path).is_some_and(|value| value.is_number() || value.is_boolean()) {
            continue;
        }
        let mut trial = current.clone();
        if let Some(slot) = lookup_mut(&mut trial, &item.path) {
            *slot = Value::String(item.raw.clone());
        }
        match serde_json::from_value::<T>(trial.clone()) {
            Ok(config) => return Ok(config),
            // Refused as text now: it was a number after all.
            Err(other) if other.to_string().contains(&format!("string {:?}", item.raw)) => {}
            Err(other) if other.to_string() != refusal => (current, refusal) = (trial, other.to_string()),
            Err(_) => {}
        }
    }
    // The value at a path is the last one given for it (a flag over a variable): name that one.
    for item in last_given(given) {
        let mut without = merged.clone();
        let default = lookup(defaults, &item.path).cloned();
        match (lookup_mut(&mut without, &item.path), default) {
            (Some(slot), Some(default)) => *slot = default,
            (Some(_), None) => {
                if let Some((leaf, parent)) = item.path.split_last()
                    && let Some(Value::Object(table)) = lookup_mut(&mut without, parent)
                {
                    table.remove(leaf);
                }
            }
            (None, _) => continue,
        }
        if serde_json::from_value::<T>(without).is_ok() {
            return Err(Error::BadValue { origin: item.origin.clone(), message: error.to_string() });
        }
    }
    Err(Error::Shape { message: error.to_string() })
}

/// Of `given`, the last item at each path, in the order given.
fn last_given(given: &[Given]) -> Vec<&Given> {
    let mut last: Vec<&Given> = Vec::new();
    for item in given.iter().rev() {
        if !last.iter().any(|later| later.path == item.path) {
            last.push(item);
        }
    }
    last.reverse();
    last
}

fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |node, key| node.get(key))
}

fn lookup_mut<'a>(value: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |node, key| node.get_mut(key))
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
    let shape = lookup(defaults, path);
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
        // An optional section left out (`kafka = None`) is a table once a key of it is given.
        if node.is_null() {
            *node = Value::Object(Map::new());
        }
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
