//! Reading a page of a stream. Records come from the tail window cache when they are there,
//! otherwise from the object store: the entry covering the wanted sequence number is found in
//! the pending index (acknowledged, not yet absorbed) or the metastore's index, and its section
//! is fetched with one ranged GET and checked against its crc32c.
//!
//! A page stops at the tail, at `max_records`, or before the record that would take it past
//! `max_bytes`; the first record is always served, however large.
//!
//! What a read holds beyond the tail cache is charged to the read budget (`--read-memory-mib`):
//! each fetched section twice (the section, and the page and encoded response built from it),
//! and cached records once (the encoded response; the records themselves are the cache's). The
//! first charge of a read waits for room, while the read holds nothing; every later one is
//! taken only if there is room now, and the page ends short otherwise. So a read never waits
//! while holding budget (no deadlock), and always serves at least one record. The charge lives
//! with the page until its response is sent.
//!
//! Retention trims a stream from the front: a read below its trim point is answered
//! OUT_OF_RANGE, naming the first record it still holds. The star reads the trim point from the
//! catalog at most once per `TRIM_POINT_FRESH` per stream, and at once when a read finds no entry
//! where it expected one, so a trim is seen by reads within that time, well inside the grace
//! period before its objects are deleted.
//!
//! The auditor moves records to other objects and, a grace period later, deletes the old ones.
//! A read that resolved its refs before a move and fetches after the delete finds the object
//! gone: it resolves again from where it is (up to `STALE_REF_RETRIES` times) and carries on.

use std::sync::Arc;
use std::time::Duration;

use nova_core::budget::{Budget, BudgetPermit};
use nova_core::catalog::IndexEntry;
use nova_core::flight::page::PageBuilder;
use nova_core::flight::{FetchError, FormatError, fetch_section};
use nova_core::in_order::InOrder;
use nova_core::limits::{COLD_READ_REFS, PAGE_REFS, STALE_REF_RETRIES};
use nova_core::object_store::StoreError;
use nova_core::record::SequencedRecord;
use nova_core::refusal::stale_refs_exhausted;
use nova_proto::RequestError;

use crate::shared::Shared;
use crate::streams::StreamState;
use crate::tail_cache::CachedRun;

#[derive(Debug)]
pub struct Page {
    pub records: Vec<SequencedRecord>,
    pub next_seq: u64,
    pub tail_seq: u64,
    /// The page's share of the read budget; hold it until the response is sent.
    pub charge: ReadCharge,
}

/// Bytes charged per record served beyond its content: the record's entry in the page, its
/// wire form, and its framing in the encoded response.
pub const READ_PER_RECORD: u64 = 192;

/// A read's charge to the read budget, grown as the read takes more.
#[derive(Debug)]
pub struct ReadCharge {
    budget: Budget,
    permit: Option<BudgetPermit>,
    /// The most the page may be charged beyond its first growth (what its client took of its
    /// share ahead); `None` for no limit beyond the budget's room.
    limit: Option<u64>,
    /// Whether the first growth may wait for room: not when the reader already holds other
    /// pages' charges (a Kafka fetch of several partitions), which would hold and wait.
    wait_first: bool,
}

impl ReadCharge {
    fn new(budget: Budget, limit: Option<u64>, wait_first: bool) -> Self {
        Self {
            budget,
            permit: None,
            limit,
            wait_first,
        }
    }

    /// Grows the charge by `bytes`. The first growth waits for room (the read holds nothing
    /// yet) unless told not to; later ones succeed only if there is room now.
    async fn grow(&mut self, bytes: u64) -> bool {
        match &mut self.permit {
            None if !self.wait_first => match self.budget.try_acquire(bytes) {
                Some(permit) => {
                    self.permit = Some(permit);
                    true
                }
                None => false,
            },
            None => {
                self.permit = Some(self.budget.acquire(bytes).await);
                true
            }
            Some(permit)
                if self
                    .limit
                    .is_some_and(|limit| permit.units().saturating_add(bytes) > limit) =>
            {
                false
            }
            Some(permit) => match self.budget.try_acquire(bytes) {
                Some(more) => {
                    permit.merge(more);
                    true
                }
                None => false,
            },
        }
    }

    pub fn bytes(&self) -> u64 {
        self.permit.as_ref().map_or(0, BudgetPermit::units)
    }
}

/// How long the star trusts the trim point it last read for a stream.
const TRIM_POINT_FRESH: Duration = Duration::from_secs(1);

/// The first record `stream` holds: as last read if that was recent (and `force` is off),
/// otherwise read from the catalog now.
pub(crate) async fn first_seq(
    shared: &Shared,
    stream: &StreamState,
    force: bool,
) -> Result<u64, RequestError> {
    let clock = shared.config.clock;
    let now = clock.now();
    if !force && let Some(first) = stream.first_seq_if_fresh(clock, Some(TRIM_POINT_FRESH)) {
        return Ok(first);
    }
    match shared.catalog.first_seq(stream.id()).await {
        Ok(first) => {
            stream.set_first_seq(first, now);
            Ok(first)
        }
        // The metastore is unreachable: the trim point only moves forward and trimmed objects
        // stay for the grace period, so the last one read serves (reads from memory must not
        // start failing with the metastore). Not when the question is whether records just
        // went missing were trimmed: a stale answer would call it a loss.
        Err(err) if !force && stream.first_seq_if_fresh(clock, None).is_some() => {
            tracing::debug!(
                stream = stream.name(),
                "trim point unreadable, using the last: {err}"
            );
            Ok(stream.first_seq_cached())
        }
        Err(err) => Err(RequestError::from(err).context(format_args!(
            "reading the trim point of stream {:?}",
            stream.name()
        ))),
    }
}

/// Refuses a read from `seq` if retention trimmed it.
pub(crate) async fn check_not_trimmed(
    shared: &Shared,
    stream: &StreamState,
    seq: u64,
    force: bool,
) -> Result<(), RequestError> {
    let first_seq = first_seq(shared, stream, force).await?;
    if seq < first_seq {
        return Err(RequestError::Trimmed {
            stream: stream.name().to_owned(),
            seq,
            first_seq,
        });
    }
    Ok(())
}

/// A failed fetch as the reader sees it (the mapping every server shares), naming the stream.
fn read_error(stream: &str, err: FetchError) -> RequestError {
    RequestError::from(err).context(format_args!("reading stream {stream:?}"))
}

pub(crate) async fn read(
    shared: &Arc<Shared>,
    stream: &StreamState,
    start_seq: u64,
    max_records: u32,
    max_bytes: u64,
    charge_limit: Option<u64>,
    wait_first: bool,
) -> Result<Page, RequestError> {
    check_not_trimmed(shared, stream, start_seq, false).await?;
    let tail = stream.tail();
    let mut page = PageBuilder::new(start_seq, tail, max_records.max(1) as usize, max_bytes);
    let mut charge = ReadCharge::new(shared.read_budget.clone(), charge_limit, wait_first);
    let mut stale_refs = 0;
    while !page.full() {
        let seq = page.next_seq;
        let room = page.max_bytes.saturating_sub(page.bytes);
        if let Some(run) = shared.tail_cache.lookup(stream.id(), seq) {
            // The encoded response's copy of what this run can add to the page. (The records'
            // own buffers are the tail cache's, charged there.)
            let run_bytes: u64 = run.fragments.iter().map(|(_, f)| f.len()).sum();
            let records = (run.end_seq - seq).min((page.max_records - page.records.len()) as u64);
            if !charge
                .grow(run_bytes.min(room.max(1)) + records * READ_PER_RECORD)
                .await
            {
                break;
            }
            take_cached(&mut page, &run).map_err(|e| {
                RequestError::Internal(format!("cached records of {:?}: {e}", stream.name()))
            })?;
            continue;
        }
        // A cold stretch: the refs that fill what the page has room for (at most
        // PAGE_REFS), fetched with up to COLD_READ_REFS GETs running (the next launched as
        // any lands, so the window neither drains every 8 sections nor waits on a slow one),
        // each charged before it is launched, and consumed in order.
        let refs = resolve(shared, stream, seq, tail, PAGE_REFS, Some(room)).await?;
        if refs.is_empty() {
            // Trimmed meanwhile (the page so far stands; the next read is told), or lost.
            if page.records.is_empty() {
                check_not_trimmed(shared, stream, seq, true).await?;
            } else if first_seq(shared, stream, true).await? > seq {
                break;
            }
            return Err(no_entry(stream, seq));
        }
        let fetch = |entry: IndexEntry| async move {
            let section = fetch_section(
                shared.store.as_ref(),
                &entry.object_key,
                entry.offset,
                entry.len,
                entry.crc32c,
            )
            .await;
            (entry, section)
        };
        let mut later = refs.into_iter();
        // Only GETs still running count against the window: one that lands before those
        // started ahead of it waits for them, without holding back the next GET.
        let mut window = InOrder::new();
        // Records the page may still take beyond those of the sections launched.
        let mut records_left = (page.max_records - page.records.len()) as u64;
        let mut budget_full = false;
        loop {
            while window.running() < COLD_READ_REFS && !budget_full && records_left > 0 {
                let Some(entry) = later.next() else { break };
                // The first entry may begin before the stretch: only its records from `seq` on.
                let records = entry
                    .end_seq
                    .saturating_sub(entry.start_seq.max(seq))
                    .min(records_left);
                if !charge.grow(2 * entry.len + records * READ_PER_RECORD).await {
                    budget_full = true;
                    break;
                }
                records_left -= records;
                window.push(fetch(entry));
            }
            let Some((entry, section)) = window.ready() else {
                if window.land().await {
                    continue;
                }
                break;
            };
            let section = match section {
                Err(FetchError::Store(StoreError::NotFound { key }))
                    if stale_refs < STALE_REF_RETRIES =>
                {
                    stale_refs += 1;
                    tracing::debug!(%key, stream = stream.name(), "ref went stale; resolving again");
                    // Resolved again from here, whatever the window found of the budget: the
                    // page may not end on a stale ref before it has a record.
                    budget_full = false;
                    if page.records.is_empty() {
                        // Nothing taken yet: give the charge back, so the next stretch may wait
                        // for room again and the page still serves at least one record.
                        charge =
                            ReadCharge::new(shared.read_budget.clone(), charge_limit, wait_first);
                    }
                    break;
                }
                Err(FetchError::Store(StoreError::NotFound { key })) => {
                    return Err(stale_refs_exhausted(stream.name(), &key));
                }
                other => other.map_err(|e| read_error(stream.name(), e))?,
            };
            page.take_from(entry.start_seq, section).map_err(|e| {
                RequestError::DataLoss(format!(
                    "{} (stream {:?}): {e}",
                    entry.object_key,
                    stream.name()
                ))
            })?;
            // Full: no more GETs for it, and none waited for.
            if page.full() {
                break;
            }
        }
        // No room in the read budget for the stretch's next section: the page ends here.
        if budget_full {
            break;
        }
    }
    Ok(Page {
        records: page.records,
        next_seq: page.next_seq,
        tail_seq: tail,
        charge,
    })
}

/// Index entries covering the stream from `seq`, in order and without gaps, up to `tail`, at
/// most `max` of them, stopping at the first record the tail cache holds and, when `bytes` is
/// given, once the entries hold that many bytes.
pub(crate) async fn resolve(
    shared: &Shared,
    stream: &StreamState,
    mut seq: u64,
    tail: u64,
    max: usize,
    bytes: Option<u64>,
) -> Result<Vec<IndexEntry>, RequestError> {
    let mut refs: Vec<IndexEntry> = Vec::new();
    let mut planned = 0u64;
    while seq < tail && refs.len() < max && bytes.is_none_or(|b| planned < b || refs.is_empty()) {
        if shared.tail_cache.contains(stream.id(), seq) {
            break;
        }
        let found = match shared.pending.lookup(stream.id(), seq) {
            Some(entry) => vec![entry],
            None => shared
                .catalog
                .index_entries(stream.id(), seq, max - refs.len())
                .await
                .map_err(RequestError::from)?,
        };
        let before = refs.len();
        for entry in found {
            // Records the tail cache holds are read from it: the stretch ends before them
            // (checked for every entry, as one lookup may return many).
            if entry.start_seq > seq
                || refs.len() == max
                || (!refs.is_empty() && shared.tail_cache.contains(stream.id(), seq))
            {
                break;
            }
            seq = entry.end_seq;
            planned += entry.len;
            refs.push(entry);
            if bytes.is_some_and(|b| planned >= b) || seq >= tail {
                break;
            }
        }
        if refs.len() == before {
            break;
        }
    }
    Ok(refs)
}

/// How far out of order objects' write times may be (stars' clocks apart across a takeover or a
/// handoff, a clock stepped back) without a read by time starting late: the search looks for
/// objects written this much before the time asked, and the reader passes over the records in
/// between.
pub(crate) const SEEK_CLOCK_SLACK_MS: u64 = 1000;

/// Where a read by time starts: at or after `from_seq` (and the stream's first record), the
/// first index entry whose object was written at or after `timestamp_ms` (unix ms) less
/// `SEEK_CLOCK_SLACK_MS`, found by a binary search over the stream's sequence numbers that reads
/// one entry per step (O(log n) metastore reads).
///
/// An object's write time is at or after the admission time of every record in it, and records
/// the star stamps are stamped at admission, so no record stamped at or after `timestamp_ms`
/// lies before the entry found as long as write times grow with sequence numbers to within the
/// slack; the reader passes over the earlier records. Records still in the tail cache are not
/// in the index: a search that reaches them stops there, and the reader passes over them the
/// same way. Entries written before objects carried a write time (0) count as older than any
/// time. A producer's own timestamps are taken as they are: one ahead of the star's clock may
/// be passed over.
pub(crate) async fn seek_time(
    shared: &Shared,
    stream: &StreamState,
    from_seq: u64,
    timestamp_ms: u64,
) -> Result<u64, RequestError> {
    // A read by time asks for what the stream holds from then on: what retention trimmed is
    // not an error here, only not there.
    let first = first_seq(shared, stream, false).await?;
    let target = timestamp_ms.saturating_sub(SEEK_CLOCK_SLACK_MS);
    let mut lo = from_seq.max(first);
    let mut hi = stream.tail();
    if let Some(hot) = shared.tail_cache.earliest(stream.id()) {
        hi = hi.min(hot.max(lo));
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let entry = match shared.pending.lookup(stream.id(), mid) {
            Some(entry) => Some(entry),
            None => shared
                .catalog
                .index_entries(stream.id(), mid, 1)
                .await
                .map_err(RequestError::from)?
                .into_iter()
                .next()
                .filter(|e| e.start_seq <= mid),
        };
        match entry {
            Some(entry) if entry.created_at_ms < target => lo = entry.end_seq.max(mid + 1),
            Some(entry) => hi = entry.start_seq.max(lo),
            // Not indexed (trimmed or deleted meanwhile): start no later than here.
            None => hi = mid,
        }
    }
    Ok(lo)
}

fn no_entry(stream: &StreamState, seq: u64) -> RequestError {
    // A stream deleted while this read ran has its index dropped: that is the delete, not a
    // loss. (Found by the simulation: such reads answered DATA_LOSS.)
    if stream.is_deleted() {
        return RequestError::StreamNotFound(stream.name().to_owned());
    }
    RequestError::DataLoss(format!(
        "no index entry covers record {seq} of stream {:?} below its tail",
        stream.name()
    ))
}

fn take_cached(page: &mut PageBuilder, run: &CachedRun) -> Result<(), FormatError> {
    // Start at the fragment holding the wanted record, then carry on through the run.
    let first = run
        .fragments
        .iter()
        .rposition(|(start, _)| *start <= page.next_seq)
        .unwrap_or(0);
    for (start, fragment) in &run.fragments[first..] {
        if page.full() {
            break;
        }
        page.take_records(*start, fragment.iter())?;
    }
    Ok(())
}
