//! The catalog: streams, the index of where each stream's records live, and chain checkpoints,
//! encoded as keys and values in the metastore.
//!
//! ```text
//! n/{name}                        stream by name: id, created time, class
//! t/{id:be64}                     stream tail: absorbed tail seq, stored bytes
//! i/{id:be64}{end_seq:be64}       index entry: a run of the stream's records in an object
//! c/{star}                        chain state: current epoch and the last absorbed slot
//! m/next_stream_id                the next stream id to hand out
//! m/next_producer_id              the next Kafka producer id to hand out
//! m/manifests                     set once every stream has a manifest in the object store
//! m/restoring                     set while a rebuild from the object store is under way
//! d/{id:be64}                     a deleted stream whose manifest is not yet marked deleted
//! x/{id:be64}                     a deleted stream whose index entries the auditor still drops
//! a/{star}                        the auditor's settle cursor over the star's chain
//! g/{due_ms:be64}{what}           garbage: objects (or a run of chain slots) to delete once due
//! f/{id:be64}                     a trimmed stream's trim point: its first seq, bytes trimmed
//! r/{name}                        a create of stream `name` in progress (its reservation)
//! e/{star}                        the star's Express checkpoint: epoch and last slot carried
//! h/{star}                        the star's chain claim (the chain's version at its claim)
//! k/{star}                        how far the collector has deleted the star's chain
//! y/{object key}                  an object being written under an intent, until it is swapped
//!                                 in or its intent is collected
//! o/{group len:be16}{group}{stream}  a consumer group's committed offset in a stream (Kafka)
//! ```
//!
//! Index entries are keyed by their *exclusive end*, so the entry holding sequence number `s` is
//! the first key after `(id, s)` in a forward scan. Every value starts with a format byte (kept
//! stable) so fields can be added later.

use std::sync::Arc;

use bytes::{Buf, BufMut};

use crate::metastore::{Compare, KeyValue, MAX_SCAN, Metastore, MetastoreError, Txn, TxnOutcome};
pub use codec::decode_every_kind;
use codec::*;

mod audit;
mod chain;
mod codec;
#[cfg(test)]
mod codec_tests;
mod offsets;
mod producer_ids;
mod restore;
use restore::MAX_RESTORE_TXN;
mod retention;
#[cfg(test)]
mod tests;
pub use audit::{Dropping, Garbage, Liveness, QueuedGarbage, SettleCursor, VersionedCursor};
pub use offsets::{CommittedOffset, MAX_GROUP_BYTES, MAX_OFFSET_METADATA};
pub use retention::Trim;

/// Reads back whether a transaction whose answer was lost landed: a read can fail too.
const READ_BACK_ATTEMPTS: usize = 5;

const FORMAT: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageClass {
    Standard,
    /// Acknowledged once a quorum of zone buckets holds the records, then carried into the
    /// Standard store and the index like any other.
    Express,
}

impl StorageClass {
    pub fn code(self) -> u8 {
        match self {
            StorageClass::Standard => 1,
            StorageClass::Express => 2,
        }
    }

    pub fn from_code(code: u8) -> Result<Self, CatalogError> {
        match code {
            1 => Ok(StorageClass::Standard),
            2 => Ok(StorageClass::Express),
            other => Err(CatalogError::Corrupt(format!(
                "unknown storage class {other}"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMeta {
    pub id: u64,
    pub name: String,
    pub created_at_ms: u64,
    pub class: StorageClass,
    pub retention: Retention,
}

/// How long a stream keeps its records: the auditor trims whole objects from the front once
/// they are older than `age_ms`, or once the stream holds more than `bytes` without them. No
/// limit where `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub age_ms: Option<u64>,
    pub bytes: Option<u64>,
}

impl Retention {
    pub fn is_unlimited(&self) -> bool {
        self.age_ms.is_none() && self.bytes.is_none()
    }

    const AGE: u8 = 1;
    const BYTES: u8 = 2;

    /// A flags byte, then each limit that is set, as a little-endian u64.
    pub fn encode(&self, buf: &mut impl BufMut) {
        let flags = self.age_ms.map_or(0, |_| Self::AGE) | self.bytes.map_or(0, |_| Self::BYTES);
        buf.put_u8(flags);
        if let Some(age) = self.age_ms {
            buf.put_u64_le(age);
        }
        if let Some(bytes) = self.bytes {
            buf.put_u64_le(bytes);
        }
    }

    /// Reads what `encode` wrote; `None` when `buf` is too short or names an unknown limit.
    pub fn decode(buf: &mut &[u8]) -> Option<Self> {
        let (&flags, rest) = buf.split_first()?;
        *buf = rest;
        if flags & !(Self::AGE | Self::BYTES) != 0 {
            return None;
        }
        let mut take = |set: bool| -> Option<Option<u64>> {
            if !set {
                return Some(None);
            }
            if buf.len() < 8 {
                return None;
            }
            Some(Some(buf.get_u64_le()))
        };
        let age_ms = take(flags & Self::AGE != 0)?;
        let bytes = take(flags & Self::BYTES != 0)?;
        Some(Self { age_ms, bytes })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamTail {
    /// One past the last absorbed record.
    pub tail_seq: u64,
    /// Encoded bytes of the absorbed records.
    pub stored_bytes: u64,
}

/// A run of one stream's records in one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub stream_id: u64,
    pub start_seq: u64,
    /// Exclusive.
    pub end_seq: u64,
    pub object_key: String,
    pub offset: u64,
    pub len: u64,
    pub crc32c: u32,
    /// When the object's newest records were written (its footer's `created_at_ms`): what
    /// retention by age goes by. 0 when unknown (entries written before it was recorded).
    pub created_at_ms: u64,
}

impl IndexEntry {
    /// The entry for a section of the object at `object_key`, created at `created_at_ms`.
    pub fn for_section(
        object_key: &str,
        section: &crate::flight::SectionEntry,
        created_at_ms: u64,
    ) -> Self {
        Self {
            stream_id: section.stream_id,
            start_seq: section.start_seq,
            end_seq: section.end_seq,
            object_key: object_key.to_owned(),
            offset: section.offset,
            len: section.len,
            crc32c: section.crc32c,
            created_at_ms,
        }
    }
}

/// A star's chain: the epoch it writes now, and how far the absorb has recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainState {
    pub epoch: u64,
    /// The last slot of `epoch` whose entries are in the index; `None` before the first.
    pub checkpoint: Option<u64>,
}

/// The chain state with the version it was read at, for compare-and-set updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionedChain {
    pub state: ChainState,
    pub version: u64,
}

/// One absorb transaction: index entries and tails from consecutive slots, and the checkpoint
/// they move the chain to.
#[derive(Debug, Clone, Default)]
pub struct AbsorbBatch {
    pub entries: Vec<IndexEntry>,
    pub tails: Vec<(u64, StreamTail)>,
    /// Deleted streams whose tail keys are removed (a no-op when already gone).
    pub forget: Vec<u64>,
    /// May the tails, too, be written ahead of the chain move when the whole does not fit one
    /// transaction? For recovery and takeover settling a chain, one flight at a time. Every
    /// spilled write compares the chain's version, so nothing lands once another writer moved
    /// the chain.
    pub spill_tails: bool,
    /// How far this absorb carries the star's express chain, written in the same transaction
    /// as the entries holding the carried records (so the two never disagree).
    pub express: Option<ExpressCheckpoint>,
    /// In a fleet, the leadership each stream's records were sequenced under (a compare on its
    /// leader record, by stream id): every one must still hold, or nothing is written and the
    /// absorb fails with `CatalogError::Deposed` naming the streams whose leadership moved.
    pub guards: Vec<(u64, Compare)>,
}

/// How far a star's express chain has been carried into its Standard chain (and so into the
/// index): every bundle of an express epoch below `epoch`, and of `epoch` every slot up to
/// `through` (`None`: none yet). A successor walks the express chain from just past it, and
/// zone copies at or below it may be collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpressCheckpoint {
    pub epoch: u64,
    pub through: Option<u64>,
}

impl ExpressCheckpoint {
    /// The catalog's encoding, also the body of the checkpoint's copy in the bucket.
    pub fn encode(&self) -> Vec<u8> {
        encode_express(self)
    }

    pub fn decode(value: &[u8]) -> Result<Self, CatalogError> {
        decode_express(value)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("stream {0:?} already exists")]
    AlreadyExists(String),
    #[error("stream {0:?} not found")]
    NotFound(String),
    /// Somebody else changed what this call expected to own (the chain moved on).
    #[error("catalog conflict: {0}")]
    Conflict(String),
    /// These leaderships (stream id, the compare its records were sequenced under) no longer
    /// hold: the leadership moved to another star while the absorbing star held records of
    /// them, which must not reach the index.
    #[error("the leadership of streams {:?} moved to another star", .0.iter().map(|(id, _)| id).collect::<Vec<_>>())]
    Deposed(Vec<(u64, Compare)>),
    #[error("catalog value is corrupt: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
}

#[derive(Debug, Clone)]
pub struct Catalog {
    store: Arc<dyn Metastore>,
}

/// A stream id from `Catalog::reserve_stream_id`, with the revision that reserved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservedId {
    pub id: u64,
    pub revision: u64,
}

/// What a catalog holds, for a rebuild deciding whether it may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occupancy {
    Empty,
    /// A rebuild was interrupted; running it again completes it.
    Restoring,
    Holds,
}

/// A catalog's streams and chain read back from the object store, for
/// `Catalog::restore_streams`.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    pub streams: Vec<(StreamMeta, StreamTail)>,
    pub next_stream_id: u64,
    /// The star and the chain state it resumes from.
    pub chain: Option<(String, ChainState)>,
    /// Streams whose first record in the bucket is past 0 (retention trimmed them).
    pub trims: Vec<(u64, Trim)>,
    /// The star's express checkpoint, from its copy in the bucket.
    pub express: Option<(String, ExpressCheckpoint)>,
}

impl Catalog {
    pub fn new(store: Arc<dyn Metastore>) -> Self {
        Self { store }
    }

    pub fn store(&self) -> &Arc<dyn Metastore> {
        &self.store
    }

    /// The same catalog on the metastore's priority lane, for the work appends wait on (the
    /// absorb): clients' reads never queue ahead of it.
    pub fn prioritised(&self) -> Catalog {
        Catalog::new(self.store.priority().unwrap_or_else(|| self.store.clone()))
    }

    /// Hands out a stream id for a create of stream `name`, never used before and never used
    /// again: index entries and manifests left behind by a deleted stream can never be
    /// mistaken for a new stream's. It also takes over the name's create reservation, which
    /// fences any earlier create of the name still queued (see `insert_stream`).
    pub async fn reserve_stream_id(&self, name: &str) -> Result<ReservedId, CatalogError> {
        loop {
            let counter = self.store.get(NEXT_ID_KEY).await?;
            let (id, compare) = match &counter {
                Some(kv) => {
                    let mut r = Reader::start(&kv.value)?;
                    (r.u64()?, Compare::Version(NEXT_ID_KEY.to_vec(), kv.version))
                }
                None => (1, Compare::Missing(NEXT_ID_KEY.to_vec())),
            };
            // A catalog that hands out ids here writes manifests for its streams from the
            // first one on; only catalogs from before manifests need them written afterwards.
            let txn = Txn::new()
                .compare(compare)
                .put(NEXT_ID_KEY.to_vec(), encode_next_id(id + 1))
                .put(MANIFESTS_KEY.to_vec(), vec![FORMAT])
                .put(creating_key(name), encode_next_id(id));
            if let TxnOutcome::Committed { revision } = self.store.commit(txn).await? {
                return Ok(ReservedId { id, revision });
            }
            // Another reservation took this id; take the next one.
        }
    }

    /// Creates a stream with a fresh id in the metastore alone. A star creates streams with
    /// `reserve_stream_id` and `insert_stream`, writing the stream's manifest in between.
    pub async fn create_stream(
        &self,
        name: &str,
        class: StorageClass,
        created_at_ms: u64,
    ) -> Result<StreamMeta, CatalogError> {
        loop {
            let reserved = self.reserve_stream_id(name).await?;
            let meta = StreamMeta {
                id: reserved.id,
                name: name.to_owned(),
                created_at_ms,
                class,
                retention: Retention::default(),
            };
            match self.insert_stream(&meta, reserved).await {
                Ok(()) => return Ok(meta),
                // Another create of the name reserved meanwhile: reserve again.
                Err(CatalogError::Conflict(_)) => continue,
                Err(err) => return Err(err),
            }
        }
    }

    /// Sets the retention of stream `name`, returning the stream as it is now.
    pub async fn set_retention(
        &self,
        name: &str,
        retention: Retention,
    ) -> Result<StreamMeta, CatalogError> {
        self.update_stream(name, |meta| meta.retention = retention)
            .await
    }

    /// Sets the storage class of stream `name`, returning the stream as it is now. The caller
    /// makes sure no append of the stream is in flight (`Star::set_storage_class`).
    pub async fn set_class(
        &self,
        name: &str,
        class: StorageClass,
    ) -> Result<StreamMeta, CatalogError> {
        self.update_stream(name, |meta| meta.class = class).await
    }

    /// Changes stream `name`'s settings with `change`, by compare-and-set on its record.
    async fn update_stream(
        &self,
        name: &str,
        change: impl Fn(&mut StreamMeta),
    ) -> Result<StreamMeta, CatalogError> {
        loop {
            let kv = self
                .store
                .get(&name_key(name))
                .await?
                .ok_or_else(|| CatalogError::NotFound(name.to_owned()))?;
            let mut meta = decode_meta(name, &kv.value)?;
            change(&mut meta);
            let txn = Txn::new()
                .compare(Compare::Version(name_key(name), kv.version))
                .put(name_key(name), encode_meta(&meta));
            if let TxnOutcome::Committed { .. } = self.store.commit(txn).await? {
                return Ok(meta);
            }
            // Changed meanwhile (deleted, or reconfigured): read it again.
        }
    }

    /// Creates a stream under an id from `reserve_stream_id`, only while the name's create
    /// reservation is still that one: an insert whose answer was lost may still be queued at
    /// etcd, and could otherwise apply much later, after a retried create and a delete of the
    /// name, bringing back a stream nobody created. Another reservation of the name, or
    /// `settle_create`, fences it for good; creates of other names never do. `AlreadyExists`
    /// when the name is taken; `Conflict` when another create of it reserved meanwhile.
    pub async fn insert_stream(
        &self,
        meta: &StreamMeta,
        reserved: ReservedId,
    ) -> Result<(), CatalogError> {
        let txn = Txn::new()
            .compare(Compare::Missing(name_key(&meta.name)))
            .compare(Compare::Version(
                creating_key(&meta.name),
                reserved.revision,
            ))
            .put(name_key(&meta.name), encode_meta(meta))
            .put(tail_key(meta.id), encode_tail(&StreamTail::default()))
            .delete(creating_key(&meta.name));
        match self.store.commit(txn).await? {
            TxnOutcome::Committed { .. } => Ok(()),
            TxnOutcome::Conflict if self.stream_exists(&meta.name).await? => {
                Err(CatalogError::AlreadyExists(meta.name.clone()))
            }
            TxnOutcome::Conflict => Err(CatalogError::Conflict(format!(
                "another create of stream {:?} reserved it meanwhile",
                meta.name
            ))),
        }
    }

    /// Settles a create of stream `name` whose insert answered with an error: drops the name's
    /// create reservation, so no insert of it still queued can ever apply, and returns the
    /// stream the catalog holds under the name now, which is then final for that create.
    pub async fn settle_create(&self, name: &str) -> Result<Option<StreamMeta>, CatalogError> {
        self.store
            .commit(Txn::new().delete(creating_key(name)))
            .await?;
        self.stream(name).await
    }

    /// Whether the catalog holds anything: a rebuild only writes into an empty one (or one a
    /// rebuild was interrupted in).
    pub async fn occupancy(&self) -> Result<Occupancy, CatalogError> {
        if self.store.get(RESTORING_KEY).await?.is_some() {
            return Ok(Occupancy::Restoring);
        }
        for prefix in [&b"n/"[..], b"c/", b"m/"] {
            if !self.store.scan(prefix, None, 1).await?.is_empty() {
                return Ok(Occupancy::Holds);
            }
        }
        Ok(Occupancy::Empty)
    }

    /// Removes a stream's name and tail, and records a pending tombstone (`d/`) until its
    /// manifest is marked deleted. Its index entries stay until the auditor drops them (`x/`
    /// says it should); nothing can reach them once the name is gone.
    pub async fn delete_stream(&self, name: &str) -> Result<StreamMeta, CatalogError> {
        let kv = self
            .store
            .get(&name_key(name))
            .await?
            .ok_or_else(|| CatalogError::NotFound(name.to_owned()))?;
        let meta = decode_meta(name, &kv.value)?;
        let mut tombstone = vec![FORMAT];
        tombstone.put_u32_le(name.len() as u32);
        tombstone.put_slice(name.as_bytes());
        tombstone.extend_from_slice(&encode_meta(&meta)[1..]);
        let txn = Txn::new()
            .compare(Compare::Version(name_key(name), kv.version))
            .delete(name_key(name))
            .delete(tail_key(meta.id))
            .delete(creating_key(name))
            .put(tombstone_key(meta.id), tombstone)
            .put(audit::dropping_key(meta.id), audit::encode_dropping(name));
        match self.store.commit(txn).await? {
            TxnOutcome::Committed { .. } => Ok(meta),
            TxnOutcome::Conflict => Err(CatalogError::Conflict(format!(
                "stream {name:?} changed while being deleted"
            ))),
        }
    }

    pub async fn stream_exists(&self, name: &str) -> Result<bool, CatalogError> {
        Ok(self.store.get(&name_key(name)).await?.is_some())
    }

    /// The absorbed tail of stream `id` (zero for a stream without one).
    pub async fn stream_tail(&self, id: u64) -> Result<StreamTail, CatalogError> {
        match self.store.get(&tail_key(id)).await? {
            Some(kv) => decode_tail(&kv.value),
            None => Ok(StreamTail::default()),
        }
    }

    /// The absorbed tails of streams `ids`, in order, in as few metastore calls as it takes (a
    /// listing's page in one transaction of reads on etcd).
    pub async fn stream_tails(&self, ids: &[u64]) -> Result<Vec<StreamTail>, CatalogError> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|&id| tail_key(id)).collect();
        self.store
            .get_many(&keys)
            .await?
            .into_iter()
            .map(|kv| match kv {
                Some(kv) => decode_tail(&kv.value),
                None => Ok(StreamTail::default()),
            })
            .collect()
    }

    /// The stream's settings, if the catalog has it.
    pub async fn stream(&self, name: &str) -> Result<Option<StreamMeta>, CatalogError> {
        match self.store.get(&name_key(name)).await? {
            Some(kv) => Ok(Some(decode_meta(name, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// Every stream with its absorbed tail.
    pub async fn load_streams(&self) -> Result<Vec<(StreamMeta, StreamTail)>, CatalogError> {
        let mut metas = Vec::new();
        for kv in self.scan_all(b"n/").await? {
            let name = std::str::from_utf8(&kv.key[2..])
                .map_err(|_| CatalogError::Corrupt("stream name is not UTF-8".into()))?;
            metas.push(decode_meta(name, &kv.value)?);
        }
        let mut out = Vec::with_capacity(metas.len());
        for meta in metas {
            let tail = match self.store.get(&tail_key(meta.id)).await? {
                Some(kv) => decode_tail(&kv.value)?,
                None => StreamTail::default(),
            };
            out.push((meta, tail));
        }
        Ok(out)
    }

    async fn scan_all(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, CatalogError> {
        let mut out: Vec<KeyValue> = Vec::new();
        loop {
            let after = out.last().map(|kv| kv.key.clone());
            let page = self.store.scan(prefix, after.as_deref(), MAX_SCAN).await?;
            let done = page.len() < MAX_SCAN;
            out.extend(page);
            if done {
                return Ok(out);
            }
        }
    }

    /// Index entries of a stream covering `from_seq` onwards, in order, at most `limit`.
    pub async fn index_entries(
        &self,
        stream_id: u64,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<IndexEntry>, CatalogError> {
        let after = index_key(stream_id, from_seq);
        self.store
            .scan(&index_prefix(stream_id), Some(&after), limit)
            .await?
            .iter()
            .map(|kv| decode_entry(&kv.key, &kv.value))
            .collect()
    }

    /// The first `limit` stars with a chain in the catalog, in key order: every star that ever
    /// wrote one, including those that left (a chain record is never removed, so a star that
    /// returns continues its epochs).
    pub async fn chain_stars(&self, limit: usize) -> Result<Vec<String>, CatalogError> {
        let page = self.store.scan(b"c/", None, limit).await?;
        Ok(page
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key[2..]).into_owned())
            .collect())
    }

    /// How far `star`'s express chain has been carried into the index; `None` before any.
    pub async fn express_checkpoint(
        &self,
        star: &str,
    ) -> Result<Option<ExpressCheckpoint>, CatalogError> {
        match self.store.get(&express_key(star)).await? {
            Some(kv) => Ok(Some(decode_express(&kv.value)?)),
            None => Ok(None),
        }
    }
}
