//! Holding the budgets across the transport: appends are charged from their gRPC length prefix,
//! before their bodies are buffered, and a read's charge is held until its response is sent.
//!
//! tonic would buffer each append message whole in a buffer of its own, reserved as soon as it
//! reads the message's prefix and kept (at the size of the largest message) for the session's
//! life. So this layer takes append messages out of tonic's hands: it follows the gRPC framing
//! of an `Append` body, and at each prefix waits until the admission buffer grants the
//! message's charge, copies the message into a buffer of exactly its size, and queues it with
//! its charge for the handler, passing tonic only an empty message in its place.
//!
//! While a charge waits nothing more of the stream is read, so HTTP/2 flow control stops the
//! producer: the transport holds at most its stream window, and this layer at most the one DATA
//! frame it was given (16 KiB, HTTP/2's default frame size). The message before is always handed
//! over first, so a session never waits on a charge for a message behind one it has not
//! finished. Calls other than `Append` are held to small messages (`nova_server::net::small`).
//!
//! A message is authorised before it is charged: its stream's name is its first field, so the
//! layer reads that far (at most a few hundred bytes) and refuses, without charging or keeping
//! any of it, a message for a stream the session's token may not append to. And while a
//! message arrives, its charge also counts against its token's share of the buffer
//! (`--max-client-share-percent`; `nova_server::net::shares`), taken before the buffer's: a token
//! that sends prefixes and trickles bodies holds at most that, never the whole buffer, and its
//! further messages wait on its own share. A refused message is skipped on the wire and answered in its
//! place in the session's order.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use parking_lot::Mutex;

use nova_chain::admission::{AdmissionBuffer, Admitted, received_charge_within};
use nova_core::limits::MAX_STREAM_NAME_BYTES;
use nova_proto::RequestError;
use nova_server::net::recycle::{Buffer, Recycler};
use nova_server::net::shares::{Share, Shares, holder};
use nova_server::net::small::{PREFIX_LEN, SmallMessages, ended_inside_a_message};
use nova_server::net::{Access, Principal, Scope};

/// The gRPC path whose requests are charged.
const APPEND_PATH: &str = "/nova.v1.Nova/Append";
/// How much of a message's start is read to find its stream's name: its tag, its length (two
/// bytes at most for a name within the limit) and the name.
const NAME_PEEK: usize = 1 + 2 + MAX_STREAM_NAME_BYTES;
/// A message whose charge was granted must arrive whole within this long, plus a second for
/// every `MESSAGE_MIN_RATE` bytes of it. Its charge holds admission room others wait for, so a
/// producer that stalls (or trickles) mid-message loses its session. The deadline is fixed when
/// the charge is granted: a byte now and then does not move it.
pub const MESSAGE_GRACE: Duration = Duration::from_secs(30);
/// The slowest rate a message may arrive at, in bytes per second, past `MESSAGE_GRACE`.
pub const MESSAGE_MIN_RATE: u64 = 1 << 20;

/// What the layer made of one message, for the handler.
#[derive(Debug)]
pub enum Charged {
    /// Assembled and charged.
    Message(Admitted, Bytes),
    /// Refused before it was charged (skipped on the wire): answer it with `error`.
    Refused { error: RequestError, stream: String },
}

/// Messages assembled and charged (or refused), waiting for the handler, in arrival order. At
/// most a few: the next message is read only once the handler has taken the one before (it
/// waits for tonic, which waits for the placeholder standing for each message).
#[derive(Debug, Default)]
pub struct Charges(Mutex<VecDeque<Charged>>);

impl Charges {
    /// The next message and its charge.
    pub fn take(&self) -> Option<Charged> {
        self.0.lock().pop_front()
    }
}

/// What tonic receives in place of each assembled message: an empty gRPC message, so its own
/// buffer never holds (or keeps) a batch.
const PLACEHOLDER: [u8; PREFIX_LEN] = [0; PREFIX_LEN];

#[derive(Debug)]
enum Framing {
    /// Reading a prefix; `got` bytes of it so far.
    Prefix { bytes: [u8; PREFIX_LEN], got: usize },
    /// Reading the start of a message of `len` bytes, up to its stream's name.
    Naming { len: u64, peek: Vec<u8> },
    /// An append message of `len` bytes, of which `peek` has arrived, waits for its charge.
    Charging { len: u64, peek: Vec<u8> },
    /// Skipping the rest of a refused message.
    Skipping { remaining: u64 },
    /// Copying a charged append message into a buffer of its size (recycled when one fits).
    Assembling { remaining: u64, buf: Buffer },
    /// Passing a message through to tonic untouched (other calls; messages over the limit,
    /// which tonic refuses at their prefix).
    Passing { remaining: u64 },
}

type Pending = Pin<Box<dyn Future<Output = (Option<Share>, Admitted)> + Send>>;

/// What a session's body charges, and who for.
#[derive(Clone)]
struct Session {
    admission: AdmissionBuffer,
    charges: Arc<Charges>,
    limits: TransportLimits,
    /// What each client holds of the buffer in messages still arriving.
    receiving: Arc<Shares>,
    /// Who the session's messages are charged to: its token (none without tokens).
    holder: Option<String>,
    principal: Option<Arc<Principal>>,
    access: Access,
    recycler: Recycler,
}

/// The sizes the charging layer works with, from the batch caps.
#[derive(Debug, Clone, Copy)]
pub struct TransportLimits {
    /// The largest message the transport accepts; a larger one is refused by tonic at its
    /// prefix, before it is buffered, so it is not charged.
    pub max_message: u64,
    /// The largest fragment a batch within the caps encodes to.
    pub largest_fragment: u64,
}

pub struct ChargedBody {
    inner: tonic::body::Body,
    session: Session,
    framing: Framing,
    /// Bytes received and not yet processed (at most one DATA frame).
    held: Option<Bytes>,
    pending: Option<Pending>,
    /// The message's part of the client's share, from its prefix until it is whole.
    share: Option<Share>,
    /// The charge of the message being assembled.
    granted: Option<Admitted>,
    /// While a message is being assembled: when its session is ended if it is not whole yet.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// An error to report once what came before it has been handed on; after it, the body ends.
    failed: Option<tonic::Status>,
    done: bool,
}

fn status(error: RequestError) -> tonic::Status {
    error.into()
}

fn fresh_prefix() -> Framing {
    Framing::Prefix {
        bytes: [0; PREFIX_LEN],
        got: 0,
    }
}

/// What the start of a message says of its stream.
enum Naming {
    /// More bytes are needed to tell.
    More,
    /// The message does not start with a stream name this layer can read (a field order other
    /// than the usual, or a malformed message): it is charged, and authorised by the handler.
    Unknown,
    Name(String),
}

/// Reads the stream's name from the start of an `AppendRequest` (field 1, length-delimited).
fn naming(peek: &[u8], len: u64) -> Naming {
    const STREAM_TAG: u8 = 0x0a;
    let Some(&tag) = peek.first() else {
        return Naming::More;
    };
    if tag != STREAM_TAG {
        return Naming::Unknown;
    }
    // The name's length, a varint of at most two bytes for names within the limit.
    let mut name_len = 0u64;
    let mut at = 1;
    loop {
        let Some(&byte) = peek.get(at) else {
            return Naming::More;
        };
        name_len |= u64::from(byte & 0x7f) << (7 * (at - 1));
        at += 1;
        if byte & 0x80 == 0 {
            break;
        }
        if at > 2 {
            return Naming::Unknown;
        }
    }
    let end = at as u64 + name_len;
    if name_len as usize > MAX_STREAM_NAME_BYTES || end > len {
        return Naming::Unknown;
    }
    if (peek.len() as u64) < end {
        return Naming::More;
    }
    match std::str::from_utf8(&peek[at..end as usize]) {
        Ok(name) => Naming::Name(name.to_owned()),
        Err(_) => Naming::Unknown,
    }
}

impl ChargedBody {
    fn new(inner: tonic::body::Body, session: Session) -> Self {
        Self {
            inner,
            session,
            framing: fresh_prefix(),
            held: None,
            pending: None,
            share: None,
            granted: None,
            deadline: None,
            failed: None,
            done: false,
        }
    }

    /// Processes `data`, returning what tonic may see now. Stops at a message that must wait
    /// for its charge, keeping the rest in `held`.
    fn process(&mut self, mut data: Bytes) -> Result<Bytes, tonic::Status> {
        let mut out = BytesMut::new();
        while !data.is_empty() {
            match &mut self.framing {
                Framing::Passing { remaining } => {
                    let take = (*remaining).min(data.len() as u64) as usize;
                    out.extend_from_slice(&data.split_to(take));
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        self.framing = fresh_prefix();
                    }
                }
                Framing::Skipping { remaining } => {
                    let take = (*remaining).min(data.len() as u64) as usize;
                    data.advance(take);
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        self.framing = fresh_prefix();
                    }
                }
                Framing::Assembling { remaining, buf } => {
                    let take = (*remaining).min(data.len() as u64) as usize;
                    buf.extend_from_slice(&data.split_to(take));
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        self.finish_message(&mut out);
                    }
                }
                Framing::Prefix { bytes, got } => {
                    bytes[*got] = data[0];
                    *got += 1;
                    data.advance(1);
                    if *got < PREFIX_LEN {
                        continue;
                    }
                    let prefix = *bytes;
                    if prefix[0] != 0 {
                        return Err(status(RequestError::InvalidRequest(
                            "compressed messages are not accepted; send them uncompressed".into(),
                        )));
                    }
                    let len = (&prefix[1..]).get_u32() as u64;
                    if len > self.session.limits.max_message {
                        // tonic refuses it at its prefix, before it is buffered.
                        out.extend_from_slice(&prefix);
                        self.framing = Framing::Passing { remaining: len };
                        continue;
                    }
                    self.framing = Framing::Naming {
                        len,
                        peek: Vec::new(),
                    };
                    if len == 0 && self.named(Naming::Unknown, &mut out) {
                        if !data.is_empty() {
                            self.held = Some(data);
                        }
                        return Ok(out.freeze());
                    }
                }
                Framing::Naming { len, peek } => {
                    let want = (*len - peek.len() as u64).min(NAME_PEEK as u64 - peek.len() as u64)
                        as usize;
                    let take = want.min(data.len());
                    peek.extend_from_slice(&data.split_to(take));
                    let told = match naming(peek, *len) {
                        Naming::More if peek.len() as u64 == *len || peek.len() >= NAME_PEEK => {
                            Naming::Unknown
                        }
                        Naming::More => continue,
                        told => told,
                    };
                    if self.named(told, &mut out) {
                        if !data.is_empty() {
                            self.held = Some(data);
                        }
                        return Ok(out.freeze());
                    }
                }
                Framing::Charging { .. } => {
                    unreachable!("no data is processed while a charge is pending")
                }
            }
        }
        Ok(out.freeze())
    }

    /// The message's stream is known (or cannot be told early): refuse it, or start charging
    /// it. True when it waits for its charge.
    fn named(&mut self, told: Naming, out: &mut BytesMut) -> bool {
        let Framing::Naming { len, peek } = std::mem::replace(&mut self.framing, fresh_prefix())
        else {
            return false;
        };
        let session = &self.session;
        let charge = received_charge_within(len, session.limits.largest_fragment);
        // For the refusal's log line and tally, cut as the handler cuts a name it logs.
        let stream = match &told {
            Naming::Name(name) => name.chars().take(128).collect(),
            _ => String::new(),
        };
        let refusal = match &told {
            Naming::Name(name) => session
                .access
                .check(session.principal.as_deref(), Scope::Append, name)
                .err(),
            _ => None,
        };
        if let Some(error) = refusal {
            // Answered in its place; the rest of it is skipped, never kept.
            session
                .charges
                .0
                .lock()
                .push_back(Charged::Refused { error, stream });
            out.extend_from_slice(&PLACEHOLDER);
            let remaining = len - peek.len() as u64;
            if remaining > 0 {
                self.framing = Framing::Skipping { remaining };
            }
            return false;
        }
        // The token's share first, then the buffer: a token whose messages still arriving hold
        // its share waits on its own, and holds nothing of the buffer meanwhile.
        let admission = session.admission.clone();
        let (shares, holder) = (session.receiving.clone(), session.holder.clone());
        self.pending = Some(Box::pin(async move {
            let share = match holder {
                Some(holder) => Some(shares.take_waiting(&holder, charge).await),
                None => None,
            };
            (share, admission.admit(charge).await)
        }));
        self.framing = Framing::Charging { len, peek };
        true
    }

    /// The charge is granted: assemble the message (or hand over an empty one).
    fn start_message(&mut self, admitted: Admitted, out: &mut BytesMut) {
        let Framing::Charging { len, peek } = std::mem::replace(&mut self.framing, fresh_prefix())
        else {
            return;
        };
        self.granted = Some(admitted);
        let mut buf = self.session.recycler.buffer(len as usize);
        buf.extend_from_slice(&peek);
        let remaining = len - peek.len() as u64;
        self.framing = Framing::Assembling { remaining, buf };
        if remaining == 0 {
            self.finish_message(out);
        } else {
            let allowed = MESSAGE_GRACE + Duration::from_secs(len / MESSAGE_MIN_RATE);
            self.deadline = Some(Box::pin(tokio::time::sleep(allowed)));
        }
    }

    /// The message is whole: queue it with its charge for the handler, and let tonic see a
    /// placeholder in its place.
    fn finish_message(&mut self, out: &mut BytesMut) {
        let framing = std::mem::replace(&mut self.framing, fresh_prefix());
        self.deadline = None;
        // Whole: no longer arriving, so no longer on the client's share.
        self.share = None;
        if let (Framing::Assembling { buf, .. }, Some(admitted)) = (framing, self.granted.take()) {
            self.session
                .charges
                .0
                .lock()
                .push_back(Charged::Message(admitted, buf.freeze()));
            out.extend_from_slice(&PLACEHOLDER);
        }
    }
}

impl ChargedBody {
    /// Whether the stream is between messages (or has not started one).
    fn between_messages(&self) -> bool {
        matches!(self.framing, Framing::Prefix { got: 0, .. })
    }

    /// Fails the body once what was already processed has been handed on.
    fn fail(
        &mut self,
        status: tonic::Status,
        out: BytesMut,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.pending = None;
        self.held = None;
        self.deadline = None;
        self.share = None;
        if out.is_empty() {
            self.done = true;
            Poll::Ready(Some(Err(status)))
        } else {
            self.failed = Some(status);
            Poll::Ready(Some(Ok(Frame::data(out.freeze()))))
        }
    }
}

impl HttpBody for ChargedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(status) = this.failed.take() {
            this.done = true;
            return Poll::Ready(Some(Err(status)));
        }
        loop {
            let mut out = BytesMut::new();
            if let Some(pending) = &mut this.pending {
                let (share, admitted) = ready!(pending.as_mut().poll(cx));
                this.share = share;
                this.pending = None;
                this.start_message(admitted, &mut out);
            }
            if let Some(data) = this.held.take() {
                match this.process(data) {
                    Ok(more) => out.extend_from_slice(&more),
                    Err(status) => return this.fail(status, out),
                }
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
            if this.pending.is_some() {
                continue;
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    if let Some(deadline) = &mut this.deadline {
                        ready!(deadline.as_mut().poll(cx));
                        let error = RequestError::Unavailable(format!(
                            "a message whose admission charge this session holds did not arrive \
                             whole within {}s plus a second per MiB; reconnect and send it again",
                            MESSAGE_GRACE.as_secs()
                        ));
                        return this.fail(status(error), BytesMut::new());
                    }
                    return Poll::Pending;
                }
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.held = Some(data),
                    Err(trailers) if this.between_messages() => {
                        return Poll::Ready(Some(Ok(trailers)));
                    }
                    Err(_) => {
                        return this.fail(status(ended_inside_a_message()), BytesMut::new());
                    }
                },
                None if !this.between_messages() => {
                    return this.fail(status(ended_inside_a_message()), BytesMut::new());
                }
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.held.is_none()
                && self.pending.is_none()
                && self.failed.is_none()
                && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Wraps `Append` request bodies in a charging `ChargedBody`, other requests in a limiting one.
/// Runs inside the authentication layer: a call's token is known.
/// (A `Read`'s charge is held until its response is sent by `nova_server::net::hold`.)
#[derive(Clone)]
pub struct ChargeLayer {
    admission: AdmissionBuffer,
    limits: TransportLimits,
    receiving: Arc<Shares>,
    access: Access,
    small: SmallMessages,
    recycler: Recycler,
}

impl ChargeLayer {
    /// A token may hold its share (`receiving`, of `--max-client-share-percent`) of the
    /// buffer in messages still arriving; the Kafka listener's requests take from the same.
    /// Messages are copied into buffers from `recycler` when one fits.
    pub fn sharing(
        admission: AdmissionBuffer,
        limits: TransportLimits,
        access: Access,
        small: SmallMessages,
        receiving: Arc<Shares>,
        recycler: Recycler,
    ) -> Self {
        Self {
            receiving,
            admission,
            limits,
            access,
            small,
            recycler,
        }
    }
}

impl<S> tower_layer::Layer<S> for ChargeLayer {
    type Service = ChargeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ChargeService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ChargeService<S> {
    inner: S,
    layer: ChargeLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for ChargeService<S>
where
    S: tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let principal = parts.extensions.get::<Arc<Principal>>().cloned();
        let peer = nova_server::net::conn::peer(&parts.extensions);
        let body = if parts.uri.path() == APPEND_PATH {
            let charges = Arc::new(Charges::default());
            parts.extensions.insert(charges.clone());
            let layer = &self.layer;
            tonic::body::Body::new(ChargedBody::new(
                body,
                Session {
                    admission: layer.admission.clone(),
                    charges,
                    limits: layer.limits,
                    receiving: layer.receiving.clone(),
                    holder: holder(principal.as_deref()),
                    principal,
                    access: layer.access.clone(),
                    recycler: layer.recycler.clone(),
                },
            ))
        } else {
            self.layer.small.limit(body, principal.as_deref(), peer)
        };
        Box::pin(self.inner.call(http::Request::from_parts(parts, body)))
    }
}

#[cfg(test)]
mod tests;
