//! The embedded metastore: one redb file. redb commits are durable (fsynced) before they
//! return, and its file lock keeps a second process from opening the same data directory.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::Semaphore;

use super::{
    Capabilities, Compare, ETCD_DEFAULT_MAX_TXN_OPS, KeyValue, MAX_SCAN, Metastore, MetastoreError,
    Mutation, Txn, TxnOutcome,
};

/// Values are stored as an 8-byte little-endian version followed by the caller's bytes.
const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");
/// Holds the last version handed out, so versions grow across restarts.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION: &str = "revision";

/// redb's page cache. A fixed term of the star's memory, so it is set rather than left at
/// redb's 1 GiB default.
const CACHE_BYTES: usize = 32 * 1024 * 1024;

/// Blocking calls in flight at once; callers past it wait for a turn.
const MAX_CONCURRENT_CALLS: usize = 16;

#[derive(Debug, Clone)]
pub struct EmbeddedMetastore {
    db: Arc<Database>,
    path: String,
    calls: Arc<Semaphore>,
}

fn internal(err: impl std::fmt::Display) -> MetastoreError {
    MetastoreError::Internal(err.to_string())
}

impl EmbeddedMetastore {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, MetastoreError> {
        let path = path.as_ref();
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => MetastoreError::Unavailable(format!(
                    "{} is already open in another process",
                    path.display()
                )),
                other => internal(other),
            })?;
        let txn = db.begin_write().map_err(internal)?;
        txn.open_table(KV).map_err(internal)?;
        txn.open_table(META).map_err(internal)?;
        txn.commit().map_err(internal)?;
        Ok(Self {
            db: Arc::new(db),
            path: path.display().to_string(),
            calls: Arc::new(Semaphore::new(MAX_CONCURRENT_CALLS)),
        })
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, MetastoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, MetastoreError> + Send + 'static,
    {
        let turn = self
            .calls
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| MetastoreError::Unavailable("metastore closed".into()))?;
        let db = self.db.clone();
        // The turn is released when the blocking work ends, not when the caller stops waiting
        // for it: a caller that gives up (shutdown, a timeout around it) must not let hung
        // calls pile up in the blocking pool past the limit.
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            f(&db)
        })
        .await
        .map_err(internal)?
    }
}

fn decode(key: &[u8], stored: &[u8]) -> Result<KeyValue, MetastoreError> {
    if stored.len() < 8 {
        return Err(internal("stored value shorter than its version"));
    }
    let mut version = [0u8; 8];
    version.copy_from_slice(&stored[..8]);
    Ok(KeyValue {
        key: key.to_vec(),
        value: stored[8..].to_vec(),
        version: u64::from_le_bytes(version),
    })
}

#[async_trait]
impl Metastore for EmbeddedMetastore {
    fn describe(&self) -> String {
        format!("embedded metastore {}", self.path)
    }

    async fn size_bytes(&self) -> Result<Option<u64>, MetastoreError> {
        let path = self.path.clone();
        let meta = tokio::fs::metadata(&path).await.map_err(internal)?;
        Ok(Some(meta.len()))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            leases: false,
            shared: false,
            // redb has no limit, but the catalog must not write what etcd would refuse: the
            // single-star default holds transactions to the fleet's bound.
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
        }
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        let key = key.to_vec();
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(internal)?;
            let table = txn.open_table(KV).map_err(internal)?;
            match table.get(key.as_slice()).map_err(internal)? {
                Some(value) => decode(&key, value.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        let prefix = prefix.to_vec();
        let start_after = start_after.map(<[u8]>::to_vec);
        let limit = limit.clamp(1, MAX_SCAN);
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(internal)?;
            let table = txn.open_table(KV).map_err(internal)?;
            let start = match &start_after {
                Some(after) if after.as_slice() >= prefix.as_slice() => after.clone(),
                _ => prefix.clone(),
            };
            let mut out = Vec::new();
            for item in table.range(start.as_slice()..).map_err(internal)? {
                let (key, value) = item.map_err(internal)?;
                let key = key.value();
                if !key.starts_with(&prefix) {
                    break;
                }
                if start_after.as_deref().is_some_and(|after| key <= after) {
                    continue;
                }
                out.push(decode(key, value.value())?);
                if out.len() == limit {
                    break;
                }
            }
            Ok(out)
        })
        .await
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        txn.check(ETCD_DEFAULT_MAX_TXN_OPS, false)?;
        self.blocking(move |db| {
            let write = db.begin_write().map_err(internal)?;
            let revision = 'apply: {
                let mut table = write.open_table(KV).map_err(internal)?;
                for compare in &txn.compares {
                    let holds = match compare {
                        Compare::Missing(key) => {
                            table.get(key.as_slice()).map_err(internal)?.is_none()
                        }
                        Compare::Version(key, want) => {
                            match table.get(key.as_slice()).map_err(internal)? {
                                Some(value) => decode(key, value.value())?.version == *want,
                                None => false,
                            }
                        }
                    };
                    if !holds {
                        break 'apply None;
                    }
                }
                let mut meta = write.open_table(META).map_err(internal)?;
                // Like etcd, one revision per transaction: every key it puts gets that version.
                let revision = meta
                    .get(REVISION)
                    .map_err(internal)?
                    .map(|v| v.value())
                    .unwrap_or(0)
                    + 1;
                let mut buf = Vec::new();
                for mutation in &txn.mutations {
                    match mutation {
                        Mutation::Put(key, value) => {
                            buf.clear();
                            buf.extend_from_slice(&revision.to_le_bytes());
                            buf.extend_from_slice(value);
                            table
                                .insert(key.as_slice(), buf.as_slice())
                                .map_err(internal)?;
                        }
                        Mutation::Delete(key) => {
                            table.remove(key.as_slice()).map_err(internal)?;
                        }
                        Mutation::PutLeased(..) => {
                            return Err(MetastoreError::Unsupported("leases"));
                        }
                    }
                }
                meta.insert(REVISION, revision).map_err(internal)?;
                Some(revision)
            };
            match revision {
                Some(revision) => {
                    write.commit().map_err(internal)?;
                    Ok(TxnOutcome::Committed { revision })
                }
                None => {
                    write.abort().map_err(internal)?;
                    Ok(TxnOutcome::Conflict)
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedMetastore::open(dir.path().join("m.redb")).unwrap();
        crate::metastore::conformance::run_all(&store, "conformance/").await;
    }

    #[tokio::test]
    async fn data_survives_reopening_and_a_second_opener_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        {
            let store = EmbeddedMetastore::open(&path).unwrap();
            store
                .commit(Txn::new().put(b"k".to_vec(), b"v".to_vec()))
                .await
                .unwrap();
            assert!(matches!(
                EmbeddedMetastore::open(&path),
                Err(MetastoreError::Unavailable(_))
            ));
        }
        let store = EmbeddedMetastore::open(&path).unwrap();
        assert_eq!(store.get(b"k").await.unwrap().unwrap().value, b"v");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_given_up_on_keeps_its_turn_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedMetastore::open(dir.path().join("m.redb")).unwrap();
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hung = store.blocking(move |_| {
            let _ = hold.recv();
            Ok(())
        });
        assert!(
            crate::clock::Clock::system()
                .timeout(Duration::from_millis(100), hung)
                .await
                .is_err()
        );
        assert_eq!(
            store.calls.available_permits(),
            MAX_CONCURRENT_CALLS - 1,
            "the abandoned call still holds its turn while it runs"
        );
        release.send(()).unwrap();
        for _ in 0..100 {
            if store.calls.available_permits() == MAX_CONCURRENT_CALLS {
                return;
            }
            crate::clock::Clock::system()
                .sleep(Duration::from_millis(10))
                .await;
        }
        panic!("the turn came back when the call ended");
    }
}
