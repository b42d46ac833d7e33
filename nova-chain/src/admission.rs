//! The admission buffer: every appended batch is charged here from the moment the transport
//! learns its size until it resolves (acknowledged or failed), and the charge is what bounds the
//! star's write-side memory.
//!
//! A batch is charged in three steps, each no smaller than what the batch holds:
//!
//! 1. When the gRPC length prefix of its message arrives, before the body is buffered:
//!    `received_charge(len)`, an upper bound on everything the message can come to hold
//!    whatever its contents: the received bytes, and the fragment encoded beside them.
//! 2. Once the received bytes are read (`WireAppend`, no per-record allocation) the exact
//!    encoded size is known, and the charge shrinks to `receiving_charge`.
//! 3. Once encoded, the charge shrinks to `held_charge`: what the fragments keep alive, and the
//!    batch's bookkeeping, until resolution. A fragment made by copying holds its content plus
//!    framing (`encoded_charge`), and the received bytes are dropped; one that references its
//!    large bodies in the received message holds that message and the copied framing.
//!
//! The per-batch, per-record and per-header constants were measured with a counting allocator
//! (`tests/overhead.rs`, which fails if a batch ever holds more than it is charged).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nova_core::clock::{Clock, Instant};
use nova_core::flight::section::Fragment;

use parking_lot::Mutex;

use nova_core::budget::{Budget, BudgetPermit};
use nova_core::metrics::BudgetMetrics;

/// Bytes per batch beyond its records: the reply channel, the admission ticket, the batch's
/// entry in its flight, and what decoding keeps beside the received bytes.
pub const PER_BATCH_OVERHEAD: u64 = 2048;
/// Bytes per record once encoded: the fragment's frame fields.
pub const ENCODED_PER_RECORD: u64 = 16;
/// Bytes per header once encoded: its two length prefixes.
pub const ENCODED_PER_HEADER: u64 = 8;
/// How much larger than its wire form a batch's fragment can be. On the wire every record and
/// every header costs at least two bytes (a tag and a length); encoded, a record costs 16 bytes
/// of framing and a header 8, and content is copied as it is. So a fragment holds at most
/// content + 14 × records + 6 × headers ≤ 8 × the message's length, reached only by a message of
/// empty records.
pub const ENCODED_PER_WIRE_BYTE: u64 = 8;

/// The charge taken on a message's length prefix: enough for the received bytes and the largest
/// fragment a message of that length can encode to.
pub fn received_charge(wire_len: u64) -> u64 {
    received_charge_within(wire_len, u64::MAX)
}

/// `received_charge`, knowing that no batch that passes the caps encodes to more than
/// `largest_fragment` bytes (a batch that does not pass is refused before it is encoded).
pub fn received_charge_within(wire_len: u64, largest_fragment: u64) -> u64 {
    PER_BATCH_OVERHEAD
        + wire_len
        + wire_len
            .saturating_mul(ENCODED_PER_WIRE_BYTE)
            .min(largest_fragment)
}

/// The largest fragment a batch within the caps encodes to: its content, and the framing of
/// as many records and as many headers as `--max-batch-records` allows.
pub fn largest_fragment(max_batch_bytes: u64, max_batch_records: u32) -> u64 {
    max_batch_bytes + (ENCODED_PER_RECORD + ENCODED_PER_HEADER) * max_batch_records as u64
}

/// The most one batch can hold at once (its received message and its fragment), whatever the
/// buffer's size: a batch charged more than the whole buffer is clamped to it, so the buffer's
/// real bound is the larger of the two.
pub fn largest_batch_hold(max_message: u64, largest_fragment: u64) -> u64 {
    PER_BATCH_OVERHEAD + max_message + largest_fragment
}

/// The charge while a read request is encoded: its received bytes and its fragment, exactly.
pub fn receiving_charge(wire_len: u64, encoded_bytes: u64) -> u64 {
    PER_BATCH_OVERHEAD + wire_len + encoded_bytes
}

/// The charge from encoding until resolution: what the batch's fragments hold (see
/// `Fragment::held_bytes`) and its bookkeeping.
pub fn held_charge(fragments: &[Fragment]) -> u64 {
    PER_BATCH_OVERHEAD + fragments.iter().map(Fragment::held_bytes).sum::<u64>()
}

/// `held_charge` for a batch encoded by copying, from its counts.
pub fn encoded_charge(records: u64, headers: u64, content_bytes: u64) -> u64 {
    PER_BATCH_OVERHEAD + records * ENCODED_PER_RECORD + headers * ENCODED_PER_HEADER + content_bytes
}

#[derive(Debug, Clone)]
pub struct AdmissionBuffer {
    budget: Budget,
    tracker: Arc<Tracker>,
}

#[derive(Debug)]
struct Tracker {
    clock: Clock,
    next_id: AtomicU64,
    /// Admission time of every unresolved batch, oldest first. Bounded: each entry holds a
    /// charge, so there are at most capacity / PER_BATCH_OVERHEAD of them.
    admitted: Mutex<BTreeMap<u64, Instant>>,
}

/// A batch's charge. Dropping it resolves the batch: the bytes return to the buffer and the
/// batch stops counting toward the oldest-admitted age.
#[derive(Debug)]
pub struct Admitted {
    permit: BudgetPermit,
    id: u64,
    tracker: Arc<Tracker>,
}

impl Admitted {
    /// Gives back the part of the charge the batch no longer holds.
    pub fn shrink_to(&mut self, bytes: u64) {
        self.permit.shrink_to(bytes);
    }

    /// Moves up to `bytes` of the charge (leaving at least one unit) into a permit of its own,
    /// for memory that outlives the batch.
    pub fn split_off(&mut self, bytes: u64) -> Option<BudgetPermit> {
        self.permit.split_off(bytes)
    }

    /// Restarts the batch's age: it counts from when its message has arrived, not from when
    /// its prefix did, so a slow producer does not read as a stalled store.
    pub fn received(&self) {
        if let Some(at) = self.tracker.admitted.lock().get_mut(&self.id) {
            *at = self.tracker.clock.now();
        }
    }

    pub fn charged(&self) -> u64 {
        self.permit.units()
    }

    /// Grows the charge by `bytes` if `buffer` (the one it came from) has room now. It never
    /// waits: a batch that already holds a charge and waits for more could, with others doing
    /// the same, hold the whole buffer with none of them able to finish.
    pub fn try_grow(&mut self, buffer: &AdmissionBuffer, bytes: u64) -> bool {
        match buffer.budget.try_acquire(bytes) {
            Some(more) => {
                self.permit.merge(more);
                true
            }
            None => false,
        }
    }

    /// Moves up to `bytes` of the charge (leaving at least one unit) into a batch of its own,
    /// admitted when this one was: one received message that holds several batches (a Kafka
    /// produce request, one per partition) hands each its part.
    pub fn split_batch(&mut self, bytes: u64) -> Option<Admitted> {
        let permit = self.permit.split_off(bytes)?;
        let id = self.tracker.next_id.fetch_add(1, Ordering::Relaxed);
        let mut admitted = self.tracker.admitted.lock();
        let at = admitted
            .get(&self.id)
            .copied()
            .unwrap_or_else(|| self.tracker.clock.now());
        admitted.insert(id, at);
        Some(Admitted {
            permit,
            id,
            tracker: self.tracker.clone(),
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.tracker.admitted.lock().remove(&self.id);
    }
}

impl AdmissionBuffer {
    pub fn new(capacity_bytes: u64, metrics: BudgetMetrics, clock: Clock) -> Self {
        Self {
            budget: Budget::new(capacity_bytes, metrics, clock),
            tracker: Arc::new(Tracker {
                clock,
                next_id: AtomicU64::new(0),
                admitted: Mutex::default(),
            }),
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
        self.tracker
            .admitted
            .lock()
            .insert(id, self.tracker.clock.now());
        Admitted {
            permit,
            id,
            tracker: self.tracker.clone(),
        }
    }

    /// How long the oldest unresolved batch has been admitted.
    pub fn oldest_age(&self) -> Option<Duration> {
        // Ids follow admission order, but a batch's clock restarts when its message has
        // arrived, so the oldest is the smallest time, not the smallest id.
        let admitted = self.tracker.admitted.lock();
        let now = self.tracker.clock.now();
        admitted
            .values()
            .min()
            .map(|at| now.saturating_duration_since(*at))
    }

    pub fn unresolved(&self) -> usize {
        self.tracker.admitted.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[tokio::test(start_paused = true)]
    async fn resolution_releases_the_charge_and_the_age() {
        let buffer = AdmissionBuffer::new(10_000, Metrics::new().admission, Clock::system());
        assert_eq!(buffer.oldest_age(), None);
        let first = buffer.admit(encoded_charge(2, 0, 100)).await;
        Clock::system().sleep(Duration::from_millis(20)).await;
        let second = buffer.admit(100).await;
        assert_eq!(buffer.budget().in_use(), encoded_charge(2, 0, 100) + 100);
        assert!(buffer.oldest_age().unwrap() >= Duration::from_millis(20));
        drop(first);
        assert!(buffer.oldest_age().unwrap() < Duration::from_millis(20));
        drop(second);
        assert_eq!(buffer.oldest_age(), None);
        assert_eq!(buffer.budget().in_use(), 0);
    }
}
