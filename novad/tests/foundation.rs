//! The bucket is the truth, and ready means ready: a star whose data directory is lost refuses
//! to start beside the data it does not know, `novad --rebuild-catalog` restores every stream
//! from the bucket alone, and a star that cannot use its store or its ports says so and exits
//! rather than pretend to serve.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use nova_client::{Client, Record};
use nova_testkit::{Fault, FaultProxy, Moto};

/// Appends `batches` batches of `per_batch` records of `size` bytes to `stream`, recording
/// what was acknowledged.
async fn load(
    client: &Client,
    stream: &str,
    batches: usize,
    per_batch: usize,
    size: usize,
    acked: &mut BTreeMap<(String, u64), String>,
) {
    let mut session = client.append_session().await.unwrap();
    for b in 0..batches {
        let bodies: Vec<String> = (0..per_batch)
            .map(|i| {
                let mut body = format!("{stream}-{b}-{i}-");
                body.push_str(&"x".repeat(size.saturating_sub(body.len())));
                body
            })
            .collect();
        let records = bodies.iter().map(|b| Record::new(b.clone())).collect();
        let ack = session.append(stream, records, None).await.unwrap();
        for (i, body) in bodies.into_iter().enumerate() {
            acked.insert((stream.to_owned(), ack.start_seq + i as u64), body);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_data_dir_is_refused_and_the_catalog_is_rebuilt_from_the_bucket() {
    let moto = Moto::start();
    moto.create_bucket("truth");
    let dir = tempfile::tempdir().unwrap();
    let star = || with_s3(novad(), &moto, "truth").data_dir(dir.path());

    let mut first = star().start();
    let client = client(&first).await;
    let mut acked = BTreeMap::new();
    for name in ["big", "small", "gone"] {
        client.create_stream(name).await.unwrap();
    }
    // Batches of 1.6 MB: each spans two sections of its flight.
    load(&client, "big", 3, 4, 400_000, &mut acked).await;
    load(&client, "small", 20, 5, 100, &mut acked).await;
    load(&client, "gone", 2, 5, 100, &mut acked).await;
    client.delete_stream("gone").await.unwrap();
    acked.retain(|(stream, _), _| stream != "gone");
    // A crash, so some flights are acknowledged but not absorbed; then the disk is lost.
    first.kill9();
    std::fs::remove_file(dir.path().join("metastore.redb")).unwrap();

    let mut refused = star().start_detached();
    let status = wait_exit(&mut refused, Duration::from_secs(60));
    assert!(!status.success());
    let log = refused.log();
    assert!(log.contains("--rebuild-catalog"), "{log}");
    assert!(log.contains("chain/nova/"), "names what it found:\n{log}");

    let mut rebuild = star().arg("--rebuild-catalog").start_detached();
    let status = wait_exit(&mut rebuild, Duration::from_secs(60));
    assert!(status.success(), "{}", rebuild.log());
    assert!(
        rebuild.log().contains("catalog rebuilt"),
        "{}",
        rebuild.log()
    );

    // A second rebuild refuses to touch the restored catalog.
    let mut again = star().arg("--rebuild-catalog").start_detached();
    assert!(!wait_exit(&mut again, Duration::from_secs(60)).success());
    assert!(
        again.log().contains("already holds a catalog"),
        "{}",
        again.log()
    );

    let restored = star().start();
    let client = common::client(&restored).await;
    for stream in ["big", "small"] {
        let stored = read_all(&client, stream).await;
        let expected: Vec<&String> = acked
            .iter()
            .filter(|((s, _), _)| s == stream)
            .map(|(_, body)| body)
            .collect();
        assert_eq!(stored.len(), expected.len(), "every record of {stream}");
        for (seq, body) in expected.iter().enumerate() {
            assert_eq!(&&stored[seq], body, "record {seq} of {stream}");
        }
    }
    assert!(
        client.describe_stream("gone").await.is_err(),
        "a deleted stream stays deleted"
    );
    let mut session = client.append_session().await.unwrap();
    let ack = session
        .append("small", records("after", 1), None)
        .await
        .unwrap();
    assert_eq!(ack.start_seq, 100, "appends continue at the restored tail");
    let info = client.create_stream("fresh").await.unwrap();
    assert_eq!(info.tail_seq, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_fails_the_start_with_a_clear_message() {
    let moto = Moto::start();
    let mut novad = with_s3(novad(), &moto, "no-such-bucket").start_detached();
    let status = wait_exit(&mut novad, Duration::from_secs(60));
    assert!(!status.success());
    let log = novad.log();
    assert!(log.contains("--s3-bucket"), "{log}");
    assert!(!log.contains("novad accepting appends"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_in_use_fails_the_start() {
    let first = novad().start();
    let taken = format!("127.0.0.1:{}", first.metrics_port());
    let mut second = novad().args(["--metrics-addr", &taken]).start_detached();
    let status = wait_exit(&mut second, Duration::from_secs(60));
    assert!(!status.success());
    assert!(second.log().contains("--metrics-addr"), "{}", second.log());
}

/// Health follows the star: NOT_SERVING while its store refuses connections, SERVING again
/// once it is back, with the ready gauge alongside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_not_serving_while_the_store_is_unreachable() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let moto = Moto::start();
    moto.create_bucket("health");
    let proxy = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    let novad = via_endpoint(novad(), &proxy.endpoint(), "health")
        .args(["--s3-request-timeout-ms", "500", "--s3-max-attempts", "1"])
        .start();
    let channel = tonic::transport::Endpoint::from_shared(novad.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let status = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    let check = async |health: &mut HealthClient<_>| {
        health
            .check(status(""))
            .await
            .map(|r| r.into_inner().status)
            .unwrap_or_default()
    };
    let mut serving = false;
    for _ in 0..50 {
        serving = check(&mut health).await == ServingStatus::Serving as i32;
        if serving {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(serving, "a recovered star serves");
    assert_eq!(novad.metric("nova_star_ready"), Some(1.0));

    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    proxy.set(Fault::Refuse);
    let append = tokio::spawn(async move {
        let mut session = client.append_session().await.unwrap();
        session.append("s", records("r", 1), None).await
    });
    let mut not_serving = false;
    for _ in 0..100 {
        not_serving = check(&mut health).await == ServingStatus::NotServing as i32;
        if not_serving {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(not_serving, "NOT_SERVING while flights cannot land");
    assert_eq!(novad.metric("nova_star_ready"), Some(0.0));

    proxy.set(Fault::Pass);
    let ack = tokio::time::timeout(Duration::from_secs(60), append)
        .await
        .expect("the append lands once the store is back")
        .unwrap()
        .unwrap();
    assert_eq!(ack.start_seq, 0);
    let mut back = false;
    for _ in 0..50 {
        back = check(&mut health).await == ServingStatus::Serving as i32;
        if back {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "SERVING again");
}

/// An append whose flight was abandoned at the shutdown deadline may still land: the producer
/// hears "outcome unknown" (DEADLINE_EXCEEDED), which the SDK tells apart from a failure that
/// applied nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_append_is_answered_outcome_unknown() {
    let moto = Moto::start();
    moto.create_bucket("abandon");
    let proxy = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    let mut novad = via_endpoint(novad(), &proxy.endpoint(), "abandon")
        .args([
            "--s3-request-timeout-ms",
            "30000",
            "--shutdown-timeout-secs",
            "1",
        ])
        .start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    proxy.set(Fault::Hang);
    let mut session = client.append_session().await.unwrap();
    session.send("s", records("r", 1), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = tokio::task::spawn_blocking(move || {
        let status = novad.terminate(Duration::from_secs(30));
        (status, novad)
    });
    let answer = tokio::time::timeout(Duration::from_secs(30), session.next_ack())
        .await
        .expect("an answer before the session ends");
    let error = answer.expect_err("the append was not acknowledged");
    assert_eq!(error.code(), Some(tonic::Code::DeadlineExceeded), "{error}");
    assert!(error.is_outcome_unknown(), "{error}");
    assert!(error.to_string().contains("outcome unknown"), "{error}");
    let (status, _novad) = status.await.unwrap();
    assert!(
        !status.success(),
        "a shutdown that abandoned work exits non-zero"
    );
}
