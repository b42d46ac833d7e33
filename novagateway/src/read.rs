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
//! A consumer reading history in order gets its next page read ahead while this one is sent
//! (`read_ahead`).
//!
//! The auditor moves records to other objects and deletes the old ones a grace period later. A
//! read whose refs were vended before a move and whose fetch comes after the delete finds the
//! object gone: it asks the star for fresh refs and starts again, up to `STALE_REF_RETRIES`
//! times, so a consumer never sees the move.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use nova_core::budget::{Budget, BudgetPermit};
use nova_core::flight::page::PageBuilder;
use nova_core::flight::{FetchError, SectionEntry, verify_section};
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
use crate::read_ahead::{AheadKey, AheadPage, Dropped, ReadAhead};
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

/// The most sections one history page plans: enough for an 8 MiB page of sections of 256 KiB
/// or more, four times the window. What a read holds while planning (the refs and each
/// section's footer entry, stream name included) stays within `PER_READ_BYTES`.
const PAGE_REFS: u32 = 32;

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
}

/// One attempt's page: the response, its charge, and for a history page, the stream's id and
/// where the star's in-memory stretch began.
struct Served {
    response: v1::ReadResponse,
    permit: BudgetPermit,
    history: Option<History>,
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
        if let Some(claimed) = key.as_ref().and_then(|key| self.ahead.claim(key)) {
            let (page, refs) = tokio::join!(claimed.page(), self.refs(&request, 1));
            match (page, refs) {
                (Ok(page), Ok(refs)) => match still_current(&request, page, refs) {
                    Some(served) => {
                        self.ahead.count("used");
                        self.metrics.reads.with_label_values(&["history"]).inc();
                        self.read_ahead_after(&request, key.as_ref(), &served);
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
            match self.read_once(&request).await {
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
    /// page its consumer will ask for next, when that one is history too and a read-ahead has
    /// room.
    fn read_ahead_after(
        self: &Arc<Self>,
        request: &v1::ReadRequest,
        key: Option<&AheadKey>,
        served: &Served,
    ) {
        let (Some(history), Some(key)) = (served.history, key) else {
            return;
        };
        let response = &served.response;
        let next = response.next_seq;
        if response.records.is_empty() || next >= history.hot_from_seq.min(response.tail_seq) {
            return;
        }
        let (Some(budget), Some(started)) = (
            self.ahead.budget.clone(),
            self.ahead.start(key.at(next), history.window),
        ) else {
            return;
        };
        let next_request = v1::ReadRequest {
            start_seq: next,
            ..request.clone()
        };
        let reader = self.clone();
        // Bounded: a task per place, and places are capped (--max-read-aheads); a task keeps
        // its place until it ends: when its page is handed over, or once nobody can take it.
        tokio::spawn(async move {
            let mut started = started;
            let page = tokio::select! {
                page = reader.read_ahead_once(&next_request, &budget) => page,
                // Nobody can take the page: stop (a star that does not answer would otherwise
                // keep the place for as long as it is silent).
                () = started.abandoned() => return,
            };
            reader.ahead.finish(started, page);
        });
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
    async fn read_once(&self, request: &v1::ReadRequest) -> Result<Served, Failure> {
        let plan = match self.plan(request).await? {
            Planned::Star => return self.forward(request).await,
            Planned::History(plan) => plan,
        };
        self.metrics.reads.with_label_values(&["history"]).inc();
        // The first window's share of the fetch pool, waited for in one go; the rest of the
        // page only if there is room as it goes (`fetch`).
        let waited = Instant::now();
        let first = plan.first_charge;
        let permit = self.pool.acquire(first).await;
        tracing::trace!(
            waited_ms = waited.elapsed().as_millis() as u64,
            charge = first,
            "fetch pool"
        );
        let served = self.fetch(request, plan, permit, &self.pool).await;
        let in_use = self.pool.in_use() as i64;
        if in_use > self.metrics.fetch_pool_peak.get() {
            self.metrics.fetch_pool_peak.set(in_use);
        }
        served
    }

    /// A read ahead, once: only history, and only if its page's first window fits in the
    /// read-ahead budget now (the page grows as a read's does). Never clamped to the budget as
    /// a consumer's read is to the pool: a window larger than the whole budget is not read
    /// ahead.
    async fn read_ahead_once(
        &self,
        request: &v1::ReadRequest,
        budget: &Budget,
    ) -> Result<AheadPage, Dropped> {
        let plan = match self.plan(request).await {
            Ok(Planned::History(plan)) => plan,
            Ok(Planned::Star) => return Err(Dropped::Hot),
            Err(_) => return Err(Dropped::Failed),
        };
        let permit = budget
            .try_acquire_exact(plan.first_charge)
            .ok_or(Dropped::NoRoom)?;
        let served = self
            .fetch(request, plan, permit, budget)
            .await
            .map_err(|_| Dropped::Failed)?;
        let history = served.history.ok_or(Dropped::Failed)?;
        Ok(AheadPage {
            response: served.response,
            permit: served.permit,
            stream_id: history.stream_id,
            window: history.window,
        })
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
                let records = section
                    .end_seq
                    .saturating_sub(section.start_seq.max(start_seq))
                    .min(records_left);
                records_left -= records;
                sections.push(PlannedSection {
                    key: object_ref.object_key.clone(),
                    charge: 2 * section.len + records * PER_RECORD_BYTES,
                    entry: section,
                });
                // Enough sections to fill the page's byte budget; more would be thrown away.
                if planned >= max_bytes || records_left == 0 {
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

    /// Fetches a planned history page with a window of sections in flight. `permit` holds
    /// the first window's charge from `budget`; each later section is charged to `budget`
    /// before it is fetched, only if it has room now and `budget` stays at most half used
    /// (give or take a section per reader growing at the same moment), and the page ends
    /// before the first that finds none. Everything charged is held with the page.
    async fn fetch(
        &self,
        request: &v1::ReadRequest,
        plan: Plan,
        mut permit: BudgetPermit,
        budget: &Budget,
    ) -> Result<Served, Failure> {
        // A first window larger than the whole budget was charged only the budget: such a
        // page takes nothing more.
        let Plan {
            refs,
            start_seq,
            max_records,
            max_bytes,
            sections,
            first_charge: window,
        } = plan;
        let mut may_grow = permit.units() >= window;
        let mut page = PageBuilder::new(
            start_seq,
            refs.next_seq.min(refs.tail_seq),
            max_records.max(1) as usize,
            max_bytes,
        );
        let fetch_one = |section: PlannedSection| {
            let tier = self.tier.clone();
            async move {
                let PlannedSection { key, entry, .. } = section;
                let bytes = tier
                    .fetch(&key, entry.offset, entry.len)
                    .await
                    .map_err(|e| fetch_failure(&FetchError::Store(e)))?;
                verify_section(&bytes, &entry).map_err(|e| {
                    Failure::Status(RequestError::DataLoss(format!("{key}: {e}")).into())
                })?;
                Ok::<_, Failure>((entry.start_seq, bytes))
            }
        };
        let mut later = sections.into_iter();
        let mut in_flight: FuturesOrdered<_> =
            later.by_ref().take(COLD_READ_REFS).map(fetch_one).collect();
        while let Some(fetched) = in_flight.next().await {
            if page.full() {
                break;
            }
            let (start, bytes) = fetched?;
            page.take_from(start, bytes).map_err(|e| {
                Status::from(RequestError::DataLoss(format!(
                    "stream {:?}: {e}",
                    request.stream
                )))
            })?;
            // Keep the window full while the budget has room for the next section now, and
            // at most half of it is in use: a few long pages (of consumers slow to take them)
            // leave room for everyone's first window.
            if may_grow && let Some(next) = later.next() {
                let spare = budget.in_use() + next.charge <= budget.capacity() / 2;
                match spare
                    .then(|| budget.try_acquire_exact(next.charge))
                    .flatten()
                {
                    Some(charge) => {
                        permit.merge(charge);
                        in_flight.push_back(fetch_one(next));
                    }
                    None => may_grow = false,
                }
            }
        }
        let mut records = page.records;
        if let Some(timestamp) = request.start_timestamp {
            // As the star does: pass over the records before the first one at `timestamp`.
            let first = records
                .iter()
                .position(|r| r.record.timestamp >= timestamp)
                .unwrap_or(records.len());
            records.drain(..first);
        }
        Ok(Served {
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
        })
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
