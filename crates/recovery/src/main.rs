//! `recovery-worker`: the recovery service as a process. Everything but flags, configuration,
//! logging and signals is in the library ([`midflight_recovery::run`]).

use std::process::ExitCode;

use midflight_recovery::RecoveryConfig;

/// glibc's allocator spent a third of this process's CPU under load (BENCHMARKS.md); mimalloc's
/// per-thread free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    midflight_service::main("recovery-worker", |config: RecoveryConfig, shutdown| {
        midflight_recovery::run(config, shutdown)
    })
}
