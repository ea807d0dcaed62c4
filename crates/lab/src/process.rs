//! Child processes of a run: started from the sibling binaries of the lab, logging to files in
//! the run directory, signalled by name (kill -9, SIGSTOP/SIGCONT for zombies, SIGTERM for a
//! graceful stop). Every child still running when the supervisor is dropped is killed, so a
//! failed run leaves nothing behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a graceful stop may take before the child is killed.
const TERM_GRACE: Duration = Duration::from_secs(15);

/// Signals the lab sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGKILL: the process dies mid-flight, nothing flushed (a crash).
    Kill,
    /// SIGTERM: graceful shutdown.
    Term,
    /// SIGSTOP: frozen; resumes as a zombie with stale state on SIGCONT.
    Stop,
    Cont,
}

impl Signal {
    fn flag(self) -> &'static str {
        match self {
            Signal::Kill => "-KILL",
            Signal::Term => "-TERM",
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
        }
    }
}

/// How to start one child.
#[derive(Debug, Clone)]
pub struct Spec {
    pub binary: &'static str,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

#[derive(Debug)]
struct Running {
    spec: Spec,
    child: Child,
    /// Restarts of this name so far (each gets its own log file).
    generation: u32,
}

/// The children of one run.
#[derive(Debug)]
pub struct Supervisor {
    binaries: PathBuf,
    logs: PathBuf,
    children: BTreeMap<String, Running>,
}

impl Supervisor {
    /// Children are started from `binaries` (the lab's own directory) and log under `logs`.
    pub fn new(binaries: PathBuf, logs: PathBuf) -> anyhow::Result<Supervisor> {
        std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
        Ok(Supervisor { binaries, logs, children: BTreeMap::new() })
    }

    /// The directory holding the lab and the service binaries.
    pub fn sibling_binaries() -> anyhow::Result<PathBuf> {
        let exe = std::env::current_exe().context("cannot find the lab's own path")?;
        Ok(exe.parent().map(Path::to_path_buf).unwrap_or_default())
    }

    pub fn start(&mut self, name: &str, spec: Spec) -> anyhow::Result<u32> {
        if self.is_running(name) {
            bail!("{name} is already running");
        }
        let generation = self.children.get(name).map_or(0, |r| r.generation + 1);
        let child = self.spawn(name, &spec, generation)?;
        let pid = child.id();
        self.children.insert(name.to_owned(), Running { spec, child, generation });
        Ok(pid)
    }

    fn spawn(&self, name: &str, spec: &Spec, generation: u32) -> anyhow::Result<Child> {
        let binary = self.binaries.join(spec.binary);
        if !binary.exists() {
            bail!("{} is not built (run `cargo build --release --bins`)", binary.display());
        }
        let log_path = self.logs.join(format!("{name}.{generation}.log"));
        let log = std::fs::File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let err = log.try_clone()?;
        Command::new(&binary)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            // Should this process die without stopping its children, they stop on their own.
            .env(midflight_service::PARENT_PID_VAR, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("cannot start {name} ({})", binary.display()))
    }

    /// Starts `name` again with the spec it last ran with (after a kill or a stop).
    pub fn restart(&mut self, name: &str) -> anyhow::Result<u32> {
        if self.is_running(name) {
            bail!("{name} is still running");
        }
        let Some(previous) = self.children.get(name) else { bail!("{name} was never started") };
        let spec = previous.spec.clone();
        let generation = previous.generation + 1;
        let child = self.spawn(name, &spec, generation)?;
        let pid = child.id();
        self.children.insert(name.to_owned(), Running { spec, child, generation });
        Ok(pid)
    }

    pub fn signal(&mut self, name: &str, signal: Signal) -> anyhow::Result<()> {
        let running = self.children.get_mut(name).with_context(|| format!("no process named {name}"))?;
        let status = Command::new("kill").arg(signal.flag()).arg(running.child.id().to_string()).status()?;
        if !status.success() {
            bail!("kill {} {name} failed", signal.flag());
        }
        if signal == Signal::Kill {
            running.child.wait().ok();
        }
        Ok(())
    }

    /// SIGTERM, then wait (bounded) for the exit; SIGKILL if it does not come.
    pub fn stop(&mut self, name: &str) -> anyhow::Result<Option<i32>> {
        self.signal(name, Signal::Term)?;
        let deadline = Instant::now() + TERM_GRACE;
        loop {
            let running = self.children.get_mut(name).with_context(|| format!("no process named {name}"))?;
            if let Some(status) = running.child.try_wait()? {
                return Ok(status.code());
            }
            if Instant::now() > deadline {
                self.signal(name, Signal::Kill)?;
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&mut self, name: &str) -> bool {
        self.children.get_mut(name).is_some_and(|r| matches!(r.child.try_wait(), Ok(None)))
    }

    /// Names of the children that exited on their own (crashed), with their exit status.
    pub fn exited(&mut self) -> Vec<(String, Option<i32>)> {
        let mut out = Vec::new();
        for (name, running) in &mut self.children {
            if let Ok(Some(status)) = running.child.try_wait() {
                out.push((name.clone(), status.code()));
            }
        }
        out
    }

    pub fn names(&self) -> Vec<String> {
        self.children.keys().cloned().collect()
    }

    /// The log file of `name`'s latest incarnation.
    pub fn current_log(&self, name: &str) -> Option<PathBuf> {
        self.children.get(name).map(|r| self.logs.join(format!("{name}.{}.log", r.generation)))
    }

    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.get(name).map(|r| r.child.id())
    }

    /// Kills every child still running.
    pub fn kill_all(&mut self) {
        for running in self.children.values_mut() {
            if matches!(running.child.try_wait(), Ok(None)) {
                // A frozen child must be thawed to die promptly.
                Command::new("kill").arg("-CONT").arg(running.child.id().to_string()).status().ok();
                running.child.kill().ok();
                running.child.wait().ok();
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill_all();
    }
}
