//! `consumer`: the consumer service as a process. Everything but the process plumbing is in the library.

use midflight_consumer::ConsumerConfig;

/// glibc's allocator spent a third of this process's CPU under load (BENCHMARKS.md); mimalloc's
/// per-thread free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    midflight_service::main("midflight-consumer", |config: ConsumerConfig, shutdown| {
        midflight_consumer::run(config, shutdown)
    })
}
