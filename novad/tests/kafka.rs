//! The Kafka listener, driven by Kafka clients nobody here wrote: kcat (librdkafka) from
//! Debian, and confluent-kafka and kafka-python from PyPI (scripts/test installs all three).

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use nova_client::Record;
use nova_testkit::{Novad, free_port, python};

/// A star serving Kafka on a port of its own; returns it and the bootstrap address.
fn kafka_star(extra: &[&str]) -> (Novad, String) {
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let novad = novad()
        .args(["--kafka-listen", bootstrap.as_str()])
        .args(extra.iter().copied())
        .start();
    nova_testkit::wait_for_port(port, Duration::from_secs(10), "the Kafka listener");
    (novad, bootstrap)
}

fn kcat_binary() -> PathBuf {
    std::env::var_os("NOVA_KCAT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kcat"))
}

/// Runs kcat with `args`, feeding it `input`.
fn kcat(bootstrap: &str, args: &[&str], input: &[u8]) -> Output {
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
    let output = child.wait_with_output().expect("kcat ran");
    assert!(
        output.status.success(),
        "kcat {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Everything in `topic` partition 0 from the start, in kcat's `format`.
fn consume(bootstrap: &str, topic: &str, format: &str) -> String {
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

#[test]
fn kcat_produces_lines_and_consumes_them_back_exactly() {
    let (novad, bootstrap) = kafka_star(&[]);
    let lines: Vec<String> = (0..2000)
        .map(|i| format!("line {i} · {}", "x".repeat(i % 300)))
        .collect();
    let input = lines.join("\n") + "\n";
    kcat(&bootstrap, &["-P", "-t", "lines"], input.as_bytes());
    assert_eq!(consume(&bootstrap, "lines", "%s\n"), input);
    // The offsets are the stream's sequence numbers.
    let offsets = consume(&bootstrap, "lines", "%o\n");
    let expected: String = (0..2000).map(|i| format!("{i}\n")).collect();
    assert_eq!(offsets, expected);
    // And the topic's partition is the stream `lines/0` to Nova's own API.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bodies = rt.block_on(async { read_all(&client(&novad).await, "lines/0").await });
    assert_eq!(bodies, lines);
}

#[test]
fn every_compression_librdkafka_sends_is_accepted_and_stored_decompressed() {
    let (novad, bootstrap) = kafka_star(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(client(&novad));
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("compressed-{codec}");
        let lines: Vec<String> = (0..500)
            .map(|i| format!("{codec} {i} {}", "z".repeat(200)))
            .collect();
        let input = lines.join("\n") + "\n";
        kcat(
            &bootstrap,
            &["-P", "-t", &topic, "-z", codec],
            input.as_bytes(),
        );
        assert_eq!(consume(&bootstrap, &topic, "%s\n"), input, "{codec}");
        let stored = rt.block_on(read_all(&client, &format!("{topic}/0")));
        assert_eq!(stored, lines, "{codec}");
    }
}

#[test]
fn keys_headers_and_timestamps_cross_between_kafka_and_grpc() {
    let (novad, bootstrap) = kafka_star(&[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(client(&novad));
    // Kafka in, Nova out: the key is the empty-named first header.
    kcat(
        &bootstrap,
        &[
            "-P",
            "-t",
            "kv",
            "-K",
            ":",
            "-H",
            "trace=abc",
            "-H",
            "empty=",
        ],
        b"k1:v1\nk2:v2\n",
    );
    let page = rt.block_on(client.read("kv/0", 0, 0)).unwrap();
    assert_eq!(page.records.len(), 2);
    let first = &page.records[0].record;
    assert_eq!(&first.body[..], b"v1");
    let headers: Vec<(&[u8], &[u8])> = first
        .headers
        .iter()
        .map(|h| (&h.name[..], &h.value[..]))
        .collect();
    assert_eq!(
        headers,
        [(&b""[..], &b"k1"[..]), (b"trace", b"abc"), (b"empty", b"")]
    );
    let stamped = first.timestamp;
    assert!(
        stamped > 1_700_000_000_000,
        "a producer's CreateTime: {stamped}"
    );
    let kafka_view = consume(&bootstrap, "kv", "%k|%s|%h|%T\n");
    assert_eq!(
        kafka_view.lines().next(),
        Some(format!("k1|v1|trace=abc,empty=|{stamped}").as_str())
    );
    // Nova in, Kafka out, with the producer's own timestamp.
    let record = Record {
        timestamp: 1_600_000_000_123,
        ..Record::new("from-grpc")
            .with_header("", "grpc-key")
            .with_header("h", "x")
    };
    rt.block_on(async {
        let mut session = client.append_session().await.unwrap();
        session
            .append("kv/0", vec![record, Record::new("no-key")], None)
            .await
            .unwrap();
    });
    let lines: Vec<String> = consume(&bootstrap, "kv", "%k|%s|%h|%T|%o\n")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines[2], "grpc-key|from-grpc|h=x|1600000000123|2");
    assert!(lines[3].starts_with("|no-key||"), "{}", lines[3]);
}

#[test]
fn python_clients_manage_topics_produce_with_every_codec_and_read_back() {
    let (_novad, bootstrap) = kafka_star(&["--kafka-auto-create-partitions", "0"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_clients.py");
    let output = Command::new(python())
        .arg(&script)
        .arg(&bootstrap)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run python ({e}); scripts/test installs confluent-kafka and kafka-python"
            )
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the Python Kafka clients failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
