//! Settle: moves each stream's records out of the chain's multi-stream flights into objects of
//! its own, so a stream's history is read from few objects and a flight can go once every
//! stream in it has moved out.
//!
//! A job takes a *window* of absorbed slots after the settle cursor (at most `WINDOW_SLOTS`
//! flights, `WINDOW_BYTES` of them and `WINDOW_SECTIONS` sections), reads each flight whole
//! through the fetch cache, and for every live stream writes its sections from the window, laid
//! end to end, as one settled object (split at `OBJECT_MAX_BYTES` and `OBJECT_MAX_SECTIONS`).
//! Consecutive small sections merge into sections of up to 1 MiB, each with its own index
//! entry, so a read of a few records fetches no more than it did from the flights. Each object
//! goes through three steps:
//!
//! 1. an intent in the garbage queue, so the object is collected if nothing ever references it;
//! 2. the object itself, under a fresh key;
//! 3. one metastore transaction that checks the stream's old entries are exactly as read,
//!    replaces them with one entry for the new object, and removes the intent.
//!
//! Once every live stream of the window has moved, the epoch's settle marker is written to the
//! bucket (a rebuild reads each epoch from there on), and the cursor moves past the window in a
//! transaction that queues the window's slots for collection. A job cut off anywhere leaves
//! either entries still on the flights (the next job redoes them) or on the new object; an
//! object written but never referenced is collected through its intent.
//!
//! The target object size: a window holds up to 64 MiB of flights, so a busy stream's settled
//! objects reach `OBJECT_MAX_BYTES` (8 MiB, a flight's default size) and a quiet one's hold
//! everything it wrote in the window. 8 MiB is past S3's 5 MiB multipart minimum, so larger
//! objects can later be assembled from settled ones by server-side copy; one GET of it takes
//! about as long to transfer as to start; and it bounds what a settle holds in memory.
//!
//! Memory: a job holds at most one flight in memory (while the fetch cache writes it to disk, or
//! a section at a time when it reads ranges), the sections of one settled object being
//! assembled, and the window's footers: `working_memory` bounds it, and novad counts it in its
//! memory formula.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use nova_core::catalog::{Garbage, IndexEntry, Liveness, SettleCursor};
use nova_core::flight::section::Fragment;
use nova_core::flight::{
    FlightFooter, FlightMeta, ObjectFooter, SUGGESTED_TAIL_READ, SectionEntry, SectionInput,
    SettleMarker, TailParse, assemble_flight, fetch_footer, fetch_section, latest_settle_marker,
    parse_tail, verify_section,
};
use nova_core::keys::{
    chain_prefix, chain_root, data_key, parse_epoch, parse_settle_marker, parse_slot,
    settle_marker_key, settle_marker_prefix, slot_key,
};
use nova_core::limits::{MAX_SECTION_BYTES, MIB};
use nova_core::manifest::mark_pending_delete;
use nova_core::object_store::MAX_LIST_KEYS;

use crate::collect::{is_far_ahead, redate_future};
use crate::fetch_cache::CachedObject;
use crate::{AuditError, Ctx, Duty, Step};

mod window;

use window::{Flight, Window, WindowEnd, load_window};

const WINDOW_SLOTS: usize = 256;
const WINDOW_BYTES: u64 = 64 * MIB;
const WINDOW_SECTIONS: usize = 16_384;
/// The window's footers in memory (each section entry with its stream's name), counted as
/// `FOOTER_ENTRY_BYTES` plus the name; the grouping by stream holds a copy.
const WINDOW_FOOTER_BYTES: u64 = 2 * MIB;
const FOOTER_ENTRY_BYTES: u64 = 96;
pub(crate) const OBJECT_MAX_BYTES: u64 = 8 * MIB;
/// Old entries one swap replaces: each costs a compare and a delete, and a transaction stays
/// well inside etcd's default of 128 operations.
pub(crate) const OBJECT_MAX_SECTIONS: usize = 48;

/// The most a settle job holds in memory when flights up to `whole_object_max` bytes are read
/// whole (larger ones, made by a single large batch, are read a section at a time) and records
/// are at most `max_record_bytes` (a section stops past 1 MiB, so it holds at most that and one
/// record with its framing): a flight as fetched (the S3 SDK's chunks and their contiguous
/// copy), as much again for the allocator keeping a freed flight-sized buffer (measured: a star
/// settling 8 MiB flights at full speed resides about 39 MiB above one with the auditor off),
/// one settled object's sections (a run stops at `OBJECT_MAX_BYTES`, so it can pass it by one
/// section), and the window's footers with their copy grouped by stream.
pub(crate) fn working_memory(whole_object_max: u64, max_record_bytes: u64) -> u64 {
    let section_max = MAX_SECTION_BYTES + max_record_bytes + 64 * 1024;
    3 * whole_object_max + OBJECT_MAX_BYTES + section_max + 2 * WINDOW_FOOTER_BYTES
}

/// A job on this star's own chain, or, when it has nothing due, on a chain it adopted (see
/// `crate::Adoptions`). An adopted chain's failure is logged and retried with backoff; it does
/// not fail the duty, so it never slows the settle of the star's own chain.
pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    // The own chain's failure is reported, but only after the adopted chains had their turn:
    // one stream's state on one chain must not stop settling everywhere.
    let own = match settle_chain(ctx, &ctx.config.star, true).await {
        Ok(Step::Done) => return Ok(Step::Done),
        Ok(Step::Idle) => Ok(Step::Idle),
        Err(err) => Err(err),
    };
    for star in ctx.adoptions.due(ctx.config.clock.unix_ms()) {
        let Some(job) = ctx.adoptions.enter(&star) else {
            continue;
        };
        let Some(outcome) = job.run(settle_chain(ctx, &star, false)).await else {
            // No longer adopted (its star rejoined): cut off, safely, anywhere.
            continue;
        };
        match outcome {
            Ok(Step::Done) => {
                ctx.adoptions.succeeded(&star);
                // Progress elsewhere is not held up by the backoff the own chain's failure
                // would bring; that failure is reported once the adopted chains are idle.
                if let Err(err) = own {
                    tracing::debug!("settle: the own chain failed; adopted chains go on: {err}");
                }
                return Ok(Step::Done);
            }
            Ok(Step::Idle) => ctx.adoptions.succeeded(&star),
            Err(err) => {
                let now = ctx.config.clock.unix_ms();
                ctx.adoptions.failed(&star, &err, now, ctx.config.idle);
            }
        }
    }
    own
}

/// Superseded settle markers one job queues (with the cursor's compare and put and one run of
/// slots, inside etcd's 128 operations).
const SUPERSEDED_MARKERS: usize = 100;

/// One job on `star`'s chain. `own`: the star's own chain, whose current epoch grows (its
/// absorbed slots wait for a window's worth or `settle_after`) and whose backlog is the settle
/// duty's due age. An adopted chain belongs to a star that left: nothing is added to it, so
/// what is absorbed is settled at once.
async fn settle_chain(ctx: &Ctx, star: &str, own: bool) -> Result<Step, AuditError> {
    let Some(chain) = ctx.catalog.chain(star).await? else {
        if own {
            ctx.set_due(Duty::Settle, None);
        }
        return Ok(Step::Idle);
    };
    let Some(at) = ctx.catalog.settle_cursor(star).await? else {
        // The first job: start at the chain's oldest epoch in the bucket.
        let epoch = first_epoch(ctx, star).await?.unwrap_or(chain.state.epoch);
        let cursor = SettleCursor {
            epoch,
            next_slot: 0,
            last_due_ms: 0,
        };
        ctx.catalog.advance_settle(star, None, cursor, &[]).await?;
        return Ok(Step::Done);
    };
    let cursor = at.cursor;
    if is_far_ahead(ctx, cursor.last_due_ms).await? {
        // A wall clock that was ahead dated this chain's garbage in the future, and every run
        // queued since carries that date (runs never come due before the ones ahead of them,
        // so what is left of an epoch stays a suffix of it): the chain's slots would stay for
        // as long as the clock was ahead, with no due age to alert on. The queue is brought
        // back first, then the cursor with it.
        return redate_future(ctx, Some((star, at.version, cursor))).await;
    }
    if cursor.epoch > chain.state.epoch {
        return Err(AuditError::Inconsistent(format!(
            "the settle cursor is at epoch {}, past the chain's epoch {}",
            cursor.epoch, chain.state.epoch
        )));
    }
    // In the epoch the star writes now, only absorbed slots are settled; an older epoch is
    // settled to its end.
    let limit = if cursor.epoch == chain.state.epoch {
        match chain.state.checkpoint {
            Some(checkpoint) if checkpoint >= cursor.next_slot && !own => Some(checkpoint),
            Some(checkpoint) if checkpoint >= cursor.next_slot => {
                // Wait for a window's worth, or until the first waited long enough.
                // Measured on the monotonic clock: a wall clock stepped back would otherwise
                // hold settling up for as long as the step.
                let clock = ctx.config.clock;
                let since = *ctx.settle_pending_since.lock().get_or_insert(clock.now());
                let waited = clock.since(since);
                let waiting = checkpoint - cursor.next_slot + 1;
                if waiting < WINDOW_SLOTS as u64 && waited < ctx.config.settle_after {
                    ctx.set_due(Duty::Settle, None);
                    return Ok(Step::Idle);
                }
                let now = clock.unix_ms();
                let overdue = waited.saturating_sub(ctx.config.settle_after);
                ctx.due_from(Duty::Settle, now.saturating_sub(overdue.as_millis() as u64));
                Some(checkpoint)
            }
            _ => {
                if own {
                    *ctx.settle_pending_since.lock() = None;
                    ctx.set_due(Duty::Settle, None);
                }
                return Ok(Step::Idle);
            }
        }
    } else {
        if own {
            ctx.mark_due(Duty::Settle);
        }
        None
    };
    if cursor.next_slot == 0
        && let Some((_, marker)) =
            latest_settle_marker(ctx.store.as_ref(), star, cursor.epoch).await?
    {
        // This epoch was settled further before: the catalog was rebuilt from the bucket
        // since, or a job wrote the marker and stopped before moving the cursor. Carry on from
        // there, queuing whatever is left of the settled slots (a rebuild may have queued them
        // too; deleting twice is harmless).
        let through = marker.settled_through;
        let prefix = chain_prefix(star, cursor.epoch);
        let lowest = ctx
            .store
            .list(&prefix, None, 1)
            .await?
            .objects
            .first()
            .and_then(|o| parse_slot(&prefix, &o.key))
            .filter(|lowest| *lowest <= through);
        let due = ctx.due_at().max(cursor.last_due_ms);
        let mut garbage: Vec<_> = lowest
            .map(|from| {
                (
                    due,
                    Garbage::ChainSlots {
                        star: star.to_owned(),
                        epoch: cursor.epoch,
                        from,
                        to: through,
                        bytes: 0,
                    },
                )
            })
            .into_iter()
            .collect();
        // Markers below it were superseded; the queue that held them may be the one a rebuild
        // lost.
        garbage.extend(superseded_markers(ctx, star, cursor.epoch, through, None, due).await?);
        let next = SettleCursor {
            next_slot: through + 1,
            last_due_ms: due,
            ..cursor
        };
        ctx.catalog
            .advance_settle(star, Some(at.version), next, &garbage)
            .await?;
        return Ok(Step::Done);
    }
    let window = load_window(ctx, star, cursor, limit).await?;

    let mut complete = true;
    for (stream_id, pieces) in group_by_stream(&window) {
        match ctx.catalog.stream_liveness(stream_id).await? {
            Liveness::Live if !resurrected(ctx, stream_id, &pieces).await? => {}
            // An absorb built before the stream was deleted can land after its drop finished
            // (retried through metastore faults), writing entries, and a tail, back. Its drop
            // is opened again, for the drop duty to take them.
            Liveness::Live => {
                reopen_drop(ctx, stream_id, &pieces).await?;
                continue;
            }
            // Its entries are dropped by their own duty; its sections go with the flights. If
            // that duty is done, entries pointing here landed after it: it is opened again.
            Liveness::Deleted => {
                if has_entries(ctx, stream_id, &pieces).await? {
                    reopen_drop(ctx, stream_id, &pieces).await?;
                }
                continue;
            }
            // Its manifest may still say live, so a rebuild would restore it, and some of its
            // records (those absorbed after the delete) have no entry to settle. The delete's
            // own mark failed (a store outage): the manifests this auditor can find are
            // marked here, rather than hold the window up until the deleting star's next
            // start, which marks its own and clears the tombstone.
            Liveness::DeletedUnmarked => {
                let stars = [ctx.config.star.as_str(), star];
                mark_pending_delete(ctx.store.as_ref(), &ctx.catalog, &stars, stream_id)
                    .await
                    .map_err(|err| {
                        AuditError::Inconsistent(format!(
                            "stream {stream_id} was deleted but its manifest is not marked yet, \
                             and marking it failed ({err}); its flights stay until it is"
                        ))
                    })?;
                tracing::debug!(
                    stream_id,
                    "settle: marked the manifest of a stream deleted during a store outage"
                );
                continue;
            }
        }
        complete &= settle_stream(ctx, &window, cursor.epoch, stream_id, &pieces).await?;
    }
    if !complete {
        // Something changed under a swap; the next job reads the window again and redoes only
        // what still points at its flights.
        return Ok(Step::Done);
    }
    finish(ctx, at.version, cursor, window).await?;
    Ok(Step::Done)
}

/// Whether a stream whose tail says live is a deleted one brought back by a late absorb: its
/// name (as the flights carry it) no longer leads to it.
async fn resurrected(ctx: &Ctx, stream_id: u64, pieces: &[Piece]) -> Result<bool, AuditError> {
    let Some(piece) = pieces.first() else {
        return Ok(false);
    };
    let by_name = ctx.catalog.stream(&piece.entry.stream).await?;
    Ok(by_name.is_none_or(|meta| meta.id != stream_id))
}

/// Whether the index holds an entry of the stream ending where one of its sections here does.
async fn has_entries(ctx: &Ctx, stream_id: u64, pieces: &[Piece]) -> Result<bool, AuditError> {
    for piece in pieces {
        if ctx
            .catalog
            .index_entry(stream_id, piece.entry.end_seq)
            .await?
            .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Opens the drop of a deleted stream again (if it is not open), for entries that came back.
async fn reopen_drop(ctx: &Ctx, stream_id: u64, pieces: &[Piece]) -> Result<(), AuditError> {
    let Some(piece) = pieces.first() else {
        return Ok(());
    };
    if ctx
        .catalog
        .reopen_drop(stream_id, &piece.entry.stream)
        .await?
    {
        tracing::warn!(
            stream = piece.entry.stream,
            stream_id,
            "auditor: index entries of a deleted stream came back after its drop (an absorb \
             that landed late); it is dropped again"
        );
    }
    Ok(())
}

/// The oldest epoch of `star`'s chain with objects in the bucket.
async fn first_epoch(ctx: &Ctx, star: &str) -> Result<Option<u64>, AuditError> {
    let root = chain_root(star);
    let page = ctx.store.list(&root, None, 1).await?;
    Ok(page
        .objects
        .first()
        .and_then(|o| parse_epoch(&root, &o.key)))
}

/// One stream's section in one flight of the window.
struct Piece {
    flight: usize,
    entry: SectionEntry,
}

fn group_by_stream(window: &Window) -> BTreeMap<u64, Vec<Piece>> {
    let mut streams: BTreeMap<u64, Vec<Piece>> = BTreeMap::new();
    for (flight, f) in window.flights.iter().enumerate() {
        for entry in &f.footer.sections {
            streams.entry(entry.stream_id).or_default().push(Piece {
                flight,
                entry: entry.clone(),
            });
        }
    }
    streams
}

/// Settles one stream's pieces, in runs of consecutive pieces whose entries still point at
/// their flights. `false` if a swap found the entries changed.
async fn settle_stream(
    ctx: &Ctx,
    window: &Window,
    epoch: u64,
    stream_id: u64,
    pieces: &[Piece],
) -> Result<bool, AuditError> {
    let mut complete = true;
    let mut run: Vec<(&Piece, (IndexEntry, u64))> = Vec::new();
    let mut run_bytes = 0u64;
    for piece in pieces {
        let flight = &window.flights[piece.flight];
        let current = ctx
            .catalog
            .index_entry(stream_id, piece.entry.end_seq)
            .await?;
        let still_here = current.filter(|(entry, _)| {
            *entry.object_key == *flight.key
                && entry.start_seq == piece.entry.start_seq
                && entry.offset == piece.entry.offset
        });
        let Some(current) = still_here else {
            // Settled already, or trimmed: nothing to move.
            complete &= write_run(ctx, window, epoch, &run).await?;
            run.clear();
            run_bytes = 0;
            continue;
        };
        let continues = run
            .last()
            .is_some_and(|(last, _)| last.entry.end_seq == piece.entry.start_seq);
        if !run.is_empty()
            && (!continues
                || run.len() >= OBJECT_MAX_SECTIONS
                || run_bytes + piece.entry.len > OBJECT_MAX_BYTES)
        {
            complete &= write_run(ctx, window, epoch, &run).await?;
            run.clear();
            run_bytes = 0;
        }
        run_bytes += piece.entry.len;
        run.push((piece, current));
    }
    complete &= write_run(ctx, window, epoch, &run).await?;
    Ok(complete)
}

async fn read_piece(ctx: &Ctx, flight: &Flight, entry: &SectionEntry) -> Result<Bytes, AuditError> {
    match &flight.disk {
        Some(disk) => {
            let bytes = disk.read(entry.offset, entry.len).await?;
            verify_section(&bytes, entry).map_err(|source| AuditError::Format {
                key: flight.key.to_string(),
                source,
            })?;
            Ok(bytes)
        }
        None => Ok(fetch_section(
            ctx.store.as_ref(),
            &flight.key,
            entry.offset,
            entry.len,
            entry.crc32c,
        )
        .await?),
    }
}

/// Writes one settled object for `run` and swaps its entries over. `false` if they changed.
async fn write_run(
    ctx: &Ctx,
    window: &Window,
    epoch: u64,
    run: &[(&Piece, (IndexEntry, u64))],
) -> Result<bool, AuditError> {
    let (Some((first, _)), Some((last, _))) = (run.first(), run.last()) else {
        return Ok(true);
    };
    let stream_id = first.entry.stream_id;
    // Consecutive pieces merge into sections of at most MAX_SECTION_BYTES (a piece larger than
    // that stays one section), so a read of a few records still fetches at most about 1 MiB.
    let mut sections: Vec<SectionInput> = Vec::new();
    let mut section_bytes = 0u64;
    let mut created_at_ms = 0;
    for (piece, _) in run {
        let flight = &window.flights[piece.flight];
        created_at_ms = created_at_ms.max(flight.footer.meta.created_at_ms);
        // `read_piece` checked the bytes against the entry's crc32c.
        let fragment = Fragment::whole_checked(
            read_piece(ctx, flight, &piece.entry).await?,
            piece.entry.end_seq - piece.entry.start_seq,
            piece.entry.crc32c,
        );
        match sections.last_mut() {
            Some(section) if section_bytes + piece.entry.len <= MAX_SECTION_BYTES => {
                section_bytes += piece.entry.len;
                section.fragments.push(fragment);
            }
            _ => {
                section_bytes = piece.entry.len;
                sections.push(SectionInput {
                    stream_id,
                    stream: piece.entry.stream.clone(),
                    start_seq: piece.entry.start_seq,
                    fragments: vec![fragment],
                });
            }
        }
    }
    let (start, end) = (first.entry.start_seq, last.entry.end_seq);
    // The footer names the epoch and the last slot the records came from.
    let meta = FlightMeta {
        star: window.star.clone(),
        epoch,
        slot: window.flights[last.flight].slot,
        created_at_ms,
    };
    let (payload, footer) = assemble_flight(meta, sections);
    // Under this star's own prefix, whichever chain the records came from: this star's
    // rewrite, retention and sweep look after it from now on.
    let key = data_key(
        &ctx.config.star,
        stream_id,
        start,
        end,
        ctx.config.entropy.next_u64(),
    );
    let size = payload.len();
    // Charged before the intent is queued: a wait here must not eat into the time the intent
    // gives the write and its swap.
    ctx.charge_rewrite(size).await;
    let intent = ctx
        .catalog
        .queue_intent(ctx.intent_due_at(), &key, size)
        .await?;
    ctx.store.put(&key, payload).await?;
    let new: Vec<IndexEntry> = footer
        .sections
        .iter()
        .map(|section| IndexEntry::for_section(&key, section, created_at_ms))
        .collect();
    let old: Vec<(IndexEntry, u64)> = run.iter().map(|(_, current)| current.clone()).collect();
    let swapped = ctx
        .catalog
        .swap_entries(&old, &new, Some(&intent), &[])
        .await?;
    if swapped {
        ctx.metrics
            .written_bytes
            .with_label_values(&["settle"])
            .inc_by(size);
        ctx.metrics
            .written_objects
            .with_label_values(&["settle"])
            .inc();
    } else {
        // Nothing references it and nothing can (its key is new, its intent still queued or
        // claimed): delete it now rather than only when the intent comes due.
        tracing::debug!(
            stream_id,
            start,
            end,
            "settle: the entries changed under the swap; deleting the object written for them"
        );
        ctx.store.delete(&key).await?;
    }
    Ok(swapped)
}

/// Every live stream of the window has moved: record it in the bucket, then move the cursor
/// and queue the window's slots (and, at a fenced epoch's end, the orphans past the fence).
async fn finish(
    ctx: &Ctx,
    version: u64,
    cursor: SettleCursor,
    window: Window,
) -> Result<(), AuditError> {
    let star = window.star.as_str();
    let due = ctx.due_at().max(cursor.last_due_ms);
    let mut garbage = Vec::new();
    let mut next_slot = cursor.next_slot;
    if let Some(last) = window.flights.last() {
        let marker = SettleMarker {
            epoch: cursor.epoch,
            settled_through: last.slot,
        };
        ctx.store
            .put(
                &settle_marker_key(star, cursor.epoch, last.slot),
                marker.encode().into(),
            )
            .await?;
        // The marker it supersedes goes with the window's slots.
        if let Some(previous) = cursor.next_slot.checked_sub(1) {
            garbage.push((
                due,
                Garbage::Object {
                    key: settle_marker_key(star, cursor.epoch, previous),
                    bytes: 0,
                },
            ));
        }
        garbage.push((
            due,
            Garbage::ChainSlots {
                star: star.to_owned(),
                epoch: cursor.epoch,
                from: cursor.next_slot,
                to: last.slot,
                bytes: window.flights.iter().map(|f| f.size).sum(),
            },
        ));
        next_slot = last.slot + 1;
    }
    let next = match window.end {
        WindowEnd::More => SettleCursor {
            epoch: cursor.epoch,
            next_slot,
            last_due_ms: due,
        },
        WindowEnd::EpochEnd { fence } => {
            if let Some(fence) = fence {
                queue_orphans(ctx, star, cursor.epoch, fence, due).await?;
            }
            // The epoch's last settle marker stays (one small object per epoch): a slot's PUT
            // that timed out may land after the slot was collected, and the marker is what
            // tells a rebuild, and recovery, that such a slot was settled long ago. Markers
            // below it that no window queued (written by a job cut off before its cursor
            // moved) go now.
            if let Some(last) = next_slot.checked_sub(1) {
                let queued = cursor.next_slot.checked_sub(1);
                let left = superseded_markers(ctx, star, cursor.epoch, last, queued, due).await?;
                garbage.extend(left);
            }
            SettleCursor {
                epoch: cursor.epoch + 1,
                next_slot: 0,
                last_due_ms: due,
            }
        }
    };
    let settled = window.flights.len() as u64;
    if ctx
        .catalog
        .advance_settle(star, Some(version), next, &garbage)
        .await?
    {
        ctx.metrics.settled_flights.inc_by(settled);
        // Once due, the settle carries on window after window until it has caught up (only
        // then does the wait start afresh), and the due age keeps counting from when it fell
        // due.
        if next.epoch != cursor.epoch {
            tracing::info!(epoch = cursor.epoch, "auditor: epoch settled");
        }
    }
    Ok(())
}

/// The settle markers of `epoch` below `through` (but `queued`, which this job queues
/// already), due at `due`: superseded, and queued by no window (a rebuild lost the queue, or a
/// job was cut off before its cursor moved). At most `SUPERSEDED_MARKERS`, from one listing.
async fn superseded_markers(
    ctx: &Ctx,
    star: &str,
    epoch: u64,
    through: u64,
    queued: Option<u64>,
    due: u64,
) -> Result<Vec<(u64, Garbage)>, AuditError> {
    let prefix = settle_marker_prefix(star, epoch);
    let page = ctx.store.list(&prefix, None, MAX_LIST_KEYS).await?;
    Ok(page
        .objects
        .iter()
        .filter(|o| {
            parse_settle_marker(&prefix, &o.key).is_some_and(|t| t < through && Some(t) != queued)
        })
        .take(SUPERSEDED_MARKERS)
        .map(|o| {
            let item = Garbage::Object {
                key: o.key.clone(),
                bytes: 0,
            };
            (due, item)
        })
        .collect())
}

/// Slots past an epoch's fence were never acknowledged (acks go out in slot order): they are
/// queued for collection. The fence itself stays, so a paused incarnation of the star can never
/// land its slot.
async fn queue_orphans(
    ctx: &Ctx,
    star: &str,
    epoch: u64,
    fence: u64,
    due: u64,
) -> Result<(), AuditError> {
    let prefix = chain_prefix(star, epoch);
    let mut after = slot_key(star, epoch, fence);
    loop {
        let page = ctx.store.list(&prefix, Some(&after), MAX_LIST_KEYS).await?;
        let orphans: Vec<_> = page
            .objects
            .iter()
            .filter(|o| parse_slot(&prefix, &o.key).is_some())
            .map(|o| {
                (
                    due,
                    Garbage::Object {
                        key: o.key.clone(),
                        bytes: o.size,
                    },
                )
            })
            .collect();
        if !orphans.is_empty() {
            tracing::info!(
                epoch,
                orphans = orphans.len(),
                "auditor: collecting slots past a fence"
            );
            ctx.catalog.queue_garbage(&orphans).await?;
        }
        match page.next_start_after {
            Some(next) => after = next,
            None => return Ok(()),
        }
    }
}
