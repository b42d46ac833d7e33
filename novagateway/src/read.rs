//! Serving a read. The star vends refs (which objects hold the stream's records from the wanted
//! sequence number, and where its in-memory stretch begins); history the gateway reads itself,
//! anything from the star's in-memory stretch on it forwards to the star.
//!
//! A history read finds each ref's section in the object's footer (footer cache): as many
//! sections as fill the page's byte budget (at most `PAGE_REFS`), as the star fills its own
//! pages. It fetches them through the object cache tier with eight in flight (a steady window:
//! the next starts as the oldest lands), checks each against its footer's crc32c, and decodes
//! the page.
//!
//! The page is charged to the fetch pool section by section, and held until it is sent. The
//! first window's charge is waited for in one go, so a read never holds part of the pool while
//! waiting for more (reads cannot deadlock each other); each section after it is charged only
//! if the pool has room now and stays at most half used, and otherwise the page ends there. A
//! busy pool makes pages shorter, never a read wait twice.
//!
//! With read-ahead on, a consumer reading history in order has its next page begun while this
//! one is still being fetched: once this page's last section is on its way, a task takes a
//! place for the next page and, when that section is small against a page, plans and fetches
//! the sections after it at once, so the consumer's window of GETs stays full from one page
//! into the next instead of draining at each page's end. The page being read then hands over
//! where it ended (inside its last section or at its end) and that section's bytes, and the
//! next page is built from there (`read_ahead`).
//!
//! The auditor moves records to other objects and deletes the old ones a grace period later. A
//! read whose refs were vended before a move and whose fetch comes after the delete finds the
//! object gone: it asks the star for fresh refs and starts again, up to `STALE_REF_RETRIES`
//! times, so a consumer never sees the move.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tonic::Status;

use nova_core::budget::{Budget, BudgetPermit};
use nova_core::flight::page::PageBuilder;
use nova_core::flight::{FetchError, SectionEntry, verify_section};
use nova_core::in_order::InOrder;
use nova_core::limits::{COLD_READ_REFS, STALE_REF_RETRIES};
use nova_core::object_store::StoreError;
use nova_core::refusal;
use nova_proto::RequestError;
use nova_proto::route::Router;
use nova_proto::v1;
use nova_proto::validate::read_caps;
use nova_server::shed::ShedLog;

use crate::footers::Footers;
use crate::metrics::GatewayMetrics;
use crate::read_ahead::{
    AheadKey, AheadPage, Dropped, LastSection, Launched, ReadAhead, Reserved, Started,
};
use crate::tier::Tier;
use nova_server::net::hold::Hold;

pub struct Reader {
    /// The star(s): requests about a stream go to its leader, following redirects.
    pub star: Router,
    pub footers: Footers,
    pub tier: Arc<Tier>,
    pub pool: Budget,
    pub metrics: GatewayMetrics,
    pub max_read_bytes: u64,
    pub max_read_records: u32,
    /// Places for reads in progress (`--max-reads`).
    pub reads: Arc<Semaphore>,
    pub max_reads: u32,
    /// Throttles the shed log to a line a second.
    pub sheds: Arc<ShedLog>,
    /// Next pages of consumers reading history in order.
    pub ahead: Arc<ReadAhead>,
}

/// `--max-reads`' default.
pub const MAX_READS: u32 = 1024;

/// What a read holds outside the fetch pool while in progress, for the memory formula: its
/// task and request, the refs and footers it looks at, the page's bookkeeping (records are in
/// the pool's share), its HTTP/2 stream.
pub const PER_READ_BYTES: u64 = 64 * 1024;

/// What each record of a page costs beyond its bytes while the response is built (its
/// decoded form and its message in the response), charged with the sections (as the star
/// charges 192 bytes a record).
const PER_RECORD_BYTES: u64 = 192;

/// The most sections one history page plans (`nova_core::limits::PAGE_REFS`). What a read
/// holds while planning (the refs and each section's footer entry, stream name included) stays
/// within `PER_READ_BYTES`.
const PAGE_REFS: u32 = nova_core::limits::PAGE_REFS as u32;

/// The retry hint of a read shed at `--max-reads`.
const SHED_RETRY_AFTER: Duration = Duration::from_millis(500);

/// Why one attempt at a read failed.
enum Failure {
    /// An object a ref named is gone (the auditor collected it): resolve again.
    Stale(String),
    Status(Status),
}

/// What a read is, once the star has given its refs.
enum Planned {
    /// From the star's in-memory stretch on: the star serves it.
    Star,
    History(Plan),
}

/// A history read's plan: the refs, and the sections that fill its page, each with its charge.
struct Plan {
    refs: v1::ResolveRefsResponse,
    start_seq: u64,
    max_records: u32,
    max_bytes: u64,
    sections: Vec<PlannedSection>,
    /// The charge a read waits for before fetching anything: its first window's.
    first_charge: u64,
}

/// A section to fetch, and what the page holds for it until it is sent: the section, its
/// share of the encoded response, and its records' bookkeeping.
struct PlannedSection {
    key: String,
    entry: SectionEntry,
    charge: u64,
    /// The page is expected to end inside it, so the next page starts in it: its owner is
    /// asked to cache it on its first request (`crate::admission`).
    keep: bool,
}

/// One attempt's page: the response, its charge, and for a history page, the stream's id and
/// where the star's in-memory stretch began.
struct Served {
    response: v1::ReadResponse,
    permit: BudgetPermit,
    history: Option<History>,
    /// A history page's last section, where the page after it starts.
    last: Option<LastSection>,
    /// Whether the page after it was begun (or found no room or place) while it was read:
    /// if so, it is not tried again after.
    next_tried: bool,
}

impl Served {
    /// Whether a page after this one is worth reading ahead: it is a history page with
    /// records, and the next one is still history.
    fn wants_next(&self) -> bool {
        let response = &self.response;
        self.history.is_some_and(|history| {
            !response.records.is_empty()
                && response.next_seq < history.hot_from_seq.min(response.tail_seq)
        })
    }
}

/// The page after one being read, begun early (`Reader::begin_next`): what the page being
/// read tells it once built (`Reader::hand_off`).
struct NextPage {
    reserved: Reserved,
    /// The read's key (its first sequence number is the page being read's).
    key: AheadKey,
    /// The section it was begun after: the page being read ends in it or at its end.
    last: SectionEntry,
    handoff: oneshot::Sender<Handoff>,
}

/// What a page tells the page begun after it: where it starts, the last section's bytes if
/// it starts inside it, and its slot.
struct Handoff {
    next_seq: u64,
    lead: Option<Bytes>,
    stream_id: u64,
    started: Started,
}

/// A page begun after another: the read it is for, and the section it starts in or after.
struct NextTask {
    request: v1::ReadRequest,
    key: AheadKey,
    last: SectionEntry,
    reserved: Reserved,
}

/// `sections` with none to be kept on its first request: the page after them is read ahead,
/// and takes its first records from the last section's bytes, handed over.
fn unkept(mut sections: Vec<PlannedSection>) -> Vec<PlannedSection> {
    for section in &mut sections {
        section.keep = false;
    }
    sections
}

/// The charge of a page that takes records from `section` when it already has its bytes:
/// the section, its share of the response, and every one of its records' bookkeeping (where
/// in the section the page starts is not known when the charge is taken).
fn lead_charge(section: &SectionEntry) -> u64 {
    let records = section.end_seq.saturating_sub(section.start_seq);
    section
        .len
        .saturating_mul(2)
        .saturating_add(records.saturating_mul(PER_RECORD_BYTES))
}

impl NextTask {
    /// What the page holds for the last section's bytes and records, if it starts inside it.
    fn last_charge(&self) -> u64 {
        lead_charge(&self.last)
    }

    /// What to plan before the page before ends: the sections after the last one, within
    /// what of the page the last section leaves, all of it counted (so the page holds no more
    /// than a consumer's own read would, and nothing fetched goes unread). Only when the last
    /// section is at most an eighth of a page, by bytes and by records: the page may then come
    /// out up to that much short. `None` otherwise: the page is planned once the page before
    /// has ended, exactly.
    fn early(&self) -> Option<(u64, u32, u64)> {
        let last = &self.last;
        let records = last.end_seq.saturating_sub(last.start_seq);
        let max_records = u64::from(self.key.max_records);
        let small = last.len <= self.key.max_bytes / 8 && records <= max_records / 8;
        small.then(|| {
            let records_left = (max_records - records).min(u64::from(u32::MAX)) as u32;
            (last.end_seq, records_left, self.key.max_bytes - last.len)
        })
    }
}

/// The sections fetched for a page begun after another, before it knows where it starts.
struct Fetched {
    sections: Vec<LastSection>,
    permit: BudgetPermit,
    /// The refs its sections were planned from (none if the page is only what is left of
    /// the last section).
    refs: Option<v1::ResolveRefsResponse>,
    /// What it is charged before growing: what reading the page after it needs room for.
    window: u64,
    /// The page after it, begun while its sections were fetched (it had been claimed).
    next: Option<NextPage>,
    /// Whether that was tried.
    next_tried: bool,
}

/// A page begun after another, started from where that one ended.
struct NextPageBuilder {
    page: PageBuilder,
    /// The section it started in, if it took records from it.
    taken: Option<LastSection>,
}

impl NextPageBuilder {
    /// The records and bytes the page has room for still (none once it is full).
    fn room(&self) -> (u32, u64) {
        let page = &self.page;
        if page.full() {
            return (0, 0);
        }
        let records = page.max_records.saturating_sub(page.records.len());
        (
            records.min(u32::MAX as usize) as u32,
            page.max_bytes.saturating_sub(page.bytes),
        )
    }
}

/// A page read ahead whose sections do not fit together: dropped (the request, when it comes,
/// is read and meets the same).
fn corrupt(stream: &str, e: impl std::fmt::Display) -> Dropped {
    tracing::warn!(%stream, "a page read ahead: {e}");
    Dropped::Failed
}

#[derive(Clone, Copy)]
struct History {
    stream_id: u64,
    hot_from_seq: u64,
    /// The charge of the page's first window: what reading the next page ahead needs room
    /// for before it starts.
    window: u64,
}

impl From<Status> for Failure {
    fn from(status: Status) -> Self {
        Failure::Status(status)
    }
}

fn fetch_failure(err: impl std::ops::Deref<Target = FetchError>) -> Failure {
    match &*err {
        FetchError::Store(StoreError::NotFound { key }) => Failure::Stale(key.clone()),
        other => Failure::Status(RequestError::from(other).into()),
    }
}

/// What a read in progress holds until its response is sent: its place under `--max-reads`,
/// and its page's charge (to the fetch pool, or to the read-ahead budget for a page read
/// ahead).
struct ReadHolds {
    _place: OwnedSemaphorePermit,
    _charge: Option<BudgetPermit>,
    gauge: prometheus::IntGauge,
}

impl Drop for ReadHolds {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Reader {
    /// Serves a read, or sheds it at `--max-reads`. The [`Hold`] keeps its place and its pool
    /// share until the response is sent. The caller has checked the consumer may read the
    /// stream (a page read ahead for one consumer may go to another).
    pub async fn read(
        self: &Arc<Self>,
        request: v1::ReadRequest,
        peer: Option<SocketAddr>,
    ) -> Result<(v1::ReadResponse, Hold), Status> {
        let Ok(place) = self.reads.clone().try_acquire_owned() else {
            return Err(self.shed(&request.stream, peer));
        };
        self.metrics.reads_in_progress.inc();
        let mut holds = ReadHolds {
            _place: place,
            _charge: None,
            gauge: self.metrics.reads_in_progress.clone(),
        };
        let (max_records, max_bytes) =
            read_caps(&request, self.max_read_records, self.max_read_bytes);
        let key = AheadKey::of(&request, max_records, max_bytes);
        if let Some(key) = key.as_ref()
            && let Some(mut claimed) = self.ahead.claim(key)
        {
            // The page's sections are all on their way: begin the one after it now (and only
            // now: found no room or place, it is not tried again once the page is in).
            let launched = claimed.launched.take();
            let tried = launched.is_some();
            let next =
                launched.and_then(|last| self.begin_next(&request, key, &last.entry, last.window));
            self.count_begun("while_read", &next);
            let (page, refs) = tokio::join!(claimed.page(), self.refs(&request, 1));
            match (page, refs) {
                (Ok(page), Ok(refs)) => match still_current(&request, page, refs) {
                    Some(served) => {
                        self.ahead.count("used");
                        self.metrics.reads.with_label_values(&["history"]).inc();
                        match next {
                            Some(next) => self.hand_off(next, &served),
                            None if tried => {}
                            None => self.read_ahead_after(&request, Some(key), &served),
                        }
                        holds._charge = Some(served.permit);
                        return Ok((served.response, Hold::new(holds)));
                    }
                    None => self.ahead.count("outdated"),
                },
                // The star did not answer: the read below meets the same failure.
                (Ok(_), Err(_)) => self.ahead.count("failed"),
                (Err(why), _) => self.ahead.count(why.label()),
            }
        }
        let mut stale = 0;
        loop {
            match self.read_once(&request, key.as_ref()).await {
                Ok(served) => {
                    self.read_ahead_after(&request, key.as_ref(), &served);
                    holds._charge = Some(served.permit);
                    return Ok((served.response, Hold::new(holds)));
                }
                Err(Failure::Status(status)) => return Err(status),
                Err(Failure::Stale(key)) if stale < STALE_REF_RETRIES => {
                    stale += 1;
                    self.metrics.stale_refs.inc();
                    tracing::debug!(%key, stream = %request.stream, "ref went stale; resolving again");
                }
                // The stream is there and its records moved under the read, over and over:
                // retryable, and never "not found", which a client takes for a deleted stream.
                Err(Failure::Stale(key)) => {
                    return Err(refusal::stale_refs_exhausted(&request.stream, &key).into());
                }
            }
        }
    }

    /// After a history page for `request` (whose read-ahead key is `key`), starts reading the
    /// page its consumer will ask for next, unless that was begun while this one was read.
    fn read_ahead_after(
        self: &Arc<Self>,
        request: &v1::ReadRequest,
        key: Option<&AheadKey>,
        served: &Served,
    ) {
        let (Some(history), Some(key), Some(last)) = (served.history, key, &served.last) else {
            return;
        };
        if served.next_tried || !served.wants_next() {
            return;
        }
        let next = self.begin_next(request, key, &last.entry, history.window);
        self.count_begun("after", &next);
        if let Some(next) = next {
            self.hand_off(next, served);
        }
    }

    /// Begins reading the page after one whose last section is `last` while that page is
    /// still being read: a task plans and fetches the sections after `last` now if `last` is
    /// small against a page (`NextTask::early`), and waits for the page to hand over where it
    /// ends ([`Reader::hand_off`]) before building its own page. So a consumer's window of
    /// GETs stays full from one page into the next, instead of draining at each page's end. `None` if read-ahead has no room or
    /// place (`estimate` is the first window's charge of the page before).
    fn begin_next(
        self: &Arc<Self>,
        request: &v1::ReadRequest,
        key: &AheadKey,
        last: &SectionEntry,
        estimate: u64,
    ) -> Option<NextPage> {
        let budget = self.ahead.budget.clone()?;
        let reserved = self.ahead.reserve(estimate)?;
        let (handoff, waiting) = oneshot::channel();
        let task = NextTask {
            request: v1::ReadRequest {
                start_timestamp: None,
                ..request.clone()
            },
            key: key.clone(),
            last: last.clone(),
            reserved: reserved.clone(),
        };
        // Bounded: a task per place, and places are capped (--max-read-aheads); a task keeps
        // its place until it ends: when its page is handed over, or once nobody can take it.
        tokio::spawn(self.clone().read_next(task, budget, waiting));
        Some(NextPage {
            reserved,
            key: key.clone(),
            last: last.clone(),
            handoff,
        })
    }

    /// Counts a read-ahead begun `when` ("while_read" or "after"), if it was.
    fn count_begun(&self, when: &str, next: &Option<NextPage>) {
        if next.is_some() {
            self.metrics
                .read_aheads_begun
                .with_label_values(&[when])
                .inc();
        }
    }

    /// Tells the page begun after `served` where it starts, opening its slot; or, when no
    /// page is wanted after this one (it reached the star's in-memory stretch, or did not end
    /// in the section the next page was begun after), lets that page go.
    fn hand_off(&self, next: NextPage, served: &Served) {
        let next_seq = served.response.next_seq;
        let Some(history) = served.history else {
            return;
        };
        if !served.wants_next() || !(next.last.start_seq..=next.last.end_seq).contains(&next_seq) {
            return;
        }
        // A next page that starts inside the last section takes its first records from it.
        let lead = match &served.last {
            _ if next_seq == next.last.end_seq => None,
            Some(last) if last.entry == next.last => Some(last.bytes.clone()),
            _ => return,
        };
        let Some(started) = self.ahead.open(&next.reserved, next.key.at(next_seq)) else {
            return;
        };
        // A task that ended already (it found no room, or its plan failed) is told too: it
        // is what hands its outcome to the slot.
        let _ = next.handoff.send(Handoff {
            next_seq,
            lead,
            stream_id: history.stream_id,
            started,
        });
    }

    /// A page begun after another (`begin_next`). When the section it follows is small
    /// against a page, it fetches what follows that section at once, and builds its page
    /// once the page before hands over where it ended. Otherwise it waits for the handover,
    /// takes what is left of the section, and only then fetches what the page still has room
    /// for. Hands the page to its slot.
    async fn read_next(
        self: Arc<Self>,
        task: NextTask,
        budget: Budget,
        mut waiting: oneshot::Receiver<Handoff>,
    ) {
        let early = task.early();
        // Fetching early, the last section's share is charged first: its bytes may come with
        // the handover while the sections after it are still being planned. (Otherwise this
        // future is never polled, and replaced once the handover has come.)
        let charged = early
            .is_some()
            .then(|| budget.try_acquire_exact(task.last_charge()))
            .flatten();
        let fetching = self.fetch_next(&task, &budget, early, charged);
        tokio::pin!(fetching);
        let mut fetched = None;
        let handoff = match early {
            Some(_) => loop {
                tokio::select! {
                    handoff = &mut waiting => break handoff,
                    done = &mut fetching, if fetched.is_none() => fetched = Some(done),
                }
            },
            None => waiting.await,
        };
        let Ok(Handoff {
            next_seq,
            lead,
            stream_id,
            mut started,
        }) = handoff
        else {
            self.ahead.count(Dropped::Unneeded.label());
            return;
        };
        if let Some(Err(why)) = fetched {
            return self.ahead.finish(started, Err(why));
        }
        let page = match self.start_page(&task, next_seq, lead) {
            Ok(page) => page,
            Err(why) => return self.ahead.finish(started, Err(why)),
        };
        if early.is_none() {
            // What is left of the page after the section, if anything: planned now, exactly.
            let (records, bytes) = page.room();
            let after = (records > 0 && bytes > 0).then_some((task.last.end_seq, records, bytes));
            let lead = if page.taken.is_some() {
                task.last_charge()
            } else {
                0
            };
            let charged = budget.try_acquire_exact(lead);
            fetching.set(self.fetch_next(&task, &budget, after, charged));
        }
        let fetched = match fetched {
            Some(fetched) => fetched,
            None => tokio::select! {
                fetched = &mut fetching => fetched,
                // Nobody can take the page: stop (a star that does not answer would otherwise
                // keep the place for as long as it is silent).
                () = started.abandoned() => return,
            },
        };
        let page = fetched.and_then(|fetched| self.finish_page(&task, page, stream_id, fetched));
        self.ahead.finish(started, page);
    }

    /// The sections of a page begun after another: planned from `after` (first sequence
    /// number, record and byte caps; none: nothing after the last section) and fetched as a
    /// read's are, charged to the read-ahead budget on top of `charged` (the last section's
    /// share, taken before; `None`: there was no room for it). Never waits for room: without
    /// it now, the page is not read ahead. Once its sections are all on their way, the page
    /// after it is begun, by this task if the page has been claimed by then, otherwise by the
    /// claim.
    async fn fetch_next(
        self: &Arc<Self>,
        task: &NextTask,
        budget: &Budget,
        after: Option<(u64, u32, u64)>,
        charged: Option<BudgetPermit>,
    ) -> Result<Fetched, Dropped> {
        let mut permit = charged.ok_or(Dropped::NoRoom)?;
        let plan = match after {
            None => None,
            Some((start_seq, max_records, max_bytes)) => {
                let after = v1::ReadRequest {
                    start_seq,
                    max_records,
                    max_bytes,
                    ..task.request.clone()
                };
                match self.plan(&after).await {
                    // Ids are never reused: another id is a stream created again under the
                    // name, whose records must not follow the old one's on a page.
                    Ok(Planned::History(plan))
                        if plan.refs.refs.first().map(|r| r.stream_id)
                            == Some(task.last.stream_id) =>
                    {
                        Some(plan)
                    }
                    Ok(Planned::History(_)) => return Err(Dropped::Failed),
                    Ok(Planned::Star) => return Err(Dropped::Hot),
                    Err(_) => return Err(Dropped::Failed),
                }
            }
        };
        let first = plan.as_ref().map_or(0, |p| p.first_charge);
        permit.merge(budget.try_acquire_exact(first).ok_or(Dropped::NoRoom)?);
        // The room the page after this one likely needs before it starts: about what this
        // one's sections (or, with none, the section it started in) took before growing.
        let window = if first > 0 { first } else { task.last_charge() };
        let mut sections = Vec::new();
        let mut next = None;
        let mut next_tried = false;
        let refs = match plan {
            None => None,
            Some(plan) => {
                self.fetch_sections(
                    unkept(plan.sections),
                    plan.first_charge,
                    &mut permit,
                    budget,
                    |section| {
                        sections.push(section);
                        Ok(false)
                    },
                    |section| {
                        let launched = Launched {
                            entry: section.entry.clone(),
                            window,
                        };
                        if let Some(last) = task.reserved.launched(launched) {
                            next_tried = true;
                            next =
                                self.begin_next(&task.request, &task.key, &last.entry, last.window);
                            self.count_begun("while_read", &next);
                        }
                    },
                )
                .await
                .map_err(|_| Dropped::Failed)?;
                Some(plan.refs)
            }
        };
        Ok(Fetched {
            sections,
            permit,
            refs,
            window,
            next,
            next_tried,
        })
    }

    /// A page begun after another, from `next_seq` (where that one ended: inside `task.last`,
    /// whose bytes are then `lead`, or at its end), with what is left of that section taken.
    fn start_page(
        &self,
        task: &NextTask,
        next_seq: u64,
        lead: Option<Bytes>,
    ) -> Result<NextPageBuilder, Dropped> {
        let last = &task.last;
        let mut page = PageBuilder::new(
            next_seq,
            u64::MAX,
            task.key.max_records.max(1) as usize,
            task.key.max_bytes,
        );
        let mut taken = None;
        if next_seq < last.end_seq {
            let bytes = lead.ok_or(Dropped::Failed)?;
            page.take_from(last.start_seq, bytes.clone())
                .map_err(|e| corrupt(&task.request.stream, e))?;
            taken = Some(LastSection {
                entry: last.clone(),
                bytes,
            });
        }
        Ok(NextPageBuilder { page, taken })
    }

    /// Ends a page begun after another with the sections fetched for it. Hands over to the
    /// page begun after this one, if there is one.
    fn finish_page(
        &self,
        task: &NextTask,
        started: NextPageBuilder,
        stream_id: u64,
        fetched: Fetched,
    ) -> Result<AheadPage, Dropped> {
        let last = &task.last;
        let NextPageBuilder {
            mut page,
            mut taken,
        } = started;
        let Fetched {
            sections,
            permit,
            refs,
            window,
            next,
            next_tried,
        } = fetched;
        let (tail_seq, hot_from_seq) = match &refs {
            Some(refs) => {
                page.tail = refs.next_seq.min(refs.tail_seq);
                (refs.tail_seq, refs.hot_from_seq)
            }
            // Nothing planned after the last section: the page is what is left of it. (Both
            // are replaced by the star's own when the page is claimed.)
            None => (last.end_seq, last.end_seq),
        };
        for section in sections {
            if page.full() {
                break;
            }
            // A section past the page's next record would leave a gap the page could not
            // see (it numbers records from where it is).
            if section.entry.start_seq > page.next_seq {
                return Err(corrupt(
                    &task.request.stream,
                    format!(
                        "a section from record {} follows a page at record {}",
                        section.entry.start_seq, page.next_seq
                    ),
                ));
            }
            page.take_from(section.entry.start_seq, section.bytes.clone())
                .map_err(|e| corrupt(&task.request.stream, e))?;
            taken = Some(section);
        }
        let served = Served {
            response: v1::ReadResponse {
                records: page.records.into_iter().map(Into::into).collect(),
                next_seq: page.next_seq,
                tail_seq,
            },
            permit,
            history: Some(History {
                stream_id,
                hot_from_seq,
                window,
            }),
            last: taken,
            next_tried,
        };
        if let Some(next) = next {
            self.hand_off(next, &served);
        }
        Ok(AheadPage {
            response: served.response,
            permit: served.permit,
            stream_id,
            window,
            last: served.last,
            next_tried: served.next_tried,
        })
    }

    /// The stream's refs from `request`'s first record on, at most `max_refs`.
    async fn refs(
        &self,
        request: &v1::ReadRequest,
        max_refs: u32,
    ) -> Result<v1::ResolveRefsResponse, Status> {
        Ok(self
            .star
            .call(&request.stream, |mut star| async move {
                star.resolve_refs(v1::ResolveRefsRequest {
                    stream: request.stream.clone(),
                    start_seq: request.start_seq,
                    max_refs,
                    start_timestamp: request.start_timestamp,
                })
                .await
            })
            .await?
            .into_inner())
    }

    /// A read past `--max-reads`: counted, logged (a line a second), refused with a hint.
    fn shed(&self, stream: &str, peer: Option<SocketAddr>) -> Status {
        self.metrics.sheds.with_label_values(&["max_reads"]).inc();
        let refusal = RequestError::CapReached {
            cap: "--max-reads",
            limit: self.max_reads as u64,
            what: "every read place of this gateway is taken; reads in progress are never cut",
            retry_after: SHED_RETRY_AFTER,
        };
        self.sheds.shed("max_reads", &refusal, Some(stream), peer);
        refusal.into()
    }

    /// A consumer's read, once: history from the object store, the rest forwarded to the star.
    /// With read-ahead on (`key`), the page after a history page is begun while it is read.
    async fn read_once(
        self: &Arc<Self>,
        request: &v1::ReadRequest,
        key: Option<&AheadKey>,
    ) -> Result<Served, Failure> {
        let plan = match self.plan(request).await? {
            Planned::Star => return self.forward(request).await,
            Planned::History(plan) => plan,
        };
        self.metrics.reads.with_label_values(&["history"]).inc();
        // The first window's share of the fetch pool, waited for in one go; the rest of the
        // page only if there is room as it goes (`fetch_sections`).
        let waited = Instant::now();
        let first = plan.first_charge;
        let permit = self.pool.acquire(first).await;
        tracing::trace!(
            waited_ms = waited.elapsed().as_millis() as u64,
            charge = first,
            "fetch pool"
        );
        let served = self.fetch(request, plan, permit, key).await;
        let in_use = self.pool.in_use() as i64;
        if in_use > self.metrics.fetch_pool_peak.get() {
            self.metrics.fetch_pool_peak.set(in_use);
        }
        served
    }

    /// Forwards `request` to the star, within the gateway's own caps, and charges its page to
    /// the pool once it arrives (the decoded page and its encoded copy), held until it is sent
    /// like a history page.
    async fn forward(&self, request: &v1::ReadRequest) -> Result<Served, Failure> {
        self.metrics.reads.with_label_values(&["star"]).inc();
        let (max_records, max_bytes) =
            read_caps(request, self.max_read_records, self.max_read_bytes);
        let forwarded = v1::ReadRequest {
            max_records,
            max_bytes,
            ..request.clone()
        };
        let page = self
            .star
            .call(&request.stream, |mut star| {
                let forwarded = forwarded.clone();
                async move { star.read(forwarded).await }
            })
            .await?
            .into_inner();
        let permit = self
            .pool
            .acquire(2 * prost::Message::encoded_len(&page) as u64)
            .await;
        Ok(Served {
            response: page,
            permit,
            history: None,
            last: None,
            next_tried: false,
        })
    }

    /// Asks the star for `request`'s refs and, for history, finds each ref's section in its
    /// object's footer: enough sections to fill the page (within the refs one answer holds).
    async fn plan(&self, request: &v1::ReadRequest) -> Result<Planned, Failure> {
        let refs = self.refs(request, PAGE_REFS).await?;
        // A read by time starts where the star's seek put the refs, never before the request.
        let start_seq = refs
            .refs
            .first()
            .map_or(request.start_seq, |r| r.start_seq.max(request.start_seq));
        if start_seq >= refs.hot_from_seq || refs.refs.is_empty() {
            return Ok(Planned::Star);
        }
        let (max_records, max_bytes) =
            read_caps(request, self.max_read_records, self.max_read_bytes);
        // Footers a window at a time (each window looked up to the end, so every footer
        // fetched is cached for the pages after this one), and no more windows once the page
        // is planned full.
        let mut sections: Vec<PlannedSection> = Vec::new();
        let mut planned = 0u64;
        // The bytes of the records the page takes, estimated: a section's length shared
        // evenly by its records.
        let mut taken = 0u64;
        let mut records_left = u64::from(max_records);
        'windows: for window in refs.refs.chunks(COLD_READ_REFS) {
            let footers =
                futures::future::join_all(window.iter().map(|r| self.footers.get(&r.object_key)))
                    .await;
            for (object_ref, footer) in window.iter().zip(footers) {
                let footer = footer.map_err(fetch_failure)?;
                let section = footer
                    .sections
                    .iter()
                    .find(|s| {
                        s.stream_id == object_ref.stream_id
                            && s.start_seq == object_ref.start_seq
                            && s.end_seq == object_ref.end_seq
                    })
                    .cloned()
                    .ok_or_else(|| {
                        Status::from(RequestError::DataLoss(format!(
                            "{} has no section for records {}..{} of stream {:?}",
                            object_ref.object_key,
                            object_ref.start_seq,
                            object_ref.end_seq,
                            request.stream
                        )))
                    })?;
                // Whole sections, the first too: a page that starts near a section's end ends
                // with it, rather than fetching another section for a few records more.
                planned += section.len;
                let available = section
                    .end_seq
                    .saturating_sub(section.start_seq.max(start_seq));
                let records = available.min(records_left);
                records_left -= records;
                taken += section.len * records
                    / section.end_seq.saturating_sub(section.start_seq).max(1);
                // Enough sections to fill the page's byte budget; more would be thrown away.
                let fills = planned >= max_bytes || records_left == 0;
                // The page is expected to end inside this section, not at its end: the next
                // page starts in it.
                let ends_inside = fills && (records < available || taken > max_bytes);
                sections.push(PlannedSection {
                    key: object_ref.object_key.clone(),
                    charge: 2 * section.len + records * PER_RECORD_BYTES,
                    entry: section,
                    keep: ends_inside,
                });
                if fills {
                    break 'windows;
                }
            }
        }
        let first_charge = sections.iter().take(COLD_READ_REFS).map(|s| s.charge).sum();
        Ok(Planned::History(Plan {
            refs,
            start_seq,
            max_records,
            max_bytes,
            sections,
            first_charge,
        }))
    }

    /// Fetches a planned history page from the fetch pool, `permit` holding its first
    /// window's charge, and builds it as its sections land. Once its sections are all on
    /// their way, begins the page after it (`key`: read-ahead is on for this read), which it
    /// hands over to when built.
    async fn fetch(
        self: &Arc<Self>,
        request: &v1::ReadRequest,
        plan: Plan,
        mut permit: BudgetPermit,
        key: Option<&AheadKey>,
    ) -> Result<Served, Failure> {
        let Plan {
            refs,
            start_seq,
            max_records,
            max_bytes,
            sections,
            first_charge: window,
        } = plan;
        let mut page = PageBuilder::new(
            start_seq,
            refs.next_seq.min(refs.tail_seq),
            max_records.max(1) as usize,
            max_bytes,
        );
        let mut last = None;
        let mut next = None;
        let mut next_tried = false;
        self.fetch_sections(
            // A page read ahead starts from this one's last section, handed over.
            if key.is_some() && self.ahead.budget.is_some() {
                unkept(sections)
            } else {
                sections
            },
            window,
            &mut permit,
            &self.pool,
            |section| {
                page.take_from(section.entry.start_seq, section.bytes.clone())
                    .map_err(|e| {
                        Status::from(RequestError::DataLoss(format!(
                            "stream {:?}: {e}",
                            request.stream
                        )))
                    })?;
                last = Some(section);
                Ok(page.full())
            },
            |section| {
                if let Some(key) = key {
                    next_tried = true;
                    next = self.begin_next(request, key, &section.entry, window);
                    self.count_begun("while_read", &next);
                }
            },
        )
        .await?;
        let mut records = page.records;
        if let Some(timestamp) = request.start_timestamp {
            // As the star does: pass over the records before the first one at `timestamp`.
            let first = records
                .iter()
                .position(|r| r.record.timestamp >= timestamp)
                .unwrap_or(records.len());
            records.drain(..first);
        }
        let served = Served {
            response: v1::ReadResponse {
                records: records.into_iter().map(Into::into).collect(),
                next_seq: page.next_seq,
                tail_seq: refs.tail_seq,
            },
            permit,
            history: refs.refs.first().map(|first| History {
                stream_id: first.stream_id,
                hot_from_seq: refs.hot_from_seq,
                window,
            }),
            last,
            next_tried,
        };
        if let Some(next) = next {
            self.hand_off(next, &served);
        }
        Ok(served)
    }

    /// Fetches `sections` with a window of them in flight (the next starts as any of them
    /// lands), checks each against its footer's crc32c, and offers each in order to `take`,
    /// until it says the page is full. `permit` holds the first window's charge (`window`)
    /// from `budget`; each later section is charged to `budget` before it is fetched, only if
    /// it has room now and `budget` stays at most half used (give or take a section per
    /// reader growing at the same moment), and the page ends before the first that finds
    /// none. Everything charged is held in `permit`. Once the last section is on its way
    /// (never if the page ended before it), `on_last` is told which it is.
    async fn fetch_sections(
        &self,
        sections: Vec<PlannedSection>,
        window: u64,
        permit: &mut BudgetPermit,
        budget: &Budget,
        mut take: impl FnMut(LastSection) -> Result<bool, Failure>,
        on_last: impl FnOnce(&PlannedSection),
    ) -> Result<(), Failure> {
        // A first window larger than the whole budget was charged only the budget: such a
        // page takes nothing more.
        let mut may_grow = permit.units() >= window;
        let fetch_one = |section: PlannedSection| {
            let tier = self.tier.clone();
            async move {
                let PlannedSection {
                    key, entry, keep, ..
                } = section;
                let bytes = tier
                    .fetch(&key, entry.offset, entry.len, keep)
                    .await
                    .map_err(|e| fetch_failure(&FetchError::Store(e)))?;
                verify_section(&bytes, &entry).map_err(|e| {
                    Failure::Status(RequestError::DataLoss(format!("{key}: {e}")).into())
                })?;
                Ok::<_, Failure>(LastSection { entry, bytes })
            }
        };
        let mut on_last = Some(on_last);
        let mut later = sections.into_iter();
        // Only GETs still running count against the window: one that lands before those
        // started ahead of it waits for them, without holding back the next GET.
        let mut window = InOrder::new();
        while window.running() < COLD_READ_REFS
            && let Some(section) = later.next()
        {
            if later.len() == 0
                && let Some(told) = on_last.take()
            {
                told(&section);
            }
            window.push(fetch_one(section));
        }
        loop {
            while let Some(fetched) = window.ready() {
                if take(fetched?)? {
                    return Ok(());
                }
            }
            // Keep the window full while the budget has room for the next section now, and
            // at most half of it is in use: a few long pages (of consumers slow to take them)
            // leave room for everyone's first window.
            while may_grow
                && window.running() < COLD_READ_REFS
                && let Some(next) = later.next()
            {
                let spare = budget.in_use() + next.charge <= budget.capacity() / 2;
                match spare
                    .then(|| budget.try_acquire_exact(next.charge))
                    .flatten()
                {
                    Some(charge) => {
                        permit.merge(charge);
                        if later.len() == 0
                            && let Some(told) = on_last.take()
                        {
                            told(&next);
                        }
                        window.push(fetch_one(next));
                    }
                    None => may_grow = false,
                }
            }
            if !window.land().await {
                return Ok(());
            }
        }
    }
}

/// A page read ahead for `request`, as the read would serve it now, or `None` if it is no
/// longer that: `refs` (the stream's refs from the request's first record, as the star gives
/// them now) must be of the same stream (ids are never reused: not one deleted and created
/// again under its name), still hold the page's first record (not trimmed), and reach past
/// its last (a star that took the stream back may have a lower tail). The tail is the star's
/// latest.
fn still_current(
    request: &v1::ReadRequest,
    page: AheadPage,
    refs: v1::ResolveRefsResponse,
) -> Option<Served> {
    let first = refs.refs.first()?;
    let seq = request.start_seq;
    if first.stream_id != page.stream_id
        || first.start_seq > seq
        || seq >= first.end_seq
        || page.response.next_seq > refs.tail_seq
    {
        return None;
    }
    let mut response = page.response;
    response.tail_seq = refs.tail_seq;
    Some(Served {
        response,
        permit: page.permit,
        history: Some(History {
            stream_id: page.stream_id,
            hot_from_seq: refs.hot_from_seq,
            window: page.window,
        }),
        last: page.last,
        next_tried: page.next_tried,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::clock::Clock;

    fn page(stream_id: u64, next_seq: u64) -> AheadPage {
        let metrics = GatewayMetrics::new();
        let budget = Budget::new(1 << 20, metrics.read_ahead.clone(), Clock::system());
        AheadPage {
            response: v1::ReadResponse {
                records: Vec::new(),
                next_seq,
                tail_seq: 50,
            },
            permit: budget.try_acquire(10).unwrap(),
            stream_id,
            window: 10,
            last: None,
            next_tried: false,
        }
    }

    fn refs(
        stream_id: u64,
        start_seq: u64,
        end_seq: u64,
        tail_seq: u64,
    ) -> v1::ResolveRefsResponse {
        v1::ResolveRefsResponse {
            refs: vec![v1::ObjectRef {
                object_key: "data/x".into(),
                stream_id,
                start_seq,
                end_seq,
            }],
            tail_seq,
            hot_from_seq: tail_seq,
            ..Default::default()
        }
    }

    fn request(start_seq: u64) -> v1::ReadRequest {
        v1::ReadRequest {
            stream: "s".into(),
            start_seq,
            ..Default::default()
        }
    }

    #[test]
    fn a_page_read_ahead_is_served_only_as_the_read_would_be_now() {
        let served = still_current(&request(10), page(7, 20), refs(7, 5, 15, 80)).unwrap();
        assert_eq!(served.response.tail_seq, 80, "the star's tail now");
        // The stream was deleted and created again under its name.
        assert!(still_current(&request(10), page(7, 20), refs(8, 5, 15, 80)).is_none());
        // Trimmed past the page's first record.
        assert!(still_current(&request(10), page(7, 20), refs(7, 12, 15, 80)).is_none());
        // A ref that does not hold the first record.
        assert!(still_current(&request(10), page(7, 20), refs(7, 0, 10, 80)).is_none());
        // A tail behind the page's end (a star that took the stream back).
        assert!(still_current(&request(10), page(7, 20), refs(7, 5, 15, 19)).is_none());
        // No refs at all.
        let none = v1::ResolveRefsResponse::default();
        assert!(still_current(&request(10), page(7, 20), none).is_none());
    }
}
