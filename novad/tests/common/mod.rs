//! Shared by novad's end-to-end tests: real novad processes, on the local store or on a real
//! moto server, and SDK clients for them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use nova_client::{Client, Record};
use nova_testkit::{Moto, Novad, NovadBuilder};

pub fn novad() -> NovadBuilder {
    NovadBuilder::new(env!("CARGO_BIN_EXE_novad"))
}

/// novad writing to a new bucket on `moto`.
pub fn novad_on_s3(moto: &Moto, bucket: &str) -> NovadBuilder {
    moto.create_bucket(bucket);
    with_s3(novad(), moto, bucket)
}

/// Points novad at an existing bucket on `moto`.
pub fn with_s3(builder: NovadBuilder, moto: &Moto, bucket: &str) -> NovadBuilder {
    via_endpoint(builder, &moto.endpoint(), bucket).args(["--s3-request-timeout-ms", "2000"])
}

/// Points novad at `bucket` on an S3-compatible endpoint (moto itself, or a fault proxy in
/// front of it), with moto's credentials.
pub fn via_endpoint(builder: NovadBuilder, endpoint: &str, bucket: &str) -> NovadBuilder {
    builder
        .args([
            "--s3-bucket",
            bucket,
            "--s3-endpoint",
            endpoint,
            "--s3-path-style",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
}

pub async fn client(novad: &Novad) -> Client {
    Client::connect(&novad.url())
        .await
        .expect("connect to novad")
}

pub fn records(prefix: &str, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record::new(format!("{prefix}-{i}")))
        .collect()
}

/// Every record body of a stream from 0 to its tail, page by page.
pub async fn read_all(client: &Client, stream: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut next = 0;
    loop {
        let page = client.read(stream, next, 0).await.expect("read");
        for r in &page.records {
            assert_eq!(r.seq, out.len() as u64, "dense sequence numbers from 0");
            out.push(String::from_utf8(r.record.body.to_vec()).expect("utf8 body"));
        }
        next = page.next_seq;
        if page.records.is_empty() || next >= page.tail_seq {
            return out;
        }
    }
}

/// Polls until `check` holds, or panics with `what` after `timeout`. Every 50 ms: the checks
/// here scrape novad's metrics page or read its log.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, what: &str, check: F) {
    nova_testkit::eventually_every(Duration::from_millis(50), timeout, what, check).await
}

/// Waits for a process started detached to exit, panicking with its log after `timeout`.
pub fn wait_exit(novad: &mut Novad, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = novad.try_exit_status() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "novad did not exit within {timeout:?}:\n{}",
            novad.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that the star's peak resident memory (the kernel's count, which the OOM killer
/// uses) stayed within its memory formula with up to `sessions` producer sessions open (each
/// with the default 64 KiB stream window), plus the fixed overhead docs/backpressure.md states.
/// A budget's gauge says what the budget accounts for; this says what the process holds.
pub fn assert_peak_rss_within_formula(novad: &Novad, sessions: u64) {
    let metrics = novad.metrics();
    let term = |t: &str| {
        nova_testkit::series(
            &metrics,
            &format!("nova_memory_formula_bytes{{term=\"{t}\"}}"),
        )
        .unwrap_or(0.0) as u64
    };
    let formula: u64 = [
        "admission",
        "express",
        "read",
        "tail_cache",
        "recycle",
        "auditor",
    ]
    .iter()
    .map(|t| term(t))
    .sum::<u64>()
        + sessions * 64 * 1024;
    let bound = formula + nova_testkit::outage::star_overhead_bytes(sessions);
    let peak = nova_testkit::series(&metrics, "nova_process_peak_resident_bytes")
        .expect("novad exports its peak RSS") as u64;
    assert!(
        peak <= bound,
        "peak RSS {} MiB over the formula {} MiB plus overhead ({} MiB)",
        peak >> 20,
        formula >> 20,
        bound >> 20
    );
}

/// Appends batches of `per_batch` records to `stream` until the session breaks (a crash, a
/// kill), returning what was acknowledged: seq → body. A sequence number acknowledged twice
/// fails the test.
pub async fn produce_until_cut(
    client: Client,
    stream: String,
    round: usize,
    per_batch: usize,
) -> BTreeMap<u64, String> {
    let mut acked = BTreeMap::new();
    let Ok(mut session) = client.append_session().await else {
        return acked;
    };
    for batch in 0.. {
        let bodies: Vec<String> = (0..per_batch)
            .map(|i| format!("r{round}-b{batch}-{i}"))
            .collect();
        let records = bodies.iter().map(|b| Record::new(b.clone())).collect();
        match session.append(&stream, records, None).await {
            Ok(ack) => {
                assert_eq!(ack.end_seq - ack.start_seq, per_batch as u64);
                for (i, body) in bodies.into_iter().enumerate() {
                    let previous = acked.insert(ack.start_seq + i as u64, body);
                    assert!(
                        previous.is_none(),
                        "seq {} acknowledged twice",
                        ack.start_seq + i as u64
                    );
                }
            }
            Err(_) => return acked,
        }
    }
    acked
}

/// Three rounds of producing to `stream` (batches of `per_batch`) and killing novad with
/// SIGKILL mid-stream, the kill coming `first_kill` after the producer starts and `step` later
/// each round. After each restart every record acknowledged so far must read back unchanged.
pub async fn kill_9_rounds(
    novad: &mut Novad,
    stream: &str,
    per_batch: usize,
    first_kill: Duration,
    step: Duration,
) {
    let mut acked = BTreeMap::new();
    for round in 0..3u32 {
        let producer = tokio::spawn(produce_until_cut(
            client(novad).await,
            stream.to_owned(),
            round as usize,
            per_batch,
        ));
        tokio::time::sleep(first_kill + step * round).await;
        novad.kill9();
        let round_acked = tokio::time::timeout(Duration::from_secs(30), producer)
            .await
            .expect("the producer notices the crash")
            .unwrap();
        assert!(
            !round_acked.is_empty(),
            "round {round} acknowledged something"
        );
        acked.extend(round_acked);
        novad.restart();
        let stored = read_all(&client(novad).await, stream).await;
        for (seq, body) in &acked {
            assert_eq!(
                stored.get(*seq as usize),
                Some(body),
                "acknowledged record {seq} of {stream} lost or changed after kill -9 (round \
                 {round})\n{}",
                novad.log()
            );
        }
        assert!(novad.log().contains("star ready"), "{}", novad.log());
    }
}

/// A grant of `scope` on the streams under `prefix`.
pub fn grant(scope: nova_server::net::auth::Scope, prefix: &str) -> nova_server::net::auth::Grant {
    nova_server::net::auth::Grant {
        scope,
        prefix: prefix.into(),
    }
}

/// Writes an `--auth-tokens` file of `(name, grants, token)` lines.
pub fn write_tokens(
    path: &std::path::Path,
    tokens: &[(&str, &[nova_server::net::auth::Grant], &str)],
) {
    let text: String = tokens
        .iter()
        .map(|(name, grants, token)| {
            format!(
                "{}\n",
                nova_server::net::auth::file_line(name, grants, token)
            )
        })
        .collect();
    std::fs::write(path, text).unwrap();
}
