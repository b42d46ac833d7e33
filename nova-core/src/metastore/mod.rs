//! The metastore: a small transactional key-value store holding the catalog (streams, the index,
//! chain checkpoints). The trait is shaped like etcd's API (versions per key, compare-and-set
//! transactions, prefix scans, leases) so a distributed backend can slot in behind it; the
//! embedded backend is a redb file under the data directory.

mod embedded;
pub mod faulty;

use std::fmt;

use async_trait::async_trait;

pub use embedded::EmbeddedMetastore;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// Changes on every write of the key; never zero for a key that exists.
    pub version: u64,
}

/// A condition a transaction checks before it applies anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key must not exist.
    Missing(Vec<u8>),
    /// The key must exist at exactly this version.
    Version(Vec<u8>, u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// Applied atomically: every compare holds and every mutation lands, or nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub mutations: Vec<Mutation>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn compare(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }

    pub fn put(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.mutations.push(Mutation::Put(key.into(), value.into()));
        self
    }

    pub fn delete(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.mutations.push(Mutation::Delete(key.into()));
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every key the transaction put now has `revision` as its version.
    Committed { revision: u64 },
    /// A compare failed; nothing was applied.
    Conflict,
}

/// What a backend can do. A caller that needs a capability a backend lacks gets
/// `MetastoreError::Unsupported` rather than a quiet imitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Keys bound to a lease that expires unless kept alive (for fleet membership).
    pub leases: bool,
    /// Other processes can reach the same data (a fleet can share it).
    pub shared: bool,
}

/// The largest scan page.
pub const MAX_SCAN: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum MetastoreError {
    #[error("metastore unavailable: {0}")]
    Unavailable(String),
    #[error("metastore does not support {0}")]
    Unsupported(&'static str),
    #[error("metastore failed: {0}")]
    Internal(String),
}

#[async_trait]
pub trait Metastore: Send + Sync + fmt::Debug + 'static {
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError>;

    /// Keys starting with `prefix`, in byte order, strictly after `start_after` when given, at
    /// most `limit` (capped at `MAX_SCAN`).
    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError>;

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError>;

    /// Grants a lease of `ttl` and returns its id.
    async fn grant_lease(&self, _ttl: std::time::Duration) -> Result<u64, MetastoreError> {
        Err(MetastoreError::Unsupported("leases"))
    }
}

#[cfg(test)]
mod tests;
