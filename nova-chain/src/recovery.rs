//! Recovery at start-up: before a star accepts appends it settles the chain it wrote last.
//!
//! From the checkpoint on, it reads each slot's footer in order and absorbs it, until the first
//! slot that holds nothing. There it writes a fence with a conditional create, so a previous
//! incarnation of this star that is somehow still running can never land (and so never
//! acknowledge) that slot. If the fence loses the race, the slot's new occupant is read and
//! settled like the others. Slots past the first gap were never acknowledged (acks go out in slot
//! order) and are left for collection. Finally the star moves to a fresh epoch, whose slot keys
//! nothing has touched.

use std::future::Future;
use std::sync::Arc;

use nova_core::catalog::{
    AbsorbBatch, Catalog, CatalogError, ChainState, IndexEntry, VersionedChain,
};
use nova_core::flight::{FenceInfo, FetchError, ObjectFooter, encode_fence, fetch_footer};
use nova_core::keys::{chain_prefix, parse_slot, slot_key};
use nova_core::object_store::{CreateOutcome, ObjectStore, StoreError};
use nova_core::record::now_ms;

use crate::config::RetryPolicy;
use crate::streams::StreamRegistry;

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
    #[error("the catalog refused recovery: {0}")]
    Catalog(CatalogError),
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
async fn patiently<T, E, F, Fut>(what: &str, retry: RetryPolicy, mut op: F) -> Result<T, E>
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
                tokio::time::sleep(delay).await;
            }
            Err(err) => return Err(err),
        }
    }
}

trait Retryable {
    fn outage(&self) -> bool;
}

impl Retryable for StoreError {
    fn outage(&self) -> bool {
        // Permanent errors (a missing bucket, refused credentials) are retried as well: the
        // operator can fix them without restarting, and giving up would lose nothing less.
        !matches!(
            self,
            StoreError::NotFound { .. } | StoreError::InvalidRange { .. }
        )
    }
}

impl Retryable for FetchError {
    fn outage(&self) -> bool {
        matches!(self, FetchError::Store(e) if e.outage())
    }
}

impl Retryable for CatalogError {
    fn outage(&self) -> bool {
        matches!(self, CatalogError::Metastore(_))
    }
}

pub async fn recover(
    star: &str,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
    streams: &StreamRegistry,
    retry: RetryPolicy,
) -> Result<Recovered, RecoveryError> {
    let current = patiently("reading the chain state", retry, || catalog.chain(star))
        .await
        .map_err(RecoveryError::Catalog)?;
    let Some(mut chain) = current else {
        let fresh = ChainState {
            epoch: 1,
            checkpoint: None,
        };
        let chain = patiently("creating the chain", retry, || {
            catalog.set_chain(star, None, fresh)
        })
        .await
        .map_err(RecoveryError::Catalog)?;
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
                chain = settle_flight(star, &key, flight, &chain, catalog, streams, retry).await?;
                settled += 1;
                next += 1;
            }
            Some(ObjectFooter::Fence(_)) => break,
            None => {
                let fence = encode_fence(&FenceInfo {
                    star: star.to_owned(),
                    epoch,
                    slot: next,
                    fenced_by: format!("{star}/{}", epoch + 1),
                    fenced_at_ms: now_ms(),
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
    let version = chain.version;
    let chain = patiently("starting a new epoch", retry, || {
        catalog.set_chain(star, Some(version), fresh)
    })
    .await
    .map_err(RecoveryError::Catalog)?;
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

async fn settle_flight(
    star: &str,
    key: &str,
    flight: nova_core::flight::FlightFooter,
    chain: &VersionedChain,
    catalog: &Catalog,
    streams: &StreamRegistry,
    retry: RetryPolicy,
) -> Result<VersionedChain, RecoveryError> {
    let mut batch = AbsorbBatch::default();
    let mut advances = Vec::new();
    for section in &flight.sections {
        // A stream deleted since this flight was written keeps no entries.
        let Some(stream) = streams.get_by_id(section.stream_id) else {
            continue;
        };
        let tail = stream.tail();
        if section.start_seq != tail {
            return Err(RecoveryError::Discontinuous {
                key: key.to_owned(),
                stream: stream.name().to_owned(),
                expected: tail,
                found: section.start_seq,
            });
        }
        batch.entries.push(IndexEntry {
            stream_id: section.stream_id,
            start_seq: section.start_seq,
            end_seq: section.end_seq,
            object_key: key.to_owned(),
            offset: section.offset,
            len: section.len,
            crc32c: section.crc32c,
        });
        let mut snapshot = stream.tail_snapshot();
        snapshot.tail_seq = section.end_seq;
        snapshot.stored_bytes += section.len;
        batch.tails.push((stream.id(), snapshot));
        advances.push((stream, section.end_seq, section.len));
    }
    let state = ChainState {
        epoch: chain.state.epoch,
        checkpoint: Some(flight.meta.slot),
    };
    let version = chain.version;
    let committed = patiently("absorbing a settled flight", retry, || {
        catalog.absorb(star, Some(version), state, batch.clone())
    })
    .await
    .map_err(RecoveryError::Catalog)?;
    for (stream, end, len) in advances {
        stream.set_next_seq(end);
        stream.advance_tail(end, len);
    }
    Ok(committed)
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
