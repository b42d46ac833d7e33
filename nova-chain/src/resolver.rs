//! The resolver: waits for flights strictly in slot order and resolves each one. A durable
//! flight's records become readable (tail cache and pending index), the streams' tails move,
//! its producers get their acks and its admission charges are released; then it joins the
//! absorb queue. A flight that did not land is never acknowledged, and neither is any flight
//! after it: the chain is broken there (another writer took the slot, or shutdown abandoned
//! the write). Its producers hear UNAVAILABLE when the flight certainly did not land and
//! "outcome unknown" (DEADLINE_EXCEEDED) when it may have: an abandoned write, or a flight that
//! landed after the break and that the chain's next owner may still settle.

use std::sync::Arc;

use tokio::sync::mpsc;

use nova_core::budget::BudgetPermit;
use nova_core::catalog::IndexEntry;
use nova_proto::RequestError;

use nova_core::metastore::Compare;

use crate::flight_build::{InFlight, cached_run, count_appended};
use crate::shared::Shared;
use crate::streams::StreamState;
use crate::writer::WriteError;

/// A durable flight waiting to be absorbed. Holds its backlog permit until the absorb commits.
pub(crate) struct Landed {
    pub slot: u64,
    pub entries: Vec<IndexEntry>,
    /// The leadership each entry's records were sequenced under (in a fleet), beside
    /// `entries`.
    pub led_under: Vec<Option<Compare>>,
    /// The last express bundle (express epoch, slot) whose records this flight carries.
    pub express: Option<(u64, u64)>,
    pub _backlog: BudgetPermit,
}

pub(crate) async fn run_resolver(
    shared: Arc<Shared>,
    mut flights: mpsc::Receiver<InFlight>,
    absorber: mpsc::Sender<Landed>,
) {
    while let Some(mut flight) = flights.recv().await {
        // Awaiting the handle by reference keeps the flight whole for resolution.
        let written = match (&mut flight.write).await {
            Ok(result) => result,
            Err(join) => Err(WriteError::Abandoned {
                key: format!("{} (its writer died: {join})", flight.key),
            }),
        };
        shared.metrics.flights_in_flight.dec();
        match (written, shared.fenced()) {
            (Ok(()), None) => resolve(&shared, flight, &absorber).await,
            // Landed, but an earlier slot did not: acknowledging it would skip records. Its
            // slot may still be settled by the next owner of the chain, so its outcome is open.
            (Ok(()), Some(reason)) => {
                let error = RequestError::OutcomeUnknown(format!(
                    "flight {} landed after the chain broke ({reason})",
                    flight.key
                ));
                fail(&shared, flight, error);
            }
            (Err(WriteError::Fenced { key }), _) => {
                shared.fence(format!(
                    "chain slot {key} was written by another writer: this star no longer owns its chain"
                ));
                let reason = shared.fenced().unwrap_or_default();
                fail(&shared, flight, nova_core::refusal::fenced(reason));
            }
            (Err(err @ WriteError::Abandoned { .. }), _) => {
                // A later flight may already have landed; the chain now ends before this slot,
                // so nothing after it may be acknowledged.
                shared.fence(format!(
                    "{err}: the chain ends before this slot and acknowledges nothing after it"
                ));
                fail(
                    &shared,
                    flight,
                    RequestError::OutcomeUnknown(err.to_string()),
                );
            }
        }
    }
}

fn fail(shared: &Shared, flight: InFlight, error: RequestError) {
    for batch in flight.batches {
        batch.fail(error.clone());
    }
    // Carried express records stay acknowledged (a quorum of zones holds them, and the chain's
    // next owner carries them again), and readable until the star exits.
    if !flight.express.pinned.is_empty() {
        shared.keep_until_exit(flight.express);
    }
}

async fn resolve(shared: &Shared, flight: InFlight, absorber: &mpsc::Sender<Landed>) {
    let InFlight {
        slot,
        key,
        footer,
        sections,
        batches,
        bytes,
        backlog,
        express,
        ..
    } = flight;
    // Records sequenced under a leadership this star no longer holds (an absorb found it moved
    // to another star, or the star took the stream up again since) are not this star's to
    // serve, acknowledge or absorb: they are left out of everything below.
    let replaced = |stream: &StreamState, under: Option<&Compare>| {
        stream.is_deposed() || under != stream.leadership().as_ref()
    };
    let stale: Vec<bool> = sections
        .iter()
        .map(|s| replaced(&s.stream, s.leadership.as_ref()))
        .collect();
    let entries: Vec<IndexEntry> = footer
        .sections
        .iter()
        .zip(&stale)
        .filter(|(_, stale)| !**stale)
        .map(|(s, _)| IndexEntry::for_section(&key, s, footer.meta.created_at_ms))
        .collect();
    // Readable first (pending index and tail cache), then the tails move, then the acks go out:
    // a reader that sees the new tail always finds the records below it.
    shared
        .pending
        .insert(slot, entries.clone(), shared.config.clock.now());
    let runs = sections
        .iter()
        .zip(&stale)
        .filter(|(_, stale)| !**stale)
        .map(|(s, _)| cached_run(s))
        .collect();
    shared.tail_cache.insert(slot, runs);
    // The carried express records are readable from the flight now; their pins, and their
    // express-buffer charges (dropped with `express` below), go.
    for (stream_id, end_seq) in &express.pinned {
        shared.tail_cache.unpin(*stream_id, *end_seq);
    }
    for ((section, entry), stale) in sections.iter().zip(&footer.sections).zip(&stale) {
        if !stale {
            section.stream.advance_tail(entry.end_seq, entry.len);
        }
    }
    shared.metrics.flights_written.inc();
    shared.metrics.flight_bytes.inc_by(bytes);
    for batch in batches {
        if replaced(&batch.stream, batch.leadership.as_ref()) {
            let refusal = batch.stream.refusal().unwrap_or_else(|| {
                RequestError::Unavailable(format!(
                    "this star took stream {:?} up again since this append was admitted; retry",
                    batch.stream.name()
                ))
            });
            batch.fail(refusal);
            continue;
        }
        count_appended(shared, &batch);
        // Dropping the batch after the reply releases its admission charge: the tail cache
        // holds the same fragment bytes from here on, under its own budget.
        let _ = batch.reply.send(Ok(batch.range));
    }
    let led_under = sections
        .iter()
        .zip(&stale)
        .filter(|(_, stale)| !**stale)
        .map(|(s, _)| s.leadership.clone())
        .collect();
    let landed = Landed {
        slot,
        entries,
        led_under,
        express: express.through,
        _backlog: backlog,
    };
    drop(express.charges);
    // The absorb queue holds one entry per backlog permit, so this never waits for room.
    let _ = absorber.send(landed).await;
}
