//! The Kafka listener, driven by Kafka clients nobody here wrote: kcat (librdkafka) from
//! Debian, and confluent-kafka and kafka-python from PyPI (scripts/test installs all three).

mod common;
mod kafka_common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use kafka_common::*;
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

mod raw {
    //! Kafka requests written by hand, for what no well-behaved client sends.

    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    pub fn varint(out: &mut Vec<u8>, value: i64) {
        let mut raw = ((value << 1) ^ (value >> 63)) as u64;
        while raw >= 0x80 {
            out.push((raw as u8 & 0x7f) | 0x80);
            raw >>= 7;
        }
        out.push(raw as u8);
    }

    /// A record batch (magic 2) of `count` records whose (maybe compressed) bytes are
    /// `records`, with `attributes` (the low bits name the codec).
    pub fn batch(attributes: i16, count: i32, records: &[u8]) -> Vec<u8> {
        idempotent_batch(attributes, count, records, (-1, -1, -1))
    }

    /// `batch`, from producer `(id, epoch, first sequence number)`.
    pub fn idempotent_batch(
        attributes: i16,
        count: i32,
        records: &[u8],
        (producer, epoch, sequence): (i64, i16, i32),
    ) -> Vec<u8> {
        let mut tail = Vec::new();
        tail.extend_from_slice(&attributes.to_be_bytes());
        tail.extend_from_slice(&(count - 1).to_be_bytes());
        tail.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        tail.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        tail.extend_from_slice(&producer.to_be_bytes());
        tail.extend_from_slice(&epoch.to_be_bytes());
        tail.extend_from_slice(&sequence.to_be_bytes());
        tail.extend_from_slice(&count.to_be_bytes());
        tail.extend_from_slice(records);
        let mut out = Vec::new();
        out.extend_from_slice(&0i64.to_be_bytes());
        out.extend_from_slice(&((4 + 1 + 4 + tail.len()) as i32).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes());
        out.push(2);
        out.extend_from_slice(&crc32c::crc32c(&tail).to_be_bytes());
        out.extend_from_slice(&tail);
        out
    }

    /// One uncompressed record with `value`.
    pub fn record(value: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8];
        varint(&mut body, 0);
        varint(&mut body, 0);
        varint(&mut body, -1);
        varint(&mut body, value.len() as i64);
        body.extend_from_slice(value);
        varint(&mut body, 0);
        let mut out = Vec::new();
        varint(&mut out, body.len() as i64);
        out.extend_from_slice(&body);
        out
    }

    /// A Produce v3 request (acks=all) of `batch` to partition 0 of `topic`.
    pub fn produce(topic: &str, batch: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&0i16.to_be_bytes()); // Produce
        body.extend_from_slice(&3i16.to_be_bytes());
        body.extend_from_slice(&42i32.to_be_bytes()); // correlation id
        body.extend_from_slice(&(-1i16).to_be_bytes()); // no client id
        body.extend_from_slice(&(-1i16).to_be_bytes()); // no transactional id
        body.extend_from_slice(&(-1i16).to_be_bytes()); // acks=all
        body.extend_from_slice(&30_000i32.to_be_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&(topic.len() as i16).to_be_bytes());
        body.extend_from_slice(topic.as_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&0i32.to_be_bytes()); // partition 0
        body.extend_from_slice(&(batch.len() as i32).to_be_bytes());
        body.extend_from_slice(batch);
        body
    }

    /// Sends a request; returns its answer's body, or `None` when the star closed the
    /// connection instead.
    pub fn send(bootstrap: &str, request: &[u8], declared_len: Option<i32>) -> Option<Vec<u8>> {
        let mut conn = TcpStream::connect(bootstrap).expect("connect to the Kafka listener");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let len = declared_len.unwrap_or(request.len() as i32);
        conn.write_all(&len.to_be_bytes()).unwrap();
        // The star may close before it has read everything declared.
        let _ = conn.write_all(request);
        let mut prefix = [0u8; 4];
        conn.read_exact(&mut prefix).ok()?;
        let mut answer = vec![0u8; i32::from_be_bytes(prefix) as usize];
        conn.read_exact(&mut answer).ok()?;
        Some(answer)
    }

    /// The error code of the one partition a Produce v3 answer holds.
    pub fn produce_error(answer: &[u8], topic: &str) -> i16 {
        // correlation id, topics count, topic name, partitions count, partition index
        let at = 4 + 4 + 2 + topic.len() + 4 + 4;
        i16::from_be_bytes([answer[at], answer[at + 1]])
    }

    /// The base offset in the one partition a Produce v3 answer holds.
    pub fn produce_offset(answer: &[u8], topic: &str) -> i64 {
        let at = 4 + 4 + 2 + topic.len() + 4 + 4 + 2;
        i64::from_be_bytes(answer[at..at + 8].try_into().unwrap())
    }
}

/// The star's peak resident memory (VmHWM), bytes.
fn peak_rss(novad: &Novad) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", novad.pid().unwrap())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn hostile_requests_close_their_connection_and_the_star_serves_on() {
    let (novad, bootstrap) = kafka_star(&[]);
    let header = |api: i16, version: i16| {
        let mut h = Vec::new();
        h.extend_from_slice(&api.to_be_bytes());
        h.extend_from_slice(&version.to_be_bytes());
        h.extend_from_slice(&7i32.to_be_bytes());
        h.extend_from_slice(&(-1i16).to_be_bytes());
        h
    };
    let huge = 0x7fff_ffffi32.to_be_bytes();
    // Arrays declaring two billion elements, in a few bytes: unguarded, the decoder reserves
    // hundreds of gigabytes and the process aborts.
    let counted = [
        [header(3, 1), huge.to_vec()].concat(),
        [
            header(0, 3),
            vec![0xff, 0xff, 0, 1, 0, 0, 3, 0xe8],
            huge.to_vec(),
        ]
        .concat(),
        [header(19, 2), huge.to_vec()].concat(),
        [
            header(1, 4),
            vec![0xff; 4],
            vec![0; 12],
            vec![0],
            huge.to_vec(),
        ]
        .concat(),
    ];
    for request in &counted {
        assert_eq!(raw::send(&bootstrap, request, None), None, "{request:?}");
    }
    // A request declaring 2 GB, and an API Kafka does not define.
    assert_eq!(raw::send(&bootstrap, &header(0, 3), Some(i32::MAX)), None);
    assert_eq!(raw::send(&bootstrap, &header(999, 0), None), None);
    // An answer to an ApiVersions newer than served: version 0, UNSUPPORTED_VERSION, the list.
    let answer =
        raw::send(&bootstrap, &[header(18, 99), vec![0]].concat(), None).expect("an answer");
    assert_eq!(i16::from_be_bytes([answer[4], answer[5]]), 35);
    let closed = |reason: &str| {
        novad
            .metric(&format!(
                "nova_kafka_connections_closed_total{{reason=\"{reason}\"}}"
            ))
            .unwrap_or(0.0)
    };
    assert_eq!(closed("malformed_request"), 4.0);
    assert_eq!(closed("request_too_large"), 1.0);
    assert_eq!(closed("unknown_api"), 1.0);
    // The star is still there.
    kcat(&bootstrap, &["-P", "-t", "after"], b"still here\n");
    assert_eq!(consume(&bootstrap, "after", "%s\n"), "still here\n");
}

#[test]
fn corrupt_batches_and_compression_bombs_are_refused_and_nothing_is_written() {
    let (novad, bootstrap) = kafka_star(&["--max-batch-bytes", "1MiB"]);
    kcat(&bootstrap, &["-P", "-t", "t"], b"first\n");
    // A flipped byte: CORRUPT_MESSAGE (2).
    let mut corrupt = raw::batch(0, 1, &raw::record(b"payload"));
    let last = corrupt.len() - 2;
    corrupt[last] ^= 0x40;
    let answer = raw::send(&bootstrap, &raw::produce("t", &corrupt), None).expect("an answer");
    assert_eq!(raw::produce_error(&answer, "t"), 2);
    // 512 MiB of zeros, gzipped to about half a megabyte: RECORD_LIST_TOO_LARGE (18), refused
    // as it inflates past the caps' worth, not held whole.
    let before = peak_rss(&novad);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let value_len: i64 = 512 << 20;
    let mut head = Vec::new();
    let mut body_head = vec![0u8];
    raw::varint(&mut body_head, 0);
    raw::varint(&mut body_head, 0);
    raw::varint(&mut body_head, -1);
    raw::varint(&mut body_head, value_len);
    raw::varint(&mut head, body_head.len() as i64 + value_len + 1);
    head.extend_from_slice(&body_head);
    gz.write_all(&head).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..512 {
        gz.write_all(&zeros).unwrap();
    }
    gz.write_all(&[0]).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 2 << 20, "{}", bomb.len());
    let answer = raw::send(
        &bootstrap,
        &raw::produce("t", &raw::batch(1, 1, &bomb)),
        None,
    )
    .expect("an answer");
    assert_eq!(raw::produce_error(&answer, "t"), 18);
    let grew = peak_rss(&novad).saturating_sub(before);
    assert!(grew < 64 << 20, "the star's peak grew by {grew} bytes");
    // Only the first record was written.
    assert_eq!(consume(&bootstrap, "t", "%s\n"), "first\n");
    // Both refusals counted (and logged, one line a second per reason).
    assert_eq!(
        novad.metric("nova_append_rejections_total{reason=\"malformed\"}"),
        Some(2.0)
    );
    assert!(
        novad.log().contains("record batch is corrupt"),
        "{}",
        novad.log()
    );
}

/// An idempotent confluent-kafka producer writes 100,000 records to one partition, through a
/// proxy that cuts every connection four times (requests the star made durable lose their
/// answers, so the client retries them) while the star is killed -9 and restarted twice (its
/// producer state is then read back from the partition). Every record the client was told is
/// delivered is stored exactly once, at the offset it was told, and in order.
#[test]
fn an_idempotent_producer_writes_each_delivered_record_once_across_cuts_and_kill_9s() {
    use nova_testkit::{Fault, FaultProxy};
    use std::io::BufRead;
    const RECORDS: usize = 100_000;
    let kafka_port = free_port();
    let proxy = FaultProxy::start(([127, 0, 0, 1], kafka_port).into());
    let listen = format!("127.0.0.1:{kafka_port}");
    let advertised = format!("127.0.0.1:{}", proxy.port());
    let mut novad = novad()
        .args([
            "--kafka-listen",
            listen.as_str(),
            "--kafka-advertise-addr",
            advertised.as_str(),
        ])
        .start();
    nova_testkit::wait_for_port(kafka_port, Duration::from_secs(10), "the Kafka listener");
    let bootstrap = advertised;
    kcat(&bootstrap, &["-P", "-t", "idem"], b"");
    let delivered_file = novad.data_dir().join("delivered.txt");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_idempotent.py");
    let mut producer = Command::new(python())
        .arg(&script)
        .args([bootstrap.as_str(), "idem"])
        .arg(&delivered_file)
        .arg(RECORDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the idempotent producer (scripts/test installs confluent-kafka)");
    let stdout = std::io::BufReader::new(producer.stdout.take().unwrap());
    enum Blow {
        Cut,
        Kill,
    }
    let mut blows = [
        (10_000usize, Blow::Cut),
        (20_000, Blow::Kill),
        (35_000, Blow::Cut),
        (55_000, Blow::Kill),
        (70_000, Blow::Cut),
        (90_000, Blow::Cut),
    ]
    .into_iter()
    .peekable();
    let mut summary = String::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(count) = line.strip_prefix("delivered ") {
            let count: usize = count.parse().unwrap();
            if let Some((_, blow)) = blows.next_if(|(at, _)| count >= *at) {
                match blow {
                    Blow::Cut => {
                        proxy.set(Fault::Refuse);
                        std::thread::sleep(Duration::from_millis(200));
                        proxy.set(Fault::Pass);
                    }
                    Blow::Kill => {
                        novad.kill9();
                        std::thread::sleep(Duration::from_millis(300));
                        novad.restart();
                    }
                }
            }
        } else if line.starts_with("done") {
            summary = line;
        }
    }
    let status = producer.wait().unwrap();
    assert!(status.success(), "the producer failed: {summary}");
    assert!(
        blows.peek().is_none(),
        "not every cut and kill happened: {summary}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stored = rt.block_on(async { read_all(&client(&novad).await, "idem/0").await });
    let stored = assert_delivered_once_in_order(&delivered_file, &stored, RECORDS, &summary);
    println!("{summary}; {stored} stored");
}

/// An idempotent producer's batch sent again is answered with its first offset and not
/// written twice, also after a kill -9, when the star reads the producer's marks back from the
/// partition; a sequence number that skips ahead is refused.
#[test]
fn a_retried_idempotent_batch_gets_its_first_offset_also_after_a_restart() {
    let (mut novad, bootstrap) = kafka_star(&[]);
    kcat(&bootstrap, &["-P", "-t", "p"], b"before\n");
    // The first producer id the star's first start hands out.
    let producer = 1i64 << 32;
    let send = |sequence: i32, value: &[u8]| {
        let batch = raw::idempotent_batch(0, 1, &raw::record(value), (producer, 0, sequence));
        let answer = raw::send(&bootstrap, &raw::produce("p", &batch), None).expect("an answer");
        (
            raw::produce_error(&answer, "p"),
            raw::produce_offset(&answer, "p"),
        )
    };
    assert_eq!(send(0, b"zero"), (0, 1));
    assert_eq!(send(0, b"zero"), (0, 1), "a retry");
    assert_eq!(send(1, b"one"), (0, 2));
    novad.kill9();
    novad.restart();
    assert_eq!(send(1, b"one"), (0, 2), "a retry after the restart");
    assert_eq!(send(0, b"zero"), (0, 1), "an older retry after the restart");
    assert_eq!(send(2, b"two"), (0, 3));
    // Sequence 9 where 3 is next: OUT_OF_ORDER_SEQUENCE_NUMBER (45), nothing written.
    assert_eq!(send(9, b"nine").0, 45);
    // Sequence 3 refused after it was reserved (a record over --max-record-bytes:
    // MESSAGE_TOO_LARGE, 10) is not written, and 4 may not follow it: 3 is still next.
    assert_eq!(send(3, &vec![b'x'; 2 << 20]).0, 10);
    assert_eq!(send(4, b"four").0, 45);
    assert_eq!(send(3, b"three"), (0, 4));
    assert_eq!(
        consume(&bootstrap, "p", "%s\n"),
        "before\nzero\none\ntwo\nthree\n"
    );
}

/// Three kafka-python consumers in one group share a six-partition topic; one leaves and the
/// other two take its partitions over, no record skipped; the group's committed offsets then
/// survive a restart of the star, and new members go on from them.
#[test]
fn a_consumer_group_shares_partitions_rebalances_and_resumes_after_a_restart() {
    let (mut novad, bootstrap) = kafka_star(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_group.py");
    let phase = |name: &str| {
        let output = Command::new(python())
            .arg(&script)
            .args([bootstrap.as_str(), name])
            .output()
            .expect("run kafka-python (scripts/test installs it)");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success() && stdout.contains("phase passed"),
            "the {name} phase failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };
    let first = phase("first");
    assert!(first.contains("after leave"), "{first}");
    novad.terminate(Duration::from_secs(30));
    novad.restart();
    let second = phase("second");
    println!("{first}{second}");
}

/// A group's lag is the records its partitions hold past its committed offsets:
/// `nova_kafka_group_lag_records` shows 40 once a member that committed all of 100 records
/// stops fetching and 40 more arrive.
#[test]
fn a_groups_lag_is_the_records_past_its_committed_offsets() {
    use std::io::BufRead;
    let (novad, bootstrap) = kafka_star(&[]);
    let lines: String = (0..100).map(|i| format!("first {i}\n")).collect();
    kcat(
        &bootstrap,
        &["-P", "-t", "lagging", "-p", "0"],
        lines.as_bytes(),
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_lag.py");
    let mut member = Command::new(python())
        .arg(&script)
        .args([bootstrap.as_str(), "lagging"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run confluent-kafka (scripts/test installs it)");
    let mut stdout = std::io::BufReader::new(member.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "produced", "the member did not get as far");
    // The lag is refreshed every 15 s.
    let series = r#"nova_kafka_group_lag_records{group="lag"}"#;
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    while novad.metric(series) != Some(40.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "{series} is {:?}, not 40",
            novad.metric(series)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(novad.metric("nova_kafka_groups"), Some(1.0));
    // `nova group` shows the same.
    let nova = |args: &[&str]| {
        let output = Command::new(nova_testkit::workspace_binary("nova"))
            .args(["--server", &novad.url()])
            .args(args)
            .output()
            .expect("run nova");
        assert!(output.status.success(), "nova {args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(nova(&["group", "list"]), "lag\tstate=Stable\tmembers=1\n");
    let described = nova(&["group", "describe", "lag"]);
    for line in [
        "state:        Stable",
        "lag:          40 records",
        "members:      1",
    ] {
        assert!(described.contains(line), "{line:?} in:\n{described}");
    }
    assert!(
        described.contains("  lagging/0\t100\t140\t40\t"),
        "the partition's row in:\n{described}"
    );
    let json = nova(&["--output", "json", "group", "describe", "lag"]);
    let json: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
    assert_eq!(json["lag"], 40);
    assert_eq!(json["offsets"][0]["committed"], 100);
    drop(member.stdin.take());
    assert!(member.wait().unwrap().success());
}

/// With `--tls-cert` and `--auth-tokens`, Kafka clients connect over TLS and authenticate with
/// SASL/PLAIN, the token as the password, and get what its grants allow: nothing before
/// authenticating, nothing with a token the star does not know, and no produce with a token
/// that may only read.
#[test]
fn sasl_plain_over_tls_carries_the_tokens_and_their_grants() {
    use nova_server::net::auth::Scope;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let everything = [
        grant(Scope::Admin, ""),
        grant(Scope::Append, ""),
        grant(Scope::Read, ""),
    ];
    write_tokens(
        &tokens,
        &[
            ("ops", &everything, "ops-token-0123456789abcdef"),
            (
                "ingest",
                &[grant(Scope::Append, "logs/"), grant(Scope::Read, "logs/")],
                "ingest-token-0123456789abcdef",
            ),
            (
                "reader",
                &[grant(Scope::Read, "")],
                "reader-token-0123456789abcdef",
            ),
        ],
    );
    let certs = nova_testkit::certs::Certs::new();
    let server = certs.server();
    let (_novad, bootstrap) = kafka_star(&[
        "--auth-tokens",
        tokens.to_str().unwrap(),
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
    ]);
    let ca = format!("ssl.ca.location={}", certs.ca().display());
    let sasl = |token: &'static str| -> Vec<String> {
        [
            "-X",
            ca.as_str(),
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            "sasl.username=anyone",
            "-X",
            &format!("sasl.password={token}"),
            "-X",
            "message.timeout.ms=5000",
            "-m",
            "5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let with = |token: &'static str, args: &[&str]| -> Vec<String> {
        let mut all = sasl(token);
        all.extend(args.iter().map(|s| s.to_string()));
        all
    };
    let run = |args: Vec<String>, input: &[u8]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kcat_may_fail(&bootstrap, &args, input)
    };
    // The operator's token creates the topic (by producing to it) and reads it back.
    let made = run(
        with("ops-token-0123456789abcdef", &["-P", "-t", "logs"]),
        b"first\n",
    );
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // An ingest token appends to logs/ and reads it.
    let appended = run(
        with("ingest-token-0123456789abcdef", &["-P", "-t", "logs"]),
        b"second\n",
    );
    assert!(
        appended.status.success(),
        "{}",
        String::from_utf8_lossy(&appended.stderr)
    );
    let read = run(
        with(
            "reader-token-0123456789abcdef",
            &["-C", "-t", "logs", "-p", "0", "-o", "beginning", "-e", "-q"],
        ),
        b"",
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout), "first\nsecond\n");
    // A reader may not produce; an unknown token gets nothing; no SASL at all, nothing.
    let refused = run(
        with("reader-token-0123456789abcdef", &["-P", "-t", "logs"]),
        b"no\n",
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("Topic authorization failed"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let unknown = run(with("not-a-token-0123456789abcdef", &["-L"]), b"");
    assert!(!unknown.status.success());
    // TLS without SASL: the connection is closed at its first request past ApiVersions.
    let tls_only = kcat_may_fail(
        &bootstrap,
        &[
            "-X",
            ca.as_str(),
            "-X",
            "security.protocol=SSL",
            "-L",
            "-m",
            "5",
        ],
        b"",
    );
    assert!(!tls_only.status.success());
    let read = run(
        with(
            "ops-token-0123456789abcdef",
            &["-C", "-t", "logs", "-p", "0", "-o", "beginning", "-e", "-q"],
        ),
        b"",
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout), "first\nsecond\n");
}

/// Kafka producers flooding a star whose object store has stopped answering are held inside
/// the admission buffer (their connections stop being read), nothing is lost, and once the
/// store is back every record lands; the star's peak memory stays within the formula.
#[test]
fn a_flood_of_kafka_producers_waits_inside_the_admission_buffer_through_an_outage() {
    const PRODUCERS: usize = 4;
    const RECORDS: usize = 1500;
    let moto = nova_testkit::Moto::start();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let novad = novad_on_s3(&moto, "flood")
        .args(["--kafka-listen", bootstrap.as_str()])
        .args(["--kafka-auto-create-partitions", "4"])
        .args(["--s3-memory-buffer-mib", "8", "--flight-linger-ms", "5"])
        .start();
    nova_testkit::wait_for_port(port, Duration::from_secs(10), "the Kafka listener");
    kcat(&bootstrap, &["-P", "-t", "flood", "-p", "0"], b"warm\n");
    moto.pause();
    let line = "x".repeat(16 * 1024);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let bootstrap = bootstrap.clone();
            let input: String = (0..RECORDS).map(|_| format!("{line}\n")).collect();
            std::thread::spawn(move || {
                kcat(
                    &bootstrap,
                    &[
                        "-P",
                        "-t",
                        "flood",
                        "-p",
                        &p.to_string(),
                        "-X",
                        "message.timeout.ms=180000",
                    ],
                    input.as_bytes(),
                )
            })
        })
        .collect();
    // 4 × 1,500 × 16 KiB is about 94 MiB against an 8 MiB buffer.
    std::thread::sleep(Duration::from_secs(6));
    let used = novad.metric("nova_admission_buffer_used_bytes").unwrap();
    let capacity = novad
        .metric("nova_admission_buffer_capacity_bytes")
        .unwrap();
    assert!(
        used <= capacity,
        "admission never passes its budget: {used} > {capacity}"
    );
    assert!(
        used > capacity / 2.0,
        "the buffer filled up: {used} of {capacity}"
    );
    assert!(
        novad.metric("nova_oldest_admitted_age_seconds").unwrap() >= 2.0,
        "the oldest admitted batch ages while the store is down"
    );
    moto.resume();
    for producer in producers {
        producer
            .join()
            .expect("every producer's records were delivered");
    }
    let counts = kcat(
        &bootstrap,
        &[
            "-C",
            "-t",
            "flood",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p\n",
        ],
        b"",
    );
    let total = String::from_utf8_lossy(&counts.stdout).lines().count();
    assert_eq!(total, PRODUCERS * RECORDS + 1);
    assert_peak_rss_within_formula(&novad, PRODUCERS as u64);
}

/// Before authenticating, a client of a star that checks tokens may send only small
/// ApiVersions and SASL requests: anything else closes its connection at the length prefix,
/// before a byte of it is charged or read.
#[test]
fn an_unauthenticated_kafka_client_gets_nothing_but_the_handshake() {
    use nova_server::net::auth::Scope;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let read = [grant(Scope::Read, "")];
    write_tokens(
        &tokens,
        &[("reader", &read, "reader-token-0123456789abcdef")],
    );
    let (novad, bootstrap) = kafka_star(&["--auth-tokens", tokens.to_str().unwrap()]);
    let header = |api: i16, version: i16| {
        let mut h = Vec::new();
        h.extend_from_slice(&api.to_be_bytes());
        h.extend_from_slice(&version.to_be_bytes());
        h.extend_from_slice(&7i32.to_be_bytes());
        h.extend_from_slice(&(-1i16).to_be_bytes());
        h
    };
    // ApiVersions is answered...
    assert!(raw::send(&bootstrap, &[header(18, 0)].concat(), None).is_some());
    // ...a Metadata request is not, nor a 100 MB produce request (closed at its prefix).
    assert_eq!(
        raw::send(&bootstrap, &[header(3, 1), vec![0, 0, 0, 0]].concat(), None),
        None
    );
    assert_eq!(
        raw::send(&bootstrap, &header(0, 3), Some(100_000_000)),
        None
    );
    assert_eq!(
        novad.metric("nova_kafka_connections_closed_total{reason=\"unauthenticated\"}"),
        Some(2.0)
    );
    assert_eq!(novad.metric("nova_admission_buffer_used_bytes"), Some(0.0));
}

/// A token removed from the file stops working on the Kafka connections already open with it,
/// at their next request (as on gRPC, where every call carries its token).
#[test]
fn a_revoked_token_stops_working_on_an_open_kafka_connection() {
    use nova_server::net::auth::Scope;
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let everything = [
        grant(Scope::Admin, ""),
        grant(Scope::Append, ""),
        grant(Scope::Read, ""),
    ];
    write_tokens(
        &tokens,
        &[
            ("ops", &everything, "ops-token-0123456789abcdef"),
            ("leaving", &everything, "leaving-token-0123456789abcdef"),
        ],
    );
    let (novad, bootstrap) = kafka_star(&["--auth-tokens", tokens.to_str().unwrap()]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_revoke.py");
    let mut producer = Command::new(python())
        .arg(&script)
        .args([bootstrap.as_str(), "leaving-token-0123456789abcdef"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run confluent-kafka (scripts/test installs it)");
    let mut out = BufReader::new(producer.stdout.take().unwrap());
    let mut said = String::new();
    out.read_line(&mut said).unwrap();
    assert_eq!(
        said.trim(),
        "ready",
        "the token worked before it was revoked"
    );
    // The token goes; the star reads the file again on SIGHUP.
    write_tokens(
        &tokens,
        &[("ops", &everything, "ops-token-0123456789abcdef")],
    );
    let pid = novad.pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    for _ in 0..100 {
        if novad.log().contains("--auth-tokens reloaded") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    producer.stdin.take().unwrap().write_all(b"go\n").unwrap();
    said.clear();
    out.read_line(&mut said).unwrap();
    let output = producer.wait_with_output().unwrap();
    assert!(
        said.starts_with("after: failed"),
        "{said}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
