//! How records look as bytes on stdin and stdout: one per line, length-prefixed, or one JSON
//! object per line with headers and a timestamp. The JSON form `read` prints is the form
//! `append` takes, so `nova read a --format json | nova append b --format json` copies a stream
//! with its headers and timestamps.

use std::io::{BufRead, Read, Write};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use nova_client::{Record, SequencedRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Framing {
    /// One record body per line (a trailing \r is dropped); no headers or timestamps.
    Lines,
    /// Each record body is a 4-byte big-endian length followed by that many bytes.
    LengthPrefixed,
    /// One JSON object per line: {"body": "…"} (or "body_hex" for bytes that are not UTF-8),
    /// optional "headers": [["name", "value"], …] and "timestamp" (Unix ms).
    Json,
}

/// Where a record was in the input, for error messages.
#[derive(Debug, Clone)]
pub struct Position {
    /// The input's name: a file's path, or `stdin`.
    pub input: String,
    /// Line number (lines, json) or record number (length-prefixed), from 1.
    pub number: u64,
    pub framing: Framing,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.framing {
            Framing::LengthPrefixed => "record",
            Framing::Lines | Framing::Json => "line",
        };
        write!(f, "{} {unit} {}", self.input, self.number)
    }
}

/// A record as JSON, in and out.
#[derive(Serialize, Deserialize)]
pub struct RecordJson {
    /// Output only: where the record is in its stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Unix ms. In: absent or 0 lets the star stamp the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body in hex, for bodies that are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_hex: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("body_hex has an odd number of digits".into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("body_hex has a non-hex digit near offset {i}"))
        })
        .collect()
}

impl RecordJson {
    pub fn of(record: &SequencedRecord) -> Self {
        let body = std::str::from_utf8(&record.record.body).ok();
        Self {
            seq: Some(record.seq),
            timestamp: Some(record.record.timestamp),
            body: body.map(str::to_owned),
            body_hex: body.is_none().then(|| hex(&record.record.body)),
            headers: record
                .record
                .headers
                .iter()
                .map(|h| {
                    (
                        String::from_utf8_lossy(&h.name).into_owned(),
                        String::from_utf8_lossy(&h.value).into_owned(),
                    )
                })
                .collect(),
        }
    }

    fn into_record(self) -> Result<Record, String> {
        let body = match (self.body, self.body_hex) {
            (Some(body), None) => body.into_bytes(),
            (None, Some(hex)) => unhex(&hex)?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return Err("give body or body_hex, not both".into()),
        };
        let mut record = Record::new(body);
        record.timestamp = self.timestamp.unwrap_or(0);
        for (name, value) in self.headers {
            record = record.with_header(name, value);
        }
        Ok(record)
    }
}

/// Yields records from a reader in one framing, each with its position. A record over
/// `max_record_bytes` (body and headers) is an error, found without reading more of it than
/// the limit, so an endless line or a huge length prefix costs no memory.
pub struct Records<R> {
    input: R,
    name: String,
    framing: Framing,
    number: u64,
    max_record_bytes: u64,
    /// Whose limit `max_record_bytes` is, for the message naming a record over it.
    limit: &'static str,
}

impl<R: BufRead> Records<R> {
    pub fn new(input: R, name: String, framing: Framing, max_record_bytes: u64) -> Self {
        Self {
            input,
            name,
            framing,
            number: 0,
            max_record_bytes,
            limit: "the server's --max-record-bytes",
        }
    }

    /// Names the limit in messages as `limit` (nova's own --max-record-bytes, when it is the
    /// lower one).
    pub fn limited_by(mut self, limit: &'static str) -> Self {
        self.limit = limit;
        self
    }

    /// The most bytes one input line may take: a JSON record's body may be hex (two digits a
    /// byte) or escaped, and carries its headers and keys besides.
    fn max_line(&self) -> u64 {
        match self.framing {
            Framing::Json => self
                .max_record_bytes
                .saturating_mul(6)
                .saturating_add(64 << 10),
            _ => self.max_record_bytes,
        }
    }

    fn oversize(&self, bytes: u64) -> String {
        format!(
            "a record of {} is over {} of {}",
            human(bytes),
            self.limit,
            human(self.max_record_bytes)
        )
    }

    fn oversize_line(&self, line: Oversize) -> String {
        format!(
            "a record of {} is over {} of {}",
            line.size(),
            self.limit,
            human(self.max_record_bytes)
        )
    }

    fn here(&self) -> Position {
        Position {
            input: self.name.clone(),
            number: self.number,
            framing: self.framing,
        }
    }

    /// The next line without its end, or `Err` with how far past the limit it was seen to run.
    fn line(&mut self) -> std::io::Result<Option<Result<Vec<u8>, Oversize>>> {
        let mut line = Vec::new();
        // The limit, its line end, and one byte more to tell a line over it.
        let cap = self.max_line().saturating_add(3);
        if (&mut self.input).take(cap).read_until(b'\n', &mut line)? == 0 {
            return Ok(None);
        }
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.len() as u64 > self.max_line() {
            // Its real size, for the message: the rest of the line is read and dropped (the
            // append stops here anyway), never held.
            let (rest, whole) = match ended {
                true => (0, true),
                false => self.skip_line()?,
            };
            return Ok(Some(Err(Oversize {
                bytes: line.len() as u64 + rest,
                whole,
            })));
        }
        Ok(Some(Ok(line)))
    }
}

/// A line over the limit: its size, and whether that is all of it (`false`: at least).
#[derive(Debug, Clone, Copy)]
struct Oversize {
    bytes: u64,
    whole: bool,
}

impl Oversize {
    fn size(self) -> String {
        match self.whole {
            true => human(self.bytes),
            false => format!("{} (at least)", human(self.bytes)),
        }
    }
}

/// The most of an oversize line read past the limit to learn its size: input that never ends
/// a line (a device, binary data) is reported "at least" this far in, not read for ever.
const SKIP_LINE_MAX: u64 = 64 << 20;

impl<R: BufRead> Records<R> {
    /// Reads the rest of a line, holding a buffer's worth at a time, and returns its length
    /// without its end (`\n` or `\r\n`), and whether the line ended within `SKIP_LINE_MAX`.
    fn skip_line(&mut self) -> std::io::Result<(u64, bool)> {
        let (mut skipped, mut last) = (0u64, None);
        loop {
            if skipped >= SKIP_LINE_MAX {
                return Ok((skipped, false));
            }
            let buf = self.input.fill_buf()?;
            if buf.is_empty() {
                return Ok((skipped, true));
            }
            if let Some(at) = buf.iter().position(|b| *b == b'\n') {
                let before = if at > 0 {
                    buf.get(at - 1).copied()
                } else {
                    last
                };
                skipped += at as u64 - u64::from(before == Some(b'\r'));
                self.input.consume(at + 1);
                return Ok((skipped, true));
            }
            last = buf.last().copied();
            skipped += buf.len() as u64;
            let len = buf.len();
            self.input.consume(len);
        }
    }
}

/// Why the input could not be read as records.
#[derive(Debug)]
pub struct BadInput {
    pub position: Position,
    pub problem: String,
}

impl<R: BufRead> Iterator for Records<R> {
    type Item = Result<(Position, Record), BadInput>;

    fn next(&mut self) -> Option<Self::Item> {
        self.number += 1;
        let bad = |this: &Self, problem: String| {
            Some(Err(BadInput {
                position: this.here(),
                problem,
            }))
        };
        let record = match self.framing {
            Framing::Lines => match self.line() {
                Ok(None) => return None,
                Ok(Some(Ok(line))) => Record::new(line),
                Ok(Some(Err(size))) => return bad(self, self.oversize_line(size)),
                Err(e) => return bad(self, e.to_string()),
            },
            Framing::Json => {
                // Blank lines between records are allowed, and not counted as records.
                let line = loop {
                    match self.line() {
                        Ok(None) => return None,
                        Ok(Some(Ok(line))) if line.iter().all(u8::is_ascii_whitespace) => {
                            self.number += 1
                        }
                        Ok(Some(Ok(line))) => break line,
                        Ok(Some(Err(size))) => {
                            return bad(
                                self,
                                format!(
                                    "a JSON line of {} cannot hold a record within {} of {}",
                                    size.size(),
                                    self.limit,
                                    human(self.max_record_bytes)
                                ),
                            );
                        }
                        Err(e) => return bad(self, e.to_string()),
                    }
                };
                let parsed = serde_json::from_slice::<RecordJson>(&line)
                    .map_err(|e| format!("not a JSON record: {e}"))
                    .and_then(RecordJson::into_record);
                match parsed {
                    Ok(record) => record,
                    Err(problem) => return bad(self, problem),
                }
            }
            Framing::LengthPrefixed => {
                let mut len = [0u8; 4];
                match self.input.read_exact(&mut len) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
                    Err(e) => return bad(self, e.to_string()),
                }
                let len = u32::from_be_bytes(len) as u64;
                if len > self.max_record_bytes {
                    return bad(self, self.oversize(len));
                }
                let mut body = Vec::new();
                match (&mut self.input).take(len).read_to_end(&mut body) {
                    Ok(n) if n as u64 == len => Record::new(body),
                    Ok(n) => {
                        return bad(
                            self,
                            format!("the input ends {n} bytes into a record of {len} bytes"),
                        );
                    }
                    Err(e) => return bad(self, e.to_string()),
                }
            }
        };
        if record.content_bytes() > self.max_record_bytes {
            return bad(self, self.oversize(record.content_bytes()));
        }
        Some(Ok((self.here(), record)))
    }
}

fn human(bytes: u64) -> String {
    nova_proto::units::human_bytes(bytes).to_string()
}

/// Writes one record in `framing`.
pub fn write_record(
    out: &mut impl Write,
    record: &SequencedRecord,
    framing: Framing,
) -> std::io::Result<()> {
    match framing {
        Framing::Lines => {
            out.write_all(&record.record.body)?;
            out.write_all(b"\n")
        }
        Framing::LengthPrefixed => {
            let len = u32::try_from(record.record.body.len()).unwrap_or(u32::MAX);
            out.write_all(&len.to_be_bytes())?;
            out.write_all(&record.record.body)
        }
        Framing::Json => {
            serde_json::to_writer(&mut *out, &RecordJson::of(record))?;
            out.write_all(b"\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(input: &[u8], framing: Framing) -> Vec<Result<(Position, Record), BadInput>> {
        Records::new(input, "stdin".into(), framing, 1 << 20).collect()
    }

    #[test]
    fn an_oversize_record_is_named_without_reading_it_whole() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100));
        input.extend(b"\nafter\n");
        let found: Vec<_> = Records::new(&input[..], "in.txt".into(), Framing::Lines, 10).collect();
        assert!(found[0].is_ok());
        let bad = found[1].as_ref().unwrap_err();
        assert_eq!(bad.position.to_string(), "in.txt line 2");
        // Its real size, though it was never held whole.
        assert!(
            bad.problem
                .contains("a record of 100 B is over the server's --max-record-bytes of 10 B"),
            "{}",
            bad.problem
        );
        // One byte over, its end read with it: the next line is not taken for its rest. A
        // CRLF line's end is not counted either.
        let input = b"12345678901\nnext\n";
        let found: Vec<_> = Records::new(&input[..], "in".into(), Framing::Lines, 10).collect();
        let bad = found[0].as_ref().unwrap_err();
        assert!(bad.problem.contains("a record of 11 B"), "{}", bad.problem);
        assert_eq!(&found[1].as_ref().unwrap().1.body[..], b"next");
        let long = [&[b'y'; 5000][..], b"\r\n"].concat();
        let found: Vec<_> = Records::new(&long[..], "in".into(), Framing::Lines, 4)
            .limited_by("nova's --max-record-bytes")
            .collect();
        let bad = found[0].as_ref().unwrap_err();
        assert!(
            bad.problem
                .contains("a record of 4.9 KiB is over nova's --max-record-bytes of 4 B"),
            "{}",
            bad.problem
        );
        // Input that never ends its line is read only so far past the limit: "at least".
        let endless = std::io::BufReader::new(std::io::Read::take(std::io::repeat(b'z'), 1 << 40));
        let bad = Records::new(endless, "dev".into(), Framing::Lines, 10)
            .next()
            .unwrap()
            .unwrap_err();
        assert!(bad.problem.contains("(at least)"), "{}", bad.problem);
        let prefixed = [0u8, 0, 1, 0];
        let found: Vec<_> =
            Records::new(&prefixed[..], "f".into(), Framing::LengthPrefixed, 10).collect();
        assert!(found[0].as_ref().unwrap_err().problem.contains("256 B"));
    }

    #[test]
    fn json_round_trips_headers_timestamps_and_bytes() {
        let record = SequencedRecord {
            seq: 7,
            record: {
                let mut r = Record::new(vec![0xffu8, 0, 1]).with_header("k", "v");
                r.timestamp = 42;
                r
            },
        };
        let mut out = Vec::new();
        write_record(&mut out, &record, Framing::Json).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            text,
            "{\"seq\":7,\"timestamp\":42,\"body_hex\":\"ff0001\",\"headers\":[[\"k\",\"v\"]]}\n"
        );
        let back = records(&out, Framing::Json);
        let (position, again) = back[0].as_ref().unwrap();
        assert_eq!(position.number, 1);
        assert_eq!(again, &record.record);
    }

    #[test]
    fn bad_input_names_its_line() {
        let found = records(b"{\"body\":\"a\"}\n\n{nope}\n", Framing::Json);
        assert!(found[0].is_ok());
        let bad = found[1].as_ref().unwrap_err();
        assert_eq!(bad.position.to_string(), "stdin line 3");
        assert!(bad.problem.contains("not a JSON record"), "{}", bad.problem);
        let short = records(&[0, 0, 0, 9, b'x'], Framing::LengthPrefixed);
        let bad = short[0].as_ref().unwrap_err();
        assert_eq!(bad.position.to_string(), "stdin record 1");
        assert!(bad.problem.contains("1 bytes into a record of 9"));
    }
}
