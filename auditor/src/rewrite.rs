//! Rewrite: merges a stream's consecutive small settled objects into one larger object, so a
//! quiet stream's history is not thousands of tiny objects (one per settle window) and a long
//! read or a rebuild touches few objects.
//!
//! *What is merged.* A run of consecutive settled objects of one stream, each referenced whole by
//! the index, up to `MERGE_MAX_BYTES` of sections, `MERGE_MAX_ENTRIES` index entries and
//! `MERGE_MAX_OBJECTS` objects (one transaction swaps them all, inside etcd's 128 operations). A
//! run is merged once it reaches one of those limits, or holds `rewrite_min_objects` (16)
//! objects; a shorter run waits for the stream to settle more. Objects the rewrite made (`rewritten_key`)
//! are never merged again, so each record is written by the auditor at most twice (settle,
//! rewrite): write amplification stays at or under 2.
//!
//! *How.* The new object is composed by the store (`ObjectStore::compose`): a source whose
//! sections reach S3's multipart minimum is copied server-side (UploadPartCopy), free of the
//! rewrite budget and never passing through the star; the others are read, their sections
//! merged into sections of up to 1 MiB (as the settle does), and sent as parts, charged to
//! `--auditor-rewrite-mib`. The footer is the last part. Then, as in the settle: an intent in the
//! garbage queue, the object, and one transaction that checks every old entry is unchanged, puts
//! the new entries, drops the intent and queues the sources for collection after the grace.
//!
//! *Finding runs.* The index is scanned in pages, from where the last job stopped; a pass that
//! reaches the end waits `settle_after` before the next, since new settled objects appear no
//! faster. Nothing is kept in memory between jobs but the scan position.

use bytes::Bytes;

use nova_core::catalog::{Garbage, IndexEntry};
use nova_core::clock::Instant;
use nova_core::flight::crc::{crc32c, crc32c_combine};
use nova_core::flight::{
    FlightFooter, FlightMeta, HEADER_LEN, ObjectFooter, SectionEntry, encode_flight_end,
    fetch_footer, flight_header,
};
use nova_core::keys::{data_root, parse_data_key, rewritten_key};
use nova_core::limits::{MAX_SECTION_BYTES, MIB};
use nova_core::object_store::{ComposePart, GetRange, PutPayload};

use crate::{AuditError, Ctx, Duty, Step};

/// Sections of a merged object at most: past this, objects are large enough that merging them
/// saves little, and a merge that assembles is bounded by `ASSEMBLE_MAX_BYTES` anyway.
pub(crate) const MERGE_MAX_BYTES: u64 = 32 * MIB;
/// Old entries one merge replaces: each costs a compare and a put or delete; with the intent's
/// three operations and a garbage record per source the transaction stays under 128.
const MERGE_MAX_ENTRIES: usize = 40;
const MERGE_MAX_OBJECTS: usize = 32;
/// Bytes one merge reads and sends through the star (sources too small to copy): what it holds
/// in memory.
pub(crate) const ASSEMBLE_MAX_BYTES: u64 = 8 * MIB;
/// Index entries one job scans before it yields its worker.
const SCAN_PER_JOB: usize = 4096;
const SCAN_PAGE: usize = 512;

/// The most a rewrite job holds: the assembled bytes, as much again while a source's GET is
/// copied out of the SDK's chunks, and the footer.
pub(crate) fn working_memory() -> u64 {
    2 * ASSEMBLE_MAX_BYTES + MIB
}

/// One settled object of the run, with the entries that reference it.
struct Source {
    key: String,
    entries: Vec<(IndexEntry, u64)>,
    /// One past its last section.
    sections_end: u64,
    /// Whether its sections lie end to end right after the header (a copy takes them as is).
    contiguous: bool,
    created_at_ms: u64,
}

impl Source {
    fn section_bytes(&self) -> u64 {
        self.entries.iter().map(|(e, _)| e.len).sum()
    }
}

/// Where the rewrite's scan stands, and when its next pass may start.
#[derive(Debug, Default)]
pub(crate) struct RewriteState {
    pub after: Option<(u64, u64)>,
    /// When the next pass may start (monotonic, as the retention's).
    pub next_pass: Option<Instant>,
    /// The store once composed an object of the wrong size: its copies are not trusted
    /// again, and every source is read and assembled instead (until the auditor restarts).
    pub copies_refused: bool,
}

/// The smallest source worth copying rather than assembling: the store's smallest part, or
/// none once its copies were refused.
fn min_part(ctx: &Ctx) -> u64 {
    if ctx.rewrite_state.lock().copies_refused {
        u64::MAX
    } else {
        ctx.store.min_compose_part()
    }
}

/// How the sources of a run become parts: decided on their entries alone, in order, so a run
/// can be cut where the assembled bytes would pass their bound.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// The store's smallest part but the last (`ObjectStore::min_compose_part`).
    min_part: u64,
    /// Bytes assembled since the last copied part (with the header when nothing precedes).
    pending: u64,
    assembled: u64,
    copied: u64,
    parts_started: bool,
}

impl Plan {
    fn new(min_part: u64) -> Self {
        Plan {
            min_part,
            pending: 0,
            assembled: 0,
            copied: 0,
            parts_started: false,
        }
    }

    /// Whether `source` would be copied, and the plan after it.
    fn with(mut self, source: &Source) -> (bool, Plan) {
        let first = !self.parts_started && self.pending == 0;
        let range = if first {
            source.sections_end
        } else {
            source.section_bytes()
        };
        let copy = source.contiguous
            && range >= self.min_part
            && (self.pending == 0 || self.pending >= self.min_part);
        if copy {
            self.pending = 0;
            self.parts_started = true;
            self.copied += source.section_bytes();
        } else {
            if first {
                self.pending = HEADER_LEN as u64;
            }
            self.pending += source.section_bytes();
            self.assembled += source.section_bytes();
        }
        (copy, self)
    }
}

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let now = ctx.config.clock.now();
    let mut cursor = {
        let state = ctx.rewrite_state.lock();
        if state.next_pass.is_some_and(|next| now < next) {
            return Ok(Step::Idle);
        }
        state.after
    };
    let mut scan = Scan {
        root: data_root(&ctx.config.star),
        min_objects: ctx.config.rewrite_min_objects.max(2),
        min_part: min_part(ctx),
        run: Vec::new(),
        current: None,
    };
    let mut scanned = 0;
    while scanned < SCAN_PER_JOB {
        let page = ctx.catalog.index_page(cursor, SCAN_PAGE).await?;
        scanned += page.len().max(1);
        let last_page = page.len() < SCAN_PAGE;
        for (entry, version) in page {
            cursor = Some((entry.stream_id, entry.end_seq));
            if let Some(run) = scan.push(entry, version) {
                return merge_and_resume(ctx, run).await;
            }
        }
        if last_page {
            if let Some(run) = scan.end() {
                return merge_and_resume(ctx, run).await;
            }
            // The pass is over; a short run at a stream's end waits for more.
            let mut state = ctx.rewrite_state.lock();
            state.after = None;
            state.next_pass = Some(crate::Ctx::after(now, ctx.config.settle_after));
            ctx.set_due(Duty::Rewrite, None);
            return Ok(Step::Idle);
        }
    }
    // Scanned enough for one job: the next starts again at the run under way, if any.
    let mut state = ctx.rewrite_state.lock();
    state.after = scan.resume_at().or(cursor);
    state.next_pass = None;
    Ok(Step::Done)
}

/// A pass over the index, a source at a time.
struct Scan {
    root: String,
    /// A run this long is merged without waiting for more.
    min_objects: usize,
    /// The store's smallest part of a composed object but the last.
    min_part: u64,
    /// Consecutive complete sources of one stream that may merge.
    run: Vec<Source>,
    /// The object whose entries are arriving, if it may merge.
    current: Option<Source>,
}

impl Scan {
    /// Takes the next entry; a run to merge now, if that entry completed one.
    fn push(&mut self, entry: IndexEntry, version: u64) -> Option<Vec<Source>> {
        if let Some(current) = &mut self.current
            && current.key == entry.object_key
            && follows(current, &entry)
        {
            add_entry(current, entry, version);
            return None;
        }
        let done = self.complete();
        if done.is_some() {
            return done;
        }
        let mergeable = parse_data_key(&self.root, &entry.object_key)
            .is_some_and(|d| !d.rewritten && d.stream_id == entry.stream_id);
        if mergeable {
            self.current = Some(new_source(entry, version));
            None
        } else {
            // A flight or a merged object ends the run.
            self.take_ready()
        }
    }

    /// The end of the index: the last source completes.
    fn end(&mut self) -> Option<Vec<Source>> {
        self.complete().or_else(|| self.take_ready())
    }

    /// Where a later job must start to see the run under way again: just before its first
    /// entry (entries are keyed by their end, so that is the previous entry's key).
    fn resume_at(&self) -> Option<(u64, u64)> {
        self.run
            .first()
            .or(self.current.as_ref())
            .and_then(|s| s.entries.first())
            .map(|(e, _)| (e.stream_id, e.start_seq))
    }

    /// Adds the object whose entries were arriving to the run.
    fn complete(&mut self) -> Option<Vec<Source>> {
        let source = self.current.take()?;
        if over_limits(std::slice::from_ref(&source), self.min_part).is_some() {
            // Too many entries to swap in one transaction with others: it stays as it is, and
            // the run ends before it.
            return self.take_ready();
        }
        let continues = self
            .run
            .last()
            .zip(source.entries.first())
            .is_some_and(|(last, (first, _))| follows(last, first));
        if !continues {
            let ready = self.take_ready();
            if ready.is_some() {
                // This source starts the next run, which a later job sees again.
                return ready;
            }
        }
        self.run.push(source);
        if let Some(cut) = over_limits(&self.run, self.min_part) {
            let rest = self.run.split_off(cut);
            let full = std::mem::replace(&mut self.run, rest);
            // The run is as large as one merge takes; one source alone is not worth a merge.
            if full.len() >= 2 {
                return Some(full);
            }
        }
        None
    }

    /// The run, if it is long enough to merge; otherwise it is dropped and waits for more.
    fn take_ready(&mut self) -> Option<Vec<Source>> {
        let run = std::mem::take(&mut self.run);
        (run.len() >= self.min_objects).then_some(run)
    }
}

/// Whether `entry` follows the last entry of `source` in the same object.
fn follows(source: &Source, entry: &IndexEntry) -> bool {
    source
        .entries
        .last()
        .is_some_and(|(e, _)| e.stream_id == entry.stream_id && e.end_seq == entry.start_seq)
}

fn new_source(entry: IndexEntry, version: u64) -> Source {
    let mut source = Source {
        key: entry.object_key.clone(),
        entries: Vec::new(),
        sections_end: 0,
        contiguous: entry.offset == HEADER_LEN as u64,
        created_at_ms: 0,
    };
    add_entry(&mut source, entry, version);
    source
}

fn add_entry(source: &mut Source, entry: IndexEntry, version: u64) {
    if source.sections_end != 0 && entry.offset != source.sections_end {
        source.contiguous = false;
    }
    source.sections_end = source.sections_end.max(entry.offset + entry.len);
    source.created_at_ms = source.created_at_ms.max(entry.created_at_ms);
    source.entries.push((entry, version));
}

/// The index of the first source that does not fit a merge with those before it, if any.
fn over_limits(run: &[Source], min_part: u64) -> Option<usize> {
    let (mut plan, mut entries, mut bytes) = (Plan::new(min_part), 0usize, 0u64);
    for (i, source) in run.iter().enumerate() {
        plan = plan.with(source).1;
        entries += source.entries.len();
        bytes += source.section_bytes();
        if i >= MERGE_MAX_OBJECTS
            || entries > MERGE_MAX_ENTRIES
            || bytes > MERGE_MAX_BYTES
            || plan.assembled > ASSEMBLE_MAX_BYTES
        {
            return Some(i);
        }
    }
    None
}

/// Merges `run`, then lets the next job scan on from its start (entries past it are unchanged).
///
/// A merge that fails is not tried again at once: the scan moves past its run, which the next
/// pass finds again. A run that fails every time (a source that cannot be read, say) must not
/// hold up every stream after it.
async fn merge_and_resume(ctx: &Ctx, run: Vec<Source>) -> Result<Step, AuditError> {
    ctx.mark_due(Duty::Rewrite);
    let first = run.first().and_then(|s| s.entries.first()).map(|(e, _)| e);
    let last = run.last().and_then(|s| s.entries.last()).map(|(e, _)| e);
    let (Some(first), Some(last)) = (first, last) else {
        return Ok(Step::Done);
    };
    let (before, past) = (
        (first.stream_id, first.start_seq),
        (last.stream_id, last.end_seq),
    );
    {
        let mut state = ctx.rewrite_state.lock();
        state.after = Some(before);
        state.next_pass = None;
    }
    if let Err(err) = merge(ctx, run).await {
        ctx.rewrite_state.lock().after = Some(past);
        return Err(err);
    }
    Ok(Step::Done)
}

/// Builds the merged object's parts: copied sources as they are, the others assembled into
/// sections of up to 1 MiB.
struct Layout {
    parts: Vec<ComposePart>,
    pending: Vec<Bytes>,
    pending_len: u64,
    sections: Vec<SectionEntry>,
    /// The section being assembled, if any; it is still open to more records.
    open: Option<SectionEntry>,
    /// The next byte's offset in the merged object.
    offset: u64,
}

impl Layout {
    fn new() -> Self {
        Self {
            parts: Vec::new(),
            pending: Vec::new(),
            pending_len: 0,
            sections: Vec::new(),
            open: None,
            offset: HEADER_LEN as u64,
        }
    }

    fn close_section(&mut self) {
        if let Some(section) = self.open.take() {
            self.sections.push(section);
        }
    }

    fn copy(&mut self, source: &Source, stream: &str) {
        self.close_section();
        let first = self.parts.is_empty() && self.pending.is_empty();
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.parts
                .push(ComposePart::Data(PutPayload::from_parts(pending)));
            self.pending_len = 0;
        }
        let start = if first { 0 } else { HEADER_LEN as u64 };
        self.parts.push(ComposePart::Copy {
            source: source.key.clone(),
            range: start..source.sections_end,
        });
        for (entry, _) in &source.entries {
            self.sections.push(SectionEntry {
                stream_id: entry.stream_id,
                stream: stream.to_owned(),
                start_seq: entry.start_seq,
                end_seq: entry.end_seq,
                offset: self.offset + (entry.offset - HEADER_LEN as u64),
                len: entry.len,
                crc32c: entry.crc32c,
            });
        }
        self.offset += source.sections_end - HEADER_LEN as u64;
    }

    /// Appends one source section's bytes, checked against its entry.
    fn assemble(&mut self, entry: &IndexEntry, bytes: Bytes, stream: &str) {
        if self.parts.is_empty() && self.pending.is_empty() {
            let header = flight_header();
            self.pending_len += header.len() as u64;
            self.pending.push(header);
        }
        let len = bytes.len() as u64;
        match &mut self.open {
            Some(open) if open.len + len <= MAX_SECTION_BYTES => {
                open.crc32c = crc32c_combine(open.crc32c, entry.crc32c, len);
                open.len += len;
                open.end_seq = entry.end_seq;
            }
            _ => {
                self.close_section();
                self.open = Some(SectionEntry {
                    stream_id: entry.stream_id,
                    stream: stream.to_owned(),
                    start_seq: entry.start_seq,
                    end_seq: entry.end_seq,
                    offset: self.offset,
                    len,
                    crc32c: entry.crc32c,
                });
            }
        }
        self.offset += len;
        self.pending_len += len;
        self.pending.push(bytes);
    }

    /// The parts, the last one ending with the footer, and the footer.
    fn finish(mut self, meta: FlightMeta) -> (Vec<ComposePart>, FlightFooter, u64) {
        self.close_section();
        let footer = FlightFooter {
            meta,
            sections: self.sections,
        };
        if self.parts.is_empty() && self.pending.is_empty() {
            self.pending.push(flight_header());
        }
        let end = encode_flight_end(&footer);
        let size = self.offset + end.len() as u64;
        self.pending.push(end);
        self.parts
            .push(ComposePart::Data(PutPayload::from_parts(self.pending)));
        (self.parts, footer, size)
    }
}

/// Writes the merged object for `run` and swaps the entries over to it.
async fn merge(ctx: &Ctx, run: Vec<Source>) -> Result<(), AuditError> {
    let star = ctx.config.star.as_str();
    let (Some(first), Some(last)) = (
        run.first().and_then(|s| s.entries.first()),
        run.last().and_then(|s| s.entries.last()),
    ) else {
        return Ok(());
    };
    let (stream_id, start, end) = (first.0.stream_id, first.0.start_seq, last.0.end_seq);
    // The stream's name, for the footer, from the first source's footer (entries hold ids).
    // The first source's footer also gives its time, should its entries lack one.
    let (stream, first_created) = match fetch_footer(ctx.store.as_ref(), &run[0].key).await? {
        ObjectFooter::Flight(footer) => match footer.sections.first() {
            Some(section) if section.stream_id == stream_id => {
                (section.stream.clone(), footer.meta.created_at_ms)
            }
            _ => {
                return Err(AuditError::Inconsistent(format!(
                    "{} does not hold stream {stream_id}'s records",
                    run[0].key
                )));
            }
        },
        ObjectFooter::Fence(_) => {
            return Err(AuditError::Inconsistent(format!(
                "{} is a fence where a settled object belongs",
                run[0].key
            )));
        }
    };
    let mut plan = Plan::new(min_part(ctx));
    let mut layout = Layout::new();
    let mut created_at_ms = 0;
    for (i, source) in run.iter().enumerate() {
        let mut source_created = source.created_at_ms;
        if source_created == 0 && i == 0 {
            source_created = first_created;
        } else if source_created == 0 {
            // Entries from before they recorded their object's time: its footer says (a merged
            // object without a time could never be trimmed by age).
            if let ObjectFooter::Flight(footer) =
                fetch_footer(ctx.store.as_ref(), &source.key).await?
            {
                source_created = footer.meta.created_at_ms;
            }
        }
        created_at_ms = created_at_ms.max(source_created);
        let (copy, next) = plan.with(source);
        plan = next;
        if copy {
            layout.copy(source, &stream);
            continue;
        }
        let (Some((head, _)), Some((tail, _))) = (source.entries.first(), source.entries.last())
        else {
            continue;
        };
        ctx.charge_rewrite(source.section_bytes()).await;
        let range = head.offset..tail.offset + tail.len;
        let got = ctx
            .store
            .get(&source.key, GetRange::Bounded(range.clone()))
            .await?;
        for (entry, _) in &source.entries {
            let at = (entry.offset - range.start) as usize;
            let bytes = got
                .bytes
                .get(at..at + entry.len as usize)
                .map(Bytes::copy_from_slice);
            let Some(bytes) = bytes.filter(|b| crc32c(b) == entry.crc32c) else {
                return Err(AuditError::Inconsistent(format!(
                    "section {}..{} of {} does not match its index entry",
                    entry.start_seq, entry.end_seq, source.key
                )));
            };
            layout.assemble(entry, bytes, &stream);
        }
    }
    let (copied, assembled) = (plan.copied, plan.assembled);
    let meta = FlightMeta {
        star: star.to_owned(),
        // A merged object spans settle windows: it names no slot.
        epoch: 0,
        slot: 0,
        created_at_ms,
    };
    let (parts, footer, size) = layout.finish(meta);
    let key = rewritten_key(star, stream_id, start, end, ctx.config.entropy.next_u64());
    let intent = ctx
        .catalog
        .queue_intent(ctx.intent_due_at(), &key, size)
        .await?;
    ctx.store.compose(&key, parts).await?;
    // Trust, but check: a store that ignores copy ranges (or drops a part) shifts every offset
    // after the first copy, and swapping such an object in would lose the records for good
    // once the sources are collected. The object is left to its intent's collection.
    let composed = ctx.store.head(&key).await?.size;
    if composed != size {
        ctx.metrics.rejected_merges.inc();
        ctx.rewrite_state.lock().copies_refused = true;
        // Gone at once rather than when its intent comes due: a catalog rebuilt before then
        // would find it among the settled objects (its key is never used again, so a DELETE
        // landing late takes nothing else).
        if let Err(err) = ctx.store.delete(&key).await {
            tracing::debug!(
                key,
                "the wrongly composed object waits for its intent: {err}"
            );
        }
        return Err(AuditError::Inconsistent(format!(
            "the object store composed {key} as {composed} bytes where {size} were asked for; \
             it does not honour copy ranges (x-amz-copy-source-range): this merge is dropped \
             (the sources stay as they are) and later merges read and assemble every source \
             instead of copying"
        )));
    }
    let new: Vec<IndexEntry> = footer
        .sections
        .iter()
        .map(|section| IndexEntry::for_section(&key, section, created_at_ms))
        .collect();
    let due = ctx.due_at();
    let retire: Vec<(u64, Garbage)> = run
        .iter()
        .map(|s| {
            (
                due,
                Garbage::Object {
                    key: s.key.clone(),
                    bytes: s.sections_end,
                },
            )
        })
        .collect();
    let old: Vec<(IndexEntry, u64)> = run.into_iter().flat_map(|s| s.entries).collect();
    if ctx
        .catalog
        .swap_entries(&old, &new, Some(&intent), &retire)
        .await?
    {
        let m = &ctx.metrics;
        m.written_bytes
            .with_label_values(&["rewrite"])
            .inc_by(size - copied);
        m.written_objects.with_label_values(&["rewrite"]).inc();
        m.copied_bytes.inc_by(copied);
        m.rewritten_objects.inc_by(retire.len() as u64);
        tracing::debug!(
            stream_id,
            start,
            end,
            sources = retire.len(),
            copied,
            assembled,
            "rewrite: merged settled objects"
        );
    } else {
        tracing::debug!(
            stream_id,
            start,
            end,
            "rewrite: the entries changed under the swap; deleting the merged object"
        );
        ctx.store.delete(&key).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::object_store::MIN_COMPOSE_PART;

    fn source(sections: &[u64]) -> Source {
        let mut offset = HEADER_LEN as u64;
        let mut seq = 0;
        let entries = sections
            .iter()
            .map(|&len| {
                let e = IndexEntry {
                    stream_id: 1,
                    start_seq: seq,
                    end_seq: seq + 1,
                    object_key: "k".into(),
                    offset,
                    len,
                    crc32c: 0,
                    created_at_ms: 0,
                };
                offset += len;
                seq += 1;
                (e, 1)
            })
            .collect();
        Source {
            key: "k".into(),
            entries,
            sections_end: offset,
            contiguous: true,
            created_at_ms: 0,
        }
    }

    #[test]
    fn large_sources_are_copied_and_small_ones_assembled() {
        let big = source(&[MIB; 6]);
        let small = source(&[MIB / 2]);
        // First a big one: copied, header included.
        let (copy, plan) = Plan::new(MIN_COMPOSE_PART).with(&big);
        assert!(copy);
        // A small one after it is assembled; a big one after that cannot be copied while the
        // assembled bytes are short of a part, so it is assembled too.
        let (copy, plan) = plan.with(&small);
        assert!(!copy);
        let (copy, plan) = plan.with(&big);
        assert!(!copy);
        assert_eq!(plan.assembled, MIB / 2 + 6 * MIB);
        // Now the assembled bytes make a part: the next big one is copied again.
        let (copy, plan) = plan.with(&big);
        assert!(copy);
        assert_eq!(plan.copied, 12 * MIB);
    }

    #[test]
    fn a_run_is_cut_where_it_passes_a_limit() {
        let run: Vec<Source> = (0..40).map(|_| source(&[MIB / 4])).collect();
        // 8 MiB of assembled bytes is 32 sources of 256 KiB, and so is the object limit.
        assert_eq!(over_limits(&run, MIN_COMPOSE_PART), Some(32));
        let many: Vec<Source> = (0..5).map(|_| source(&[MIB / 8; 10])).collect();
        assert_eq!(
            over_limits(&many, MIN_COMPOSE_PART),
            Some(4),
            "entries past 40"
        );
        let big: Vec<Source> = (0..6).map(|_| source(&[MIB; 7])).collect();
        assert_eq!(
            over_limits(&big, MIN_COMPOSE_PART),
            Some(4),
            "bytes past 32 MiB"
        );
    }
}
