//! A metastore wrapper that injects faults on command, for tests: commits can be held until
//! released, fail before applying, or apply and then lose their answer (the ambiguous outcome a
//! timed-out commit has).

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::{Capabilities, KeyValue, Metastore, MetastoreError, Txn, TxnOutcome};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFault {
    /// Waits until `release` (or `clear`), then commits.
    Hold,
    /// Fails without applying anything.
    Fail,
    /// Applies, then reports a failure.
    LoseAnswer,
}

/// Faults queued for the next commits, each with how many commits it applies to and, if set,
/// the key prefix a commit must write or delete to meet it.
type Queue = Vec<(CommitFault, Option<u32>, Option<Vec<u8>>)>;

#[derive(Debug, Clone)]
pub struct FaultyMetastore {
    inner: Arc<dyn Metastore>,
    faults: Arc<Mutex<Queue>>,
    released: Arc<watch::Sender<u64>>,
    /// Commits that have started waiting on a `Hold`, ever.
    held: Arc<watch::Sender<u64>>,
}

impl FaultyMetastore {
    pub fn new(inner: Arc<dyn Metastore>) -> Self {
        Self {
            inner,
            faults: Arc::default(),
            released: Arc::new(watch::channel(0).0),
            held: Arc::new(watch::channel(0).0),
        }
    }

    /// Applies `fault` to the next `times` commits (`None`: every commit until cleared).
    pub fn inject(&self, fault: CommitFault, times: Option<u32>) {
        self.faults.lock().push((fault, times, None));
    }

    /// Like `inject`, for commits that write or delete a key starting with `prefix` only;
    /// other commits pass untouched. Faults apply in order: while this one is first in the
    /// queue, faults queued after it wait too.
    pub fn inject_for_keys(&self, fault: CommitFault, times: Option<u32>, prefix: &[u8]) {
        self.faults
            .lock()
            .push((fault, times, Some(prefix.to_vec())));
    }

    /// Waits until some commit is held by a `Hold` fault.
    pub async fn wait_held(&self) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|n| *n > 0).await;
    }

    pub fn clear(&self) {
        self.faults.lock().clear();
        self.released.send_modify(|n| *n += 1);
    }

    fn next_fault(&self, txn: &Txn) -> Option<CommitFault> {
        let mut faults = self.faults.lock();
        let (fault, remaining, prefix) = faults.first_mut()?;
        if let Some(prefix) = prefix {
            let touches = txn.mutations.iter().any(|m| m.key().starts_with(prefix));
            if !touches {
                return None;
            }
        }
        let fault = *fault;
        if let Some(remaining) = remaining {
            *remaining -= 1;
            if *remaining == 0 {
                faults.remove(0);
            }
        }
        Some(fault)
    }
}

fn injected(what: &str) -> MetastoreError {
    MetastoreError::Unavailable(format!("injected fault: {what}"))
}

#[async_trait]
impl Metastore for FaultyMetastore {
    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn size_bytes(&self) -> Result<Option<u64>, MetastoreError> {
        self.inner.size_bytes().await
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        self.inner.get(key).await
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        self.inner.scan(prefix, start_after, limit).await
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        let mut released = self.released.subscribe();
        match self.next_fault(&txn) {
            None => self.inner.commit(txn).await,
            Some(CommitFault::Hold) => {
                self.held.send_modify(|n| *n += 1);
                let _ = released.changed().await;
                self.inner.commit(txn).await
            }
            Some(CommitFault::Fail) => Err(injected("the commit failed")),
            Some(CommitFault::LoseAnswer) => {
                self.inner.commit(txn).await?;
                Err(injected("the commit landed but its answer was lost"))
            }
        }
    }

    async fn grant_lease(&self, ttl: std::time::Duration) -> Result<u64, MetastoreError> {
        self.inner.grant_lease(ttl).await
    }

    async fn keep_alive(&self, lease: u64) -> Result<Option<std::time::Duration>, MetastoreError> {
        self.inner.keep_alive(lease).await
    }

    async fn revoke_lease(&self, lease: u64) -> Result<(), MetastoreError> {
        self.inner.revoke_lease(lease).await
    }
}
