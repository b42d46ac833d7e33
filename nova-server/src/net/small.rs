//! Request messages of every call but `Append`, held to small sizes and short arrival times.
//!
//! tonic reserves a buffer of a message's declared length at its prefix and waits as long as
//! the client likes for the rest, and a call whose body is incomplete keeps its connection busy
//! (so no idle deadline closes it). A client could so hold memory it never sent on every stream
//! of every connection. Here a message is refused at its prefix if it declares more than
//! [`SMALL_MESSAGE_LIMIT`] bytes; otherwise it is collected outside tonic, charged to a budget
//! of [`SMALL_MESSAGES_BUDGET`] bytes for the whole server (and to the token's share
//! of it, per token), and handed to tonic only once whole. The first message must be whole within
//! [`SMALL_MESSAGE_GRACE`] of the call's headers, and each later one within that of its
//! prefix; past it the call fails with UNAVAILABLE and lets go of its charge.
//!
//! Legitimate small messages arrive in one frame, so the budget is all but empty except while
//! clients trickle; its share (`--max-client-share-percent`) keeps one token's trickling from
//! refusing everybody else.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use nova_proto::RequestError;

use super::Principal;
use super::shares::{Share, Shares, holder};
use crate::shed::ShedLog;

/// The largest message a call other than `Append` may send: reads and admin calls are small.
pub const SMALL_MESSAGE_LIMIT: u64 = 64 * 1024;
/// How long a small message may take to arrive.
pub const SMALL_MESSAGE_GRACE: Duration = Duration::from_secs(10);
/// Small messages in arrival, for the whole server: part of its fixed overhead.
pub const SMALL_MESSAGES_BUDGET: u64 = nova_core::limits::REQUEST_MESSAGES_BUDGET;
/// The label of a small message refused because the budget (or the client's share) is full.
pub const SHED_LABEL: &str = nova_core::limits::REQUEST_BODIES_SHED;

/// A gRPC message's prefix: a compression flag and a 4-byte length.
pub const PREFIX_LEN: usize = 5;

/// The holder of calls made without a token on a server that checks tokens (health checks,
/// reflection). No token's name has a space, so none can be it.
const ANONYMOUS: &str = "(no token)";

/// The server's budget for small messages in arrival, and who holds what of it.
#[derive(Clone)]
pub struct SmallMessages {
    budget: Arc<Semaphore>,
    shares: Arc<Shares>,
    /// Whether the server checks tokens: then the calls that need none (health, reflection)
    /// share one holder between them, so that anonymous clients hold at most one share.
    tokens: bool,
    sheds: prometheus::IntCounter,
    log: Arc<ShedLog>,
}

impl SmallMessages {
    /// `sheds` counts refusals (the server's sheds counter at [`SHED_LABEL`]); `log` logs them;
    /// a token may hold `share_percent` of the budget; `tokens`: the server checks tokens.
    pub fn new(
        sheds: prometheus::IntCounter,
        log: Arc<ShedLog>,
        share_percent: u8,
        tokens: bool,
    ) -> Self {
        Self {
            budget: Arc::new(Semaphore::new(SMALL_MESSAGES_BUDGET as usize)),
            shares: Shares::of(SMALL_MESSAGES_BUDGET, share_percent),
            tokens,
            sheds,
            log,
        }
    }

    /// Bytes of the budget held now.
    pub fn in_use(&self) -> u64 {
        SMALL_MESSAGES_BUDGET - self.budget.available_permits() as u64
    }

    /// Wraps a request body of a call from `principal` at `peer`.
    pub fn limit(
        &self,
        body: tonic::body::Body,
        principal: Option<&Principal>,
        peer: Option<SocketAddr>,
    ) -> tonic::body::Body {
        tonic::body::Body::new(LimitedBody {
            inner: body,
            messages: self.clone(),
            holder: match holder(principal) {
                None if self.tokens => Some(ANONYMOUS.to_owned()),
                named => named,
            },
            peer,
            framing: Framing::fresh(),
            deadline: Some(Box::pin(tokio::time::sleep(SMALL_MESSAGE_GRACE))),
            done: false,
        })
    }

    fn charge(&self, holder: Option<&str>, len: u64) -> Result<Charge, RequestError> {
        let refused = |limit: u64, what: &'static str| RequestError::CapReached {
            cap: SHED_LABEL,
            limit,
            what,
            retry_after: Duration::from_secs(1),
        };
        let share = match holder {
            Some(holder) => Some(self.shares.try_take(holder, len).ok_or_else(|| {
                refused(
                    self.shares.cap(),
                    "bytes of request messages one token may have in arrival at once \
                     (--max-client-share-percent)",
                )
            })?),
            None => None,
        };
        // At most SMALL_MESSAGE_LIMIT + 5, well within a u32.
        let permit = self
            .budget
            .clone()
            .try_acquire_many_owned(len as u32)
            .map_err(|_| {
                refused(
                    SMALL_MESSAGES_BUDGET,
                    "bytes of request messages in arrival at once, for the whole server",
                )
            })?;
        Ok(Charge {
            _permit: permit,
            _share: share,
        })
    }
}

/// What a message in arrival holds.
struct Charge {
    _permit: OwnedSemaphorePermit,
    _share: Option<Share>,
}

enum Framing {
    Prefix {
        bytes: [u8; PREFIX_LEN],
        got: usize,
    },
    /// Collecting a message (its prefix included) of which `remaining` bytes are still due.
    Collecting {
        remaining: u64,
        buf: BytesMut,
        _charge: Charge,
    },
}

impl Framing {
    fn fresh() -> Self {
        Framing::Prefix {
            bytes: [0; PREFIX_LEN],
            got: 0,
        }
    }
}

struct LimitedBody {
    inner: tonic::body::Body,
    messages: SmallMessages,
    holder: Option<String>,
    peer: Option<SocketAddr>,
    framing: Framing,
    /// Until the first message is whole, or the current one: when the call fails.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
}

impl LimitedBody {
    /// Takes in `data`; returns the messages completed by it (prefixes included).
    fn process(&mut self, mut data: Bytes) -> Result<Bytes, RequestError> {
        let mut out = BytesMut::new();
        while !data.is_empty() {
            match &mut self.framing {
                Framing::Prefix { bytes, got } => {
                    bytes[*got] = data[0];
                    *got += 1;
                    data.advance(1);
                    if *got < PREFIX_LEN {
                        continue;
                    }
                    let prefix = *bytes;
                    let len = (&prefix[1..]).get_u32() as u64;
                    if len > SMALL_MESSAGE_LIMIT {
                        return Err(RequestError::MessageTooLarge(format!(
                            "a message of {len} bytes, over the {SMALL_MESSAGE_LIMIT} bytes this \
                             call accepts"
                        )));
                    }
                    if len == 0 {
                        // An empty message (a health check's) is whole at its prefix, and
                        // holds nothing.
                        out.extend_from_slice(&prefix);
                        self.framing = Framing::fresh();
                        self.deadline = None;
                        continue;
                    }
                    let charge = self
                        .messages
                        .charge(self.holder.as_deref(), PREFIX_LEN as u64 + len)?;
                    let mut buf = BytesMut::with_capacity(PREFIX_LEN + len as usize);
                    buf.extend_from_slice(&prefix);
                    self.framing = Framing::Collecting {
                        remaining: len,
                        buf,
                        _charge: charge,
                    };
                    if self.deadline.is_none() {
                        self.deadline = Some(Box::pin(tokio::time::sleep(SMALL_MESSAGE_GRACE)));
                    }
                }
                Framing::Collecting { remaining, buf, .. } => {
                    let take = (*remaining).min(data.len() as u64) as usize;
                    buf.extend_from_slice(&data.split_to(take));
                    *remaining -= take as u64;
                    if *remaining > 0 {
                        continue;
                    }
                    let whole = std::mem::replace(&mut self.framing, Framing::fresh());
                    if let Framing::Collecting { buf, .. } = whole {
                        out.extend_from_slice(&buf);
                    }
                    self.deadline = None;
                }
            }
        }
        Ok(out.freeze())
    }

    fn between_messages(&self) -> bool {
        matches!(self.framing, Framing::Prefix { got: 0, .. })
    }

    fn fail(&mut self, error: RequestError) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let RequestError::CapReached { .. } = &error {
            self.messages.sheds.inc();
            self.messages.log.shed(SHED_LABEL, &error, None, self.peer);
        }
        self.end(error.into())
    }

    fn end(&mut self, status: tonic::Status) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.framing = Framing::fresh();
        self.deadline = None;
        self.done = true;
        Poll::Ready(Some(Err(status)))
    }
}

impl HttpBody for LimitedBody {
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
        loop {
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    if let Some(deadline) = &mut this.deadline {
                        ready!(deadline.as_mut().poll(cx));
                        return this.end(
                            RequestError::Unavailable(format!(
                                "the request message did not arrive whole within {}s; nothing \
                                 was done",
                                SMALL_MESSAGE_GRACE.as_secs()
                            ))
                            .into(),
                        );
                    }
                    return Poll::Pending;
                }
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => match this.process(data) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(error) => return this.fail(error),
                    },
                    Err(trailers) if this.between_messages() => {
                        return Poll::Ready(Some(Ok(trailers)));
                    }
                    Err(_) => return this.fail(ended_inside_a_message()),
                },
                None if !this.between_messages() => return this.fail(ended_inside_a_message()),
                None => {
                    this.deadline = None;
                    return Poll::Ready(None);
                }
                Some(Err(status)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(status)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.between_messages() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What a request stream that ends (or sends trailers) inside a message is told.
pub fn ended_inside_a_message() -> RequestError {
    RequestError::InvalidRequest(
        "the stream ended inside a message; the message was not applied".into(),
    )
}

/// Limits the request bodies of every call (a gateway's; a star limits all but `Append` in its
/// charging layer). Runs inside the authentication layer, so a client is its token.
#[derive(Clone)]
pub struct SmallMessagesLayer(pub SmallMessages);

impl<S> tower_layer::Layer<S> for SmallMessagesLayer {
    type Service = SmallMessagesService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SmallMessagesService {
            inner,
            messages: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct SmallMessagesService<S> {
    inner: S,
    messages: SmallMessages,
}

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for SmallMessagesService<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let principal = parts.extensions.get::<Arc<Principal>>().cloned();
        let peer = super::conn::peer(&parts.extensions);
        let body = self.messages.limit(body, principal.as_deref(), peer);
        self.inner.call(http::Request::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::BodyExt;

    fn messages() -> SmallMessages {
        let sheds = prometheus::IntCounter::new("sheds", "sheds").unwrap();
        SmallMessages::new(
            sheds,
            Arc::new(ShedLog::new(nova_core::clock::Clock::system())),
            25,
            true,
        )
    }

    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    fn chunked(wire: &[u8], chunk: usize) -> tonic::body::Body {
        let chunks: Vec<Result<Frame<Bytes>, tonic::Status>> = wire
            .chunks(chunk)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            chunks,
        )))
    }

    #[tokio::test]
    async fn small_messages_pass_whole_and_large_ones_are_refused_at_their_prefix() {
        let small = messages();
        // An empty message last (a GetServerInfo's only message) is whole at its prefix.
        for (wire, chunk) in [1, 3, 64, 1000].into_iter().flat_map(|chunk| {
            [
                (framed(&[&[1u8; 100], b"", &[2u8; 7]]), chunk),
                (framed(&[b""]), chunk),
            ]
        }) {
            let mut body = small.limit(chunked(&wire, chunk), None, None);
            let mut out = Vec::new();
            while let Some(frame) = body.frame().await {
                out.extend_from_slice(&frame.unwrap().into_data().unwrap());
            }
            assert_eq!(out, wire, "chunks of {chunk}");
            assert_eq!(small.in_use(), 0, "nothing held once whole");
        }
        let mut large = vec![0u8];
        large.extend_from_slice(&((SMALL_MESSAGE_LIMIT as u32 + 1).to_be_bytes()));
        let mut body = small.limit(chunked(&large, 16), None, None);
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(error.code(), tonic::Code::ResourceExhausted);
    }

    /// A call whose message never completes (or never starts) fails at the grace, and its
    /// charge is let go; while it waits, the client's share is held.
    #[tokio::test(start_paused = true)]
    async fn an_incomplete_message_is_charged_and_fails_at_its_deadline() {
        let small = messages();
        let mut wire = vec![0u8];
        wire.extend_from_slice(&60_000u32.to_be_bytes());
        wire.extend_from_slice(&[1u8; 10]);
        let stalled = || {
            let stream = futures::stream::iter(vec![Ok::<_, tonic::Status>(Frame::data(
                Bytes::from(wire.clone()),
            ))])
            .chain(futures::stream::pending());
            tonic::body::Body::new(http_body_util::StreamBody::new(stream))
        };
        // Shares of 2 MiB: 34 stalled messages of 60 KB from one token, the 35th refused.
        let token = |name: &str| Principal {
            name: name.into(),
            grants: Vec::new(),
        };
        let mut bodies = Vec::new();
        let refused = loop {
            let mut body = small.limit(stalled(), Some(&token("a")), None);
            let polled = tokio::time::timeout(Duration::from_millis(1), body.frame()).await;
            match polled {
                Ok(Some(Err(status))) => break status,
                Ok(other) => panic!("{other:?}"),
                Err(_) => bodies.push(body),
            }
        };
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(bodies.len() as u64, SMALL_MESSAGES_BUDGET / 4 / 60_005);
        assert_eq!(small.in_use(), bodies.len() as u64 * 60_005);
        // Another token has its own share.
        let mut theirs = small.limit(stalled(), Some(&token("b")), None);
        assert!(
            tokio::time::timeout(Duration::from_millis(1), theirs.frame())
                .await
                .is_err(),
            "waiting for the rest, charged"
        );
        // Calls without a token (health, reflection) share one holder: anonymous clients
        // together hold at most one share.
        let mut anonymous = Vec::new();
        let refused = loop {
            let mut body = small.limit(stalled(), None, None);
            match tokio::time::timeout(Duration::from_millis(1), body.frame()).await {
                Ok(Some(Err(status))) => break status,
                Ok(other) => panic!("{other:?}"),
                Err(_) => anonymous.push(body),
            }
        };
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(anonymous.len(), bodies.len());
        drop(anonymous);
        let error = bodies[0].frame().await.unwrap().unwrap_err();
        assert_eq!(error.code(), tonic::Code::Unavailable);
        drop(bodies);
        drop(theirs);
        assert_eq!(small.in_use(), 0);

        // Headers and no message at all: the same deadline.
        let silent =
            tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::pending::<
                Result<Frame<Bytes>, tonic::Status>,
            >()));
        let mut body = small.limit(silent, None, None);
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(error.code(), tonic::Code::Unavailable);
    }
}
