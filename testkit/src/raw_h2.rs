//! HTTP/2 spoken by hand, for tests of what a hostile client can do to a server: connections
//! with the window they choose, gRPC calls whose messages never finish arriving.

use bytes::Bytes;
use h2::SendStream;
use h2::client::{ResponseFuture, SendRequest};

/// An HTTP/2 connection of the test's own to 127.0.0.1:`port`, advertising `window` bytes of
/// stream window.
pub async fn connect(port: u16, window: u32) -> SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (h2, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake(tcp)
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    h2.ready().await.expect("connection ready")
}

/// Opens a gRPC call on `path` with `token`, its request body left open.
pub async fn open_call(
    h2: &mut SendRequest<Bytes>,
    port: u16,
    path: &str,
    token: &str,
) -> (ResponseFuture, SendStream<Bytes>) {
    let request = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("a valid request");
    *h2 = h2.clone().ready().await.expect("connection ready");
    h2.send_request(request, false).expect("open a call")
}

/// `message` framed as gRPC frames it: uncompressed, its length first.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend(message);
    out
}

/// Opens `per_connection` calls on `path` over each of `connections` new connections, each
/// sending a message declared at `declared` bytes and all of it but its last byte. The calls
/// stay open while their handles are held.
pub async fn unfinished_calls(
    port: u16,
    path: &str,
    token: &str,
    connections: usize,
    per_connection: usize,
    declared: u32,
) -> Vec<(ResponseFuture, SendStream<Bytes>)> {
    let mut calls = Vec::new();
    for _ in 0..connections {
        let mut h2 = connect(port, 65_535).await;
        for _ in 0..per_connection {
            let (response, mut send) = open_call(&mut h2, port, path, token).await;
            let mut start = grpc_frame(&vec![0u8; declared as usize]);
            start.pop();
            send.send_data(Bytes::from(start), false)
                .expect("send the start of a message");
            calls.push((response, send));
        }
    }
    calls
}
