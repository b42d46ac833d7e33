//! One Kafka connection: requests read one at a time, answered strictly in order.
//!
//! The reading half takes a request's 4-byte length, then its API key and version, and decides
//! before reading the rest: a request over its limit closes the connection (as a Kafka broker
//! does; the client reconnects), a produce request is charged to the admission buffer as an
//! append message is (waiting, and so not reading further, while the buffer is full), and any
//! other request over `KAFKA_SMALL_REQUEST_BYTES` is charged its size. A produce request is
//! then checked and handed to the packer at once, so appends keep the order the client sent
//! them in; its answer, and every other request's work, is queued as a future. The writing half
//! runs those futures one after another and writes each answer: at most
//! `KAFKA_PIPELINE_DEPTH` wait, and past that the connection stops reading.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use nova_chain::admission::{PER_BATCH_OVERHEAD, received_charge};
use nova_core::limits::{
    KAFKA_DECODED_PER_WIRE_BYTE, KAFKA_MAX_CONTROL_REQUEST_BYTES, KAFKA_PIPELINE_DEPTH,
    KAFKA_SMALL_REQUEST_BYTES,
};
use nova_server::net::conn::{CallMark, Conn};

use super::Kafka;

/// A request's answer once its work is done; `None` when it is not answered (`acks=0`).
pub type Answer = Pin<Box<dyn Future<Output = Option<Reply>> + Send>>;

/// An answer, and what it holds (a fetch's read charges) until it is written.
pub struct Reply {
    pub response: ResponseKind,
    pub hold: Option<Box<dyn std::any::Any + Send>>,
    /// Instead of answering, close the connection, for this reason: where the API has no way
    /// to say a retriable failure (an all-topics Metadata), a client reconnects and asks again.
    pub close: Option<String>,
}

impl Reply {
    pub fn new(response: ResponseKind) -> Self {
        Self {
            response,
            hold: None,
            close: None,
        }
    }

    pub fn closing(response: ResponseKind, why: String) -> Self {
        Self {
            close: Some(why),
            ..Self::new(response)
        }
    }
}

/// The APIs served, and the versions of each (within what kafka-protocol knows).
const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    // Not 9 and later (flexible versions): their tagged fields decode to far more than their
    // size, and a produce request may be large.
    (ApiKey::Produce, 3, 8),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::FindCoordinator, 0, 3),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    // Version 0 is listed because librdkafka looks for it before it uses SaslAuthenticate;
    // after a version-0 handshake the exchange would come outside Kafka's framing, which is
    // not served (such a connection is closed at its next bytes).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

fn versions(api: ApiKey) -> Option<(i16, i16)> {
    let valid = api.valid_versions();
    SUPPORTED
        .iter()
        .find(|(key, _, _)| *key == api)
        .map(|(_, min, max)| ((*min).max(valid.min), (*max).min(valid.max)))
}

fn api_versions() -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .filter_map(|(api, _, _)| {
            let (min, max) = versions(*api)?;
            Some(
                ApiVersion::default()
                    .with_api_key(*api as i16)
                    .with_min_version(min)
                    .with_max_version(max),
            )
        })
        .collect()
}

/// A request read and queued for its answer.
struct Pending {
    correlation_id: i32,
    api: ApiKey,
    version: i16,
    answer: Answer,
    /// The connection has a call in progress until the answer is written.
    _call: CallMark,
    /// What the request was charged, held until its answer is written: the decoded request
    /// waits in the queue with it.
    _charge: Option<nova_chain::admission::Admitted>,
}

/// Why the listener closed a connection (`nova_kafka_connections_closed_total{reason}`).
struct Close {
    reason: &'static str,
    detail: String,
}

pub async fn serve(kafka: Arc<Kafka>, conn: Conn) {
    let peer = conn.peer();
    let marks = conn.call_marks();
    let (read, write) = tokio::io::split(conn);
    let (pending_tx, pending_rx) = mpsc::channel(KAFKA_PIPELINE_DEPTH);
    let writer_gone = CancellationToken::new();
    let reader_gone = CancellationToken::new();
    let reading = async {
        let closed = read_requests(&kafka, peer, &marks, read, pending_tx, &writer_gone).await;
        // The client is gone (or sent what ends the connection): the answers queued for it,
        // and the work still to do for them (fetches waiting at tails), go too. Appends
        // already submitted become durable all the same.
        reader_gone.cancel();
        if let Err(close) = closed {
            kafka
                .metrics
                .closed
                .with_label_values(&[close.reason])
                .inc();
            if let Some(unlogged) = kafka.ctx.sheds.admit(close.reason) {
                tracing::info!(
                    %peer,
                    reason = close.reason,
                    unlogged_since_last = unlogged,
                    "closing a Kafka connection: {}",
                    close.detail
                );
            }
        }
    };
    let writing = async {
        tokio::select! {
            _ = write_answers(pending_rx, write, &marks) => {}
            _ = reader_gone.cancelled() => {}
        }
        writer_gone.cancel();
    };
    tokio::join!(reading, writing);
}

async fn read_requests(
    kafka: &Arc<Kafka>,
    peer: SocketAddr,
    marks: &nova_server::net::conn::CallMarks,
    mut read: tokio::io::ReadHalf<Conn>,
    pending: mpsc::Sender<Pending>,
    writer_gone: &CancellationToken,
) -> Result<(), Close> {
    let ctx = &kafka.ctx;
    // Who the connection authenticated as; with no tokens to check, anyone, from the start.
    let mut principal: Option<Arc<nova_server::net::Principal>> = None;
    // The token it authenticated with, to check again on every request.
    let mut token: Option<bytes::Bytes> = None;
    let mut mechanism_agreed = false;
    loop {
        let mut prefix = [0u8; 8];
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return Ok(()),
            _ = writer_gone.cancelled() => return Ok(()),
            // The connection's end (or a deadline of its limits) ends the reading.
            read = read.read_exact(&mut prefix[..4]) => if read.is_err() { return Ok(()) },
        }
        let len = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        if len < 4 {
            return Err(Close {
                reason: "malformed_request",
                detail: format!("a request of {len} bytes"),
            });
        }
        let len = len as u64;
        if read.read_exact(&mut prefix[4..]).await.is_err() {
            return Ok(());
        }
        let key = i16::from_be_bytes([prefix[4], prefix[5]]);
        let version = i16::from_be_bytes([prefix[6], prefix[7]]);
        let Ok(api) = ApiKey::try_from(key) else {
            return Err(Close {
                reason: "unknown_api",
                detail: format!("API key {key}, which Kafka does not define"),
            });
        };
        // Before a client with tokens to show has shown one, it may send only small requests
        // of the kinds that get it authenticated: nothing is charged to the buffers every
        // producer shares, and none of it counts as activity that keeps its connection open.
        let anonymous = kafka.tokens.is_some() && principal.is_none();
        if anonymous
            && (len > KAFKA_SMALL_REQUEST_BYTES
                || !matches!(
                    api,
                    ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
                ))
        {
            return Err(Close {
                reason: "unauthenticated",
                detail: format!(
                    "a {api:?} request of {len} bytes before authenticating (SASL/PLAIN with a \
                     token, --auth-tokens)"
                ),
            });
        }
        let produce = api == ApiKey::Produce;
        let cap = if produce {
            kafka.max_produce_bytes
        } else {
            KAFKA_MAX_CONTROL_REQUEST_BYTES
        };
        if len > cap {
            return Err(Close {
                reason: "request_too_large",
                detail: format!(
                    "a {api:?} request of {len} bytes, over the {cap} bytes read (for Produce, \
                     the message limit set by --max-batch-bytes)"
                ),
            });
        }
        // Charged before its bytes are read, so a full buffer holds the connection here: a
        // produce request as an append message of its size is (its decoded form is smaller
        // than what that allows for), any other request for what it may decode to.
        let charge = if produce || len > KAFKA_SMALL_REQUEST_BYTES {
            let bytes = if produce {
                received_charge(len)
            } else {
                PER_BATCH_OVERHEAD + len * KAFKA_DECODED_PER_WIRE_BYTE
            };
            // The token's share first, then the buffer, as a gRPC append's: a token whose
            // requests hold its share waits on its own, holding nothing of the buffer.
            let holder = nova_server::net::shares::holder(principal.as_deref());
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => return Ok(()),
                admitted = async {
                    let share = match &holder {
                        Some(holder) => Some(kafka.receiving.take_waiting(holder, bytes).await),
                        None => None,
                    };
                    (share, ctx.star.admission().admit(bytes).await)
                } => Some(admitted),
            }
        } else {
            None
        };
        // The share is held while the request is read and handed on (until this iteration
        // ends); the charge, as long as the request's work needs it.
        let (_receiving, charge) = match charge {
            Some((share, admitted)) => (share, Some(admitted)),
            None => (None, None),
        };
        let mut frame = BytesMut::zeroed(len as usize);
        frame[..4].copy_from_slice(&prefix[4..]);
        if read.read_exact(&mut frame[4..]).await.is_err() {
            return Ok(());
        }
        if let Some(charge) = &charge {
            charge.received();
        }
        let call = if anonymous {
            CallMark::none()
        } else {
            marks.begin()
        };
        let mut frame = frame.freeze();
        let Some((min, max)) = versions(api) else {
            return Err(Close {
                reason: "unsupported_api",
                detail: format!(
                    "{api:?}, which Nova's Kafka listener does not serve (docs/kafka.md)"
                ),
            });
        };
        if !(min..=max).contains(&version) {
            if api == ApiKey::ApiVersions {
                // Kafka's way: a version-0 answer naming the versions served, so the client
                // asks again with one of them.
                let correlation_id = correlation_id(&frame);
                let answer = ResponseKind::ApiVersions(
                    ApiVersionsResponse::default()
                        .with_error_code(
                            kafka_protocol::error::ResponseError::UnsupportedVersion.code(),
                        )
                        .with_api_keys(api_versions()),
                );
                let queued = Pending {
                    correlation_id,
                    api,
                    version: 0,
                    answer: Box::pin(async move { Some(Reply::new(answer)) }),
                    _call: call,
                    _charge: charge,
                };
                if pending.send(queued).await.is_err() {
                    return Ok(());
                }
                continue;
            }
            return Err(Close {
                reason: "unsupported_version",
                detail: format!("{api:?} version {version}; served: {min} to {max}"),
            });
        }
        let header = RequestHeader::decode(&mut frame, api.request_header_version(version));
        let request = header.and_then(|header| {
            RequestKind::decode(api, &mut frame, version).map(|request| (header, request))
        });
        let (header, request) = match request {
            Ok(decoded) => decoded,
            Err(error) => {
                return Err(Close {
                    reason: "malformed_request",
                    detail: format!("an unreadable {api:?} v{version} request: {error:#}"),
                });
            }
        };
        drop(frame);
        kafka
            .metrics
            .requests
            .with_label_values(&[&format!("{api:?}")])
            .inc();
        let mut close_after = None;
        let request = match (&kafka.tokens, request) {
            (_, RequestKind::SaslHandshake(request)) => {
                let (response, agreed) = super::sasl::handshake(&request);
                mechanism_agreed = agreed && version >= 1;
                if version == 0 {
                    // The exchange would follow outside Kafka's framing: not served.
                    close_after = Some(Close {
                        reason: "unauthenticated",
                        detail: "a version-0 SASL handshake (use SaslAuthenticate)".into(),
                    });
                }
                Err(response)
            }
            (Some(tokens), RequestKind::SaslAuthenticate(request)) if mechanism_agreed => {
                let (response, authenticated) = super::sasl::authenticate(tokens, &request);
                token = authenticated.as_ref().map(|(_, token)| token.clone());
                let authenticated = authenticated.map(|(principal, _)| principal);
                if authenticated.is_none() {
                    close_after = Some(Close {
                        reason: "sasl_authentication_failed",
                        detail: "its SASL/PLAIN token is not one this server knows".into(),
                    });
                }
                principal = authenticated;
                Err(response)
            }
            (None, RequestKind::SaslAuthenticate(_)) => {
                return Err(Close {
                    reason: "unauthenticated",
                    detail: "SASL, but this star checks no tokens (--auth-tokens)".into(),
                });
            }
            (_, RequestKind::SaslAuthenticate(_)) => {
                return Err(Close {
                    reason: "unauthenticated",
                    detail: "SaslAuthenticate before a SaslHandshake for PLAIN".into(),
                });
            }
            // The token is checked again on every request, as a gRPC call's is: one revoked
            // (or narrowed) since the connection authenticated stops working at once.
            (Some(tokens), request)
                if principal.is_some()
                    && !reauthenticate(tokens, token.as_ref(), &mut principal) =>
            {
                let _ = request;
                return Err(Close {
                    reason: "unauthenticated",
                    detail: "its token is no longer one this server knows".into(),
                });
            }
            (Some(_), request)
                if principal.is_none() && !matches!(request, RequestKind::ApiVersions(_)) =>
            {
                return Err(Close {
                    reason: "unauthenticated",
                    detail: format!(
                        "a {api:?} request before authenticating (SASL/PLAIN with a token, \
                         --auth-tokens)"
                    ),
                });
            }
            (_, request) => Ok(request),
        };
        let (answer, charge) = match (request, charge) {
            (Err(response), charge) => (
                Some(Box::pin(async move { Some(Reply::new(response)) }) as Answer),
                charge,
            ),
            (Ok(RequestKind::Produce(request)), Some(charge)) => (
                super::produce::produce(
                    kafka,
                    peer,
                    principal.as_deref(),
                    request,
                    version,
                    len,
                    charge,
                )
                .await,
                None,
            ),
            (Ok(request), charge) => {
                let client = header.client_id.as_deref().unwrap_or_default().to_owned();
                let who = Who {
                    peer,
                    client,
                    principal: principal.clone(),
                };
                (
                    Some(answer(kafka.clone(), who, request, version).await),
                    charge,
                )
            }
        };
        let Some(answer) = answer else { continue };
        let queued = Pending {
            correlation_id: header.correlation_id,
            api,
            version,
            answer,
            _call: call,
            _charge: charge,
        };
        if pending.send(queued).await.is_err() {
            return Ok(());
        }
        if let Some(close) = close_after {
            return Err(close);
        }
    }
}

/// Checks `token` again; keeps `principal` current (its grants may have changed on reload).
fn reauthenticate(
    tokens: &nova_server::net::Tokens,
    token: Option<&bytes::Bytes>,
    principal: &mut Option<Arc<nova_server::net::Principal>>,
) -> bool {
    let Some(token) = token else { return false };
    let mut bearer = b"Bearer ".to_vec();
    bearer.extend_from_slice(token);
    match tokens.authenticate(Some(&bearer)) {
        Ok(current) => {
            if principal.as_deref() != Some(&current) {
                *principal = Some(Arc::new(current));
            }
            true
        }
        Err(_) => {
            *principal = None;
            false
        }
    }
}

/// Who sent a request: its connection's peer, its client id, and the token it authenticated
/// with (none when the star checks no tokens).
pub struct Who {
    pub peer: SocketAddr,
    pub client: String,
    pub principal: Option<Arc<nova_server::net::Principal>>,
}

/// The correlation id of a request whose header could not be decoded at its version: it is
/// the first field after the API key and version in every header version.
fn correlation_id(frame: &Bytes) -> i32 {
    frame
        .get(4..8)
        .map_or(0, |id| i32::from_be_bytes([id[0], id[1], id[2], id[3]]))
}

/// A request other than Produce. What changes topics or producers, or says what exists, runs
/// now, before the connection reads on, so it takes effect in the order the client sent it
/// among the produce requests around it; reads and waits (fetches, offsets, group joins) run
/// when their turn to be answered comes.
async fn answer(kafka: Arc<Kafka>, who: Who, request: RequestKind, version: i16) -> Answer {
    let Who {
        peer,
        client,
        principal: owned,
    } = who;
    let principal = owned.as_deref();
    let now = |response| -> Answer { Box::pin(async move { Some(Reply::new(response)) }) };
    let request = match request {
        RequestKind::ApiVersions(_) => {
            return now(ResponseKind::ApiVersions(
                ApiVersionsResponse::default().with_api_keys(api_versions()),
            ));
        }
        RequestKind::Metadata(request) => {
            let answer = super::topics::metadata(&kafka, principal, request, version).await;
            return Box::pin(async move {
                Some(match answer {
                    Ok(response) => Reply::new(response),
                    Err(why) => {
                        Reply::closing(ResponseKind::Metadata(Default::default()), why.message)
                    }
                })
            });
        }
        RequestKind::CreateTopics(request) => {
            return now(super::topics::create(&kafka, principal, request, version).await);
        }
        RequestKind::DeleteTopics(request) => {
            return now(super::topics::delete(&kafka, principal, request, version).await);
        }
        RequestKind::InitProducerId(request) => {
            return now(kafka.producers.init(&kafka, principal, request).await);
        }
        RequestKind::CreatePartitions(request) => {
            return now(super::topics::grow(&kafka, principal, request).await);
        }
        RequestKind::DescribeConfigs(request) => {
            return now(super::configs::describe(&kafka, principal, request, version).await);
        }
        RequestKind::AlterConfigs(request) => {
            return now(super::configs::alter(&kafka, principal, request).await);
        }
        RequestKind::IncrementalAlterConfigs(request) => {
            return now(super::configs::alter_incrementally(&kafka, principal, request).await);
        }
        RequestKind::FindCoordinator(request) => {
            return now(super::group_api::find_coordinator(&kafka, request, version));
        }
        RequestKind::Heartbeat(request) => {
            return now(super::group_api::heartbeat(&kafka, principal, request));
        }
        RequestKind::LeaveGroup(request) => {
            return now(super::group_api::leave(&kafka, principal, request, version));
        }
        RequestKind::OffsetCommit(request) => {
            return now(super::group_api::commit(&kafka, principal, request).await);
        }
        RequestKind::OffsetFetch(request) => {
            return now(super::group_api::fetch_offsets(&kafka, principal, request, version).await);
        }
        RequestKind::ListGroups(_) => {
            return now(super::group_api::list(&kafka, principal, version).await);
        }
        RequestKind::DescribeGroups(request) => {
            return now(super::group_api::describe(&kafka, principal, request));
        }
        other => other,
    };
    Box::pin(async move {
        let principal = owned.as_deref();
        let response = match request {
            RequestKind::ListOffsets(request) => {
                super::offsets::list_offsets(&kafka, peer, principal, request, version).await
            }
            // Joins and syncs wait for the group's rebalance.
            RequestKind::JoinGroup(request) => {
                super::group_api::join(&kafka, peer, principal, client, request, version).await
            }
            RequestKind::SyncGroup(request) => {
                super::group_api::sync(&kafka, principal, request, version).await
            }
            RequestKind::Fetch(request) => {
                return Some(super::fetch::fetch(&kafka, peer, principal, request, version).await);
            }
            // `versions` admits no other API.
            other => {
                tracing::error!(
                    "a Kafka request the listener does not serve reached it: {other:?}"
                );
                return None;
            }
        };
        Some(Reply::new(response))
    })
}

/// An answer as the pieces to write, its length prefix and header first. A fetch's record
/// batches are pieces of their own, written as they were made rather than copied into the
/// frame; any other answer is one piece.
fn encode_answer(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    response: ResponseKind,
) -> Result<Vec<Bytes>, String> {
    let header_version = api.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    if let ResponseKind::Fetch(fetched) = &response
        && nova_kafka::fetch_frame::VERSIONS.contains(&version)
    {
        let mut encoded = BytesMut::new();
        header
            .encode(&mut encoded, header_version)
            .map_err(|e| format!("{e:#}"))?;
        return nova_kafka::fetch_frame::fetch_frame(&encoded, fetched, version)
            .map_err(|e| e.to_string());
    }
    let mut out = BytesMut::new();
    out.put_i32(0);
    header
        .encode(&mut out, header_version)
        .and_then(|()| response.encode(&mut out, version))
        .map_err(|e| format!("{e:#}"))?;
    let len = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(vec![out.freeze()])
}

/// Writes `pieces` in order, several to a write where the connection takes them (a fetch's
/// small pieces between its batches would otherwise each be a segment of their own); each is
/// dropped once written.
async fn write_pieces(
    write: &mut tokio::io::WriteHalf<Conn>,
    pieces: Vec<Bytes>,
) -> std::io::Result<()> {
    use bytes::Buf;
    let mut pieces: std::collections::VecDeque<Bytes> = pieces.into();
    while !pieces.is_empty() {
        let slices: Vec<std::io::IoSlice<'_>> = pieces
            .iter()
            .take(64)
            .map(|p| std::io::IoSlice::new(p))
            .collect();
        let mut written = write.write_vectored(&slices).await?;
        drop(slices);
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let Some(front) = pieces.front_mut() else {
                break;
            };
            if written >= front.len() {
                written -= front.len();
                pieces.pop_front();
            } else {
                front.advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}

async fn write_answers(
    mut pending: mpsc::Receiver<Pending>,
    mut write: tokio::io::WriteHalf<Conn>,
    marks: &nova_server::net::conn::CallMarks,
) {
    while let Some(next) = pending.recv().await {
        let Some(reply) = next.answer.await else {
            continue;
        };
        if let Some(why) = reply.close {
            tracing::warn!(api = ?next.api, "closing a Kafka connection instead of answering: {why}");
            return;
        }
        // An answer holding a charge (a fetch's pages) must be taken within --send-timeout.
        let _sending = reply.hold.is_some().then(|| marks.begin_send());
        let pieces = encode_answer(next.api, next.version, next.correlation_id, reply.response);
        let pieces = match pieces {
            Ok(pieces) => pieces,
            Err(error) => {
                // A field set that the client's version lacks: Nova's bug, not the client's.
                tracing::error!(
                    api = ?next.api,
                    version = next.version,
                    "a Kafka answer could not be encoded; closing the connection: {error}"
                );
                return;
            }
        };
        if write_pieces(&mut write, pieces).await.is_err() {
            return;
        }
        drop(reply.hold);
    }
}
