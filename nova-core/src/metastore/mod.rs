//! The metastore: a small transactional key-value store holding the catalog (streams, the index,
//! chain checkpoints) and, in a fleet, the stars' registrations and the streams' leaders. The
//! trait is shaped like etcd's API (versions per key, compare-and-set transactions, prefix scans,
//! leases). Two backends: the embedded one, a redb file under the data directory (one star, no
//! set-up), and etcd (a fleet of stars sharing one catalog).

pub mod conformance;
mod embedded;
#[cfg(feature = "etcd")]
mod etcd;
pub mod faulty;

use std::fmt;

use async_trait::async_trait;

pub use embedded::EmbeddedMetastore;
#[cfg(feature = "etcd")]
pub use etcd::{ETCD_MAX_INFLIGHT, EtcdMetastore, EtcdOptions};

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
    /// A put bound to a lease: the key disappears when the lease expires or is revoked.
    PutLeased(Vec<u8>, Vec<u8>, u64),
    Delete(Vec<u8>),
}

impl Mutation {
    pub fn key(&self) -> &[u8] {
        match self {
            Mutation::Put(key, _) | Mutation::PutLeased(key, _, _) | Mutation::Delete(key) => key,
        }
    }
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

    pub fn put_leased(
        mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: u64,
    ) -> Self {
        self.mutations
            .push(Mutation::PutLeased(key.into(), value.into(), lease));
        self
    }

    pub fn delete(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.mutations.push(Mutation::Delete(key.into()));
        self
    }

    /// Refuses, before anything applies, a transaction past `max_ops` or one using leases on a
    /// backend without them.
    pub fn check(&self, max_ops: usize, leases: bool) -> Result<(), MetastoreError> {
        if self.ops() > max_ops {
            return Err(MetastoreError::TooLarge {
                ops: self.ops(),
                limit: max_ops,
            });
        }
        if !leases
            && self
                .mutations
                .iter()
                .any(|m| matches!(m, Mutation::PutLeased(..)))
        {
            return Err(MetastoreError::Unsupported("leases"));
        }
        Ok(())
    }

    /// Compares and mutations together: what etcd counts against `--max-txn-ops`.
    pub fn ops(&self) -> usize {
        self.compares.len().max(self.mutations.len())
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
    /// The most operations one transaction may carry (`Txn::ops`); a larger one is refused
    /// with `MetastoreError::TooLarge` before anything is sent. etcd's default is 128.
    pub max_txn_ops: usize,
}

/// etcd's default `--max-txn-ops`.
pub const ETCD_DEFAULT_MAX_TXN_OPS: usize = 128;

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
    #[error(
        "a transaction of {ops} operations is over this metastore's limit of {limit} \
         (etcd's --max-txn-ops)"
    )]
    TooLarge { ops: usize, limit: usize },
}

#[async_trait]
pub trait Metastore: Send + Sync + fmt::Debug + 'static {
    fn describe(&self) -> String;

    fn capabilities(&self) -> Capabilities;

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError>;

    /// A handle on this metastore whose reads wait with its transactions, not with other
    /// reads: for the work appends wait on. `None` when the backend has one queue.
    fn priority(&self) -> Option<std::sync::Arc<dyn Metastore>> {
        None
    }

    /// Each of `keys`, in order. A backend that can read many keys in one round trip does (etcd:
    /// a transaction of reads); the default reads them one by one.
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<KeyValue>>, MetastoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.get(key).await?);
        }
        Ok(out)
    }

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

    /// Renews a lease for its whole ttl. `None`: the lease is gone (expired or revoked), and
    /// so are the keys bound to it.
    async fn keep_alive(&self, _lease: u64) -> Result<Option<std::time::Duration>, MetastoreError> {
        Err(MetastoreError::Unsupported("leases"))
    }

    /// Ends a lease now, deleting the keys bound to it.
    async fn revoke_lease(&self, _lease: u64) -> Result<(), MetastoreError> {
        Err(MetastoreError::Unsupported("leases"))
    }

    /// How many bytes the metastore takes where it keeps its data (a file, etcd's database),
    /// for the operator; `None` when the backend cannot tell.
    async fn size_bytes(&self) -> Result<Option<u64>, MetastoreError> {
        Ok(None)
    }
}
