//! Accepting connections within limits. Every connection holds one of `--max-connections`
//! places from its accept until it closes; past the cap a new connection is closed at once and
//! counted, and open ones are never cut to make room. A TLS handshake runs in a task of its own
//! (the accept loop never waits on a slow client) and must finish, and the first request arrive,
//! within `--first-request-timeout` of the accept; a connection with no call in progress for
//! `--idle-timeout` is closed. So is one whose writes make no progress for
//! `--keepalive-timeout` (a peer that stopped reading), and one holding a response it has not
//! taken within `--send-timeout` (a consumer that withholds its HTTP/2 window). The deadlines
//! run on one timer per connection, polled from both its reads and its writes: h2 stops
//! reading while it has bytes it cannot write, so a check on reads alone never fires for a
//! peer that stopped reading.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::tls::ReloadingTls;
use crate::shed::ShedLog;

/// Connections whose handshake is done, waiting for tonic to take them. Small: tonic takes
/// each at once; the places under the cap bound how many handshakes run.
const ACCEPTED_QUEUE: usize = 64;

/// The limits on one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    /// From the accept to the first request (the TLS handshake included).
    pub first_request: Duration,
    /// With no call in progress.
    pub idle: Duration,
    /// With bytes to write and none taken by the peer.
    pub write_stall: Duration,
    /// From a response's first frame to its last, for responses that hold a charge.
    pub send: Duration,
}

/// One listener's connection series.
#[derive(Debug, Clone)]
pub struct ConnMetrics {
    pub open: IntGauge,
    pub capacity: IntGauge,
    pub accepted: prometheus::IntCounter,
    /// New connections refused: `max_connections`, `tls_handshake`.
    pub refused: IntCounterVec,
    /// Connections closed by the server: `first_request_timeout`, `idle_timeout`,
    /// `write_timeout`, `send_timeout`.
    pub closed: IntCounterVec,
}

impl ConnMetrics {
    pub fn register(r: &prometheus::Registry, prefix: &str) -> Self {
        use nova_core::metrics::{counter, counter_vec, gauge};
        let metrics = Self {
            open: gauge(
                r,
                &format!("{prefix}_connections"),
                "gRPC connections open.",
            ),
            capacity: gauge(
                r,
                &format!("{prefix}_connections_capacity"),
                "The most gRPC connections open at once (--max-connections).",
            ),
            accepted: counter(
                r,
                &format!("{prefix}_connections_accepted_total"),
                "gRPC connections accepted (TLS handshake done).",
            ),
            refused: counter_vec(
                r,
                &format!("{prefix}_connections_refused_total"),
                "New gRPC connections closed unserved: max_connections (past --max-connections), tls_handshake (a failed or slow handshake).",
                &["reason"],
            ),
            closed: counter_vec(
                r,
                &format!("{prefix}_connections_closed_total"),
                "gRPC connections the server closed: first_request_timeout (no request within --first-request-timeout), idle_timeout (no call for --idle-timeout), write_timeout (the peer took no bytes for --keepalive-timeout), send_timeout (a response not taken within --send-timeout).",
                &["reason"],
            ),
        };
        for reason in ["max_connections", "tls_handshake"] {
            metrics.refused.with_label_values(&[reason]);
        }
        for reason in CLOSE_REASONS {
            metrics.closed.with_label_values(&[reason]);
        }
        metrics
    }
}

const CLOSE_REASONS: [&str; 4] = [
    "first_request_timeout",
    "idle_timeout",
    "write_timeout",
    "send_timeout",
];

/// What a connection's calls tell it: whether it has had one, how many run, when one last
/// began or ended.
#[derive(Debug)]
pub struct ConnState {
    opened: Instant,
    calls: AtomicU64,
    active: AtomicU64,
    /// Milliseconds after `opened` that a call last began or ended.
    last_call_ms: AtomicU64,
    /// Responses being sent that hold a charge, by a serial number: when each began, in
    /// milliseconds after `opened`. Serials grow with time, so the first is the oldest. At most
    /// one per HTTP/2 stream (`--max-concurrent-streams`).
    sending: Mutex<BTreeMap<u64, u64>>,
    next_send: AtomicU64,
    /// How many entries `sending` has: the check made on every read and write looks here,
    /// and takes the lock only when a response is being sent.
    sends: AtomicU64,
}

impl ConnState {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            calls: AtomicU64::new(0),
            active: AtomicU64::new(0),
            last_call_ms: AtomicU64::new(0),
            sending: Mutex::new(BTreeMap::new()),
            next_send: AtomicU64::new(0),
            sends: AtomicU64::new(0),
        }
    }

    fn since_opened(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    fn begin(&self) {
        self.calls.fetch_add(1, Ordering::AcqRel);
        self.active.fetch_add(1, Ordering::AcqRel);
        self.last_call_ms
            .store(self.since_opened(), Ordering::Release);
    }

    fn end(&self) {
        self.last_call_ms
            .store(self.since_opened(), Ordering::Release);
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    /// Why the connection should close now, or when to look again.
    fn verdict(&self, limits: &ConnLimits) -> Result<Instant, &'static str> {
        let calls = self.calls_verdict(limits)?;
        let oldest_send = match self.sends.load(Ordering::Acquire) {
            0 => None,
            _ => self.sending.lock().first_key_value().map(|(_, &ms)| ms),
        };
        match oldest_send {
            Some(began) => {
                let deadline = self.opened + Duration::from_millis(began) + limits.send;
                if Instant::now() >= deadline {
                    Err("send_timeout")
                } else {
                    Ok(calls.min(deadline))
                }
            }
            None => Ok(calls),
        }
    }

    fn calls_verdict(&self, limits: &ConnLimits) -> Result<Instant, &'static str> {
        if self.calls.load(Ordering::Acquire) == 0 {
            let deadline = self.opened + limits.first_request;
            return if Instant::now() >= deadline {
                Err("first_request_timeout")
            } else {
                Ok(deadline)
            };
        }
        if self.active.load(Ordering::Acquire) > 0 {
            return Ok(Instant::now() + limits.idle);
        }
        let idle_from =
            self.opened + Duration::from_millis(self.last_call_ms.load(Ordering::Acquire));
        let deadline = idle_from + limits.idle;
        if Instant::now() >= deadline {
            Err("idle_timeout")
        } else {
            Ok(deadline)
        }
    }
}

/// The open connections of a listener by peer address, so a call can find its connection.
/// Holds at most `--max-connections` entries.
#[derive(Debug, Default)]
pub struct Connections {
    by_peer: Mutex<HashMap<SocketAddr, Arc<ConnState>>>,
}

/// The address a request came from, as its connection reported it.
pub fn peer(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<TcpConnectInfo>()
        .and_then(|info| info.remote_addr)
}

/// A response being sent on a connection, which must be taken within `--send-timeout`.
#[derive(Debug)]
pub struct SendMark(Option<(Arc<ConnState>, u64)>);

impl Drop for SendMark {
    fn drop(&mut self) {
        if let Some((state, serial)) = self.0.take()
            && state.sending.lock().remove(&serial).is_some()
        {
            state.sends.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A call in progress on a connection; the connection is busy until it drops.
#[derive(Debug)]
pub struct CallMark(Option<Arc<ConnState>>);

impl CallMark {
    /// A call that does not count as the connection's activity.
    pub fn none() -> Self {
        Self(None)
    }
}

impl Drop for CallMark {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.end();
        }
    }
}

impl Connections {
    /// Marks the connection `extensions` came in on busy until the mark drops.
    pub fn begin(&self, extensions: &http::Extensions) -> CallMark {
        let state = peer(extensions).and_then(|peer| self.by_peer.lock().get(&peer).cloned());
        if let Some(state) = &state {
            state.begin();
        }
        CallMark(state)
    }

    /// Starts the `--send-timeout` clock for a response on the connection from `peer`; it
    /// stops when the mark drops (the response's last frame is out).
    pub fn begin_send(&self, peer: Option<SocketAddr>) -> SendMark {
        let state = peer.and_then(|peer| self.by_peer.lock().get(&peer).cloned());
        SendMark(state.map(|state| {
            let serial = state.next_send.fetch_add(1, Ordering::AcqRel);
            let began = state.since_opened();
            state.sending.lock().insert(serial, began);
            state.sends.fetch_add(1, Ordering::AcqRel);
            (state, serial)
        }))
    }

    fn register(&self, peer: SocketAddr) -> Arc<ConnState> {
        let state = Arc::new(ConnState::new());
        self.by_peer.lock().insert(peer, state.clone());
        state
    }

    /// Forgets `state`'s entry, and only it: a new connection from the same address (a
    /// reused port) may already have taken the key.
    fn forget(&self, peer: &SocketAddr, state: &Arc<ConnState>) {
        let mut by_peer = self.by_peer.lock();
        if by_peer.get(peer).is_some_and(|s| Arc::ptr_eq(s, state)) {
            by_peer.remove(peer);
        }
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection's place under the cap, from its accept (before any handshake) to its close.
struct Place {
    peer: SocketAddr,
    state: Arc<ConnState>,
    connections: Arc<Connections>,
    open: IntGauge,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.connections.forget(&self.peer, &self.state);
        self.open.dec();
    }
}

/// An accepted connection, as tonic serves it.
pub struct Conn {
    io: Io,
    local: Option<SocketAddr>,
    state: Arc<ConnState>,
    limits: ConnLimits,
    check: Pin<Box<Sleep>>,
    /// Since when the connection has had bytes to write that the peer would not take.
    write_stalled: Option<Instant>,
    closed: IntCounterVec,
    place: Place,
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: Some(self.place.peer),
        }
    }
}

/// Marks calls on one connection, for a protocol served outside tonic (Kafka's): the
/// connection's idle and first-request deadlines count them as tonic's calls are counted.
#[derive(Debug, Clone)]
pub struct CallMarks(Arc<ConnState>);

impl CallMarks {
    /// A call in progress until the mark drops.
    pub fn begin(&self) -> CallMark {
        self.0.begin();
        CallMark(Some(self.0.clone()))
    }

    /// Starts the `--send-timeout` clock for an answer that holds a charge; it stops when the
    /// mark drops (the answer is written).
    pub fn begin_send(&self) -> SendMark {
        let state = &self.0;
        let serial = state.next_send.fetch_add(1, Ordering::AcqRel);
        let began = state.since_opened();
        state.sending.lock().insert(serial, began);
        state.sends.fetch_add(1, Ordering::AcqRel);
        SendMark(Some((state.clone(), serial)))
    }
}

impl Conn {
    /// Where the connection comes from.
    pub fn peer(&self) -> SocketAddr {
        self.place.peer
    }

    /// What marks this connection's calls in progress.
    pub fn call_marks(&self) -> CallMarks {
        CallMarks(self.state.clone())
    }

    /// Closes the connection (an error from its read or write) once a limit says so. Looked
    /// at on every read and write: a response that starts sending can bring the next deadline
    /// nearer than the timer's.
    fn poll_limits(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let verdict =
                self.state
                    .verdict(&self.limits)
                    .and_then(|next| match self.write_stalled {
                        Some(since) if Instant::now() >= since + self.limits.write_stall => {
                            Err("write_timeout")
                        }
                        Some(since) => Ok(next.min(since + self.limits.write_stall)),
                        None => Ok(next),
                    });
            match verdict {
                Ok(next) => {
                    if next != self.check.deadline() {
                        self.check.as_mut().reset(next);
                    }
                }
                Err(reason) => {
                    self.closed.with_label_values(&[reason]).inc();
                    tracing::debug!(peer = %self.place.peer, reason, "closing a connection");
                    return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, reason));
                }
            }
            ready!(self.check.as_mut().poll(cx));
        }
    }

    /// Notes whether a write went through, and fails it once the peer has taken nothing for
    /// too long (or another deadline passed while the connection could only wait to write).
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                self.write_stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                self.write_stalled.get_or_insert_with(Instant::now);
                match self.poll_limits(cx) {
                    Poll::Ready(error) => Poll::Ready(Err(error)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Poll::Ready(error) = this.poll_limits(cx) {
            return Poll::Ready(Err(error));
        }
        match &mut this.io {
            Io::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = match &mut this.io {
            Io::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        };
        this.after_write(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = match &mut this.io {
            Io::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        };
        this.after_write(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = match &mut this.io {
            Io::Plain(io) => Pin::new(io).poll_flush(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        };
        this.after_write(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The places under `--max-connections`, which every listener of a process may share: a
/// star's Kafka listener takes its connections' places from the same cap as its gRPC one.
#[derive(Debug, Clone)]
pub struct Places(Arc<Semaphore>);

impl Places {
    pub fn new(limits: &ConnLimits) -> Self {
        Self(Arc::new(Semaphore::new(limits.max_connections.max(1))))
    }
}

/// Accepts connections on `listener` within `limits`, with TLS when `tls` is given, until
/// `stopping`; yields them as tonic's incoming stream.
pub fn incoming(
    listener: TcpListener,
    tls: Option<ReloadingTls>,
    limits: ConnLimits,
    connections: Arc<Connections>,
    metrics: ConnMetrics,
    stopping: CancellationToken,
) -> impl futures::Stream<Item = io::Result<Conn>> {
    let places = Places::new(&limits);
    incoming_within(
        listener,
        tls,
        limits,
        places,
        connections,
        metrics,
        stopping,
    )
}

/// `incoming`, with the connections' places taken from `places`.
pub fn incoming_within(
    listener: TcpListener,
    tls: Option<ReloadingTls>,
    limits: ConnLimits,
    places: Places,
    connections: Arc<Connections>,
    metrics: ConnMetrics,
    stopping: CancellationToken,
) -> impl futures::Stream<Item = io::Result<Conn>> {
    let (accepted, stream) = mpsc::channel(ACCEPTED_QUEUE);
    metrics.capacity.set(limits.max_connections as i64);
    tokio::spawn(accept_loop(
        listener,
        tls,
        limits,
        places,
        connections,
        metrics,
        accepted,
        stopping,
    ));
    tokio_stream::wrappers::ReceiverStream::new(stream)
}

#[allow(
    clippy::too_many_arguments,
    reason = "one listener's whole set-up, passed once"
)]
async fn accept_loop(
    listener: TcpListener,
    tls: Option<ReloadingTls>,
    limits: ConnLimits,
    places: Places,
    connections: Arc<Connections>,
    metrics: ConnMetrics,
    accepted: mpsc::Sender<io::Result<Conn>>,
    stopping: CancellationToken,
) {
    let places = places.0;
    let refusals = ShedLog::new(nova_core::clock::Clock::system());
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stopping.cancelled() => return,
            _ = accepted.closed() => return,
            next = listener.accept() => match next {
                Ok(next) => next,
                Err(error) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    if let Some(unlogged) = refusals.admit("accept") {
                        tracing::warn!(unlogged_since_last = unlogged, "accepting a connection failed: {error}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            metrics
                .refused
                .with_label_values(&["max_connections"])
                .inc();
            if let Some(unlogged) = refusals.admit("max_connections") {
                tracing::warn!(
                    cap = "max_connections",
                    limit = limits.max_connections,
                    peer = %peer.ip(),
                    unlogged_since_last = unlogged,
                    "refused a connection at --max-connections={}: every place is taken; open \
                     connections are never cut",
                    limits.max_connections
                );
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().ok();
        let state = connections.register(peer);
        metrics.open.inc();
        let place = Place {
            peer,
            state: state.clone(),
            connections: connections.clone(),
            open: metrics.open.clone(),
            _permit: place,
        };
        let closed = metrics.closed.clone();
        // Every deadline counts from the accept, the TLS handshake's time included.
        let first_check = state.opened + limits.first_request;
        let conn = move |io| Conn {
            io,
            local,
            state,
            limits,
            check: Box::pin(tokio::time::sleep_until(first_check)),
            write_stalled: None,
            closed,
            place,
        };
        match &tls {
            None => {
                metrics.accepted.inc();
                if accepted.send(Ok(conn(Io::Plain(tcp)))).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                // The handshake runs beside the accept loop, within the connection's place
                // (dropped with the task if it fails).
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
                let handshake = tokio::time::timeout(limits.first_request, acceptor.accept(tcp));
                let accepted = accepted.clone();
                let refused = metrics.refused.clone();
                let counted = metrics.accepted.clone();
                tokio::spawn(async move {
                    let outcome = match handshake.await {
                        Ok(Ok(io)) => Ok(io),
                        Ok(Err(error)) => Err(error.to_string()),
                        Err(_) => Err("no handshake within --first-request-timeout".to_owned()),
                    };
                    match outcome {
                        Ok(io) => {
                            counted.inc();
                            let _ = accepted.send(Ok(conn(Io::Tls(Box::new(io))))).await;
                        }
                        Err(problem) => {
                            refused.with_label_values(&["tls_handshake"]).inc();
                            tracing::debug!(%peer, "TLS handshake failed: {problem}");
                        }
                    }
                });
            }
        }
    }
}
