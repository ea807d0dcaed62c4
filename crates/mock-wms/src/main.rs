//! `mock-wms`: the mock as a process. Flags, configuration, logs and signals come from
//! midflight-service; everything else is in the library.
//!
//! A mock warehouse system: idempotent, queryable, reversible, with fault injection.

use anyhow::Context;
use midflight_mock_wms::WmsConfig;

/// glibc's allocator spent a third of this process's CPU under load (BENCHMARKS.md); mimalloc's
/// per-thread free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    midflight_service::main("mock-wms", |config: WmsConfig, shutdown| async move {
        let listener = tokio::net::TcpListener::bind(&config.server.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.listen))?;
        midflight_mock_wms::run(config, listener, shutdown.cancelled_owned()).await?;
        anyhow::Ok(())
    })
}
