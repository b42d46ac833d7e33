//! `Produce`: each partition's records become one append to its stream, charged, checked
//! against the caps and handed to the packer in the order the requests arrived; the answer
//! waits until every partition's append is durable (or refused). With `acks=0` nothing is
//! answered, and the records are still durable before any read sees them.
//!
//! The charge: the request was charged from its length prefix as an append message is
//! (`conn`), and must cover, at each point, the request, one partition's decompressed records,
//! the records decoded from them and the fragments they encode to. What a partition needs
//! beyond it is taken only if the buffer has room now (`Admitted::try_grow`: a request that
//! holds a charge never waits for more); if not, that partition is refused with a retriable
//! error and its client retries it. Each partition's append then leaves with its fragments'
//! exact charge (`Admitted::split_batch`), and the rest is returned once the request is done.

use std::mem::size_of;
use std::net::SocketAddr;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use nova_chain::admission::{Admitted, PER_BATCH_OVERHEAD, encoded_charge, held_charge};
use nova_core::flight::section::encode_chunks;
use nova_core::limits::MAX_SECTION_BYTES;
use nova_kafka::batch::{Codec, Measure, RawBatch, measure, records, split_batches};
use nova_kafka::decompress::{DecompressError, decompress};
use nova_kafka::errors::KafkaRefusal;
use nova_kafka::mapping::{ProducerMark, stream_of};
use nova_proto::RequestError;
use nova_proto::domain::{Header, Record};

use nova_server::net::{Principal, Scope};

use super::Kafka;
use super::conn::{Answer, Reply};
use super::idempotence::Verdict;

/// What one partition came to before its answer.
enum Outcome {
    Refused(KafkaRefusal),
    /// Submitted (or, for a retried idempotent batch, submitted before): its first offset.
    Pending(BoxFuture<'static, Result<u64, KafkaRefusal>>),
}

/// Charges, checks and submits every partition's records, in order; the answer awaits their
/// durability. `None` for `acks=0`, which is not answered.
pub async fn produce(
    kafka: &Kafka,
    peer: SocketAddr,
    principal: Option<&Principal>,
    request: ProduceRequest,
    version: i16,
    frame_len: u64,
    mut charge: Admitted,
) -> Option<Answer> {
    let base = PER_BATCH_OVERHEAD + frame_len;
    let transactional = request.transactional_id.is_some();
    let mut topics = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for partition in topic.partition_data {
            let outcome =
                if let Err(refusal) = super::partition_stream(&topic.name, partition.index) {
                    Outcome::Refused(refusal)
                } else if !matches!(request.acks, -1..=1) {
                    Outcome::Refused(KafkaRefusal::new(
                        kafka_protocol::error::ResponseError::InvalidRequiredAcks,
                        format!("acks={} (0, 1 and -1 are served)", request.acks),
                    ))
                } else if transactional {
                    Outcome::Refused(KafkaRefusal::new(
                        kafka_protocol::error::ResponseError::TransactionalIdAuthorizationFailed,
                        "transactions are not supported by Nova's Kafka listener (docs/kafka.md)",
                    ))
                } else {
                    let stream = stream_of(&topic.name, partition.index);
                    match append(
                        kafka,
                        peer,
                        principal,
                        &stream,
                        partition.records,
                        base,
                        &mut charge,
                    )
                    .await
                    {
                        Ok(pending) => Outcome::Pending(pending),
                        Err(refusal) => Outcome::Refused(refusal),
                    }
                };
            partitions.push((partition.index, outcome));
        }
        topics.push((topic.name, partitions));
    }
    // The request's bytes are gone; what each append holds left with it.
    drop(charge);
    if request.acks == 0 {
        return None;
    }
    let metrics = kafka.metrics.clone();
    Some(Box::pin(async move {
        let mut throttle = 0;
        let mut responses = Vec::with_capacity(topics.len());
        for (name, partitions) in topics {
            let mut answers = Vec::with_capacity(partitions.len());
            for (index, outcome) in partitions {
                let result = match outcome {
                    Outcome::Refused(refusal) => Err(refusal),
                    Outcome::Pending(pending) => pending.await,
                };
                let mut answer = PartitionProduceResponse::default().with_index(index);
                match result {
                    Ok(base_offset) => answer.base_offset = base_offset as i64,
                    Err(refusal) => {
                        metrics.answered("Produce", refusal.error);
                        throttle = throttle.max(refusal.throttle_ms());
                        answer.error_code = refusal.code();
                        if version >= 8 {
                            answer.error_message = Some(StrBytes::from_string(refusal.message));
                        }
                    }
                }
                answers.push(answer);
            }
            responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(answers),
            );
        }
        Some(Reply::new(ResponseKind::Produce(
            ProduceResponse::default()
                .with_responses(responses)
                .with_throttle_time_ms(throttle),
        )))
    }))
}

/// One partition's records: routed, decoded within the charge, checked and submitted.
async fn append(
    kafka: &Kafka,
    peer: SocketAddr,
    principal: Option<&Principal>,
    stream: &str,
    data: Option<Bytes>,
    base: u64,
    charge: &mut Admitted,
) -> Result<BoxFuture<'static, Result<u64, KafkaRefusal>>, KafkaRefusal> {
    let ctx = &kafka.ctx;
    let refuse = |error: RequestError| {
        crate::service::reject_append(ctx, Some(peer), &error, stream);
        KafkaRefusal::from(&error)
    };
    ctx.access
        .check(principal, Scope::Append, stream)
        .map_err(refuse)?;
    let target = ctx
        .route(stream, Some(peer), principal)
        .await
        .map_err(refuse)?;
    let data = data.ok_or_else(|| refuse(RequestError::EmptyBatch))?;
    let batches = split_batches(data).map_err(|e| refuse_batch(ctx, peer, stream, &e))?;
    let caps = ctx.caps;
    let declared: u64 = batches.iter().map(|b| b.header.record_count as u64).sum();
    if declared > caps.max_batch_records as u64 {
        return Err(refuse(RequestError::TooManyRecords {
            records: declared,
            cap: caps.max_batch_records,
        }));
    }
    // An idempotent producer's retry is answered with its first outcome; a new batch is
    // reserved before anything else can refuse it (dropping the reservation unreserves it).
    let mark = producer_mark(&batches).map_err(refuse)?;
    let reservation = match &mark {
        Some(mark) => {
            let learned = kafka.producers.learn(kafka, &target, mark).await?;
            let owner = principal.map(|p| p.name.as_str()).unwrap_or_default();
            match kafka.producers.check(&target, mark, owner, learned) {
                Verdict::Duplicate(outcome) => return Ok(outcome.boxed()),
                Verdict::Refused(refusal) => return Err(refusal),
                Verdict::New(reservation, outcome) => Some((reservation, outcome)),
            }
        }
        None => None,
    };
    // Decompressed, each batch may hold the caps' worth of records and Kafka's framing of
    // them; past that it is refused as it inflates.
    let limit = caps.max_batch_bytes + 64 * caps.max_batch_records as u64;
    // Decompressed bytes held so far (an uncompressed batch is a slice of the request, which
    // `base` already counts).
    let mut inflated = 0u64;
    let mut held = base;
    let mut decoded = Vec::with_capacity(batches.len());
    let mut total = Measure::default();
    for batch in batches {
        if batch.header.transactional() || batch.header.control() {
            return Err(KafkaRefusal::new(
                kafka_protocol::error::ResponseError::TransactionalIdAuthorizationFailed,
                "transactional batches are not supported by Nova's Kafka listener (docs/kafka.md)",
            ));
        }
        let codec = batch
            .header
            .codec()
            .map_err(|e| refuse_batch(ctx, peer, stream, &e))?;
        let left = limit.saturating_sub(inflated);
        let plain = decompress(codec, &batch.records, left, &mut |more| {
            held += more;
            room(kafka, charge, held)
        })
        .map_err(|e| refuse_decompress(ctx, peer, stream, &e))?;
        if codec != Codec::None {
            inflated += plain.len() as u64;
        }
        held = base + inflated;
        total.add(measure(&plain, &batch.header).map_err(|e| refuse_batch(ctx, peer, stream, &e))?);
        decoded.push((batch.header, plain));
    }
    check_caps(&total, caps).map_err(refuse)?;
    if let Some(mark) = &mark {
        let header = mark.header();
        total.headers += 1;
        total.content_bytes += (header.name.len() + header.value.len()) as u64;
    }
    // Decoded records and their fragments, beside the decompressed bytes.
    let records_bytes =
        total.records * size_of::<Record>() as u64 + total.headers * size_of::<Header>() as u64;
    let fragments = encoded_charge(total.records, total.headers, total.content_bytes);
    if !room(kafka, charge, base + inflated + records_bytes + fragments) {
        return Err(refuse_decompress(
            ctx,
            peer,
            stream,
            &DecompressError::NoRoom,
        ));
    }
    let mut out = Vec::with_capacity(total.records as usize);
    for (header, plain) in &decoded {
        records(plain, header, &mut out).map_err(|e| refuse_batch(ctx, peer, stream, &e))?;
    }
    drop(decoded);
    if let (Some(mark), Some(last)) = (&mark, out.last_mut()) {
        last.headers.push(mark.header());
    }
    let now = ctx.star.config().clock.unix_ms();
    for record in &mut out {
        if record.timestamp == 0 {
            record.timestamp = now;
        }
    }
    let chunks = encode_chunks(&out, MAX_SECTION_BYTES as usize);
    drop(out);
    let part = charge
        .split_batch(held_charge(&chunks))
        .ok_or_else(|| refuse_decompress(ctx, peer, stream, &DecompressError::NoRoom))?;
    let reply = ctx
        .star
        .submit(target, chunks, total.content_bytes, None, part)
        .await
        .map_err(refuse)?;
    Ok(match reservation {
        Some((reservation, outcome)) => {
            reservation.submitted(reply);
            outcome.boxed()
        }
        None => async move {
            match reply.await {
                Ok(Ok(range)) => Ok(range.start),
                Ok(Err(error)) => Err(KafkaRefusal::from(&error)),
                Err(_) => Err(KafkaRefusal::from(&nova_core::refusal::shutting_down())),
            }
        }
        .boxed(),
    })
}

/// The idempotent producer's mark for a partition's batches, if they come from one: every
/// batch from the same producer and epoch, their sequence numbers following on.
fn producer_mark(batches: &[RawBatch]) -> Result<Option<ProducerMark>, RequestError> {
    let Some(first) = batches.first().map(|b| &b.header) else {
        return Ok(None);
    };
    if first.producer_id < 0 {
        return Ok(None);
    }
    let mut records: i32 = 0;
    for batch in batches {
        let header = &batch.header;
        let follows = first.base_sequence.wrapping_add(records) & i32::MAX;
        if header.producer_id != first.producer_id
            || header.producer_epoch != first.producer_epoch
            || header.base_sequence != follows
        {
            return Err(RequestError::InvalidRequest(
                "the batches of one partition in a produce request come from different \
                 producers, or their sequence numbers do not follow on"
                    .into(),
            ));
        }
        records = records.saturating_add(header.record_count);
    }
    Ok(Some(ProducerMark {
        producer_id: first.producer_id,
        epoch: first.producer_epoch,
        base_sequence: first.base_sequence,
        records,
    }))
}

/// Whether the request's charge covers `needed`, growing it if the buffer has room now.
fn room(kafka: &Kafka, charge: &mut Admitted, needed: u64) -> bool {
    let held = charge.charged();
    needed <= held || charge.try_grow(kafka.ctx.star.admission(), needed - held)
}

/// The caps, judged on the decompressed records as on an append's (the same checks, in the
/// same order).
fn check_caps(total: &Measure, caps: nova_proto::validate::AppendCaps) -> Result<(), RequestError> {
    nova_proto::validate::check_record_count(total.records, &caps)?;
    if total.largest_record > caps.max_record_bytes {
        return Err(RequestError::RecordTooLarge {
            index: total.largest_at,
            bytes: total.largest_record,
            cap: caps.max_record_bytes,
        });
    }
    nova_proto::validate::check_batch_size(total.headers, total.content_bytes, &caps)
}

fn refuse_batch(
    ctx: &crate::service::Context,
    peer: SocketAddr,
    stream: &str,
    error: &nova_kafka::batch::BatchError,
) -> KafkaRefusal {
    let refusal = RequestError::InvalidRequest(format!("produce to {stream}: {error}"));
    crate::service::reject_append(ctx, Some(peer), &refusal, stream);
    KafkaRefusal::from(error)
}

/// A decompression refused: too large or corrupt is the batch's fault; no room is a shed,
/// counted and logged as one (`kafka_produce_room`).
fn refuse_decompress(
    ctx: &crate::service::Context,
    peer: SocketAddr,
    stream: &str,
    error: &DecompressError,
) -> KafkaRefusal {
    let refusal = KafkaRefusal::from(error);
    match error {
        DecompressError::NoRoom => {
            let shed = RequestError::CapReached {
                cap: "--s3-memory-buffer-mib",
                limit: ctx.star.admission().budget().capacity(),
                what: "the admission buffer has no room now for this produce request's \
                       decompressed records",
                retry_after: refusal.retry_after.unwrap_or_default(),
            };
            crate::service::caps::record_shed(
                &ctx.metrics,
                &ctx.sheds,
                "kafka_produce_room",
                &shed,
                Some(stream),
                Some(peer),
            );
        }
        _ => {
            let rejected = RequestError::InvalidRequest(format!("produce to {stream}: {error}"));
            crate::service::reject_append(ctx, Some(peer), &rejected, stream);
        }
    }
    refusal
}
