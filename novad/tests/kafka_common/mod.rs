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

/// Checks an idempotent producer's run (`python/kafka_idempotent.py`): it was told of at least
/// nine in ten of its `records` delivered (lines "i offset" in `delivered_file`), each of those
/// is stored exactly once, at the offset it was told, and `stored` (the partition's bodies,
/// "record i …") holds every record once, in the order produced. How many are stored.
pub fn assert_delivered_once_in_order(
    delivered_file: &std::path::Path,
    stored: &[String],
    records: usize,
    summary: &str,
) -> usize {
    let delivered: Vec<(usize, u64)> = std::fs::read_to_string(delivered_file)
        .unwrap()
        .lines()
        .map(|l| {
            let (i, o) = l.split_once(' ').unwrap();
            (i.parse().unwrap(), o.parse().unwrap())
        })
        .collect();
    assert!(delivered.len() * 10 >= records * 9, "{summary}");
    let ids: Vec<usize> = stored
        .iter()
        .map(|body| body.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    let mut seen = std::collections::HashMap::new();
    for (offset, id) in ids.iter().enumerate() {
        seen.entry(*id).or_insert_with(Vec::new).push(offset as u64);
    }
    for (id, offset) in &delivered {
        let at = seen.get(id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(
            at,
            [*offset],
            "record {id}, reported at offset {offset}: stored at {at:?}"
        );
    }
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "records out of order or repeated"
    );
    ids.len()
}
