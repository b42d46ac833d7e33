//! Index entries of flights that are acknowledged but not yet absorbed. Reads that miss the tail
//! cache find such records here, since the metastore does not know them yet. Bounded by the
//! backlog budget: a flight enters when it is acknowledged and leaves when its absorb commits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use nova_core::clock::Instant;

use parking_lot::Mutex;

use nova_core::catalog::IndexEntry;

#[derive(Debug, Default)]
pub struct PendingIndex {
    inner: Mutex<Inner>,
}

/// An unabsorbed flight: its slot, when it was acknowledged, and the (stream, end seq) keys of
/// its entries.
#[derive(Debug)]
struct PendingFlight {
    slot: u64,
    acked_at: Instant,
    keys: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Unabsorbed flights in slot order.
    flights: VecDeque<PendingFlight>,
    by_stream: HashMap<u64, BTreeMap<u64, IndexEntry>>,
}

impl PendingIndex {
    /// Adds an acknowledged flight's entries; `acked_at` starts its unabsorbed age.
    pub fn insert(&self, slot: u64, entries: Vec<IndexEntry>, acked_at: Instant) {
        let mut inner = self.inner.lock();
        let keys = entries.iter().map(|e| (e.stream_id, e.end_seq)).collect();
        for entry in entries {
            inner
                .by_stream
                .entry(entry.stream_id)
                .or_default()
                .insert(entry.end_seq, entry);
        }
        inner.flights.push_back(PendingFlight {
            slot,
            acked_at,
            keys,
        });
    }

    /// Forgets every flight up to and including `slot`: their entries are in the metastore now.
    pub fn absorbed_through(&self, slot: u64) {
        let mut inner = self.inner.lock();
        while inner.flights.front().is_some_and(|f| f.slot <= slot) {
            let Some(flight) = inner.flights.pop_front() else {
                break;
            };
            for (stream_id, end_seq) in flight.keys {
                if let Some(entries) = inner.by_stream.get_mut(&stream_id) {
                    entries.remove(&end_seq);
                    if entries.is_empty() {
                        inner.by_stream.remove(&stream_id);
                    }
                }
            }
        }
    }

    /// The unabsorbed entry holding `seq` of the stream.
    pub fn lookup(&self, stream_id: u64, seq: u64) -> Option<IndexEntry> {
        let inner = self.inner.lock();
        inner
            .by_stream
            .get(&stream_id)?
            .range(seq + 1..)
            .next()
            .filter(|(_, e)| e.start_seq <= seq)
            .map(|(_, e)| e.clone())
    }

    /// How long the oldest unabsorbed flight has waited since its ack, as of `now`.
    pub fn oldest_age(&self, now: Instant) -> Option<Duration> {
        self.inner
            .lock()
            .flights
            .front()
            .map(|f| now.saturating_duration_since(f.acked_at))
    }

    pub fn len(&self) -> usize {
        self.inner.lock().flights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(stream_id: u64, start: u64, end: u64) -> IndexEntry {
        IndexEntry {
            created_at_ms: 0,
            stream_id,
            start_seq: start,
            end_seq: end,
            object_key: format!("k{start}"),
            offset: 0,
            len: 1,
            crc32c: 0,
        }
    }

    #[test]
    fn entries_leave_when_absorbed() {
        let clock = nova_core::clock::Clock::system();
        let pending = PendingIndex::default();
        pending.insert(0, vec![entry(1, 0, 5)], clock.now());
        pending.insert(1, vec![entry(1, 5, 9), entry(2, 0, 3)], clock.now());
        assert_eq!(pending.lookup(1, 4).unwrap().start_seq, 0);
        assert_eq!(pending.lookup(1, 5).unwrap().start_seq, 5);
        assert!(pending.lookup(1, 9).is_none());
        pending.absorbed_through(0);
        assert!(pending.lookup(1, 4).is_none());
        assert_eq!(pending.len(), 1);
        pending.absorbed_through(1);
        assert!(pending.is_empty());
        assert!(pending.lookup(2, 0).is_none());
        assert_eq!(pending.oldest_age(clock.now()), None);
    }
}
