//! What the Kafka tests share: kcat, run as the README's test command installs it.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

pub fn kcat_binary() -> PathBuf {
    std::env::var_os("NOVA_KCAT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kcat"))
}

/// Runs kcat with `args`, feeding it `input`; it must succeed.
pub fn kcat(bootstrap: &str, args: &[&str], input: &[u8]) -> Output {
    let output = kcat_may_fail(bootstrap, args, input);
    assert!(
        output.status.success(),
        "kcat {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs kcat with `args`, feeding it `input`.
pub fn kcat_may_fail(bootstrap: &str, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(kcat_binary())
        .args(["-b", bootstrap])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run kcat ({e}); the README's test command (scripts/test) installs it")
        });
    child
        .stdin
        .take()
        .expect("kcat's stdin")
        .write_all(input)
        .expect("feed kcat");
    child.wait_with_output().expect("kcat ran")
}

/// Everything in `topic` partition 0 from the start, in kcat's `format`.
pub fn consume(bootstrap: &str, topic: &str, format: &str) -> String {
    let output = kcat(
        bootstrap,
        &[
            "-C",
            "-t",
            topic,
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            format,
        ],
        b"",
    );
    String::from_utf8(output.stdout).expect("UTF-8 from kcat")
}
