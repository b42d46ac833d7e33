//! A layer that bounds the requests in flight to the store below it: reads (GET, HEAD, LIST) and
//! writes (PUT, conditional PUT, DELETE, compose) each pass a limit of their own, so a burst of
//! cold reads cannot starve flight writes. A request holds its slot until its answer is complete
//! (a GET's body read to the end). It stacks on any backend, so a backend is only its protocol.
//!
//! The local directory store keeps a bound of its own besides: its calls run on the blocking
//! thread pool, and a call whose caller gave up still holds a thread until the disk answers.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, ObjectMeta, ObjectStore, Op,
    PutPayload, StoreError,
};

#[derive(Debug)]
pub struct ConcurrencyLimited {
    inner: Arc<dyn ObjectStore>,
    reads: Semaphore,
    writes: Semaphore,
}

impl ConcurrencyLimited {
    pub fn new(inner: Arc<dyn ObjectStore>, reads: usize, writes: usize) -> Self {
        Self {
            inner,
            reads: Semaphore::new(reads.max(1)),
            writes: Semaphore::new(writes.max(1)),
        }
    }

    async fn slot(&self, op: Op, key: &str) -> Result<SemaphorePermit<'_>, StoreError> {
        let semaphore = match op {
            Op::Get | Op::Head | Op::List => &self.reads,
            Op::Put | Op::PutIfAbsent | Op::Delete | Op::Compose => &self.writes,
        };
        semaphore
            .acquire()
            .await
            .map_err(|_| StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: "store closed".into(),
            })
    }
}

#[async_trait]
impl ObjectStore for ConcurrencyLimited {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        let _slot = self.slot(Op::PutIfAbsent, key).await?;
        self.inner.put_if_absent(key, payload).await
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        let _slot = self.slot(Op::Put, key).await?;
        self.inner.put(key, payload).await
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        let _slot = self.slot(Op::Get, key).await?;
        self.inner.get(key, range).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let _slot = self.slot(Op::Head, key).await?;
        self.inner.head(key).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        let _slot = self.slot(Op::List, prefix).await?;
        self.inner.list(prefix, start_after, max_keys).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let _slot = self.slot(Op::Delete, key).await?;
        self.inner.delete(key).await
    }

    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        let _slot = self.slot(Op::Compose, key).await?;
        self.inner.compose(key, parts).await
    }

    fn min_compose_part(&self) -> u64 {
        self.inner.min_compose_part()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object_store::faulty::{Fault, FaultyStore};
    use crate::object_store::{LocalStore, StoreLimits};

    /// Writes past the limit wait for a slot while reads go by on theirs.
    #[tokio::test]
    async fn writes_wait_for_a_slot_and_reads_have_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = FaultyStore::new(Arc::new(
            LocalStore::open(dir.path(), StoreLimits::default()).unwrap(),
        ));
        faulty.inject(&[Op::Put], "held", Fault::Hold, None);
        let store = Arc::new(ConcurrencyLimited::new(Arc::new(faulty.clone()), 1, 1));
        let held = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .put("held", bytes::Bytes::from_static(b"x").into())
                    .await
            }
        });
        let clock = crate::clock::Clock::system();
        clock.sleep(std::time::Duration::from_millis(50)).await;
        // The one write slot is taken by the held PUT: the next write waits.
        let second = store.put("other", bytes::Bytes::from_static(b"y").into());
        tokio::pin!(second);
        assert!(
            clock
                .timeout(std::time::Duration::from_millis(100), &mut second)
                .await
                .is_err(),
            "a write passed a full write limit"
        );
        // Reads are not held up by writes.
        let listed = store.list("", None, 10).await.unwrap();
        assert!(listed.objects.is_empty());
        faulty.clear();
        held.await.unwrap().unwrap();
        second.await.unwrap();
    }
}
