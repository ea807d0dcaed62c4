//! Compiles the proto contracts with a vendored `protoc`, so a fresh machine needs no system
//! protobuf compiler. Clients and servers are generated only when their feature is on, so a
//! caller of the downstreams does not compile server code and the mocks do not compile clients
//! they never use (tests turn both on).

use std::path::PathBuf;

const PROTOS: [&str; 3] = ["wms/v1/wms.proto", "logistics/v1/logistics.proto", "faults/v1/faults.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_client(std::env::var_os("CARGO_FEATURE_CLIENT").is_some())
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        .compile_with_config(config, &protos, std::slice::from_ref(&root))?;
    Ok(())
}
