//! The record encoding inside a flight section.
//!
//! A section is the concatenation of the records of one stream in one flight, in sequence order.
//! Each record is framed as:
//!
//! ```text
//! u32 len            bytes that follow this field
//! u64 timestamp      ms since the Unix epoch
//! u32 header_count
//! header_count × (u32 name_len, name, u32 value_len, value)
//! body               the rest of the frame
//! ```
//!
//! All integers are little-endian. A batch is encoded on its own into a *fragment*; a stream's
//! section is its fragments laid end to end, so the star never copies a batch twice.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use nova_proto::wire::{WireAppend, WireRecord};

use super::FormatError;
use crate::record::{Header, Record};

/// Fixed framing bytes per record: len, timestamp, header count.
pub const RECORD_FRAME_BYTES: usize = 4 + 8 + 4;
/// Framing bytes per header: the two length prefixes.
pub const HEADER_FRAME_BYTES: usize = 4 + 4;

/// One batch's records, encoded and ready to be laid into a section.
#[derive(Debug, Clone)]
pub struct Fragment {
    pub bytes: Bytes,
    pub records: u64,
}

/// The encoded size of one record.
pub fn encoded_len(record: &Record) -> usize {
    RECORD_FRAME_BYTES
        + record
            .headers
            .iter()
            .map(|h| HEADER_FRAME_BYTES + h.name.len() + h.value.len())
            .sum::<usize>()
        + record.body.len()
}

/// Encodes records into one contiguous fragment. Callers have already validated the record
/// caps, so every length fits its u32 field.
pub fn encode_fragment<'a>(records: impl IntoIterator<Item = &'a Record> + Clone) -> Fragment {
    let total: usize = records.clone().into_iter().map(encoded_len).sum();
    let mut buf = BytesMut::with_capacity(total);
    let mut count = 0u64;
    for record in records {
        let len = encoded_len(record) - 4;
        buf.put_u32_le(len as u32);
        buf.put_u64_le(record.timestamp);
        buf.put_u32_le(record.headers.len() as u32);
        for header in &record.headers {
            buf.put_u32_le(header.name.len() as u32);
            buf.put_slice(&header.name);
            buf.put_u32_le(header.value.len() as u32);
            buf.put_slice(&header.value);
        }
        buf.put_slice(&record.body);
        count += 1;
    }
    Fragment {
        bytes: buf.freeze(),
        records: count,
    }
}

/// Encodes records into fragments of at most `max_chunk` bytes each, split at record
/// boundaries (a single record larger than `max_chunk` gets a fragment of its own). Keeping
/// fragments small keeps sections small, and a reader never fetches more than one section at a
/// time for a ref.
pub fn encode_chunks(records: &[Record], max_chunk: usize) -> Vec<Fragment> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, record) in records.iter().enumerate() {
        let len = encoded_len(record);
        if i > start && size + len > max_chunk {
            chunks.push(encode_fragment(records[start..i].iter()));
            start = i;
            size = 0;
        }
        size += len;
    }
    if start < records.len() {
        chunks.push(encode_fragment(records[start..].iter()));
    }
    chunks
}

/// The encoded size of a record read from an append request's wire bytes.
fn wire_encoded_len(record: &WireRecord<'_>) -> usize {
    RECORD_FRAME_BYTES
        + HEADER_FRAME_BYTES * record.header_count as usize
        + record.content_bytes as usize
}

/// The encoded size of a whole request: what its fragments will hold.
pub fn wire_encoded_bytes(request: &WireAppend) -> u64 {
    (RECORD_FRAME_BYTES as u64) * request.record_count()
        + (HEADER_FRAME_BYTES as u64) * request.header_count()
        + request.content_bytes()
}

/// Encodes a received request's records straight from its wire bytes into fragments of at most
/// `max_chunk` bytes each (split at record boundaries, as `encode_chunks` does), stamping
/// records without a timestamp with `now_ms`. Each fragment is allocated once, at its exact
/// size; nothing else is. The request must have passed `validate_wire`.
pub fn encode_wire_chunks(request: &WireAppend, now_ms: u64, max_chunk: usize) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    let mut records = request.records().peekable();
    while records.peek().is_some() {
        // Measure the next chunk, then write it.
        let mut size = 0usize;
        let mut count = 0u64;
        let mut ahead = records.clone();
        while let Some(record) = ahead.peek() {
            let len = wire_encoded_len(record);
            if count > 0 && size + len > max_chunk {
                break;
            }
            size += len;
            count += 1;
            ahead.next();
        }
        let mut buf = BytesMut::with_capacity(size);
        for record in records.by_ref().take(count as usize) {
            buf.put_u32_le((wire_encoded_len(&record) - 4) as u32);
            buf.put_u64_le(record.timestamp.unwrap_or(now_ms));
            buf.put_u32_le(record.header_count as u32);
            for (name, value) in record.headers() {
                buf.put_u32_le(name.len() as u32);
                buf.put_slice(name);
                buf.put_u32_le(value.len() as u32);
                buf.put_slice(value);
            }
            buf.put_slice(record.body);
        }
        fragments.push(Fragment {
            bytes: buf.freeze(),
            records: count,
        });
    }
    fragments
}

/// Iterates the records of a section (or any run of whole fragments) without copying: bodies and
/// headers are slices of the input.
#[derive(Debug, Clone)]
pub struct RecordIter {
    rest: Bytes,
}

impl RecordIter {
    pub fn new(section: Bytes) -> Self {
        Self { rest: section }
    }

    /// Skips `n` records without materialising them.
    pub fn skip_records(&mut self, n: u64) -> Result<(), FormatError> {
        for _ in 0..n {
            let len = self.frame_len()?;
            self.rest.advance(4 + len);
        }
        Ok(())
    }

    fn frame_len(&self) -> Result<usize, FormatError> {
        if self.rest.len() < 4 {
            return Err(FormatError::corrupt("record frame truncated"));
        }
        let len = u32::from_le_bytes([self.rest[0], self.rest[1], self.rest[2], self.rest[3]]);
        let len = len as usize;
        if len > self.rest.len() - 4 {
            return Err(FormatError::corrupt("record length runs past the section"));
        }
        Ok(len)
    }

    fn decode_next(&mut self) -> Result<Record, FormatError> {
        let len = self.frame_len()?;
        self.rest.advance(4);
        let mut frame = self.rest.split_to(len);
        if frame.len() < 12 {
            return Err(FormatError::corrupt(
                "record frame shorter than its fixed fields",
            ));
        }
        let timestamp = frame.get_u64_le();
        let header_count = frame.get_u32_le() as usize;
        // Each header needs at least its two length prefixes; refuse counts the frame cannot hold
        // before allocating for them.
        if header_count > frame.len() / HEADER_FRAME_BYTES {
            return Err(FormatError::corrupt(
                "header count exceeds the record frame",
            ));
        }
        let mut headers = Vec::with_capacity(header_count);
        for _ in 0..header_count {
            let name = take_prefixed(&mut frame)?;
            let value = take_prefixed(&mut frame)?;
            headers.push(Header { name, value });
        }
        Ok(Record {
            timestamp,
            headers,
            body: frame,
        })
    }
}

fn take_prefixed(frame: &mut Bytes) -> Result<Bytes, FormatError> {
    if frame.len() < 4 {
        return Err(FormatError::corrupt("header length truncated"));
    }
    let len = frame.get_u32_le() as usize;
    if len > frame.len() {
        return Err(FormatError::corrupt("header runs past the record frame"));
    }
    Ok(frame.split_to(len))
}

impl Iterator for RecordIter {
    type Item = Result<Record, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let item = self.decode_next();
        if item.is_err() {
            // A corrupt frame poisons everything after it.
            self.rest.clear();
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn arb_record() -> impl Strategy<Value = Record> {
        (
            any::<u64>(),
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 0..16),
                    proptest::collection::vec(any::<u8>(), 0..16),
                ),
                0..4,
            ),
            proptest::collection::vec(any::<u8>(), 0..256),
        )
            .prop_map(|(timestamp, headers, body)| Record {
                timestamp,
                headers: headers
                    .into_iter()
                    .map(|(n, v)| Header {
                        name: n.into(),
                        value: v.into(),
                    })
                    .collect(),
                body: body.into(),
            })
    }

    proptest! {
        #[test]
        fn fragments_round_trip(records in proptest::collection::vec(arb_record(), 0..32)) {
            let fragment = encode_fragment(records.iter());
            prop_assert_eq!(fragment.records, records.len() as u64);
            prop_assert_eq!(fragment.bytes.len(), records.iter().map(encoded_len).sum::<usize>());
            let decoded: Result<Vec<_>, _> = RecordIter::new(fragment.bytes).collect();
            prop_assert_eq!(decoded.unwrap(), records);
        }

        #[test]
        fn skipping_lands_on_the_right_record(
            records in proptest::collection::vec(arb_record(), 1..16),
            skip in 0usize..16,
        ) {
            let skip = skip % records.len();
            let fragment = encode_fragment(records.iter());
            let mut iter = RecordIter::new(fragment.bytes);
            iter.skip_records(skip as u64).unwrap();
            let decoded: Result<Vec<_>, _> = iter.collect();
            prop_assert_eq!(&decoded.unwrap()[..], &records[skip..]);
        }

        #[test]
        fn chunks_split_at_record_boundaries(records in proptest::collection::vec(arb_record(), 0..40), max in 1usize..2000) {
            let chunks = encode_chunks(&records, max);
            let mut decoded = Vec::new();
            for chunk in &chunks {
                let in_chunk: Vec<_> = RecordIter::new(chunk.bytes.clone()).collect::<Result<_, _>>().unwrap();
                prop_assert_eq!(in_chunk.len() as u64, chunk.records);
                // Over the limit only when one record alone is.
                prop_assert!(chunk.bytes.len() <= max || in_chunk.len() == 1);
                decoded.extend(in_chunk);
            }
            prop_assert_eq!(decoded, records);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for item in RecordIter::new(bytes.into()) {
                if item.is_err() { break; }
            }
        }

        #[test]
        fn truncation_is_detected(records in proptest::collection::vec(arb_record(), 1..8), cut in 1usize..64) {
            let fragment = encode_fragment(records.iter());
            let cut = cut.min(fragment.bytes.len());
            let truncated = fragment.bytes.slice(..fragment.bytes.len() - cut);
            let decoded: Result<Vec<_>, _> = RecordIter::new(truncated).collect();
            // Either an error, or (when the cut removed whole records exactly) fewer records.
            if let Ok(decoded) = decoded {
                prop_assert!(decoded.len() < records.len());
            }
        }
    }
}
