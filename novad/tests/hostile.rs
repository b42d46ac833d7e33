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

/// A client that speaks just enough HTTP/2 to open streams as fast as it can, ignoring the
/// server's SETTINGS_MAX_CONCURRENT_STREAMS (a well-behaved client, such as h2's, never
/// exceeds it).
struct StreamFlood {
    tcp: tokio::net::TcpStream,
    authority: String,
}

impl StreamFlood {
    async fn open(port: u16) -> Self {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        tcp.write_all(&hello).await.unwrap();
        let mut flood = Self {
            tcp,
            authority: format!("127.0.0.1:{port}"),
        };
        // The server's SETTINGS come first; once acknowledged its limits apply.
        loop {
            let (kind, flags, _, _) = flood.frame().await.expect("the server's SETTINGS");
            if kind == 4 && flags & 1 == 0 {
                break;
            }
        }
        flood
            .tcp
            .write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0])
            .await
            .unwrap();
        flood
    }

    /// The next frame: type, flags, stream, payload.
    async fn frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        let mut head = [0u8; 9];
        self.tcp.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.tcp.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], stream, payload))
    }

    /// A HEADERS frame opening a Read call on `stream` (HPACK without indexing or Huffman).
    fn headers(&self, stream: u32) -> Vec<u8> {
        fn literal(out: &mut Vec<u8>, value: &str) {
            out.push(value.len() as u8);
            out.extend(value.as_bytes());
        }
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.push(0x04); // :path
        literal(&mut block, "/nova.v1.Nova/Read");
        block.push(0x01); // :authority
        literal(&mut block, &self.authority);
        block.extend([0x0f, 0x10]); // content-type (static index 31)
        literal(&mut block, "application/grpc");
        block.push(0x00); // te, a name of its own
        literal(&mut block, "te");
        literal(&mut block, "trailers");
        let len = (block.len() as u32).to_be_bytes();
        let mut frame = vec![len[1], len[2], len[3], 1, 4]; // HEADERS, END_HEADERS
        frame.extend(stream.to_be_bytes());
        frame.extend(block);
        frame
    }

    /// Opens `n` streams at once; how many the server refused (RST_STREAM REFUSED_STREAM)
    /// within three seconds.
    async fn send(&mut self, n: u32) -> u32 {
        use tokio::io::AsyncWriteExt;
        let frames: Vec<u8> = (0..n).flat_map(|i| self.headers(2 * i + 1)).collect();
        self.tcp.write_all(&frames).await.unwrap();
        let mut refused = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while let Ok(Some((kind, _, _, payload))) =
            tokio::time::timeout_at(deadline, self.frame()).await
        {
            if kind == 3 && payload == [0, 0, 0, 7] {
                refused += 1;
            }
            assert_ne!(kind, 7, "the server sent GOAWAY: {payload:?}");
        }
        refused
    }
}

/// Calls GetServerInfo over a raw HTTP/2 connection with an `x-padding` header of `padding`
/// bytes; whether it was served (grpc-status 0, in the headers or the trailers).
async fn server_info_with_padding(port: u16, padding: usize) -> bool {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let Ok(mut h2) = h2.ready().await else {
        return false;
    };
    let request = http::Request::post(format!(
        "http://127.0.0.1:{port}/nova.v1.Nova/GetServerInfo"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("x-padding", "p".repeat(padding))
    .body(())
    .unwrap();
    let Ok((response, mut send)) = h2.send_request(request, false) else {
        return false;
    };
    // An empty GetServerInfoRequest: uncompressed, zero bytes long.
    let _ = send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true);
    let answer = async {
        let response = response.await.ok()?;
        if response.status() != http::StatusCode::OK {
            return Some(false);
        }
        let ok = |headers: &http::HeaderMap| headers.get("grpc-status").is_some_and(|s| s == "0");
        if ok(response.headers()) {
            return Some(true);
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.ok()?;
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let trailers = body.trailers().await.ok()??;
        Some(ok(&trailers))
    };
    tokio::time::timeout(Duration::from_secs(5), answer)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_connections_are_bounded_counted_and_leave_good_clients_served() {
    let novad = novad()
        .args([
            "--max-connections",
            &CONNECTIONS.to_string(),
            "--first-request-timeout",
            "20s",
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
    // Measured before any reaches its first-request deadline.
    assert!(
        opened_at.elapsed() < Duration::from_secs(15),
        "opening {CONNECTIONS} connections took {:?}",
        opened_at.elapsed()
    );
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
    eprintln!("hostile: served while stalled");
    append(&mut session, &mut appended).await;
    assert_eq!(read_all(&client, "good").await.len(), appended);

    // Past the first-request deadline every stalled connection is closed, and counted.
    eprintln!("hostile: waiting for closures");
    eventually(
        Duration::from_secs(40),
        "the stalled connections to close",
        || {
            novad
                .metric("nova_connections_closed_total{reason=\"first_request_timeout\"}")
                .unwrap_or(0.0)
                >= (CONNECTIONS - 1) as f64
        },
    )
    .await;
    drop(stalled);
    // Places are free again: a new client connects.
    eprintln!("hostile: reconnecting");
    let later = common::client(&novad).await;
    assert_eq!(read_all(&later, "good").await.len(), appended);

    // One connection opening streams without end, ignoring the star's limit: past 1024 open
    // at once, each new one is refused.
    eprintln!("hostile: stream flood");
    let mut flood = StreamFlood::open(novad.port()).await;
    let refused = flood.send(2000).await;
    eprintln!("hostile: 2000 streams on one connection, {refused} refused");
    assert!(
        refused >= 2000 - 1024,
        "only {refused} of 2000 streams refused at --max-concurrent-streams=1024"
    );
    // While the flood holds its streams, the good clients are served.
    append(&mut session, &mut appended).await;
    drop(flood);

    // A call whose headers are over --max-header-list-bytes is refused before any handler.
    eprintln!("hostile: oversized header");
    // The same call with small headers is the control: served.
    assert!(
        server_info_with_padding(novad.port(), 16).await,
        "a GetServerInfo with small headers was not served"
    );
    let served = server_info_with_padding(novad.port(), 64 * 1024).await;
    assert!(!served, "a 64 KiB header list was served");

    // And still the good clients are served.
    eprintln!("hostile: final check");
    append(&mut session, &mut appended).await;
    assert_eq!(read_all(&client, "good").await.len(), appended);
}
