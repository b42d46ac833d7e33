//! The `nova` CLI against a real novad: the README's three-line example, and a kill -9 right
//! after the ack losing nothing.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use nova_testkit::{NovadBuilder, workspace_binary};

fn nova(server: &str, args: &[&str], stdin: &[u8]) -> Output {
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

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "nova failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

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
    assert!(described.contains("tail_seq: 3"), "{described}");
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
        &["append", "bulk", "--batch-records", "1000"],
        input.as_bytes(),
    ));
    assert_eq!(appended, "0..1000\n1000..2000\n2000..2500\n");
    let read = ok(nova(&url, &["read", "bulk"], b""));
    assert_eq!(read, input);
}
