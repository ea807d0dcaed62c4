//! `consumer`: the consumer service as a process. Everything but the process plumbing is in the library.

use midflight_consumer::ConsumerConfig;

fn main() -> std::process::ExitCode {
    midflight_service::main("midflight-consumer", |config: ConsumerConfig, shutdown| {
        midflight_consumer::run(config, shutdown)
    })
}
