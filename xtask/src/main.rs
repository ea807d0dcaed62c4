//! `cargo xtask`: the project's automation, as a workspace member so it needs nothing but cargo.
//!
//! It stays light (two dependencies) so `cargo xtask` starts fast. Commands that run the
//! system (the demo, scenarios, chaos, the local stack, benchmarks) build the `midflight-lab`
//! binary in release mode and hand it their arguments: that is where the services, the embedded
//! Kafka and the invariant checker are wired together.

mod tidy;

use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

const HELP: &str = "\
cargo xtask <command> [args]

Commands:
  demo                  Build everything, start the local stack as separate processes on the
                        embedded Kafka, reproduce the incident with the legacy design and with
                        midflight, check the invariants and print a report.
  scenario <name>       Run one scenario of the catalogue (`scenario --list` lists them).
  chaos                 Random fault campaign fully determined by --seed, then the checker.
  stack up|down|produce Leave the local stack running for manual exploration, produce orders
                        to it, and stop it.
  bench                 Benchmarks side by side with the baselines; writes a report.
  tidy                  Repository checks (also run by `cargo test`).

Each run command accepts --help for its own flags.
";

/// Commands forwarded to the lab binary.
const LAB_COMMANDS: [&str; 5] = ["demo", "scenario", "chaos", "stack", "bench"];

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else {
        print!("{HELP}");
        return Ok(ExitCode::SUCCESS);
    };
    match command.as_str() {
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(ExitCode::SUCCESS)
        }
        "tidy" => {
            let problems = tidy::check_all(&tidy::workspace_root())?;
            if problems.is_empty() {
                println!("tidy: ok");
                return Ok(ExitCode::SUCCESS);
            }
            for problem in &problems {
                eprintln!("tidy: {problem}");
            }
            Ok(ExitCode::FAILURE)
        }
        name if LAB_COMMANDS.contains(&name) => lab(&args),
        other => bail!("unknown command {other:?}; run `cargo xtask` for the list"),
    }
}

/// Variables `cargo run` sets for the binary it runs, which describe xtask's package.
fn is_run_env(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// Builds the lab (release) and runs it with the same arguments.
fn lab(args: &[String]) -> anyhow::Result<ExitCode> {
    let root = tidy::workspace_root();
    if !root.join("crates/lab/Cargo.toml").exists() {
        bail!("`cargo xtask {}` needs the midflight-lab crate, which is not in this checkout yet", args[0]);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(&cargo);
    // `cargo run` describes xtask's own package in the environment (CARGO_MANIFEST_DIR and
    // friends); some dependencies' build scripts read those, so the inner build would be
    // fingerprinted apart from a plain `cargo build --release` and rebuild everything each time
    // one follows the other.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if is_run_env(&name) {
            build.env_remove(name.as_ref());
        }
    }
    let status = build
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "--bins"])
        .status()
        .context("cannot run cargo build")?;
    if !status.success() {
        bail!("cargo build --release failed");
    }
    let status = Command::new(root.join("target/release/midflight-lab"))
        .current_dir(&root)
        .args(args)
        .status()
        .context("cannot start target/release/midflight-lab")?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8)
    })
}
