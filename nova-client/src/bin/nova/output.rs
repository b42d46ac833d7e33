//! Printing for people and for scripts.

use std::io::Write;

use serde::Serialize;

use nova_client::StreamInfo;

use crate::when::{format_duration, format_time};

/// A stream for scripts: times in Unix ms and as dates, sizes in bytes.
#[derive(Serialize)]
pub struct StreamJson<'a> {
    pub name: &'a str,
    pub tail_seq: u64,
    pub stored_bytes: u64,
    pub storage_class: &'a str,
    pub created_at_ms: u64,
    pub created_at: String,
    pub first_seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_age_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub leader_id: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub leader_addr: &'a str,
}

impl<'a> From<&'a StreamInfo> for StreamJson<'a> {
    fn from(info: &'a StreamInfo) -> Self {
        Self {
            name: &info.name,
            tail_seq: info.tail_seq,
            stored_bytes: info.stored_bytes,
            storage_class: info.storage_class.as_str(),
            created_at_ms: info.created_at_ms,
            created_at: format_time(info.created_at_ms),
            first_seq: info.first_seq,
            retention_age_ms: info.retention.age.map(|a| a.as_millis() as u64),
            retention_bytes: info.retention.bytes,
            leader_id: &info.leader_id,
            leader_addr: &info.leader_addr,
        }
    }
}

/// A stream for people, one field a line.
pub fn describe(out: &mut impl Write, info: &StreamInfo) -> anyhow::Result<()> {
    let human = nova_proto::units::human_bytes;
    writeln!(out, "name:           {}", info.name)?;
    writeln!(out, "storage class:  {}", info.storage_class)?;
    writeln!(
        out,
        "records:        {}..{} ({} held)",
        info.first_seq,
        info.tail_seq,
        info.tail_seq - info.first_seq.min(info.tail_seq)
    )?;
    writeln!(
        out,
        "stored:         {} ({} bytes)",
        human(info.stored_bytes),
        info.stored_bytes
    )?;
    writeln!(out, "created:        {}", format_time(info.created_at_ms))?;
    let age = info
        .retention
        .age
        .map_or_else(|| "no limit".to_owned(), format_duration);
    let bytes = info
        .retention
        .bytes
        .map_or_else(|| "no limit".to_owned(), human);
    writeln!(out, "retention:      age {age}, size {bytes}")?;
    if !info.leader_id.is_empty() {
        writeln!(
            out,
            "leader:         {} at {}",
            info.leader_id, info.leader_addr
        )?;
    }
    Ok(())
}

/// One JSON line.
pub fn json_line(out: &mut impl Write, value: &impl Serialize) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}
