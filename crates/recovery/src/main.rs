//! `recovery-worker`: the recovery service as a process. Everything but flags, configuration,
//! logging and signals is in the library ([`midflight_recovery::run`]).

use std::process::ExitCode;

use midflight_recovery::RecoveryConfig;

fn main() -> ExitCode {
    midflight_service::main("recovery-worker", |config: RecoveryConfig, shutdown| {
        midflight_recovery::run(config, shutdown)
    })
}
