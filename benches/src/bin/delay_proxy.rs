//! A TCP delay line: forwards every connection to a target, each chunk in either direction
//! `--delay-ms` after it arrived, in order, without limiting bandwidth (chunks in flight
//! overlap, as packets on a long link do). Put in front of a local S3-compatible server, it
//! gives the store the round trip a real one has (`tc netem` does not work on this machine).
//! Prints its address on one line once it listens; runs until killed.
//!
//! delay-proxy --target 127.0.0.1:PORT --delay-ms 10 [--listen 127.0.0.1:0]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Bytes read at once.
const CHUNK: usize = 64 * 1024;
/// Chunks on the line per direction of a connection: at 64 KiB, 64 MiB in flight, past what
/// any link this machine can fill holds within a delay of a few tens of ms.
const LINE: usize = 1024;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Reads `from` and hands each chunk on, stamped with when it may leave.
async fn read_side(
    mut from: OwnedReadHalf,
    line: mpsc::Sender<(Instant, Vec<u8>)>,
    delay: Duration,
) {
    loop {
        let mut buf = vec![0; CHUNK];
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf.truncate(n);
                if line.send((Instant::now() + delay, buf)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes each chunk to `to` when its time comes; closes `to` when the line ends.
async fn write_side(mut to: OwnedWriteHalf, mut line: mpsc::Receiver<(Instant, Vec<u8>)>) {
    while let Some((at, chunk)) = line.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

fn pipe(from: OwnedReadHalf, to: OwnedWriteHalf, delay: Duration) {
    let (tx, rx) = mpsc::channel(LINE);
    tokio::spawn(read_side(from, tx, delay));
    tokio::spawn(write_side(to, rx));
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let target = arg("--target").ok_or("--target is required")?;
    let delay = Duration::from_millis(
        arg("--delay-ms")
            .ok_or("--delay-ms is required")?
            .parse()
            .map_err(|e| format!("--delay-ms: {e}"))?,
    );
    let listen = arg("--listen").unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("listening on {listen}: {e}"))?;
    println!("{}", listener.local_addr().map_err(|e| e.to_string())?);
    loop {
        let (client, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let target = target.clone();
        tokio::spawn(async move {
            // The connection's set-up pays the round trip too.
            tokio::time::sleep(2 * delay).await;
            let Ok(server) = TcpStream::connect(&target).await else {
                return;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            pipe(client_read, server_write, delay);
            pipe(server_read, client_write, delay);
        });
    }
}
