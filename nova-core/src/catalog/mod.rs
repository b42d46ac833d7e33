//! The catalog: streams, the index of where each stream's records live, and chain checkpoints,
//! encoded as keys and values in the metastore.
//!
//! ```text
//! n/{name}                        stream by name: id, created time, class
//! t/{id:be64}                     stream tail: absorbed tail seq, stored bytes
//! i/{id:be64}{end_seq:be64}       index entry: a run of the stream's records in an object
//! c/{star}                        chain state: current epoch and the last absorbed slot
//! m/next_stream_id                the next stream id to hand out
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
//! ```
//!
//! Index entries are keyed by their *exclusive end*, so the entry holding sequence number `s` is
//! the first key after `(id, s)` in a forward scan. Every value starts with a format byte (kept
//! stable) so fields can be added later.

use std::sync::Arc;

use bytes::{Buf, BufMut};

use crate::metastore::{Compare, KeyValue, MAX_SCAN, Metastore, MetastoreError, Txn, TxnOutcome};

mod audit;
#[cfg(test)]
mod codec_tests;
mod retention;
pub use audit::{Dropping, Garbage, Liveness, QueuedGarbage, SettleCursor, VersionedCursor};
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

fn name_key(name: &str) -> Vec<u8> {
    let mut key = b"n/".to_vec();
    key.extend_from_slice(name.as_bytes());
    key
}

fn tail_key(id: u64) -> Vec<u8> {
    let mut key = b"t/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

fn index_prefix(id: u64) -> Vec<u8> {
    let mut key = b"i/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

fn index_key(id: u64, end_seq: u64) -> Vec<u8> {
    let mut key = index_prefix(id);
    key.extend_from_slice(&end_seq.to_be_bytes());
    key
}

/// `e/{star}`. Every catalog prefix is one letter and a slash; `x/` (deleted streams being
/// dropped) scans every key under it, so a new kind of record needs a letter of its own.
fn express_key(star: &str) -> Vec<u8> {
    let mut key = b"e/".to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

fn encode_express(checkpoint: &ExpressCheckpoint) -> Vec<u8> {
    encode_epoch_slot(checkpoint.epoch, checkpoint.through)
}

fn decode_express(value: &[u8]) -> Result<ExpressCheckpoint, CatalogError> {
    let (epoch, through) = decode_epoch_slot(value, "express checkpoint")?;
    Ok(ExpressCheckpoint { epoch, through })
}

/// An epoch and, optionally, a slot of it: a chain's checkpoint, an express checkpoint.
pub(super) fn encode_epoch_slot(epoch: u64, slot: Option<u64>) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(epoch);
    match slot {
        Some(slot) => {
            buf.put_u8(1);
            buf.put_u64_le(slot);
        }
        None => buf.put_u8(0),
    }
    buf
}

pub(super) fn decode_epoch_slot(
    value: &[u8],
    what: &str,
) -> Result<(u64, Option<u64>), CatalogError> {
    let mut r = Reader::start(value)?;
    let epoch = r.u64()?;
    let slot = match r.u8()? {
        0 => None,
        1 => Some(r.u64()?),
        other => return Err(CatalogError::Corrupt(format!("bad {what} tag {other}"))),
    };
    Ok((epoch, slot))
}

fn chain_key(star: &str) -> Vec<u8> {
    let mut key = b"c/".to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

/// `h/{star}`: written with the chain, in one transaction, when a starting star or a takeover
/// claims it (`claim_chain`). While it carries the chain's version, the last write to the chain
/// was that claim, not anybody's absorb.
fn claim_key(star: &str) -> Vec<u8> {
    let mut key = b"h/".to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

const NEXT_ID_KEY: &[u8] = b"m/next_stream_id";

/// The reservation of the create of stream `name` in progress: rewritten by every create of
/// the name, compared by its insert, removed once the create is settled.
fn creating_key(name: &str) -> Vec<u8> {
    let mut key = b"r/".to_vec();
    key.extend_from_slice(name.as_bytes());
    key
}
const MANIFESTS_KEY: &[u8] = b"m/manifests";
const RESTORING_KEY: &[u8] = b"m/restoring";

fn tombstone_key(id: u64) -> Vec<u8> {
    let mut key = b"d/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// What a catalog holds, for a rebuild deciding whether it may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occupancy {
    Empty,
    /// A rebuild was interrupted; running it again completes it.
    Restoring,
    Holds,
}

/// Keys written per transaction by a restore, well under what any metastore accepts.
const MAX_RESTORE_TXN: usize = 100;

fn encode_next_id(id: u64) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(id);
    buf
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

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn start(buf: &[u8]) -> Result<Reader<'_>, CatalogError> {
        match buf.first() {
            Some(&FORMAT) => Ok(Reader(&buf[1..])),
            Some(other) => Err(CatalogError::Corrupt(format!(
                "unknown value format {other}"
            ))),
            None => Err(CatalogError::Corrupt("empty value".into())),
        }
    }
    fn need(&self, n: usize) -> Result<(), CatalogError> {
        if self.0.len() < n {
            Err(CatalogError::Corrupt("value truncated".into()))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, CatalogError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn u32(&mut self) -> Result<u32, CatalogError> {
        self.need(4)?;
        Ok(self.0.get_u32_le())
    }
    fn u64(&mut self) -> Result<u64, CatalogError> {
        self.need(8)?;
        Ok(self.0.get_u64_le())
    }
    /// A field added after the format byte's value was fixed: absent in older values.
    fn optional_u64(&mut self) -> Result<Option<u64>, CatalogError> {
        if self.0.is_empty() {
            Ok(None)
        } else {
            self.u64().map(Some)
        }
    }
    fn string(&mut self) -> Result<String, CatalogError> {
        let len = self.u32()? as usize;
        self.need(len)?;
        let s = std::str::from_utf8(&self.0[..len])
            .map_err(|_| CatalogError::Corrupt("string is not UTF-8".into()))?
            .to_owned();
        self.0.advance(len);
        Ok(s)
    }
}

fn encode_meta(meta: &StreamMeta) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(meta.id);
    buf.put_u64_le(meta.created_at_ms);
    buf.put_u8(meta.class.code());
    meta.retention.encode(&mut buf);
    buf
}

fn decode_meta(name: &str, value: &[u8]) -> Result<StreamMeta, CatalogError> {
    let mut r = Reader::start(value)?;
    let id = r.u64()?;
    let created_at_ms = r.u64()?;
    let class = StorageClass::from_code(r.u8()?)?;
    // Absent from streams created before retention existed.
    let retention = if r.0.is_empty() {
        Retention::default()
    } else {
        Retention::decode(&mut r.0)
            .ok_or_else(|| CatalogError::Corrupt("stream retention is malformed".into()))?
    };
    Ok(StreamMeta {
        id,
        name: name.to_owned(),
        created_at_ms,
        class,
        retention,
    })
}

fn encode_tail(tail: &StreamTail) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(tail.tail_seq);
    buf.put_u64_le(tail.stored_bytes);
    buf
}

fn decode_tail(value: &[u8]) -> Result<StreamTail, CatalogError> {
    let mut r = Reader::start(value)?;
    Ok(StreamTail {
        tail_seq: r.u64()?,
        stored_bytes: r.u64()?,
    })
}

fn encode_entry(entry: &IndexEntry) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(entry.start_seq);
    buf.put_u32_le(entry.object_key.len() as u32);
    buf.put_slice(entry.object_key.as_bytes());
    buf.put_u64_le(entry.offset);
    buf.put_u64_le(entry.len);
    buf.put_u32_le(entry.crc32c);
    buf.put_u64_le(entry.created_at_ms);
    buf
}

fn decode_entry(key: &[u8], value: &[u8]) -> Result<IndexEntry, CatalogError> {
    if key.len() != 2 + 16 {
        return Err(CatalogError::Corrupt(
            "index key has the wrong length".into(),
        ));
    }
    let mut k = &key[2..];
    let stream_id = k.get_u64();
    let end_seq = k.get_u64();
    let mut r = Reader::start(value)?;
    Ok(IndexEntry {
        stream_id,
        start_seq: r.u64()?,
        end_seq,
        object_key: r.string()?,
        offset: r.u64()?,
        len: r.u64()?,
        crc32c: r.u32()?,
        // Absent from entries written before it was recorded.
        created_at_ms: r.optional_u64()?.unwrap_or(0),
    })
}

fn encode_chain(state: &ChainState) -> Vec<u8> {
    encode_epoch_slot(state.epoch, state.checkpoint)
}

/// Runs every catalog decoder over one record. Catalog records are bytes from outside the
/// process (a metastore someone else can write), so the fuzz targets feed this arbitrary input:
/// each decoder must answer with an error, never panic.
#[doc(hidden)]
pub fn decode_every_kind(key: &[u8], value: &[u8]) -> usize {
    [
        decode_meta("fuzz", value).is_ok(),
        decode_tail(value).is_ok(),
        decode_entry(key, value).is_ok(),
        decode_chain(value).is_ok(),
        decode_express(value).is_ok(),
        audit::decode_cursor(value).is_ok(),
        audit::decode_garbage(key, value).is_ok(),
        retention::decode_trim(value).is_ok(),
    ]
    .into_iter()
    .filter(|ok| *ok)
    .count()
}

fn decode_chain(value: &[u8]) -> Result<ChainState, CatalogError> {
    let (epoch, checkpoint) = decode_epoch_slot(value, "checkpoint")?;
    Ok(ChainState { epoch, checkpoint })
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

    pub async fn chain(&self, star: &str) -> Result<Option<VersionedChain>, CatalogError> {
        match self.store.get(&chain_key(star)).await? {
            Some(kv) => Ok(Some(VersionedChain {
                state: decode_chain(&kv.value)?,
                version: kv.version,
            })),
            None => Ok(None),
        }
    }

    /// The chain, if it is at exactly `state` now and was last written by an absorb. A commit
    /// whose answer was lost (an error after the metastore applied it) makes its retry meet a
    /// version conflict; this tells that apart from another writer having moved the chain.
    /// Only this star's incarnation absorbs into its epoch (recovery moves every restart to a
    /// fresh one), so finding `state` means the earlier attempt landed, unless a claim
    /// (`claim_chain`) wrote the same state since: then the chain is another process's.
    pub async fn chain_if_at(
        &self,
        star: &str,
        state: ChainState,
    ) -> Result<Option<VersionedChain>, CatalogError> {
        let Some(chain) = self.chain(star).await?.filter(|chain| chain.state == state) else {
            return Ok(None);
        };
        let claim = self.store.get(&claim_key(star)).await?;
        Ok(claim
            .is_none_or(|kv| kv.version != chain.version)
            .then_some(chain))
    }

    /// Writes the chain again as it is, at `version`, with its claim: every commit compared
    /// against an earlier version fails from here on, and none can take this write for its own
    /// (`chain_if_at`). `None` if the chain moved since it was read at `version`.
    pub async fn claim_chain(
        &self,
        star: &str,
        chain: VersionedChain,
    ) -> Result<Option<VersionedChain>, CatalogError> {
        let key = chain_key(star);
        let txn = Txn::new()
            .compare(Compare::Version(key.clone(), chain.version))
            .put(key, encode_chain(&chain.state))
            .put(claim_key(star), vec![FORMAT]);
        Ok(match self.store.commit(txn).await? {
            TxnOutcome::Committed { revision } => Some(VersionedChain {
                state: chain.state,
                version: revision,
            }),
            TxnOutcome::Conflict => None,
        })
    }

    /// Moves the chain to `state` if it is still at `expected` (`None`: it must not exist yet).
    pub async fn set_chain(
        &self,
        star: &str,
        expected: Option<u64>,
        state: ChainState,
    ) -> Result<VersionedChain, CatalogError> {
        self.absorb(star, expected, state, AbsorbBatch::default())
            .await
    }

    /// Records index entries and tails and moves the chain's checkpoint, atomically, if the
    /// chain is still at the version the caller last saw.
    pub async fn absorb(
        &self,
        star: &str,
        expected: Option<u64>,
        state: ChainState,
        batch: AbsorbBatch,
    ) -> Result<VersionedChain, CatalogError> {
        let key = chain_key(star);
        let compare = match expected {
            Some(version) => Compare::Version(key.clone(), version),
            None => Compare::Missing(key.clone()),
        };
        let batch = self.spill(batch, &compare, star).await?;
        let mut txn = Txn::new()
            .compare(compare.clone())
            .put(key, encode_chain(&state));
        for (_, guard) in &batch.guards {
            txn = txn.compare(guard.clone());
        }
        if let Some(express) = &batch.express {
            txn = txn.put(express_key(star), encode_express(express));
        }
        for entry in &batch.entries {
            txn = txn.put(
                index_key(entry.stream_id, entry.end_seq),
                encode_entry(entry),
            );
        }
        for (id, tail) in &batch.tails {
            txn = txn.put(tail_key(*id), encode_tail(tail));
        }
        for id in &batch.forget {
            txn = txn.delete(tail_key(*id));
        }
        match self.store.commit(txn).await? {
            TxnOutcome::Committed { revision } => Ok(VersionedChain {
                state,
                version: revision,
            }),
            TxnOutcome::Conflict => Err(self.why_conflict(star, &compare, &batch.guards).await),
        }
    }

    /// What made an absorb's compares fail: the chain moved (another process owns it), or the
    /// leadership of some of its streams did. Asked only after a conflict, so an absorb costs
    /// no reads while nothing is wrong.
    async fn why_conflict(
        &self,
        star: &str,
        chain: &Compare,
        guards: &[(u64, Compare)],
    ) -> CatalogError {
        if guards.is_empty() {
            return chain_moved(star);
        }
        match self.holds(chain).await {
            Ok(true) => {}
            Ok(false) => return chain_moved(star),
            Err(err) => return CatalogError::Metastore(err),
        }
        let mut deposed = Vec::new();
        for (stream, guard) in guards {
            match self.holds(guard).await {
                Ok(true) => {}
                Ok(false) => deposed.push((*stream, guard.clone())),
                Err(err) => return CatalogError::Metastore(err),
            }
        }
        if deposed.is_empty() {
            // Every compare holds now: something moved and moved back. Retried, it tells.
            return CatalogError::Metastore(MetastoreError::Unavailable(
                "an absorb conflicted and nothing it compares has changed; retrying".into(),
            ));
        }
        CatalogError::Deposed(deposed)
    }

    async fn holds(&self, compare: &Compare) -> Result<bool, MetastoreError> {
        Ok(match compare {
            Compare::Missing(key) => self.store.get(key).await?.is_none(),
            Compare::Version(key, version) => self
                .store
                .get(key)
                .await?
                .is_some_and(|kv| kv.version == *version),
        })
    }
}

/// What a writer meets when another process moved the chain it was writing.
fn chain_moved(star: &str) -> CatalogError {
    CatalogError::Conflict(format!("chain of {star} moved: another process owns it"))
}

impl Catalog {
    /// Writes ahead, in transactions of their own, what of an absorb would not fit the
    /// metastore's transaction limit beside the chain move, and returns the rest: the removal
    /// of deleted streams' tails, index entries (keyed by their own position, so settling the
    /// flight again writes the same keys) and, when `spill_tails` allows, tails. Live absorbs
    /// are sized to fit (the packer caps a flight's sections, the absorber groups by
    /// operations), so this serves flights written before that cap, met again by recovery.
    async fn spill(
        &self,
        mut batch: AbsorbBatch,
        chain: &Compare,
        star: &str,
    ) -> Result<AbsorbBatch, CatalogError> {
        // Each spilled write holds only while the chain is still where the caller saw it (and
        // the streams' leadership where it was), so a writer that lost either meanwhile writes
        // nothing.
        let guards = batch.guards.clone();
        let guarded = |txn: Txn| {
            guards
                .iter()
                .fold(txn.compare(chain.clone()), |txn, (_, guard)| {
                    txn.compare(guard.clone())
                })
        };
        let limit = self.store.capabilities().max_txn_ops;
        // What never spills: the chain move, and the express checkpoint beside it.
        let moves = 1 + usize::from(batch.express.is_some());
        if moves + batch.tails.len() > limit {
            if !batch.spill_tails {
                return Err(CatalogError::Metastore(MetastoreError::TooLarge {
                    ops: moves + batch.tails.len(),
                    limit,
                }));
            }
            // Tails ahead first, then the entries below: each tail is the flight's own value.
            while moves + batch.tails.len() > limit {
                let n = (batch.tails.len() + moves - limit).min(limit);
                let txn = batch.tails.drain(..n).fold(Txn::new(), |txn, (id, tail)| {
                    txn.put(tail_key(id), encode_tail(&tail))
                });
                if self.store.commit(guarded(txn)).await? == TxnOutcome::Conflict {
                    return Err(self.why_conflict(star, chain, &guards).await);
                }
            }
        }
        let fixed = moves + batch.tails.len();
        while fixed + batch.entries.len() + batch.forget.len() > limit {
            let txn = if !batch.forget.is_empty() {
                let n = batch.forget.len().min(limit);
                batch
                    .forget
                    .drain(..n)
                    .fold(Txn::new(), |txn, id| txn.delete(tail_key(id)))
            } else {
                let over = fixed + batch.entries.len() - limit;
                let n = over.min(limit);
                batch.entries.drain(..n).fold(Txn::new(), |txn, entry| {
                    txn.put(
                        index_key(entry.stream_id, entry.end_seq),
                        encode_entry(&entry),
                    )
                })
            };
            if self.store.commit(guarded(txn)).await? == TxnOutcome::Conflict {
                return Err(self.why_conflict(star, chain, &guards).await);
            }
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::EmbeddedMetastore;

    /// The key table at the top of this file names every prefix the catalog writes: a record
    /// kind it leaves out is one a reader of the metastore (or a new prefix's author, who must
    /// pick an unused letter) cannot learn about.
    #[test]
    fn the_key_table_names_every_prefix() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/catalog");
        let table: String = include_str!("mod.rs")
            .lines()
            .take_while(|line| line.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut prefixes = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for (at, _) in source.match_indices("b\"") {
                let literal = &source[at + 2..];
                let bytes = literal.as_bytes();
                if bytes.len() > 2 && bytes[0].is_ascii_lowercase() && bytes[1] == b'/' {
                    prefixes.insert(literal[..2].to_owned());
                }
            }
        }
        assert!(prefixes.len() >= 10, "{prefixes:?}");
        for prefix in prefixes {
            assert!(
                table.contains(&format!("//! {prefix}")),
                "catalog prefix {prefix} is missing from the key table"
            );
        }
    }

    pub(super) fn catalog() -> (tempfile::TempDir, Catalog) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedMetastore::open(dir.path().join("m.redb")).unwrap();
        (dir, Catalog::new(Arc::new(store)))
    }

    /// A Standard stream `name` under a reserved id, as a create would insert it.
    fn standard(name: &str, reserved: ReservedId) -> StreamMeta {
        StreamMeta {
            id: reserved.id,
            name: name.into(),
            created_at_ms: 1,
            class: StorageClass::Standard,
            retention: Retention::default(),
        }
    }

    /// A claim moves the chain's version without changing its state: a commit compared against
    /// the version before fails, and a writer looking for its own lost commit does not take the
    /// claim for it; an absorb after the claim is found again.
    #[tokio::test]
    async fn a_claim_fails_earlier_commits_and_is_nobodys_own() {
        let (_dir, catalog) = catalog();
        let state = ChainState {
            epoch: 3,
            checkpoint: Some(7),
        };
        let first = catalog.set_chain("s", None, state).await.unwrap();
        assert_eq!(catalog.chain_if_at("s", state).await.unwrap(), Some(first));
        let claimed = catalog.claim_chain("s", first).await.unwrap().unwrap();
        assert_eq!(claimed.state, state);
        assert!(claimed.version > first.version);
        assert_eq!(catalog.chain_if_at("s", state).await.unwrap(), None);
        let moved = ChainState {
            checkpoint: Some(8),
            ..state
        };
        let late = catalog.set_chain("s", Some(first.version), moved).await;
        assert!(matches!(late, Err(CatalogError::Conflict(_))), "{late:?}");
        assert_eq!(catalog.claim_chain("s", first).await.unwrap(), None);
        let next = catalog
            .set_chain("s", Some(claimed.version), moved)
            .await
            .unwrap();
        assert_eq!(catalog.chain_if_at("s", moved).await.unwrap(), Some(next));
    }

    /// Found by fleet seeds 31402 and 42568: a create whose insert was still queued at etcd
    /// when its caller gave up, retried (under a fresh id) and then deleted, applied after the
    /// delete and brought the name back as a stream nobody had created.
    #[tokio::test]
    async fn an_insert_applied_after_a_retried_create_and_a_delete_brings_nothing_back() {
        use crate::metastore::faulty::{CommitFault, FaultyMetastore};
        let (_dir, catalog) = catalog();
        let slow = FaultyMetastore::new(catalog.store().clone());
        let first = Catalog::new(Arc::new(slow.clone()));
        let reserved = first.reserve_stream_id("s").await.unwrap();
        let meta = standard("s", reserved);
        slow.inject(CommitFault::Hold, None);
        let queued = tokio::spawn(async move { first.insert_stream(&meta, reserved).await });
        slow.wait_held().await;
        // The caller gave up on it: created again, then deleted.
        let retried = catalog
            .create_stream("s", StorageClass::Standard, 2)
            .await
            .unwrap();
        assert_ne!(retried.id, reserved.id);
        catalog.delete_stream("s").await.unwrap();
        slow.clear();
        assert!(matches!(
            queued.await.unwrap(),
            Err(CatalogError::Conflict(_))
        ));
        assert!(catalog.stream("s").await.unwrap().is_none());
    }

    /// The fence is the name's: creates of other names between a reservation and its insert
    /// (through other stars) do not make it fail.
    #[tokio::test]
    async fn creates_of_other_names_do_not_fence_an_insert() {
        let (_dir, catalog) = catalog();
        let reserved = catalog.reserve_stream_id("s").await.unwrap();
        catalog
            .create_stream("other", StorageClass::Standard, 1)
            .await
            .unwrap();
        let meta = standard("s", reserved);
        catalog.insert_stream(&meta, reserved).await.unwrap();
        assert_eq!(catalog.stream("s").await.unwrap(), Some(meta));
        // Settled: no reservation is left behind.
        assert!(
            catalog
                .store()
                .get(&creating_key("s"))
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn streams_get_fresh_ids_and_names_are_unique() {
        let (_dir, catalog) = catalog();
        let a = catalog
            .create_stream("a", StorageClass::Standard, 1)
            .await
            .unwrap();
        let b = catalog
            .create_stream("b", StorageClass::Standard, 2)
            .await
            .unwrap();
        assert_ne!(a.id, b.id);
        assert!(matches!(
            catalog.create_stream("a", StorageClass::Standard, 3).await,
            Err(CatalogError::AlreadyExists(_))
        ));
        catalog.delete_stream("a").await.unwrap();
        let again = catalog
            .create_stream("a", StorageClass::Standard, 4)
            .await
            .unwrap();
        assert!(again.id > b.id, "ids are never reused");
        let loaded = catalog.load_streams().await.unwrap();
        let names: Vec<_> = loaded.iter().map(|(m, _)| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(matches!(
            catalog.delete_stream("nope").await,
            Err(CatalogError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn absorb_records_entries_and_fences_stale_writers() {
        let (_dir, catalog) = catalog();
        let s = catalog
            .create_stream("s", StorageClass::Standard, 1)
            .await
            .unwrap();
        let chain = catalog
            .set_chain(
                "star",
                None,
                ChainState {
                    epoch: 1,
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        let entry = |start, end| IndexEntry {
            stream_id: s.id,
            start_seq: start,
            end_seq: end,
            object_key: format!("obj-{start}"),
            offset: 16,
            len: 100,
            crc32c: 7,
            created_at_ms: 0,
        };
        let batch = AbsorbBatch {
            entries: vec![entry(0, 10), entry(10, 25)],
            tails: vec![(
                s.id,
                StreamTail {
                    tail_seq: 25,
                    stored_bytes: 200,
                },
            )],
            ..AbsorbBatch::default()
        };
        let next = ChainState {
            epoch: 1,
            checkpoint: Some(1),
        };
        let chain2 = catalog
            .absorb("star", Some(chain.version), next, batch)
            .await
            .unwrap();
        assert_eq!(catalog.chain("star").await.unwrap(), Some(chain2));
        // A writer still holding the old version is refused.
        assert!(matches!(
            catalog
                .absorb("star", Some(chain.version), next, AbsorbBatch::default())
                .await,
            Err(CatalogError::Conflict(_))
        ));
        assert_eq!(
            catalog.index_entries(s.id, 0, 10).await.unwrap(),
            [entry(0, 10), entry(10, 25)]
        );
        assert_eq!(
            catalog.index_entries(s.id, 9, 10).await.unwrap(),
            [entry(0, 10), entry(10, 25)]
        );
        assert_eq!(
            catalog.index_entries(s.id, 10, 10).await.unwrap(),
            [entry(10, 25)]
        );
        assert!(
            catalog
                .index_entries(s.id, 25, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let loaded = catalog.load_streams().await.unwrap();
        assert_eq!(
            loaded[0].1,
            StreamTail {
                tail_seq: 25,
                stored_bytes: 200
            }
        );
    }

    #[tokio::test]
    async fn the_express_checkpoint_moves_with_the_absorb_and_counts_toward_the_limit() {
        let (_dir, catalog) = catalog();
        let limit = catalog.store().capabilities().max_txn_ops as u64;
        let fresh = ChainState {
            epoch: 1,
            checkpoint: None,
        };
        let chain = catalog.set_chain("star", None, fresh).await.unwrap();
        assert_eq!(catalog.express_checkpoint("star").await.unwrap(), None);
        let carried = ExpressCheckpoint {
            epoch: 3,
            through: Some(9),
        };
        let next = ChainState {
            epoch: 1,
            checkpoint: Some(0),
        };
        let batch = AbsorbBatch {
            express: Some(carried),
            ..AbsorbBatch::default()
        };
        let moved = catalog
            .absorb("star", Some(chain.version), next, batch.clone())
            .await
            .unwrap();
        assert_eq!(
            catalog.express_checkpoint("star").await.unwrap(),
            Some(carried)
        );
        // A writer that lost the chain moves neither.
        let stale = ExpressCheckpoint {
            epoch: 3,
            through: Some(10),
        };
        let refused = catalog
            .absorb(
                "star",
                Some(chain.version),
                next,
                AbsorbBatch {
                    express: Some(stale),
                    ..AbsorbBatch::default()
                },
            )
            .await;
        assert!(matches!(refused, Err(CatalogError::Conflict(_))));
        assert_eq!(
            catalog.express_checkpoint("star").await.unwrap(),
            Some(carried)
        );
        // Tails filling the transaction beside the chain move alone no longer fit beside the
        // checkpoint too.
        let tails: Vec<(u64, StreamTail)> = (0..limit - 1)
            .map(|id| {
                (
                    id,
                    StreamTail {
                        tail_seq: 1,
                        stored_bytes: 0,
                    },
                )
            })
            .collect();
        let full = AbsorbBatch {
            tails,
            express: Some(stale),
            ..AbsorbBatch::default()
        };
        assert!(matches!(
            catalog
                .absorb("star", Some(moved.version), next, full)
                .await,
            Err(CatalogError::Metastore(MetastoreError::TooLarge { .. }))
        ));
        assert!(decode_express(&encode_express(&stale)).is_ok_and(|x| x == stale));
        // Under a prefix of its own: the drop duty's scan of deleted streams does not see it.
        assert!(catalog.dropping_streams(16).await.unwrap().is_empty());
        assert!(decode_express(&[FORMAT, 1, 2]).is_err());
    }

    /// An absorb larger than the metastore's transaction limit (a flight from before sections
    /// were capped) lands whole: its entries spill into transactions of their own ahead of the
    /// one moving the chain.
    #[tokio::test]
    async fn an_absorb_past_the_transaction_limit_spills_its_entries() {
        let (_dir, catalog) = catalog();
        let limit = catalog.store().capabilities().max_txn_ops as u64;
        let s = catalog
            .create_stream("s", StorageClass::Standard, 1)
            .await
            .unwrap();
        let fresh = ChainState {
            epoch: 1,
            checkpoint: None,
        };
        let chain = catalog.set_chain("star", None, fresh).await.unwrap();
        let count = 3 * limit + 7;
        let entries: Vec<IndexEntry> = (0..count)
            .map(|n| IndexEntry {
                stream_id: s.id,
                start_seq: n,
                end_seq: n + 1,
                object_key: "flight".into(),
                offset: n * 10,
                len: 10,
                crc32c: 0,
                created_at_ms: 0,
            })
            .collect();
        let batch = AbsorbBatch {
            entries: entries.clone(),
            tails: vec![(
                s.id,
                StreamTail {
                    tail_seq: count,
                    stored_bytes: count * 10,
                },
            )],
            forget: (1000..1000 + limit).collect(),
            spill_tails: false,
            express: None,
            guards: Vec::new(),
        };
        let next = ChainState {
            epoch: 1,
            checkpoint: Some(0),
        };
        catalog
            .absorb("star", Some(chain.version), next, batch)
            .await
            .unwrap();
        assert_eq!(catalog.chain("star").await.unwrap().unwrap().state, next);
        let read = catalog.index_entries(s.id, 0, 10_000).await.unwrap();
        assert_eq!(read, entries);
        assert_eq!(catalog.stream_tail(s.id).await.unwrap().tail_seq, count);

        // More streams than one transaction holds: only a chain's sole writer may spill tails.
        let many = |spill_tails| AbsorbBatch {
            tails: (0..2 * limit)
                .map(|id| {
                    (
                        10_000 + id,
                        StreamTail {
                            tail_seq: id,
                            stored_bytes: 0,
                        },
                    )
                })
                .collect(),
            spill_tails,
            ..AbsorbBatch::default()
        };
        let chain = catalog.chain("star").await.unwrap().unwrap();
        let later = ChainState {
            epoch: 1,
            checkpoint: Some(1),
        };
        assert!(matches!(
            catalog
                .absorb("star", Some(chain.version), later, many(false))
                .await,
            Err(CatalogError::Metastore(MetastoreError::TooLarge { .. }))
        ));
        catalog
            .absorb("star", Some(chain.version), later, many(true))
            .await
            .unwrap();
        assert_eq!(catalog.chain("star").await.unwrap().unwrap().state, later);
        assert_eq!(
            catalog
                .stream_tail(10_000 + 2 * limit - 1)
                .await
                .unwrap()
                .tail_seq,
            2 * limit - 1
        );
    }
}
