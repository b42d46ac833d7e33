//! The tail window cache: acknowledged flights kept in memory for hot reads, within a byte
//! budget of its own. It takes the very fragments the admission buffer charged (no copy), so the
//! two budgets tile a record's life: admission until the ack, the cache after it.
//!
//! Eviction is strictly oldest-admitted first: flights enter in slot order, which is admission
//! order, and leave from the front. A flight larger than the whole budget is not cached at all
//! (logged and counted); its reads go to the object store.
//!
//! *Pinned* runs are the exception: records acknowledged before they are anywhere a read can
//! find them otherwise (an Express bundle held by a quorum of zones, not yet carried into a
//! Standard flight and the index). They are never evicted and not charged to this budget: the
//! express buffer holds their bytes until the run is unpinned, once the flight carrying them
//! is cached and indexed. So a read never finds a gap between the ack and the index.

use std::collections::{BTreeMap, HashMap, VecDeque};

use parking_lot::Mutex;

use crate::metrics::TailCacheMetrics;
use nova_core::flight::section::Fragment;

/// Bytes charged per cached batch beyond its fragment: the map entries that index it.
pub const PER_FRAGMENT_OVERHEAD: u64 = 128;

/// One stream's records from one flight.
#[derive(Debug, Clone)]
pub struct CachedRun {
    pub stream_id: u64,
    pub start_seq: u64,
    /// Exclusive.
    pub end_seq: u64,
    /// Fragments in sequence order, each with its first sequence number.
    pub fragments: Vec<(u64, Fragment)>,
}

impl CachedRun {
    fn charge(&self) -> u64 {
        self.fragments
            .iter()
            .map(|(_, f)| f.held_bytes() + PER_FRAGMENT_OVERHEAD)
            .sum()
    }
}

#[derive(Debug)]
struct CachedFlight {
    slot: u64,
    charge: u64,
    /// (stream id, end seq) of each run, to unlink them on eviction.
    runs: Vec<(u64, u64)>,
}

#[derive(Debug)]
struct Inner {
    used: u64,
    flights: VecDeque<CachedFlight>,
    by_stream: HashMap<u64, BTreeMap<u64, CachedRun>>,
    /// Pinned runs by stream and end seq (see the module's comment).
    pinned: HashMap<u64, BTreeMap<u64, CachedRun>>,
}

/// The run of `runs` holding `seq`, if any.
fn holding(runs: Option<&BTreeMap<u64, CachedRun>>, seq: u64) -> Option<&CachedRun> {
    runs?
        .range(seq + 1..)
        .next()
        .map(|(_, run)| run)
        .filter(|run| run.start_seq <= seq)
}

#[derive(Debug)]
pub struct TailCache {
    capacity: u64,
    inner: Mutex<Inner>,
    metrics: TailCacheMetrics,
}

impl TailCache {
    pub fn new(capacity: u64, metrics: TailCacheMetrics) -> Self {
        metrics.capacity.set(capacity as i64);
        Self {
            capacity,
            inner: Mutex::new(Inner {
                used: 0,
                flights: VecDeque::new(),
                by_stream: HashMap::new(),
                pinned: HashMap::new(),
            }),
            metrics,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used(&self) -> u64 {
        self.inner.lock().used
    }

    /// Caches an acknowledged flight's runs, evicting the oldest flights to make room.
    pub fn insert(&self, slot: u64, runs: Vec<CachedRun>) {
        let charge: u64 = runs.iter().map(CachedRun::charge).sum();
        if charge > self.capacity {
            self.metrics.skipped_flights.inc();
            tracing::info!(
                slot,
                bytes = charge,
                capacity = self.capacity,
                "flight is larger than the whole tail window cache (--tail-window-cache-mib); \
                 not cached, its reads go to the object store"
            );
            return;
        }
        let mut inner = self.inner.lock();
        while inner.used + charge > self.capacity {
            let Some(oldest) = inner.flights.pop_front() else {
                break;
            };
            inner.used -= oldest.charge;
            for (stream_id, end_seq) in oldest.runs {
                if let Some(runs) = inner.by_stream.get_mut(&stream_id) {
                    runs.remove(&end_seq);
                    if runs.is_empty() {
                        inner.by_stream.remove(&stream_id);
                    }
                }
            }
            self.metrics.evicted_flights.inc();
        }
        let keys = runs.iter().map(|r| (r.stream_id, r.end_seq)).collect();
        for run in runs {
            inner
                .by_stream
                .entry(run.stream_id)
                .or_default()
                .insert(run.end_seq, run);
        }
        inner.flights.push_back(CachedFlight {
            slot,
            charge,
            runs: keys,
        });
        inner.used += charge;
        self.metrics.in_use.set(inner.used as i64);
        self.metrics.flights.set(inner.flights.len() as i64);
    }

    /// Keeps `run` readable until `unpin` (see the module's comment).
    pub fn pin(&self, run: CachedRun) {
        let mut inner = self.inner.lock();
        inner
            .pinned
            .entry(run.stream_id)
            .or_default()
            .insert(run.end_seq, run);
    }

    /// Ends the pin of the stream's run ending at `end_seq`: the flight carrying it is cached and
    /// indexed by now.
    pub fn unpin(&self, stream_id: u64, end_seq: u64) {
        let mut inner = self.inner.lock();
        if let Some(runs) = inner.pinned.get_mut(&stream_id) {
            runs.remove(&end_seq);
            if runs.is_empty() {
                inner.pinned.remove(&stream_id);
            }
        }
    }

    /// Bytes held by pinned runs (charged to the express buffer, not to this cache).
    pub fn pinned_bytes(&self) -> u64 {
        let inner = self.inner.lock();
        inner
            .pinned
            .values()
            .flat_map(|runs| runs.values())
            .map(CachedRun::charge)
            .sum()
    }

    /// The cached or pinned run holding `seq` of the stream, if any.
    pub fn lookup(&self, stream_id: u64, seq: u64) -> Option<CachedRun> {
        let inner = self.inner.lock();
        let found = holding(inner.by_stream.get(&stream_id), seq)
            .or_else(|| holding(inner.pinned.get(&stream_id), seq))
            .cloned();
        match &found {
            Some(_) => self.metrics.hits.inc(),
            None => self.metrics.misses.inc(),
        }
        found
    }

    /// Whether the cache holds record `seq` of the stream, cached or pinned (without counting
    /// a hit or miss).
    pub fn contains(&self, stream_id: u64, seq: u64) -> bool {
        let inner = self.inner.lock();
        holding(inner.by_stream.get(&stream_id), seq).is_some()
            || holding(inner.pinned.get(&stream_id), seq).is_some()
    }

    /// The first sequence number of the stream the cache holds, cached or pinned, if any.
    pub fn earliest(&self, stream_id: u64) -> Option<u64> {
        let inner = self.inner.lock();
        let first = |runs: Option<&BTreeMap<u64, CachedRun>>| {
            runs.and_then(|runs| runs.values().next())
                .map(|run| run.start_seq)
        };
        match (
            first(inner.by_stream.get(&stream_id)),
            first(inner.pinned.get(&stream_id)),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drops a stream's cached records, returning their share of the budget: for a stream
    /// handed to another star, whose records this star will not serve again (if it leads the
    /// stream later, its cache starts over from the tail it takes up).
    pub fn forget_stream(&self, stream_id: u64) {
        let mut inner = self.inner.lock();
        inner.pinned.remove(&stream_id);
        let Some(runs) = inner.by_stream.remove(&stream_id) else {
            return;
        };
        // One pass over the cached flights (bounded by the budget), not one per run.
        let mut freed = 0;
        for flight in inner.flights.iter_mut() {
            flight.runs.retain(|(id, end_seq)| {
                if *id != stream_id {
                    return true;
                }
                let charge = runs.get(end_seq).map_or(0, CachedRun::charge);
                flight.charge -= charge;
                freed += charge;
                false
            });
        }
        // A flight left with nothing cached is no longer worth its place.
        inner.flights.retain(|f| !f.runs.is_empty());
        inner.used -= freed;
        self.metrics.in_use.set(inner.used as i64);
        self.metrics.flights.set(inner.flights.len() as i64);
    }

    /// Slots currently cached, oldest first (for tests and diagnostics).
    pub fn slots(&self) -> Vec<u64> {
        self.inner.lock().flights.iter().map(|f| f.slot).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use bytes::Bytes;

    fn run(stream_id: u64, start: u64, records: u64, bytes: usize) -> CachedRun {
        CachedRun {
            stream_id,
            start_seq: start,
            end_seq: start + records,
            fragments: vec![(
                start,
                Fragment::whole(Bytes::from(vec![0u8; bytes]), records),
            )],
        }
    }

    fn cache(capacity: u64) -> (TailCache, TailCacheMetrics) {
        let metrics = Metrics::new().tail_cache;
        (TailCache::new(capacity, metrics.clone()), metrics)
    }

    #[test]
    fn a_forgotten_stream_gives_its_share_back() {
        let unit = 1000 + PER_FRAGMENT_OVERHEAD;
        let (cache, _metrics) = cache(10 * unit);
        cache.insert(0, vec![run(1, 0, 10, 1000), run(2, 0, 10, 1000)]);
        cache.insert(1, vec![run(1, 10, 10, 1000)]);
        assert_eq!(cache.used(), 3 * unit);
        cache.forget_stream(1);
        assert_eq!(cache.used(), unit);
        assert_eq!(cache.slots(), [0], "a flight left empty is dropped");
        assert!(cache.lookup(1, 5).is_none() && cache.earliest(1).is_none());
        assert_eq!(cache.lookup(2, 5).unwrap().start_seq, 0);
        // Eviction afterwards accounts what is left, and nothing below zero.
        for slot in 2..12 {
            cache.insert(slot, vec![run(3, slot * 10, 10, 1000)]);
        }
        assert!(cache.used() <= cache.capacity());
        assert!(cache.lookup(2, 5).is_none());
    }

    #[test]
    fn evicts_oldest_flights_first() {
        let unit = 1000 + PER_FRAGMENT_OVERHEAD;
        let (cache, metrics) = cache(3 * unit);
        for slot in 0..3 {
            cache.insert(slot, vec![run(1, slot * 10, 10, 1000)]);
        }
        assert_eq!(cache.slots(), [0, 1, 2]);
        cache.insert(3, vec![run(1, 30, 10, 1000)]);
        assert_eq!(cache.slots(), [1, 2, 3], "the oldest flight went first");
        assert!(cache.lookup(1, 5).is_none(), "evicted records are gone");
        assert_eq!(cache.lookup(1, 15).unwrap().start_seq, 10);
        assert_eq!(cache.lookup(1, 39).unwrap().start_seq, 30);
        assert!(cache.lookup(1, 40).is_none());
        assert_eq!(metrics.evicted_flights.get(), 1);
        assert!(cache.used() <= cache.capacity());
    }

    #[test]
    fn a_flight_bigger_than_the_budget_is_skipped() {
        let (cache, metrics) = cache(5000);
        cache.insert(0, vec![run(1, 0, 1, 100)]);
        cache.insert(1, vec![run(1, 1, 1, 10_000)]);
        assert_eq!(metrics.skipped_flights.get(), 1);
        assert_eq!(cache.slots(), [0], "nothing was evicted for it");
        assert!(cache.lookup(1, 1).is_none());
    }

    #[test]
    fn pinned_runs_read_until_unpinned_and_outlive_eviction() {
        let unit = 1000 + PER_FRAGMENT_OVERHEAD;
        let (cache, _) = cache(2 * unit);
        cache.insert(0, vec![run(1, 0, 10, 1000)]);
        // Acknowledged at the zones, not yet in a flight: pinned, outside the budget.
        cache.pin(run(1, 10, 10, 1000));
        cache.pin(run(1, 20, 10, 1000));
        assert_eq!(cache.used(), unit);
        assert_eq!(cache.pinned_bytes(), 2 * unit);
        assert_eq!(cache.lookup(1, 25).unwrap().start_seq, 20);
        assert!(cache.contains(1, 10));
        // Eviction of every flight leaves the pinned runs readable.
        for slot in 1..4 {
            cache.insert(slot, vec![run(2, slot * 10, 10, 1000)]);
        }
        assert!(cache.lookup(1, 5).is_none(), "the flight was evicted");
        assert_eq!(cache.earliest(1), Some(10));
        assert_eq!(cache.lookup(1, 15).unwrap().end_seq, 20);
        // Carried into a flight covering both runs, then unpinned: the flight serves them.
        cache.insert(4, vec![run(1, 10, 20, 1000)]);
        cache.unpin(1, 20);
        cache.unpin(1, 30);
        assert_eq!(cache.pinned_bytes(), 0);
        assert_eq!(cache.lookup(1, 25).unwrap().start_seq, 10);
        // A forgotten stream's pins go with it.
        cache.pin(run(3, 0, 1, 10));
        cache.forget_stream(3);
        assert!(!cache.contains(3, 0));
    }

    #[test]
    fn streams_are_kept_apart() {
        let (cache, _) = cache(1 << 20);
        cache.insert(0, vec![run(1, 0, 5, 10), run(2, 100, 5, 10)]);
        assert_eq!(cache.lookup(2, 102).unwrap().stream_id, 2);
        assert!(cache.lookup(2, 2).is_none());
        assert!(cache.lookup(3, 0).is_none());
    }
}
