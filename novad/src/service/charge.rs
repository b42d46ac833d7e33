//! Holding the budgets across the transport: appends are charged from their gRPC length prefix,
//! before their bodies are buffered, and a read's charge is held until its response is sent.
//!
//! tonic buffers a whole message before a handler sees it, and reserves room for it as soon as
//! it reads the 5-byte gRPC prefix (compression flag and length). So the charge must be taken
//! before tonic sees a prefix. This layer wraps the body of every `Append` call: it follows the
//! gRPC framing as bytes pass through, and when a prefix completes it holds the byte that would
//! complete it until the admission buffer grants `received_charge(len)`. The grant goes into a
//! queue the session's handler takes from, one per message, in order.
//!
//! While the charge waits nothing more of the stream is read, so HTTP/2 flow control stops the
//! producer: the transport holds at most its stream window, and this layer at most the one DATA
//! frame it was given (16 KiB, HTTP/2's default frame size). Data up to the end of the previous
//! message always passes first, so a session never waits on a charge for a message behind one
//! it has not finished.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use parking_lot::Mutex;

use nova_chain::ReadCharge;
use nova_chain::admission::{AdmissionBuffer, Admitted, received_charge};

/// The gRPC path whose requests are charged.
const APPEND_PATH: &str = "/nova.v1.Nova/Append";
/// The gRPC path whose responses hold a read charge.
const READ_PATH: &str = "/nova.v1.Nova/Read";
const PREFIX_LEN: usize = 5;

/// Charges granted for messages the handler has not taken yet. At most one or two: a charge is
/// requested only once the previous message has passed in full.
#[derive(Debug, Default)]
pub struct Charges(Mutex<VecDeque<Admitted>>);

impl Charges {
    /// The charge of the next message, in arrival order.
    pub fn take(&self) -> Option<Admitted> {
        self.0.lock().pop_front()
    }
}

#[derive(Debug, Clone, Copy)]
enum Framing {
    /// Reading a prefix; `got` bytes of it so far.
    Prefix { bytes: [u8; PREFIX_LEN], got: usize },
    /// The prefix's last byte is held until the charge for `len` is granted.
    Charging { len: u64 },
    /// Passing a message's body; this many bytes remain.
    Body { remaining: u64 },
}

type Pending = Pin<Box<dyn Future<Output = Admitted> + Send>>;

pub struct ChargedBody {
    inner: tonic::body::Body,
    admission: AdmissionBuffer,
    charges: Arc<Charges>,
    framing: Framing,
    /// Bytes received and not yet passed on (at most one DATA frame).
    held: Option<Bytes>,
    pending: Option<Pending>,
}

impl ChargedBody {
    fn new(inner: tonic::body::Body, admission: AdmissionBuffer, charges: Arc<Charges>) -> Self {
        Self {
            inner,
            admission,
            charges,
            framing: Framing::Prefix {
                bytes: [0; PREFIX_LEN],
                got: 0,
            },
            held: None,
            pending: None,
        }
    }

    /// Splits off the part of `data` that may pass now: everything up to the byte that
    /// completes the next prefix. Starts the charge when a prefix completes.
    fn passable(&mut self, mut data: Bytes) -> Bytes {
        let mut at = 0usize;
        while at < data.len() {
            match &mut self.framing {
                Framing::Body { remaining } => {
                    let take = (*remaining).min((data.len() - at) as u64);
                    at += take as usize;
                    *remaining -= take;
                    if *remaining == 0 {
                        self.framing = Framing::Prefix {
                            bytes: [0; PREFIX_LEN],
                            got: 0,
                        };
                    }
                }
                Framing::Prefix { bytes, got } => {
                    bytes[*got] = data[at];
                    *got += 1;
                    if *got == PREFIX_LEN {
                        let len = (&bytes[1..]).get_u32() as u64;
                        self.framing = Framing::Charging { len };
                        let admission = self.admission.clone();
                        self.pending = Some(Box::pin(async move {
                            admission.admit(received_charge(len)).await
                        }));
                        self.held = Some(data.split_off(at));
                        return data;
                    }
                    at += 1;
                }
                // The charge is granted: the held prefix byte passes, then the body.
                Framing::Charging { len } => {
                    let len = *len;
                    at += 1;
                    self.framing = if len == 0 {
                        Framing::Prefix {
                            bytes: [0; PREFIX_LEN],
                            got: 0,
                        }
                    } else {
                        Framing::Body { remaining: len }
                    };
                }
            }
        }
        data
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
        loop {
            if let Some(pending) = &mut this.pending {
                let admitted = ready!(pending.as_mut().poll(cx));
                this.pending = None;
                this.charges.0.lock().push_back(admitted);
            }
            if let Some(data) = this.held.take() {
                let passable = this.passable(data);
                if !passable.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(passable))));
                }
                continue;
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.held = Some(data),
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A page's share of the read budget, handed out of the read handler in the response's
/// extensions; released once the response body is sent, or dropped.
#[derive(Clone, Debug)]
pub struct ReadHold {
    /// Held for its release on drop.
    _charge: Arc<ReadCharge>,
}

impl ReadHold {
    pub fn new(charge: ReadCharge) -> Self {
        Self {
            _charge: Arc::new(charge),
        }
    }
}

/// A response body that releases its read charge when it ends.
struct HeldBody {
    inner: tonic::body::Body,
    hold: Option<ReadHold>,
}

impl HttpBody for HeldBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none() {
            self.hold = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps `Append` request bodies in `ChargedBody` and `Read` response bodies in `HeldBody`;
/// other calls pass untouched.
#[derive(Clone)]
pub struct ChargeLayer {
    admission: AdmissionBuffer,
}

impl ChargeLayer {
    pub fn new(admission: AdmissionBuffer) -> Self {
        Self { admission }
    }
}

impl<S> tower_layer::Layer<S> for ChargeLayer {
    type Service = ChargeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ChargeService {
            inner,
            admission: self.admission.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ChargeService<S> {
    inner: S,
    admission: AdmissionBuffer,
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
        match request.uri().path() {
            APPEND_PATH => {
                let (mut parts, body) = request.into_parts();
                let charges = Arc::new(Charges::default());
                parts.extensions.insert(charges.clone());
                let body = ChargedBody::new(body, self.admission.clone(), charges);
                Box::pin(self.inner.call(http::Request::from_parts(
                    parts,
                    tonic::body::Body::new(body),
                )))
            }
            READ_PATH => {
                let response = self.inner.call(request);
                Box::pin(async move {
                    let (mut parts, body) = response.await?.into_parts();
                    let hold = parts.extensions.remove::<ReadHold>();
                    let body = tonic::body::Body::new(HeldBody { inner: body, hold });
                    Ok(http::Response::from_parts(parts, body))
                })
            }
            _ => Box::pin(self.inner.call(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use nova_core::metrics::Metrics;

    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    /// Feeds `wire` in chunks of `chunk` bytes through a charged body; returns what passed.
    async fn pass(wire: &[u8], chunk: usize, admission: AdmissionBuffer) -> (Vec<u8>, usize) {
        let expected: u64 = {
            let mut at = 0;
            let mut sum = 0;
            while at < wire.len() {
                let len =
                    u32::from_be_bytes([wire[at + 1], wire[at + 2], wire[at + 3], wire[at + 4]]);
                sum += received_charge(len as u64);
                at += 5 + len as usize;
            }
            sum
        };
        let chunks: Vec<Result<Frame<Bytes>, tonic::Status>> = wire
            .chunks(chunk)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let inner = tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            chunks,
        )));
        let charges = Arc::new(Charges::default());
        let mut body = ChargedBody::new(inner, admission.clone(), charges.clone());
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            out.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        let granted = charges.0.lock().len();
        assert_eq!(
            charges.0.lock().iter().map(Admitted::charged).sum::<u64>(),
            admission.budget().in_use(),
            "the queue holds every charge taken"
        );
        assert_eq!(admission.budget().in_use(), expected);
        (out, granted)
    }

    #[tokio::test]
    async fn every_message_is_charged_and_every_byte_passes_in_order() {
        let wire = framed(&[b"hello", b"", &[7u8; 100], b"x"]);
        for chunk in [1, 2, 3, 5, 7, 64, 1000] {
            let admission = AdmissionBuffer::new(1 << 20, Metrics::new().admission);
            let (out, granted) = pass(&wire, chunk, admission.clone()).await;
            assert_eq!(out, wire, "chunks of {chunk}");
            assert_eq!(granted, 4, "one charge per message, chunks of {chunk}");
            assert_eq!(admission.budget().in_use(), 0, "released with the session");
        }
    }

    /// The prefix of a message is not completed downstream until its charge is granted.
    #[tokio::test]
    async fn a_prefix_waits_for_its_charge() {
        let admission = AdmissionBuffer::new(received_charge(10), Metrics::new().admission);
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
        let (out, granted) = passing.await.unwrap();
        assert_eq!((out, granted), (wire, 1));
    }
}
