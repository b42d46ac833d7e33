//! The fetch cache: whole objects the settle reads, kept as files under a scratch directory
//! within a byte budget (`--auditor-fetch-cache-mib`), so a flight is fetched with one GET and
//! its sections are read back from disk, not held in memory.
//!
//! An object the budget cannot admit (larger than the budget, or everything resident is in use)
//! is not cached: the caller falls back to ranged GETs. Objects are evicted least recently used
//! first, and only while nobody holds them, so what is on disk never exceeds the budget.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use nova_core::object_store::{GetRange, ObjectStore, StoreError};

use crate::metrics::AuditorMetrics;

/// More entries than this are evicted whatever their size, so the index stays small when
/// objects are tiny.
const MAX_ENTRIES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("fetch cache file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One object on disk. The file goes when the last holder drops it after eviction.
#[derive(Debug)]
pub struct CachedObject {
    path: PathBuf,
    pub size: u64,
}

impl Drop for CachedObject {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl CachedObject {
    /// Bytes `offset..offset + len` of the object.
    pub async fn read(self: &Arc<Self>, offset: u64, len: u64) -> Result<Bytes, CacheError> {
        let this = self.clone();
        let read = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut file = std::fs::File::open(&this.path)?;
            file.seek(SeekFrom::Start(offset))?;
            let mut buf = vec![0; len as usize];
            file.read_exact(&mut buf)?;
            Ok(buf)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r);
        read.map(Bytes::from).map_err(|source| CacheError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Arc<CachedObject>>,
    /// Least recently used first.
    order: VecDeque<String>,
    resident: u64,
    next_file: u64,
}

#[derive(Debug)]
pub struct FetchCache {
    dir: PathBuf,
    capacity: u64,
    state: Mutex<State>,
    metrics: AuditorMetrics,
}

impl FetchCache {
    /// A cache under `dir`, emptied first: what a previous process left there is scratch.
    pub fn open(dir: &Path, capacity: u64, metrics: AuditorMetrics) -> std::io::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        metrics.cache_capacity.set(capacity as i64);
        metrics.cache_resident.set(0);
        Ok(Self {
            dir: dir.to_owned(),
            capacity,
            state: Mutex::new(State::default()),
            metrics,
        })
    }

    /// The whole object at `key` (of `size` bytes), from disk or fetched with one GET; `None`
    /// when the budget cannot admit it, and the caller reads ranges instead.
    pub async fn load(
        &self,
        store: &dyn ObjectStore,
        key: &str,
        size: u64,
    ) -> Result<Option<Arc<CachedObject>>, CacheError> {
        let path = {
            let mut state = self.state.lock();
            if let Some(hit) = state.entries.get(key).cloned() {
                state.order.retain(|k| k != key);
                state.order.push_back(key.to_owned());
                self.metrics.cache_hits.inc();
                return Ok(Some(hit));
            }
            self.metrics.cache_misses.inc();
            if !self.make_room(&mut state, size) {
                self.metrics.cache_fallbacks.inc();
                return Ok(None);
            }
            // Reserved now, so concurrent loads cannot overrun the budget together.
            state.resident += size;
            state.next_file += 1;
            self.dir.join(format!("{:016}", state.next_file))
        };
        let fetched = match store.get(key, GetRange::All).await {
            Ok(got) => got.bytes,
            Err(err) => {
                self.release(size);
                return Err(err.into());
            }
        };
        let written = {
            let (path, bytes) = (path.clone(), fetched.clone());
            tokio::task::spawn_blocking(move || std::fs::write(path, &bytes))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|r| r)
        };
        if let Err(source) = written {
            let _ = std::fs::remove_file(&path);
            self.release(size);
            return Err(CacheError::Io { path, source });
        }
        // The object may be shorter or longer than listed (rewritten meanwhile); account for
        // what is on disk.
        let actual = fetched.len() as u64;
        let object = Arc::new(CachedObject { path, size: actual });
        let mut state = self.state.lock();
        state.resident = state.resident - size + actual;
        state.entries.insert(key.to_owned(), object.clone());
        state.order.push_back(key.to_owned());
        self.metrics.cache_resident.set(state.resident as i64);
        Ok(Some(object))
    }

    fn release(&self, size: u64) {
        let mut state = self.state.lock();
        state.resident = state.resident.saturating_sub(size);
        self.metrics.cache_resident.set(state.resident as i64);
    }

    /// Evicts unused objects, oldest first, until `size` more bytes fit. `false` if they cannot.
    fn make_room(&self, state: &mut State, size: u64) -> bool {
        if size > self.capacity {
            return false;
        }
        let mut scanned = 0;
        while (state.resident + size > self.capacity || state.entries.len() >= MAX_ENTRIES)
            && scanned < state.order.len()
        {
            let Some(key) = state.order.pop_front() else {
                break;
            };
            let idle = state
                .entries
                .get(&key)
                .is_some_and(|o| Arc::strong_count(o) == 1);
            if idle {
                if let Some(object) = state.entries.remove(&key) {
                    state.resident = state.resident.saturating_sub(object.size);
                }
            } else {
                state.order.push_back(key);
                scanned += 1;
            }
        }
        self.metrics.cache_resident.set(state.resident as i64);
        state.resident + size <= self.capacity && state.entries.len() < MAX_ENTRIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::object_store::LocalStore;

    #[tokio::test]
    async fn serves_hits_from_disk_evicts_idle_objects_and_refuses_what_cannot_fit() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path().join("store"), Default::default()).unwrap();
        for (key, len) in [("a", 40u64), ("b", 40), ("c", 40), ("big", 200)] {
            store
                .put(
                    key,
                    Bytes::from(vec![key.as_bytes()[0]; len as usize]).into(),
                )
                .await
                .unwrap();
        }
        let metrics = AuditorMetrics::register(&prometheus::Registry::new());
        let cache = FetchCache::open(&root.path().join("cache"), 100, metrics.clone()).unwrap();
        let a = cache.load(&store, "a", 40).await.unwrap().unwrap();
        assert_eq!(&a.read(10, 3).await.unwrap()[..], b"aaa");
        let again = cache.load(&store, "a", 40).await.unwrap().unwrap();
        assert_eq!(metrics.cache_hits.get(), 1);
        drop(again);
        let b = cache.load(&store, "b", 40).await.unwrap().unwrap();
        // a and b are held: c does not fit and is refused rather than overrunning the budget.
        assert!(cache.load(&store, "c", 40).await.unwrap().is_none());
        assert_eq!(metrics.cache_fallbacks.get(), 1);
        drop(a);
        // Now a is idle and goes to make room.
        let c = cache.load(&store, "c", 40).await.unwrap().unwrap();
        assert_eq!(metrics.cache_resident.get(), 80);
        assert!(cache.load(&store, "big", 200).await.unwrap().is_none());
        drop((b, c));
        let files = std::fs::read_dir(root.path().join("cache"))
            .unwrap()
            .count();
        assert_eq!(files, 2, "the evicted object's file is gone");
    }
}
