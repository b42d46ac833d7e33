//! Stream manifests: one small object per stream in the object store, so that the bucket alone
//! is enough to rebuild the catalog. Flights say which records belong to which stream id and
//! name; a manifest says what the stream is (its name, class and creation time) and whether it
//! was deleted, which no flight can.
//!
//! ```text
//! magic "NOVASTM\0" | u16 version | u8 deleted | u64 id | u64 created_at_ms | u8 class
//! | u16 name_len | name | retention (version 2) | u32 crc32c of everything before it
//! ```
//!
//! The retention is a flags byte (1: an age follows, 2: a byte count follows) and the limits
//! that are set, each a u64. Integers are little-endian; each version's layout is kept stable,
//! and version 1 (before retention) still reads, as unlimited.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::catalog::{Catalog, CatalogError};
use crate::catalog::{Retention, StorageClass, StreamMeta};
use crate::keys::stream_manifest_key;
use crate::object_store::{ObjectStore, StoreError};

const MAGIC: &[u8; 8] = b"NOVASTM\0";
const VERSION: u16 = 2;
/// Without retention.
const VERSION_1: u16 = 1;

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
        // A stream without retention is written as version 1, which older releases read.
        let version = if self.meta.retention.is_unlimited() {
            VERSION_1
        } else {
            VERSION
        };
        buf.put_u16_le(version);
        buf.put_u8(self.deleted as u8);
        buf.put_u64_le(self.meta.id);
        buf.put_u64_le(self.meta.created_at_ms);
        buf.put_u8(self.meta.class.code());
        buf.put_u16_le(name.len() as u16);
        buf.put_slice(name);
        if version == VERSION {
            self.meta.retention.encode(&mut buf);
        }
        let crc = crate::flight::crc::crc32c(&buf);
        buf.put_u32_le(crc);
        buf.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() < 4 {
            return Err(corrupt("shorter than its checksum"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crate::flight::crc::crc32c(body) != stored {
            return Err(corrupt("checksum mismatch"));
        }
        let mut r = body;
        if r.len() < 8 + 2 + 1 + 8 + 8 + 1 + 2 || &r[..8] != MAGIC {
            return Err(corrupt("not a stream manifest"));
        }
        r.advance(8);
        let version = r.get_u16_le();
        if version != VERSION && version != VERSION_1 {
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
        if r.len() < len || (version == VERSION_1 && r.len() != len) {
            return Err(corrupt("name length does not match"));
        }
        let (name, mut rest) = r.split_at(len);
        let name = std::str::from_utf8(name)
            .map_err(|_| corrupt("name is not UTF-8"))?
            .to_owned();
        let retention = if version == VERSION_1 {
            Retention::default()
        } else {
            let retention =
                Retention::decode(&mut rest).ok_or_else(|| corrupt("retention is malformed"))?;
            if !rest.is_empty() {
                return Err(corrupt("bytes after the retention"));
            }
            retention
        };
        Ok(Self {
            meta: StreamMeta {
                id,
                name,
                created_at_ms,
                class,
                retention,
            },
            deleted,
        })
    }
}

/// Writes the manifest of `meta` under `star`'s prefix, saying whether it is deleted.
pub async fn write_manifest(
    store: &dyn ObjectStore,
    star: &str,
    meta: &StreamMeta,
    deleted: bool,
) -> Result<(), StoreError> {
    let manifest = StreamManifest {
        meta: meta.clone(),
        deleted,
    };
    store
        .put(
            &stream_manifest_key(star, meta.id),
            manifest.encode().into(),
        )
        .await
}

/// Marks deleted the manifest of stream `id`, deleted while the store was down (its tombstone
/// still pending): under the first of `stars` (the caller's own prefix, as the star's own
/// delete does) and under each other one that holds a manifest for it. The tombstone stays:
/// only the star that deleted the stream knows its own prefix holds a manifest to mark, and it
/// clears the tombstone once it has (at its next start).
pub async fn mark_pending_delete(
    store: &dyn ObjectStore,
    catalog: &Catalog,
    stars: &[&str],
    id: u64,
) -> Result<(), MarkDeleteError> {
    let Some(meta) = catalog.pending_tombstone(id).await? else {
        return Ok(());
    };
    let Some((own, others)) = stars.split_first() else {
        return Ok(());
    };
    write_manifest(store, own, &meta, true).await?;
    for star in others.iter().filter(|star| *star != own) {
        match store.head(&stream_manifest_key(star, id)).await {
            Ok(_) => write_manifest(store, star, &meta, true).await?,
            Err(StoreError::NotFound { .. }) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum MarkDeleteError {
    #[error("marking a deleted stream's manifest: {0}")]
    Store(#[from] StoreError),
    #[error("reading a deleted stream's tombstone: {0}")]
    Catalog(#[from] CatalogError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn manifests_round_trip(
            id: u64,
            created: u64,
            deleted: bool,
            name in "[a-z0-9/._-]{1,64}",
            age_ms: Option<u64>,
            bytes: Option<u64>,
        ) {
            let manifest = StreamManifest {
                meta: StreamMeta {
                    id,
                    name,
                    created_at_ms: created,
                    class: StorageClass::Standard,
                    retention: Retention { age_ms, bytes },
                },
                deleted,
            };
            let bytes = manifest.encode();
            prop_assert_eq!(StreamManifest::decode(&bytes), Ok(manifest));
        }

        #[test]
        fn damage_is_detected(flip in 0usize..40) {
            let manifest = StreamManifest {
                meta: StreamMeta {
                    id: 7,
                    name: "orders".into(),
                    created_at_ms: 1,
                    class: StorageClass::Standard,
                    retention: Retention { age_ms: Some(1000), bytes: None },
                },
                deleted: false,
            };
            let mut bytes = manifest.encode().to_vec();
            let at = flip % bytes.len();
            bytes[at] ^= 0x40;
            prop_assert!(StreamManifest::decode(&bytes).is_err());
        }
    }

    /// A manifest written before retention existed (version 1) still reads, as unlimited.
    #[test]
    fn version_1_manifests_read_without_retention() {
        let mut buf = BytesMut::new();
        buf.put_slice(MAGIC);
        buf.put_u16_le(VERSION_1);
        buf.put_u8(0);
        buf.put_u64_le(3);
        buf.put_u64_le(9);
        buf.put_u8(StorageClass::Standard.code());
        buf.put_u16_le(2);
        buf.put_slice(b"ab");
        let crc = crate::flight::crc::crc32c(&buf);
        buf.put_u32_le(crc);
        let manifest = StreamManifest::decode(&buf).unwrap();
        assert_eq!(manifest.meta.name, "ab");
        assert!(manifest.meta.retention.is_unlimited());
    }
}
