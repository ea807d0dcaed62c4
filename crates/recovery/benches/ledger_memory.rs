//! What a reconciliation pass's ledger view costs the process in memory: folds N entries of
//! the common kind (one lock per request id, in pages as a downstream serves them) and reports
//! how much the resident set grew, per entry, with the recovery worker's allocator.
//!
//! `cargo bench -p midflight-recovery --bench ledger_memory [-- N]` (N defaults to 1,000,000).
//! BENCHMARKS.md records the numbers; `ReconcileSection::ledger_entries_max` is sized from them.

use midflight_api::client::{LedgerEntry, LedgerKind};
use midflight_recovery::Ledger;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Entries per page, as the mocks serve them at most.
const PAGE: u64 = 1_000;

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmRSS in KiB")
}

fn main() {
    // `cargo bench` passes `--bench`; the first number among the arguments is N.
    let n: u64 = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(1_000_000);
    let before = resident_kib();
    let mut ledger = Ledger::default();
    for start in (0..n).step_by(PAGE as usize) {
        let page: Vec<LedgerEntry> = (start..(start + PAGE).min(n))
            .map(|i| LedgerEntry {
                seq: i + 1,
                kind: LedgerKind::Apply,
                request_id: format!("mf-wms-{i:032x}"),
                order_no: format!("O-{i:08}"),
                effect_id: format!("LCK{i:012}"),
                at_ms: 1,
            })
            .collect();
        ledger.fold(&page);
    }
    let grown = resident_kib().saturating_sub(before);
    println!(
        "{n} entries: resident set grew {} MiB, {:.0} bytes an entry ({:.0} counted from capacities)",
        grown / 1024,
        grown as f64 * 1024.0 / n as f64,
        ledger.heap_bytes() as f64 / n as f64
    );
}
