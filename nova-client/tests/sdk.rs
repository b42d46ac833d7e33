//! The SDK against real novad processes: the producer's exactly-once retries across dropped
//! connections and a restarted star, its unacknowledged-bytes bound, its handling of retry
//! hints, and the consumer's follow mode.

#![allow(
    clippy::disallowed_methods,
    reason = "real novad processes run on the real clock"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nova_client::{Client, Consumer, Error, Producer, ProducerConfig, Record};
use nova_testkit::{Fault, FaultProxy, Moto, NovadBuilder, workspace_binary};
use tonic::Code;

fn novad() -> NovadBuilder {
    NovadBuilder::new(workspace_binary("novad"))
}

/// A star on moto with a fault proxy between them, to make the object store hang.
fn star_behind_a_fault_proxy() -> (Moto, FaultProxy, nova_testkit::Novad) {
    star_behind_a_fault_proxy_with(&[])
}

fn star_behind_a_fault_proxy_with(args: &[&str]) -> (Moto, FaultProxy, nova_testkit::Novad) {
    let moto = Moto::start();
    moto.create_bucket("store");
    let store = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    let star = novad()
        .args([
            "--s3-bucket",
            "store",
            "--s3-endpoint",
            &store.endpoint(),
            "--s3-path-style",
        ])
        .args(["--s3-request-timeout-ms", "500"])
        .args(args.iter().copied())
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .start();
    (moto, store, star)
}

/// A client of `star` and a producer of its new stream "s" whose batches time out after
/// `timeout`.
async fn producer_timing_out_after(
    star: &nova_testkit::Novad,
    timeout: Duration,
) -> (Client, Producer) {
    let client = Client::connect(&star.url()).await.unwrap();
    client.create_stream("s").await.unwrap();
    let config = ProducerConfig {
        delivery_timeout: timeout,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client.clone(), "s", config).await.unwrap();
    (client, producer)
}

async fn read_bodies(client: &Client, stream: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut consumer = Consumer::new(client.clone(), stream, 0);
    loop {
        let page = consumer.next_page().await.unwrap();
        if page.records.is_empty() {
            return out;
        }
        for record in page.records {
            assert_eq!(record.seq, out.len() as u64);
            out.push(String::from_utf8(record.record.body.to_vec()).unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_after_dropped_connections_and_a_restart_write_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut star = novad().data_dir(dir.path()).start();
    let proxy = FaultProxy::start(([127, 0, 0, 1], star.port()).into());
    let client = Client::connect(&proxy.endpoint()).await.unwrap();
    client.create_stream("s").await.unwrap();
    let config = ProducerConfig {
        batch_records: 50,
        max_retries: 50,
        max_backoff: Duration::from_millis(500),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client.clone(), "s", config).await.unwrap();
    const RECORDS: usize = 20_000;
    let done = Arc::new(AtomicBool::new(false));
    let appending = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut tickets = Vec::with_capacity(RECORDS);
            for i in 0..RECORDS {
                tickets.push(
                    producer
                        .append(Record::new(format!("record-{i}")))
                        .await
                        .unwrap(),
                );
                if i % 2000 == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            producer.flush().await.unwrap();
            let mut seqs = Vec::with_capacity(RECORDS);
            for ticket in tickets {
                seqs.push(ticket.wait().await.unwrap());
            }
            done.store(true, Ordering::SeqCst);
            seqs
        })
    };
    // Cut every connection a few times while the producer is busy, and restart the star once.
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if done.load(Ordering::SeqCst) {
            break;
        }
        proxy.set(Fault::Refuse);
        if round == 3 {
            star.kill9();
            star.restart();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        proxy.set(Fault::Pass);
    }
    let seqs = tokio::time::timeout(Duration::from_secs(120), appending)
        .await
        .expect("the producer finishes")
        .unwrap();
    assert_eq!(
        seqs,
        (0..RECORDS as u64).collect::<Vec<_>>(),
        "each record at its own place"
    );
    let stored = read_bodies(&client, "s").await;
    assert_eq!(stored.len(), RECORDS, "no duplicates, no gaps");
    for (i, body) in stored.iter().enumerate() {
        assert_eq!(body, &format!("record-{i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_blocks_at_its_unacknowledged_bytes_bound() {
    let (_moto, store, star) = star_behind_a_fault_proxy();
    let client = Client::connect(&star.url()).await.unwrap();
    client.create_stream("s").await.unwrap();
    let config = ProducerConfig {
        max_unacked_bytes: 64 * 1024,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client.clone(), "s", config).await.unwrap();
    store.set(Fault::Hang);
    let record = || Record::new(vec![b'b'; 1024]);
    let mut tickets = Vec::new();
    for _ in 0..64 {
        tickets.push(producer.append(record()).await.unwrap());
    }
    let blocked = tokio::time::timeout(Duration::from_secs(1), producer.append(record())).await;
    assert!(blocked.is_err(), "the 65th KiB waits for an ack");
    store.set(Fault::Pass);
    tickets.push(
        tokio::time::timeout(Duration::from_secs(60), producer.append(record()))
            .await
            .expect("room frees once acks arrive")
            .unwrap(),
    );
    producer.flush().await.unwrap();
    for (i, ticket) in tickets.into_iter().enumerate() {
        assert_eq!(ticket.wait().await.unwrap(), i as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_session_is_retried_after_the_servers_hint() {
    let star = novad().args(["--max-producer-sessions", "1"]).start();
    let client = Client::connect(&star.url()).await.unwrap();
    client.create_stream("s").await.unwrap();
    let holder = client.append_session().await.unwrap();

    // With no retries allowed the shed surfaces at once, naming the cap.
    let impatient = ProducerConfig {
        max_retries: 0,
        ..ProducerConfig::default()
    };
    match Producer::new(client.clone(), "s", impatient).await {
        Err(Error::RetriesExhausted { last, .. }) => {
            assert_eq!(last.code(), Some(Code::ResourceExhausted));
            assert!(
                last.to_string().contains("--max-producer-sessions"),
                "{last}"
            );
        }
        Err(other) => panic!("expected RetriesExhausted, got {other}"),
        Ok(_) => panic!("opened past the session cap"),
    }

    let started = Instant::now();
    let opening = tokio::spawn({
        let client = client.clone();
        async move { Producer::new(client, "s", ProducerConfig::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(holder);
    let producer = tokio::time::timeout(Duration::from_secs(30), opening)
        .await
        .expect("the producer gets a session once one frees")
        .unwrap()
        .expect("opened");
    // The star's hint is 1 s: the first retry waited for it, the second found the free slot.
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let seq = producer
        .append(Record::new("late"))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(seq, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_following_consumer_waits_at_the_tail_without_polling() {
    let star = novad().args(["--max-subscriptions", "1"]).start();
    let client = Client::connect(&star.url()).await.unwrap();
    client.create_stream("s").await.unwrap();
    let mut consumer = Consumer::new(client.clone(), "s", 0).follow(Duration::from_secs(10));
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let page = consumer.next_page().await.unwrap();
        (page, started.elapsed(), consumer)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        star.metric("nova_subscriptions"),
        Some(1.0),
        "one read waits at the tail"
    );

    // The cap on waiting reads sheds a second one.
    let second = Consumer::new(client.clone(), "s", 0)
        .follow(Duration::from_secs(10))
        .next_page()
        .await;
    match second {
        Err(Error::Status { code, message, .. }) => {
            assert_eq!(code, Code::ResourceExhausted);
            assert!(message.contains("--max-subscriptions"), "{message}");
        }
        other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
    }

    let mut session = client.append_session().await.unwrap();
    session
        .append("s", vec![Record::new("news")], None)
        .await
        .unwrap();
    let (page, waited, consumer) = waiting.await.unwrap();
    assert_eq!(
        page.records.len(),
        1,
        "the waiting read answers as soon as a record lands"
    );
    assert!(
        waited < Duration::from_secs(5),
        "it did not sit out its whole wait: {waited:?}"
    );
    assert_eq!(consumer.position(), 1);
    assert_eq!(star.metric("nova_subscriptions"), Some(0.0));

    // A follow read that times out returns an empty page, not an error.
    let mut short = Consumer::new(client.clone(), "s", 1).follow(Duration::from_millis(200));
    let page = short.next_page().await.unwrap();
    assert!(page.records.is_empty());
    assert_eq!(page.tail_seq, 1);
}

/// A star whose object store hangs holds the producer's batch admitted and unanswered: the
/// batch fails at its delivery timeout, "outcome unknown" (it may land once the store is back),
/// every later append of the producer fails the same way, and nothing is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fails_at_its_delivery_timeout_and_so_does_every_later_one() {
    let (_moto, store, star) = star_behind_a_fault_proxy();
    let timeout = Duration::from_secs(3);
    let (client, producer) = producer_timing_out_after(&star, timeout).await;
    store.set(Fault::Hang);
    let started = Instant::now();
    let first = producer.append(Record::new("first")).await.unwrap();
    let failed = tokio::time::timeout(Duration::from_secs(30), first.wait())
        .await
        .expect("the batch gives up at its delivery timeout")
        .expect_err("not acknowledged while the store hangs");
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(5),
        "failed at its delivery timeout, after {took:?}"
    );
    match &failed {
        Error::DeliveryTimeout {
            start_seq,
            records,
            outcome_unknown,
            ..
        } => {
            assert_eq!((*start_seq, *records), (0, 1));
            assert!(*outcome_unknown, "the star holds it admitted: {failed}");
        }
        other => panic!("expected DeliveryTimeout, got {other}"),
    }
    assert!(failed.is_outcome_unknown() && !failed.is_retryable());
    assert!(failed.to_string().contains("delivery timeout"), "{failed}");
    // The producer stopped: nothing after the failed batch is sent after a gap.
    let later = match producer.append(Record::new("later")).await {
        Err(error) => error,
        Ok(ticket) => ticket.wait().await.expect_err("no later batch is sent"),
    };
    assert!(
        matches!(later, Error::DeliveryTimeout { start_seq: 0, .. }),
        "later appends fail with the same error: {later}"
    );

    // The store comes back: the admitted batch lands (its outcome was unknown), once; the
    // later record was never sent.
    store.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.describe_stream("s").await.unwrap().tail_seq == 0 {
        assert!(Instant::now() < deadline, "the held batch lands");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(read_bodies(&client, "s").await, ["first"]);
}

/// A star whose admission buffer is full stops reading its sessions, so a producer's sends wait
/// on the transport: the delivery timeout bounds that wait too, and the producer gives up
/// rather than hang with its appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_timeout_holds_while_the_star_stops_reading() {
    let (_moto, store, star) = star_behind_a_fault_proxy_with(&["--s3-memory-buffer-mib", "1"]);
    let timeout = Duration::from_secs(3);
    let (_client, producer) = producer_timing_out_after(&star, timeout).await;
    store.set(Fault::Hang);
    let started = Instant::now();
    let first = producer
        .append(Record::new(vec![b'h'; 1024]))
        .await
        .unwrap();
    // Far more than the star admits: its buffer fills, it stops reading, and the producer's
    // sends wait on HTTP/2 flow control.
    let appending = tokio::spawn(async move {
        for _ in 0..16 * 1024 {
            if producer
                .append(Record::new(vec![b'h'; 1024]))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let failed = tokio::time::timeout(Duration::from_secs(30), first.wait())
        .await
        .expect("the first batch gives up at its delivery timeout")
        .expect_err("not acknowledged while the store hangs");
    assert!(matches!(failed, Error::DeliveryTimeout { .. }), "{failed}");
    assert!(
        started.elapsed() < timeout + Duration::from_secs(5),
        "gave up at its timeout, after {:?}",
        started.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(10), appending)
        .await
        .expect("the appends after it fail too, rather than wait")
        .unwrap();
}
