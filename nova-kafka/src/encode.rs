//! Records as a fetch sends them: one uncompressed record batch (magic 2) per page.
//!
//! Written here rather than with kafka-protocol's encoder, which keeps a record's headers in a
//! map and so drops all but one of several headers with the same name; Kafka allows them, and
//! Nova keeps them.

use bytes::{BufMut, Bytes, BytesMut};
use nova_proto::domain::SequencedRecord;

use crate::batch::BATCH_HEADER_BYTES;
use crate::mapping::{KafkaRecord, to_kafka};

/// The records (consecutive sequence numbers, at least one) as one batch whose offsets are
/// their sequence numbers.
pub fn encode_batch(records: &[SequencedRecord]) -> Bytes {
    let Some(first) = records.first() else {
        return Bytes::new();
    };
    let kafka: Vec<KafkaRecord> = records.iter().map(|r| to_kafka(&r.record)).collect();
    let base_timestamp = kafka[0].timestamp;
    let max_timestamp = kafka
        .iter()
        .map(|r| r.timestamp)
        .max()
        .unwrap_or(base_timestamp);
    let bodies: Vec<usize> = kafka
        .iter()
        .enumerate()
        .map(|(i, r)| record_body_len(r, r.timestamp.wrapping_sub(base_timestamp), i as i64))
        .collect();
    let size = BATCH_HEADER_BYTES
        + bodies
            .iter()
            .map(|&body| varint_len(body as i64) + body)
            .sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    out.put_i64(first.seq as i64);
    out.put_i32((size - 12) as i32);
    // Partition leader epoch: Nova has no replica epochs to fence with.
    out.put_i32(0);
    out.put_i8(2);
    let crc_at = out.len();
    out.put_u32(0);
    // CreateTime, no compression, not transactional.
    out.put_i16(0);
    out.put_i32(records.len() as i32 - 1);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    // No producer: -1 for its id, epoch and sequence.
    out.put_i64(-1);
    out.put_i16(-1);
    out.put_i32(-1);
    out.put_i32(records.len() as i32);
    for (i, (record, body)) in kafka.iter().zip(&bodies).enumerate() {
        put_varint(&mut out, *body as i64);
        out.put_i8(0);
        put_varint(&mut out, record.timestamp.wrapping_sub(base_timestamp));
        put_varint(&mut out, i as i64);
        put_nullable(&mut out, record.key.as_deref());
        put_nullable(&mut out, record.value.as_deref());
        put_varint(&mut out, record.headers.len() as i64);
        for (name, value) in &record.headers {
            put_nullable(&mut out, Some(name.as_bytes()));
            put_nullable(&mut out, value.as_deref());
        }
    }
    let crc = crc_fast::crc32_iscsi(&out[crc_at + 4..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

fn record_body_len(record: &KafkaRecord, timestamp_delta: i64, offset_delta: i64) -> usize {
    1 + varint_len(timestamp_delta)
        + varint_len(offset_delta)
        + nullable_len(record.key.as_deref())
        + nullable_len(record.value.as_deref())
        + varint_len(record.headers.len() as i64)
        + record
            .headers
            .iter()
            .map(|(name, value)| {
                nullable_len(Some(name.as_bytes())) + nullable_len(value.as_deref())
            })
            .sum::<usize>()
}

fn nullable_len(bytes: Option<&[u8]>) -> usize {
    match bytes {
        Some(bytes) => varint_len(bytes.len() as i64) + bytes.len(),
        None => varint_len(-1),
    }
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn varint_len(value: i64) -> usize {
    let bits = 64 - zigzag(value).leading_zeros() as usize;
    bits.div_ceil(7).max(1)
}

fn put_varint(out: &mut BytesMut, value: i64) {
    let mut raw = zigzag(value);
    while raw >= 0x80 {
        out.put_u8((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    out.put_u8(raw as u8);
}

fn put_nullable(out: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        Some(bytes) => {
            put_varint(out, bytes.len() as i64);
            out.put_slice(bytes);
        }
        None => put_varint(out, -1),
    }
}
