//! The report of a run: what the checker found plus what the lab measured, printed for people
//! and written as JSON (`--report-json`) for machines and for comparing runs.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use midflight_checker::{Report, Violation};
use serde::Serialize;

/// How the notes that fail a run begin.
pub const FAILING_NOTES: [&str; 2] = ["crash", "never fired"];

#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    pub name: String,
    pub messages: usize,
    pub by_status: BTreeMap<String, usize>,
    pub duplicate_effects: usize,
    pub lost: usize,
    pub violations: Vec<Violation>,
    pub faults_injected: usize,
    pub takeovers: usize,
    pub tickets: usize,
    pub seconds_to_quiescence: f64,
    /// False when the run hit its deadline before every message was terminal.
    pub quiescent: bool,
    /// What the lab saw besides the checker: processes that died on their own, and such.
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy: Option<Box<RunReport>>,
}

impl RunReport {
    pub fn from_check(name: &str, report: Report) -> RunReport {
        RunReport {
            name: name.to_owned(),
            messages: report.messages,
            by_status: report.by_status,
            duplicate_effects: report.duplicate_effects,
            lost: report.lost,
            violations: report.violations,
            takeovers: report.takeovers,
            tickets: report.tickets,
            ..RunReport::default()
        }
    }

    /// A run passes when the checker found nothing, everything settled, no child crashed and
    /// every step of its schedule fired (a fault that never happened tested nothing).
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
            && self.quiescent
            && self.notes.iter().all(|n| !FAILING_NOTES.iter().any(|prefix| n.starts_with(prefix)))
    }

    pub fn print(&self) {
        println!("── {} ──", self.name);
        println!("  messages              {}", self.messages);
        let statuses: Vec<String> = self.by_status.iter().map(|(s, n)| format!("{s} {n}")).collect();
        println!("  outcomes              {}", statuses.join(", "));
        println!("  duplicate effects     {}", self.duplicate_effects);
        println!("  lost messages         {}", self.lost);
        println!("  takeovers             {}", self.takeovers);
        println!("  tickets               {}", self.tickets);
        println!("  faults injected       {}", self.faults_injected);
        let settled = if self.quiescent { "" } else { " (deadline hit: not quiescent)" };
        println!("  time to quiescence    {:.1} s{settled}", self.seconds_to_quiescence);
        println!("  invariant violations  {}", self.violations.len());
        for violation in self.violations.iter().take(20) {
            println!("    {violation}");
        }
        if self.violations.len() > 20 {
            println!("    ... and {} more (see the JSON report)", self.violations.len() - 20);
        }
        for note in &self.notes {
            println!("  note: {note}");
        }
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).ok();
        }
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_passes_only_settled_clean_and_with_its_whole_schedule() {
        let settled =
            RunReport { quiescent: true, notes: vec!["logs and databases: run/x".into()], ..RunReport::default() };
        assert!(settled.passed());
        for note in [
            "crash: consumer-2 exited on its own (status Some(101)); see its log",
            "crash: recovery-1 did not stop cleanly on SIGTERM (status None); see its log",
            "never fired: kill -9 consumer-2 (AtHeld(5))",
        ] {
            let mut report = settled.clone();
            report.notes.push(note.to_owned());
            assert!(!report.passed(), "{note}");
        }
        assert!(!RunReport { quiescent: false, ..settled.clone() }.passed());
    }
}
