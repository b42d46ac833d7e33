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
//! section is its fragments laid end to end, so the star never copies a batch twice. A fragment
//! made from a received append message need not be one buffer: its large bodies can stay where
//! the message holds them (`encode_wire_referenced`), so they are never copied at all.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use nova_proto::wire::{WireAppend, WireRecord};

use super::FormatError;
use crate::record::{Header, Record};

/// Fixed framing bytes per record: len, timestamp, header count.
pub const RECORD_FRAME_BYTES: usize = 4 + 8 + 4;
/// Framing bytes per header: the two length prefixes.
pub const HEADER_FRAME_BYTES: usize = 4 + 4;
/// A record body of at least this many bytes is referenced in the received message rather
/// than copied into its fragment. A referenced body costs two parts (`PART_HELD` each) and
/// splits the object writes; for smaller bodies the copy is the cheaper of the two.
pub const REFERENCE_MIN_BODY: usize = 4096;
/// The least share of a message its referenced bodies must make up (as a fraction) for its
/// fragment to reference them rather than copy.
const REFERENCED_SHARE_MIN: (u64, u64) = (7, 8);
/// What each part of a fragment costs beyond its bytes: its slice in the fragment's list, and
/// its clones in the lists of the flight (and of an Express bundle) that lay the fragment out
/// while the batch is charged.
const PART_HELD: u64 = 3 * std::mem::size_of::<Bytes>() as u64;
/// What a fragment in several parts holds beyond its parts: the shared list's header and the
/// reference counts of the message and of the copied buffer.
const PARTS_OVERHEAD: u64 = 128;

/// One batch's records, encoded and ready to be laid into a section. The encoded bytes are its
/// parts laid end to end: one part when the records were copied into a buffer of their own, or
/// copied framing interleaved with bodies that live in the received message.
///
/// Its checksum is taken when it is made, while its bytes are still in the CPU's cache: a
/// flight's section checksums are combined from them (`crc32c_combine`) rather than computed
/// again over bytes the cache has long dropped.
#[derive(Debug, Clone)]
pub struct Fragment {
    parts: Arc<[Bytes]>,
    len: u64,
    held: u64,
    crc32c: u32,
    pub records: u64,
}

impl Fragment {
    /// A fragment in one buffer. The buffer is taken to be exactly its size: a fragment
    /// encoded by copying is, and a section sliced out of a fetched object is charged by its
    /// reader at its own length.
    pub fn whole(bytes: Bytes, records: u64) -> Self {
        let crc32c = super::crc::crc32c(&bytes);
        Self::whole_checked(bytes, records, crc32c)
    }

    /// `whole`, for bytes whose crc32c the caller has just verified against a stored one: a
    /// section read back from an object is not checksummed a second time.
    pub fn whole_checked(bytes: Bytes, records: u64, crc32c: u32) -> Self {
        let len = bytes.len() as u64;
        Self {
            crc32c,
            parts: Arc::new([bytes]),
            len,
            held: len,
            records,
        }
    }

    /// Encoded bytes: what the fragment adds to a section.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Memory the fragment keeps alive: its encoded bytes, or for a fragment that references a
    /// received message, that whole message, the copied framing and the list of parts. This is
    /// what a fragment is charged while it is held.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// The crc32c of the encoded bytes.
    pub fn crc32c(&self) -> u32 {
        self.crc32c
    }

    /// The encoded bytes, in order, as shared slices.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The fragment's records, without copying bodies.
    pub fn iter(&self) -> RecordIter {
        match &*self.parts {
            [whole] => RecordIter::new(whole.clone()),
            _ => RecordIter::over_parts(self.parts.clone()),
        }
    }

    /// The encoded bytes in one buffer: a copy unless the fragment is one part already.
    pub fn to_bytes(&self) -> Bytes {
        match &*self.parts {
            [whole] => whole.clone(),
            parts => {
                let mut buf = BytesMut::with_capacity(self.len as usize);
                for part in parts {
                    buf.put_slice(part);
                }
                buf.freeze()
            }
        }
    }
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
    Fragment::whole(buf.freeze(), count)
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
            put_wire_framing(&mut buf, &record, now_ms);
            buf.put_slice(record.body);
        }
        fragments.push(Fragment::whole(buf.freeze(), count));
    }
    fragments
}

/// Encodes a received request: referencing its large bodies in `request`'s message when
/// `message_exact` (the message is a buffer of exactly its size, as the star's charging layer
/// assembles it) and `encode_wire_referenced` takes it, and by copying into chunks of at most
/// `max_chunk` bytes otherwise.
pub fn encode_received(
    request: &WireAppend,
    now_ms: u64,
    max_chunk: usize,
    message_exact: bool,
) -> Vec<Fragment> {
    if message_exact && let Some(fragment) = encode_wire_referenced(request, now_ms, max_chunk) {
        return vec![fragment];
    }
    encode_wire_chunks(request, now_ms, max_chunk)
}

/// Writes a received record's frame up to its body: length, timestamp, headers.
fn put_wire_framing(buf: &mut BytesMut, record: &WireRecord<'_>, now_ms: u64) {
    buf.put_u32_le((wire_encoded_len(record) - 4) as u32);
    buf.put_u64_le(record.timestamp.unwrap_or(now_ms));
    buf.put_u32_le(record.header_count as u32);
    for (name, value) in record.headers() {
        buf.put_u32_le(name.len() as u32);
        buf.put_slice(name);
        buf.put_u32_le(value.len() as u32);
        buf.put_slice(value);
    }
}

/// Encodes a received request as one fragment that references its bodies of at least
/// `REFERENCE_MIN_BODY` bytes where the request's message holds them. Framing, headers and
/// smaller bodies are copied, in order, into one buffer of exactly their size; the fragment is
/// that buffer's runs interleaved with the referenced bodies, and it keeps the whole message
/// alive (`Fragment::held_bytes` says so).
///
/// Returns `None`, and the caller copies with `encode_wire_chunks`, when the records do not fit
/// one chunk of `max_chunk` bytes (chunks sharing one message could not each be charged for
/// it), or when referenced bodies are under `REFERENCED_SHARE_MIN` of the message. A referenced
/// fragment holds the whole message plus its copied framing, a copy holds only the encoded
/// bytes, so referencing costs the message's other bytes (small bodies, headers, protobuf
/// framing) on top; past that share they are at most an eighth of it. The message must be a
/// buffer of exactly its size, and the request must have passed `validate_wire`.
pub fn encode_wire_referenced(
    request: &WireAppend,
    now_ms: u64,
    max_chunk: usize,
) -> Option<Fragment> {
    // Measure: the whole encoding, what is copied, and how many bodies are referenced.
    let (mut encoded, mut copied, mut referenced, mut bodies) = (0usize, 0usize, 0u64, 0usize);
    for record in request.records() {
        let len = wire_encoded_len(&record);
        encoded += len;
        if record.body.len() >= REFERENCE_MIN_BODY {
            copied += len - record.body.len();
            referenced += record.body.len() as u64;
            bodies += 1;
        } else {
            copied += len;
        }
    }
    let (num, den) = REFERENCED_SHARE_MIN;
    if bodies == 0
        || encoded > max_chunk
        || referenced.saturating_mul(den) < request.wire_len().saturating_mul(num)
    {
        return None;
    }
    // Write: one buffer for everything copied, split into a run before each referenced body.
    let mut copy = BytesMut::with_capacity(copied);
    let mut parts = Vec::with_capacity(2 * bodies + 1);
    let mut records = 0u64;
    for record in request.records() {
        put_wire_framing(&mut copy, &record, now_ms);
        if record.body.len() >= REFERENCE_MIN_BODY {
            parts.push(copy.split().freeze());
            parts.push(request.share(record.body));
        } else {
            copy.put_slice(record.body);
        }
        records += 1;
    }
    if !copy.is_empty() {
        parts.push(copy.split().freeze());
    }
    let held = request.wire_len() + copied as u64 + parts.len() as u64 * PART_HELD + PARTS_OVERHEAD;
    // Measured, not computed: the footer's offsets must be the bytes written.
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    debug_assert_eq!(
        len, encoded as u64,
        "a referenced fragment's framing was mismeasured"
    );
    let crc32c = super::crc::crc32c_parts(&parts);
    Some(Fragment {
        crc32c,
        parts: parts.into(),
        len,
        held,
        records,
    })
}

/// Iterates the records of a section, or of a fragment in several parts, without copying:
/// bodies and headers are slices of the input. (A field that straddles two parts, which no
/// fragment the star encodes has, is copied out whole.)
#[derive(Debug, Clone)]
pub struct RecordIter {
    /// The part being read.
    rest: Bytes,
    /// For several parts: all of them, and the index of the one after `rest`.
    more: Option<(Arc<[Bytes]>, usize)>,
    /// Bytes in `rest` and in the parts after it.
    remaining: usize,
}

impl RecordIter {
    pub fn new(section: Bytes) -> Self {
        Self {
            remaining: section.len(),
            rest: section,
            more: None,
        }
    }

    /// The records of the parts laid end to end.
    pub fn over_parts(parts: Arc<[Bytes]>) -> Self {
        Self {
            remaining: parts.iter().map(Bytes::len).sum(),
            rest: Bytes::new(),
            more: Some((parts, 0)),
        }
    }

    /// Skips `n` records without materialising them.
    pub fn skip_records(&mut self, n: u64) -> Result<(), FormatError> {
        for _ in 0..n {
            let len = self.frame_len()?;
            self.skip(len);
        }
        Ok(())
    }

    /// Moves to the next non-empty part when the current one is used up.
    fn fill(&mut self) {
        while self.rest.is_empty() {
            match &mut self.more {
                Some((parts, next)) if *next < parts.len() => {
                    self.rest = parts[*next].clone();
                    *next += 1;
                }
                _ => return,
            }
        }
    }

    /// The next `n` bytes (at most `remaining`): a slice of the current part when it holds
    /// them, a copy when they straddle parts.
    fn take(&mut self, n: usize) -> Bytes {
        self.fill();
        if self.rest.len() >= n {
            self.remaining -= n;
            return self.rest.split_to(n);
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            self.fill();
            if self.rest.is_empty() {
                break;
            }
            let k = (n - out.len()).min(self.rest.len());
            out.put_slice(&self.rest[..k]);
            self.rest.advance(k);
            self.remaining -= k;
        }
        out.freeze()
    }

    fn skip(&mut self, mut n: usize) {
        while n > 0 {
            self.fill();
            if self.rest.is_empty() {
                return;
            }
            let k = n.min(self.rest.len());
            self.rest.advance(k);
            self.remaining -= k;
            n -= k;
        }
    }

    /// The next `N` bytes (at most `remaining` must be asked for), from wherever they lie.
    fn read_array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        self.fill();
        if self.rest.len() >= N {
            out.copy_from_slice(&self.rest[..N]);
            self.rest.advance(N);
            self.remaining -= N;
        } else {
            out.copy_from_slice(&self.take(N));
        }
        out
    }

    fn read_u32(&mut self) -> u32 {
        u32::from_le_bytes(self.read_array())
    }

    fn read_u64(&mut self) -> u64 {
        u64::from_le_bytes(self.read_array())
    }

    /// Reads the next frame's length prefix and checks the frame is all there.
    fn frame_len(&mut self) -> Result<usize, FormatError> {
        if self.remaining < 4 {
            return Err(FormatError::corrupt("record frame truncated"));
        }
        let len = self.read_u32() as usize;
        if len > self.remaining {
            return Err(FormatError::corrupt("record length runs past the section"));
        }
        Ok(len)
    }

    fn decode_next(&mut self) -> Result<Record, FormatError> {
        let len = self.frame_len()?;
        self.fill();
        if self.rest.len() >= len {
            // The whole frame is in this part: every field is a slice of it.
            self.remaining -= len;
            return decode_frame(self.rest.split_to(len));
        }
        self.decode_split(len)
    }

    /// Decodes a frame that runs on into later parts (framing in one, body in the next).
    fn decode_split(&mut self, len: usize) -> Result<Record, FormatError> {
        if len < 12 {
            return Err(FormatError::corrupt(
                "record frame shorter than its fixed fields",
            ));
        }
        let timestamp = self.read_u64();
        let header_count = self.read_u32() as usize;
        let mut left = len - 12;
        if header_count > left / HEADER_FRAME_BYTES {
            return Err(FormatError::corrupt(
                "header count exceeds the record frame",
            ));
        }
        let mut headers = Vec::with_capacity(header_count);
        for _ in 0..header_count {
            let name = self.take_prefixed(&mut left)?;
            let value = self.take_prefixed(&mut left)?;
            headers.push(Header { name, value });
        }
        Ok(Record {
            timestamp,
            headers,
            body: self.take(left),
        })
    }

    fn take_prefixed(&mut self, left: &mut usize) -> Result<Bytes, FormatError> {
        if *left < 4 {
            return Err(FormatError::corrupt("header length truncated"));
        }
        let len = self.read_u32() as usize;
        *left -= 4;
        if len > *left {
            return Err(FormatError::corrupt("header runs past the record frame"));
        }
        *left -= len;
        Ok(self.take(len))
    }
}

/// Decodes one record frame (after its length prefix) held in one buffer.
fn decode_frame(mut frame: Bytes) -> Result<Record, FormatError> {
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
        if self.remaining == 0 {
            return None;
        }
        let item = self.decode_next();
        if item.is_err() {
            // A corrupt frame poisons everything after it.
            self.rest.clear();
            self.more = None;
            self.remaining = 0;
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Records as a producer sends them: small and large bodies, a few headers, and a
    /// timestamp or none.
    fn arb_wire_record() -> impl Strategy<Value = nova_proto::v1::Record> {
        (
            prop_oneof![0usize..64, 4000usize..9000],
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 0..8),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ),
                0..3,
            ),
            proptest::option::of(any::<u64>()),
            any::<u8>(),
        )
            .prop_map(|(len, headers, timestamp, fill)| nova_proto::v1::Record {
                body: vec![fill; len].into(),
                headers: headers
                    .into_iter()
                    .map(|(name, value)| nova_proto::v1::Header {
                        name: name.into(),
                        value: value.into(),
                    })
                    .collect(),
                timestamp,
            })
    }

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
            prop_assert_eq!(fragment.len() as usize, records.iter().map(encoded_len).sum::<usize>());
            prop_assert_eq!(fragment.held_bytes(), fragment.len());
            let decoded: Result<Vec<_>, _> = fragment.iter().collect();
            prop_assert_eq!(decoded.unwrap(), records);
        }

        #[test]
        fn skipping_lands_on_the_right_record(
            records in proptest::collection::vec(arb_record(), 1..16),
            skip in 0usize..16,
        ) {
            let skip = skip % records.len();
            let fragment = encode_fragment(records.iter());
            let mut iter = fragment.iter();
            iter.skip_records(skip as u64).unwrap();
            let decoded: Result<Vec<_>, _> = iter.collect();
            prop_assert_eq!(&decoded.unwrap()[..], &records[skip..]);
        }

        #[test]
        fn chunks_split_at_record_boundaries(records in proptest::collection::vec(arb_record(), 0..40), max in 1usize..2000) {
            let chunks = encode_chunks(&records, max);
            let mut decoded = Vec::new();
            for chunk in &chunks {
                let in_chunk: Vec<_> = chunk.iter().collect::<Result<_, _>>().unwrap();
                prop_assert_eq!(in_chunk.len() as u64, chunk.records);
                // Over the limit only when one record alone is.
                prop_assert!(chunk.len() as usize <= max || in_chunk.len() == 1);
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
            let bytes = fragment.to_bytes();
            let cut = cut.min(bytes.len());
            let truncated = bytes.slice(..bytes.len() - cut);
            let decoded: Result<Vec<_>, _> = RecordIter::new(truncated).collect();
            // Either an error, or (when the cut removed whole records exactly) fewer records.
            if let Ok(decoded) = decoded {
                prop_assert!(decoded.len() < records.len());
            }
        }

        /// However a section is cut into parts, its records read back the same.
        #[test]
        fn parts_read_like_one_section(
            records in proptest::collection::vec(arb_record(), 0..16),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
            skip in 0usize..16,
        ) {
            let whole = encode_fragment(records.iter()).to_bytes();
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(whole.len() + 1)).collect();
            at.push(0);
            at.push(whole.len());
            at.sort_unstable();
            let parts: Vec<Bytes> = at.windows(2).map(|w| whole.slice(w[0]..w[1])).collect();
            let decoded: Vec<Record> =
                RecordIter::over_parts(parts.clone().into()).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(&decoded, &records);
            let skip = skip.min(records.len());
            let mut iter = RecordIter::over_parts(parts.into());
            iter.skip_records(skip as u64).unwrap();
            let rest: Vec<Record> = iter.collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(&rest[..], &records[skip..]);
        }

        /// Garbage cut into parts never panics either.
        #[test]
        fn garbage_in_parts_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = Bytes::from(bytes);
            let cut = cut.index(bytes.len() + 1);
            let parts: Arc<[Bytes]> = vec![bytes.slice(..cut), bytes.slice(cut..)].into();
            let mut skipping = RecordIter::over_parts(parts.clone());
            let _ = skipping.skip_records(3);
            for item in RecordIter::over_parts(parts) {
                if item.is_err() { break; }
            }
        }

        /// A fragment that references the message's bodies is byte for byte the copied one,
        /// reads back the same records, takes its large bodies from the message itself, and
        /// says it holds the message.
        #[test]
        fn referenced_fragments_match_copies(
            records in proptest::collection::vec(arb_wire_record(), 1..24),
            now in any::<u64>(),
        ) {
            let request = nova_proto::v1::AppendRequest {
                stream: "s".into(),
                records,
                match_seq_num: None,
            };
            let message = Bytes::from(prost::Message::encode_to_vec(&request));
            let wire = WireAppend::parse(message.clone());
            prop_assert_eq!(wire.problem(), None);
            let copied = encode_wire_chunks(&wire, now, usize::MAX);
            prop_assert_eq!(copied.len(), 1);
            let large: u64 = request.records.iter()
                .filter(|r| r.body.len() >= REFERENCE_MIN_BODY)
                .map(|r| r.body.len() as u64)
                .sum();
            let Some(fragment) = encode_wire_referenced(&wire, now, usize::MAX) else {
                prop_assert!(large == 0 || large * 8 < message.len() as u64 * 7);
                return Ok(());
            };
            prop_assert_eq!(fragment.to_bytes(), copied[0].to_bytes());
            prop_assert_eq!(fragment.crc32c(), crc32c::crc32c(&copied[0].to_bytes()));
            prop_assert_eq!(fragment.crc32c(), copied[0].crc32c());
            prop_assert_eq!(fragment.len(), copied[0].len());
            prop_assert_eq!(fragment.records, request.records.len() as u64);
            prop_assert!(fragment.held_bytes() >= message.len() as u64 + fragment.len() - large);
            let decoded: Vec<Record> = fragment.iter().collect::<Result<_, _>>().unwrap();
            let expected: Vec<Record> = copied[0].iter().collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(&decoded, &expected);
            let span = message.as_ptr_range();
            for record in &decoded {
                if record.body.len() >= REFERENCE_MIN_BODY {
                    prop_assert!(span.contains(&record.body.as_ptr()), "a large body was copied");
                }
            }
            // Too large for one chunk: the caller copies instead.
            prop_assert!(encode_wire_referenced(&wire, now, fragment.len() as usize - 1).is_none());
        }
    }
}
