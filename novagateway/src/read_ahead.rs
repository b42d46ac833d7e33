//! Read-ahead: a consumer reading history in order asks next for the page that starts where
//! the one it just got ends, with the same caps. The gateway begins that page before this one
//! is done, once this page's last section is on its way. A page ends inside its last section
//! or at its end, so the next page starts there. When that section is at most an eighth of a
//! page, the sections after it are planned and fetched at once, so the consumer's GETs keep a
//! full window from one page into the next (planned within what the caps leave after the whole
//! section: the page may hold up to that section less than a consumer's own read would, never
//! more, so nothing fetched goes unread). Otherwise the page waits until this one is built and
//! then plans exactly the room it has left. Either way, this page hands over where it ended and
//! that section's bytes, and the next page is built from there.
//!
//! A read-ahead first takes a place (`--max-read-aheads`, each with its task); once the page
//! before knows where it ends, it opens a slot under the next request's key (stream, first
//! sequence number, page caps), kept until that request claims it, for at most
//! `READ_AHEAD_TTL`. It is only ever a history page (a read that would go to the star is not
//! made ahead), never a read by time, and is only made when there is room: its page, with
//! the section it starts in, is charged to its own budget (`--read-ahead-bytes`, taken
//! only if free, never waited for; its footers, when not cached, are fetched through the fetch
//! pool as a read's are). A read-ahead that finds no room, fails, or would go to the star is
//! dropped, and the request, when it comes, is read as if there had been none. A claimed page
//! keeps its charge until its response is sent. It begins the page after it in turn once its
//! last section is on its way and it has been claimed (by its task or by the claim, whichever
//! comes second), so pages are read ahead only for consumers that come for them, one ahead.
//!
//! A claim asks the star for the stream's refs while it waits for the page, and serves the
//! page only if it is still that stream's (same id: a stream deleted and created again under
//! its name is another stream) and its first record is still there (not trimmed), with the
//! tail as it is now. A history page's records never change, so the page is then what the
//! read would have served. (So a page read ahead costs the star two ResolveRefs, the
//! read-ahead's and the claim's, where a read makes one: cheap calls, answered from memory or
//! one index scan, against the object-store GETs the read-ahead overlaps.)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use bytes::Bytes;
use nova_core::budget::{Budget, BudgetPermit};
use nova_core::flight::SectionEntry;
use nova_proto::v1;

use crate::metrics::GatewayMetrics;

/// How long a read-ahead waits for its request; past it the slot and its bytes are freed.
pub const READ_AHEAD_TTL: Duration = Duration::from_secs(2);

/// How often slots past their TTL are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// `--read-ahead-bytes`' default: off. On a machine whose cores the store shares, the extra
/// requests in flight cost more than the overlap gives to consumers that ask for their next page
/// at once (docs/performance.md); 64MiB (the fetch pool's size) suits consumers that spend
/// time on each page, or a store a round trip away.
pub const READ_AHEAD_BYTES: &str = "0";

/// `--max-read-aheads`' default.
pub const MAX_READ_AHEADS: u32 = 64;

/// The request a read-ahead answers: every field that shapes a history page. Reads by time
/// are never made ahead.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AheadKey {
    stream: String,
    start_seq: u64,
    pub max_records: u32,
    pub max_bytes: u64,
}

impl AheadKey {
    /// The same read's key from `start_seq` on: the next page's, for a consumer reading in
    /// order (the caps do not change between its pages).
    pub fn at(&self, start_seq: u64) -> Self {
        AheadKey {
            start_seq,
            ..self.clone()
        }
    }

    /// The key of `request` read with these caps (the gateway's caps applied); `None` for a
    /// read by time.
    pub fn of(request: &v1::ReadRequest, max_records: u32, max_bytes: u64) -> Option<Self> {
        request.start_timestamp.is_none().then(|| AheadKey {
            stream: request.stream.clone(),
            start_seq: request.start_seq,
            max_records,
            max_bytes,
        })
    }
}

/// A page read ahead: the response and its charge, held until the response is sent.
pub struct AheadPage {
    pub response: v1::ReadResponse,
    pub permit: BudgetPermit,
    /// The id of the stream its records are from.
    pub stream_id: u64,
    /// The charge of its first window (see `read::History`).
    pub window: u64,
    /// Its last section, where the page after it starts.
    pub last: Option<LastSection>,
    /// Whether the page after it was begun while it was read (it had been claimed by then).
    pub next_tried: bool,
}

/// A page's last section: a page ends inside it or at its end, so the page after it starts
/// there, and takes its first records from these bytes instead of fetching them again.
#[derive(Clone)]
pub struct LastSection {
    pub entry: SectionEntry,
    /// Held by the page after it too, which is charged for them (`read::lead_charge`).
    pub bytes: Bytes,
}

/// Why a read-ahead was dropped before its request came.
#[derive(Debug, Clone, Copy)]
pub enum Dropped {
    /// Its budget had no room for the page.
    NoRoom,
    /// The page would have come from the star.
    Hot,
    /// Begun while the page before it was read, which then ended where no read-ahead is
    /// wanted (at the star's in-memory stretch, or the page failed).
    Unneeded,
    /// The read failed (the request, when it comes, is read again and meets the failure).
    Failed,
}

impl Dropped {
    pub fn label(self) -> &'static str {
        match self {
            Dropped::NoRoom => "no_room",
            Dropped::Hot => "hot",
            Dropped::Unneeded => "unneeded",
            Dropped::Failed => "failed",
        }
    }
}

/// What a read-ahead's task hands over.
type Outcome = Result<AheadPage, Dropped>;

/// A slot taken by the request it was read ahead for.
pub struct Claimed {
    page: oneshot::Receiver<Outcome>,
    /// The page's last section, if it was on its way before the claim: the claimer begins the
    /// page after it.
    pub launched: Option<Launched>,
}

impl Claimed {
    /// The page, once read (as long as a read takes: the claim's request is waiting for a read
    /// that began before it); why it was dropped otherwise.
    pub async fn page(self) -> Outcome {
        self.page.await.unwrap_or(Err(Dropped::Failed))
    }
}

struct Slot {
    page: oneshot::Receiver<Outcome>,
    started: Instant,
    /// Its place under `--max-read-aheads`, shared with its task: free once both are gone.
    _place: Arc<OwnedSemaphorePermit>,
    id: u64,
    /// Which of the page's task and its claim begins the page after it.
    next: Arc<Mutex<NextOwner>>,
}

/// A read-ahead's place under `--max-read-aheads`, held by its task (and its slot, once
/// open) until both are gone.
#[derive(Clone)]
pub struct Reserved {
    place: Arc<OwnedSemaphorePermit>,
    id: u64,
    next: Arc<Mutex<NextOwner>>,
}

/// The last section of a page read ahead, on its way: what the page after it is begun from.
pub struct Launched {
    pub entry: SectionEntry,
    /// The page's first window's charge: the room the page after it likely needs.
    pub window: u64,
}

/// Which begins the page after a page read ahead, once the page's last section is on its
/// way: the page's task if the page has been claimed by then (reading ahead only for a
/// consumer that has come for the page before), otherwise the claim, when it comes. Never
/// both.
#[derive(Default)]
struct NextOwner {
    claimed: bool,
    launched: Option<Launched>,
}

impl Reserved {
    /// The page's last section is on its way: `Some` (back) if the page has been claimed, and
    /// the caller begins the page after it; `None` if not, and the claim will.
    pub fn launched(&self, launched: Launched) -> Option<Launched> {
        let mut next = self.next.lock();
        if next.claimed {
            return Some(launched);
        }
        next.launched = Some(launched);
        None
    }
}

pub struct ReadAhead {
    /// Bytes of pages read ahead (`--read-ahead-bytes`); 0 turns read-ahead off.
    pub budget: Option<Budget>,
    places: Arc<Semaphore>,
    slots: Mutex<HashMap<AheadKey, Slot>>,
    next_id: AtomicU64,
    metrics: GatewayMetrics,
}

/// A read-ahead that has a slot, to be run by the caller: it reads the page and hands it to
/// [`ReadAhead::finish`], unless [`Started::abandoned`] comes first.
pub struct Started {
    tx: oneshot::Sender<Outcome>,
    key: AheadKey,
    id: u64,
    _place: Arc<OwnedSemaphorePermit>,
}

impl Started {
    /// Resolves once nobody can take the page any more (its slot went past the TTL, or the
    /// request that claimed it went away): the read may stop, giving back its place.
    pub async fn abandoned(&mut self) {
        self.tx.closed().await
    }
}

impl ReadAhead {
    /// Read-ahead is off without a budget or without slots.
    pub fn new(budget: Option<Budget>, max_read_aheads: u32, metrics: GatewayMetrics) -> Self {
        Self {
            budget: budget.filter(|_| max_read_aheads > 0),
            places: Arc::new(Semaphore::new(max_read_aheads as usize)),
            slots: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            metrics,
        }
    }

    /// Takes the slot of `key`, if there is one: its page, when [`Claimed::page`] is awaited
    /// (it may still be being read). The claimer counts the outcome.
    pub fn claim(&self, key: &AheadKey) -> Option<Claimed> {
        let slot = self.slots.lock().remove(key)?;
        self.metrics.read_ahead_slots.dec();
        let launched = {
            let mut next = slot.next.lock();
            next.claimed = true;
            next.launched.take()
        };
        Some(Claimed {
            page: slot.page,
            launched,
        })
    }

    /// A place for a read-ahead, unless read-ahead is off, every place is taken, or its
    /// budget has less room than `estimate` (the first window's charge of the page before it,
    /// likely close: a read-ahead bound to find no room is not begun). Its slot is opened
    /// later, once the page before it knows where it ends ([`ReadAhead::open`]).
    pub fn reserve(&self, estimate: u64) -> Option<Reserved> {
        let budget = self.budget.as_ref()?;
        if budget.capacity().saturating_sub(budget.in_use()) < estimate {
            self.count("no_room");
            return None;
        }
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            self.count("cap");
            return None;
        };
        Some(Reserved {
            place: Arc::new(place),
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            next: Arc::default(),
        })
    }

    /// Opens the slot of `key` for the read-ahead that holds `reserved`, unless one for `key`
    /// exists (then this read-ahead is not needed: dropping what it holds ends it).
    pub fn open(&self, reserved: &Reserved, key: AheadKey) -> Option<Started> {
        let mut slots = self.slots.lock();
        if slots.contains_key(&key) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        slots.insert(
            key.clone(),
            Slot {
                page: rx,
                started: Instant::now(),
                _place: reserved.place.clone(),
                id: reserved.id,
                next: reserved.next.clone(),
            },
        );
        self.metrics.read_ahead_slots.inc();
        Some(Started {
            tx,
            key,
            id: reserved.id,
            _place: reserved.place.clone(),
        })
    }

    /// `reserve` and `open` in one.
    #[cfg(test)]
    fn start(&self, key: AheadKey, estimate: u64) -> Option<Started> {
        if self.slots.lock().contains_key(&key) {
            return None;
        }
        let reserved = self.reserve(estimate)?;
        self.open(&reserved, key)
    }

    /// Hands a read-ahead's outcome to its slot. Each outcome is counted once: a page by its
    /// claimer (used or outdated) or by the sweep (expired); a read-ahead dropped while still
    /// in its slot here, one dropped after its claim by the claimer.
    pub fn finish(&self, started: Started, outcome: Outcome) {
        if let Err(why) = &outcome
            && self.remove_slot(&started.key, started.id)
        {
            self.count(why.label());
            return;
        }
        // Claimed, or still in its slot: the receiver takes it. (Past its TTL, the slot is
        // gone and the page drops here with its charge.)
        let _ = started.tx.send(outcome);
    }

    /// Frees the slots past their TTL, with their pages and charges. A page still being read
    /// is dropped when its task hands it over; the task keeps its place until it ends, as
    /// long as any read takes.
    pub fn sweep(&self) {
        let now = Instant::now();
        let expired: Vec<Slot> = self
            .slots
            .lock()
            .extract_if(|_, slot| now.duration_since(slot.started) >= READ_AHEAD_TTL)
            .map(|(_, slot)| slot)
            .collect();
        if expired.is_empty() {
            return;
        }
        self.metrics.read_ahead_slots.sub(expired.len() as i64);
        self.count_by("expired", expired.len() as u64);
        // The pages (megabytes each) are freed here, out of the lock every read takes.
        drop(expired);
    }

    /// Sweeps every `SWEEP_EVERY` while `ahead` is alive.
    pub async fn sweep_forever(ahead: std::sync::Weak<ReadAhead>) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match ahead.upgrade() {
                Some(ahead) => ahead.sweep(),
                None => return,
            }
        }
    }

    /// Removes the slot of `key` if it is still read-ahead `id`'s (not claimed, expired, or
    /// taken by a later read-ahead of the same key); whether it did.
    fn remove_slot(&self, key: &AheadKey, id: u64) -> bool {
        let mut slots = self.slots.lock();
        if slots.get(key).is_none_or(|slot| slot.id != id) {
            return false;
        }
        slots.remove(key);
        self.metrics.read_ahead_slots.dec();
        true
    }

    /// Counts a read-ahead's outcome (each is counted once, by what ends it).
    pub fn count(&self, outcome: &str) {
        self.count_by(outcome, 1);
    }

    fn count_by(&self, outcome: &str, n: u64) {
        self.metrics
            .read_aheads
            .with_label_values(&[outcome])
            .inc_by(n);
    }

    /// The slots in use (for tests).
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.slots.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::clock::Clock;

    fn ahead(places: u32) -> ReadAhead {
        let metrics = GatewayMetrics::new();
        let budget = Budget::new(1 << 20, metrics.read_ahead.clone(), Clock::system());
        ReadAhead::new(Some(budget), places, metrics)
    }

    fn key(seq: u64) -> AheadKey {
        AheadKey {
            stream: "s".into(),
            start_seq: seq,
            max_records: 10,
            max_bytes: 100,
        }
    }

    fn page(ahead: &ReadAhead, bytes: u64, next_seq: u64) -> AheadPage {
        AheadPage {
            response: v1::ReadResponse {
                records: Vec::new(),
                next_seq,
                tail_seq: 100,
            },
            permit: ahead.budget.as_ref().unwrap().try_acquire(bytes).unwrap(),
            stream_id: 1,
            window: bytes,
            last: None,
            next_tried: false,
        }
    }

    fn outcome(ahead: &ReadAhead, label: &str) -> u64 {
        ahead.metrics.read_aheads.with_label_values(&[label]).get()
    }

    fn in_use(ahead: &ReadAhead) -> u64 {
        ahead.budget.as_ref().unwrap().in_use()
    }

    #[tokio::test]
    async fn a_claim_takes_the_page_once_and_keeps_its_charge() {
        let ahead = ahead(4);
        let started = ahead.start(key(5), 0).unwrap();
        assert!(ahead.start(key(5), 0).is_none(), "one slot per key");
        ahead.finish(started, Ok(page(&ahead, 1000, 9)));
        assert!(ahead.claim(&key(6)).is_none(), "another key");
        let claimed = ahead.claim(&key(5)).unwrap().page().await.ok().unwrap();
        assert_eq!(claimed.response.next_seq, 9);
        assert_eq!(in_use(&ahead), 1000);
        assert!(ahead.claim(&key(5)).is_none(), "claimed once");
        assert_eq!(ahead.metrics.read_ahead_slots.get(), 0);
        drop(claimed);
        assert_eq!(in_use(&ahead), 0);
    }

    #[tokio::test]
    async fn a_claim_waits_for_a_page_still_being_read() {
        let ahead = ahead(4);
        let started = ahead.start(key(1), 0).unwrap();
        let claimed = ahead.claim(&key(1)).unwrap();
        assert_eq!(ahead.slots(), 0, "the slot is the claim's");
        let mut waiting = Box::pin(claimed.page());
        assert!(
            futures::FutureExt::now_or_never(waiting.as_mut()).is_none(),
            "nothing to take yet"
        );
        ahead.finish(started, Ok(page(&ahead, 10, 7)));
        assert_eq!(waiting.await.ok().map(|p| p.response.next_seq), Some(7));
    }

    #[tokio::test]
    async fn a_dropped_read_ahead_frees_its_slot_and_place() {
        let ahead = ahead(1);
        let started = ahead.start(key(1), 0).unwrap();
        assert!(ahead.start(key(2), 0).is_none(), "the only place is taken");
        assert_eq!(outcome(&ahead, "cap"), 1);
        ahead.finish(started, Err(Dropped::NoRoom));
        assert_eq!(outcome(&ahead, "no_room"), 1);
        assert_eq!(ahead.slots(), 0);
        assert!(ahead.claim(&key(1)).is_none());
        assert!(ahead.start(key(2), 0).is_some(), "the place came back");
    }

    #[tokio::test]
    async fn a_claim_of_a_read_ahead_that_failed_learns_why() {
        let ahead = ahead(2);
        let started = ahead.start(key(3), 0).unwrap();
        let claimed = ahead.claim(&key(3)).unwrap();
        ahead.finish(started, Err(Dropped::Hot));
        assert!(matches!(claimed.page().await, Err(Dropped::Hot)));
        assert_eq!(outcome(&ahead, "hot"), 0, "the claimer counts it");
    }

    #[tokio::test]
    async fn one_is_not_begun_when_the_page_before_it_would_not_fit() {
        let ahead = ahead(4);
        let held = ahead.budget.as_ref().unwrap().try_acquire(1 << 19).unwrap();
        assert!(ahead.start(key(1), (1 << 19) + 1).is_none());
        assert_eq!(outcome(&ahead, "no_room"), 1);
        assert!(ahead.start(key(1), 1 << 19).is_some());
        drop(held);
    }

    #[tokio::test]
    async fn pages_nobody_claims_are_freed_after_the_ttl() {
        let ahead = ahead(2);
        let started = ahead.start(key(1), 0).unwrap();
        ahead.finish(started, Ok(page(&ahead, 500, 2)));
        let reading = ahead.start(key(2), 0).unwrap();
        ahead.sweep();
        assert_eq!(ahead.slots(), 2, "not yet");
        // Age the slots instead of waiting out the TTL.
        for slot in ahead.slots.lock().values_mut() {
            slot.started -= READ_AHEAD_TTL;
        }
        ahead.sweep();
        assert_eq!(ahead.slots(), 0);
        assert_eq!(outcome(&ahead, "expired"), 2);
        assert_eq!(in_use(&ahead), 0, "its charge went");
        assert_eq!(ahead.metrics.read_ahead_slots.get(), 0);
        let third = ahead.start(key(3), 0).unwrap();
        assert!(
            ahead.start(key(4), 0).is_none(),
            "the task still reading keeps its place"
        );
        // Its page, when read, is dropped with its charge, and not counted again.
        ahead.finish(reading, Ok(page(&ahead, 500, 3)));
        assert_eq!(in_use(&ahead), 0);
        ahead.finish(third, Err(Dropped::Failed));
        assert_eq!(outcome(&ahead, "expired"), 2);
        assert_eq!(outcome(&ahead, "failed"), 1);
    }

    #[tokio::test]
    async fn a_read_ahead_nobody_can_take_is_abandoned() {
        use futures::FutureExt;
        let ahead = ahead(2);
        let mut waiting = ahead.start(key(1), 0).unwrap();
        assert!(
            waiting.abandoned().now_or_never().is_none(),
            "its slot waits"
        );
        let mut claimed = ahead.start(key(2), 0).unwrap();
        let claim = ahead.claim(&key(2)).unwrap();
        assert!(
            claimed.abandoned().now_or_never().is_none(),
            "its claimer waits"
        );
        drop(claim);
        assert!(
            claimed.abandoned().now_or_never().is_some(),
            "its claimer went away"
        );
        for slot in ahead.slots.lock().values_mut() {
            slot.started -= READ_AHEAD_TTL;
        }
        ahead.sweep();
        assert!(
            waiting.abandoned().now_or_never().is_some(),
            "its slot expired"
        );
    }

    fn launched(end_seq: u64) -> Launched {
        Launched {
            entry: SectionEntry {
                stream_id: 1,
                stream: "s".into(),
                start_seq: 0,
                end_seq,
                offset: 0,
                len: 10,
                crc32c: 0,
            },
            window: 20,
        }
    }

    #[tokio::test]
    async fn the_page_after_is_begun_by_the_task_or_by_the_claim_never_both() {
        let ahead = ahead(4);
        // The last section went out before the claim: the claim begins the next page.
        let reserved = ahead.reserve(0).unwrap();
        assert!(
            reserved.launched(launched(7)).is_none(),
            "its slot is not even open"
        );
        let _started = ahead.open(&reserved, key(1)).unwrap();
        let claimed = ahead.claim(&key(1)).unwrap();
        assert_eq!(claimed.launched.map(|l| l.entry.end_seq), Some(7));
        // Claimed first: the task begins it, and the claim has nothing to begin from.
        let reserved = ahead.reserve(0).unwrap();
        let _started = ahead.open(&reserved, key(2)).unwrap();
        let claimed = ahead.claim(&key(2)).unwrap();
        assert!(claimed.launched.is_none());
        assert_eq!(
            reserved.launched(launched(9)).map(|l| l.entry.end_seq),
            Some(9)
        );
    }

    #[tokio::test]
    async fn a_slot_is_opened_once_per_key() {
        let ahead = ahead(2);
        let first = ahead.reserve(0).unwrap();
        let second = ahead.reserve(0).unwrap();
        assert!(ahead.open(&first, key(3)).is_some());
        assert!(ahead.open(&second, key(3)).is_none());
        assert!(ahead.reserve(0).is_none(), "both places are taken");
        drop(second);
        assert!(
            ahead.reserve(0).is_some(),
            "the unneeded one's place came back"
        );
    }

    #[tokio::test]
    async fn off_starts_nothing() {
        let off = ReadAhead::new(None, 4, GatewayMetrics::new());
        assert!(off.start(key(1), 0).is_none());
        let no_slots = ahead(0);
        assert!(no_slots.start(key(1), 0).is_none());
        assert_eq!(outcome(&no_slots, "cap"), 0);
    }
}
