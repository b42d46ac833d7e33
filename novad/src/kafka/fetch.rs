//! `Fetch`: pages of each partition's stream from the requested offsets, as one record batch
//! per partition, served from the tail cache or the object store as any read is. A fetch that
//! finds fewer than `min_bytes` waits at the tails for up to `max_wait_ms` (capped as a gRPC
//! read's wait is), holding one subscription place (`--max-subscriptions`) and nothing else.
//! Past the cap the fetch is answered empty with `throttle_time_ms`, so the client backs off;
//! the shed is counted and logged as a gRPC read's is.
//!
//! Fetch sessions (KIP-227) are not kept: every answer has session id 0, which tells clients to
//! send full fetches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ResponseKind};

use nova_chain::ReadCharge;
use nova_chain::streams::StreamState;
use nova_core::limits::MAX_READ_WAIT_MS;
use nova_kafka::encode::encode_batch;
use nova_kafka::errors::KafkaRefusal;

use nova_server::net::{Principal, Scope};

use super::Kafka;
use super::conn::Reply;

/// One requested partition.
struct Wanted {
    index: i32,
    offset: i64,
    max_bytes: i64,
    stream: Result<Arc<StreamState>, KafkaRefusal>,
}

/// One partition's part of the answer.
struct Found {
    index: i32,
    error: Option<KafkaRefusal>,
    high_watermark: i64,
    log_start: i64,
    records: Bytes,
}

pub async fn fetch(
    kafka: &Kafka,
    peer: SocketAddr,
    principal: Option<&Principal>,
    request: FetchRequest,
    version: i16,
) -> Reply {
    let ctx = &kafka.ctx;
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut wanted = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let stream =
                match super::partition_stream(&topic.topic, partition.partition).and_then(|name| {
                    super::allowed(kafka, principal, Scope::Read, &name).map(|()| name)
                }) {
                    Ok(name) => ctx
                        .route(&name, Some(peer), principal)
                        .await
                        .map_err(|e| KafkaRefusal::from(&e)),
                    Err(refusal) => Err(refusal),
                };
            wanted.push(Wanted {
                index: partition.partition,
                offset: partition.fetch_offset,
                max_bytes: i64::from(partition.partition_max_bytes),
                stream,
            });
        }
        topics.push((topic.topic, wanted));
    }
    let first_stream = topics
        .iter()
        .flat_map(|(_, w)| w.iter())
        .find_map(|w| w.stream.as_ref().ok().map(|s| s.name().to_owned()));
    let _place = match ctx.subscriptions.admit(Some(peer), first_stream.as_deref()) {
        Ok(place) => place,
        Err(shed) => {
            let throttle = KafkaRefusal::from(&shed).throttle_ms();
            return respond(kafka, version, throttle, Vec::new(), Vec::new());
        }
    };
    let clock = ctx.star.config().clock;
    let wait = Duration::from_millis((request.max_wait_ms.max(0) as u64).min(MAX_READ_WAIT_MS));
    let deadline = clock.now() + wait;
    let min_bytes = request.min_bytes.max(0) as u64;
    loop {
        let mut budget = i64::from(request.max_bytes.max(1));
        let mut holds = Vec::new();
        let mut answers = Vec::with_capacity(topics.len());
        let mut found_bytes = 0u64;
        let mut errors = false;
        for (name, wanted) in &topics {
            let mut parts = Vec::with_capacity(wanted.len());
            for want in wanted {
                let found = read_one(kafka, want, &mut budget, &mut holds).await;
                found_bytes += found.records.len() as u64;
                errors |= found.error.is_some();
                parts.push(found);
            }
            answers.push((name.clone(), parts));
        }
        let now = clock.now();
        if found_bytes >= min_bytes || errors || now >= deadline || ctx.shutdown.is_cancelled() {
            return respond(kafka, version, 0, answers, holds);
        }
        drop(holds);
        // Wait for any of the streams to grow past where it stands now (not past the offset
        // asked for: a partition that had some records would end the wait at once), the
        // deadline, or shutdown.
        let waits: Vec<_> = topics
            .iter()
            .flat_map(|(_, w)| w.iter())
            .filter_map(|want| {
                let stream = want.stream.as_ref().ok()?.clone();
                let from = u64::try_from(want.offset).ok()?.max(stream.tail());
                let left = deadline.saturating_duration_since(now);
                Some(async move { stream.wait_past(from, left, clock).await }.boxed())
            })
            .collect();
        if waits.is_empty() {
            return respond(kafka, version, 0, answers, Vec::new());
        }
        tokio::select! {
            _ = futures::future::select_all(waits) => {}
            _ = ctx.shutdown.cancelled() => {}
        }
    }
}

/// Reads one partition within what is left of the request's byte limit.
async fn read_one(
    kafka: &Kafka,
    want: &Wanted,
    budget: &mut i64,
    holds: &mut Vec<ReadCharge>,
) -> Found {
    let ctx = &kafka.ctx;
    let mut found = Found {
        index: want.index,
        error: None,
        high_watermark: -1,
        log_start: -1,
        records: Bytes::new(),
    };
    let stream = match &want.stream {
        Ok(stream) => stream,
        Err(refusal) => {
            found.error = Some(refusal.clone());
            return found;
        }
    };
    let tail = stream.tail();
    found.high_watermark = tail as i64;
    found.log_start = stream.first_seq_cached() as i64;
    let out_of_range = |what: String| KafkaRefusal::new(ResponseError::OffsetOutOfRange, what);
    let Ok(offset) = u64::try_from(want.offset) else {
        found.error = Some(out_of_range(format!("offset {} is negative", want.offset)));
        return found;
    };
    if offset > tail {
        found.error = Some(out_of_range(format!(
            "offset {offset} is past the partition's end ({tail})"
        )));
        return found;
    }
    // The request's limit counts the first partition in full; past it, nothing more is read.
    if offset == tail || (*budget <= 0 && !holds.is_empty()) {
        return found;
    }
    let max_bytes = (want.max_bytes.min(*budget).max(1) as u64).min(ctx.max_read_bytes);
    // Only the first page read may wait for room in the read budget: one that waited while
    // holding the others' could wait on itself.
    let read = if holds.is_empty() {
        ctx.star
            .read(stream, offset, ctx.max_read_records, max_bytes)
            .await
    } else {
        ctx.star
            .read_if_room(stream, offset, ctx.max_read_records, max_bytes)
            .await
    };
    match read {
        Ok(page) if page.records.is_empty() => {}
        Ok(page) => {
            // Counted as any read's records are.
            ctx.metrics.read_records.inc_by(page.records.len() as u64);
            ctx.metrics
                .read_bytes
                .inc_by(page.records.iter().map(|r| r.record.content_bytes()).sum());
            found.records = encode_batch(&page.records);
            *budget -= found.records.len() as i64;
            holds.push(page.charge);
        }
        // Trimmed away: OFFSET_OUT_OF_RANGE, and the consumer resets.
        Err(error) => found.error = Some(KafkaRefusal::from(&error)),
    }
    found
}

fn respond(
    kafka: &Kafka,
    version: i16,
    throttle_ms: i32,
    answers: Vec<(kafka_protocol::messages::TopicName, Vec<Found>)>,
    holds: Vec<ReadCharge>,
) -> Reply {
    let mut throttle = throttle_ms;
    let responses = answers
        .into_iter()
        .map(|(topic, parts)| {
            let partitions = parts
                .into_iter()
                .map(|found| {
                    let mut data = PartitionData::default()
                        .with_partition_index(found.index)
                        .with_high_watermark(found.high_watermark)
                        .with_last_stable_offset(found.high_watermark)
                        .with_records(Some(found.records));
                    if version >= 5 {
                        data.log_start_offset = found.log_start;
                    }
                    if let Some(refusal) = found.error {
                        kafka.metrics.answered("Fetch", refusal.error);
                        throttle = throttle.max(refusal.throttle_ms());
                        data.error_code = refusal.code();
                    }
                    data
                })
                .collect();
            FetchableTopicResponse::default()
                .with_topic(topic)
                .with_partitions(partitions)
        })
        .collect();
    Reply {
        response: ResponseKind::Fetch(
            FetchResponse::default()
                .with_throttle_time_ms(throttle)
                .with_responses(responses),
        ),
        hold: Some(Box::new(holds)),
        close: None,
    }
}
