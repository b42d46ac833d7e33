//! Rebuilding the catalog from the object store alone, for a star whose metastore is gone.
//!
//! The bucket holds everything needed: stream manifests (`streams/{star}/{id}`) name each
//! stream, its settings and whether it was deleted, and the chain's flights say which records
//! of which stream each section holds. Each epoch of the chain is read from slot 0 up to its
//! first gap or fence, exactly as recovery settles it (acknowledgements go out in slot order, so
//! nothing past a gap was ever acknowledged), and every section becomes an index entry. The
//! chain is then recorded where the star's next start settles and fences from, as after any
//! crash.
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
    Catalog, CatalogError, ChainState, IndexEntry, Occupancy, Restored, StorageClass, StreamMeta,
    StreamTail,
};
use nova_core::clock::Clock;
use nova_core::flight::{FetchError, ObjectFooter, fetch_footer};
use nova_core::keys::{
    chain_prefix, chain_root, parse_slot, parse_stream_manifest, slot_key, streams_prefix,
};
use nova_core::manifest::{ManifestError, StreamManifest};
use nova_core::object_store::{GetRange, ListPage, MAX_LIST_KEYS, ObjectStore, StoreError};

use crate::recovery::Retryable;

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
    #[error("{key} does not belong to this star's chain: {what}")]
    Foreign { key: String, what: String },
    #[error("writing the catalog: {0}")]
    Catalog(#[from] CatalogError),
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
    pub flights: u64,
    pub records: u64,
    /// Slots past a gap or fence: never acknowledged, left for collection.
    pub orphaned_slots: u64,
    /// The chain the star resumes from.
    pub chain: Option<ChainState>,
}

struct Stream {
    meta: StreamMeta,
    tail: StreamTail,
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
    let mut report = RebuildReport::default();
    let mut max_id = 0u64;
    let mut streams: BTreeMap<u64, Stream> = BTreeMap::new();
    let mut deleted: BTreeSet<u64> = BTreeSet::new();
    let mut names: HashMap<String, u64> = HashMap::new();
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
            max_id = max_id.max(id);
            if manifest.deleted {
                deleted.insert(id);
                continue;
            }
            // Two live manifests of one name: a create that failed half-way, or a stream whose
            // delete was never marked. The newer id is the stream the name belongs to.
            if let Some(&other) = names.get(&manifest.meta.name) {
                let older = other.min(id);
                deleted.insert(older);
                streams.remove(&older);
                if older == id {
                    continue;
                }
            }
            names.insert(manifest.meta.name.clone(), id);
            streams.insert(
                id,
                Stream {
                    meta: manifest.meta,
                    tail: StreamTail::default(),
                },
            );
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    report.deleted_streams = deleted.len() as u64;

    let root = chain_root(star);
    let mut slots_per_epoch: BTreeMap<u64, u64> = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = list_page(clock, store, &root, after.as_deref()).await?;
        for object in &page.objects {
            let Some(epoch) = object
                .key
                .strip_prefix(&root)
                .and_then(|rest| rest.split('/').next())
                .and_then(|epoch| epoch.parse::<u64>().ok())
            else {
                continue;
            };
            if parse_slot(&chain_prefix(star, epoch), &object.key).is_some() {
                *slots_per_epoch.entry(epoch).or_default() += 1;
            }
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }

    let mut pending: Vec<IndexEntry> = Vec::new();
    for (&epoch, &slots) in &slots_per_epoch {
        report.epochs += 1;
        let mut slot = 0u64;
        let mut last = None;
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
                max_id = max_id.max(id);
                if deleted.contains(&id) {
                    continue;
                }
                let stream = match streams.entry(id) {
                    std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                    std::collections::btree_map::Entry::Vacant(entry) => {
                        // No manifest: the flight's own name for it is all there is, unless a
                        // stream with a manifest holds that name.
                        if names.contains_key(&section.stream) {
                            continue;
                        }
                        names.insert(section.stream.clone(), id);
                        report.streams_without_manifest += 1;
                        entry.insert(Stream {
                            meta: StreamMeta {
                                id,
                                name: section.stream.clone(),
                                created_at_ms: meta.created_at_ms,
                                class: StorageClass::Standard,
                            },
                            tail: StreamTail::default(),
                        })
                    }
                };
                if stream.meta.name != section.stream {
                    return Err(RebuildError::Foreign {
                        key,
                        what: format!(
                            "its section for stream id {id} names {:?}, the manifest {:?}",
                            section.stream, stream.meta.name
                        ),
                    });
                }
                if section.start_seq != stream.tail.tail_seq {
                    return Err(RebuildError::Discontinuous {
                        key,
                        stream: stream.meta.name.clone(),
                        expected: stream.tail.tail_seq,
                        found: section.start_seq,
                    });
                }
                stream.tail.tail_seq = section.end_seq;
                stream.tail.stored_bytes += section.len;
                report.records += section.end_seq - section.start_seq;
                pending.push(IndexEntry {
                    stream_id: id,
                    start_seq: section.start_seq,
                    end_seq: section.end_seq,
                    object_key: key.clone(),
                    offset: section.offset,
                    len: section.len,
                    crc32c: section.crc32c,
                });
            }
            if pending.len() >= ENTRY_BATCH {
                catalog.restore_entries(&pending).await?;
                pending.clear();
            }
            report.flights += 1;
            last = Some(slot);
            slot += 1;
        }
        report.orphaned_slots += slots.saturating_sub(slot + fenced_by.is_some() as u64);
        report.chain = Some(match fenced_by {
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
    }
    catalog.restore_entries(&pending).await?;
    report.streams = streams.len() as u64;
    let restored = Restored {
        streams: streams.into_values().map(|s| (s.meta, s.tail)).collect(),
        next_stream_id: max_id + 1,
        chain: report.chain.map(|state| (star.to_owned(), state)),
    };
    catalog.restore_streams(&restored).await?;
    Ok(report)
}
