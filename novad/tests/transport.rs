//! A decoded batch is never held outside the budgets: two hundred sessions each send a 16 MiB
//! batch while the object store hangs, and the star's resident memory stays under its closed
//! formula plus the fixed overhead the docs state. Every message is charged from its gRPC length
//! prefix, before its body is buffered; the others wait in their sessions' stream windows.
//!
//! The batches are sent over raw HTTP/2 from one shared buffer, so the test itself does not
//! hold two hundred copies of them.

mod common;

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use common::*;
use nova_proto::v1;
use nova_testkit::outage::star_overhead_bytes;
use nova_testkit::{Fault, FaultProxy, Moto, NovadBuilder};

const SESSIONS: u64 = 200;
const ADMISSION_MIB: u64 = 64;
const TAIL_MIB: u64 = 16;
const READ_MIB: u64 = 8;

/// One gRPC-framed append of 16 records of just under 1 MiB: a 16 MiB batch.
fn big_append() -> Bytes {
    let body = Bytes::from(vec![b'z'; (1 << 20) - 64]);
    let request = v1::AppendRequest {
        stream: "s".into(),
        records: (0..16)
            .map(|_| v1::Record {
                body: body.clone(),
                headers: vec![],
                timestamp: None,
            })
            .collect(),
        match_seq_num: None,
    };
    let encoded = request.encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + encoded.len());
    framed.put_u8(0);
    framed.put_u32(encoded.len() as u32);
    framed.put_slice(&encoded);
    framed.freeze()
}

/// Opens an `Append` call over raw HTTP/2.
async fn open_append(
    h2: &h2::client::SendRequest<Bytes>,
    port: u16,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut h2 = h2.clone().ready().await.unwrap();
    let request = http::Request::post(format!("http://127.0.0.1:{port}/nova.v1.Nova/Append"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    h2.send_request(request, false).unwrap()
}

/// Sends `message` on the stream as its windows allow, a frame's worth at a time, as an HTTP/2
/// client that streams a body does; the slices share the buffer.
async fn send_slowly(mut send: h2::SendStream<Bytes>, message: Bytes) {
    let mut at = 0;
    while at < message.len() {
        send.reserve_capacity((message.len() - at).min(16 * 1024));
        let Some(Ok(granted)) = std::future::poll_fn(|cx| send.poll_capacity(cx)).await else {
            return;
        };
        if granted == 0 {
            continue;
        }
        let end = (at + granted).min(message.len());
        if send.send_data(message.slice(at..end), false).is_err() {
            return;
        }
        at = end;
    }
}

/// Small budgets for `sessions` sessions, and room for the 16 MiB batches, small enough that
/// the buffer stays the admission term of the formula.
fn small_budgets(builder: NovadBuilder, sessions: u64) -> NovadBuilder {
    builder.args([
        "--s3-memory-buffer-mib",
        &ADMISSION_MIB.to_string(),
        "--tail-window-cache-mib",
        &TAIL_MIB.to_string(),
        "--read-memory-mib",
        &READ_MIB.to_string(),
        "--max-producer-sessions",
        &sessions.to_string(),
        "--max-batch-bytes",
        "17MiB",
    ])
}

/// A raw HTTP/2 connection to novad, with Nagle off so small frames are not held back.
async fn connect(novad: &nova_testkit::Novad) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", novad.port()))
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    h2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_mib_batches_into_a_paused_store_stay_inside_the_formula() {
    let moto = Moto::start();
    moto.create_bucket("paused");
    let proxy = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    let novad = small_budgets(via_endpoint(novad(), &proxy.endpoint(), "paused"), SESSIONS)
        .args(["--s3-request-timeout-ms", "60000"])
        .start();
    client(&novad).await.create_stream("s").await.unwrap();
    proxy.set(Fault::Hang);

    let message = big_append();
    let h2 = connect(&novad).await;
    let mut calls = Vec::new();
    for _ in 0..SESSIONS {
        let (response, send) = open_append(&h2, novad.port()).await;
        calls.push((response, tokio::spawn(send_slowly(send, message.clone()))));
    }

    let formula = nova_testkit::outage::star_budgets(ADMISSION_MIB, TAIL_MIB, READ_MIB, SESSIONS)
        .at_session_cap()
        .total();
    let limit = formula + star_overhead_bytes(SESSIONS);
    let pid = novad.pid().unwrap();
    let started = Instant::now();
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(10) {
        if let Some((rss, _)) = nova_server::memory::resident_bytes(pid) {
            peak = peak.max(rss);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admitted = novad.metric("nova_admission_buffer_used_bytes").unwrap();
    println!(
        "{SESSIONS} sessions × 16 MiB into a hung store: peak RSS {:.1} MiB against formula {:.1} MiB \
         + overhead {:.1} MiB; admission buffer holds {:.1} MiB",
        peak as f64 / (1 << 20) as f64,
        formula as f64 / (1 << 20) as f64,
        star_overhead_bytes(SESSIONS) as f64 / (1 << 20) as f64,
        admitted / (1 << 20) as f64,
    );
    assert!(
        admitted > 0.0,
        "a batch was admitted and waits for the store"
    );
    let landing = novad.metric("nova_flights_in_flight").unwrap_or(0.0);
    assert!(landing >= 1.0, "a 16 MiB batch went through to a flight");
    assert!(
        peak <= limit,
        "peak RSS {peak} over the formula {formula} plus the stated overhead"
    );
    drop(calls);
}

/// After large batches are acknowledged, sessions that stay open hold nothing of them: the
/// transport keeps no buffer the size of the largest message a session once sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_sessions_keep_nothing_of_their_last_batch() {
    const IDLE: u64 = 20;
    let novad = small_budgets(novad(), IDLE).start();
    client(&novad).await.create_stream("s").await.unwrap();
    let message = big_append();
    let h2 = connect(&novad).await;
    let mut sessions = Vec::new();
    for _ in 0..IDLE {
        let (response, send) = open_append(&h2, novad.port()).await;
        let sending = tokio::spawn(send_slowly(send, message.clone()));
        sessions.push((response, sending));
    }
    // Every batch is acknowledged (one AppendAck each); the sessions stay open.
    let mut open = Vec::new();
    for (response, sending) in sessions {
        let response = tokio::time::timeout(Duration::from_secs(120), response)
            .await
            .expect("an answer")
            .unwrap();
        let mut body = response.into_body();
        let ack = tokio::time::timeout(Duration::from_secs(120), body.data())
            .await
            .expect("an ack")
            .expect("the session is open")
            .unwrap();
        let ack = v1::AppendAck::decode(&ack[5..]).unwrap();
        assert!(ack.error.is_none(), "{ack:?}");
        assert_eq!(ack.end_seq - ack.start_seq, 16);
        open.push((body, sending));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = nova_server::memory::resident_bytes(novad.pid().unwrap())
        .unwrap()
        .0;
    let formula = nova_testkit::outage::star_budgets(ADMISSION_MIB, TAIL_MIB, READ_MIB, IDLE)
        .at_session_cap()
        .total();
    let limit = formula + star_overhead_bytes(IDLE);
    println!(
        "{IDLE} idle sessions after a 16 MiB batch each: RSS {:.1} MiB, formula {:.1} MiB + overhead {:.1} MiB",
        rss as f64 / (1 << 20) as f64,
        formula as f64 / (1 << 20) as f64,
        star_overhead_bytes(IDLE) as f64 / (1 << 20) as f64
    );
    assert!(
        rss <= limit,
        "RSS {rss} over {limit} with the sessions idle"
    );
    drop(open);
}
