//! Recycled message buffers.
//!
//! A received append is copied into a buffer of exactly its size, which the batch's fragments
//! then reference until its flight has landed and the tail cache lets it go. A fresh buffer of
//! a few hundred KiB comes from the allocator as pages never touched, and the first write to
//! each page faults it in and clears it: at saturation that was a fifth of the star's CPU,
//! more than checksumming every byte. So a buffer whose last reference is dropped comes back
//! here, already resident, and the next message of its size (within [`slack`]) is copied into
//! it instead.
//!
//! What waits here is bounded: at most `capacity` bytes; a buffer that would pass it is freed.
//! Only buffers of at least [`MIN_RECYCLED`] bytes are kept (smaller ones come from the
//! allocator's own free lists without faults).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use nova_core::prom::{counter_vec, gauge};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge, Registry};

/// Buffers smaller than this are neither kept nor looked for.
pub const MIN_RECYCLED: usize = 32 * 1024;

/// The most a recycled buffer's capacity may exceed the message it takes: a page, or 1/32 of
/// the message for large ones. The charge is the message's size, so this is the most a
/// recycled buffer holds beyond its charge (an allocator rounds fresh ones up too).
pub fn slack(len: usize) -> usize {
    (len / 32).max(4096)
}

#[derive(Debug, Default)]
struct Pool {
    /// Buffers by capacity.
    by_capacity: BTreeMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

/// What the recycler does, for operators: how much it holds, and how often a message found a
/// buffer in it.
#[derive(Debug, Clone)]
pub struct RecycleMetrics {
    held: IntGauge,
    buffers: IntCounterVec,
}

impl RecycleMetrics {
    pub fn register(registry: &Registry) -> Self {
        Self {
            held: gauge(
                registry,
                "nova_recycle_buffer_bytes",
                "Bytes of append buffers kept for reuse (at most --recycle-buffer-mib).",
            ),
            buffers: counter_vec(
                registry,
                "nova_recycle_buffers_total",
                "Append messages of 32 KiB or more by where their buffer came from: reused (kept \
                 for reuse, already resident) or fresh (new from the allocator).",
                &["source"],
            ),
        }
    }

    #[cfg(test)]
    fn unregistered() -> Self {
        Self::register(&Registry::new())
    }
}

/// Buffers waiting to be written again; cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Recycler {
    pool: Arc<Mutex<Pool>>,
    capacity: usize,
    metrics: RecycleMetrics,
}

impl Recycler {
    /// Keeps at most `capacity` bytes of buffers.
    pub fn new(capacity: usize, metrics: RecycleMetrics) -> Self {
        Self {
            pool: Arc::default(),
            capacity,
            metrics,
        }
    }

    /// An empty buffer that holds `len` bytes: a recycled one when one fits, else a new one of
    /// exactly `len`.
    pub fn buffer(&self, len: usize) -> Buffer {
        let recycled = (len >= MIN_RECYCLED)
            .then(|| {
                let mut pool = self.pool.lock();
                let capacity = *pool.by_capacity.range(len..=len + slack(len)).next()?.0;
                let list = pool.by_capacity.get_mut(&capacity)?;
                let buf = list.pop()?;
                if list.is_empty() {
                    pool.by_capacity.remove(&capacity);
                }
                pool.bytes -= buf.capacity();
                self.metrics.held.set(pool.bytes as i64);
                Some(buf)
            })
            .flatten();
        if len >= MIN_RECYCLED {
            let source = if recycled.is_some() {
                "reused"
            } else {
                "fresh"
            };
            self.metrics.buffers.with_label_values(&[source]).inc();
        }
        Buffer {
            buf: recycled.unwrap_or_else(|| Vec::with_capacity(len)),
            home: self.clone(),
        }
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() < MIN_RECYCLED {
            return;
        }
        let mut pool = self.pool.lock();
        if pool.bytes + buf.capacity() > self.capacity {
            return;
        }
        buf.clear();
        pool.bytes += buf.capacity();
        self.metrics.held.set(pool.bytes as i64);
        pool.by_capacity
            .entry(buf.capacity())
            .or_default()
            .push(buf);
    }

    /// Bytes of buffers waiting here.
    pub fn held_bytes(&self) -> usize {
        self.pool.lock().bytes
    }
}

/// A buffer being filled; frozen into `Bytes` that give it back when the last of them drops.
#[derive(Debug)]
pub struct Buffer {
    buf: Vec<u8>,
    home: Recycler,
}

impl Buffer {
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(Returning(Some(self)))
    }
}

/// The owner behind frozen `Bytes`: gives the buffer back when dropped.
struct Returning(Option<Buffer>);

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |b| b.buf.as_slice())
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(Buffer { buf, home }) = self.0.take() {
            home.give_back(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(recycler: &Recycler, len: usize) -> Bytes {
        let mut buffer = recycler.buffer(len);
        buffer.extend_from_slice(&vec![7; len]);
        buffer.freeze()
    }

    #[test]
    fn a_dropped_buffer_is_reused_for_a_message_of_its_size_and_not_for_others() {
        let recycler = Recycler::new(1 << 20, RecycleMetrics::unregistered());
        let first = filled(&recycler, 256 * 1024);
        let address = first.as_ptr();
        let slice = first.slice(10..20);
        drop(first);
        assert_eq!(recycler.held_bytes(), 0, "a slice still holds it");
        drop(slice);
        assert_eq!(recycler.held_bytes(), 256 * 1024);
        // Far larger or smaller messages get buffers of their own.
        let other = filled(&recycler, 300 * 1024);
        assert_ne!(other.as_ptr(), address);
        let small = recycler.buffer(200 * 1024);
        assert_eq!(small.buf.capacity(), 200 * 1024);
        // One within the slack takes it, and reads its own bytes.
        let mut again = recycler.buffer(256 * 1024 - 100);
        assert_eq!(recycler.held_bytes(), 0);
        again.extend_from_slice(&vec![9; 256 * 1024 - 100]);
        let again = again.freeze();
        assert_eq!(again.as_ptr(), address);
        assert_eq!(again.len(), 256 * 1024 - 100);
        assert!(again.iter().all(|&b| b == 9));
    }

    #[test]
    fn what_waits_is_bounded_and_small_buffers_are_not_kept() {
        let recycler = Recycler::new(300 * 1024, RecycleMetrics::unregistered());
        let a = filled(&recycler, 128 * 1024);
        let b = filled(&recycler, 128 * 1024);
        let c = filled(&recycler, 128 * 1024);
        drop((a, b, c));
        assert_eq!(
            recycler.held_bytes(),
            256 * 1024,
            "the third would pass the bound"
        );
        drop(filled(&recycler, 4 * 1024));
        assert_eq!(recycler.held_bytes(), 256 * 1024);
    }
}
