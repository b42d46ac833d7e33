//! `ListOffsets`: a partition's earliest offset (its stream's trim point, after retention),
//! its latest (the tail: the offset the next record gets), the offset of its newest record
//! (`-3`, max timestamp), or the first offset whose record is stamped at or after a time.

use std::net::SocketAddr;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse, ResponseKind};

use nova_kafka::errors::KafkaRefusal;
use nova_proto::RequestError;

use nova_server::net::{Principal, Scope};

use super::Kafka;

const EARLIEST: i64 = -2;
const LATEST: i64 = -1;
const MAX_TIMESTAMP: i64 = -3;

/// Pages a search by time reads past where the index put it before it settles for the
/// offset it reached (the index lands within a section of the record, so one or two pages do).
const TIME_SEARCH_PAGES: usize = 4;

/// The most a page of a search by time holds.
const TIME_SEARCH_PAGE_BYTES: u64 = nova_core::limits::MIB;

pub async fn list_offsets(
    kafka: &Kafka,
    peer: SocketAddr,
    principal: Option<&Principal>,
    request: ListOffsetsRequest,
    version: i16,
) -> ResponseKind {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let mut answer = ListOffsetsPartitionResponse::default()
                .with_partition_index(partition.partition_index);
            let found = match super::partition_stream(&topic.name, partition.partition_index)
                .and_then(|name| {
                    super::allowed(kafka, principal, Scope::Read, &name).map(|()| name)
                }) {
                Ok(stream) => offset_of(kafka, peer, &stream, partition.timestamp).await,
                Err(refusal) => Err(refusal),
            };
            match found {
                Ok((offset, timestamp)) => {
                    answer.offset = offset;
                    answer.timestamp = timestamp;
                    if version >= 4 {
                        answer.leader_epoch = 0;
                    }
                }
                Err(refusal) => {
                    kafka.metrics.answered("ListOffsets", refusal.error);
                    answer.error_code = refusal.code();
                }
            }
            partitions.push(answer);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    ResponseKind::ListOffsets(ListOffsetsResponse::default().with_topics(topics))
}

/// The offset (and, for a search by time, the record's timestamp; else -1).
async fn offset_of(
    kafka: &Kafka,
    peer: SocketAddr,
    name: &str,
    timestamp: i64,
) -> Result<(i64, i64), KafkaRefusal> {
    let ctx = &kafka.ctx;
    let refuse = |e: RequestError| KafkaRefusal::from(&e);
    let stream = ctx.route(name, Some(peer), None).await.map_err(refuse)?;
    let star = &ctx.star;
    match timestamp {
        LATEST => Ok((stream.tail() as i64, -1)),
        EARLIEST => Ok((star.first_seq(&stream).await.map_err(refuse)? as i64, -1)),
        MAX_TIMESTAMP => {
            let first = star.first_seq(&stream).await.map_err(refuse)?;
            let tail = stream.tail();
            if tail <= first {
                return Ok((-1, -1));
            }
            let page = star.read(&stream, tail - 1, 1, 1).await.map_err(refuse)?;
            Ok(page
                .records
                .first()
                .map_or((-1, -1), |r| (r.seq as i64, r.record.timestamp as i64)))
        }
        at if at >= 0 => {
            let at = at as u64;
            let first = star.first_seq(&stream).await.map_err(refuse)?;
            let mut seq = star.seek_time(&stream, first, at).await.map_err(refuse)?;
            for _ in 0..TIME_SEARCH_PAGES {
                if seq >= stream.tail() {
                    return Ok((-1, -1));
                }
                let page = star
                    .read(
                        &stream,
                        seq,
                        ctx.max_read_records,
                        TIME_SEARCH_PAGE_BYTES.min(ctx.max_read_bytes),
                    )
                    .await
                    .map_err(refuse)?;
                if let Some(found) = page.records.iter().find(|r| r.record.timestamp >= at) {
                    return Ok((found.seq as i64, found.record.timestamp as i64));
                }
                seq = page.next_seq;
            }
            Ok((seq as i64, -1))
        }
        other => Err(KafkaRefusal::new(
            ResponseError::InvalidRequest,
            format!("timestamp {other} names no offset Nova's Kafka listener knows"),
        )),
    }
}
