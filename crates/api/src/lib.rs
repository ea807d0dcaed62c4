//! The gRPC contracts of midflight's downstreams, generated from `proto/`.
//!
//! This is the only crate that holds prost types: services and the saga driver convert them to
//! their own domain types at their boundary. Generated clients are behind the `client` feature
//! and server traits behind `server`, so each side compiles only what it uses.
//!
//! Each proto package maps to a module of the same path (`wms.v1` is [`wms::v1`]).

/// The warehouse system: lock, query, reverse stock and list its ledger.
pub mod wms {
    pub mod v1 {
        tonic::include_proto!("wms.v1");
    }
}

/// The logistics provider: create, query, cancel shipments and list its ledger.
pub mod logistics {
    pub mod v1 {
        tonic::include_proto!("logistics.v1");
    }
}

/// Fault injection of the mock downstreams, set by scenarios at run time.
pub mod faults {
    pub mod v1 {
        tonic::include_proto!("faults.v1");
    }
}

/// Domain-level clients of the downstreams: `midflight_model` types in, `Observation`s out.
#[cfg(feature = "client")]
pub mod client;
