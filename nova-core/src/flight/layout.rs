//! Assembling and parsing whole flight objects: header, sections, footer, trailer.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::FormatError;
use super::section::Fragment;
use crate::object_store::PutPayload;

const HEADER_MAGIC: &[u8; 8] = b"NOVAFLT\0";
const TRAILER_MAGIC: &[u8; 8] = b"NOVAEND\0";
/// Kept stable: bump only with a reader for the new version beside the old one.
const VERSION: u16 = 1;
const KIND_FLIGHT: u16 = 1;
const KIND_FENCE: u16 = 2;

pub const HEADER_LEN: usize = 16;
pub const TRAILER_LEN: usize = 24;
/// How much of an object's end a reader fetches first: enough for the footer of a flight that
/// holds a few hundred streams, so most footers arrive in one request.
pub const SUGGESTED_TAIL_READ: u64 = 64 * 1024;

/// Who wrote a flight and where it belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightMeta {
    pub star: String,
    pub epoch: u64,
    pub slot: u64,
    pub created_at_ms: u64,
}

/// One stream's records in a flight, as the writer hands them over.
#[derive(Debug, Clone)]
pub struct SectionInput {
    pub stream_id: u64,
    pub stream: String,
    pub start_seq: u64,
    pub fragments: Vec<Fragment>,
}

/// Where one stream's section sits in a flight object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionEntry {
    pub stream_id: u64,
    pub stream: String,
    pub start_seq: u64,
    /// Exclusive.
    pub end_seq: u64,
    /// Byte offset of the section from the start of the object.
    pub offset: u64,
    pub len: u64,
    pub crc32c: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightFooter {
    pub meta: FlightMeta,
    pub sections: Vec<SectionEntry>,
}

/// The marker a successor writes at the first free slot of a predecessor's chain, so the
/// predecessor's next conditional create fails and it can never acknowledge past it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceInfo {
    pub star: String,
    pub epoch: u64,
    pub slot: u64,
    pub fenced_by: String,
    pub fenced_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectFooter {
    Flight(FlightFooter),
    Fence(FenceInfo),
}

/// Lays sections out behind a header and appends the footer and trailer. The section bytes are
/// not copied: the payload is the header, every fragment as it is, and the footer.
pub fn assemble_flight(
    meta: FlightMeta,
    sections: Vec<SectionInput>,
) -> (PutPayload, FlightFooter) {
    let part_count: usize = sections
        .iter()
        .flat_map(|s| &s.fragments)
        .map(|f| f.parts().len())
        .sum();
    let mut parts = Vec::with_capacity(part_count + 2);
    parts.push(encode_header(KIND_FLIGHT));
    let mut offset = HEADER_LEN as u64;
    let mut entries = Vec::with_capacity(sections.len());
    for section in sections {
        let mut crc = 0u32;
        let mut len = 0u64;
        let mut records = 0u64;
        for fragment in &section.fragments {
            // Each fragment's checksum was taken when it was encoded; one pass over the bytes.
            crc = super::crc::crc32c_combine(crc, fragment.crc32c(), fragment.len());
            len += fragment.len();
            records += fragment.records;
        }
        entries.push(SectionEntry {
            stream_id: section.stream_id,
            stream: section.stream,
            start_seq: section.start_seq,
            end_seq: section.start_seq + records,
            offset,
            len,
            crc32c: crc,
        });
        offset += len;
        for fragment in &section.fragments {
            parts.extend(fragment.parts().iter().cloned());
        }
    }
    let footer = FlightFooter {
        meta,
        sections: entries,
    };
    let mut body = BytesMut::new();
    encode_flight_footer(&footer, &mut body);
    let footer_bytes = body.freeze();
    parts.push(footer_bytes.clone());
    parts.push(encode_trailer(&footer_bytes, KIND_FLIGHT));
    (PutPayload::from_parts(parts), footer)
}

/// The header a flight object starts with: the same for every flight object of this format
/// version, so a copy of one object's start can begin another.
pub fn flight_header() -> Bytes {
    encode_header(KIND_FLIGHT)
}

/// The footer and trailer that end a flight object whose sections were laid out elsewhere (an
/// object composed from copied ranges): `footer.sections` give each section's final offset.
pub fn encode_flight_end(footer: &FlightFooter) -> Bytes {
    let mut body = BytesMut::new();
    encode_flight_footer(footer, &mut body);
    let footer_bytes = body.freeze();
    let trailer = encode_trailer(&footer_bytes, KIND_FLIGHT);
    let mut out = BytesMut::with_capacity(footer_bytes.len() + trailer.len());
    out.put_slice(&footer_bytes);
    out.put_slice(&trailer);
    out.freeze()
}

/// A complete fence object.
pub fn encode_fence(info: &FenceInfo) -> Bytes {
    let mut footer = BytesMut::new();
    put_str(&mut footer, &info.star);
    footer.put_u64_le(info.epoch);
    footer.put_u64_le(info.slot);
    put_str(&mut footer, &info.fenced_by);
    footer.put_u64_le(info.fenced_at_ms);
    let footer = footer.freeze();
    let mut out = BytesMut::with_capacity(HEADER_LEN + footer.len() + TRAILER_LEN);
    out.put_slice(&encode_header(KIND_FENCE));
    out.put_slice(&footer);
    out.put_slice(&encode_trailer(&footer, KIND_FENCE));
    out.freeze()
}

fn encode_header(kind: u16) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_LEN);
    buf.put_slice(HEADER_MAGIC);
    buf.put_u16_le(VERSION);
    buf.put_u16_le(kind);
    let crc = crate::flight::crc::crc32c(&buf);
    buf.put_u32_le(crc);
    buf.freeze()
}

fn encode_trailer(footer: &[u8], kind: u16) -> Bytes {
    let mut buf = BytesMut::with_capacity(TRAILER_LEN);
    buf.put_u32_le(footer.len() as u32);
    buf.put_u32_le(crate::flight::crc::crc32c(footer));
    buf.put_u16_le(VERSION);
    buf.put_u16_le(kind);
    buf.put_u32_le(0);
    buf.put_slice(TRAILER_MAGIC);
    buf.freeze()
}

fn encode_flight_footer(footer: &FlightFooter, buf: &mut BytesMut) {
    put_str(buf, &footer.meta.star);
    buf.put_u64_le(footer.meta.epoch);
    buf.put_u64_le(footer.meta.slot);
    buf.put_u64_le(footer.meta.created_at_ms);
    buf.put_u32_le(footer.sections.len() as u32);
    for s in &footer.sections {
        buf.put_u64_le(s.stream_id);
        put_str(buf, &s.stream);
        buf.put_u64_le(s.start_seq);
        buf.put_u64_le(s.end_seq);
        buf.put_u64_le(s.offset);
        buf.put_u64_le(s.len);
        buf.put_u32_le(s.crc32c);
    }
}

fn put_str(buf: &mut BytesMut, s: &str) {
    buf.put_u16_le(s.len() as u16);
    buf.put_slice(s.as_bytes());
}

/// What a reader learns from the end of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailParse {
    Footer(ObjectFooter),
    /// The footer starts before the bytes that were fetched: fetch the object from this offset.
    NeedFrom(u64),
}

/// Parses the footer out of the last bytes of an object of `object_size` bytes. `tail` must be
/// a suffix of the object (the whole object is fine).
pub fn parse_tail(tail: &[u8], object_size: u64) -> Result<TailParse, FormatError> {
    if (tail.len() as u64) > object_size {
        return Err(FormatError::corrupt("tail longer than the object"));
    }
    if object_size < (HEADER_LEN + TRAILER_LEN) as u64 {
        return Err(FormatError::corrupt(format!(
            "object of {object_size} bytes is shorter than a header and trailer"
        )));
    }
    if tail.len() < TRAILER_LEN {
        return Ok(TailParse::NeedFrom(object_size - TRAILER_LEN as u64));
    }
    let mut trailer = &tail[tail.len() - TRAILER_LEN..];
    let footer_len = trailer.get_u32_le() as u64;
    let footer_crc = trailer.get_u32_le();
    let version = trailer.get_u16_le();
    let kind = trailer.get_u16_le();
    let reserved = trailer.get_u32_le();
    if trailer != TRAILER_MAGIC {
        return Err(FormatError::corrupt(
            "trailer magic missing (truncated object?)",
        ));
    }
    if version != VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    if reserved != 0 {
        return Err(FormatError::corrupt("trailer reserved field is not zero"));
    }
    let needed = footer_len + TRAILER_LEN as u64;
    if needed + HEADER_LEN as u64 > object_size {
        return Err(FormatError::corrupt(
            "footer length runs past the object start",
        ));
    }
    if needed > tail.len() as u64 {
        return Ok(TailParse::NeedFrom(object_size - needed));
    }
    let footer = &tail[tail.len() - needed as usize..tail.len() - TRAILER_LEN];
    let computed = crate::flight::crc::crc32c(footer);
    if computed != footer_crc {
        return Err(FormatError::Checksum {
            what: "footer",
            stored: footer_crc,
            computed,
        });
    }
    let footer_start = object_size - needed;
    let parsed = match kind {
        KIND_FLIGHT => ObjectFooter::Flight(decode_flight_footer(footer, footer_start)?),
        KIND_FENCE => ObjectFooter::Fence(decode_fence(footer)?),
        other => return Err(FormatError::corrupt(format!("unknown object kind {other}"))),
    };
    Ok(TailParse::Footer(parsed))
}

/// Parses and fully checks a whole object: header, footer, and every section's checksum.
pub fn parse_object(object: &[u8]) -> Result<ObjectFooter, FormatError> {
    let header_kind = check_header(object)?;
    let footer = match parse_tail(object, object.len() as u64)? {
        TailParse::Footer(footer) => footer,
        TailParse::NeedFrom(_) => return Err(FormatError::corrupt("footer not in object")),
    };
    let footer_kind = match &footer {
        ObjectFooter::Flight(_) => KIND_FLIGHT,
        ObjectFooter::Fence(_) => KIND_FENCE,
    };
    if header_kind != footer_kind {
        return Err(FormatError::corrupt(
            "header and trailer disagree on the object kind",
        ));
    }
    if let ObjectFooter::Flight(flight) = &footer {
        for entry in &flight.sections {
            let start = entry.offset as usize;
            let section = &object[start..start + entry.len as usize];
            verify_section(section, entry)?;
        }
    }
    Ok(footer)
}

fn check_header(object: &[u8]) -> Result<u16, FormatError> {
    if object.len() < HEADER_LEN {
        return Err(FormatError::corrupt("object shorter than its header"));
    }
    let mut header = &object[..HEADER_LEN];
    if &header[..8] != HEADER_MAGIC {
        return Err(FormatError::corrupt(
            "header magic missing: not a Nova object",
        ));
    }
    let computed = crate::flight::crc::crc32c(&header[..12]);
    header.advance(8);
    let version = header.get_u16_le();
    let kind = header.get_u16_le();
    let stored = header.get_u32_le();
    if stored != computed {
        return Err(FormatError::Checksum {
            what: "header",
            stored,
            computed,
        });
    }
    if version != VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    Ok(kind)
}

/// Checks a section fetched on its own against its footer entry.
pub fn verify_section(section: &[u8], entry: &SectionEntry) -> Result<(), FormatError> {
    if section.len() as u64 != entry.len {
        return Err(FormatError::corrupt(format!(
            "section of stream {} is {} bytes, footer says {}",
            entry.stream,
            section.len(),
            entry.len
        )));
    }
    let computed = crate::flight::crc::crc32c(section);
    if computed != entry.crc32c {
        return Err(FormatError::Checksum {
            what: "section",
            stored: entry.crc32c,
            computed,
        });
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn need(&self, n: usize) -> Result<(), FormatError> {
        if self.buf.len() < n {
            Err(FormatError::corrupt("footer truncated"))
        } else {
            Ok(())
        }
    }
    fn u16(&mut self) -> Result<u16, FormatError> {
        self.need(2)?;
        Ok(self.buf.get_u16_le())
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        self.need(4)?;
        Ok(self.buf.get_u32_le())
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        self.need(8)?;
        Ok(self.buf.get_u64_le())
    }
    fn string(&mut self) -> Result<String, FormatError> {
        let len = self.u16()? as usize;
        self.need(len)?;
        let s = std::str::from_utf8(&self.buf[..len])
            .map_err(|_| FormatError::corrupt("footer string is not UTF-8"))?
            .to_owned();
        self.buf.advance(len);
        Ok(s)
    }
    fn finish(&self) -> Result<(), FormatError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FormatError::corrupt("trailing bytes after footer"))
        }
    }
}

/// Smallest encoded section entry: the fixed fields and an empty name.
const MIN_ENTRY_BYTES: usize = 8 + 2 + 8 * 4 + 4;

fn decode_flight_footer(buf: &[u8], footer_start: u64) -> Result<FlightFooter, FormatError> {
    let mut r = Reader { buf };
    let meta = FlightMeta {
        star: r.string()?,
        epoch: r.u64()?,
        slot: r.u64()?,
        created_at_ms: r.u64()?,
    };
    let count = r.u32()? as usize;
    if count > r.buf.len() / MIN_ENTRY_BYTES {
        return Err(FormatError::corrupt("section count exceeds the footer"));
    }
    let mut sections = Vec::with_capacity(count);
    let mut expected_offset = HEADER_LEN as u64;
    for _ in 0..count {
        let entry = SectionEntry {
            stream_id: r.u64()?,
            stream: r.string()?,
            start_seq: r.u64()?,
            end_seq: r.u64()?,
            offset: r.u64()?,
            len: r.u64()?,
            crc32c: r.u32()?,
        };
        if entry.offset != expected_offset || entry.end_seq < entry.start_seq {
            return Err(FormatError::corrupt(format!(
                "section entry for stream {} is out of place",
                entry.stream
            )));
        }
        expected_offset = entry
            .offset
            .checked_add(entry.len)
            .ok_or_else(|| FormatError::corrupt("section length overflows"))?;
        sections.push(entry);
    }
    if expected_offset != footer_start {
        return Err(FormatError::corrupt(
            "sections do not end where the footer starts",
        ));
    }
    r.finish()?;
    Ok(FlightFooter { meta, sections })
}

fn decode_fence(buf: &[u8]) -> Result<FenceInfo, FormatError> {
    let mut r = Reader { buf };
    let info = FenceInfo {
        star: r.string()?,
        epoch: r.u64()?,
        slot: r.u64()?,
        fenced_by: r.string()?,
        fenced_at_ms: r.u64()?,
    };
    r.finish()?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::section::{RecordIter, encode_fragment};
    use crate::record::{Header, Record};
    use proptest::prelude::*;

    fn arb_records() -> impl Strategy<Value = Vec<Record>> {
        proptest::collection::vec(
            (
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..64),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            )
                .prop_map(|(timestamp, body, header)| Record {
                    timestamp,
                    headers: header
                        .map(|h| {
                            vec![Header {
                                name: Bytes::from_static(b"k"),
                                value: h.into(),
                            }]
                        })
                        .unwrap_or_default(),
                    body: body.into(),
                }),
            1..8,
        )
    }

    fn arb_sections() -> impl Strategy<Value = Vec<(u64, Vec<Vec<Record>>)>> {
        proptest::collection::vec(
            (
                0u64..1_000_000,
                proptest::collection::vec(arb_records(), 1..4),
            ),
            0..6,
        )
    }

    fn build(sections: &[(u64, Vec<Vec<Record>>)]) -> (Bytes, FlightFooter) {
        let inputs = sections
            .iter()
            .enumerate()
            .map(|(i, (start, batches))| SectionInput {
                stream_id: i as u64 + 7,
                stream: format!("stream-{i}"),
                start_seq: *start,
                fragments: batches.iter().map(|b| encode_fragment(b.iter())).collect(),
            })
            .collect();
        let meta = FlightMeta {
            star: "star-a".into(),
            epoch: 3,
            slot: 42,
            created_at_ms: 1_700_000_000_000,
        };
        let (payload, footer) = assemble_flight(meta, inputs);
        (payload.to_bytes(), footer)
    }

    proptest! {
        #[test]
        fn flights_round_trip(sections in arb_sections()) {
            let (object, footer) = build(&sections);
            let parsed = parse_object(&object).unwrap();
            prop_assert_eq!(&parsed, &ObjectFooter::Flight(footer.clone()));
            for (entry, (start, batches)) in footer.sections.iter().zip(&sections) {
                let section = object.slice(entry.offset as usize..(entry.offset + entry.len) as usize);
                verify_section(&section, entry).unwrap();
                let want: Vec<Record> = batches.iter().flatten().cloned().collect();
                prop_assert_eq!(entry.start_seq, *start);
                prop_assert_eq!(entry.end_seq - entry.start_seq, want.len() as u64);
                let got: Vec<Record> = RecordIter::new(section).collect::<Result<_, _>>().unwrap();
                prop_assert_eq!(got, want);
            }
        }

        #[test]
        fn any_suffix_finds_the_footer(sections in arb_sections(), keep in 0usize..4096) {
            let (object, footer) = build(&sections);
            let size = object.len() as u64;
            let keep = keep.min(object.len());
            let tail = &object[object.len() - keep..];
            // A suffix holding the trailer needs at most one more read; a shorter one, two.
            let mut reads = 1;
            let mut result = parse_tail(tail, size).unwrap();
            while let TailParse::NeedFrom(from) = result {
                reads += 1;
                result = parse_tail(&object[from as usize..], size).unwrap();
            }
            let allowed = if keep >= TRAILER_LEN { 2 } else { 3 };
            prop_assert!(reads <= allowed);
            let TailParse::Footer(parsed) = result else { unreachable!() };
            prop_assert_eq!(parsed, ObjectFooter::Flight(footer));
        }

        #[test]
        fn every_single_byte_flip_is_detected(sections in arb_sections(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let (object, _) = build(&sections);
            let mut damaged = object.to_vec();
            let i = at.index(damaged.len());
            damaged[i] ^= 1 << bit;
            prop_assert!(parse_object(&damaged).is_err());
        }

        #[test]
        fn truncation_is_detected(sections in arb_sections(), cut in 1usize..4096) {
            let (object, _) = build(&sections);
            let cut = cut.min(object.len());
            prop_assert!(parse_object(&object[..object.len() - cut]).is_err());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
            let _ = parse_object(&bytes);
            let _ = parse_tail(&bytes, bytes.len() as u64);
        }
    }

    #[test]
    fn fences_round_trip_and_are_told_apart() {
        let info = FenceInfo {
            star: "star-a".into(),
            epoch: 2,
            slot: 9,
            fenced_by: "star-a/3".into(),
            fenced_at_ms: 5,
        };
        let object = encode_fence(&info);
        assert_eq!(parse_object(&object).unwrap(), ObjectFooter::Fence(info));
    }

    #[test]
    fn an_empty_flight_is_still_a_valid_object() {
        let (object, footer) = build(&[]);
        assert_eq!(parse_object(&object).unwrap(), ObjectFooter::Flight(footer));
    }
}
