//! Rebuilding the catalog from the object store alone, for a star whose metastore is gone.
//!
//! The bucket holds everything needed: stream manifests (`streams/{star}/{id}`) name each
//! stream, its settings and whether it was deleted; settled objects (`data/{star}/{id}/…`) hold
//! the records the auditor moved out of the chain; and the chain's flights say which records of
//! which stream each section holds.
//!
//! Settled objects come first, each stream's in key order (by first record): from its first
//! record (or from where a trim marker says retention may have trimmed it), the rebuild takes the
//! chain of objects, each starting where the last ended, that reaches furthest, so objects a
//! rewrite replaced or an interrupted settle left behind are passed over and queued for
//! collection.
//! Then each epoch of the chain is read from just past its settle marker (slot 0 without one)
//! up to its first gap or fence, exactly as recovery settles it (acknowledgements go out in slot
//! order, so nothing past a gap was ever acknowledged). A section whose records a settled object
//! already holds is skipped; every other becomes an index entry. Slots below the marker that
//! are still there are queued for collection. The chain is then recorded where the star's next
//! start settles and fences from, as after any crash.
//!
//! Memory stays bounded by the streams: one entry per stream ever created (the deleted ones as
//! bare ids), index entries written in small batches as the chain is read, and per epoch only a
//! count of its objects. A rebuild marks the metastore while it runs, so an interrupted one is
//! simply run again, and novad refuses to start on a half-restored catalog.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nova_core::catalog::{
    Catalog, CatalogError, ChainState, ExpressCheckpoint, Garbage, IndexEntry, Occupancy, Restored,
    StorageClass, StreamMeta, StreamTail, Trim,
};
use nova_core::clock::Clock;
use nova_core::flight::{FetchError, ObjectFooter, fetch_footer, latest_settle_marker};
use nova_core::keys::{
    DataKey, TrimMarker, chain_prefix, chain_root, data_root, parse_data_key, parse_epoch,
    parse_slot, parse_stream_manifest, parse_trim_marker, slot_key, streams_prefix, trims_root,
};
use nova_core::manifest::{ManifestError, StreamManifest};
use nova_core::object_store::{GetRange, ListPage, MAX_LIST_KEYS, ObjectStore, StoreError};

use crate::recovery::Retryable;

mod settled;

use settled::restore_settled;

/// Index entries written per batch while the chain is read.
const ENTRY_BATCH: usize = 1000;
/// Attempts at one object-store request that fails with a retryable error.
const ATTEMPTS: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error(
        "the metastore already holds a catalog; a rebuild only fills an empty one (move the \
         old metastore aside first if it is the one to replace)"
    )]
    NotEmpty,
    #[error("reading the object store: {0}")]
    Store(#[from] StoreError),
    #[error("manifest {key}: {source}")]
    Manifest { key: String, source: ManifestError },
    #[error("flight {key} is unreadable: {source}")]
    Flight { key: String, source: FetchError },
    #[error("settle marker {key} is unreadable: {source}")]
    Marker {
        key: String,
        source: nova_core::flight::FormatError,
    },
    #[error(
        "flight {key} does not continue stream {stream:?}: its section starts at {found}, the \
         records before it end at {expected}"
    )]
    Discontinuous {
        key: String,
        stream: String,
        expected: u64,
        found: u64,
    },
    #[error(
        "stream {stream:?}'s records in the bucket start at {found}, but no trim marker says \
         retention trimmed it past {trimmed}: the objects holding {trimmed}..{found} are missing \
         (in a fleet, records another star settled live under that star's prefix), so the \
         rebuild stops rather than call them trimmed"
    )]
    FrontMissing {
        stream: String,
        trimmed: u64,
        found: u64,
    },
    #[error("{key} does not belong to this star's chain: {what}")]
    Foreign { key: String, what: String },
    #[error("writing the catalog: {0}")]
    Catalog(#[from] CatalogError),
    #[error("{0}")]
    ExpressCheckpoint(#[from] crate::express::marker::MarkerError),
}

/// What a rebuild restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Streams restored, with records or without.
    pub streams: u64,
    /// Streams whose manifests say they were deleted, or that a newer stream of the same name
    /// replaced: not restored, their records skipped.
    pub deleted_streams: u64,
    /// Streams found in flights without a manifest, restored under the name their flights give.
    pub streams_without_manifest: u64,
    pub epochs: u64,
    /// Settled objects the index now references.
    pub settled_objects: u64,
    /// Objects queued for collection: settled objects another one supersedes or of deleted
    /// streams, and settled slots the auditor had not deleted yet.
    pub queued_garbage: u64,
    pub flights: u64,
    pub records: u64,
    /// Slots past a gap or fence: never acknowledged, left for collection.
    pub orphaned_slots: u64,
    /// The chain the star resumes from.
    pub chain: Option<ChainState>,
    /// Where the star's express chain resumes from (its checkpoint's copy in the bucket):
    /// the walk at the next start carries what the zones hold past it.
    pub express: Option<ExpressCheckpoint>,
}

struct Stream {
    meta: StreamMeta,
    tail: StreamTail,
    /// Where retention surely trimmed the stream (its trim markers' highest committed point):
    /// records below it are not restored.
    trim: u64,
    /// How far a trim may have gone (its markers' highest `after`): records below it may be
    /// gone; records above it never were trimmed.
    trim_reached: u64,
    /// The records the index holds so far, as disjoint ranges in order. Settled objects are
    /// unions of whole flight sections, so a section is inside a range or apart from all.
    cover: Vec<(u64, u64)>,
}

impl Stream {
    fn new(meta: StreamMeta) -> Self {
        Self {
            meta,
            tail: StreamTail::default(),
            trim: 0,
            trim_reached: 0,
            cover: Vec::new(),
        }
    }

    /// `committed`: the stream surely starts there; `reached`: its records surely went that far
    /// (a trim was about to move past them), so its tail is at least that, even when a trim
    /// emptied it.
    fn trim_at(&mut self, committed: u64, reached: u64) {
        self.trim = self.trim.max(committed);
        self.trim_reached = self.trim_reached.max(reached);
        self.tail.tail_seq = self.tail.tail_seq.max(reached);
    }

    fn covers(&self, start: u64, end: u64) -> bool {
        self.cover.iter().any(|&(s, e)| s <= start && end <= e)
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.cover.iter().any(|&(s, e)| start < e && s < end)
    }

    /// Records `start..end` (apart from everything covered) join the index.
    fn add(&mut self, start: u64, end: u64, bytes: u64) {
        let at = self.cover.partition_point(|&(s, _)| s < start);
        self.cover.insert(at, (start, end));
        // Merge touching neighbours.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.cover.len());
        for &(s, e) in &self.cover {
            match merged.last_mut() {
                Some(last) if last.1 == s => last.1 = e,
                _ => merged.push((s, e)),
            }
        }
        self.cover = merged;
        self.tail.tail_seq = self.tail.tail_seq.max(end);
        self.tail.stored_bytes += bytes;
    }
}

/// Retries `op` while it fails with an outage (the same errors recovery waits out), a few times
/// with backoff: a rebuild is run by hand, so it gives up and says why rather than wait.
async fn retrying<T, E, F, Fut>(clock: Clock, mut op: F) -> Result<T, E>
where
    E: Retryable + std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(err) if err.outage() && attempt < ATTEMPTS => {
                tracing::warn!(attempt, "rebuild: retrying: {err}");
                clock
                    .sleep(Duration::from_millis(100 << attempt.min(6)))
                    .await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn list_page(
    clock: Clock,
    store: &dyn ObjectStore,
    prefix: &str,
    after: Option<&str>,
) -> Result<ListPage, StoreError> {
    retrying(clock, || store.list(prefix, after, MAX_LIST_KEYS)).await
}

pub async fn rebuild_catalog(
    star: &str,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
    clock: Clock,
) -> Result<RebuildReport, RebuildError> {
    match catalog.occupancy().await? {
        Occupancy::Holds => return Err(RebuildError::NotEmpty),
        Occupancy::Empty | Occupancy::Restoring => catalog.begin_restore().await?,
    }
    let store = store.as_ref();
    let mut found = Found::default();
    read_manifests(star, store, clock, &mut found).await?;
    read_trim_markers(star, store, clock, &mut found).await?;
    restore_settled(star, store, catalog, clock, &mut found).await?;
    for epoch in list_epochs(star, store, clock).await? {
        walk_epoch(star, store, catalog, clock, epoch, &mut found).await?;
    }
    found.report.queued_garbage = found.garbage.len() as u64;
    catalog.queue_garbage(&found.garbage).await?;
    catalog.restore_entries(&found.pending).await?;
    check_continuity(&found.streams)?;
    found.report.streams = found.streams.len() as u64;
    let trims = trim_points(&found.streams);
    // The express checkpoint cannot be recomputed from the Standard chain (a flight does not
    // say which bundles it carried); its copy is at or behind the lost one, and nothing ahead
    // of it was collected, so the next start's walk from it finds every bundle not yet carried.
    found.report.express = retrying(clock, || crate::express::marker::read(store, star)).await?;
    // The star that wrote the express chain ran at that chain epoch, whether or not any of its
    // Standard flights landed: the next start must walk that Standard epoch (settling what
    // landed, fencing the rest, so a late or paused writer can never land a flight there
    // unnoticed) and the express chain behind it, so the chain resumes there at least.
    if let Some(express) = found.report.express {
        let express_chain_epoch = express.epoch / crate::express::GENERATIONS_PER_EPOCH;
        if found
            .report
            .chain
            .is_none_or(|chain| chain.epoch < express_chain_epoch)
        {
            found.report.chain = Some(ChainState {
                epoch: express_chain_epoch,
                checkpoint: None,
            });
        }
    }
    let Found {
        streams,
        max_id,
        report,
        ..
    } = found;
    let restored = Restored {
        express: report.express.map(|c| (star.to_owned(), c)),
        trims,
        streams: streams.into_values().map(|s| (s.meta, s.tail)).collect(),
        next_stream_id: max_id + 1,
        chain: report.chain.map(|state| (star.to_owned(), state)),
    };
    catalog.restore_streams(&restored).await?;
    Ok(report)
}

/// Reads every stream manifest: the streams to restore by id and name, the deleted ones, and the
/// highest id handed out so far.
async fn read_manifests(
    star: &str,
    store: &dyn ObjectStore,
    clock: Clock,
    found: &mut Found,
) -> Result<(), RebuildError> {
    let prefix = streams_prefix(star);
    let mut after: Option<String> = None;
    loop {
        let page = list_page(clock, store, &prefix, after.as_deref()).await?;
        for object in &page.objects {
            let Some(id) = parse_stream_manifest(&prefix, &object.key) else {
                continue;
            };
            let bytes = retrying(clock, || store.get(&object.key, GetRange::All))
                .await?
                .bytes;
            let manifest =
                StreamManifest::decode(&bytes).map_err(|source| RebuildError::Manifest {
                    key: object.key.clone(),
                    source,
                })?;
            found.max_id = found.max_id.max(id);
            if manifest.deleted {
                found.deleted.insert(id);
                continue;
            }
            // Two live manifests of one name: a create that failed half-way, or a stream whose
            // delete was never marked. The newer id is the stream the name belongs to.
            if let Some(&other) = found.names.get(&manifest.meta.name) {
                let older = other.min(id);
                found.deleted.insert(older);
                found.streams.remove(&older);
                if older == id {
                    continue;
                }
            }
            found.names.insert(manifest.meta.name.clone(), id);
            found.streams.insert(id, Stream::new(manifest.meta));
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    found.report.deleted_streams = found.deleted.len() as u64;
    Ok(())
}

/// Trim markers: where retention surely trimmed each stream (the highest committed point) and
/// how far its records surely went (the highest point a trim was about to move to). Only the
/// markers saying the most are kept; the others, and those of streams not restored, are queued
/// (the garbage queue is lost with the catalog).
async fn read_trim_markers(
    star: &str,
    store: &dyn ObjectStore,
    clock: Clock,
    found: &mut Found,
) -> Result<(), RebuildError> {
    let trims = trims_root(star);
    let mut markers: BTreeMap<u64, Vec<(String, u64, TrimMarker)>> = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = list_page(clock, store, &trims, after.as_deref()).await?;
        for object in &page.objects {
            if let Some((id, marker)) = parse_trim_marker(&trims, &object.key) {
                markers
                    .entry(id)
                    .or_default()
                    .push((object.key.clone(), object.size, marker));
            }
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    for (id, list) in markers {
        let committed = list.iter().map(|(_, _, m)| m.committed).max().unwrap_or(0);
        let reached = list.iter().map(|(_, _, m)| m.after).max().unwrap_or(0);
        let stream = found.streams.get_mut(&id);
        let restored = stream.is_some();
        if let Some(stream) = stream {
            stream.trim_at(committed, reached);
        }
        // Of the markers saying `committed`, the one reaching furthest is enough (a trim that
        // failed left the others).
        let furthest_committed = list
            .iter()
            .filter(|(_, _, m)| m.committed == committed)
            .map(|(_, _, m)| m.after)
            .max();
        for (key, size, marker) in list {
            let says_the_most = marker.after == reached
                || (marker.committed == committed && Some(marker.after) == furthest_committed);
            let keep = restored && says_the_most;
            if !keep {
                found
                    .garbage
                    .push((clock.unix_ms(), Garbage::Object { key, bytes: size }));
            }
        }
    }
    Ok(())
}

/// The chain's epochs: any object under an epoch's prefix (a slot, a fence, a settle marker)
/// shows it.
async fn list_epochs(
    star: &str,
    store: &dyn ObjectStore,
    clock: Clock,
) -> Result<BTreeSet<u64>, RebuildError> {
    let root = chain_root(star);
    let mut epochs: BTreeSet<u64> = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = list_page(clock, store, &root, after.as_deref()).await?;
        for object in &page.objects {
            if let Some(epoch) = parse_epoch(&root, &object.key) {
                epochs.insert(epoch);
            }
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(epochs)
}

/// Reads one epoch of the chain from just past its settle marker up to its first gap or fence,
/// indexing every section no settled object holds, and records the chain as resuming there.
async fn walk_epoch(
    star: &str,
    store: &dyn ObjectStore,
    catalog: &Catalog,
    clock: Clock,
    epoch: u64,
    found: &mut Found,
) -> Result<(), RebuildError> {
    found.report.epochs += 1;
    let marker = match retrying(clock, || latest_settle_marker(store, star, epoch)).await {
        Ok(latest) => latest.map(|(_, marker)| marker),
        Err(FetchError::Store(err)) => return Err(err.into()),
        Err(FetchError::Format { key, source }) => {
            return Err(RebuildError::Marker { key, source });
        }
    };
    // Slots up to the marker were settled: their records are in settled objects, and those
    // the auditor had not deleted yet are queued for it (what is left of them is a run
    // ending at the marker, since they are deleted in order).
    let mut slot = 0u64;
    let mut last = None;
    if let Some(marker) = marker {
        slot = marker.settled_through + 1;
        last = Some(marker.settled_through);
        let prefix = chain_prefix(star, epoch);
        let first = list_page(clock, store, &prefix, None).await?;
        if let Some(lowest) = first
            .objects
            .iter()
            .find_map(|o| parse_slot(&prefix, &o.key))
            .filter(|lowest| *lowest <= marker.settled_through)
        {
            found.garbage.push((
                clock.unix_ms(),
                Garbage::ChainSlots {
                    star: star.to_owned(),
                    epoch,
                    from: lowest,
                    to: marker.settled_through,
                    bytes: 0,
                },
            ));
        }
    }
    let mut fenced_by = None;
    loop {
        let key = slot_key(star, epoch, slot);
        let footer = match retrying(clock, || fetch_footer(store, &key)).await {
            Ok(footer) => footer,
            Err(FetchError::Store(StoreError::NotFound { .. })) => break,
            Err(source) => return Err(RebuildError::Flight { key, source }),
        };
        let flight = match footer {
            ObjectFooter::Fence(fence) => {
                if (fence.star.as_str(), fence.epoch, fence.slot) != (star, epoch, slot) {
                    return Err(RebuildError::Foreign {
                        key,
                        what: format!(
                            "it is a fence for slot {} of epoch {} of star {:?}",
                            fence.slot, fence.epoch, fence.star
                        ),
                    });
                }
                // "star/epoch": the epoch whose recovery wrote it.
                fenced_by = fence
                    .fenced_by
                    .rsplit('/')
                    .next()
                    .and_then(|e| e.parse::<u64>().ok());
                break;
            }
            ObjectFooter::Flight(flight) => flight,
        };
        let meta = &flight.meta;
        if (meta.star.as_str(), meta.epoch, meta.slot) != (star, epoch, slot) {
            return Err(RebuildError::Foreign {
                key,
                what: format!(
                    "its footer says slot {} of epoch {} of star {:?}",
                    meta.slot, meta.epoch, meta.star
                ),
            });
        }
        for section in &flight.sections {
            let id = section.stream_id;
            found.max_id = found.max_id.max(id);
            if found.deleted.contains(&id) {
                continue;
            }
            let Some(stream) = stream_of(
                &mut found.streams,
                &mut found.names,
                &mut found.report,
                section,
                meta.created_at_ms,
                &key,
            )?
            else {
                continue;
            };
            // A settled object holds these records already (settled, not yet collected), or
            // retention trimmed them.
            if stream.covers(section.start_seq, section.end_seq) || section.end_seq <= stream.trim {
                continue;
            }
            let expected = stream.tail.tail_seq;
            let follows = section.start_seq == expected
                // Or it fills a gap settled objects left (an interrupted settle).
                || (section.start_seq < expected
                    && !stream.overlaps(section.start_seq, section.end_seq));
            if !follows {
                return Err(RebuildError::Discontinuous {
                    key,
                    stream: stream.meta.name.clone(),
                    expected,
                    found: section.start_seq,
                });
            }
            stream.add(section.start_seq, section.end_seq, section.len);
            found.report.records += section.end_seq - section.start_seq;
            found.pending.push(IndexEntry::for_section(
                &key,
                section,
                flight.meta.created_at_ms,
            ));
        }
        if found.pending.len() >= ENTRY_BATCH {
            catalog.restore_entries(&found.pending).await?;
            found.pending.clear();
        }
        found.report.flights += 1;
        last = Some(slot);
        slot += 1;
    }
    found.report.orphaned_slots +=
        count_slots_after(clock, store, star, epoch, slot + fenced_by.is_some() as u64).await?;
    found.report.chain = Some(match fenced_by {
        // A later epoch fenced this one, though it wrote nothing yet: resume from it, so
        // its number is never handed out twice.
        Some(next) if next > epoch => ChainState {
            epoch: next,
            checkpoint: None,
        },
        _ => ChainState {
            epoch,
            checkpoint: last,
        },
    });
    Ok(())
}

/// Every stream's records must run without a gap from its first to its tail, and start past 0
/// only where retention trimmed them.
fn check_continuity(streams: &BTreeMap<u64, Stream>) -> Result<(), RebuildError> {
    // Every stream's records must run without a gap from its first to its tail.
    for stream in streams.values() {
        if let [(_, first_end), (next, _), ..] = stream.cover[..] {
            return Err(RebuildError::Discontinuous {
                key: format!("the records of stream {:?}", stream.meta.name),
                stream: stream.meta.name.clone(),
                expected: first_end,
                found: next,
            });
        }
    }
    // Records start past 0 only where retention trimmed them, and a trim always wrote its
    // marker first: a front past every marker's reach is missing objects, not a trim.
    for stream in streams.values() {
        let first = stream
            .cover
            .first()
            .map_or(stream.tail.tail_seq, |&(start, _)| start);
        let trimmed = stream.trim.max(stream.trim_reached);
        if first > trimmed {
            return Err(RebuildError::FrontMissing {
                stream: stream.meta.name.clone(),
                trimmed,
                found: first,
            });
        }
    }
    Ok(())
}

/// A stream whose records start past 0 had its front trimmed by retention: its trim point is its
/// first record (or its tail, when it holds none), and never below what surely committed.
fn trim_points(streams: &BTreeMap<u64, Stream>) -> Vec<(u64, Trim)> {
    streams
        .values()
        .map(|s| {
            let first = s.cover.first().map_or(s.tail.tail_seq, |&(start, _)| start);
            (s.meta.id, first.max(s.trim))
        })
        .filter(|&(_, first)| first > 0)
        .map(|(id, first_seq)| {
            (
                id,
                Trim {
                    first_seq,
                    trimmed_bytes: 0,
                },
            )
        })
        .collect()
}

/// Slots of `epoch` numbered `from` or more: past the walk's end, never acknowledged.
async fn count_slots_after(
    clock: Clock,
    store: &dyn ObjectStore,
    star: &str,
    epoch: u64,
    from: u64,
) -> Result<u64, RebuildError> {
    let prefix = chain_prefix(star, epoch);
    let mut after = from.checked_sub(1).map(|slot| slot_key(star, epoch, slot));
    let mut count = 0;
    loop {
        let page = list_page(clock, store, &prefix, after.as_deref()).await?;
        count += page
            .objects
            .iter()
            .filter(|o| parse_slot(&prefix, &o.key).is_some())
            .count() as u64;
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return Ok(count),
        }
    }
}

/// What the walk of the bucket has found so far, and what it has still to write: each pass
/// reads it and adds to it.
#[derive(Default)]
struct Found {
    /// The streams to restore, by id.
    streams: BTreeMap<u64, Stream>,
    /// Streams whose manifests say they were deleted (or lost their name to a newer id).
    deleted: BTreeSet<u64>,
    names: HashMap<String, u64>,
    /// The highest stream id any manifest, settled object or flight section names.
    max_id: u64,
    /// Index entries not yet written (written in batches of `ENTRY_BATCH`).
    pending: Vec<IndexEntry>,
    /// Objects and chain slots to queue for the collector, with when they became garbage.
    garbage: Vec<(u64, Garbage)>,
    report: RebuildReport,
}

/// The stream a section belongs to. One without a manifest is restored under the name its
/// sections give, unless a stream with a manifest holds that name (`None`: its records are
/// skipped). A section naming another stream than the manifest is refused.
fn stream_of<'a>(
    streams: &'a mut BTreeMap<u64, Stream>,
    names: &mut HashMap<String, u64>,
    report: &mut RebuildReport,
    section: &nova_core::flight::SectionEntry,
    created_at_ms: u64,
    key: &str,
) -> Result<Option<&'a mut Stream>, RebuildError> {
    let id = section.stream_id;
    let stream = match streams.entry(id) {
        std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::btree_map::Entry::Vacant(entry) => {
            if names.contains_key(&section.stream) {
                return Ok(None);
            }
            names.insert(section.stream.clone(), id);
            report.streams_without_manifest += 1;
            entry.insert(Stream::new(StreamMeta {
                id,
                name: section.stream.clone(),
                created_at_ms,
                class: StorageClass::Standard,
                retention: Default::default(),
            }))
        }
    };
    if stream.meta.name != section.stream {
        return Err(RebuildError::Foreign {
            key: key.to_owned(),
            what: format!(
                "its section for stream id {id} names {:?}, the manifest {:?}",
                section.stream, stream.meta.name
            ),
        });
    }
    Ok(Some(stream))
}
