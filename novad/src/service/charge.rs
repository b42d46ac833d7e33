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
//! finished. Calls other than `Append` pass through, held to small messages.

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
use nova_proto::RequestError;

/// The gRPC path whose requests are charged.
const APPEND_PATH: &str = "/nova.v1.Nova/Append";
const PREFIX_LEN: usize = 5;
/// The largest message any other call may send: reads and admin calls are small, and their
/// bodies are not charged, so a large one is refused before it is buffered.
pub const SMALL_MESSAGE_LIMIT: u64 = 64 * 1024;
/// A message whose charge was granted must arrive whole within this long, plus a second for
/// every `MESSAGE_MIN_RATE` bytes of it. Its charge holds admission room others wait for, so a
/// producer that stalls (or trickles) mid-message loses its session. The deadline is fixed when
/// the charge is granted: a byte now and then does not move it.
pub const MESSAGE_GRACE: Duration = Duration::from_secs(30);
/// The slowest rate a message may arrive at, in bytes per second, past `MESSAGE_GRACE`.
pub const MESSAGE_MIN_RATE: u64 = 1 << 20;

/// Messages assembled and charged, waiting for the handler, in arrival order. At most one or
/// two: the next message is read only once the handler has taken the one before (it waits for
/// tonic, which waits for the placeholder standing for each message).
#[derive(Debug, Default)]
pub struct Charges(Mutex<VecDeque<(Admitted, Bytes)>>);

impl Charges {
    /// The next message and its charge.
    pub fn take(&self) -> Option<(Admitted, Bytes)> {
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
    /// An append message of `len` bytes waits for its charge.
    Charging { len: u64 },
    /// Copying a charged append message into a buffer of exactly its size.
    Assembling { remaining: u64, buf: BytesMut },
    /// Passing a message through to tonic untouched (other calls; messages over the limit,
    /// which tonic refuses at their prefix).
    Passing { remaining: u64 },
}

type Pending = Pin<Box<dyn Future<Output = Admitted> + Send>>;

/// What the body does at each message's prefix.
#[derive(Clone)]
enum Mode {
    /// Append: charge the admission buffer, then assemble the message outside tonic.
    Charge {
        admission: AdmissionBuffer,
        charges: Arc<Charges>,
        limits: TransportLimits,
    },
    /// Any other call: refuse a message over `SMALL_MESSAGE_LIMIT` before it is buffered.
    Limit,
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
    mode: Mode,
    framing: Framing,
    /// Bytes received and not yet processed (at most one DATA frame).
    held: Option<Bytes>,
    pending: Option<Pending>,
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

impl ChargedBody {
    fn new(inner: tonic::body::Body, mode: Mode) -> Self {
        Self {
            inner,
            mode,
            framing: fresh_prefix(),
            held: None,
            pending: None,
            granted: None,
            deadline: None,
            failed: None,
            done: false,
        }
    }

    /// Processes `data`, returning what tonic may see now. Stops at a prefix that must wait for
    /// its charge, keeping the rest in `held`.
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
                    // Small messages of other calls pass through to tonic; so does an append
                    // over the transport's limit, which tonic refuses at its prefix. Any other
                    // append waits for its charge.
                    let charged = match &self.mode {
                        Mode::Limit if len > SMALL_MESSAGE_LIMIT => {
                            return Err(status(RequestError::MessageTooLarge(format!(
                                "a message of {len} bytes, over the {SMALL_MESSAGE_LIMIT} bytes \
                                 this call accepts"
                            ))));
                        }
                        Mode::Charge {
                            admission, limits, ..
                        } if len <= limits.max_message => Some((
                            admission.clone(),
                            received_charge_within(len, limits.largest_fragment),
                        )),
                        Mode::Limit | Mode::Charge { .. } => None,
                    };
                    if let Some((admission, charge)) = charged {
                        self.pending = Some(Box::pin(async move { admission.admit(charge).await }));
                        self.framing = Framing::Charging { len };
                        if !data.is_empty() {
                            self.held = Some(data);
                        }
                        return Ok(out.freeze());
                    }
                    out.extend_from_slice(&prefix);
                    self.framing = Framing::Passing { remaining: len };
                    if len == 0 {
                        self.framing = fresh_prefix();
                    }
                }
                Framing::Charging { .. } => {
                    unreachable!("no data is processed while a charge is pending")
                }
            }
        }
        Ok(out.freeze())
    }

    /// The charge is granted: assemble the message (or hand over an empty one).
    fn start_message(&mut self, admitted: Admitted, out: &mut BytesMut) {
        let Framing::Charging { len } = self.framing else {
            return;
        };
        self.granted = Some(admitted);
        self.framing = Framing::Assembling {
            remaining: len,
            buf: BytesMut::with_capacity(len as usize),
        };
        if len == 0 {
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
        if let (Framing::Assembling { buf, .. }, Some(admitted), Mode::Charge { charges, .. }) =
            (framing, self.granted.take(), &self.mode)
        {
            charges.0.lock().push_back((admitted, buf.freeze()));
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
                let admitted = ready!(pending.as_mut().poll(cx));
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

fn ended_inside_a_message() -> RequestError {
    RequestError::InvalidRequest(
        "the stream ended inside a message; the message was not applied".into(),
    )
}

/// Wraps `Append` request bodies in a charging `ChargedBody`, other requests in a limiting one.
/// (A `Read`'s charge is held until its response is sent by `nova_core::net::hold`.)
#[derive(Clone)]
pub struct ChargeLayer {
    admission: AdmissionBuffer,
    limits: TransportLimits,
}

impl ChargeLayer {
    pub fn new(admission: AdmissionBuffer, limits: TransportLimits) -> Self {
        Self { admission, limits }
    }
}

impl<S> tower_layer::Layer<S> for ChargeLayer {
    type Service = ChargeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ChargeService {
            inner,
            admission: self.admission.clone(),
            limits: self.limits,
        }
    }
}

#[derive(Clone)]
pub struct ChargeService<S> {
    inner: S,
    admission: AdmissionBuffer,
    limits: TransportLimits,
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
        let mode = if parts.uri.path() == APPEND_PATH {
            let charges = Arc::new(Charges::default());
            parts.extensions.insert(charges.clone());
            Mode::Charge {
                admission: self.admission.clone(),
                charges,
                limits: self.limits,
            }
        } else {
            Mode::Limit
        };
        let body = tonic::body::Body::new(ChargedBody::new(body, mode));
        Box::pin(self.inner.call(http::Request::from_parts(parts, body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::BodyExt;
    use nova_chain::admission::received_charge;
    use nova_core::metrics::Metrics;

    const LIMITS: TransportLimits = TransportLimits {
        max_message: 1 << 20,
        largest_fragment: u64::MAX,
    };

    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    fn body(wire: &[u8], chunk: usize) -> tonic::body::Body {
        let chunks: Vec<Result<Frame<Bytes>, tonic::Status>> = wire
            .chunks(chunk)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            chunks,
        )))
    }

    /// Feeds `wire` in chunks of `chunk` bytes through a charged body; returns what tonic saw
    /// and the messages queued for the handler.
    async fn pass(wire: &[u8], chunk: usize, admission: AdmissionBuffer) -> (Vec<u8>, Vec<Bytes>) {
        let charges = Arc::new(Charges::default());
        let mode = Mode::Charge {
            admission: admission.clone(),
            charges: charges.clone(),
            limits: LIMITS,
        };
        let mut body = ChargedBody::new(body(wire, chunk), mode);
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            out.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        let queued = charges.0.lock();
        assert_eq!(
            queued.iter().map(|(a, _)| a.charged()).sum::<u64>(),
            admission.budget().in_use(),
            "the queue holds every charge taken"
        );
        let messages = queued.iter().map(|(_, m)| m.clone()).collect();
        (out, messages)
    }

    #[tokio::test]
    async fn every_message_is_charged_and_assembled_in_order() {
        let messages: [&[u8]; 4] = [b"hello", b"", &[7u8; 100], b"x"];
        let wire = framed(&messages);
        for chunk in [1, 2, 3, 5, 7, 64, 1000] {
            let admission = AdmissionBuffer::new(
                1 << 20,
                Metrics::new().admission,
                nova_core::clock::Clock::system(),
            );
            let (out, queued) = pass(&wire, chunk, admission.clone()).await;
            assert_eq!(
                out,
                framed(&[b"", b"", b"", b""]),
                "tonic sees placeholders"
            );
            assert_eq!(queued, messages, "chunks of {chunk}");
            assert_eq!(admission.budget().in_use(), 0, "released with the session");
        }
    }

    /// A message is not taken in until its charge is granted.
    #[tokio::test]
    async fn a_message_waits_for_its_charge() {
        let admission = AdmissionBuffer::new(
            received_charge(10),
            Metrics::new().admission,
            nova_core::clock::Clock::system(),
        );
        let hold = admission.admit(received_charge(10)).await;
        let wire = framed(&[&[1u8; 10]]);
        let passing = {
            let wire = wire.clone();
            let admission = admission.clone();
            tokio::spawn(async move { pass(&wire, 64, admission).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!passing.is_finished(), "the message waits for its charge");
        drop(hold);
        let (_, queued) = passing.await.unwrap();
        assert_eq!(queued, [Bytes::from_static(&[1u8; 10])]);
    }

    /// A prefix over the transport's limit is not charged (tonic refuses the message), nor is
    /// a compressed one accepted.
    #[tokio::test]
    async fn oversized_and_compressed_messages_are_not_charged() {
        let admission = AdmissionBuffer::new(
            1 << 30,
            Metrics::new().admission,
            nova_core::clock::Clock::system(),
        );
        let mut oversized = vec![0u8];
        oversized.extend_from_slice(&((2u32 << 20).to_be_bytes()));
        let charges = Arc::new(Charges::default());
        let mode = Mode::Charge {
            admission: admission.clone(),
            charges: charges.clone(),
            limits: LIMITS,
        };
        let mut passing = ChargedBody::new(body(&oversized, 64), mode);
        let first = passing.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            first, oversized,
            "passed to tonic, which refuses it at its prefix"
        );
        assert!(charges.take().is_none(), "not charged");
        assert_eq!(admission.budget().in_use(), 0);

        let mut compressed = framed(&[b"abc"]);
        compressed[0] = 1;
        let mode = Mode::Charge {
            admission,
            charges: Arc::default(),
            limits: LIMITS,
        };
        let mut body = ChargedBody::new(body(&compressed, 64), mode);
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
    }

    /// Calls other than Append are held to small messages before anything is buffered.
    #[tokio::test]
    async fn other_calls_refuse_large_messages() {
        let small = framed(&[&[1u8; 100]]);
        let mut body_small = ChargedBody::new(body(&small, 16), Mode::Limit);
        let mut out = Vec::new();
        while let Some(frame) = body_small.frame().await {
            out.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(out, small);
        let mut large = vec![0u8];
        large.extend_from_slice(&((SMALL_MESSAGE_LIMIT as u32 + 1).to_be_bytes()));
        let mut body_large = ChargedBody::new(body(&large, 16), Mode::Limit);
        let error = body_large.frame().await.unwrap().unwrap_err();
        assert_eq!(error.code(), tonic::Code::ResourceExhausted);
    }

    /// A producer that stops in the middle of a message whose charge it holds loses its
    /// session at the message's deadline, and the charge with it.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_message_times_out() {
        let admission = AdmissionBuffer::new(
            1 << 20,
            Metrics::new().admission,
            nova_core::clock::Clock::system(),
        );
        let mut wire = vec![0u8];
        wire.extend_from_slice(&100u32.to_be_bytes());
        wire.extend_from_slice(&[1u8; 10]);
        // The body yields the first 15 bytes, then never ends.
        let stalled =
            futures::stream::iter(vec![Ok::<_, tonic::Status>(Frame::data(Bytes::from(wire)))])
                .chain(futures::stream::pending());
        let inner = tonic::body::Body::new(http_body_util::StreamBody::new(stalled));
        let charges = Arc::new(Charges::default());
        let mode = Mode::Charge {
            admission: admission.clone(),
            charges: charges.clone(),
            limits: LIMITS,
        };
        let mut body = ChargedBody::new(inner, mode);
        let mut passed = 0;
        let error = loop {
            match body.frame().await.unwrap() {
                Ok(frame) => passed += frame.into_data().unwrap().len(),
                Err(error) => break error,
            }
        };
        assert_eq!(
            passed, 0,
            "nothing of a message reaches tonic before it is whole"
        );
        assert_eq!(error.code(), tonic::Code::Unavailable);
        assert!(
            error.message().contains("did not arrive"),
            "{}",
            error.message()
        );
    }

    /// A stream that ends inside a message is an error, not a clean close: the message is not
    /// applied, and the producer is told.
    #[tokio::test]
    async fn a_stream_ending_inside_a_message_is_an_error() {
        let admission = AdmissionBuffer::new(
            1 << 20,
            Metrics::new().admission,
            nova_core::clock::Clock::system(),
        );
        let whole = framed(&[b"whole"]);
        let mut wire = whole.clone();
        wire.extend_from_slice(&[0, 0, 0, 0, 50, 1, 2, 3]);
        let charges = Arc::new(Charges::default());
        let mode = Mode::Charge {
            admission,
            charges: charges.clone(),
            limits: LIMITS,
        };
        let mut body = ChargedBody::new(body(&wire, 4), mode);
        let mut passed = Vec::new();
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => passed.extend_from_slice(&frame.into_data().unwrap()),
                Some(Err(error)) => break error,
                None => panic!("a clean end"),
            }
        };
        assert_eq!(passed, PLACEHOLDER, "the whole message was handed on first");
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert!(body.frame().await.is_none(), "nothing after the error");
    }
}
