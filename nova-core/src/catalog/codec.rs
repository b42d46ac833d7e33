//! The catalog's key schema (the table in `catalog`'s documentation) and the codecs of its
//! values. Every value starts with the format byte; decoders answer a value they cannot read
//! with `CatalogError::Corrupt`, never a panic (the fuzz targets hold them to it).

use bytes::{Buf, BufMut};

use super::{
    CatalogError, ChainState, ExpressCheckpoint, FORMAT, IndexEntry, Retention, StorageClass,
    StreamMeta, StreamTail, audit, retention,
};

pub(super) fn name_key(name: &str) -> Vec<u8> {
    let mut key = b"n/".to_vec();
    key.extend_from_slice(name.as_bytes());
    key
}

pub(super) fn tail_key(id: u64) -> Vec<u8> {
    let mut key = b"t/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

pub(super) fn index_prefix(id: u64) -> Vec<u8> {
    let mut key = b"i/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

pub(super) fn index_key(id: u64, end_seq: u64) -> Vec<u8> {
    let mut key = index_prefix(id);
    key.extend_from_slice(&end_seq.to_be_bytes());
    key
}

/// `e/{star}`. Every catalog prefix is one letter and a slash; `x/` (deleted streams being
/// dropped) scans every key under it, so a new kind of record needs a letter of its own.
pub(super) fn express_key(star: &str) -> Vec<u8> {
    let mut key = b"e/".to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

pub(super) fn encode_express(checkpoint: &ExpressCheckpoint) -> Vec<u8> {
    encode_epoch_slot(checkpoint.epoch, checkpoint.through)
}

pub(super) fn decode_express(value: &[u8]) -> Result<ExpressCheckpoint, CatalogError> {
    let (epoch, through) = decode_epoch_slot(value, "express checkpoint")?;
    Ok(ExpressCheckpoint { epoch, through })
}

/// An epoch and, optionally, a slot of it: a chain's checkpoint, an express checkpoint.
pub(super) fn encode_epoch_slot(epoch: u64, slot: Option<u64>) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(epoch);
    match slot {
        Some(slot) => {
            buf.put_u8(1);
            buf.put_u64_le(slot);
        }
        None => buf.put_u8(0),
    }
    buf
}

pub(super) fn decode_epoch_slot(
    value: &[u8],
    what: &str,
) -> Result<(u64, Option<u64>), CatalogError> {
    let mut r = Reader::start(value)?;
    let epoch = r.u64()?;
    let slot = match r.u8()? {
        0 => None,
        1 => Some(r.u64()?),
        other => return Err(CatalogError::Corrupt(format!("bad {what} tag {other}"))),
    };
    Ok((epoch, slot))
}

pub(super) fn chain_key(star: &str) -> Vec<u8> {
    let mut key = b"c/".to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

/// `h/{star}`: written with the chain, in one transaction, when a starting star or a takeover
/// claims it (`claim_chain`). While it carries the chain's version, the last write to the chain
/// was that claim, not anybody's absorb.
pub(super) fn claim_key(star: &str) -> Vec<u8> {
    let mut key = b"h/".to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

pub(super) const NEXT_ID_KEY: &[u8] = b"m/next_stream_id";

/// The reservation of the create of stream `name` in progress: rewritten by every create of
/// the name, compared by its insert, removed once the create is settled.
pub(super) fn creating_key(name: &str) -> Vec<u8> {
    let mut key = b"r/".to_vec();
    key.extend_from_slice(name.as_bytes());
    key
}
pub(super) const MANIFESTS_KEY: &[u8] = b"m/manifests";
pub(super) const RESTORING_KEY: &[u8] = b"m/restoring";

pub(super) fn tombstone_key(id: u64) -> Vec<u8> {
    let mut key = b"d/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

pub(super) fn encode_next_id(id: u64) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(id);
    buf
}

pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl Reader<'_> {
    pub(super) fn start(buf: &[u8]) -> Result<Reader<'_>, CatalogError> {
        match buf.first() {
            Some(&FORMAT) => Ok(Reader(&buf[1..])),
            Some(other) => Err(CatalogError::Corrupt(format!(
                "unknown value format {other}"
            ))),
            None => Err(CatalogError::Corrupt("empty value".into())),
        }
    }
    pub(super) fn need(&self, n: usize) -> Result<(), CatalogError> {
        if self.0.len() < n {
            Err(CatalogError::Corrupt("value truncated".into()))
        } else {
            Ok(())
        }
    }
    pub(super) fn u8(&mut self) -> Result<u8, CatalogError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    pub(super) fn u32(&mut self) -> Result<u32, CatalogError> {
        self.need(4)?;
        Ok(self.0.get_u32_le())
    }
    pub(super) fn u64(&mut self) -> Result<u64, CatalogError> {
        self.need(8)?;
        Ok(self.0.get_u64_le())
    }
    /// A field added after the format byte's value was fixed: absent in older values.
    pub(super) fn optional_u64(&mut self) -> Result<Option<u64>, CatalogError> {
        if self.0.is_empty() {
            Ok(None)
        } else {
            self.u64().map(Some)
        }
    }
    pub(super) fn string(&mut self) -> Result<String, CatalogError> {
        let len = self.u32()? as usize;
        self.need(len)?;
        let s = std::str::from_utf8(&self.0[..len])
            .map_err(|_| CatalogError::Corrupt("string is not UTF-8".into()))?
            .to_owned();
        self.0.advance(len);
        Ok(s)
    }
}

pub(super) fn encode_meta(meta: &StreamMeta) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(meta.id);
    buf.put_u64_le(meta.created_at_ms);
    buf.put_u8(meta.class.code());
    meta.retention.encode(&mut buf);
    buf
}

pub(super) fn decode_meta(name: &str, value: &[u8]) -> Result<StreamMeta, CatalogError> {
    let mut r = Reader::start(value)?;
    let id = r.u64()?;
    let created_at_ms = r.u64()?;
    let class = StorageClass::from_code(r.u8()?)?;
    // Absent from streams created before retention existed.
    let retention = if r.0.is_empty() {
        Retention::default()
    } else {
        Retention::decode(&mut r.0)
            .ok_or_else(|| CatalogError::Corrupt("stream retention is malformed".into()))?
    };
    Ok(StreamMeta {
        id,
        name: name.to_owned(),
        created_at_ms,
        class,
        retention,
    })
}

pub(super) fn encode_tail(tail: &StreamTail) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(tail.tail_seq);
    buf.put_u64_le(tail.stored_bytes);
    buf
}

pub(super) fn decode_tail(value: &[u8]) -> Result<StreamTail, CatalogError> {
    let mut r = Reader::start(value)?;
    Ok(StreamTail {
        tail_seq: r.u64()?,
        stored_bytes: r.u64()?,
    })
}

pub(super) fn encode_entry(entry: &IndexEntry) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(entry.start_seq);
    buf.put_u32_le(entry.object_key.len() as u32);
    buf.put_slice(entry.object_key.as_bytes());
    buf.put_u64_le(entry.offset);
    buf.put_u64_le(entry.len);
    buf.put_u32_le(entry.crc32c);
    buf.put_u64_le(entry.created_at_ms);
    buf
}

pub(super) fn decode_entry(key: &[u8], value: &[u8]) -> Result<IndexEntry, CatalogError> {
    if key.len() != 2 + 16 {
        return Err(CatalogError::Corrupt(
            "index key has the wrong length".into(),
        ));
    }
    let mut k = &key[2..];
    let stream_id = k.get_u64();
    let end_seq = k.get_u64();
    let mut r = Reader::start(value)?;
    Ok(IndexEntry {
        stream_id,
        start_seq: r.u64()?,
        end_seq,
        object_key: r.string()?,
        offset: r.u64()?,
        len: r.u64()?,
        crc32c: r.u32()?,
        // Absent from entries written before it was recorded.
        created_at_ms: r.optional_u64()?.unwrap_or(0),
    })
}

pub(super) fn encode_chain(state: &ChainState) -> Vec<u8> {
    encode_epoch_slot(state.epoch, state.checkpoint)
}

/// Runs every catalog decoder over one record. Catalog records are bytes from outside the
/// process (a metastore someone else can write), so the fuzz targets feed this arbitrary input:
/// each decoder must answer with an error, never panic.
#[doc(hidden)]
pub fn decode_every_kind(key: &[u8], value: &[u8]) -> usize {
    [
        decode_meta("fuzz", value).is_ok(),
        decode_tail(value).is_ok(),
        decode_entry(key, value).is_ok(),
        decode_chain(value).is_ok(),
        decode_express(value).is_ok(),
        audit::decode_cursor(value).is_ok(),
        audit::decode_garbage(key, value).is_ok(),
        retention::decode_trim(value).is_ok(),
    ]
    .into_iter()
    .filter(|ok| *ok)
    .count()
}

pub(super) fn decode_chain(value: &[u8]) -> Result<ChainState, CatalogError> {
    let (epoch, checkpoint) = decode_epoch_slot(value, "checkpoint")?;
    Ok(ChainState { epoch, checkpoint })
}
