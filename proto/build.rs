//! Generates the nova.v1 types and clients, the servers, and the file descriptor set that the
//! reflection service serves. protoc comes from protoc-bin-vendored so a fresh machine needs
//! no system protobuf install; an explicit PROTOC in the environment still wins.
//!
//! The servers are generated apart from the types, with one difference: a server receives
//! `AppendRequest` as `wire::WireAppend` (the received bytes, read without allocating per
//! record), so that what decoding holds is bounded by the message's length. Clients send the
//! generated `AppendRequest`; both are the same bytes on the wire. And a server encodes its
//! responses with `codec::ExactCodec`, into a buffer reserved at the response's length.

use std::path::PathBuf;

fn protoc() -> Result<PathBuf, Box<dyn std::error::Error>> {
    Ok(match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = ["proto/nova/v1/nova.proto"];

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc()?);
    // Record payloads decode as `Bytes` slices of the received frame, not fresh Vec copies.
    config.bytes(["."]);
    tonic_prost_build::configure()
        .build_server(false)
        .file_descriptor_set_path(out_dir.join("nova_v1_descriptor.bin"))
        .compile_with_config(config, &protos, &["proto"])?;

    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc()?);
    tonic_prost_build::configure()
        .build_client(false)
        .out_dir(&server_dir)
        .codec_path("crate::codec::ExactCodec")
        .extern_path(".nova.v1", "crate::v1")
        .extern_path(".nova.v1.AppendRequest", "crate::wire::WireAppend")
        .compile_with_config(config, &protos, &["proto"])?;
    Ok(())
}
