//! Printing for people and for scripts.

use std::io::Write;

use serde::Serialize;

use nova_client::{SequencedRecord, StreamInfo};

use crate::Format;

#[derive(Serialize)]
pub struct StreamJson<'a> {
    pub name: &'a str,
    pub tail_seq: u64,
    pub stored_bytes: u64,
    pub storage_class: &'a str,
    pub created_at_ms: u64,
    pub first_seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_age_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
}

impl<'a> From<&'a StreamInfo> for StreamJson<'a> {
    fn from(info: &'a StreamInfo) -> Self {
        Self {
            name: &info.name,
            tail_seq: info.tail_seq,
            stored_bytes: info.stored_bytes,
            storage_class: info.storage_class.as_str(),
            created_at_ms: info.created_at_ms,
            first_seq: info.first_seq,
            retention_age_ms: info.retention.age.map(|a| a.as_millis() as u64),
            retention_bytes: info.retention.bytes,
        }
    }
}

/// One JSON line.
pub fn json_line(out: &mut impl Write, value: &impl Serialize) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}

#[derive(Serialize)]
struct RecordJson<'a> {
    seq: u64,
    timestamp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a str>,
    /// Bodies that are not UTF-8 are printed as hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_hex: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, String)>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A record: its body and a newline as text, or a JSON line with its sequence number,
/// timestamp and headers.
pub fn record(
    out: &mut impl Write,
    record: &SequencedRecord,
    format: Format,
) -> anyhow::Result<()> {
    match format {
        Format::Text => {
            out.write_all(&record.record.body)?;
            out.write_all(b"\n")?;
            Ok(())
        }
        Format::Json => {
            let body = std::str::from_utf8(&record.record.body).ok();
            let json = RecordJson {
                seq: record.seq,
                timestamp: record.record.timestamp,
                body,
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
            };
            json_line(out, &json)
        }
    }
}
