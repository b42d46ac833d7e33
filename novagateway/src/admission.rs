//! Which fetched ranges the object cache keeps.
//!
//! By default a range is cached only when it is asked for again while it is still remembered
//! as asked for. A consumer that reads history once (a backfill, a new consumer group starting
//! from the beginning, a replay) then passes through without evicting what other consumers
//! share, and a gateway does not map a cache's worth of fresh memory for ranges that nobody
//! reads twice: it drops them once sent, and the allocator hands their buffers to the next
//! fetch. The price is one more GET for a range many consumers read: the first request is not
//! cached, the second is (and concurrent second requests share one fetch).
//!
//! A reader whose page is expected to end inside a section (the last one its plan takes for the
//! page's caps) asks for it to be kept on its first request: the next page starts in it.
//!
//! What is remembered is a fixed table of 64-bit fingerprints of (object key, offset, length),
//! one slot per 8 KiB of cache, indexed by the fingerprint. A range whose slot another range
//! took since its first request counts as new again: the table forgets, it never grows.

use std::sync::atomic::{AtomicU64, Ordering};

/// Cache bytes per remembered request. Sections are from tens of KiB to 1 MiB (about 350 KiB
/// in the benchmarks), so the table has tens of slots per range the cache holds: a range asked
/// for again after a cache's worth of other first requests is forgotten about one time in 40
/// (one in 5 for 32 KiB sections).
const CACHE_BYTES_PER_SLOT: u64 = 8 << 10;
const MIN_SLOTS: u64 = 1024;
const MAX_SLOTS: u64 = 1 << 22;

/// When a fetched range is cached (`--object-cache-admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Admission {
    /// On its second request while the first is remembered.
    Repeat,
    /// On its first request.
    First,
}

/// Remembers the ranges asked for once.
pub struct Doorkeeper {
    slots: Box<[AtomicU64]>,
}

impl Doorkeeper {
    /// A table sized for an object cache of `cache_bytes`.
    pub fn for_cache(cache_bytes: u64) -> Self {
        let slots = Self::slots_for(cache_bytes);
        Self {
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slots_for(cache_bytes: u64) -> u64 {
        (cache_bytes / CACHE_BYTES_PER_SLOT).clamp(MIN_SLOTS, MAX_SLOTS)
    }

    /// The table's size for an object cache of `cache_bytes` (the formula counts it with the
    /// cache).
    pub fn bytes_for(cache_bytes: u64) -> u64 {
        Self::slots_for(cache_bytes) * std::mem::size_of::<AtomicU64>() as u64
    }

    /// Whether the range with this fingerprint was asked for before (and still remembered);
    /// either way it is remembered now.
    pub fn asked_before(&self, fingerprint: u64) -> bool {
        // Zero marks an empty slot, so a slot holds the fingerprint with its low bit set; the
        // slot is chosen from the fingerprint itself, which uses every slot.
        let mark = fingerprint | 1;
        let slot = &self.slots[(fingerprint % self.slots.len() as u64) as usize];
        slot.swap(mark, Ordering::Relaxed) == mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_new_once_then_known_until_its_slot_is_taken() {
        let door = Doorkeeper::for_cache(0);
        assert_eq!(door.slots.len() as u64, MIN_SLOTS);
        assert!(!door.asked_before(7));
        assert!(door.asked_before(7));
        assert!(door.asked_before(7));
        // Another fingerprint landing in the same slot displaces it.
        let other = 7 + 2 * MIN_SLOTS;
        assert!(!door.asked_before(other));
        assert!(!door.asked_before(7));
        // Zero is a fingerprint like any other, not an empty slot.
        assert!(!door.asked_before(0));
        assert!(door.asked_before(0));
    }

    #[test]
    fn every_slot_is_used() {
        let door = Doorkeeper::for_cache(0);
        for fingerprint in 0..MIN_SLOTS {
            assert!(!door.asked_before(fingerprint), "{fingerprint}");
        }
        assert!(door.slots.iter().all(|s| s.load(Ordering::Relaxed) != 0));
        for fingerprint in 0..MIN_SLOTS {
            assert!(door.asked_before(fingerprint), "{fingerprint}");
        }
    }

    #[test]
    fn the_table_follows_the_cache_within_its_bounds() {
        assert_eq!(Doorkeeper::bytes_for(0), MIN_SLOTS * 8);
        assert_eq!(Doorkeeper::bytes_for(256 << 20), 32768 * 8);
        assert_eq!(Doorkeeper::bytes_for(u64::MAX), MAX_SLOTS * 8);
    }
}
