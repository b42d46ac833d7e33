//! Rebuilding a catalog from the object store (`nova-chain`'s rebuild drives it): the marker of
//! a restore under way, the flag that every stream has its manifest, the tombstones of deletes
//! whose manifests are not yet marked, and writing the restored streams and index back.

use super::*;

/// Keys written per transaction by a restore, well under what any metastore accepts.
pub(super) const MAX_RESTORE_TXN: usize = 100;

impl Catalog {
    /// Marks a rebuild under way, until `restore_streams` finishes it.
    pub async fn begin_restore(&self) -> Result<(), CatalogError> {
        self.store
            .commit(Txn::new().put(RESTORING_KEY.to_vec(), vec![FORMAT]))
            .await?;
        Ok(())
    }

    /// Whether every stream has a manifest in the object store (false for catalogs from before
    /// manifests existed, until they are written).
    pub async fn manifests_complete(&self) -> Result<bool, CatalogError> {
        Ok(self.store.get(MANIFESTS_KEY).await?.is_some())
    }

    pub async fn set_manifests_complete(&self) -> Result<(), CatalogError> {
        self.store
            .commit(Txn::new().put(MANIFESTS_KEY.to_vec(), vec![FORMAT]))
            .await?;
        Ok(())
    }

    /// Deleted streams whose manifests are not yet marked deleted in the object store.
    pub async fn pending_tombstones(&self) -> Result<Vec<StreamMeta>, CatalogError> {
        let mut out = Vec::new();
        for kv in self.scan_all(b"d/").await? {
            let mut r = Reader::start(&kv.value)?;
            let name = r.string()?;
            let rest = [&[FORMAT][..], r.0].concat();
            out.push(decode_meta(&name, &rest)?);
        }
        Ok(out)
    }

    /// The pending tombstone of stream `id`: the stream as it was when deleted, while its
    /// manifest is not yet marked deleted.
    pub async fn pending_tombstone(&self, id: u64) -> Result<Option<StreamMeta>, CatalogError> {
        let Some(kv) = self.store.get(&tombstone_key(id)).await? else {
            return Ok(None);
        };
        let mut r = Reader::start(&kv.value)?;
        let name = r.string()?;
        let rest = [&[FORMAT][..], r.0].concat();
        Ok(Some(decode_meta(&name, &rest)?))
    }

    /// Forgets a pending tombstone once the manifest says the stream is deleted.
    pub async fn clear_tombstone(&self, id: u64) -> Result<(), CatalogError> {
        self.store
            .commit(Txn::new().delete(tombstone_key(id)))
            .await?;
        Ok(())
    }

    /// Writes index entries read back from the object store (`restore_streams` finishes a
    /// restore). Idempotent: entries are keyed by their own position.
    pub async fn restore_entries(&self, entries: &[IndexEntry]) -> Result<(), CatalogError> {
        for chunk in entries.chunks(MAX_RESTORE_TXN) {
            let mut txn = Txn::new();
            for entry in chunk {
                txn = txn.put(
                    index_key(entry.stream_id, entry.end_seq),
                    encode_entry(entry),
                );
            }
            self.store.commit(txn).await?;
        }
        Ok(())
    }

    /// Finishes a catalog rebuilt from the object store: streams with their tails, the next
    /// stream id, and the star's chain, clearing the mark `begin_restore` set in the same last
    /// transaction. An interrupted restore leaves the mark, and can be run again.
    pub async fn restore_streams(&self, restored: &Restored) -> Result<(), CatalogError> {
        // Names are unique in a restore, and a rerun after an interruption rewrites the same
        // keys, so these writes need no compares.
        for chunk in restored.streams.chunks(MAX_RESTORE_TXN / 2) {
            let mut txn = Txn::new();
            for (meta, tail) in chunk {
                txn = txn
                    .put(name_key(&meta.name), encode_meta(meta))
                    .put(tail_key(meta.id), encode_tail(tail));
            }
            self.store.commit(txn).await?;
        }
        for chunk in restored.trims.chunks(MAX_RESTORE_TXN) {
            let mut txn = Txn::new();
            for (id, trim) in chunk {
                txn = txn.put(retention::trim_key(*id), retention::encode_trim(trim));
            }
            self.store.commit(txn).await?;
        }
        let mut txn = Txn::new()
            .put(
                NEXT_ID_KEY.to_vec(),
                encode_next_id(restored.next_stream_id),
            )
            .put(MANIFESTS_KEY.to_vec(), vec![FORMAT])
            .delete(RESTORING_KEY.to_vec());
        if let Some((star, checkpoint)) = &restored.express {
            txn = txn.put(express_key(star), encode_express(checkpoint));
        }
        if let Some((star, state)) = &restored.chain {
            txn = txn.put(chain_key(star), encode_chain(state));
        }
        match self.store.commit(txn).await {
            Ok(_) => Ok(()),
            // The answer was lost: the mark is gone only if this transaction landed. (Found by
            // the simulation: a rebuild whose last answer was lost reported failure, and running
            // it again was refused, because the catalog it had finished was no longer empty.)
            Err(err) => {
                for _ in 0..READ_BACK_ATTEMPTS {
                    match self.store.get(RESTORING_KEY).await {
                        Ok(None) => return Ok(()),
                        Ok(Some(_)) => break,
                        Err(_) => continue,
                    }
                }
                Err(err.into())
            }
        }
    }
}
