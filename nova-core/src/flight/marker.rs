//! The settle marker: how far the auditor has settled one epoch of a star's chain, kept in the
//! object store beside the epoch's slots (`keys::settle_marker_key`, one key per value; the
//! highest is the truth).
//!
//! The auditor deletes settled flights, so slot numbers below the marker may hold nothing: a
//! rebuild from the bucket starts each epoch after its marker, and treats a missing slot past
//! it as the end of what was acknowledged, exactly as before anything was collected.
//!
//! ```text
//! magic "NOVASTL\0", u16 version, u64 epoch, u64 settled_through, u32 crc32c of what precedes
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{FetchError, FormatError};
use crate::keys::{parse_settle_marker, settle_marker_key, settle_marker_prefix};
use crate::object_store::{GetRange, MAX_LIST_KEYS, ObjectStore, StoreError};

const MAGIC: &[u8; 8] = b"NOVASTL\0";
const VERSION: u16 = 1;
const LEN: usize = 8 + 2 + 8 + 8 + 4;

/// Every slot of `epoch` up to and including `settled_through` is settled: its live records
/// are in settled objects and the slot may be gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettleMarker {
    pub epoch: u64,
    pub settled_through: u64,
}

impl SettleMarker {
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(LEN);
        buf.put_slice(MAGIC);
        buf.put_u16_le(VERSION);
        buf.put_u64_le(self.epoch);
        buf.put_u64_le(self.settled_through);
        let crc = crate::flight::crc::crc32c(&buf);
        buf.put_u32_le(crc);
        buf.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() != LEN {
            return Err(FormatError::corrupt(format!(
                "settle marker of {} bytes, expected {LEN}",
                bytes.len()
            )));
        }
        if &bytes[..8] != MAGIC {
            return Err(FormatError::corrupt("settle marker magic missing"));
        }
        let computed = crate::flight::crc::crc32c(&bytes[..LEN - 4]);
        let mut rest = &bytes[8..];
        let version = rest.get_u16_le();
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let epoch = rest.get_u64_le();
        let settled_through = rest.get_u64_le();
        let stored = rest.get_u32_le();
        if stored != computed {
            return Err(FormatError::Checksum {
                what: "settle marker",
                stored,
                computed,
            });
        }
        Ok(Self {
            epoch,
            settled_through,
        })
    }
}

/// The highest settle marker of an epoch, with its key, or `None` when it has none.
pub async fn latest_settle_marker(
    store: &dyn ObjectStore,
    star: &str,
    epoch: u64,
) -> Result<Option<(String, SettleMarker)>, FetchError> {
    let prefix = settle_marker_prefix(star, epoch);
    let mut highest: Option<u64> = None;
    let mut after: Option<String> = None;
    loop {
        let page = store.list(&prefix, after.as_deref(), MAX_LIST_KEYS).await?;
        for object in &page.objects {
            if let Some(through) = parse_settle_marker(&prefix, &object.key) {
                highest = highest.max(Some(through));
            }
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let Some(through) = highest else {
        return Ok(None);
    };
    let key = settle_marker_key(star, epoch, through);
    let bytes = match store.get(&key, GetRange::All).await {
        Ok(got) => got.bytes,
        // Collected between the listing and now: a higher one replaced it, so look again.
        Err(StoreError::NotFound { .. }) => {
            return Box::pin(latest_settle_marker(store, star, epoch)).await;
        }
        Err(err) => return Err(err.into()),
    };
    let format = |source| FetchError::Format {
        key: key.clone(),
        source,
    };
    let marker = SettleMarker::decode(&bytes).map_err(format)?;
    if (marker.epoch, marker.settled_through) != (epoch, through) {
        return Err(format(FormatError::corrupt(format!(
            "the marker says epoch {} slot {}",
            marker.epoch, marker.settled_through
        ))));
    }
    Ok(Some((key, marker)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let marker = SettleMarker {
            epoch: 3,
            settled_through: 41,
        };
        let bytes = marker.encode();
        assert_eq!(SettleMarker::decode(&bytes), Ok(marker));
        for i in 0..bytes.len() {
            let mut damaged = bytes.to_vec();
            damaged[i] ^= 0x40;
            assert!(SettleMarker::decode(&damaged).is_err(), "byte {i}");
        }
        assert!(SettleMarker::decode(&bytes[..LEN - 1]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn every_marker_round_trips(epoch in proptest::prelude::any::<u64>(), settled_through in proptest::prelude::any::<u64>()) {
            let marker = SettleMarker { epoch, settled_through };
            proptest::prop_assert_eq!(SettleMarker::decode(&marker.encode()), Ok(marker));
        }
    }
}
