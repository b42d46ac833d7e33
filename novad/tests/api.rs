//! The API against a real novad: appends, reads, stream admin, and every refusal answered with
//! the right code and a message naming the problem, while the session goes on.

mod common;

use bytes::Bytes;
use tonic::Code;

use common::*;
use nova_client::{Error, ReadOptions, Record};

#[tokio::test]
async fn appends_are_sequenced_densely_and_read_back() {
    let novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("a").await.unwrap();
    client.create_stream("b").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    // Pipelined: three batches in flight before the first ack is read, across two streams.
    session.send("a", records("a0", 3), None).await.unwrap();
    session.send("b", records("b0", 2), None).await.unwrap();
    session.send("a", records("a1", 2), None).await.unwrap();
    let acks: Vec<_> = [
        session.next_ack().await.unwrap(),
        session.next_ack().await.unwrap(),
        session.next_ack().await.unwrap(),
    ]
    .iter()
    .map(|a| (a.start_seq, a.end_seq))
    .collect();
    assert_eq!(
        acks,
        [(0, 3), (0, 2), (3, 5)],
        "acks in request order, seqs dense per stream"
    );
    assert_eq!(
        read_all(&client, "a").await,
        ["a0-0", "a0-1", "a0-2", "a1-0", "a1-1"]
    );
    let info = client.describe_stream("a").await.unwrap();
    assert_eq!(info.tail_seq, 5);
    assert!(info.stored_bytes > 0);
    assert_eq!(info.storage_class, nova_client::StorageClass::Standard);
    assert!(info.created_at_ms > 1_700_000_000_000);

    // Headers and timestamps survive; an unset timestamp is stamped by the star.
    let stamped = Record {
        timestamp: 42,
        ..Record::new("with-header").with_header("k", "v")
    };
    session
        .append("b", vec![stamped, Record::new("now")], None)
        .await
        .unwrap();
    let page = client.read("b", 2, 10).await.unwrap();
    assert_eq!(page.records[0].record.timestamp, 42);
    assert_eq!(
        page.records[0].record.headers[0].name,
        Bytes::from_static(b"k")
    );
    assert!(page.records[1].record.timestamp > 1_700_000_000_000);
}

#[tokio::test]
async fn reading_at_or_past_the_tail_is_an_empty_page_not_an_error() {
    let novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let empty = client.read("s", 0, 10).await.unwrap();
    assert!(empty.records.is_empty());
    assert_eq!(empty.tail_seq, 0);
    let mut session = client.append_session().await.unwrap();
    session.append("s", records("r", 4), None).await.unwrap();
    for at in [4, 100] {
        let page = client.read("s", at, 10).await.unwrap();
        assert!(page.records.is_empty());
        assert_eq!(page.tail_seq, 4);
    }
}

fn code_of(result: Result<impl std::fmt::Debug, Error>) -> (Code, String) {
    match result {
        Err(Error::Status { code, message, .. }) => (code, message),
        other => panic!("expected a status error, got {other:?}"),
    }
}

#[tokio::test]
async fn refused_appends_apply_nothing_and_the_session_goes_on() {
    let novad = novad()
        .args([
            "--max-batch-records",
            "10",
            "--max-record-bytes",
            "100",
            "--max-batch-bytes",
            "500",
        ])
        .start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();

    let (code, message) = code_of(session.append("s", records("x", 11), None).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("--max-batch-records=10"), "{message}");

    let big = vec![Record::new(vec![b'x'; 101])];
    let (code, message) = code_of(session.append("s", big, None).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("--max-record-bytes=100"), "{message}");

    let heavy: Vec<_> = (0..6).map(|_| Record::new(vec![b'y'; 100])).collect();
    let (code, message) = code_of(session.append("s", heavy, None).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("--max-batch-bytes=500"), "{message}");

    let (code, message) = code_of(session.append("s", vec![], None).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("empty"), "{message}");

    let (code, message) = code_of(session.append("nope", records("z", 1), None).await);
    assert_eq!(code, Code::NotFound);
    assert!(message.contains("nope"), "{message}");

    // Nothing of the refused batches was applied, and the same session still appends.
    let ack = session.append("s", records("ok", 2), None).await.unwrap();
    assert_eq!((ack.start_seq, ack.end_seq), (0, 2));
    assert_eq!(read_all(&client, "s").await, ["ok-0", "ok-1"]);
    let metrics = novad.metrics();
    assert!(
        metrics.contains("nova_append_rejections_total{reason=\"max_batch_records\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn match_seq_num_makes_appends_conditional() {
    let novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    session.append("s", records("a", 3), Some(0)).await.unwrap();
    // A retry of the same batch (the producer never saw its ack) is refused, not duplicated.
    match session.append("s", records("a", 3), Some(0)).await {
        Err(Error::Status {
            code,
            next_seq,
            message,
            ..
        }) => {
            assert_eq!(code, Code::FailedPrecondition);
            assert_eq!(next_seq, Some(3));
            assert!(message.contains("match_seq_num"), "{message}");
        }
        other => panic!("expected FAILED_PRECONDITION, got {other:?}"),
    }
    // Pipelined conditional appends chain on the sequence numbers already assigned.
    session.send("s", records("b", 2), Some(3)).await.unwrap();
    session.send("s", records("c", 1), Some(5)).await.unwrap();
    assert_eq!(session.next_ack().await.unwrap().end_seq, 5);
    assert_eq!(session.next_ack().await.unwrap().end_seq, 6);
    assert_eq!(read_all(&client, "s").await.len(), 6);
}

#[tokio::test]
async fn read_pages_stop_at_either_cap_and_always_serve_one_record() {
    let novad = novad()
        .args(["--max-read-records", "5", "--max-read-bytes", "1000"])
        .start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    let mut batch: Vec<_> = (0..8).map(|i| Record::new(format!("small-{i}"))).collect();
    batch.extend((0..3).map(|_| Record::new(vec![b'L'; 400])));
    batch.push(Record::new(vec![b'H'; 5000]));
    session.append("s", batch, None).await.unwrap();

    let page = client.read("s", 0, 0).await.unwrap();
    assert_eq!(page.records.len(), 5, "the record cap");
    assert_eq!(page.next_seq, 5);
    let page = client.read("s", 0, 3).await.unwrap();
    assert_eq!(page.records.len(), 3, "a request may ask for fewer");
    let page = client.read("s", 8, 0).await.unwrap();
    assert_eq!(
        page.records.len(),
        2,
        "the byte cap: a third 400-byte record would pass 1000"
    );
    let page = client.read("s", 11, 0).await.unwrap();
    assert_eq!(
        page.records.len(),
        1,
        "one record always serves, even over the byte cap"
    );
    assert_eq!(page.records[0].record.body.len(), 5000);
    let lower = ReadOptions {
        max_bytes: 100,
        ..ReadOptions::default()
    };
    let page = client.read_with("s", 8, lower).await.unwrap();
    assert_eq!(
        page.records.len(),
        1,
        "a request may lower the byte cap too"
    );
}

#[tokio::test]
async fn streams_are_listed_paged_and_deleted() {
    let novad = novad().start();
    let client = client(&novad).await;
    for name in ["x/1", "x/2", "x/3", "y"] {
        client.create_stream(name).await.unwrap();
    }
    let (code, message) = code_of(client.create_stream("y").await);
    assert_eq!(code, Code::AlreadyExists);
    assert!(message.contains("\"y\""), "{message}");
    let (code, _) = code_of(client.create_stream("").await);
    assert_eq!(code, Code::InvalidArgument);

    let (page, next) = client.list_streams("x/", "", 2).await.unwrap();
    assert_eq!(
        page.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["x/1", "x/2"]
    );
    let (page, next) = client.list_streams("x/", &next.unwrap(), 2).await.unwrap();
    assert_eq!(
        page.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["x/3"]
    );
    assert_eq!(next, None);

    let mut session = client.append_session().await.unwrap();
    session.append("y", records("old", 3), None).await.unwrap();
    client.delete_stream("y").await.unwrap();
    let (code, _) = code_of(client.describe_stream("y").await);
    assert_eq!(code, Code::NotFound);
    let (code, _) = code_of(client.read("y", 0, 1).await);
    assert_eq!(code, Code::NotFound);
    let (code, _) = code_of(client.delete_stream("y").await);
    assert_eq!(code, Code::NotFound);
    // A recreated stream starts over, with none of the old records.
    client.create_stream("y").await.unwrap();
    assert_eq!(client.describe_stream("y").await.unwrap().tail_seq, 0);
    assert!(read_all(&client, "y").await.is_empty());
}

/// A star without express zone buckets refuses an Express stream by name and class, and
/// creates nothing: the name stays free.
#[tokio::test]
async fn express_streams_are_refused_without_zone_buckets() {
    let novad = novad().start();
    let client = client(&novad).await;
    let express = nova_client::StreamConfig {
        storage_class: nova_client::StorageClass::Express,
        ..Default::default()
    };
    let (code, message) = code_of(client.create_stream_configured("fast", express).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("\"fast\""), "{message}");
    assert!(message.contains("EXPRESS"), "{message}");
    assert!(message.contains("zone"), "{message}");
    let (code, _) = code_of(client.describe_stream("fast").await);
    assert_eq!(code, Code::NotFound, "nothing was created");
    let info = client
        .create_stream("fast")
        .await
        .expect("the name is free");
    assert_eq!(info.storage_class, nova_client::StorageClass::Standard);
}
