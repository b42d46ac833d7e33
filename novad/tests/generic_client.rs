//! A generic gRPC client (Python grpcio, no Nova .proto) discovers the API through reflection,
//! checks health, appends and reads. The README's test command installs grpcio beside moto.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use nova_testkit::python;

#[test]
fn python_grpcio_finds_and_calls_the_api_through_reflection() {
    let novad = novad().start();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/generic_client.py");
    let python = python();
    let output = Command::new(&python)
        .arg(&script)
        .arg(format!("127.0.0.1:{}", novad.port()))
        .arg("from-python")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); the README's test command (scripts/test) installs grpcio",
                python.display()
            )
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the generic client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("health SERVING"), "{stdout}");
    assert!(stdout.contains("read back 2 records"), "{stdout}");
}
