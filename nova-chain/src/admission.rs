//! The admission buffer: every appended batch is charged here from the moment its decoded form
//! exists until it resolves (acknowledged or failed), and the charge is what bounds the star's
//! write-side memory.
//!
//! A batch is charged its content bytes plus a fixed overhead per batch, per record and per
//! header: the structures that exist while it is in flight (the decoded request's per-record
//! structs, the encoded fragment's framing, the pending-ack bookkeeping). The constants were
//! measured with a counting allocator (`tests/overhead.rs`, which also keeps them honest).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use nova_core::budget::{Budget, BudgetPermit};
use nova_core::metrics::BudgetMetrics;

/// Bytes charged per batch beyond its records: the pending-ack entry, its reply channel, the
/// admission ticket, and the fragment's handle in the flight.
pub const PER_BATCH_OVERHEAD: u64 = 512;
/// Bytes charged per record beyond its content: the decoded request's record struct and the
/// encoded frame's fixed fields.
pub const PER_RECORD_OVERHEAD: u64 = 96;
/// Bytes charged per header beyond its name and value: the decoded header struct and the two
/// length prefixes in the frame.
pub const PER_HEADER_OVERHEAD: u64 = 80;

/// What one batch is charged.
pub fn charge_for(records: u64, headers: u64, content_bytes: u64) -> u64 {
    PER_BATCH_OVERHEAD
        + records * PER_RECORD_OVERHEAD
        + headers * PER_HEADER_OVERHEAD
        + content_bytes
}

#[derive(Debug, Clone)]
pub struct AdmissionBuffer {
    budget: Budget,
    tracker: Arc<Tracker>,
}

#[derive(Debug, Default)]
struct Tracker {
    next_id: AtomicU64,
    /// Admission time of every unresolved batch, oldest first. Bounded: each entry holds a
    /// charge, so there are at most capacity / PER_BATCH_OVERHEAD of them.
    admitted: Mutex<BTreeMap<u64, Instant>>,
}

/// A batch's charge. Dropping it resolves the batch: the bytes return to the buffer and the
/// batch stops counting toward the oldest-admitted age.
#[derive(Debug)]
pub struct Admitted {
    _permit: BudgetPermit,
    id: u64,
    tracker: Arc<Tracker>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.tracker.admitted.lock().remove(&self.id);
    }
}

impl AdmissionBuffer {
    pub fn new(capacity_bytes: u64, metrics: BudgetMetrics) -> Self {
        Self {
            budget: Budget::new(capacity_bytes, metrics),
            tracker: Arc::default(),
        }
    }

    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Charges `bytes` (clamped to the whole buffer), waiting for room. Cancel-safe.
    pub async fn admit(&self, bytes: u64) -> Admitted {
        let permit = self.budget.acquire(bytes).await;
        self.track(permit)
    }

    /// Charges `bytes` if there is room now.
    pub fn try_admit(&self, bytes: u64) -> Option<Admitted> {
        self.budget
            .try_acquire(bytes)
            .map(|permit| self.track(permit))
    }

    fn track(&self, permit: BudgetPermit) -> Admitted {
        let id = self.tracker.next_id.fetch_add(1, Ordering::Relaxed);
        self.tracker.admitted.lock().insert(id, Instant::now());
        Admitted {
            _permit: permit,
            id,
            tracker: self.tracker.clone(),
        }
    }

    /// How long the oldest unresolved batch has been admitted.
    pub fn oldest_age(&self) -> Option<Duration> {
        let admitted = self.tracker.admitted.lock();
        admitted.values().next().map(Instant::elapsed)
    }

    pub fn unresolved(&self) -> usize {
        self.tracker.admitted.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::metrics::Metrics;

    #[tokio::test]
    async fn resolution_releases_the_charge_and_the_age() {
        let buffer = AdmissionBuffer::new(10_000, Metrics::new().admission);
        assert_eq!(buffer.oldest_age(), None);
        let first = buffer.admit(charge_for(2, 0, 100)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = buffer.admit(100).await;
        assert_eq!(buffer.budget().in_use(), charge_for(2, 0, 100) + 100);
        assert!(buffer.oldest_age().unwrap() >= Duration::from_millis(20));
        drop(first);
        assert!(buffer.oldest_age().unwrap() < Duration::from_millis(20));
        drop(second);
        assert_eq!(buffer.oldest_age(), None);
        assert_eq!(buffer.budget().in_use(), 0);
    }
}
