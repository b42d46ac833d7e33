//! The absorb: records landed flights in the index, in slot order, moving the chain's checkpoint
//! in the same metastore transaction. Flights that queued up while a commit ran are committed
//! together, so a slow metastore costs fewer, larger transactions rather than a longer queue.
//! Each flight's backlog permit returns when its commit does.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use nova_core::catalog::{
    AbsorbBatch, CatalogError, ChainState, ExpressCheckpoint, StreamTail, VersionedChain,
};
use nova_core::metastore::Compare;

use crate::resolver::Landed;
use crate::shared::Shared;

/// The most flights one absorb transaction carries.
const MAX_GROUP: usize = 64;

/// Deleted streams' tails one absorb removes; more wait for the next.
const MAX_FORGET: usize = 8;

/// What a group of flights costs in the absorb transaction, kept up as flights join it: one
/// put per index entry and per stream whose tail moves.
#[derive(Default)]
struct GroupCost {
    entries: usize,
    streams: std::collections::HashSet<u64>,
}

impl GroupCost {
    /// The group's operations if `flight` joined it.
    fn with(&self, flight: &Landed) -> usize {
        let mut new_streams: Vec<u64> = flight
            .entries
            .iter()
            .map(|e| e.stream_id)
            .filter(|id| !self.streams.contains(id))
            .collect();
        new_streams.sort_unstable();
        new_streams.dedup();
        self.entries + flight.entries.len() + self.streams.len() + new_streams.len()
    }

    fn add(&mut self, flight: &Landed) {
        self.entries += flight.entries.len();
        self.streams
            .extend(flight.entries.iter().map(|e| e.stream_id));
    }
}

pub(crate) async fn run_absorber(
    shared: Arc<Shared>,
    mut landed: mpsc::Receiver<Landed>,
    mut chain: VersionedChain,
    mut tails: HashMap<u64, StreamTail>,
) {
    // Room in one transaction for entries and tails, beside the chain move, the forgets and
    // the express checkpoint (which must land with the entries of the records it carries).
    let express_move = usize::from(shared.config.express.is_some());
    let room = shared
        .catalog
        .store()
        .capabilities()
        .max_txn_ops
        .saturating_sub(1 + MAX_FORGET + express_move);
    // A flight that did not fit the previous group starts the next.
    let mut carried: Option<Landed> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match landed.recv().await {
                Some(first) => first,
                None => break,
            },
        };
        let mut cost = GroupCost::default();
        cost.add(&first);
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match landed.try_recv() {
                Ok(next) if cost.with(&next) > room => {
                    carried = Some(next);
                    break;
                }
                Ok(next) => {
                    cost.add(&next);
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        if shared.fenced().is_some() {
            // The chain is someone else's now; the successor settles these slots.
            continue;
        }
        rebase_moved_streams(&shared, &group, &mut tails).await;
        let last_slot = group.last().map(|l| l.slot).unwrap_or_default();
        let mut batch = AbsorbBatch::default();
        // Each entry's leadership (its flight's guard for its stream), beside `batch.entries`.
        let mut led_under = Vec::new();
        let mut touched = HashMap::new();
        for flight in &group {
            for (entry, guard) in flight.entries.iter().zip(&flight.led_under) {
                // A deleted stream's records need no index: nothing can name them any more.
                if shared.streams.get_by_id(entry.stream_id).is_none() {
                    continue;
                }
                let tail = tails.entry(entry.stream_id).or_default();
                tail.tail_seq = entry.end_seq;
                tail.stored_bytes += entry.len;
                touched.insert(entry.stream_id, *tail);
                batch.entries.push(entry.clone());
                // Each stream's records hold only under the leadership they were sequenced
                // under; the transaction compares each such leadership once.
                if let Some(guard) = guard
                    && !batch
                        .guards
                        .iter()
                        .any(|(id, g)| *id == entry.stream_id && g == guard)
                {
                    batch.guards.push((entry.stream_id, guard.clone()));
                }
                led_under.push(guard.clone());
            }
        }
        batch.tails = touched.into_iter().collect();
        let carried = group.iter().filter_map(|l| l.express).next_back();
        batch.express = carried.map(|(epoch, slot)| ExpressCheckpoint {
            epoch,
            through: Some(slot),
        });
        // Forget deleted streams, and remove the tail key an absorb racing the delete may have
        // written back after it.
        for id in shared.streams.take_deleted(MAX_FORGET) {
            tails.remove(&id);
            batch.forget.push(id);
        }
        let state = ChainState {
            epoch: shared.epoch,
            checkpoint: Some(last_slot),
        };
        let batch_express = batch.express;
        let absorb = Absorb {
            batch,
            led_under,
            state,
        };
        let Some(committed) = commit_or_depose(&shared, &chain, absorb, &mut tails).await else {
            // Fenced or abandoned: these flights stay in the chain for the next owner.
            continue;
        };
        chain = committed;
        if let Some(checkpoint) = batch_express {
            // The zone copies at or below it may go now.
            shared.express_carried.send_replace(Some(checkpoint));
        }
        shared.pending.absorbed_through(last_slot);
        shared.metrics.flights_absorbed.inc_by(group.len() as u64);
        // Dropping the group returns its backlog permits.
    }
}

/// Takes the absorbed tail from the catalog for each stream whose records this chain does not
/// continue: in a fleet, a stream this star leads anew (created elsewhere, or led by another
/// star since this star last did) continues from what its previous leader absorbed. Without
/// this the stored bytes written back would count only this star's share.
async fn rebase_moved_streams(
    shared: &Shared,
    group: &[Landed],
    tails: &mut HashMap<u64, StreamTail>,
) {
    let mut seen = std::collections::HashSet::new();
    for entry in group.iter().flat_map(|l| l.entries.iter()) {
        if !seen.insert(entry.stream_id) {
            continue;
        }
        let continues = tails
            .get(&entry.stream_id)
            .is_some_and(|t| t.tail_seq == entry.start_seq);
        if continues || entry.start_seq == 0 {
            continue;
        }
        match shared.absorb_catalog.stream_tail(entry.stream_id).await {
            Ok(tail) => {
                tails.insert(entry.stream_id, tail);
            }
            // The tail is then counted from what this star knew; its sequence is exact either
            // way (each entry sets it).
            Err(err) => tracing::warn!(
                stream_id = entry.stream_id,
                "reading a stream's absorbed tail to continue it: {err}"
            ),
        }
    }
}

/// One absorb transaction being committed: the batch, the leadership each of its entries was
/// sequenced under, and the chain state it moves to.
struct Absorb {
    batch: AbsorbBatch,
    led_under: Vec<Option<Compare>>,
    state: ChainState,
}

/// Commits one absorb (see `commit`). Records sequenced under a leadership that has since
/// moved to another star are left out of the index and the rest is committed without them; if
/// that leadership is the one the star leads the stream under now, the stream is deposed: its
/// appends are refused from now on and what this star holds of it in memory is dropped.
/// Records it acknowledged under that leadership are lost to the index: a second writer was
/// detected, not trusted away, and the error log and `nova_fleet_deposed_streams_total` say
/// so. (A stream deleted meanwhile loses its leader record the same way, and quietly.)
async fn commit_or_depose(
    shared: &Shared,
    chain: &VersionedChain,
    mut absorb: Absorb,
    tails: &mut HashMap<u64, StreamTail>,
) -> Option<VersionedChain> {
    loop {
        let failed = match commit(shared, chain, absorb.state, absorb.batch.clone()).await? {
            Committed::Landed(chain) => return Some(chain),
            Committed::Deposed(failed) => failed,
        };
        let mut affected = Vec::new();
        for (id, guard) in &failed {
            let stream = shared.streams.get_by_id(*id).filter(|s| !s.is_deleted());
            let dropped: Vec<(u64, u64)> = absorb
                .batch
                .entries
                .iter()
                .zip(&absorb.led_under)
                .filter(|(e, g)| e.stream_id == *id && g.as_ref() == Some(guard))
                .map(|(e, _)| (e.start_seq, e.end_seq))
                .collect();
            if let Some(stream) = &stream {
                if stream.leadership().as_ref() == Some(guard) {
                    stream.depose();
                    // Reads must not find its records in memory either.
                    shared.tail_cache.forget_stream(*id);
                }
                shared.metrics.deposed_streams.inc();
                tracing::error!(
                    stream = stream.name(),
                    stream_id = id,
                    seqs = ?dropped,
                    "another star took this stream's leadership while this star held records \
                     of it: they are left out of the index, and this star stops leading the \
                     stream"
                );
            }
            affected.push(*id);
        }
        // Keep what was sequenced under a leadership that still holds.
        let mut kept = absorb.led_under.iter();
        absorb.batch.entries.retain(|entry| {
            let guard = kept.next().cloned().flatten();
            !failed
                .iter()
                .any(|(id, g)| *id == entry.stream_id && guard.as_ref() == Some(g))
        });
        absorb
            .led_under
            .retain(|guard| !failed.iter().any(|(_, g)| guard.as_ref() == Some(g)));
        absorb.batch.guards.retain(|guard| !failed.contains(guard));
        recount_tails(shared, &mut absorb.batch, &affected, tails).await?;
    }
}

/// Recomputes the tails of `streams` in `batch` from the entries it still holds, on top of
/// each stream's absorbed tail in the catalog. `None` when shutdown abandoned the work.
async fn recount_tails(
    shared: &Shared,
    batch: &mut AbsorbBatch,
    streams: &[u64],
    tails: &mut HashMap<u64, StreamTail>,
) -> Option<()> {
    for id in streams {
        tails.remove(id);
        batch.tails.retain(|(stream, _)| stream != id);
        let remaining: Vec<(u64, u64)> = batch
            .entries
            .iter()
            .filter(|e| e.stream_id == *id)
            .map(|e| (e.end_seq, e.len))
            .collect();
        if remaining.is_empty() {
            continue;
        }
        let mut tail = absorbed_tail(shared, *id).await?;
        for (end_seq, len) in remaining {
            tail.tail_seq = end_seq;
            tail.stored_bytes += len;
        }
        tails.insert(*id, tail);
        batch.tails.push((*id, tail));
    }
    Some(())
}

/// A stream's absorbed tail, read again until the metastore answers: a guess would commit a
/// wrong byte count. `None` when shutdown abandoned the work.
async fn absorbed_tail(shared: &Shared, id: u64) -> Option<StreamTail> {
    let clock = shared.config.clock;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match shared.absorb_catalog.stream_tail(id).await {
            Ok(tail) => return Some(tail),
            Err(err) => tracing::warn!(
                stream_id = id,
                attempt,
                "reading a stream's absorbed tail: {err}; retrying"
            ),
        }
        let delay = shared.config.retry.delay(attempt, &shared.config.entropy);
        tokio::select! {
            biased;
            _ = clock.sleep(delay) => {}
            _ = shared.abandon.cancelled() => return None,
        }
    }
}

enum Committed {
    Landed(VersionedChain),
    /// Nothing was written: these leaderships (stream id, guard) no longer hold.
    Deposed(Vec<(u64, Compare)>),
}

/// Commits one absorb, retrying metastore failures until it lands. `None` when the chain was
/// lost or shutdown abandoned the work.
async fn commit(
    shared: &Shared,
    chain: &VersionedChain,
    state: ChainState,
    batch: AbsorbBatch,
) -> Option<Committed> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let clock = shared.config.clock;
        let started = clock.now();
        *shared.health.commit_started.lock() = Some(started);
        let result = tokio::select! {
            biased;
            result = shared.absorb_catalog.absorb(&shared.config.star, Some(chain.version), state, batch.clone()) => result,
            _ = shared.abandon.cancelled() => {
                *shared.health.commit_started.lock() = None;
                return None;
            }
        };
        *shared.health.commit_started.lock() = None;
        shared
            .metrics
            .absorb_latency
            .observe(clock.since(started).as_secs_f64());
        match result {
            Ok(committed) => {
                let mut failing = shared.health.commit_failing.lock();
                if *failing {
                    tracing::info!(attempts = attempt, "absorb commits are landing again");
                    *failing = false;
                }
                return Some(Committed::Landed(committed));
            }
            Err(CatalogError::Deposed(streams)) => return Some(Committed::Deposed(streams)),
            Err(CatalogError::Conflict(reason)) => {
                // After a failed attempt, the conflict may be that attempt's own success.
                if attempt > 1 {
                    match shared
                        .absorb_catalog
                        .chain_if_at(&shared.config.star, state)
                        .await
                    {
                        Ok(Some(committed)) => {
                            tracing::info!(
                                attempts = attempt,
                                "an absorb commit reported as failed had landed; carrying on"
                            );
                            *shared.health.commit_failing.lock() = false;
                            return Some(Committed::Landed(committed));
                        }
                        Ok(None) => {}
                        // Cannot tell yet: ask again after the backoff rather than give up the
                        // chain on a guess.
                        Err(err) => {
                            tracing::warn!("re-reading the chain after a conflict failed: {err}");
                            let delay = shared.config.retry.delay(attempt, &shared.config.entropy);
                            tokio::select! {
                                biased;
                                _ = clock.sleep(delay) => continue,
                                _ = shared.abandon.cancelled() => return None,
                            }
                        }
                    }
                }
                shared.fence(reason);
                return None;
            }
            Err(err) => {
                *shared.health.commit_failing.lock() = true;
                let delay = shared.config.retry.delay(attempt, &shared.config.entropy);
                if attempt == 1 || attempt.is_multiple_of(10) {
                    tracing::warn!(
                        attempt,
                        retry_in_ms = delay.as_millis() as u64,
                        "absorb commit failed, retrying: {err}"
                    );
                }
                tokio::select! {
                    biased;
                    _ = clock.sleep(delay) => {}
                    _ = shared.abandon.cancelled() => return None,
                }
            }
        }
    }
}
