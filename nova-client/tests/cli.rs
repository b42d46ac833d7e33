//! The `nova` CLI against a real novad: the README's three-line example, and a kill -9 right
//! after the ack losing nothing.

#![allow(
    clippy::disallowed_methods,
    reason = "drives real novad processes and the nova CLI on the real clock"
)]

mod common;

use std::process::{Command, Stdio};

use nova_testkit::{NovadBuilder, workspace_binary};

use common::{nova, ok};

#[test]
fn create_append_read_round_trip_and_survive_kill_9() {
    let mut novad = NovadBuilder::new(workspace_binary("novad")).start();
    let url = novad.url();
    assert_eq!(
        ok(nova(&url, &["stream", "create", "events"], b"")),
        "created events\n"
    );
    let appended = ok(nova(&url, &["append", "events"], b"alpha\nbeta\ngamma\n"));
    assert_eq!(appended, "0..3\n", "the assigned range");
    // Acknowledged means durable: a kill -9 right now loses nothing.
    novad.kill9();
    novad.restart();
    assert_eq!(
        ok(nova(&url, &["read", "events", "--from", "0"], b"")),
        "alpha\nbeta\ngamma\n"
    );
    assert_eq!(
        ok(nova(
            &url,
            &["read", "events", "--from", "1", "--limit", "1"],
            b""
        )),
        "beta\n"
    );
    let described = ok(nova(&url, &["stream", "describe", "events"], b""));
    assert!(described.contains("records:        0..3"), "{described}");
    assert_eq!(ok(nova(&url, &["stream", "list"], b"")), "events\ttail=3\n");

    // Errors go to stderr with the reason, and a non-zero exit.
    let missing = nova(&url, &["read", "nope", "--from", "0"], b"");
    assert!(!missing.status.success());
    assert!(missing.stdout.is_empty(), "nothing else on stdout");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"));

    assert_eq!(
        ok(nova(&url, &["stream", "delete", "events"], b"")),
        "deleted events\n"
    );
}

#[test]
fn large_inputs_are_batched() {
    let novad = NovadBuilder::new(workspace_binary("novad")).start();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "bulk"], b""));
    let input: String = (0..2500).map(|i| format!("line-{i}\n")).collect();
    let appended = ok(nova(
        &url,
        &["append", "bulk", "--batch-bytes", "4KiB"],
        input.as_bytes(),
    ));
    assert_eq!(appended, "0..2500\n");
    let read = ok(nova(&url, &["read", "bulk"], b""));
    assert_eq!(read, input);
}

#[test]
fn files_length_prefixed_input_and_json_output() {
    let novad = NovadBuilder::new(workspace_binary("novad")).start();
    let url = novad.url();
    let created = ok(nova(
        &url,
        &["--output", "json", "stream", "create", "bin"],
        b"",
    ));
    assert!(
        created.starts_with("{\"name\":\"bin\",\"tail_seq\":0"),
        "{created}"
    );

    // Length-prefixed records may hold anything, newlines and invalid UTF-8 included.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("records.bin");
    let mut framed = Vec::new();
    for body in [&b"one\nline"[..], &[0xff, 0x00, 0x01][..], b"last"] {
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(body);
    }
    std::fs::write(&file, &framed).unwrap();
    let appended = ok(nova(
        &url,
        &[
            "--output",
            "json",
            "append",
            "bin",
            "--format",
            "length-prefixed",
            file.to_str().unwrap(),
        ],
        b"",
    ));
    assert_eq!(
        appended,
        "{\"stream\":\"bin\",\"records\":3,\"start_seq\":0,\"end_seq\":3}\n"
    );

    let read = ok(nova(&url, &["--output", "json", "read", "bin"], b""));
    let lines: Vec<&str> = read.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("{\"seq\":0,"), "{}", lines[0]);
    assert!(lines[0].contains("\"body\":\"one\\nline\""), "{}", lines[0]);
    assert!(lines[1].contains("\"body_hex\":\"ff0001\""), "{}", lines[1]);

    let described = ok(nova(
        &url,
        &["--output", "json", "stream", "describe", "bin"],
        b"",
    ));
    assert!(described.contains("\"tail_seq\":3"), "{described}");
    let listed = ok(nova(&url, &["--output", "json", "stream", "list"], b""));
    assert_eq!(listed.lines().count(), 1);
}

#[test]
fn tail_prints_the_last_records_and_follows_new_ones() {
    let novad = NovadBuilder::new(workspace_binary("novad")).start();
    let url = novad.url();
    ok(nova(&url, &["stream", "create", "t"], b""));
    let input: String = (0..20).map(|i| format!("r{i}\n")).collect();
    ok(nova(&url, &["append", "t"], input.as_bytes()));
    assert_eq!(ok(nova(&url, &["tail", "t", "-n", "2"], b"")), "r18\nr19\n");

    let mut follower = Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["--server", &url, "tail", "-f", "-n", "0", "t"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    ok(nova(&url, &["append", "t"], b"fresh\n"));
    let mut stdout = follower.stdout.take().unwrap();
    let mut line = [0u8; 6];
    std::io::Read::read_exact(&mut stdout, &mut line).unwrap();
    assert_eq!(
        &line, b"fresh\n",
        "the follower prints the new record as it lands"
    );
    follower.kill().unwrap();
    let _ = follower.wait();
}

#[test]
fn the_token_is_never_printed() {
    // `--help` lists NOVA_TOKEN without its value.
    let help = Command::new(env!("CARGO_BIN_EXE_nova"))
        .arg("--help")
        .env("NOVA_TOKEN", "s3cret-value")
        .output()
        .expect("run nova");
    let help = ok(help);
    assert!(help.contains("NOVA_TOKEN"), "{help}");
    assert!(!help.contains("s3cret-value"), "{help}");
    // A token that cannot be sent is refused by what is wrong with it, not by its value.
    let refused = nova(
        "http://127.0.0.1:1",
        &["--token", "not a token", "stream", "list"],
        b"",
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("printable ASCII"), "{stderr}");
    assert!(!stderr.contains("not a token"), "{stderr}");
}

#[test]
fn an_express_stream_is_refused_by_a_star_without_zone_buckets() {
    let novad = NovadBuilder::new(workspace_binary("novad")).start();
    let url = novad.url();
    let refused = nova(
        &url,
        &["stream", "create", "fast", "--storage-class", "express"],
        b"",
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("EXPRESS") && stderr.contains("zone"),
        "{stderr}"
    );
    assert_eq!(
        ok(nova(
            &url,
            &["stream", "create", "fast", "--storage-class", "standard"],
            b""
        )),
        "created fast\n"
    );
}
