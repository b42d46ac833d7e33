//! Retention: trims each stream with a retention from its front, a whole object at a time.
//!
//! A pass goes over the streams a page at a time (every `RETENTION_PASS_IDLES` idle periods).
//! For a stream with a retention, the object holding its first records is trimmed when
//!
//! - *by age:* it was written more than `age` ago (its index entries record when: the flight's
//!   time, or the newest of the flights a settled or merged object came from), or
//! - *by bytes:* the stream would still hold at least `bytes` without it,
//!
//! and again for the next object, until neither holds. A trim first writes a *trim marker* to
//! the bucket (`trims/{star}/{id}/{first seq}`), so that a catalog rebuilt from the bucket alone
//! knows where the stream starts (without it a stream trimmed to nothing would start again at
//! 0, and records trimmed but not yet deleted would come back). Then one transaction: the
//! object's entries go, the stream's trim point moves to where they ended, the stream's older
//! markers are queued, and a settled object (one stream's alone) is queued for collection after
//! the grace period, so reads that resolved it just before still finish. A chain flight's entry just goes: the flight holds other streams,
//! and the settle skips sections whose entries are gone.
//!
//! Trimming whole objects keeps it cheap (no rewrite) at the price of precision: a stream keeps
//! up to one object more than its limits say.
//!
//! *Two clocks for age.* A trim is never undone, and a wall clock can be wrong: a star's clock
//! stepped ahead calls every object old, and one that was behind stamped its objects with
//! times earlier than their writes. So an object is old by age only when both the stars' clock
//! (the entries' times against the auditor's wall clock) and the object store's (the object's
//! Last-Modified against the store's time now, read from a probe object this auditor rewrites
//! once a pass) say so. One bad clock keeps objects longer; it never trims them early. A trim
//! one clock wanted and the other refused is counted (`nova_auditor_refused_trims_total{reason=
//! "clock"}`) and logged once a pass.

use nova_core::catalog::{Garbage, IndexEntry, Liveness, StreamMeta};
use nova_core::clock::Instant;
use nova_core::flight::{ObjectFooter, fetch_footer};
use nova_core::keys::{
    TrimMarker, clock_probe_key, parse_any_data_key, parse_trim_marker, trim_marker_key,
    trim_marker_prefix, trims_root,
};
use nova_core::object_store::MAX_LIST_KEYS;

use crate::{AuditError, Ctx, Duty, Step};

/// Streams one job looks at.
const STREAMS_PER_JOB: usize = 64;
/// Objects one job trims from one stream before it moves on (the next job comes back).
const TRIMS_PER_STREAM: usize = 16;
/// Index entries one trim removes at most: each costs a compare and a delete; with the trim
/// point's compare and put, the object's garbage record and up to `MARKERS_PER_TRIM` older
/// markers the transaction stays inside etcd's 128 operations (50 × 2 + 2 + 1 + 16 = 119). A settled or merged object has at most 48; a flight may hold more of one stream
/// (one large batch), and is then trimmed in several steps (it is shared, so nothing of it is
/// deleted either way).
const FRONT_ENTRIES: usize = 50;
/// Older trim markers one trim queues for collection (normally one: the previous trim's; more
/// only after crashes between a marker's write and its trim, and the next trims take the rest).
const MARKERS_PER_TRIM: usize = 16;
/// A pass starts this many idle periods after the last one ended.
const RETENTION_PASS_IDLES: u32 = 5;

/// Where the retention's pass stands.
#[derive(Debug, Default)]
pub(crate) struct RetentionState {
    pub after: Option<String>,
    /// When the next pass may start (monotonic: a wall clock stepped back must not hold
    /// passes up for as long as the step).
    pub next_pass: Option<Instant>,
    /// Whether this pass found a stream with more to trim than one job does.
    pub behind: bool,
    /// The object store's time as this pass read it, and when (monotonic), once a trim by age
    /// needed it.
    pub store_time: Option<(u64, nova_core::clock::Instant)>,
    /// Trims refused for a clock this pass (logged once, at the pass's end).
    pub refused_for_clock: u64,
}

/// S3 gives Last-Modified in whole seconds, rounded down: an object's time and the store's now
/// are each up to this much early, so an object is called old by the store's clock only this
/// much later.
const STORE_CLOCK_GRAIN_MS: u64 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Age,
    Bytes,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::Bytes => "bytes",
        }
    }
}

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let now = ctx.config.clock.now();
    let after = {
        let state = ctx.retention_state.lock();
        if state.next_pass.is_some_and(|next| now < next) {
            return Ok(Step::Idle);
        }
        state.after.clone()
    };
    let page = ctx
        .catalog
        .streams_page(after.as_deref(), STREAMS_PER_JOB)
        .await?;
    let mut trimmed_any = false;
    let mut failure = None;
    for meta in &page {
        if meta.retention.is_unlimited() {
            continue;
        }
        // One stream that cannot be trimmed now must not hold up the others.
        let (trims, more) = match trim_stream(ctx, meta).await {
            Ok(done) => done,
            Err(err) => {
                failure.get_or_insert(AuditError::Inconsistent(format!(
                    "trimming stream {:?}: {err}",
                    meta.name
                )));
                (0, true)
            }
        };
        trimmed_any |= trims > 0;
        if more {
            ctx.mark_due(Duty::Retention);
            ctx.retention_state.lock().behind = true;
        }
    }
    let mut state = ctx.retention_state.lock();
    state.after = page.last().map(|m| m.name.clone());
    if page.len() < STREAMS_PER_JOB {
        // The pass is over.
        if !std::mem::take(&mut state.behind) {
            ctx.set_due(Duty::Retention, None);
        }
        state.store_time = None;
        let refused = std::mem::take(&mut state.refused_for_clock);
        if refused > 0 {
            tracing::warn!(
                refused,
                "retention: objects the star's wall clock calls old were kept, the object \
                 store's clock calling them younger; check the clocks (NTP) of the stars and \
                 of the store"
            );
        }
        state.after = None;
        state.next_pass = Some(crate::Ctx::after(
            now,
            ctx.config.idle.saturating_mul(RETENTION_PASS_IDLES),
        ));
    } else {
        state.next_pass = None;
    }
    drop(state);
    // The pass moved on past a stream that failed; the failure is reported (and backed off
    // from) once, and the stream is tried again next pass.
    if let Some(err) = failure {
        return Err(err);
    }
    Ok(if trimmed_any || page.len() == STREAMS_PER_JOB {
        Step::Done
    } else {
        Step::Idle
    })
}

/// Trims `meta`'s stream while its front object is past its retention, up to
/// `TRIMS_PER_STREAM` objects; returns how many it trimmed and whether more may be due.
async fn trim_stream(ctx: &Ctx, meta: &StreamMeta) -> Result<(usize, bool), AuditError> {
    for done in 0..TRIMS_PER_STREAM {
        let at = ctx.catalog.trim(meta.id).await?;
        let trimmed_bytes = at.map_or(0, |(t, _)| t.trimmed_bytes);
        // From the stream's first entry, not its trim point: a catalog rebuilt from the bucket
        // may hold entries of an object that spans the trim point, below it, and an object is
        // only ever trimmed with all of its entries.
        let page = ctx
            .catalog
            .index_page(Some((meta.id, 0)), FRONT_ENTRIES + 1)
            .await?;
        let Some(object) = page
            .first()
            .filter(|(e, _)| e.stream_id == meta.id)
            .map(|(e, _)| e.object_key.clone())
        else {
            return Ok((done, false));
        };
        let front: Vec<(IndexEntry, u64)> = page
            .iter()
            .take_while(|(e, _)| e.stream_id == meta.id && e.object_key == object)
            .take(FRONT_ENTRIES)
            .cloned()
            .collect();
        // A settled object is the stream's alone, whichever star's prefix holds it (a stream
        // led by several stars over time has objects under each); a flight is shared and goes
        // with the chain.
        let owned = parse_any_data_key(&object).is_some_and(|d| d.stream_id == meta.id);
        let whole = page
            .get(front.len())
            .is_none_or(|(e, _)| e.stream_id != meta.id || e.object_key != object);
        if owned && !whole {
            return Err(AuditError::Inconsistent(format!(
                "{object} holds over {FRONT_ENTRIES} entries of stream {}; it is not trimmed",
                meta.name
            )));
        }
        let Some(reason) = due(ctx, meta, &front, trimmed_bytes).await? else {
            return Ok((done, false));
        };
        let bytes: u64 = front.iter().map(|(e, _)| e.len).sum();
        let Some((last, _)) = front.last() else {
            return Ok((done, false));
        };
        let committed = at.map_or(0, |(t, _)| t.first_seq);
        let marker = TrimMarker {
            after: last.end_seq.max(committed),
            committed,
        };
        // The markers since the last committed trim (normally just its own): each marker is
        // queued once, by the first trim after it.
        let mut garbage = markers_in(ctx, meta.id, committed..marker.after).await?;
        garbage.truncate(MARKERS_PER_TRIM);
        let marker_key = trim_marker_key(&ctx.config.star, meta.id, marker);
        ctx.store
            .put(&marker_key, bytes::Bytes::new().into())
            .await?;
        if owned {
            let size = front
                .iter()
                .map(|(e, _)| e.offset + e.len)
                .max()
                .unwrap_or(0);
            garbage.push((
                ctx.due_at(),
                Garbage::Object {
                    key: object.clone(),
                    bytes: size,
                },
            ));
        }
        if !ctx.catalog.trim_front(&front, at, &garbage).await? {
            // Settled, merged, trimmed or deleted meanwhile: look again next time. The marker
            // of a live stream stays: it is harmless (what it says committed had, and its
            // records did exist), the next trim past it queues it, and deleting it here could
            // race a later trim that puts the same key (a DELETE that lands late would take
            // that trim's marker away, and a rebuild would then find the stream's front
            // missing). A deleted stream's drop may have listed its markers already: this one
            // is queued (no trim of it ever puts the key again).
            if ctx.catalog.stream_liveness(meta.id).await? != Liveness::Live {
                let item = Garbage::Object {
                    key: marker_key,
                    bytes: 0,
                };
                ctx.catalog.queue_garbage(&[(ctx.due_at(), item)]).await?;
            }
            return Ok((done, true));
        }
        let records: u64 = front.iter().map(|(e, _)| e.end_seq - e.start_seq).sum();
        ctx.metrics
            .trimmed_bytes
            .with_label_values(&[reason.as_str()])
            .inc_by(bytes);
        ctx.metrics.trimmed_records.inc_by(records);
        tracing::debug!(
            stream = meta.name,
            object,
            records,
            bytes,
            reason = reason.as_str(),
            "retention: trimmed"
        );
    }
    Ok((TRIMS_PER_STREAM, true))
}

/// Why the front object `front` is due for trimming, if it is.
async fn due(
    ctx: &Ctx,
    meta: &StreamMeta,
    front: &[(IndexEntry, u64)],
    trimmed_bytes: u64,
) -> Result<Option<Reason>, AuditError> {
    let retention = meta.retention;
    if let Some(max) = retention.bytes {
        let tail = ctx.catalog.stream_tail(meta.id).await?;
        let held = tail.stored_bytes.saturating_sub(trimmed_bytes);
        let bytes: u64 = front.iter().map(|(e, _)| e.len).sum();
        if held.saturating_sub(bytes) >= max {
            return Ok(Some(Reason::Bytes));
        }
    }
    if let Some(age) = retention.age_ms {
        let mut created = front
            .iter()
            .map(|(e, _)| e.created_at_ms)
            .max()
            .unwrap_or(0);
        if created == 0
            && let Some((entry, _)) = front.first()
        {
            // An entry from before entries recorded their object's time: its footer says.
            created = match fetch_footer(ctx.store.as_ref(), &entry.object_key).await? {
                ObjectFooter::Flight(footer) => footer.meta.created_at_ms,
                ObjectFooter::Fence(_) => 0,
            };
        }
        // An object whose time cannot be told is kept.
        if created == 0 || created.saturating_add(age) > ctx.config.clock.unix_ms() {
            return Ok(None);
        }
        // The star's clock calls it old; the store's must too.
        let Some((first, _)) = front.first() else {
            return Ok(None);
        };
        let written = ctx.store.head(&first.object_key).await?.modified_ms;
        let store_now = store_now(ctx).await?;
        match (written, store_now) {
            (Some(written), Some(now))
                if written.saturating_add(age + STORE_CLOCK_GRAIN_MS) > now =>
            {
                ctx.metrics
                    .refused_trims
                    .with_label_values(&["clock"])
                    .inc();
                ctx.retention_state.lock().refused_for_clock += 1;
                tracing::debug!(
                    stream = meta.name,
                    object = first.object_key,
                    created,
                    written,
                    store_now = now,
                    "retention: the store's clock says the object is not old yet; kept"
                );
                return Ok(None);
            }
            // A store that keeps no times leaves the star's clock the only one.
            _ => return Ok(Some(Reason::Age)),
        }
    }
    Ok(None)
}

/// The object store's time now, by its own clock: this pass's reading of the probe object's
/// Last-Modified, moved on by the monotonic time since. `None` when the store keeps no times.
pub(crate) async fn store_now(ctx: &Ctx) -> Result<Option<u64>, AuditError> {
    let read = ctx.retention_state.lock().store_time;
    let (at, when) = match read {
        Some(read) => read,
        None => {
            let key = clock_probe_key(&ctx.config.star);
            ctx.store.put(&key, bytes::Bytes::new().into()).await?;
            let when = ctx.config.clock.now();
            let Some(at) = ctx.store.head(&key).await?.modified_ms else {
                return Ok(None);
            };
            ctx.retention_state.lock().store_time = Some((at, when));
            (at, when)
        }
    };
    Ok(Some(at + ctx.config.clock.since(when).as_millis() as u64))
}

/// The stream's trim markers whose trim would move the trim point into `after` (all of them
/// with `0..u64::MAX`), queued for collection after the grace period.
pub(crate) async fn markers_in(
    ctx: &Ctx,
    stream_id: u64,
    after: std::ops::Range<u64>,
) -> Result<Vec<(u64, Garbage)>, AuditError> {
    let root = trims_root(&ctx.config.star);
    let prefix = trim_marker_prefix(&ctx.config.star, stream_id);
    let due = ctx.due_at();
    let mut found = Vec::new();
    // Keys sort by `after` (zero-padded): listing starts at the range, page after page (a
    // store may answer a short page), and stops past it.
    let mut start = Some(format!("{prefix}{:020}", after.start));
    while let Some(from) = start.take() {
        let page = ctx.store.list(&prefix, Some(&from), MAX_LIST_KEYS).await?;
        for object in &page.objects {
            let Some((id, marker)) = parse_trim_marker(&root, &object.key) else {
                continue;
            };
            if marker.after >= after.end {
                return Ok(found);
            }
            if id == stream_id && after.contains(&marker.after) {
                found.push((
                    due,
                    Garbage::Object {
                        key: object.key.clone(),
                        bytes: object.size,
                    },
                ));
            }
        }
        start = page.next_start_after;
    }
    Ok(found)
}
