//! Stream manifests: one small object per stream in the object store, so that the bucket alone
//! is enough to rebuild the catalog. Flights say which records belong to which stream id and
//! name; a manifest says what the stream is (its name, class and creation time) and whether it
//! was deleted, which no flight can.
//!
//! ```text
//! magic "NOVASTM\0" | u16 version | u8 deleted | u64 id | u64 created_at_ms | u8 class
//! | u16 name_len | name | u32 crc32c of everything before it
//! ```
//!
//! Integers are little-endian; the version and field layout are kept stable.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::catalog::{StorageClass, StreamMeta};

const MAGIC: &[u8; 8] = b"NOVASTM\0";
const VERSION: u16 = 1;

/// What the bucket records about one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamManifest {
    pub meta: StreamMeta,
    pub deleted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt stream manifest: {0}")]
pub struct ManifestError(pub String);

fn corrupt(what: &str) -> ManifestError {
    ManifestError(what.to_owned())
}

impl StreamManifest {
    pub fn encode(&self) -> Bytes {
        let name = self.meta.name.as_bytes();
        let mut buf = BytesMut::with_capacity(8 + 2 + 1 + 8 + 8 + 1 + 2 + name.len() + 4);
        buf.put_slice(MAGIC);
        buf.put_u16_le(VERSION);
        buf.put_u8(self.deleted as u8);
        buf.put_u64_le(self.meta.id);
        buf.put_u64_le(self.meta.created_at_ms);
        buf.put_u8(self.meta.class.code());
        buf.put_u16_le(name.len() as u16);
        buf.put_slice(name);
        let crc = crc32c::crc32c(&buf);
        buf.put_u32_le(crc);
        buf.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() < 4 {
            return Err(corrupt("shorter than its checksum"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(body) != stored {
            return Err(corrupt("checksum mismatch"));
        }
        let mut r = body;
        if r.len() < 8 + 2 + 1 + 8 + 8 + 1 + 2 || &r[..8] != MAGIC {
            return Err(corrupt("not a stream manifest"));
        }
        r.advance(8);
        let version = r.get_u16_le();
        if version != VERSION {
            return Err(ManifestError(format!("unsupported version {version}")));
        }
        let deleted = match r.get_u8() {
            0 => false,
            1 => true,
            other => return Err(ManifestError(format!("bad deleted flag {other}"))),
        };
        let id = r.get_u64_le();
        let created_at_ms = r.get_u64_le();
        let class =
            StorageClass::from_code(r.get_u8()).map_err(|e| ManifestError(e.to_string()))?;
        let len = r.get_u16_le() as usize;
        if r.len() != len {
            return Err(corrupt("name length does not match"));
        }
        let name = std::str::from_utf8(r)
            .map_err(|_| corrupt("name is not UTF-8"))?
            .to_owned();
        Ok(Self {
            meta: StreamMeta {
                id,
                name,
                created_at_ms,
                class,
            },
            deleted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn manifests_round_trip(id: u64, created: u64, deleted: bool, name in "[a-z0-9/._-]{1,64}") {
            let manifest = StreamManifest {
                meta: StreamMeta { id, name, created_at_ms: created, class: StorageClass::Standard },
                deleted,
            };
            let bytes = manifest.encode();
            prop_assert_eq!(StreamManifest::decode(&bytes), Ok(manifest));
        }

        #[test]
        fn damage_is_detected(flip in 0usize..40) {
            let manifest = StreamManifest {
                meta: StreamMeta { id: 7, name: "orders".into(), created_at_ms: 1, class: StorageClass::Standard },
                deleted: false,
            };
            let mut bytes = manifest.encode().to_vec();
            let at = flip % bytes.len();
            bytes[at] ^= 0x40;
            prop_assert!(StreamManifest::decode(&bytes).is_err());
        }
    }
}
