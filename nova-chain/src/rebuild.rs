//! Rebuilding the catalog from the object store alone, for a star whose metastore is gone.
//!
//! The bucket holds everything needed: stream manifests (`streams/{id}`) name each stream, its
//! settings and whether it was deleted, and the chain's flights say which records of which
//! stream each section holds. Each epoch of the chain is read from slot 0 up to its first gap
//! or fence, exactly as recovery settles it (acknowledgements go out in slot order, so nothing
//! past a gap was ever acknowledged), and every section becomes an index entry. The chain is
//! then recorded at its last epoch's last settled slot, and the star's next start settles and
//! fences from there as after any crash.
//!
//! Memory stays bounded: manifests and tails are kept per stream, index entries are written
//! in small batches as the chain is read, and only the set of epochs is kept from the listing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use nova_core::catalog::{
    Catalog, CatalogError, ChainState, IndexEntry, Restored, StorageClass, StreamMeta, StreamTail,
};
use nova_core::flight::{FetchError, ObjectFooter, fetch_footer};
use nova_core::keys::{
    STREAMS_PREFIX, chain_prefix, chain_root, parse_slot, parse_stream_manifest, slot_key,
};
use nova_core::manifest::{ManifestError, StreamManifest};
use nova_core::object_store::{GetRange, MAX_LIST_KEYS, ObjectStore, StoreError};

/// Index entries written per batch while the chain is read.
const ENTRY_BATCH: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error(
        "the metastore already holds a catalog; a rebuild only fills an empty one (move the \\
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
        "flight {key} does not continue stream {stream:?}: its section starts at {found}, the \\
         records before it end at {expected}"
    )]
    Discontinuous {
        key: String,
        stream: String,
        expected: u64,
        found: u64,
    },
    #[error("{key} is not a flight of this chain: {what}")]
    Foreign { key: String, what: String },
    #[error("writing the catalog: {0}")]
    Catalog(#[from] CatalogError),
}

/// What a rebuild restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Streams restored, with records or without.
    pub streams: u64,
    /// Streams whose manifests say they were deleted: not restored, their records skipped.
    pub deleted_streams: u64,
    /// Streams found in flights without a manifest (written before manifests existed),
    /// restored under the name their flights give.
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

pub async fn rebuild_catalog(
    star: &str,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
) -> Result<RebuildReport, RebuildError> {
    if !catalog.is_empty().await? {
        return Err(RebuildError::NotEmpty);
    }
    let mut report = RebuildReport::default();
    let mut max_id = 0u64;
    // Live streams by id; deleted ids are remembered so their sections are skipped.
    let mut streams: BTreeMap<u64, Stream> = BTreeMap::new();
    let mut deleted: BTreeSet<u64> = BTreeSet::new();
    for key in list_all(store.as_ref(), STREAMS_PREFIX).await? {
        let Some(id) = parse_stream_manifest(&key) else {
            continue;
        };
        let bytes = store.get(&key, GetRange::All).await?.bytes;
        let manifest = StreamManifest::decode(&bytes).map_err(|source| RebuildError::Manifest {
            key: key.clone(),
            source,
        })?;
        max_id = max_id.max(id);
        if manifest.deleted {
            deleted.insert(id);
        } else {
            streams.insert(
                id,
                Stream {
                    meta: manifest.meta,
                    tail: StreamTail::default(),
                },
            );
        }
    }
    report.deleted_streams = deleted.len() as u64;

    let root = chain_root(star);
    let mut slots_per_epoch: BTreeMap<u64, u64> = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list(&root, after.as_deref(), MAX_LIST_KEYS).await?;
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

    let mut names: HashMap<String, u64> = streams
        .iter()
        .map(|(id, s)| (s.meta.name.clone(), *id))
        .collect();
    let mut pending: Vec<IndexEntry> = Vec::new();
    for (&epoch, &slots) in &slots_per_epoch {
        report.epochs += 1;
        let mut settled = 0u64;
        let mut last = None;
        let mut fenced = false;
        loop {
            let key = slot_key(star, epoch, settled);
            let footer = match fetch_footer(store.as_ref(), &key).await {
                Ok(footer) => footer,
                Err(FetchError::Store(StoreError::NotFound { .. })) => break,
                Err(source) => return Err(RebuildError::Flight { key, source }),
            };
            let flight = match footer {
                ObjectFooter::Fence(_) => {
                    fenced = true;
                    break;
                }
                ObjectFooter::Flight(flight) => flight,
            };
            let meta = &flight.meta;
            if (meta.star.as_str(), meta.epoch, meta.slot) != (star, epoch, settled) {
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
                        // Written before manifests: the flight's own name for it is all there
                        // is, unless a stream with a manifest holds that name now.
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
            last = Some(settled);
            settled += 1;
        }
        report.orphaned_slots += slots.saturating_sub(settled + fenced as u64);
        report.chain = Some(ChainState {
            epoch,
            checkpoint: last,
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

/// Every key under `prefix` (used for manifests: one per stream ever created).
async fn list_all(store: &dyn ObjectStore, prefix: &str) -> Result<Vec<String>, StoreError> {
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list(prefix, after.as_deref(), MAX_LIST_KEYS).await?;
        keys.extend(page.objects.into_iter().map(|o| o.key));
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return Ok(keys),
        }
    }
}
