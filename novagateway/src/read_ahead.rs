//! Read-ahead: a consumer reading history in order asks next for the page that starts where
//! the one it just got ends, with the same caps. While that page is on its way to it, the
//! gateway fetches the next one, so a consumer waits for one round of object-store GETs per
//! two pages at most, not per page: with one page in flight per consumer, that wait is what
//! limited a cold read, not the fetch pool or the object store.
//!
//! A read-ahead is kept in a slot under the next request's key (stream, first sequence number,
//! page caps) until that request claims it, for at most `READ_AHEAD_TTL`. It is only ever a
//! history page (a read that would go to the star is not made ahead), never a read by time,
//! and is only started when there is room: its page is charged to its own budget
//! (`--read-ahead-bytes`, taken only if free, never waited for; its footers, when not cached,
//! are fetched through the fetch pool as a read's are), and the slots in use (each
//! with its task) are capped (`--max-read-aheads`). A read-ahead that finds no room, fails, or
//! would go to the star is dropped, and the request, when it comes, is read as if there had
//! been none. A claimed page keeps its charge until its response is sent.
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

use nova_core::budget::{Budget, BudgetPermit};
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
    max_records: u32,
    max_bytes: u64,
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
}

/// Why a read-ahead was dropped before its request came.
#[derive(Debug, Clone, Copy)]
pub enum Dropped {
    /// Its budget had no room for the page.
    NoRoom,
    /// The page would have come from the star.
    Hot,
    /// The read failed (the request, when it comes, is read again and meets the failure).
    Failed,
}

impl Dropped {
    pub fn label(self) -> &'static str {
        match self {
            Dropped::NoRoom => "no_room",
            Dropped::Hot => "hot",
            Dropped::Failed => "failed",
        }
    }
}

/// What a read-ahead's task hands over.
type Outcome = Result<AheadPage, Dropped>;

/// A slot taken by the request it was read ahead for.
pub struct Claimed {
    page: oneshot::Receiver<Outcome>,
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
        Some(Claimed { page: slot.page })
    }

    /// A slot for a read-ahead of `key`, unless read-ahead is off, one for `key` exists, every
    /// place is taken, or its budget has less room than `estimate` (the first window's charge
    /// of the page before it, likely close: a read-ahead bound to find no room is not begun).
    pub fn start(&self, key: AheadKey, estimate: u64) -> Option<Started> {
        let budget = self.budget.as_ref()?;
        let mut slots = self.slots.lock();
        if slots.contains_key(&key) {
            return None;
        }
        if budget.capacity().saturating_sub(budget.in_use()) < estimate {
            self.count("no_room");
            return None;
        }
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            self.count("cap");
            return None;
        };
        let place = Arc::new(place);
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        slots.insert(
            key.clone(),
            Slot {
                page: rx,
                started: Instant::now(),
                _place: place.clone(),
                id,
            },
        );
        self.metrics.read_ahead_slots.inc();
        Some(Started {
            tx,
            key,
            id,
            _place: place,
        })
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

    #[tokio::test]
    async fn off_starts_nothing() {
        let off = ReadAhead::new(None, 4, GatewayMetrics::new());
        assert!(off.start(key(1), 0).is_none());
        let no_slots = ahead(0);
        assert!(no_slots.start(key(1), 0).is_none());
        assert_eq!(outcome(&no_slots, "cap"), 0);
    }
}
