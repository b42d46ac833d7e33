//! Producer sessions: the `Append` bidirectional stream.
//!
//! Each session is two halves joined by a bounded queue of pending answers. The reader half
//! takes one request at a time: validates it, charges it to the admission buffer (waiting, and
//! so not reading further frames, while the buffer is full), encodes it and hands it to the
//! packer. The answer half yields one `AppendAck` per request, strictly in request order, each
//! once its batch is durable or refused. A producer that stops reading acks fills the queue,
//! which stops the reader; nothing in a session grows without bound.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use prometheus::Histogram;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tonic::{Code, Status, Streaming};

use nova_chain::admission::{held_charge, received_charge, receiving_charge};
use nova_chain::{AckRange, AppendReply};
use nova_core::catalog::StorageClass;
use nova_core::clock::{Clock, Instant};
use nova_core::flight::section::{encode_received, wire_encoded_bytes};
use nova_core::limits::{MAX_SECTION_BYTES, QUEUED_REFUSALS, SESSION_PIPELINE_DEPTH};
use nova_proto::RequestError;
use nova_proto::v1;
use nova_proto::validate::validate_wire;
use nova_proto::wire::WireAppend;

use super::Context;
use super::caps::CapPermit;
use super::charge::{Charged, Charges};

pub type AckStream = Pin<Box<dyn Stream<Item = Result<v1::AppendAck, Status>> + Send>>;

/// One answer owed to the producer, in its place in the session's queue. The queue holds up to
/// `SESSION_PIPELINE_DEPTH` of them for a producer that does not read its acks, so the large
/// variants are boxed: a slot costs what a `Durable` does.
enum Pending {
    /// Refused before it was admitted.
    Answer(Box<Refusal>),
    /// Admitted; resolves when durable or failed.
    Durable(Durable),
    /// The session ends here, after the answers before it.
    Close(Box<Status>),
}

/// A refusal waiting to be read, holding one of the session's `QUEUED_REFUSALS` places: a
/// refusal costs the star no admission charge, so a producer sending batch after bad batch
/// without reading the answers would otherwise fill the whole pipeline with error messages.
struct Refusal {
    ack: v1::AppendAck,
    _place: Option<OwnedSemaphorePermit>,
}

/// An admitted append waiting to be durable, and what its ack time is measured from.
struct Durable {
    reply: oneshot::Receiver<AppendReply>,
    /// When its message had arrived whole and charged.
    arrived: Instant,
    clock: Clock,
    /// `nova_append_ack_seconds` for its stream's class.
    ack_time: Histogram,
}

fn ack(range: AckRange) -> v1::AppendAck {
    v1::AppendAck {
        start_seq: range.start,
        end_seq: range.end,
        error: None,
    }
}

fn refusal(error: &RequestError) -> v1::AppendAck {
    v1::AppendAck {
        start_seq: 0,
        end_seq: 0,
        error: Some(error.to_append_error()),
    }
}

/// Opens a session (or sheds it at the cap) and returns its stream of answers.
pub fn open_session(
    ctx: Arc<Context>,
    peer: Option<SocketAddr>,
    principal: Option<Arc<nova_server::net::Principal>>,
    charges: Option<Arc<Charges>>,
    inbound: Streaming<WireAppend>,
) -> Result<AckStream, Status> {
    if let Some(reason) = ctx.star.fenced() {
        return Err(nova_core::refusal::fenced(reason).into());
    }
    // A token that may append nowhere holds no session place (nor charges a batch).
    if let Some(principal) = &principal
        && !principal.has(nova_server::net::Scope::Append)
    {
        ctx.access.check(
            Some(principal),
            nova_server::net::Scope::Append,
            "(any stream)",
        )?;
    }
    // A session names its streams only in its appends: the shed names the peer.
    let permit = ctx.sessions.admit(peer, None)?;
    let (pending_tx, pending_rx) = mpsc::channel(SESSION_PIPELINE_DEPTH);
    // One task per session, bounded by --max-producer-sessions.
    tokio::spawn(read_requests(
        ctx, peer, principal, charges, inbound, pending_tx,
    ));
    Ok(Box::pin(answers(pending_rx, permit)))
}

fn answers(
    pending: mpsc::Receiver<Pending>,
    permit: CapPermit,
) -> impl Stream<Item = Result<v1::AppendAck, Status>> + Send {
    // The permit lives in the stream's state: the session's slot frees when the stream ends or
    // the producer goes away.
    futures::stream::unfold(
        (pending, permit, false),
        |(mut pending, permit, closed)| async move {
            if closed {
                return None;
            }
            let item = match pending.recv().await? {
                Pending::Answer(refusal) => Ok(refusal.ack),
                Pending::Durable(durable) => Ok(match durable.reply.await {
                    Ok(Ok(range)) => {
                        durable
                            .ack_time
                            .observe(durable.clock.since(durable.arrived).as_secs_f64());
                        ack(range)
                    }
                    Ok(Err(error)) => refusal(&error),
                    Err(_) => refusal(&RequestError::Unavailable(
                        "the star stopped before this append was durable; retry it".into(),
                    )),
                }),
                Pending::Close(status) => return Some((Err(*status), (pending, permit, true))),
            };
            Some((item, (pending, permit, false)))
        },
    )
}

async fn read_requests(
    ctx: Arc<Context>,
    peer: Option<SocketAddr>,
    principal: Option<Arc<nova_server::net::Principal>>,
    charges: Option<Arc<Charges>>,
    mut inbound: Streaming<WireAppend>,
    pending: mpsc::Sender<Pending>,
) {
    let shutting_down = || {
        Pending::Close(Box::new(
            RequestError::Unavailable(
                "novad is shutting down: every append answered above is final; reconnect to send more"
                    .into(),
            )
            .into(),
        ))
    };
    let refusals = Arc::new(Semaphore::new(QUEUED_REFUSALS));
    loop {
        let next = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => {
                let _ = pending.send(shutting_down()).await;
                return;
            }
            _ = pending.closed() => return,
            next = inbound.message() => next,
        };
        let request = match next {
            Ok(Some(request)) => request,
            // The producer closed its side; the answers still owed go out, then the stream ends.
            Ok(None) => return,
            Err(status) => {
                // Release the transport and any charge it queued before waiting to say why:
                // the answers ahead of this one may take a while to drain.
                drop(inbound);
                drop(charges);
                let _ = pending
                    .send(Pending::Close(Box::new(frame_error(status))))
                    .await;
                return;
            }
        };
        let answer = tokio::select! {
            answer = admit(&ctx, peer, principal.as_deref(), charges.as_deref(), request) => answer,
            _ = pending.closed() => return,
            _ = ctx.shutdown.cancelled() => {
                let _ = pending.send(shutting_down()).await;
                return;
            }
        };
        let answer = match answer {
            // Past QUEUED_REFUSALS unread refusals the session stops reading (flow control
            // holds the producer) until the producer reads the answers ahead.
            Pending::Answer(mut refusal) => {
                refusal._place = tokio::select! {
                    place = refusals.clone().acquire_owned() => place.ok(),
                    _ = pending.closed() => return,
                    _ = ctx.shutdown.cancelled() => {
                        let _ = pending.send(shutting_down()).await;
                        return;
                    }
                };
                Pending::Answer(refusal)
            }
            other => other,
        };
        if pending.send(answer).await.is_err() {
            return;
        }
    }
}

/// What the transport reports about an unreadable frame, as the producer should see it.
fn frame_error(status: Status) -> Status {
    match status.code() {
        // tonic reports undecodable protobuf as INTERNAL; it is the producer's frame that is bad.
        Code::Internal => {
            RequestError::InvalidRequest(format!("malformed append frame: {}", status.message()))
                .into()
        }
        Code::OutOfRange | Code::ResourceExhausted => RequestError::MessageTooLarge(format!(
            "append frame over the message limit (twice --max-batch-bytes): {}",
            status.message()
        ))
        .into(),
        // The producer went away or the connection broke: nothing to tell it.
        _ => status,
    }
}

fn rejection_reason(error: &RequestError) -> &'static str {
    match error {
        RequestError::EmptyBatch => "empty_batch",
        RequestError::TooManyRecords { .. } => "max_batch_records",
        RequestError::TooManyHeaders { .. } => "max_batch_headers",
        RequestError::BatchTooLarge { .. } => "max_batch_bytes",
        RequestError::RecordTooLarge { .. } => "max_record_bytes",
        RequestError::InvalidStreamName { .. } => "invalid_stream_name",
        RequestError::StreamNotFound(_) => "stream_not_found",
        RequestError::NotLeader { .. } => "not_leader",
        RequestError::InvalidRequest(_) => "malformed",
        RequestError::UnavailableFor { .. } => "express_unavailable",
        RequestError::PermissionDenied(_) => "permission_denied",
        _ => "other",
    }
}

/// Answers an append with a refusal (`reject_append`).
fn reject(ctx: &Context, peer: Option<SocketAddr>, error: RequestError, stream: &str) -> Pending {
    reject_append(ctx, peer, &error, stream);
    Pending::Answer(Box::new(Refusal {
        ack: refusal(&error),
        _place: None,
    }))
}

/// Counts an append refused by reason; tallies and logs it with the stream and the peer (a
/// redirect is routing, not a refusal, so it is not tallied against them). Kafka's produce
/// refusals come here too.
pub fn reject_append(ctx: &Context, peer: Option<SocketAddr>, error: &RequestError, stream: &str) {
    let reason = rejection_reason(error);
    ctx.metrics.rejections.with_label_values(&[reason]).inc();
    if !matches!(error, RequestError::NotLeader { .. }) {
        ctx.metrics.refused.hit(Some(stream), peer);
    }
    if let Some(unlogged) = ctx.sheds.admit(reason) {
        tracing::info!(
            reason,
            stream,
            peer = %nova_core::top::peer_key(peer),
            unlogged_since_last = unlogged,
            "append rejected: {error}"
        );
    }
}

async fn admit(
    ctx: &Context,
    peer: Option<SocketAddr>,
    principal: Option<&nova_server::net::Principal>,
    charges: Option<&Charges>,
    request: WireAppend,
) -> Pending {
    // The message was charged from its length prefix and assembled outside tonic
    // (`charge.rs`), which saw only an empty placeholder for it. Without that layer in front (a
    // test calling the service directly) tonic's message is the request, charged now.
    // `exact`: the message is a buffer of its own size (rounded up to its last page when it is
    // recycled, `nova_server::net::recycle::page_fit`: the memory an exact one takes anyway),
    // so its fragment may keep it.
    let (mut admitted, request, exact) = match charges.map(Charges::take) {
        Some(Some(Charged::Message(admitted, message))) => {
            (admitted, WireAppend::parse(message), true)
        }
        // Refused before it was charged: the token may not append to its stream.
        Some(Some(Charged::Refused { error, stream })) => {
            return reject(ctx, peer, error, &stream);
        }
        // Every placeholder tonic yields stands for a queued message; one without is a bug, and
        // answering it would shift every later answer by one.
        Some(None) => {
            tracing::error!("an append message arrived without its charge; ending the session");
            return Pending::Close(Box::new(
                RequestError::Internal("the star lost track of a message; reconnect".into()).into(),
            ));
        }
        None => {
            let admitted = ctx
                .star
                .admission()
                .admit(received_charge(request.wire_len()))
                .await;
            (admitted, request, false)
        }
    };
    admitted.received();
    let clock = ctx.star.config().clock;
    let arrived = clock.now();
    let refuse = |error: RequestError, stream: &str| reject(ctx, peer, error, stream);
    // In a fleet, every append is routed: a stream this star does not lead (or no longer
    // leads) is answered with a redirect naming its leader.
    // Each append names its stream: the session's token must allow appending to it.
    let routed = match validate_wire(&request, &ctx.caps) {
        Ok(name) => match ctx
            .access
            .check(principal, nova_server::net::Scope::Append, name)
        {
            Ok(()) => ctx.route(name, peer, principal).await,
            Err(error) => Err(error),
        },
        Err(error) => Err(error),
    };
    let stream = match routed {
        Ok(stream) => stream,
        Err(error) => {
            let name = request.stream_bytes();
            return refuse(
                error,
                &String::from_utf8_lossy(&name[..name.len().min(128)]),
            );
        }
    };
    let content = request.content_bytes();
    let match_seq_num = request.match_seq_num();
    // From here the batch holds exactly its received bytes and, while encoding, its fragment.
    admitted.shrink_to(receiving_charge(
        request.wire_len(),
        wire_encoded_bytes(&request),
    ));
    // Large bodies stay in the received message rather than being copied; the fragment then
    // holds the message, and its charge says so.
    let chunks = encode_received(
        &request,
        ctx.star.config().clock.unix_ms(),
        MAX_SECTION_BYTES as usize,
        exact,
    );
    drop(request);
    admitted.shrink_to(held_charge(&chunks));
    let class = match stream.class() {
        StorageClass::Standard => "standard",
        StorageClass::Express => "express",
    };
    let ack_time = ctx.metrics.append_ack.with_label_values(&[class]);
    match ctx
        .star
        .submit(stream.clone(), chunks, content, match_seq_num, admitted)
        .await
    {
        Ok(reply) => Pending::Durable(Durable {
            reply,
            arrived,
            clock,
            ack_time,
        }),
        Err(error) => refuse(error, stream.name()),
    }
}
