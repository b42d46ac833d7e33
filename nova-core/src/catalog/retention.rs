//! What retention keeps in the catalog: each trimmed stream's *trim point*, `f/{id}`, the first
//! sequence number it still holds and the bytes trimmed below it. Only the auditor's retention
//! duty moves it, in the transaction that drops the entries below it; reads below it are
//! answered OUT_OF_RANGE, naming it.

use super::*;

const TRIM_PREFIX: &[u8] = b"f/";

pub(super) fn trim_key(id: u64) -> Vec<u8> {
    let mut key = TRIM_PREFIX.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// A stream's trim point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trim {
    /// The first record the stream still holds; everything below it was trimmed.
    pub first_seq: u64,
    /// Encoded bytes of the trimmed records: the stream holds its tail's stored bytes less these.
    pub trimmed_bytes: u64,
}

pub(super) fn encode_trim(trim: &Trim) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(trim.first_seq);
    buf.put_u64_le(trim.trimmed_bytes);
    buf
}

pub(super) fn decode_trim(value: &[u8]) -> Result<Trim, CatalogError> {
    let mut r = Reader::start(value)?;
    Ok(Trim {
        first_seq: r.u64()?,
        trimmed_bytes: r.u64()?,
    })
}

impl Catalog {
    /// Streams in name order after `after` (from the first when `None`), at most `limit`.
    pub async fn streams_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StreamMeta>, CatalogError> {
        // No stream is named "": it stands for "from the first".
        self.streams_with_prefix("", after.unwrap_or(""), limit)
            .await
    }

    /// Streams whose names start with `prefix`, in name order after `after` (from the first
    /// when empty), at most `limit`.
    pub async fn streams_with_prefix(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<StreamMeta>, CatalogError> {
        let scan_prefix = name_key(prefix);
        let after = (!after.is_empty()).then(|| name_key(after));
        self.store
            .scan(&scan_prefix, after.as_deref(), limit)
            .await?
            .iter()
            .map(|kv| {
                let name = std::str::from_utf8(&kv.key[2..])
                    .map_err(|_| CatalogError::Corrupt("stream name is not UTF-8".into()))?;
                decode_meta(name, &kv.value)
            })
            .collect()
    }

    /// Stream `id`'s trim point and its version (`None`: never trimmed, it starts at 0).
    pub async fn trim(&self, id: u64) -> Result<Option<(Trim, u64)>, CatalogError> {
        match self.store.get(&trim_key(id)).await? {
            Some(kv) => Ok(Some((decode_trim(&kv.value)?, kv.version))),
            None => Ok(None),
        }
    }

    /// The first record stream `id` still holds.
    pub async fn first_seq(&self, id: u64) -> Result<u64, CatalogError> {
        Ok(self.trim(id).await?.map_or(0, |(trim, _)| trim.first_seq))
    }

    /// Trims the stream's first entries (`front`, consecutive from its trim point, each still at
    /// the version it was read at) and moves its trim point to where they end, from the version
    /// it was read at (`None`: it had none). `garbage` (the objects only these entries
    /// referenced) is queued in the same transaction. `false` if anything changed meanwhile.
    pub async fn trim_front(
        &self,
        front: &[(IndexEntry, u64)],
        at: Option<(Trim, u64)>,
        garbage: &[(u64, Garbage)],
    ) -> Result<bool, CatalogError> {
        let (Some((first, _)), Some((last, _))) = (front.first(), front.last()) else {
            return Ok(true);
        };
        let id = first.stream_id;
        let from = at.map_or(0, |(trim, _)| trim.first_seq);
        let consecutive = front
            .windows(2)
            .all(|w| w[0].0.end_seq == w[1].0.start_seq && w[1].0.stream_id == id);
        if first.start_seq > from || !consecutive {
            return Err(CatalogError::Conflict(format!(
                "entries {}..{} of stream {id} are not the front of the stream at {from}",
                first.start_seq, last.end_seq
            )));
        }
        let key = trim_key(id);
        let mut txn = Txn::new().compare(match at {
            Some((_, version)) => Compare::Version(key.clone(), version),
            None => Compare::Missing(key.clone()),
        });
        for (entry, version) in front {
            let entry_key = index_key(entry.stream_id, entry.end_seq);
            txn = txn
                .compare(Compare::Version(entry_key.clone(), *version))
                .delete(entry_key);
        }
        let next = Trim {
            // Entries below the trim point (an object spanning it, restored by a rebuild) go
            // without moving it back.
            first_seq: last.end_seq.max(from),
            trimmed_bytes: at.map_or(0, |(trim, _)| trim.trimmed_bytes)
                + front.iter().map(|(e, _)| e.len).sum::<u64>(),
        };
        let txn = audit::queue(txn.put(key, encode_trim(&next)), garbage);
        Ok(matches!(
            self.store.commit(txn).await?,
            TxnOutcome::Committed { .. }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::tests::catalog;

    fn entry(id: u64, start: u64, end: u64, key: &str) -> IndexEntry {
        IndexEntry {
            stream_id: id,
            start_seq: start,
            end_seq: end,
            object_key: key.into(),
            offset: 16,
            len: 10,
            crc32c: 0,
            created_at_ms: 0,
        }
    }

    #[tokio::test]
    async fn trimming_moves_the_trim_point_only_from_the_front_and_only_once() {
        let (_dir, catalog) = catalog();
        let meta = catalog
            .create_stream("s", StorageClass::Standard, 1)
            .await
            .unwrap();
        let entries: Vec<IndexEntry> = (0..3)
            .map(|i| entry(meta.id, i * 5, i * 5 + 5, &format!("o{i}")))
            .collect();
        catalog.restore_entries(&entries).await.unwrap();
        assert_eq!(catalog.first_seq(meta.id).await.unwrap(), 0);
        let read = catalog.index_page(None, 10).await.unwrap();
        // Not the front: refused.
        assert!(catalog.trim_front(&read[1..2], None, &[]).await.is_err());
        let garbage = [(
            5,
            Garbage::Object {
                key: "o0".into(),
                bytes: 10,
            },
        )];
        assert!(
            catalog
                .trim_front(&read[..1], None, &garbage)
                .await
                .unwrap()
        );
        let at = catalog.trim(meta.id).await.unwrap();
        assert_eq!(
            at.map(|(t, _)| t),
            Some(Trim {
                first_seq: 5,
                trimmed_bytes: 10
            })
        );
        assert_eq!(catalog.garbage_page(10).await.unwrap().len(), 1);
        // The same trim again finds the trim point moved and its entry gone.
        assert!(!catalog.trim_front(&read[..1], None, &[]).await.unwrap());
        assert!(catalog.trim_front(&read[1..2], at, &[]).await.unwrap());
        assert_eq!(catalog.first_seq(meta.id).await.unwrap(), 10);
        let left = catalog.index_entries(meta.id, 0, 10).await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].start_seq, 10);
    }
}
