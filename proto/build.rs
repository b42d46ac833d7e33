//! Generates the nova.v1 types and service stubs, and the file descriptor set that the
//! reflection service serves. protoc comes from protoc-bin-vendored so a fresh machine needs
//! no system protobuf install; an explicit PROTOC in the environment still wins.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    config.protoc_executable(protoc);
    // Record payloads decode as `Bytes` slices of the received frame, not fresh Vec copies.
    config.bytes(["."]);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("nova_v1_descriptor.bin"))
        .compile_with_config(config, &["proto/nova/v1/nova.proto"], &["proto"])?;
    Ok(())
}
