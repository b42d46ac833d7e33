//! Consumer groups' committed offsets (Kafka's `OffsetCommit`): for each group and stream, the
//! offset the group's consumers go on from and the metadata string they committed with it, at
//! `o/{group length:be16}{group}{stream}`. They live in the metastore, so on etcd a group's
//! progress survives the loss of the star that coordinated it.

use super::*;

const OFFSET_PREFIX: &[u8] = b"o/";

/// Puts in one metastore transaction: well inside etcd's default of 128 operations.
const OFFSETS_PER_TXN: usize = 64;

/// The longest metadata string kept with a committed offset.
pub const MAX_OFFSET_METADATA: usize = 4096;

/// One stream's committed offset for a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub stream: String,
    pub offset: i64,
    pub metadata: String,
    pub committed_at_ms: u64,
}

/// The longest group name kept (the key holds its length in two bytes).
pub const MAX_GROUP_BYTES: usize = u16::MAX as usize;

fn group_prefix(group: &str) -> Result<Vec<u8>, CatalogError> {
    if group.len() > MAX_GROUP_BYTES {
        return Err(CatalogError::Corrupt(format!(
            "group name of {} bytes is over {MAX_GROUP_BYTES}",
            group.len()
        )));
    }
    let mut key = OFFSET_PREFIX.to_vec();
    key.put_u16(group.len() as u16);
    key.extend_from_slice(group.as_bytes());
    Ok(key)
}

fn offset_key(group: &str, stream: &str) -> Result<Vec<u8>, CatalogError> {
    let mut key = group_prefix(group)?;
    key.extend_from_slice(stream.as_bytes());
    Ok(key)
}

fn encode_offset(offset: &CommittedOffset) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(offset.offset as u64);
    buf.put_u64_le(offset.committed_at_ms);
    buf.put_u32_le(offset.metadata.len() as u32);
    buf.extend_from_slice(offset.metadata.as_bytes());
    buf
}

fn decode_offset(stream: String, value: &[u8]) -> Result<CommittedOffset, CatalogError> {
    let mut r = Reader::start(value)?;
    Ok(CommittedOffset {
        stream,
        offset: r.u64()? as i64,
        committed_at_ms: r.u64()?,
        metadata: r.string()?,
    })
}

impl Catalog {
    /// Records `offsets` as `group`'s committed ones (a group name is at most 65,535 bytes; a
    /// longer one, or metadata over `MAX_OFFSET_METADATA`, is refused before anything is
    /// written). Large commits are written in several transactions, each stream's offset
    /// whole.
    pub async fn commit_offsets(
        &self,
        group: &str,
        offsets: &[CommittedOffset],
    ) -> Result<(), CatalogError> {
        group_prefix(group)?;
        if let Some(long) = offsets
            .iter()
            .find(|o| o.metadata.len() > MAX_OFFSET_METADATA)
        {
            return Err(CatalogError::Corrupt(format!(
                "offset metadata of {} bytes for {} is over {MAX_OFFSET_METADATA}",
                long.metadata.len(),
                long.stream
            )));
        }
        for chunk in offsets.chunks(OFFSETS_PER_TXN) {
            let mut txn = Txn::new();
            for offset in chunk {
                txn = txn.put(offset_key(group, &offset.stream)?, encode_offset(offset));
            }
            self.store.commit(txn).await?;
        }
        Ok(())
    }

    /// `group`'s committed offsets, by stream name.
    pub async fn committed_offsets(
        &self,
        group: &str,
    ) -> Result<Vec<CommittedOffset>, CatalogError> {
        let prefix = group_prefix(group)?;
        self.scan_all(&prefix)
            .await?
            .into_iter()
            .map(|kv| {
                let stream = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
                decode_offset(stream, &kv.value)
            })
            .collect()
    }

    /// Every group with committed offsets, at most `limit`, after `start_after`.
    pub async fn offset_groups(
        &self,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, CatalogError> {
        let mut groups = Vec::new();
        // Past every key of `start_after`'s group: its prefix followed by the largest bytes.
        let mut after = match start_after {
            Some(g) => {
                let mut key = group_prefix(g)?;
                key.extend_from_slice(&[0xff; 8]);
                Some(key)
            }
            None => None,
        };
        while groups.len() < limit {
            let page = self.store.scan(OFFSET_PREFIX, after.as_deref(), 1).await?;
            let Some(kv) = page.first() else { break };
            let rest = &kv.key[OFFSET_PREFIX.len()..];
            let Some((len, name)) = rest.split_first_chunk::<2>() else {
                return Err(CatalogError::Corrupt("a committed offset's key".into()));
            };
            let len = u16::from_be_bytes(*len) as usize;
            let Some(name) = name.get(..len) else {
                return Err(CatalogError::Corrupt("a committed offset's key".into()));
            };
            let group = String::from_utf8_lossy(name).into_owned();
            let mut next = group_prefix(&group)?;
            next.extend_from_slice(&[0xff; 8]);
            after = Some(next);
            groups.push(group);
        }
        Ok(groups)
    }

    /// Forgets `group`'s committed offsets.
    pub async fn delete_offsets(&self, group: &str) -> Result<(), CatalogError> {
        let keys: Vec<Vec<u8>> = self
            .scan_all(&group_prefix(group)?)
            .await?
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        for chunk in keys.chunks(OFFSETS_PER_TXN) {
            let txn = chunk
                .iter()
                .fold(Txn::new(), |txn, key| txn.delete(key.clone()));
            self.store.commit(txn).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::EmbeddedMetastore;

    #[tokio::test]
    async fn committed_offsets_read_back_by_group() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(Arc::new(
            EmbeddedMetastore::open(dir.path().join("m.redb")).unwrap(),
        ));
        let offset = |stream: &str, offset| CommittedOffset {
            stream: stream.into(),
            offset,
            metadata: format!("m{offset}"),
            committed_at_ms: 5,
        };
        catalog
            .commit_offsets("g1", &[offset("t/0", 10), offset("t/1", 20)])
            .await
            .unwrap();
        // A group whose name is the other's prefix keeps offsets of its own.
        catalog
            .commit_offsets("g", &[offset("t/0", 1)])
            .await
            .unwrap();
        catalog
            .commit_offsets("g1", &[offset("t/0", 11)])
            .await
            .unwrap();
        assert_eq!(
            catalog.committed_offsets("g1").await.unwrap(),
            vec![offset("t/0", 11), offset("t/1", 20)]
        );
        assert_eq!(
            catalog.committed_offsets("g").await.unwrap(),
            vec![offset("t/0", 1)]
        );
        assert_eq!(catalog.offset_groups(None, 10).await.unwrap(), ["g", "g1"]);
        assert_eq!(catalog.offset_groups(Some("g"), 10).await.unwrap(), ["g1"]);
        catalog.delete_offsets("g1").await.unwrap();
        assert!(catalog.committed_offsets("g1").await.unwrap().is_empty());
        assert_eq!(catalog.offset_groups(None, 10).await.unwrap(), ["g"]);
    }
}
