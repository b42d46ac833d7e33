//! `nova append` against a star that answers and keeps refusing: with two of three Express
//! zones paused the star refuses every Express append (no quorum), and the CLI retries, says so
//! on stderr, and gives up within its `--delivery-timeout`, naming the Express quorum and
//! whether the batch may have landed. What it reported as not appended is never readable later.
//! Real processes throughout: novad on four moto servers (a regional bucket and three zones).

#![allow(
    clippy::disallowed_methods,
    reason = "drives real processes and the nova CLI on the real clock"
)]

mod common;

use std::time::{Duration, Instant};

use nova_client::{Client, Record, StorageClass, StreamConfig};
use nova_testkit::{Moto, NovadBuilder, workspace_binary};

use common::nova;

const DELIVERY_TIMEOUT: Duration = Duration::from_secs(6);

fn on_moto(builder: NovadBuilder, moto: &Moto, bucket: &str) -> NovadBuilder {
    moto.create_bucket(bucket);
    builder
        .args([
            "--s3-bucket",
            bucket,
            "--s3-endpoint",
            &moto.endpoint(),
            "--s3-path-style",
            "--s3-request-timeout-ms",
            "2000",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
}

async fn read_bodies(client: &Client, stream: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut next = 0;
    loop {
        let page = client.read(stream, next, 0).await.expect("read");
        out.extend(
            page.records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.record.body).into_owned()),
        );
        next = page.next_seq;
        if page.records.is_empty() || next >= page.tail_seq {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_gives_up_within_its_delivery_timeout_naming_the_express_quorum() {
    let regional = Moto::start();
    let zones: Vec<Moto> = (0..3).map(|_| Moto::start()).collect();
    let mut builder = on_moto(
        NovadBuilder::new(workspace_binary("novad")),
        &regional,
        "regional",
    )
    .args([
        "--s3-express-publish-deadline",
        "1000ms",
        "--auditor",
        "false",
    ]);
    for (moto, name) in zones.iter().zip(["az1", "az2", "az3"]) {
        moto.create_bucket("zone");
        builder = builder.args([
            "--s3-express-zone".to_owned(),
            format!("name={name},bucket=zone,endpoint={}", moto.endpoint()),
        ]);
    }
    let star = builder.start();
    let client = Client::connect(&star.url()).await.unwrap();
    client
        .create_stream_configured(
            "x",
            StreamConfig {
                storage_class: StorageClass::Express,
                ..StreamConfig::default()
            },
        )
        .await
        .unwrap();
    let mut session = client.append_session().await.unwrap();
    session
        .append("x", vec![Record::new("before")], None)
        .await
        .expect("all zones up: acknowledged");

    // Two zones down: the append in flight misses its quorum and the express chain cannot be
    // sealed, so every later Express append is refused at once, with a retry hint.
    zones[0].pause();
    zones[1].pause();
    session
        .append("x", vec![Record::new("in-flight")], None)
        .await
        .expect_err("two zones down: no quorum");

    let started = Instant::now();
    let output = nova(
        &star.url(),
        &[
            "append",
            "x",
            "--delivery-timeout",
            &format!("{}s", DELIVERY_TIMEOUT.as_secs()),
        ],
        b"lost-0\nlost-1\nlost-2\n",
    );
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    eprintln!("nova append said, in {took:?}:\n{stderr}");
    assert!(!output.status.success(), "gave up, exit 1: {stderr}");
    assert!(
        took < DELIVERY_TIMEOUT + Duration::from_secs(10),
        "gave up within its delivery timeout (plus start-up), after {took:?}: {stderr}"
    );
    assert!(
        // It gives up early only when the next attempt would go out past the timeout (the
        // star's hint is 1 s, spread up to 1.5 s).
        took >= DELIVERY_TIMEOUT - Duration::from_secs(2),
        "retried until the timeout rather than giving up at the first refusal ({took:?}): \
         {stderr}"
    );
    assert!(
        stderr.contains("retrying append to \"x\""),
        "said it was retrying: {stderr}"
    );
    assert!(
        stderr.contains("quorum of 2 of 3 zones"),
        "named the Express quorum: {stderr}"
    );
    assert!(
        stderr.contains("were not acknowledged within the 6s delivery timeout"),
        "named the timeout: {stderr}"
    );
    assert!(
        stderr.contains("none of the input was acknowledged (it was to start at seq 1)"),
        "said how much of the input is in the stream: {stderr}"
    );
    let known = stderr.contains("they were not appended");
    assert!(
        known || stderr.contains("outcome unknown"),
        "said whether the records may have landed: {stderr}"
    );
    let retries = stderr.matches("retrying append").count();
    assert!(
        retries >= 2 && retries as u64 <= DELIVERY_TIMEOUT.as_secs() + 2,
        "a notice about once a second at most ({retries}): {stderr}"
    );

    // For scripts, the same as JSON lines on stderr: the retries, then the error.
    let output = nova(
        &star.url(),
        &[
            "--output",
            "json",
            "append",
            "x",
            "--delivery-timeout",
            "3s",
        ],
        b"lost-json\n",
    );
    assert!(!output.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(|line| serde_json::from_str(line).expect("each stderr line is JSON"))
        .collect();
    let retrying = lines
        .iter()
        .find_map(|line| line.get("retrying"))
        .expect("a retrying line");
    assert_eq!(retrying["what"], "append to \"x\"");
    assert_eq!(retrying["code"], "UNAVAILABLE");
    assert!(retrying["retry_in_ms"].as_u64().is_some());
    assert!(retrying["gives_up_in_ms"].as_u64().is_some());
    let error = &lines.last().expect("an error line")["error"];
    assert_eq!(error["code"], "UNAVAILABLE", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("quorum"),
        "{error}"
    );

    // The zones come back; once Express appends are accepted again, what nova reported as not
    // appended is not there.
    zones[0].resume();
    zones[1].resume();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut session = client.append_session().await.unwrap();
        match session.append("x", vec![Record::new("after")], None).await {
            Ok(_) => break,
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                assert!(Instant::now() < deadline, "Express appends resume: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let stored = read_bodies(&client, "x").await;
    assert_eq!(stored.first().map(String::as_str), Some("before"));
    assert_eq!(stored.last().map(String::as_str), Some("after"));
    if known {
        assert!(
            !stored.iter().any(|body| body.starts_with("lost-")),
            "records reported as not appended were stored: {stored:?}"
        );
    }
    assert!(
        !stored.iter().any(|body| body == "lost-json"),
        "the JSON run's record, refused throughout, was stored: {stored:?}"
    );
}
