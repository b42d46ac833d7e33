//! What the auditor keeps in the catalog: its settle cursor over a star's chain, the garbage
//! queue, and the deleted streams whose index entries it still has to drop.
//!
//! The garbage queue is keyed by due time, so the oldest due item is the first key of a scan and
//! a collector pages through what is due in order, never holding the queue in memory. An item
//! is queued in the same transaction that stops the catalog referencing its object (an index
//! swap, the settle cursor passing a run of chain slots), or before the object is written (an
//! *intent*: the transaction that starts referencing it removes the intent again), so an object
//! is either referenced or queued, whatever crashes in between.
//!
//! A collector *claims* an item (rewrites it, changing its version) before it deletes anything,
//! and a swap only lands if its intent is still at the version it was queued at: so an object
//! whose intent came due while its writer was slow is either deleted or referenced, never both.

use std::collections::HashMap;

use super::*;
use crate::keys::slot_key;

const CURSOR_PREFIX: &[u8] = b"a/";
const GARBAGE_PREFIX: &[u8] = b"g/";
const DROPPING_PREFIX: &[u8] = b"x/";
/// `y/{object key}`: an object being written under an intent. Present from before its PUT until
/// its swap lands or its intent is collected, so a sweep can tell an object that may still
/// become referenced from one that never can.
const WRITING_PREFIX: &[u8] = b"y/";

/// `k/{star}`: how far the collector has deleted the star's chain, as the epoch and last slot
/// of the latest run of its slots collected. A chain's runs are queued with due times that
/// never go back and collected in due order, so every run queued before that one went too: a
/// slot at or below the mark that is still in the bucket landed after its run was collected,
/// and the sweep may queue it without queuing twice what the queue still holds.
const COLLECTED_PREFIX: &[u8] = b"k/";

fn collected_key(star: &str) -> Vec<u8> {
    let mut key = COLLECTED_PREFIX.to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

/// A collected mark: the chain's encoding of an epoch and a slot, the slot always there.
pub(super) fn decode_mark(value: &[u8]) -> Result<(u64, u64), CatalogError> {
    match super::decode_epoch_slot(value, "collected mark")? {
        (epoch, Some(slot)) => Ok((epoch, slot)),
        (_, None) => Err(CatalogError::Corrupt(
            "a collected mark without its slot".into(),
        )),
    }
}

/// Attempts at moving a chain's collected mark that meets another collector's move.
const COLLECTED_MARK_ATTEMPTS: usize = 5;

fn writing_key(object: &str) -> Vec<u8> {
    let mut key = WRITING_PREFIX.to_vec();
    key.extend_from_slice(object.as_bytes());
    key
}

const TAG_OBJECT: u8 = 1;
const TAG_CHAIN_SLOTS: u8 = 2;
const TAG_AGAIN: u8 = 3;

/// Index entries dropped per transaction for a deleted stream, with one queued object each at
/// most: well under what any metastore accepts in one transaction.
pub const DROP_BATCH: usize = 50;

pub(super) fn encode_dropping(name: &str) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    put_string(&mut buf, name);
    buf
}

/// What the catalog says of a stream id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Live,
    Deleted,
    /// Deleted, and its manifest in the bucket does not say so yet.
    DeletedUnmarked,
}

/// A deleted stream whose index entries are still to be dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropping {
    pub id: u64,
    /// Its name when it was deleted: the stream is gone while the name does not lead to `id`.
    pub name: String,
}

pub(super) fn dropping_key(id: u64) -> Vec<u8> {
    let mut key = DROPPING_PREFIX.to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

fn cursor_key(star: &str) -> Vec<u8> {
    let mut key = CURSOR_PREFIX.to_vec();
    key.extend_from_slice(star.as_bytes());
    key
}

/// Where the settle duty stands in one star's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettleCursor {
    pub epoch: u64,
    /// The first slot of `epoch` not yet settled.
    pub next_slot: u64,
    /// The latest due time given to a run of chain slots. Runs are queued with due times that
    /// never go back (even if the wall clock does), so chain slots are deleted in slot order and
    /// the slots left in an epoch are always a suffix of it.
    pub last_due_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionedCursor {
    pub cursor: SettleCursor,
    pub version: u64,
}

/// Something to delete once its grace period is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Garbage {
    /// One object of `bytes` bytes (zero when unknown).
    Object { key: String, bytes: u64 },
    /// Slots `from..=to` of one epoch of a star's chain, deleted in slot order.
    ChainSlots {
        star: String,
        epoch: u64,
        from: u64,
        to: u64,
        bytes: u64,
    },
    /// An object deleted once as never referenced, deleted again after another grace period:
    /// a write of it that was still in flight (a slow or retried PUT) may have landed since.
    Again { key: String },
}

impl Garbage {
    fn label(&self) -> String {
        match self {
            Garbage::Object { key, .. } | Garbage::Again { key } => key.clone(),
            Garbage::ChainSlots {
                star, epoch, from, ..
            } => slot_key(star, *epoch, *from),
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            Garbage::Object { bytes, .. } | Garbage::ChainSlots { bytes, .. } => *bytes,
            Garbage::Again { .. } => 0,
        }
    }
}

/// An item of the garbage queue, with the key that removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedGarbage {
    pub key: Vec<u8>,
    pub version: u64,
    pub due_ms: u64,
    pub item: Garbage,
}

/// The queue key of `item` due at `due_ms`.
pub fn garbage_key(due_ms: u64, item: &Garbage) -> Vec<u8> {
    let mut key = GARBAGE_PREFIX.to_vec();
    key.extend_from_slice(&due_ms.to_be_bytes());
    key.extend_from_slice(item.label().as_bytes());
    key
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.put_u32_le(s.len() as u32);
    buf.put_slice(s.as_bytes());
}

pub(super) fn encode_garbage(item: &Garbage) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    match item {
        Garbage::Object { key, bytes } => {
            buf.put_u8(TAG_OBJECT);
            put_string(&mut buf, key);
            buf.put_u64_le(*bytes);
        }
        Garbage::ChainSlots {
            star,
            epoch,
            from,
            to,
            bytes,
        } => {
            buf.put_u8(TAG_CHAIN_SLOTS);
            put_string(&mut buf, star);
            buf.put_u64_le(*epoch);
            buf.put_u64_le(*from);
            buf.put_u64_le(*to);
            buf.put_u64_le(*bytes);
        }
        Garbage::Again { key } => {
            buf.put_u8(TAG_AGAIN);
            put_string(&mut buf, key);
        }
    }
    buf
}

pub(super) fn decode_garbage(key: &[u8], value: &[u8]) -> Result<QueuedGarbage, CatalogError> {
    decode_queued(key, value, 0)
}

fn decode_queued(key: &[u8], value: &[u8], version: u64) -> Result<QueuedGarbage, CatalogError> {
    let Some(mut rest) = key.strip_prefix(GARBAGE_PREFIX) else {
        return Err(CatalogError::Corrupt(
            "garbage key without its prefix".into(),
        ));
    };
    if rest.len() < 8 {
        return Err(CatalogError::Corrupt("garbage key too short".into()));
    }
    let due_ms = rest.get_u64();
    let mut r = Reader::start(value)?;
    let item = match r.u8()? {
        TAG_OBJECT => Garbage::Object {
            key: r.string()?,
            bytes: r.u64()?,
        },
        TAG_CHAIN_SLOTS => {
            let item = Garbage::ChainSlots {
                star: r.string()?,
                epoch: r.u64()?,
                from: r.u64()?,
                to: r.u64()?,
                bytes: r.u64()?,
            };
            if let Garbage::ChainSlots { from, to, .. } = item
                && from > to
            {
                return Err(CatalogError::Corrupt(format!(
                    "garbage slot run {from}..={to} is empty"
                )));
            }
            item
        }
        TAG_AGAIN => Garbage::Again { key: r.string()? },
        other => {
            return Err(CatalogError::Corrupt(format!(
                "unknown garbage kind {other}"
            )));
        }
    };
    Ok(QueuedGarbage {
        key: key.to_vec(),
        version,
        due_ms,
        item,
    })
}

pub(super) fn encode_cursor(cursor: &SettleCursor) -> Vec<u8> {
    let mut buf = vec![FORMAT];
    buf.put_u64_le(cursor.epoch);
    buf.put_u64_le(cursor.next_slot);
    buf.put_u64_le(cursor.last_due_ms);
    buf
}

pub(super) fn decode_cursor(value: &[u8]) -> Result<SettleCursor, CatalogError> {
    let mut r = Reader::start(value)?;
    Ok(SettleCursor {
        epoch: r.u64()?,
        next_slot: r.u64()?,
        last_due_ms: r.u64()?,
    })
}

pub(super) fn queue(mut txn: Txn, items: &[(u64, Garbage)]) -> Txn {
    for (due_ms, item) in items {
        txn = txn.put(garbage_key(*due_ms, item), encode_garbage(item));
    }
    txn
}

impl Catalog {
    pub async fn settle_cursor(&self, star: &str) -> Result<Option<VersionedCursor>, CatalogError> {
        match self.store.get(&cursor_key(star)).await? {
            Some(kv) => Ok(Some(VersionedCursor {
                cursor: decode_cursor(&kv.value)?,
                version: kv.version,
            })),
            None => Ok(None),
        }
    }

    /// Moves the settle cursor to `next` if it is still at version `expected` (`None`: it must
    /// not exist yet), queuing `garbage` in the same transaction. `false` if it moved meanwhile.
    pub async fn advance_settle(
        &self,
        star: &str,
        expected: Option<u64>,
        next: SettleCursor,
        garbage: &[(u64, Garbage)],
    ) -> Result<bool, CatalogError> {
        let key = cursor_key(star);
        let compare = match expected {
            Some(version) => Compare::Version(key.clone(), version),
            None => Compare::Missing(key.clone()),
        };
        let txn = queue(
            Txn::new().compare(compare).put(key, encode_cursor(&next)),
            garbage,
        );
        Ok(matches!(
            self.store.commit(txn).await?,
            TxnOutcome::Committed { .. }
        ))
    }

    /// Queued garbage due after `after_ms`, earliest first, at most `limit` items.
    pub async fn garbage_due_after(
        &self,
        after_ms: u64,
        limit: usize,
    ) -> Result<Vec<QueuedGarbage>, CatalogError> {
        // Past every key due at `after_ms`: their labels are text, below 0xff.
        let mut start = GARBAGE_PREFIX.to_vec();
        start.extend_from_slice(&after_ms.to_be_bytes());
        start.push(0xff);
        self.store
            .scan(GARBAGE_PREFIX, Some(&start), limit)
            .await?
            .iter()
            .map(|kv| decode_queued(&kv.key, &kv.value, kv.version))
            .collect()
    }

    /// Moves queued items to new due times (`items`: each with its new due) in one transaction
    /// that applies only if every item is still queued as read; with `cursor` (a star, the
    /// version its settle cursor was read at, and where it goes), only if that cursor is still
    /// there too, and it moves with them (unless an item had to wait for a later job).
    pub async fn redate_garbage(
        &self,
        cursor: Option<(&str, u64, SettleCursor)>,
        items: &[(QueuedGarbage, u64)],
    ) -> Result<bool, CatalogError> {
        let mut txn = Txn::new();
        let mut held_back = false;
        // etcd refuses a transaction that names one key twice. A new key can only equal
        // another moving item's old or new key (items keep their order, and move only
        // earlier): the same item queued twice needs one copy; a different item under the
        // same label (an object's first and second delete) waits for a later job instead.
        let moving: HashMap<&[u8], &Garbage> = items
            .iter()
            .map(|(q, _)| (q.key.as_slice(), &q.item))
            .collect();
        let mut placed: HashMap<Vec<u8>, &Garbage> = HashMap::new();
        for (queued, due_ms) in items {
            let key = garbage_key(*due_ms, &queued.item);
            let clash = moving
                .get(key.as_slice())
                .or_else(|| placed.get(&key))
                .copied();
            if clash.is_some_and(|other| *other != queued.item) {
                held_back = true;
                continue;
            }
            txn = txn
                .compare(Compare::Version(queued.key.clone(), queued.version))
                .delete(queued.key.clone());
            if clash.is_none() {
                placed.insert(key.clone(), &queued.item);
                txn = txn.put(key, encode_garbage(&queued.item));
            }
        }
        // The cursor follows only once every item is back.
        if let Some((star, expected, next)) = cursor.filter(|_| !held_back) {
            let key = cursor_key(star);
            txn = txn
                .compare(Compare::Version(key.clone(), expected))
                .put(key, encode_cursor(&next));
        }
        Ok(matches!(
            self.store.commit(txn).await?,
            TxnOutcome::Committed { .. }
        ))
    }

    /// Queues garbage on its own: intents, written before the objects they name. Returns each
    /// item's queue key and version, which the transaction that starts referencing the object
    /// checks and removes.
    pub async fn queue_garbage(
        &self,
        items: &[(u64, Garbage)],
    ) -> Result<Vec<(Vec<u8>, u64)>, CatalogError> {
        let mut keys = Vec::with_capacity(items.len());
        for chunk in items.chunks(MAX_RESTORE_TXN) {
            let revision = match self.store.commit(queue(Txn::new(), chunk)).await? {
                TxnOutcome::Committed { revision } => revision,
                TxnOutcome::Conflict => {
                    return Err(CatalogError::Conflict("queuing garbage".into()));
                }
            };
            keys.extend(
                chunk
                    .iter()
                    .map(|(due, item)| (garbage_key(*due, item), revision)),
            );
        }
        Ok(keys)
    }

    /// Queues the intent for a settled object about to be written (and marks it as being
    /// written): the returned key and version are what its swap checks.
    pub async fn queue_intent(
        &self,
        due_ms: u64,
        object: &str,
        bytes: u64,
    ) -> Result<(Vec<u8>, u64), CatalogError> {
        let item = Garbage::Object {
            key: object.to_owned(),
            bytes,
        };
        let key = garbage_key(due_ms, &item);
        let txn = queue(Txn::new(), &[(due_ms, item)]).put(writing_key(object), key.clone());
        match self.store.commit(txn).await? {
            TxnOutcome::Committed { revision } => Ok((key, revision)),
            TxnOutcome::Conflict => Err(CatalogError::Conflict("queuing an intent".into())),
        }
    }

    /// Whether the index references `object`, a settled object holding records of stream
    /// `stream_id` up to `end_seq`: only the stream's entry ending there can.
    pub async fn references(
        &self,
        stream_id: u64,
        end_seq: u64,
        object: &str,
    ) -> Result<bool, CatalogError> {
        Ok(self
            .index_entry(stream_id, end_seq)
            .await?
            .is_some_and(|(entry, _)| entry.object_key == object))
    }

    /// Whether `object` is being written under an intent that is still queued.
    pub async fn being_written(&self, object: &str) -> Result<bool, CatalogError> {
        Ok(self.store.get(&writing_key(object)).await?.is_some())
    }

    /// Claims a queued item for deletion: afterwards no swap whose intent it is can land. `false`
    /// if it changed or went meanwhile (its swap landed, or another collector has it).
    pub async fn claim_garbage(&self, item: &QueuedGarbage) -> Result<bool, CatalogError> {
        let txn = Txn::new()
            .compare(Compare::Version(item.key.clone(), item.version))
            .put(item.key.clone(), encode_garbage(&item.item));
        Ok(matches!(
            self.store.commit(txn).await?,
            TxnOutcome::Committed { .. }
        ))
    }

    /// The first `limit` items of the garbage queue, earliest due first.
    pub async fn garbage_page(&self, limit: usize) -> Result<Vec<QueuedGarbage>, CatalogError> {
        self.store
            .scan(GARBAGE_PREFIX, None, limit)
            .await?
            .iter()
            .map(|kv| decode_queued(&kv.key, &kv.value, kv.version))
            .collect()
    }

    /// Records stream `id`, deleted under `name`, as dropping again, unless it is: for index
    /// entries, and a tail, that an absorb landing after its drop wrote back. `true` if this
    /// opened it. The caller has seen that `name` no longer leads to `id`; the drop checks again.
    pub async fn reopen_drop(&self, id: u64, name: &str) -> Result<bool, CatalogError> {
        let key = dropping_key(id);
        let txn = Txn::new()
            .compare(Compare::Missing(key.clone()))
            .put(key, encode_dropping(name));
        Ok(matches!(
            self.store.commit(txn).await?,
            TxnOutcome::Committed { .. }
        ))
    }

    /// How far the collector has deleted `star`'s chain: the epoch and last slot of the
    /// latest run collected (see `COLLECTED_PREFIX`).
    pub async fn chain_collected(&self, star: &str) -> Result<Option<(u64, u64)>, CatalogError> {
        match self.store.get(&collected_key(star)).await? {
            Some(kv) => decode_mark(&kv.value).map(Some),
            None => Ok(None),
        }
    }

    /// Forgets a collected run of `star`'s chain slots ending at `slot` of `epoch`, and moves
    /// the chain's collected mark there if that is further, in one transaction. Should other
    /// collectors keep moving the mark meanwhile, the run is forgotten without it: a mark that
    /// lags only makes the sweep look at less.
    pub async fn forget_chain_run(
        &self,
        queued: &QueuedGarbage,
        star: &str,
        epoch: u64,
        slot: u64,
    ) -> Result<(), CatalogError> {
        let key = collected_key(star);
        for _ in 0..COLLECTED_MARK_ATTEMPTS {
            let current = self.store.get(&key).await?;
            let mark = current
                .as_ref()
                .map(|kv| decode_mark(&kv.value))
                .transpose()?;
            let mut txn = Txn::new().delete(queued.key.clone());
            if mark.is_none_or(|mark| (epoch, slot) > mark) {
                let compare = match &current {
                    Some(kv) => Compare::Version(key.clone(), kv.version),
                    None => Compare::Missing(key.clone()),
                };
                let value = super::encode_epoch_slot(epoch, Some(slot));
                txn = txn.compare(compare).put(key.clone(), value);
            }
            if let TxnOutcome::Committed { .. } = self.store.commit(txn).await? {
                return Ok(());
            }
        }
        self.forget_garbage(queued).await
    }

    pub async fn forget_garbage(&self, queued: &QueuedGarbage) -> Result<(), CatalogError> {
        let mut txn = Txn::new().delete(queued.key.clone());
        if let Garbage::Object { key, .. } = &queued.item {
            txn = txn.delete(writing_key(key));
        }
        self.store.commit(txn).await?;
        Ok(())
    }

    /// Index entries of every stream, in (stream, seq) order, after the entry of stream
    /// `after.0` ending at `after.1` (from the first when `None`), at most `limit`, each with
    /// its version.
    pub async fn index_page(
        &self,
        after: Option<(u64, u64)>,
        limit: usize,
    ) -> Result<Vec<(IndexEntry, u64)>, CatalogError> {
        let after = after.map(|(id, end)| index_key(id, end));
        self.store
            .scan(b"i/", after.as_deref(), limit)
            .await?
            .iter()
            .map(|kv| Ok((decode_entry(&kv.key, &kv.value)?, kv.version)))
            .collect()
    }

    /// The index entry of stream `id` ending at `end_seq`, with its version.
    pub async fn index_entry(
        &self,
        id: u64,
        end_seq: u64,
    ) -> Result<Option<(IndexEntry, u64)>, CatalogError> {
        let key = index_key(id, end_seq);
        match self.store.get(&key).await? {
            Some(kv) => Ok(Some((decode_entry(&kv.key, &kv.value)?, kv.version))),
            None => Ok(None),
        }
    }

    /// Replaces `old` (consecutive entries of one stream, each still at the version it was read
    /// at) with `new` (consecutive entries covering exactly the same records), removes `intent`
    /// (the new object's, still at its version) from the garbage queue and queues `retire`,
    /// atomically. `false` if any old entry or the intent changed meanwhile.
    pub async fn swap_entries(
        &self,
        old: &[(IndexEntry, u64)],
        new: &[IndexEntry],
        intent: Option<&(Vec<u8>, u64)>,
        retire: &[(u64, Garbage)],
    ) -> Result<bool, CatalogError> {
        let (Some((first, _)), Some((last, _)), Some(new_first), Some(new_last)) =
            (old.first(), old.last(), new.first(), new.last())
        else {
            return Err(CatalogError::Conflict(
                "a swap needs entries on both sides".into(),
            ));
        };
        let stream = first.stream_id;
        let tiles = |entries: Vec<&IndexEntry>| {
            entries
                .iter()
                .all(|e| e.stream_id == stream && e.start_seq < e.end_seq)
                && entries.windows(2).all(|w| w[0].end_seq == w[1].start_seq)
        };
        if first.start_seq != new_first.start_seq
            || last.end_seq != new_last.end_seq
            || !tiles(old.iter().map(|(e, _)| e).collect())
            || !tiles(new.iter().collect())
        {
            return Err(CatalogError::Conflict(format!(
                "entries {}..{} of stream {stream} do not tile {}..{}",
                first.start_seq, last.end_seq, new_first.start_seq, new_last.end_seq
            )));
        }
        let mut txn = Txn::new();
        for (entry, version) in old {
            let key = index_key(entry.stream_id, entry.end_seq);
            txn = txn.compare(Compare::Version(key.clone(), *version));
            // An old entry ending where a new one ends is replaced by the put below.
            if !new.iter().any(|n| n.end_seq == entry.end_seq) {
                txn = txn.delete(key);
            }
        }
        for entry in new {
            txn = txn.put(
                index_key(entry.stream_id, entry.end_seq),
                encode_entry(entry),
            );
        }
        if let Some((key, version)) = intent {
            txn = txn
                .compare(Compare::Version(key.clone(), *version))
                .delete(key.clone())
                .delete(writing_key(&new_first.object_key));
        }
        let txn = queue(txn, retire);
        Ok(matches!(
            self.store.commit(txn).await?,
            TxnOutcome::Committed { .. }
        ))
    }

    /// Whether stream `id` is live, deleted, or deleted with its manifest not yet saying so (a
    /// rebuild from the bucket would bring it back, so nothing of it may go yet).
    ///
    /// The tail is read first: a delete removes it and writes the tombstone in one transaction,
    /// and a tombstone goes only once the manifest is marked, so whatever the tail said, the
    /// tombstone read after it tells an unmarked delete. (Read the other way round, a delete
    /// landing between the reads would make a stream whose manifest is unmarked look deleted
    /// and marked, and its sections be skipped.)
    pub async fn stream_liveness(&self, id: u64) -> Result<Liveness, CatalogError> {
        let tail = self.store.get(&tail_key(id)).await?;
        if self.store.get(&tombstone_key(id)).await?.is_some() {
            return Ok(Liveness::DeletedUnmarked);
        }
        Ok(if tail.is_some() {
            Liveness::Live
        } else {
            Liveness::Deleted
        })
    }

    /// Deleted streams whose index entries are still to be dropped, at most `limit`, and
    /// whether each one's manifest is marked deleted yet (only then may its records go).
    pub async fn dropping_streams(
        &self,
        limit: usize,
    ) -> Result<Vec<(Dropping, bool)>, CatalogError> {
        let mut out = Vec::new();
        for kv in self.store.scan(DROPPING_PREFIX, None, limit).await? {
            let mut id = kv.key.get(2..10).ok_or_else(|| {
                CatalogError::Corrupt("deleted-stream key has the wrong length".into())
            })?;
            let id = id.get_u64();
            let name = Reader::start(&kv.value)?.string()?;
            let marked = self.store.get(&tombstone_key(id)).await?.is_none();
            out.push((Dropping { id, name }, marked));
        }
        Ok(out)
    }

    /// Drops up to `DROP_BATCH` index entries of deleted stream `dropping`, queuing (due at
    /// `due_ms`) the objects `owned` says belong to the stream alone. Once none are left, the
    /// stream is forgotten (with a tail a late absorb may have written back). Returns the
    /// entries dropped; zero means the stream is done.
    pub async fn drop_entries(
        &self,
        dropping: &Dropping,
        due_ms: u64,
        owned: impl Fn(&IndexEntry) -> bool,
    ) -> Result<usize, CatalogError> {
        let id = dropping.id;
        let by_name = self.stream(&dropping.name).await?;
        if by_name.as_ref().is_some_and(|meta| meta.id == id) {
            return Err(CatalogError::Conflict(format!(
                "stream {:?} ({id}) is live; only a deleted stream's entries are dropped",
                dropping.name
            )));
        }
        let page = self.store.scan(&index_prefix(id), None, DROP_BATCH).await?;
        if page.is_empty() {
            self.store
                .commit(
                    Txn::new()
                        .delete(dropping_key(id))
                        .delete(tail_key(id))
                        .delete(super::retention::trim_key(id)),
                )
                .await?;
            return Ok(0);
        }
        let mut txn = Txn::new();
        // An object holds several entries: queue each once, with all of their bytes.
        let mut objects: std::collections::BTreeMap<String, u64> = Default::default();
        for kv in &page {
            let entry = decode_entry(&kv.key, &kv.value)?;
            txn = txn.compare(Compare::Version(kv.key.clone(), kv.version));
            txn = txn.delete(kv.key.clone());
            if owned(&entry) {
                *objects.entry(entry.object_key).or_default() += entry.len;
            }
        }
        let garbage: Vec<_> = objects
            .into_iter()
            .map(|(key, bytes)| (due_ms, Garbage::Object { key, bytes }))
            .collect();
        match self.store.commit(queue(txn, &garbage)).await? {
            TxnOutcome::Committed { .. } => Ok(page.len()),
            TxnOutcome::Conflict => Err(CatalogError::Conflict(format!(
                "the entries of deleted stream {id} changed while being dropped"
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
