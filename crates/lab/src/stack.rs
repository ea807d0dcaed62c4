//! `cargo xtask stack up|down|produce`: the local stack left running for manual exploration.
//!
//! The embedded Kafka lives inside a process, so `up` starts a detached `stack serve` process
//! that hosts it and supervises the services, writes the stack's addresses to
//! `run/stack/state.json`, and stays until `down` sends it SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::system::{System, SystemSpec};
use crate::workload::Workload;

#[derive(Debug, Clone, clap::Args)]
pub struct StackArgs {
    #[command(subcommand)]
    pub command: StackCommand,
    /// Where the stack keeps its databases, logs and state file.
    #[arg(long, default_value = "run/stack", global = true)]
    pub dir: PathBuf,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum StackCommand {
    /// Start the stack in the background.
    Up {
        #[arg(long, default_value_t = 3)]
        consumers: usize,
        #[arg(long)]
        mysql_url: Option<String>,
    },
    /// Stop it.
    Down,
    /// Produce orders to the running stack.
    Produce {
        #[arg(long, default_value_t = 100)]
        messages: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Host the stack in the foreground (what `up` runs detached).
    #[command(hide = true)]
    Serve {
        #[arg(long, default_value_t = 3)]
        consumers: usize,
        #[arg(long)]
        mysql_url: Option<String>,
    },
}

/// What `up` leaves behind for `down`, `produce` and people.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    pid: u32,
    bootstrap_servers: String,
    order_topic: String,
    database_url: String,
    wms: String,
    logistics: String,
}

pub async fn run(args: StackArgs) -> anyhow::Result<bool> {
    let state_path = args.dir.join("state.json");
    match args.command {
        StackCommand::Up { consumers, mysql_url } => up(&args.dir, &state_path, consumers, mysql_url),
        StackCommand::Down => down(&state_path),
        StackCommand::Produce { messages, seed } => produce(&state_path, messages, seed).await,
        StackCommand::Serve { consumers, mysql_url } => serve(&args.dir, &state_path, consumers, mysql_url).await,
    }
}

fn up(dir: &Path, state_path: &Path, consumers: usize, mysql_url: Option<String>) -> anyhow::Result<bool> {
    if state_path.exists() {
        bail!("a stack seems to be up already ({}); run `cargo xtask stack down` first", state_path.display());
    }
    std::fs::create_dir_all(dir)?;
    let log = std::fs::File::create(dir.join("serve.log"))?;
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["stack", "--dir", &dir.display().to_string(), "serve", "--consumers", &consumers.to_string()]);
    if let Some(url) = &mysql_url {
        command.args(["--mysql-url", url]);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .context("cannot start the stack host")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !state_path.exists() {
        if Instant::now() > deadline {
            bail!("the stack did not come up within 60 s; see {}", dir.join("serve.log").display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let state: State = serde_json::from_str(&std::fs::read_to_string(state_path)?)?;
    println!("stack up (host pid {})", state.pid);
    println!("  kafka bootstrap   {}", state.bootstrap_servers);
    println!("  saga database     {}", state.database_url);
    println!("  mock wms          {}", state.wms);
    println!("  mock logistics    {}", state.logistics);
    println!("  logs              {}", dir.display());
    println!("try: cargo xtask stack produce --messages 100");
    println!("     cargo run -q -p midflight-ctl -- --set database.url='{}' list", state.database_url);
    Ok(true)
}

fn down(state_path: &Path) -> anyhow::Result<bool> {
    let Ok(text) = std::fs::read_to_string(state_path) else {
        println!("no stack is up");
        return Ok(true);
    };
    let state: State = serde_json::from_str(&text)?;
    Command::new("kill").arg("-TERM").arg(state.pid.to_string()).status().ok();
    let deadline = Instant::now() + Duration::from_secs(30);
    while state_path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    if state_path.exists() {
        Command::new("kill").arg("-KILL").arg(state.pid.to_string()).status().ok();
        std::fs::remove_file(state_path).ok();
    }
    println!("stack down");
    Ok(true)
}

async fn produce(state_path: &Path, messages: usize, seed: u64) -> anyhow::Result<bool> {
    let text = std::fs::read_to_string(state_path).context("no stack is up (run `cargo xtask stack up`)")?;
    let state: State = serde_json::from_str(&text)?;
    let kafka = midflight_stack::kafka::EmbeddedKafka::connect(&state.bootstrap_servers)?;
    let workload = Workload::orders(seed, messages, &format!("M{seed}"));
    let expected = workload.produce(&kafka, &state.order_topic).await?;
    println!("produced {} orders", expected.orders.len());
    Ok(true)
}

async fn serve(dir: &Path, state_path: &Path, consumers: usize, mysql_url: Option<String>) -> anyhow::Result<bool> {
    let parent = dir.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "stack".to_owned());
    let mut spec = SystemSpec::new(&name, &parent);
    spec.consumers = consumers;
    spec.mysql_url = mysql_url;
    spec.lease_ms = 30_000;
    spec.rpc_timeout_ms = 2_000;
    let mut system = System::start(spec).await?;
    let state = State {
        pid: std::process::id(),
        bootstrap_servers: system.kafka.bootstrap_servers().to_owned(),
        order_topic: system.names.order_topic.clone(),
        database_url: system.database_url.clone(),
        wms: system.wms_endpoint.clone(),
        logistics: system.logistics_endpoint.clone(),
    };
    std::fs::write(state_path, serde_json::to_string_pretty(&state)?)?;
    midflight_service::shutdown_on_signals().cancelled().await;
    system.shutdown();
    std::fs::remove_file(state_path).ok();
    Ok(true)
}
