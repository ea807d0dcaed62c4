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
    problems.extend(design_docs_agree(root)?);
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
/// stack host the embedded Kafka for tests and the demo, the recovery worker's purge reads the
/// order topic's retention, and the lab keeps the legacy design's
/// business table (the old system, which had no saga table) with sea-orm.
fn crate_boundaries(metadata: &Value) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        (
            "sea-orm",
            &["midflight-store", "midflight-mock", "midflight-mock-wms", "midflight-mock-logistics", "midflight-lab"][..],
        ),
        ("sea-orm-migration", &["midflight-store"][..]),
        ("rdkafka", &["midflight-consumer", "midflight-recovery", "midflight-stack", "midflight-lab"][..]),
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

/// The design document and its Chinese translation, kept in sync.
const DESIGN_DOCS: [&str; 2] = ["docs/design.md", "docs/design.zh-CN.md"];

/// What the design documents must agree with, read from the code.
#[derive(Debug)]
struct DesignFacts {
    /// Every status as stored (`Status::as_str`).
    statuses: Vec<String>,
    /// Every column of the `saga` table.
    columns: Vec<String>,
    /// The legal edges `(from, to)`: automated (`can_transition`) and operator's.
    automated: BTreeSet<(String, String)>,
    operator: BTreeSet<(String, String)>,
    /// The text of the migration the documents quote.
    saga_ddl: String,
}

/// The design documents (`docs/design.md`, `docs/design.zh-CN.md`) agree with the code: every
/// cited path exists, every cited test or function exists in the cited file, every status and
/// every `saga` column is named, the quoted DDL is the migration's, the state diagram has exactly
/// the legal edges, both documents cite the same paths, and README and ARCHITECTURE link both.
fn design_docs_agree(root: &Path) -> anyhow::Result<Vec<String>> {
    let facts = design_facts(root)?;
    let mut problems = Vec::new();
    let mut cited: Vec<(&str, BTreeSet<String>)> = Vec::new();
    for doc in DESIGN_DOCS {
        let Ok(text) = std::fs::read_to_string(root.join(doc)) else {
            problems.push(format!("{doc} is missing: the answer to the user's four questions lives there"));
            continue;
        };
        problems.extend(design_doc_problems(root, doc, &text, &facts));
        cited.push((doc, citations(&text).into_iter().map(|c| c.path).collect()));
    }
    if let [(english, en), (chinese, zh)] = &cited[..] {
        for path in en.difference(zh) {
            problems.push(format!("{chinese} does not cite `{path}`, which {english} cites: keep them in sync"));
        }
        for path in zh.difference(en) {
            problems.push(format!("{english} does not cite `{path}`, which {chinese} cites: keep them in sync"));
        }
    }
    for index in ["README.md", "ARCHITECTURE.md"] {
        let text = std::fs::read_to_string(root.join(index)).with_context(|| index.to_owned())?;
        for doc in DESIGN_DOCS.iter().filter(|doc| !text.contains(*doc)) {
            problems.push(format!("{index} does not link {doc}"));
        }
    }
    Ok(problems)
}

/// The problems of one design document.
fn design_doc_problems(root: &Path, doc: &str, text: &str, facts: &DesignFacts) -> Vec<String> {
    let mut problems = Vec::new();
    for citation in citations(text) {
        let target = root.join(&citation.path);
        if !target.exists() {
            problems.push(format!("{doc}: cites `{}`, which does not exist", citation.path));
            continue;
        }
        for name in &citation.names {
            if !defines(&target, name) {
                problems.push(format!(
                    "{doc}: cites `{}` `{name}`, but that file has no `fn {name}`, `both_engines!({name}, ...)` or scenario {name}",
                    citation.path
                ));
            }
        }
    }
    for status in &facts.statuses {
        if !contains_word(text, status) {
            problems.push(format!("{doc}: never names the status {status}"));
        }
    }
    for column in &facts.columns {
        if !text.contains(&format!("`{column}`")) {
            problems.push(format!("{doc}: does not explain the saga column `{column}`"));
        }
    }
    for (info, block) in fenced_blocks(text) {
        if block.starts_with("CREATE TABLE saga (") && !facts.saga_ddl.contains(&block) {
            problems.push(format!("{doc}: the quoted saga DDL differs from migrations/0001_saga.sql"));
        }
        if info == "mermaid" {
            problems.extend(diagram_problems(doc, &block, facts));
        }
    }
    problems
}

/// The diagram's edges must be exactly the legal ones, the operator's labelled `operator`.
fn diagram_problems(doc: &str, diagram: &str, facts: &DesignFacts) -> Vec<String> {
    let mut automated = BTreeSet::new();
    let mut operator = BTreeSet::new();
    for line in diagram.lines() {
        let Some((from, rest)) = line.split_once("-->") else { continue };
        let (to, label) = rest.split_once(':').unwrap_or((rest, ""));
        let edge = (from.trim().to_owned(), to.trim().to_owned());
        if edge.0 == "[*]" || edge.1 == "[*]" {
            continue;
        }
        let drawn = if label.contains("operator") { &mut operator } else { &mut automated };
        drawn.insert(edge);
    }
    let mut problems = Vec::new();
    for (kind, drawn, legal) in [("", &automated, &facts.automated), ("operator ", &operator, &facts.operator)] {
        for (from, to) in legal.difference(drawn) {
            problems.push(format!("{doc}: the state diagram lacks the legal {kind}edge {from} --> {to}"));
        }
        for (from, to) in drawn.difference(legal) {
            problems.push(format!("{doc}: the state diagram draws {from} --> {to}, not a legal {kind}edge"));
        }
    }
    problems
}

/// A repository path cited in backticks, with the names cited right after it (`path` `a`, `b`).
#[derive(Debug, PartialEq, Eq)]
struct Citation {
    path: String,
    names: Vec<String>,
}

/// The citations in the prose of a document (fenced code blocks are not prose).
fn citations(text: &str) -> Vec<Citation> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Odd parts are inline code, even parts the text between them.
    let parts: Vec<&str> = prose.split('`').collect();
    let mut out = Vec::new();
    let mut index = 1;
    while index < parts.len() {
        if !is_repo_path(parts[index]) {
            index += 2;
            continue;
        }
        let mut citation = Citation { path: parts[index].to_owned(), names: Vec::new() };
        let mut next = index + 2;
        // The first name follows the path after one space (or a line break); more follow
        // after a comma.
        let joins = |between: &str, first: bool| {
            if first { matches!(between, " " | "\n") } else { matches!(between.trim(), "," | "，" | "、") }
        };
        while next < parts.len() && joins(parts[next - 1], citation.names.is_empty()) && is_name(parts[next]) {
            citation.names.push(parts[next].to_owned());
            next += 2;
        }
        out.push(citation);
        index = next;
    }
    out
}

/// `crates/...`, `docs/x.md`, `README.md`: repository-relative, no spaces or globs.
fn is_repo_path(token: &str) -> bool {
    const EXTENSIONS: [&str; 7] = [".md", ".rs", ".toml", ".sql", ".txt", ".proto", ".json"];
    let charset = token.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'));
    charset
        && !token.is_empty()
        && !token.starts_with(['.', '/', '-'])
        && (token.contains('/') || EXTENSIONS.iter().any(|ext| token.ends_with(ext)))
}

/// A function or test name: snake case.
fn is_name(token: &str) -> bool {
    token.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && token.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Whether `target` defines `name`: a function or a `both_engines!` test in a file, or an
/// entry (a scenario) in a directory.
fn defines(target: &Path, name: &str) -> bool {
    if target.is_dir() {
        return std::fs::read_dir(target).into_iter().flatten().flatten().any(|entry| {
            let file = entry.file_name().to_string_lossy().into_owned();
            file == name || file.split_once('.').is_some_and(|(stem, _)| stem == name)
        });
    }
    let Ok(text) = std::fs::read_to_string(target) else { return false };
    if text.contains(&format!("both_engines!({name},")) {
        return true;
    }
    let needle = format!("fn {name}");
    text.match_indices(&needle).any(|(at, _)| {
        let after = text[at + needle.len()..].chars().next().unwrap_or(' ');
        !(after.is_ascii_alphanumeric() || after == '_')
    })
}

/// `word` occurs with no letter, digit or underscore of the same script on either side.
fn contains_word(text: &str, word: &str) -> bool {
    let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    text.match_indices(word)
        .any(|(at, _)| !part(text[..at].chars().next_back()) && !part(text[at + word.len()..].chars().next()))
}

/// `(info string, content)` of every fenced code block.
fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in text.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), Vec::new())),
            (Some(_), Some(_)) => {
                if let Some((info, lines)) = open.take() {
                    blocks.push((info, lines.join("\n")));
                }
            }
            (Some((_, lines)), None) => lines.push(line),
            (None, None) => {}
        }
    }
    blocks
}

/// Reads statuses, edges and the `saga` table from the code, refusing to guess.
fn design_facts(root: &Path) -> anyhow::Result<DesignFacts> {
    let status_rs = std::fs::read_to_string(root.join("crates/model/src/status.rs")).context("status.rs")?;
    let saga_ddl = std::fs::read_to_string(root.join("migrations/0001_saga.sql")).context("0001_saga.sql")?;
    let statuses: Vec<String> =
        fn_body(&status_rs, "as_str").split('"').skip(1).step_by(2).map(str::to_owned).collect();
    let declared = status_rs
        .split_once("pub const ALL: [Status; ")
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(n, _)| n.parse::<usize>().ok());
    if declared != Some(statuses.len()) {
        bail!("status.rs: read {} status names from as_str, but Status::ALL holds {declared:?}", statuses.len());
    }
    let columns: Vec<String> = saga_ddl
        .split_once("CREATE TABLE saga (")
        .and_then(|(_, rest)| rest.split_once("\n)"))
        .map(|(body, _)| body)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|word| is_name(word))
        .map(str::to_owned)
        .collect();
    let automated = transition_edges(&fn_body(&status_rs, "can_transition"), "&[", ']');
    let operator = transition_edges(&fn_body(&status_rs, "operator_can_transition"), "matches!(to,", ')');
    if columns.is_empty() || automated.is_empty() || operator.is_empty() {
        bail!("could not read the saga columns or the legal transitions from the code");
    }
    Ok(DesignFacts { statuses, columns, automated, operator, saga_ddl })
}

/// The body of `fn name` in `source` (between its braces), or empty.
fn fn_body(source: &str, name: &str) -> String {
    let Some(start) = source.find(&format!("fn {name}(")) else { return String::new() };
    let Some(open) = source[start..].find('{').map(|at| start + at) else { return String::new() };
    let mut depth = 0;
    for (at, c) in source[open..].char_indices() {
        depth += match c {
            '{' => 1,
            '}' => -1,
            _ => 0,
        };
        if depth == 0 {
            return source[open + 1..open + at].to_owned();
        }
    }
    String::new()
}

/// Edges of a match over statuses: each `From | Other => ... <open> To, To2 <close>` arm.
fn transition_edges(body: &str, open: &str, close: char) -> BTreeSet<(String, String)> {
    let mut edges = BTreeSet::new();
    for arm in body.split("=>").collect::<Vec<_>>().windows(2) {
        let from = arm[0].rsplit([',', '{', '\n']).find(|s| !s.trim().is_empty()).unwrap_or_default();
        let Some((_, targets)) = arm[1].split_once(open) else { continue };
        let targets = targets.split(close).next().unwrap_or_default();
        for source in from.split('|').map(str::trim).filter(|s| *s != "_" && !s.is_empty()) {
            for target in targets.split([',', '|']).map(str::trim).filter(|s| !s.is_empty()) {
                edges.insert((screaming(source), screaming(target)));
            }
        }
    }
    edges
}

/// `WmsRequested` -> `WMS_REQUESTED`.
fn screaming(camel: &str) -> String {
    let mut out = String::new();
    for (index, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn cargo_metadata(root: &Path) -> anyhow::Result<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(root)
        // Offline, and only this machine's platform: the build has fetched exactly those
        // packages, while other platforms' dependencies may never have been downloaded here.
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", "host-tuple"])
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
    fn the_design_doc_check_sees_what_is_wrong() {
        // The check itself must be able to fail: a made-up path, a made-up test, a missing
        // status and column, an edge the model forbids.
        let root = workspace_root();
        let facts = design_facts(&root).expect("facts from the code");
        assert!(facts.statuses.contains(&"WMS_REQUESTED".to_owned()), "{facts:?}");
        assert!(facts.automated.contains(&("LOGISTICS_CONFIRMED".to_owned(), "DONE".to_owned())), "{facts:?}");
        let text = "See `crates/store/tests/store.rs` `claim_race`, `no_such_test` and `crates/nowhere.rs`.\n\
            ```mermaid\nRECEIVED --> DONE\n```\n";
        let problems = design_doc_problems(&root, "doc", text, &facts);
        let expected = ["`no_such_test`", "`crates/nowhere.rs`", "status WMS_REQUESTED", "column `lease_epoch`"];
        for needle in expected.into_iter().chain(["draws RECEIVED --> DONE", "lacks the legal edge"]) {
            assert!(problems.iter().any(|p| p.contains(needle)), "no problem mentions {needle}: {problems:#?}");
        }
        assert!(!problems.iter().any(|p| p.contains("`claim_race`")), "{problems:#?}");
    }

    #[test]
    fn the_model_check_sees_forbidden_dependencies() {
        // The check itself must be able to fail: the store does depend on tokio and sea-orm.
        let metadata = cargo_metadata(&workspace_root()).expect("metadata");
        let closure = normal_closure(&metadata, "midflight-store").expect("closure");
        assert!(closure.contains("tokio") && closure.contains("sea-orm"), "{closure:?}");
    }
}
