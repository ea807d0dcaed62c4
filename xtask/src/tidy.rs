//! Tidy checks: the architecture invariants and conventions that a compiler does not enforce,
//! run by `cargo test -p xtask` (so by the README's test command) and by `cargo xtask tidy`.
//!
//! Each check returns the problems it finds as sentences naming the file or crate, so a failure
//! says what to fix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Runs every check; an empty list means tidy.
pub fn check_all(root: &Path) -> anyhow::Result<Vec<String>> {
    let metadata = cargo_metadata(root)?;
    let sources = rust_sources(root)?;
    let mut problems = Vec::new();
    problems.extend(pure_model(&metadata, root)?);
    problems.extend(crate_boundaries(&metadata));
    problems.extend(module_headers(root, &sources)?);
    problems.extend(forbidden_text(root, &sources)?);
    problems.extend(migrations_listed(root)?);
    problems.extend(docs_cover_crates(root)?);
    problems.extend(readme_test_command(root)?);
    Ok(problems)
}

/// Crates the pure state model must never depend on, directly or not.
const IMPURE: [&str; 10] =
    ["tokio", "sea-orm", "sqlx", "rdkafka", "rdkafka-sys", "tonic", "hyper", "mio", "reqwest", "opentelemetry"];

/// Clock reads and I/O the model's source must not contain.
const MODEL_FORBIDDEN: [&str; 7] =
    ["SystemTime::now", "Instant::now", "std::fs", "std::net", "std::env", "thread::sleep", "std::process"];

fn pure_model(metadata: &Value, root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for dependency in normal_closure(metadata, "midflight-model")? {
        if IMPURE.iter().any(|name| dependency == *name || dependency.starts_with(&format!("{name}-"))) {
            problems.push(format!("midflight-model depends on {dependency}: the state model must do no I/O"));
        }
    }
    for file in rust_files_under(&root.join("crates/model/src"))? {
        let text = std::fs::read_to_string(&file)?;
        for needle in MODEL_FORBIDDEN {
            if text.contains(needle) {
                problems.push(format!(
                    "{}: uses {needle}; the model reads no clock and does no I/O",
                    relative(root, &file)
                ));
            }
        }
    }
    Ok(problems)
}

/// Which packages may depend directly on which outside-world crates (STYLE.md rule 2).
/// The mocks stand for other companies' systems with databases of their own; the lab and the
/// stack host the embedded Kafka for tests and the demo.
fn crate_boundaries(metadata: &Value) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("sea-orm", &["midflight-store", "midflight-mock", "midflight-mock-wms", "midflight-mock-logistics"][..]),
        ("sea-orm-migration", &["midflight-store"][..]),
        ("rdkafka", &["midflight-consumer", "midflight-stack", "midflight-lab"][..]),
        ("prost", &["midflight-api"][..]),
        ("tonic-prost", &["midflight-api"][..]),
    ]);
    let members: BTreeSet<&str> =
        metadata["workspace_members"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let mut problems = Vec::new();
    for package in packages(metadata).filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id))) {
        let name = package["name"].as_str().unwrap_or_default();
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let target = dependency["name"].as_str().unwrap_or_default();
            let normal = dependency["kind"].is_null();
            if let Some(owners) = allowed.get(target)
                && normal
                && !owners.contains(&name)
            {
                problems.push(format!("{name} depends on {target}; only {} may (STYLE.md rule 2)", owners.join(", ")));
            }
        }
    }
    problems
}

fn module_headers(root: &Path, sources: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for file in sources {
        let text = std::fs::read_to_string(file)?;
        let first = text.lines().find(|line| !line.trim().is_empty()).unwrap_or_default();
        if !first.starts_with("//!") {
            problems.push(format!("{}: starts without a `//!` header saying what it owns", relative(root, file)));
        }
    }
    Ok(problems)
}

/// Text that must not appear in sources, with where it is allowed.
fn forbidden_text(root: &Path, sources: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    // Written in pieces so this file does not trip its own check.
    let ignore = format!("#[{}", "ignore");
    let env_read = format!("env::{}(", "var");
    let debug = format!("{}!(", "dbg");
    let mut problems = Vec::new();
    for file in sources {
        let path = relative(root, file);
        let text = std::fs::read_to_string(file)?;
        if text.contains(&ignore) {
            problems.push(format!("{path}: an ignored test; tests run always or not at all"));
        }
        if text.contains(&debug) {
            problems.push(format!("{path}: a leftover dbg!"));
        }
        let env_allowed = path.starts_with("crates/config/")
            || path.starts_with("crates/service/")
            || path.starts_with("crates/lab/")
            || path.starts_with("xtask/")
            || path.contains("/tests/")
            || path.contains("/benches/")
            || path.ends_with("/testing.rs")
            || path.ends_with("/build.rs");
        if text.contains(&env_read) && !env_allowed {
            problems.push(format!("{path}: reads the environment; configuration goes through midflight-config"));
        }
    }
    Ok(problems)
}

fn migrations_listed(root: &Path) -> anyhow::Result<Vec<String>> {
    let listing = std::fs::read_to_string(root.join("crates/store/src/migrate.rs"))?;
    let mut problems = Vec::new();
    let mut numbers = Vec::new();
    for entry in std::fs::read_dir(root.join("migrations"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".sql") else { continue };
        match stem.split_once('_').and_then(|(n, _)| n.parse::<u32>().ok()) {
            Some(number) => numbers.push(number),
            None => problems.push(format!("migrations/{name}: name must be NNNN_what.sql")),
        }
        if !listing.contains(&format!("migrations/{name}")) {
            problems.push(format!("migrations/{name} is not applied: list it in crates/store/src/migrate.rs"));
        }
    }
    numbers.sort_unstable();
    if numbers.iter().enumerate().any(|(i, n)| *n != i as u32 + 1) {
        problems.push(format!("migrations must be numbered 1, 2, 3... without gaps, found {numbers:?}"));
    }
    Ok(problems)
}

fn docs_cover_crates(root: &Path) -> anyhow::Result<Vec<String>> {
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).context("ARCHITECTURE.md")?;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(root.join("crates"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !architecture.contains(&format!("crates/{name}")) {
            problems.push(format!("ARCHITECTURE.md: the code map does not mention crates/{name}"));
        }
    }
    Ok(problems)
}

/// The command `.ci/run` runs must be the README's test command, word for word.
fn readme_test_command(root: &Path) -> anyhow::Result<Vec<String>> {
    let ci = std::fs::read_to_string(root.join(".ci/run")).context(".ci/run")?;
    let readme = std::fs::read_to_string(root.join("README.md")).context("README.md")?;
    let Some(line) = ci.lines().find(|line| line.trim_start().starts_with("cargo test")) else {
        return Ok(vec![".ci/run does not run `cargo test`".to_owned()]);
    };
    if readme.contains(line.trim()) {
        Ok(Vec::new())
    } else {
        Ok(vec![format!("README.md does not show the test command .ci/run runs: `{}`", line.trim())])
    }
}

fn cargo_metadata(root: &Path) -> anyhow::Result<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--offline"])
        .output()
        .context("cannot run cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

fn packages(metadata: &Value) -> impl Iterator<Item = &Value> {
    metadata["packages"].as_array().into_iter().flatten()
}

/// Names of every package `root_package` depends on for its build (not dev), transitively.
fn normal_closure(metadata: &Value, root_package: &str) -> anyhow::Result<BTreeSet<String>> {
    let names: BTreeMap<&str, &str> =
        packages(metadata).filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?))).collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let Some(start) = names.iter().find(|(_, name)| **name == root_package).map(|(id, _)| *id) else {
        bail!("package {root_package} not found by cargo metadata");
    };
    let mut seen = BTreeSet::new();
    let mut stack = vec![start];
    while let Some(id) = stack.pop() {
        for dep in nodes.get(id).and_then(|n| n["deps"].as_array()).into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            let Some(dep_id) = dep["pkg"].as_str() else { continue };
            if normal && seen.insert(dep_id) {
                stack.push(dep_id);
            }
        }
    }
    Ok(seen.into_iter().filter_map(|id| names.get(id).map(|n| (*n).to_owned())).collect())
}

/// Every Rust source of ours (crates and xtask), not build output.
fn rust_sources(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = rust_files_under(&root.join("crates"))?;
    files.extend(rust_files_under(&root.join("xtask"))?);
    Ok(files)
}

fn rust_files_under(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current)? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if path.is_dir() {
                if name != "target" {
                    pending.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_is_tidy() {
        let problems = check_all(&workspace_root()).expect("tidy checks run");
        assert!(problems.is_empty(), "tidy problems:\n  {}", problems.join("\n  "));
    }

    #[test]
    fn the_model_check_sees_forbidden_dependencies() {
        // The check itself must be able to fail: the store does depend on tokio and sea-orm.
        let metadata = cargo_metadata(&workspace_root()).expect("metadata");
        let closure = normal_closure(&metadata, "midflight-store").expect("closure");
        assert!(closure.contains("tokio") && closure.contains("sea-orm"), "{closure:?}");
    }
}
