//! Running the `nova` binary in the CLI tests.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// `nova --server SERVER ARGS…` with `stdin` on its standard input, run to its end.
pub fn nova(server: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nova"))
        .arg("--server")
        .arg(server)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nova");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// The standard output of a run that succeeded (or a panic with its standard error).
pub fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "nova failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The standard output and error of a run that failed.
pub fn failed(output: Output) -> (String, String) {
    assert!(!output.status.success(), "nova should have failed");
    (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}
