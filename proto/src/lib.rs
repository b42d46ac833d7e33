//! Nova's wire schema (`nova.v1`), the validated domain types requests become, and the mapping
//! from errors to gRPC statuses. Everything else depends on this crate; it depends on nothing
//! of Nova's.

pub mod clock;
pub mod codec;

/// gRPC status codes, for crates that see them without using tonic themselves.
pub use tonic::Code;
mod convert;
pub mod domain;
pub mod error;
pub mod route;
pub mod rpc;
pub mod units;
pub mod validate;
pub mod wire;

pub mod v1 {
    #![allow(clippy::all)]
    tonic::include_proto!("nova.v1");

    /// The encoded file descriptor set, for the reflection service.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("nova_v1_descriptor");
}

/// The servers of nova.v1, receiving appends as `wire::WireAppend`.
pub mod server {
    #![allow(clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/server/nova.v1.rs"));
}

pub use error::RequestError;
