//! An append request as the star receives it: the wire bytes themselves, checked and measured
//! in one pass without allocating, instead of a decoded vector of records.
//!
//! The star charges a batch to its admission buffer from the gRPC length prefix, before the
//! message is even buffered, so what decoding may allocate must be bounded by that length. A
//! generated decoder allocates a struct per record and per header: a message of two-byte empty
//! records would grow seventy-fold when decoded. `WireAppend` holds only the received bytes
//! (a zero-copy slice of the transport's buffer) and a few counters; records are read out of it
//! again, still without copying, when the batch is encoded into its fragment.
//!
//! A request that is not well-formed protobuf decodes anyway, with `problem` saying what is
//! wrong, so that the star refuses that one request and the session goes on.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};

/// `AppendRequest` as received: the whole message and what one pass over it learned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireAppend {
    message: Bytes,
    stream: Bytes,
    match_seq_num: Option<u64>,
    records: u64,
    headers: u64,
    content_bytes: u64,
    /// The first record with the most content bytes: (index, bytes).
    largest: (u64, u64),
    problem: Option<String>,
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// Reads protobuf fields out of a byte slice.
#[derive(Debug, Clone)]
struct Fields<'a> {
    rest: &'a [u8],
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.rest.split_first().ok_or("truncated varint")?;
            self.rest = rest;
            // The tenth byte holds the 64th bit only.
            if i == 9 && byte > 1 {
                return Err("varint overflows 64 bits");
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err("varint longer than ten bytes")
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], &'static str> {
        if n > self.rest.len() as u64 {
            return Err("field runs past the end of its message");
        }
        let (taken, rest) = self.rest.split_at(n as usize);
        self.rest = rest;
        Ok(taken)
    }

    /// The next field's number and value, or `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, Value<'a>)>, &'static str> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        if key > u64::from(u32::MAX) {
            return Err("field key over 32 bits");
        }
        let number = key >> 3;
        if number == 0 {
            return Err("field number 0");
        }
        let value = match (key & 7) as u8 {
            VARINT => Value::Varint(self.varint()?),
            LEN => {
                let len = self.varint()?;
                Value::Bytes(self.take(len)?)
            }
            FIXED64 => {
                self.take(8)?;
                Value::Other
            }
            FIXED32 => {
                self.take(4)?;
                Value::Other
            }
            _ => return Err("unsupported wire type (groups are not used by nova.v1)"),
        };
        Ok(Some((number, value)))
    }
}

/// One record of a `WireAppend`, borrowed from the message.
#[derive(Debug, Clone, Copy)]
pub struct WireRecord<'a> {
    pub timestamp: Option<u64>,
    pub body: &'a [u8],
    /// The record's own bytes, for reading its headers.
    raw: &'a [u8],
    pub header_count: u64,
    /// Body plus header names and values.
    pub content_bytes: u64,
}

impl<'a> WireRecord<'a> {
    /// Parses a `Record` message; later occurrences of a singular field win, as in protobuf.
    fn parse(raw: &'a [u8]) -> Result<Self, &'static str> {
        let mut record = WireRecord {
            timestamp: None,
            body: &[],
            raw,
            header_count: 0,
            content_bytes: 0,
        };
        let mut header_bytes = 0u64;
        let mut fields = Fields::new(raw);
        while let Some((number, value)) = fields.next()? {
            match (number, value) {
                (1, Value::Bytes(body)) => record.body = body,
                (2, Value::Bytes(header)) => {
                    let (name, value) = parse_header(header)?;
                    record.header_count += 1;
                    header_bytes += (name.len() + value.len()) as u64;
                }
                (3, Value::Varint(timestamp)) => record.timestamp = Some(timestamp),
                (1..=3, _) => return Err("a record field has the wrong wire type"),
                _ => {}
            }
        }
        record.content_bytes = record.body.len() as u64 + header_bytes;
        Ok(record)
    }

    /// The record's headers, in order, as (name, value).
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let mut fields = Fields::new(self.raw);
        std::iter::from_fn(move || {
            loop {
                // The record was checked when the request was decoded.
                match fields.next().ok()?? {
                    (2, Value::Bytes(header)) => return parse_header(header).ok(),
                    _ => continue,
                }
            }
        })
    }
}

fn parse_header(raw: &[u8]) -> Result<(&[u8], &[u8]), &'static str> {
    let (mut name, mut value): (&[u8], &[u8]) = (&[], &[]);
    let mut fields = Fields::new(raw);
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Value::Bytes(bytes)) => name = bytes,
            (2, Value::Bytes(bytes)) => value = bytes,
            (1 | 2, _) => return Err("a header field has the wrong wire type"),
            _ => {}
        }
    }
    Ok((name, value))
}

impl WireAppend {
    /// Reads a request out of its wire bytes. Never fails: a malformed request comes back
    /// with `problem` set.
    pub fn parse(message: Bytes) -> Self {
        let mut request = WireAppend {
            message,
            ..Default::default()
        };
        if let Err(problem) = request.scan() {
            request.problem = Some(problem.to_owned());
        }
        request
    }

    fn scan(&mut self) -> Result<(), &'static str> {
        let message = self.message.clone();
        let mut fields = Fields::new(&message);
        while let Some((number, value)) = fields.next()? {
            match (number, value) {
                (1, Value::Bytes(stream)) => self.stream = message.slice_ref(stream),
                (2, Value::Bytes(raw)) => {
                    let record = WireRecord::parse(raw)?;
                    if record.content_bytes > self.largest.1 || self.records == 0 {
                        self.largest = (self.records, record.content_bytes);
                    }
                    self.records += 1;
                    self.headers += record.header_count;
                    self.content_bytes += record.content_bytes;
                }
                (3, Value::Varint(seq)) => self.match_seq_num = Some(seq),
                (1..=3, _) => return Err("a request field has the wrong wire type"),
                _ => {}
            }
        }
        Ok(())
    }

    /// The stream name's bytes, unchecked (it may not be UTF-8).
    pub fn stream_bytes(&self) -> &[u8] {
        &self.stream
    }

    pub fn match_seq_num(&self) -> Option<u64> {
        self.match_seq_num
    }

    pub fn record_count(&self) -> u64 {
        self.records
    }

    pub fn header_count(&self) -> u64 {
        self.headers
    }

    pub fn content_bytes(&self) -> u64 {
        self.content_bytes
    }

    /// The first record with the most content bytes: (index, bytes).
    pub fn largest_record(&self) -> (u64, u64) {
        self.largest
    }

    /// What makes the request malformed, if anything.
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    /// Bytes the request holds: the received message.
    pub fn wire_len(&self) -> u64 {
        self.message.len() as u64
    }

    /// The whole received message, shared rather than copied.
    pub fn message(&self) -> Bytes {
        self.message.clone()
    }

    /// A slice of the message, shared rather than copied: `part` must be a field this request
    /// handed out (a record's body), which lies within the message.
    pub fn share(&self, part: &[u8]) -> Bytes {
        self.message.slice_ref(part)
    }

    /// The records, in order. Only meaningful for a request without a `problem`.
    pub fn records(&self) -> WireRecords<'_> {
        WireRecords {
            fields: Fields::new(&self.message),
        }
    }
}

/// The records of a `WireAppend`, in order; cloning it is cheap (a position in the message).
#[derive(Debug, Clone)]
pub struct WireRecords<'a> {
    fields: Fields<'a>,
}

impl<'a> Iterator for WireRecords<'a> {
    type Item = WireRecord<'a>;

    fn next(&mut self) -> Option<WireRecord<'a>> {
        loop {
            // The request was checked when it was decoded, so parsing cannot fail here.
            match self.fields.next().ok()?? {
                (2, Value::Bytes(raw)) => return WireRecord::parse(raw).ok(),
                _ => continue,
            }
        }
    }
}

/// Decoding keeps the received bytes whole: the transport hands over a zero-copy slice of its
/// buffer, and nothing else is allocated.
impl prost::Message for WireAppend {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.message);
    }

    fn merge_field(
        &mut self,
        _tag: u32,
        _wire_type: WireType,
        _buf: &mut impl Buf,
        _ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // `decode` below reads whole messages; nothing merges into a WireAppend field by field.
        #[allow(deprecated)]
        Err(prost::DecodeError::new(
            "WireAppend decodes whole messages only",
        ))
    }

    fn encoded_len(&self) -> usize {
        self.message.len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    fn decode(mut buf: impl Buf) -> Result<Self, prost::DecodeError> {
        Ok(Self::parse(buf.copy_to_bytes(buf.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use proptest::prelude::*;
    use prost::Message;

    fn wire(request: &v1::AppendRequest) -> WireAppend {
        WireAppend::parse(Bytes::from(request.encode_to_vec()))
    }

    fn arb_record() -> impl Strategy<Value = v1::Record> {
        (
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 0..8),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ),
                0..4,
            ),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(|(body, headers, timestamp)| v1::Record {
                body: body.into(),
                headers: headers
                    .into_iter()
                    .map(|(name, value)| v1::Header {
                        name: name.into(),
                        value: value.into(),
                    })
                    .collect(),
                timestamp,
            })
    }

    proptest! {
        /// What the one pass learns, and the records it reads back, are what prost encoded.
        #[test]
        fn reads_back_what_prost_wrote(
            stream in "[a-z]{0,16}",
            records in proptest::collection::vec(arb_record(), 0..20),
            match_seq_num in proptest::option::of(any::<u64>()),
        ) {
            let request = v1::AppendRequest { stream: stream.clone(), records: records.clone(), match_seq_num };
            let wire = wire(&request);
            prop_assert_eq!(wire.problem(), None);
            prop_assert_eq!(wire.stream_bytes(), stream.as_bytes());
            prop_assert_eq!(wire.match_seq_num(), match_seq_num);
            prop_assert_eq!(wire.record_count(), records.len() as u64);
            let headers: usize = records.iter().map(|r| r.headers.len()).sum();
            prop_assert_eq!(wire.header_count(), headers as u64);
            let content: usize = records
                .iter()
                .map(|r| r.body.len() + r.headers.iter().map(|h| h.name.len() + h.value.len()).sum::<usize>())
                .sum();
            prop_assert_eq!(wire.content_bytes(), content as u64);
            let read: Vec<_> = wire.records().collect();
            prop_assert_eq!(read.len(), records.len());
            for (got, want) in read.iter().zip(&records) {
                prop_assert_eq!(got.body, &want.body[..]);
                prop_assert_eq!(got.timestamp, want.timestamp);
                let headers: Vec<_> = got.headers().collect();
                let expected: Vec<_> = want.headers.iter().map(|h| (&h.name[..], &h.value[..])).collect();
                prop_assert_eq!(headers, expected);
            }
        }

        /// Any bytes at all decode without panicking, and what is not protobuf says so.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let wire = WireAppend::parse(Bytes::from(bytes));
            if wire.problem().is_none() {
                let _ = wire.records().count();
            }
        }
    }

    #[test]
    fn truncation_is_a_problem_not_a_panic() {
        let request = v1::AppendRequest {
            stream: "s".into(),
            records: vec![v1::Record {
                body: Bytes::from_static(b"hello"),
                headers: vec![],
                timestamp: Some(5),
            }],
            match_seq_num: Some(3),
        };
        let bytes = request.encode_to_vec();
        for cut in 1..bytes.len() {
            let wire = WireAppend::parse(Bytes::copy_from_slice(&bytes[..cut]));
            // Every strict prefix either lacks something or is malformed; none panics.
            assert!(
                wire.problem().is_some()
                    || wire.record_count() == 0
                    || wire.match_seq_num().is_none()
            );
        }
    }

    #[test]
    fn decoding_through_prost_keeps_the_bytes() {
        let request = v1::AppendRequest {
            stream: "s".into(),
            records: vec![v1::Record {
                body: Bytes::from_static(b"x"),
                headers: vec![],
                timestamp: None,
            }],
            match_seq_num: None,
        };
        let encoded = Bytes::from(request.encode_to_vec());
        let wire = <WireAppend as Message>::decode(encoded.clone()).unwrap();
        assert_eq!(wire.wire_len(), encoded.len() as u64);
        assert_eq!(wire.encode_to_vec(), encoded.to_vec());
    }
}
