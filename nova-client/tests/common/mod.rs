//! Running the `nova` binary in the CLI tests.
#![allow(dead_code)]

use std::process::Output;

#[allow(
    unused_imports,
    reason = "not every test binary that shares this module uses both"
)]
pub use nova_testkit::{nova_at as nova, succeeded as ok};

/// The standard output and error of a run that failed.
pub fn failed(output: Output) -> (String, String) {
    assert!(!output.status.success(), "nova should have failed");
    (
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}
