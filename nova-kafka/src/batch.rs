//! Record batches as producers send them (magic 2, Kafka 0.11 and later), parsed by hand.
//!
//! kafka-protocol decodes every request message, but its record decoder reserves room for as
//! many records, and as many headers per record, as the batch declares: a few hostile bytes
//! declaring two billion of them would have the star abort on an allocation it cannot make.
//! Here nothing is sized from a count: a batch is walked once to check its framing and measure
//! it (`measure`), charged, and only then turned into records (`records`), whose bodies and
//! header values are slices of the buffer they arrived in.
//!
//! The layout (all integers big-endian; records use zigzag varints):
//!
//! ```text
//! base_offset i64 | batch_length i32 | partition_leader_epoch i32 | magic i8 | crc u32 |
//! attributes i16 | last_offset_delta i32 | base_timestamp i64 | max_timestamp i64 |
//! producer_id i64 | producer_epoch i16 | base_sequence i32 | record_count i32 | records…
//!
//! record: length varint | attributes i8 | timestamp_delta varlong | offset_delta varint |
//!         key_length varint | key | value_length varint | value | header_count varint |
//!         (header_key_length varint | header_key | header_value_length varint | value)…
//! ```
//!
//! The crc (crc32c) covers everything from `attributes` to the batch's end.

use bytes::{Buf, Bytes};
use nova_proto::domain::Record;

use crate::mapping::{KafkaHeader, to_nova};

/// Bytes before the first record.
pub const BATCH_HEADER_BYTES: usize = 61;
/// `base_offset` and `batch_length`: what `batch_length` does not count.
const LENGTH_PREFIX_BYTES: usize = 12;
/// Where the crc'd part starts (`attributes`).
const CRC_FROM: usize = 21;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    #[error("record batch is cut short ({0})")]
    Truncated(&'static str),
    #[error("record batch has magic {0}; only magic 2 (Kafka 0.11 and later clients) is accepted")]
    Magic(i8),
    #[error(
        "record batch is corrupt: its crc32c is {stored:#010x} but its bytes sum to {computed:#010x}"
    )]
    Checksum { stored: u32, computed: u32 },
    #[error("record batch is malformed: {0}")]
    Malformed(&'static str),
    #[error("record batch uses compression codec {0}, which Kafka does not define")]
    Codec(i16),
}

/// How a batch's records are compressed (the low three bits of its attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// A batch's fixed fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    pub fn codec(&self) -> Result<Codec, BatchError> {
        Ok(match self.attributes & 0x7 {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            other => return Err(BatchError::Codec(other)),
        })
    }

    /// Timestamps set by the broker (LogAppendTime) rather than the producer.
    pub fn log_append_time(&self) -> bool {
        self.attributes & 0x8 != 0
    }

    pub fn transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }

    pub fn control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
}

/// One batch as received: its header, and its records still in their wire form (compressed
/// when the header says so).
#[derive(Debug, Clone)]
pub struct RawBatch {
    pub header: BatchHeader,
    pub records: Bytes,
}

/// Splits a produce request's records field into its batches, checking each one's magic,
/// length and checksum. Nothing is allocated per declared count: each batch takes at least
/// `BATCH_HEADER_BYTES` of the input.
pub fn split_batches(mut data: Bytes) -> Result<Vec<RawBatch>, BatchError> {
    let mut batches = Vec::new();
    while !data.is_empty() {
        if data.len() < BATCH_HEADER_BYTES {
            return Err(BatchError::Truncated("a batch header"));
        }
        let length = i32::from_be_bytes(data[8..12].try_into().unwrap_or_default());
        let magic = data[16] as i8;
        if magic != 2 {
            return Err(BatchError::Magic(magic));
        }
        let Ok(length) = usize::try_from(length) else {
            return Err(BatchError::Malformed("a negative batch length"));
        };
        let end = LENGTH_PREFIX_BYTES
            .checked_add(length)
            .filter(|end| *end >= BATCH_HEADER_BYTES)
            .ok_or(BatchError::Malformed(
                "a batch length shorter than its header",
            ))?;
        if end > data.len() {
            return Err(BatchError::Truncated(
                "a batch longer than the request holds",
            ));
        }
        let batch = data.split_to(end);
        let stored = u32::from_be_bytes(batch[17..21].try_into().unwrap_or_default());
        let computed = crc_fast::crc32_iscsi(&batch[CRC_FROM..]);
        if stored != computed {
            return Err(BatchError::Checksum { stored, computed });
        }
        let mut fields = &batch[CRC_FROM..BATCH_HEADER_BYTES];
        let header = BatchHeader {
            attributes: fields.get_i16(),
            last_offset_delta: fields.get_i32(),
            base_timestamp: {
                let base = fields.get_i64();
                let _max_timestamp = fields.get_i64();
                base
            },
            producer_id: fields.get_i64(),
            producer_epoch: fields.get_i16(),
            base_sequence: fields.get_i32(),
            record_count: fields.get_i32(),
        };
        if header.record_count < 0 {
            return Err(BatchError::Malformed("a negative record count"));
        }
        batches.push(RawBatch {
            header,
            records: batch.slice(BATCH_HEADER_BYTES..),
        });
    }
    Ok(batches)
}

/// What a batch's records come to as Nova records, measured without building them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measure {
    pub records: u64,
    pub headers: u64,
    /// Bodies, header names and values: what Nova's caps judge.
    pub content_bytes: u64,
    /// The largest record's content bytes, and its index (the first, of equals).
    pub largest_record: u64,
    pub largest_at: u64,
}

impl Measure {
    /// `other`, measured after this, added to it.
    pub fn add(&mut self, other: Measure) {
        if other.largest_record > self.largest_record {
            self.largest_record = other.largest_record;
            self.largest_at = self.records + other.largest_at;
        }
        self.records += other.records;
        self.headers += other.headers;
        self.content_bytes += other.content_bytes;
    }
}

/// Walks `count` records in `data` (decompressed), checking their framing, and measures them
/// as Nova records.
pub fn measure(data: &Bytes, header: &BatchHeader) -> Result<Measure, BatchError> {
    let mut total = Measure::default();
    walk(data, header, |record| {
        total.add(Measure {
            records: 1,
            headers: record.headers.len() as u64,
            content_bytes: record.content_bytes(),
            largest_record: record.content_bytes(),
            largest_at: 0,
        });
    })?;
    Ok(total)
}

/// The batch's records as Nova records (see `mapping`), sharing `data`'s buffer. Call after
/// `measure` passed and the result was charged.
pub fn records(
    data: &Bytes,
    header: &BatchHeader,
    out: &mut Vec<Record>,
) -> Result<(), BatchError> {
    walk(data, header, |record| out.push(record))
}

fn walk(
    data: &Bytes,
    header: &BatchHeader,
    mut each: impl FnMut(Record),
) -> Result<(), BatchError> {
    let mut cursor = Cursor {
        data,
        at: 0,
        end: data.len(),
    };
    for _ in 0..header.record_count {
        let length = cursor.varint("a record length")?;
        let length = usize::try_from(length)
            .map_err(|_| BatchError::Malformed("a negative record length"))?;
        let end = cursor
            .at
            .checked_add(length)
            .filter(|end| *end <= data.len())
            .ok_or(BatchError::Truncated("a record longer than its batch"))?;
        let mut record = Cursor {
            data,
            at: cursor.at,
            end,
        };
        record.skip(1, "record attributes")?;
        let timestamp_delta = record.varint("a timestamp delta")?;
        record.varint("an offset delta")?;
        let key = record.nullable("a key")?;
        let value = record.nullable("a value")?;
        let count = record.varint("a header count")?;
        if count < 0 {
            return Err(BatchError::Malformed("a negative header count"));
        }
        let mut headers = Vec::new();
        for _ in 0..count {
            let name = record
                .nullable("a header key")?
                .ok_or(BatchError::Malformed("a header key that is null"))?;
            if std::str::from_utf8(&name).is_err() {
                return Err(BatchError::Malformed("a header key that is not UTF-8"));
            }
            let value = record.nullable("a header value")?;
            headers.push(KafkaHeader { name, value });
        }
        if record.at != end {
            return Err(BatchError::Malformed(
                "a record whose length does not match its fields",
            ));
        }
        cursor.at = end;
        let timestamp = header.base_timestamp.saturating_add(timestamp_delta);
        each(to_nova(timestamp, key, value, headers));
    }
    if cursor.at != data.len() {
        return Err(BatchError::Malformed("bytes after the batch's last record"));
    }
    Ok(())
}

/// Reads `data[at..end]`.
struct Cursor<'a> {
    data: &'a Bytes,
    at: usize,
    end: usize,
}

impl Cursor<'_> {
    fn skip(&mut self, n: usize, what: &'static str) -> Result<(), BatchError> {
        if self.end - self.at < n {
            return Err(BatchError::Truncated(what));
        }
        self.at += n;
        Ok(())
    }

    /// A zigzag varint of up to 64 bits.
    fn varint(&mut self, what: &'static str) -> Result<i64, BatchError> {
        let mut raw: u64 = 0;
        for shift in (0..70).step_by(7) {
            if self.at == self.end {
                return Err(BatchError::Truncated(what));
            }
            let byte = self.data[self.at];
            self.at += 1;
            if shift == 63 && byte > 1 {
                return Err(BatchError::Malformed("a varint over 64 bits"));
            }
            raw |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err(BatchError::Malformed("a varint over 64 bits"))
    }

    /// A length-prefixed byte string; length -1 is null.
    fn nullable(&mut self, what: &'static str) -> Result<Option<Bytes>, BatchError> {
        let length = self.varint(what)?;
        if length == -1 {
            return Ok(None);
        }
        let length = usize::try_from(length).map_err(|_| BatchError::Malformed(what))?;
        if self.end - self.at < length {
            return Err(BatchError::Truncated(what));
        }
        let bytes = self.data.slice(self.at..self.at + length);
        self.at += length;
        Ok(Some(bytes))
    }
}
