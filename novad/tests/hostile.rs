//! Hostile clients against a real star: thousands of connections that never send a request
//! (some stopping inside a frame), connections past the cap, a flood of streams on one
//! connection, oversized headers. A well-behaved producer and consumer keep working throughout,
//! every refusal is counted, and the star's memory grows by no more than the stated cost of a
//! connection.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;

const CONNECTIONS: usize = 2000;

/// What a connection that stalls looks like on the wire: the HTTP/2 preface, an empty SETTINGS
/// frame, then (for some) the first bytes of a HEADERS frame that never completes.
fn stall(port: u16, partial_header: bool) -> Option<TcpStream> {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    if partial_header {
        // A HEADERS frame on stream 1 announcing 100 bytes, of which 3 arrive.
        bytes.extend([0, 0, 100, 1, 4, 0, 0, 0, 1, 0x82, 0x86, 0x84]);
    }
    tcp.write_all(&bytes).ok()?;
    Some(tcp)
}

/// Ten records from the good producer, which must be served.
async fn append(session: &mut nova_client::AppendSession, appended: &mut usize) {
    session
        .append("good", records(&format!("g{appended}"), 10), None)
        .await
        .expect("a good producer is served");
    *appended += 10;
}

fn resident(novad: &nova_testkit::Novad) -> f64 {
    novad.metric("nova_process_resident_bytes").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_connections_are_bounded_counted_and_leave_good_clients_served() {
    let novad = novad()
        .args([
            "--max-connections",
            &CONNECTIONS.to_string(),
            "--first-request-timeout",
            "6s",
        ])
        .start();
    // A good producer and consumer, connected first: they hold a place each.
    let client = client(&novad).await;
    client.create_stream("good").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    let mut appended = 0usize;
    append(&mut session, &mut appended).await;
    let before = resident(&novad);

    // Thousands of connections that never make a request; a tenth stop inside a frame.
    let opened_at = Instant::now();
    let mut stalled = Vec::new();
    for i in 0..CONNECTIONS + 100 {
        if let Some(tcp) = stall(novad.port(), i % 10 == 0) {
            stalled.push(tcp);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(opened_at.elapsed() < Duration::from_secs(5), "opened in time to measure");
    let open = novad.metric("nova_connections").unwrap();
    assert_eq!(open as usize, CONNECTIONS, "held at the cap");
    let refused = novad
        .metric("nova_connections_refused_total{reason=\"max_connections\"}")
        .unwrap();
    assert!(refused >= 100.0, "{refused} refused past the cap");
    let grown = resident(&novad) - before;
    let per_connection = grown / CONNECTIONS as f64;
    eprintln!(
        "{CONNECTIONS} stalled connections grew the star by {:.1} MiB: {:.1} KiB each",
        grown / (1 << 20) as f64,
        per_connection / 1024.0
    );
    assert!(
        per_connection < 32.0 * 1024.0,
        "a stalled connection costs {per_connection} bytes, over the 32 KiB docs/security.md states"
    );

    // The good clients, holding their places, are served all the while.
    append(&mut session, &mut appended).await;
    assert_eq!(read_all(&client, "good").await.len(), appended);

    // Past the first-request deadline every stalled connection is closed, and counted.
    eventually(Duration::from_secs(20), "the stalled connections to close", || {
        novad
            .metric("nova_connections_closed_total{reason=\"first_request_timeout\"}")
            .unwrap_or(0.0)
            >= (CONNECTIONS - 1) as f64
    })
    .await;
    drop(stalled);
    // Places are free again: a new client connects.
    let later = common::client(&novad).await;
    assert_eq!(read_all(&later, "good").await.len(), appended);

    // One connection opening streams without end: the star allows it 1024 at once.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", novad.port()))
        .await
        .unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut h2 = h2.ready().await.unwrap();
    let mut streams = Vec::new();
    let flood = async {
        loop {
            h2 = h2.clone().ready().await.unwrap();
            let request = http::Request::post(format!(
                "http://127.0.0.1:{}/nova.v1.Nova/Read",
                novad.port()
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
            let (response, send) = h2.send_request(request, false).unwrap();
            streams.push((response, send));
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), flood).await;
    assert_eq!(h2.current_max_send_streams(), 1024, "the star's SETTINGS");
    assert!(
        streams.len() <= 1024 + 1,
        "{} streams open on one connection",
        streams.len()
    );
    drop(streams);

    // A call whose headers are over --max-header-list-bytes is refused before any handler.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", novad.port()))
        .await
        .unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut h2 = h2.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://127.0.0.1:{}/nova.v1.Nova/GetServerInfo",
        novad.port()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("x-padding", "p".repeat(64 * 1024))
    .body(())
    .unwrap();
    let served = match h2.send_request(request, false) {
        Ok((response, mut send)) => {
            let _ = send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true);
            match tokio::time::timeout(Duration::from_secs(5), response).await {
                Ok(Ok(response)) => response
                    .headers()
                    .get("grpc-status")
                    .is_some_and(|s| s == "0"),
                _ => false,
            }
        }
        Err(_) => false,
    };
    assert!(!served, "a 64 KiB header list was served");

    // And still the good clients are served.
    append(&mut session, &mut appended).await;
    assert_eq!(read_all(&client, "good").await.len(), appended);
}
