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

    /// [`Supervisor::stop_together`] for one child: thawed, SIGTERM, then wait (bounded) for
    /// the exit; SIGKILL if it does not come. `None` also for a child that was not running.
    pub fn stop(&mut self, name: &str) -> anyhow::Result<Option<i32>> {
        Ok(self.stop_together(&[name.to_owned()])?.pop().and_then(|(_, code)| code))
    }

    pub fn is_running(&mut self, name: &str) -> bool {
        self.children.get_mut(name).is_some_and(|r| matches!(r.child.try_wait(), Ok(None)))
    }

    /// Names of the children that exited on their own (crashed), with their exit status.
    pub fn exited(&mut self) -> Vec<(String, Option<i32>)> {
        self.exited_incarnations().into_iter().map(|(name, _, code)| (name, code)).collect()
    }

    /// The children whose latest incarnation has exited: name, incarnation (0 for the first
    /// start, one more for each restart) and exit status (`None`: ended by a signal).
    pub fn exited_incarnations(&mut self) -> Vec<(String, u32, Option<i32>)> {
        let mut out = Vec::new();
        for (name, running) in &mut self.children {
            if let Ok(Some(status)) = running.child.try_wait() {
                out.push((name.clone(), running.generation, status.code()));
            }
        }
        out
    }

    /// The incarnation of `name` started last.
    pub fn generation(&self, name: &str) -> Option<u32> {
        self.children.get(name).map(|r| r.generation)
    }

    /// Stops those of `names` that are running, all at once: each is thawed (it may be frozen)
    /// and sent SIGTERM, then all are waited for up to the same grace, and any still running
    /// is killed. Returns each stopped child's exit status (`None`: it had to be killed, or a
    /// signal ended it).
    pub fn stop_together(&mut self, names: &[String]) -> anyhow::Result<Vec<(String, Option<i32>)>> {
        let mut stopping = Vec::new();
        for name in names {
            if self.is_running(name) {
                self.signal(name, Signal::Cont)?;
                self.signal(name, Signal::Term)?;
                stopping.push(name.clone());
            }
        }
        let deadline = Instant::now() + TERM_GRACE;
        let mut stopped = Vec::new();
        while !stopping.is_empty() {
            let mut still = Vec::new();
            for name in stopping {
                let running = self.children.get_mut(&name).with_context(|| format!("no process named {name}"))?;
                match running.child.try_wait()? {
                    Some(status) => stopped.push((name, status.code())),
                    None if Instant::now() > deadline => {
                        self.signal(&name, Signal::Kill)?;
                        stopped.push((name, None));
                    }
                    None => still.push(name),
                }
            }
            stopping = still;
            if !stopping.is_empty() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(stopped)
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

/// Supervisors of programs in /bin, for the lab's own tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A supervisor of programs in /bin, logging to a directory of its own that goes with it.
    pub(crate) struct Children {
        pub supervisor: Supervisor,
        logs: PathBuf,
    }

    impl Drop for Children {
        fn drop(&mut self) {
            self.supervisor.kill_all();
            std::fs::remove_dir_all(&self.logs).ok();
        }
    }

    pub(crate) fn supervisor(test: &str) -> Children {
        let logs = std::env::temp_dir().join(format!("midflight-lab-{test}-{}", std::process::id()));
        let supervisor = Supervisor::new(PathBuf::from("/bin"), logs.clone()).expect("supervisor");
        Children { supervisor, logs }
    }

    pub(crate) fn spec(binary: &'static str, args: &[&str]) -> Spec {
        Spec { binary, args: args.iter().map(|a| (*a).to_owned()).collect(), env: Vec::new() }
    }

    /// Waits (bounded) until `name` has exited.
    pub(crate) fn wait_exited(children: &mut Supervisor, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while children.is_running(name) {
            assert!(Instant::now() < deadline, "{name} still running after 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{spec, supervisor, wait_exited};
    use super::*;

    #[test]
    fn each_restart_is_an_incarnation_of_its_own() {
        let mut run = supervisor("incarnations");
        let children = &mut run.supervisor;
        children.start("x", spec("sleep", &["30"])).expect("start");
        assert_eq!(children.generation("x"), Some(0));
        children.signal("x", Signal::Kill).expect("kill");
        assert_eq!(children.exited_incarnations(), vec![("x".to_owned(), 0, None)]);
        children.start("x", spec("false", &[])).expect("start again");
        wait_exited(children, "x");
        assert_eq!(children.exited_incarnations(), vec![("x".to_owned(), 1, Some(1))]);
    }

    #[test]
    fn a_frozen_child_is_stopped_with_the_others() {
        let mut run = supervisor("stop-together");
        let children = &mut run.supervisor;
        children.start("a", spec("sleep", &["30"])).expect("start a");
        children.start("b", spec("sleep", &["30"])).expect("start b");
        children.signal("a", Signal::Stop).expect("freeze a");
        let names = vec!["a".to_owned(), "b".to_owned(), "never-started".to_owned()];
        let mut stopped = children.stop_together(&names).expect("stop");
        stopped.sort();
        // sleep dies of the SIGTERM it does not handle: no exit code, and neither waited for
        // the grace to run out (a frozen child would have).
        assert_eq!(stopped, vec![("a".to_owned(), None), ("b".to_owned(), None)]);
        assert!(!children.is_running("a") && !children.is_running("b"));
    }
}
