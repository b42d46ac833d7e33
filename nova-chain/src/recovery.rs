//! Recovery at start-up: before a star accepts appends it settles the chain it wrote last.
//!
//! From the checkpoint on, it reads each slot's footer in order and absorbs it, until the first
//! slot that holds nothing. There it writes a fence with a conditional create, so a previous
//! incarnation of this star that is somehow still running can never land (and so never
//! acknowledge) that slot. If the fence loses the race, the slot's new occupant is read and
//! settled like the others. Slots past the first gap were never acknowledged (acks go out in slot
//! order) and are left for collection. Finally the star moves to a fresh epoch, whose slot keys
//! nothing has touched.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use nova_core::catalog::{
    AbsorbBatch, Catalog, CatalogError, ChainState, IndexEntry, StreamTail, VersionedChain,
};
use nova_core::flight::{FenceInfo, FetchError, ObjectFooter, encode_fence, fetch_footer};
use nova_core::keys::{chain_prefix, chain_root, parse_slot, slot_key};
use nova_core::object_store::{
    CreateOutcome, ObjectStore, ProbeError, StoreError, probe_conditional_create,
};

use crate::config::{Backoff, Leaders};
use crate::streams::{StreamRegistry, StreamState};

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error(
        "flight {key} is unreadable, refusing to start rather than lose or invent records: {source}"
    )]
    Corrupt { key: String, source: FetchError },
    #[error(
        "flight {key} does not continue stream {stream}: its section starts at {found}, the stream's tail is {expected}"
    )]
    Discontinuous {
        key: String,
        stream: String,
        expected: u64,
        found: u64,
    },
    /// The object at a slot of this star's chain was not written there by this chain: two
    /// stars share a `--star-id` on one bucket, or the metastore does not belong to the bucket.
    #[error(
        "{key} does not belong to this star's chain: {what}. Refusing to start rather than mix \
         another chain's records into these streams: give each star its own --star-id, or point \
         novad at the metastore that belongs to this bucket"
    )]
    Foreign { key: String, what: String },
    #[error("{0}")]
    Store(ProbeError),
    #[error(
        "the object store already holds chain objects of star {star:?} ({found}, in {store}), \
         but the metastore knows no chain for it: they were written by a star whose metastore \
         is gone, or by another star with the same --star-id. Refusing to start beside data this \
         star does not know. To adopt the data, run `novad --rebuild-catalog` with the same \
         flags, then start novad again; to start afresh, give this star another --star-id (or \
         another bucket or --s3-prefix)"
    )]
    UnknownChain {
        star: String,
        found: String,
        store: String,
    },
    #[error("the catalog refused recovery: {0}")]
    Catalog(CatalogError),
    #[error(
        "star {star:?} has written an express chain, and no express zone buckets are configured \
         now: its zones may hold acknowledged records that nothing else has. Start novad with \
         the same --s3-express-zone flags as before"
    )]
    ExpressZonesMissing { star: String },
    #[error(
        "the bucket holds star {star:?}'s express chain up to express epoch {express_epoch}, \
         beyond the catalog's chain (epoch {chain_epoch}): the metastore does not belong to \
         this bucket, or lost its catalog. Refusing to start beside data it does not know: run \
         `novad --rebuild-catalog` with the same flags, then start novad again"
    )]
    ExpressAhead {
        star: String,
        express_epoch: u64,
        chain_epoch: u64,
    },
    #[error("reading the express checkpoint's copy in the bucket: {0}")]
    ExpressCheckpointCopy(String),
    #[error("settling the express chain: {0}")]
    Express(#[from] crate::express::WalkError),
}

/// What recovery settled.
#[derive(Debug, Clone)]
pub struct Recovered {
    /// The chain state the star writes from: a fresh epoch with no checkpoint.
    pub chain: VersionedChain,
    pub settled_flights: u64,
    pub orphaned_slots: u64,
}

/// Retries an operation whose failures are outages (object store or metastore unreachable)
/// until it succeeds, logging clearly so an operator sees why the star is not up yet.
pub(crate) async fn patiently<T, E, F, Fut>(what: &str, retry: &Backoff, mut op: F) -> Result<T, E>
where
    E: std::fmt::Display + Retryable,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match op().await {
            Ok(value) => {
                if attempt > 1 {
                    tracing::info!(attempts = attempt, "recovery: {what} succeeded");
                }
                return Ok(value);
            }
            Err(err) if err.outage() => {
                let delay = retry.delay(attempt);
                tracing::error!(
                    attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    "recovery: {what} failed; novad keeps retrying and accepts no appends until it succeeds: {err}"
                );
                retry.clock.sleep(delay).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Commits a chain move through outages. A retry that meets a conflict after an attempt failed
/// checks whether that attempt landed before concluding that another writer owns the chain.
pub(crate) async fn commit_patiently(
    what: &str,
    retry: &Backoff,
    catalog: &Catalog,
    star: &str,
    expected: Option<u64>,
    state: ChainState,
    batch: AbsorbBatch,
) -> Result<VersionedChain, RecoveryError> {
    let failed_before = std::sync::atomic::AtomicBool::new(false);
    patiently(what, retry, || async {
        match catalog.absorb(star, expected, state, batch.clone()).await {
            Err(CatalogError::Conflict(reason))
                if failed_before.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                match catalog.chain_if_at(star, state).await? {
                    Some(committed) => Ok(committed),
                    None => Err(CatalogError::Conflict(reason)),
                }
            }
            Err(err) => {
                failed_before.store(true, std::sync::atomic::Ordering::Relaxed);
                Err(err)
            }
            Ok(committed) => Ok(committed),
        }
    })
    .await
    .map_err(RecoveryError::Catalog)
}

pub(crate) trait Retryable {
    fn outage(&self) -> bool;
}

impl Retryable for StoreError {
    fn outage(&self) -> bool {
        // A permanent error at start-up (a missing bucket, refused credentials) fails the start
        // with its message: a star that came up anyway would only block every append.
        self.is_retryable()
    }
}

impl Retryable for ProbeError {
    fn outage(&self) -> bool {
        self.is_retryable()
    }
}

impl Retryable for crate::express::marker::MarkerError {
    fn outage(&self) -> bool {
        self.is_retryable()
    }
}

impl Retryable for FetchError {
    fn outage(&self) -> bool {
        matches!(self, FetchError::Store(e) if e.outage())
    }
}

impl Retryable for CatalogError {
    fn outage(&self) -> bool {
        // A transaction over the metastore's limit fails the same way every time.
        matches!(self, CatalogError::Metastore(e) if !matches!(e, nova_core::metastore::MetastoreError::TooLarge { .. }))
    }
}

impl Retryable for crate::streams::LoadError {
    fn outage(&self) -> bool {
        match self {
            // Only an unreachable metastore is waited out: a corrupt or unwritable one fails
            // the start with its error.
            crate::streams::LoadError::Catalog(CatalogError::Metastore(e)) => {
                matches!(e, nova_core::metastore::MetastoreError::Unavailable(_))
            }
            crate::streams::LoadError::Catalog(_) => false,
            crate::streams::LoadError::Manifests(e) => e.outage(),
            crate::streams::LoadError::RestoreInterrupted => false,
        }
    }
}

/// Writes `star`'s chain again as it is, so that every commit an earlier writer already sent
/// for it fails from here on: the last absorb of an incarnation killed while the metastore was
/// stalled can still be queued there, as can a paused predecessor's in a takeover, and it
/// applies when it gets its turn. Called before the streams' tails are loaded, so the tails
/// and the chain that recovery then walks are of one moment. Without it, such an absorb landing
/// between the two left the tails older than the checkpoint, and the start failed on the next
/// flight (found by the fleet simulation, seeds 5475 and 6685).
pub(crate) async fn claim_chain(
    star: &str,
    catalog: &Catalog,
    retry: &Backoff,
) -> Result<(), RecoveryError> {
    let mut moved = 0u32;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let current = patiently("reading the chain state", retry, || catalog.chain(star))
            .await
            .map_err(RecoveryError::Catalog)?;
        // No chain yet: recovery creates it, comparing that it is missing.
        let Some(chain) = current else {
            return Ok(());
        };
        match catalog.claim_chain(star, chain).await {
            Ok(Some(_)) => return Ok(()),
            // A late commit landed between the read and the claim: read again and claim
            // again. A writer that keeps moving the chain is another live process.
            Ok(None) => {
                moved += 1;
                tracing::warn!(
                    attempt,
                    "recovery: the chain moved while this star claimed it (an earlier \
                     incarnation's commit landing late); claiming it again"
                );
                if moved >= CLAIM_ATTEMPTS {
                    return Err(RecoveryError::Catalog(CatalogError::Conflict(format!(
                        "the chain of {star} moved {moved} times while this star claimed it: \
                         another process is writing it"
                    ))));
                }
            }
            Err(err) if err.outage() => {
                tracing::warn!(
                    attempt,
                    "recovery: claiming the chain failed, retrying: {err}"
                );
            }
            Err(err) => return Err(RecoveryError::Catalog(err)),
        }
        retry.clock.sleep(retry.delay(attempt)).await;
    }
}

/// Claims of a chain that another commit may beat before the start gives up: late commits of
/// earlier incarnations are few, a live writer never stops.
const CLAIM_ATTEMPTS: u32 = 10;

pub async fn recover(
    star: &str,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
    streams: &StreamRegistry,
    retry: &Backoff,
    led: &LeaderCheck<'_>,
) -> Result<Recovered, RecoveryError> {
    let current = patiently("reading the chain state", retry, || catalog.chain(star))
        .await
        .map_err(RecoveryError::Catalog)?;
    let Some(mut chain) = current else {
        check_no_chain_objects(star, store, retry).await?;
        let fresh = ChainState {
            epoch: 1,
            checkpoint: None,
        };
        let chain = commit_patiently(
            "creating the chain",
            retry,
            catalog,
            star,
            None,
            fresh,
            AbsorbBatch::default(),
        )
        .await?;
        return Ok(Recovered {
            chain,
            settled_flights: 0,
            orphaned_slots: 0,
        });
    };
    let epoch = chain.state.epoch;
    let mut next = chain.state.checkpoint.map_or(0, |slot| slot + 1);
    let mut settled = 0u64;
    loop {
        let key = slot_key(star, epoch, next);
        let footer = patiently("reading a chain slot", retry, || async {
            match fetch_footer(store.as_ref(), &key).await {
                Ok(footer) => Ok(Some(footer)),
                Err(FetchError::Store(StoreError::NotFound { .. })) => Ok(None),
                Err(err) => Err(err),
            }
        })
        .await
        .map_err(|source| RecoveryError::Corrupt {
            key: key.clone(),
            source,
        })?;
        match footer {
            Some(ObjectFooter::Flight(flight)) => {
                check_written_here(&key, star, epoch, next, &flight.meta)?;
                // A flight of the Standard chain carries no express checkpoint in its object;
                // the express walk that follows finds what it carried already in the tails.
                let settle = Settle {
                    star,
                    catalog,
                    streams,
                    retry,
                    led,
                };
                chain = settle.flight(&key, flight, &chain, None).await?;
                settled += 1;
                next += 1;
            }
            Some(ObjectFooter::Fence(fence)) => {
                if (fence.star.as_str(), fence.epoch, fence.slot) != (star, epoch, next) {
                    return Err(RecoveryError::Foreign {
                        key,
                        what: format!(
                            "it is a fence for slot {} of epoch {} of star {:?}",
                            fence.slot, fence.epoch, fence.star
                        ),
                    });
                }
                break;
            }
            None => {
                let fence = encode_fence(&FenceInfo {
                    star: star.to_owned(),
                    epoch,
                    slot: next,
                    fenced_by: format!("{star}/{}", epoch + 1),
                    fenced_at_ms: retry.clock.unix_ms(),
                });
                let outcome = patiently("fencing the previous chain", retry, || {
                    store.put_if_absent(&key, fence.clone().into())
                })
                .await
                .map_err(|e| RecoveryError::Corrupt {
                    key: key.clone(),
                    source: e.into(),
                })?;
                match outcome {
                    CreateOutcome::Created => break,
                    // Someone landed this slot just now: read and settle it on the next pass.
                    CreateOutcome::AlreadyExists => continue,
                }
            }
        }
    }
    let orphaned_slots = count_orphans(store, star, epoch, next).await;
    if orphaned_slots > 0 {
        tracing::warn!(
            epoch,
            fenced_at = next,
            orphaned_slots,
            "slots past the fence were never acknowledged; they are left for collection"
        );
    }
    let fresh = ChainState {
        epoch: epoch + 1,
        checkpoint: None,
    };
    let chain = commit_patiently(
        "starting a new epoch",
        retry,
        catalog,
        star,
        Some(chain.version),
        fresh,
        AbsorbBatch::default(),
    )
    .await?;
    if settled > 0 {
        tracing::info!(
            settled,
            epoch,
            "recovery settled acknowledged flights into the index"
        );
    }
    Ok(Recovered {
        chain,
        settled_flights: settled,
        orphaned_slots,
    })
}

/// Which streams' records in a chain being settled belong in the index: always outside a
/// fleet; in one, unless the stream's leader record names another star (see [`Leaders`]), or
/// another writer's records already fill the index where a section starts. Decided once per
/// stream for the whole settling (the Standard walk and the Express walk after it), so an
/// answer that changes meanwhile (a record cleared) cannot leave a stream's sections half
/// settled, with a gap. Holds one answer per stream of the catalog at most.
pub struct LeaderCheck<'a> {
    star: &'a str,
    leaders: Option<&'a dyn Leaders>,
    retry: &'a Backoff,
    answers: parking_lot::Mutex<HashMap<u64, bool>>,
}

impl<'a> LeaderCheck<'a> {
    /// For settling `star`'s chain, asking `leaders` (none outside a fleet).
    pub fn new(star: &'a str, leaders: Option<&'a dyn Leaders>, retry: &'a Backoff) -> Self {
        Self {
            star,
            leaders,
            retry,
            answers: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Whether `stream`'s records in the object at `key` belong in the index.
    pub(crate) async fn led_here(
        &self,
        key: &str,
        stream: &StreamState,
    ) -> Result<bool, RecoveryError> {
        let Some(leaders) = self.leaders else {
            return Ok(true);
        };
        if let Some(led) = self.answers.lock().get(&stream.id()) {
            return Ok(*led);
        }
        let leader = patiently("reading a stream's leader record", self.retry, || async {
            leaders
                .leader(stream.name())
                .await
                .map_err(CatalogError::Metastore)
        })
        .await
        .map_err(RecoveryError::Catalog)?;
        let led = match leader {
            Some(other) if other != self.star => {
                tracing::error!(
                    key,
                    stream = stream.name(),
                    leader = other,
                    "the chain holds records of a stream another star leads, written after its \
                     leadership moved: they are left out of the index"
                );
                false
            }
            _ => true,
        };
        self.answers.lock().insert(stream.id(), led);
        Ok(led)
    }

    /// Whether a section of `stream` starting at `start_seq`, below the index's tail
    /// `tail_seq`, is a second writer's leftover to leave out rather than a broken chain: in a
    /// fleet, the records already there were written by the star the stream was led by (a
    /// record naming it may have been cleared since). The stream's records in this chain are
    /// left out from here on. Outside a fleet nobody else writes the index, and the chain is
    /// broken.
    pub(crate) fn overwritten(
        &self,
        key: &str,
        stream: &StreamState,
        start_seq: u64,
        tail_seq: u64,
    ) -> bool {
        if self.leaders.is_none() || start_seq >= tail_seq {
            return false;
        }
        tracing::error!(
            key,
            stream = stream.name(),
            start_seq,
            tail_seq,
            "the chain holds records of a stream whose index another writer filled past their \
             start: they are left out of the index"
        );
        self.answers.lock().insert(stream.id(), false);
        true
    }
}

/// What settling a chain's flights needs: whose chain, the catalog and streams it settles into,
/// the retry policy, and which streams' records belong in the index.
pub(crate) struct Settle<'a> {
    pub star: &'a str,
    pub catalog: &'a Catalog,
    pub streams: &'a StreamRegistry,
    pub retry: &'a Backoff,
    pub led: &'a LeaderCheck<'a>,
}

impl Settle<'_> {
    /// Absorbs one landed flight of the chain into the index, moving the chain's checkpoint to
    /// its slot (and the express checkpoint to `express`, for a flight carrying bundles).
    pub(crate) async fn flight(
        &self,
        key: &str,
        flight: nova_core::flight::FlightFooter,
        chain: &VersionedChain,
        express: Option<nova_core::catalog::ExpressCheckpoint>,
    ) -> Result<VersionedChain, RecoveryError> {
        let Self {
            star,
            catalog,
            streams,
            retry,
            ..
        } = *self;
        let mut batch = AbsorbBatch {
            express,
            ..AbsorbBatch::default()
        };
        // Each stream's tail as this flight moves it: a stream may own several sections of one
        // flight (one per MiB), and each continues the one before it, not the absorbed tail.
        let mut moved: Vec<(Arc<StreamState>, StreamTail)> = Vec::new();
        for section in &flight.sections {
            // A stream deleted since this flight was written keeps no entries.
            let Some(stream) = streams.get_by_id(section.stream_id) else {
                continue;
            };
            if !self.led.led_here(key, &stream).await? {
                continue;
            }
            if stream.name() != section.stream {
                return Err(RecoveryError::Foreign {
                    key: key.to_owned(),
                    what: format!(
                        "its section for stream id {} names stream {:?}, but this catalog's stream {} is {:?}",
                        section.stream_id,
                        section.stream,
                        section.stream_id,
                        stream.name()
                    ),
                });
            }
            let index = match moved.iter().position(|(s, _)| s.id() == stream.id()) {
                Some(index) => index,
                None => {
                    let tail = stream.tail_snapshot();
                    // Checked before the stream's tail is in the batch, which would write
                    // back the one read.
                    if self
                        .led
                        .overwritten(key, &stream, section.start_seq, tail.tail_seq)
                    {
                        continue;
                    }
                    moved.push((stream.clone(), tail));
                    moved.len() - 1
                }
            };
            let tail = &mut moved[index].1;
            if section.start_seq != tail.tail_seq {
                return Err(RecoveryError::Discontinuous {
                    key: key.to_owned(),
                    stream: stream.name().to_owned(),
                    expected: tail.tail_seq,
                    found: section.start_seq,
                });
            }
            tail.tail_seq = section.end_seq;
            tail.stored_bytes += section.len;
            batch.entries.push(IndexEntry::for_section(
                key,
                section,
                flight.meta.created_at_ms,
            ));
        }
        batch.tails = moved.iter().map(|(s, tail)| (s.id(), *tail)).collect();
        // A flight written before flights were capped may move more streams than one transaction
        // holds; recovery is the chain's only writer now, so its tails may go ahead too.
        batch.spill_tails = true;
        let state = ChainState {
            epoch: chain.state.epoch,
            checkpoint: Some(flight.meta.slot),
        };
        let committed = commit_patiently(
            "absorbing a settled flight",
            retry,
            catalog,
            star,
            Some(chain.version),
            state,
            batch,
        )
        .await?;
        for (stream, tail) in moved {
            let added = tail.stored_bytes - stream.stored_bytes();
            stream.set_next_seq(tail.tail_seq);
            stream.advance_tail(tail.tail_seq, added);
        }
        Ok(committed)
    }
}

/// Checks that the store is usable for a chain: reachable, accepting writes, and making
/// conditional creates exclusive. Outages are waited out; anything else fails the start.
pub async fn probe_store(
    star: &str,
    store: &Arc<dyn ObjectStore>,
    retry: &Backoff,
) -> Result<(), RecoveryError> {
    // A fresh key for every attempt: an earlier attempt's DELETE may still land late, and
    // landing between a retry's two creates it would make the store look non-exclusive.
    patiently("probing the object store", retry, || async {
        let key = format!(
            "probe/{star}/{}-{:016x}",
            retry.clock.unix_ms(),
            retry.entropy.next_u64()
        );
        probe_conditional_create(store.as_ref(), &key).await
    })
    .await
    .map_err(RecoveryError::Store)
}

/// A chain that is new to the metastore must be new to the store too: objects under its prefix
/// mean the metastore lost (or never had) what the bucket holds.
async fn check_no_chain_objects(
    star: &str,
    store: &Arc<dyn ObjectStore>,
    retry: &Backoff,
) -> Result<(), RecoveryError> {
    let prefix = chain_root(star);
    let page = patiently("listing the chain's prefix", retry, || {
        store.list(&prefix, None, 1)
    })
    .await
    .map_err(|e| RecoveryError::Store(ProbeError::Refused(e)))?;
    match page.objects.first() {
        None => Ok(()),
        Some(found) => Err(RecoveryError::UnknownChain {
            star: star.to_owned(),
            found: found.key.clone(),
            store: store.describe(),
        }),
    }
}

/// A flight names the chain slot it was written for; settling one found anywhere else would
/// adopt another chain's records.
fn check_written_here(
    key: &str,
    star: &str,
    epoch: u64,
    slot: u64,
    meta: &nova_core::flight::FlightMeta,
) -> Result<(), RecoveryError> {
    if meta.star == star && meta.epoch == epoch && meta.slot == slot {
        return Ok(());
    }
    Err(RecoveryError::Foreign {
        key: key.to_owned(),
        what: format!(
            "its footer says it is slot {} of epoch {} of star {:?}",
            meta.slot, meta.epoch, meta.star
        ),
    })
}

/// Slots past the fence, for the log. Best effort: a listing failure only loses the count.
async fn count_orphans(
    store: &Arc<dyn ObjectStore>,
    star: &str,
    epoch: u64,
    fenced_at: u64,
) -> u64 {
    let prefix = chain_prefix(star, epoch);
    let after = slot_key(star, epoch, fenced_at);
    match store.list(&prefix, Some(&after), 1000).await {
        Ok(page) => page
            .objects
            .iter()
            .filter(|o| parse_slot(&prefix, &o.key).is_some())
            .count() as u64,
        Err(_) => 0,
    }
}
