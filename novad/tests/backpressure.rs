//! Bounds that block or shed: the producer-session cap sheds new sessions with
//! RESOURCE_EXHAUSTED and a retry hint while open sessions carry on; a full admission buffer
//! blocks producers (no error, no growth) until the object store lets flights land.

mod common;

use std::time::Duration;

use tonic::Code;

use common::*;
use nova_client::{Error, Record};
use nova_testkit::Moto;

#[tokio::test]
async fn sessions_past_the_cap_are_shed_with_a_hint_and_open_ones_carry_on() {
    let novad = novad().args(["--max-producer-sessions", "2"]).start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut first = client.append_session().await.unwrap();
    let mut second = client.append_session().await.unwrap();
    first.append("s", records("1", 1), None).await.unwrap();

    match client.append_session().await {
        Err(Error::Status {
            code,
            message,
            retry_after,
            ..
        }) => {
            assert_eq!(code, Code::ResourceExhausted);
            assert!(message.contains("--max-producer-sessions"), "{message}");
            assert!(
                retry_after.is_some_and(|d| d > Duration::ZERO),
                "a retry-after-ms hint"
            );
        }
        Err(other) => panic!("expected RESOURCE_EXHAUSTED, got {other}"),
        Ok(_) => panic!("a third session opened past a cap of two"),
    }
    // Existing sessions were not cut.
    first.append("s", records("1", 1), None).await.unwrap();
    second.append("s", records("2", 1), None).await.unwrap();
    assert_eq!(
        novad.metric("nova_sheds_total{cap=\"max_producer_sessions\"}"),
        Some(1.0)
    );
    assert!(
        novad
            .log()
            .contains("shed new work: --max-producer-sessions reached (2)"),
        "the shed is logged"
    );

    // A slot frees when a session ends.
    drop(first);
    let mut third = None;
    for _ in 0..50 {
        if let Ok(session) = client.append_session().await {
            third = Some(session);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    third
        .expect("a session opens once another ends")
        .append("s", records("3", 1), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_admission_buffer_blocks_producers_until_flights_land() {
    let moto = Moto::start();
    let novad = novad_on_s3(&moto, "admission")
        .args(["--s3-memory-buffer-mib", "1", "--flight-linger-ms", "5"])
        .start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    session.append("s", records("warm", 1), None).await.unwrap();

    // The object store hangs: no flight can land, so nothing is acknowledged.
    moto.pause();
    const BATCHES: usize = 120;
    let body = vec![b'x'; 16 * 1024];
    let producer = tokio::spawn(async move {
        let mut sent = 0;
        for _ in 0..BATCHES {
            session
                .send("s", vec![Record::new(body.clone())], None)
                .await
                .unwrap();
            sent += 1;
        }
        (session, sent)
    });
    // 120 × 16 KiB is nearly twice the 1 MiB budget: the producer cannot get it all in.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !producer.is_finished(),
        "the producer is blocked by flow control, not failed"
    );
    let used = novad.metric("nova_admission_buffer_used_bytes").unwrap();
    let capacity = novad
        .metric("nova_admission_buffer_capacity_bytes")
        .unwrap();
    assert_eq!(capacity, (1 << 20) as f64);
    assert!(
        used <= capacity,
        "admission never passes its budget: {used} > {capacity}"
    );
    assert!(used > capacity / 2.0, "the buffer filled up: {used}");
    assert_eq!(
        novad.metric("nova_admission_buffer_waiters"),
        Some(1.0),
        "one charge waits"
    );
    assert!(
        novad.metric("nova_oldest_admitted_age_seconds").unwrap() >= 2.0,
        "the oldest admitted batch ages while the store is down"
    );

    moto.resume();
    let (mut session, sent) = tokio::time::timeout(Duration::from_secs(60), producer)
        .await
        .expect("the producer unblocks once flights land")
        .unwrap();
    assert_eq!(sent, BATCHES);
    let mut last_end = 1;
    for _ in 0..BATCHES {
        let ack = tokio::time::timeout(Duration::from_secs(60), session.next_ack())
            .await
            .expect("every blocked append completes")
            .unwrap();
        assert_eq!(ack.start_seq, last_end, "in order, no gaps");
        last_end = ack.end_seq;
    }
    assert_eq!(
        client.describe_stream("s").await.unwrap().tail_seq,
        1 + BATCHES as u64
    );
    assert_eq!(novad.metric("nova_admission_buffer_used_bytes"), Some(0.0));
    assert_peak_rss_within_formula(&novad, 2);
}

#[tokio::test]
async fn a_batch_heavier_than_the_whole_buffer_still_goes_through() {
    let novad = novad().args(["--s3-memory-buffer-mib", "1"]).start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    let heavy: Vec<_> = (0..3).map(|_| Record::new(vec![b'h'; 1 << 20])).collect();
    let ack = tokio::time::timeout(Duration::from_secs(30), session.append("s", heavy, None))
        .await
        .expect("the clamped charge does not deadlock")
        .unwrap();
    assert_eq!((ack.start_seq, ack.end_seq), (0, 3));
    let page = client.read("s", 0, 0).await.unwrap();
    assert_eq!(page.records.len(), 3);
}
