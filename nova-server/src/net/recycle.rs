//! Recycled message buffers.
//!
//! A received append is copied into a buffer of its own size, which the batch's fragments then
//! reference until its flight has landed and the tail cache lets it go. The allocator maps a
//! buffer of [`MIN_RECYCLED`] or more on its own and unmaps it when freed
//! (`nova_core::allocator`), so every such message is written into pages never touched, and the
//! first write to each page faults it in and clears it: at saturation that was a fifth of the
//! star's CPU, more than checksumming every byte. So a buffer whose last reference is dropped
//! comes back here, already resident, and the next message that fills the same whole pages is
//! copied into it instead.
//!
//! A buffer is sized to end where its last page ends ([`page_fit`]): the pages a fresh buffer
//! for the message would be mapped in anyway. A message takes a kept buffer only of exactly
//! that size, so a recycled buffer never holds more memory than a fresh one would.
//!
//! What waits here is bounded: at most `capacity` bytes. When a buffer comes back to a full
//! pool, buffers of the size least recently asked for make room for it (or it is freed, when
//! nothing else can go), so a change of message sizes does not leave the pool holding sizes
//! nobody asks for.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use nova_core::prom::{counter_vec, gauge};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge, Registry};

/// Buffers smaller than this are neither kept nor looked for: the allocator serves them from
/// its arenas, whose free memory stays resident, so they do not fault.
pub const MIN_RECYCLED: usize = nova_core::allocator::MMAP_THRESHOLD as usize;

/// What glibc's malloc adds to a buffer it maps on its own, on 64-bit: its chunk header and the
/// size word it rounds the request up with (a mapped chunk is `align16(len + 8) + 8` bytes,
/// rounded up to whole pages).
const CHUNK_HEADER: usize = 24;
const PAGE: usize = 4096;

/// The capacity of a buffer for a message of `len` bytes: `len`, rounded up to where the last
/// page the allocator maps for it ends. No more memory than a buffer of exactly `len`.
pub fn page_fit(len: usize) -> usize {
    if len < MIN_RECYCLED {
        return len;
    }
    (len + CHUNK_HEADER).div_ceil(PAGE) * PAGE - CHUNK_HEADER
}

/// Kept buffers of one capacity; there is a shelf only while it holds some.
#[derive(Debug, Default)]
struct Shelf {
    buffers: Vec<Vec<u8>>,
    /// When a buffer of this size was last asked for or given back (the pool's own clock).
    last_used: u64,
}

#[derive(Debug, Default)]
struct Pool {
    /// Buffers by capacity.
    shelves: HashMap<usize, Shelf>,
    bytes: usize,
    clock: u64,
}

impl Pool {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Takes out buffers of the least recently used sizes other than `keep` until `room` more
    /// bytes fit under `capacity`, and hands them back to be freed (outside the lock); `None`,
    /// taking nothing, when even all of them would not make room.
    fn make_room(&mut self, room: usize, capacity: usize, keep: usize) -> Option<Vec<Vec<u8>>> {
        let others: usize = self
            .shelves
            .iter()
            .filter(|(size, _)| **size != keep)
            .map(|(size, shelf)| size * shelf.buffers.len())
            .sum();
        if self.bytes - others + room > capacity {
            return None;
        }
        let mut freed = Vec::new();
        while self.bytes + room > capacity {
            let Some(oldest) = self
                .shelves
                .iter()
                .filter(|(size, shelf)| **size != keep && !shelf.buffers.is_empty())
                .min_by_key(|(_, shelf)| shelf.last_used)
                .map(|(size, _)| *size)
            else {
                break;
            };
            if let Some(shelf) = self.shelves.get_mut(&oldest) {
                while self.bytes + room > capacity {
                    let Some(buf) = shelf.buffers.pop() else {
                        break;
                    };
                    self.bytes -= buf.capacity();
                    freed.push(buf);
                }
            }
        }
        self.shelves.retain(|_, shelf| !shelf.buffers.is_empty());
        Some(freed)
    }
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
                "Append messages of 128 KiB or more by where their buffer came from: reused (kept \
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

    /// An empty buffer that holds `len` bytes: a kept one of its [`page_fit`] when there is
    /// one, else a new one of that capacity.
    pub fn buffer(&self, len: usize) -> Buffer {
        let capacity = page_fit(len);
        let recycled = if len >= MIN_RECYCLED && self.capacity > 0 {
            let mut pool = self.pool.lock();
            let now = pool.tick();
            // A shelf exists only while it holds buffers, so the map never outgrows the pool.
            let buf = match pool.shelves.get_mut(&capacity) {
                Some(shelf) => {
                    let buf = shelf.buffers.pop();
                    if shelf.buffers.is_empty() {
                        pool.shelves.remove(&capacity);
                    } else {
                        shelf.last_used = now;
                    }
                    buf
                }
                None => None,
            };
            if let Some(buf) = &buf {
                pool.bytes -= buf.capacity();
                self.metrics.held.set(pool.bytes as i64);
            }
            buf
        } else {
            None
        };
        if len >= MIN_RECYCLED {
            let source = if recycled.is_some() {
                "reused"
            } else {
                "fresh"
            };
            self.metrics.buffers.with_label_values(&[source]).inc();
        }
        Buffer {
            buf: recycled.unwrap_or_else(|| Vec::with_capacity(capacity)),
            home: self.clone(),
        }
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        let size = buf.capacity();
        if size < MIN_RECYCLED || size > self.capacity {
            return;
        }
        let freed = {
            let mut pool = self.pool.lock();
            let Some(freed) = pool.make_room(size, self.capacity, size) else {
                return;
            };
            let now = pool.tick();
            buf.clear();
            pool.bytes += size;
            let shelf = pool.shelves.entry(size).or_default();
            shelf.last_used = now;
            shelf.buffers.push(buf);
            self.metrics.held.set(pool.bytes as i64);
            freed
        };
        // Unmapped after the lock is let go.
        drop(freed);
    }

    /// Bytes of buffers waiting here.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
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

    const K: usize = 1024;

    fn filled(recycler: &Recycler, len: usize) -> Bytes {
        let mut buffer = recycler.buffer(len);
        buffer.extend_from_slice(&vec![7; len]);
        buffer.freeze()
    }

    #[test]
    fn a_buffer_ends_where_its_last_page_would() {
        assert_eq!(page_fit(100 * K), 100 * K, "below the threshold: exact");
        assert_eq!(page_fit(256 * K), 260 * K - 24);
        assert_eq!(page_fit(256 * K - 24), 256 * K - 24);
        assert_eq!(page_fit(256 * K - 23), 260 * K - 24);
    }

    #[test]
    fn a_dropped_buffer_is_reused_for_a_message_filling_the_same_pages_only() {
        let recycler = Recycler::new(1 << 20, RecycleMetrics::unregistered());
        let first = filled(&recycler, 256 * K);
        let address = first.as_ptr();
        let slice = first.slice(10..20);
        drop(first);
        assert_eq!(recycler.held_bytes(), 0, "a slice still holds it");
        drop(slice);
        assert_eq!(recycler.held_bytes(), page_fit(256 * K));
        // A message a page shorter fits fewer pages: a buffer of its own.
        let shorter = recycler.buffer(252 * K);
        assert_eq!(shorter.buf.capacity(), page_fit(252 * K));
        assert_eq!(recycler.held_bytes(), page_fit(256 * K));
        // One that fills the same pages takes it, and reads its own bytes.
        let mut again = recycler.buffer(256 * K + 100);
        assert_eq!(recycler.held_bytes(), 0);
        again.extend_from_slice(&vec![9; 256 * K + 100]);
        let again = again.freeze();
        assert_eq!(again.as_ptr(), address);
        assert_eq!(again.len(), 256 * K + 100);
        assert!(again.iter().all(|&b| b == 9));
    }

    #[test]
    fn what_waits_is_bounded_and_sizes_nobody_asks_for_make_room() {
        let recycler = Recycler::new(3 * page_fit(256 * K), RecycleMetrics::unregistered());
        let big: Vec<Bytes> = (0..3).map(|_| filled(&recycler, 256 * K)).collect();
        drop(big);
        assert_eq!(recycler.held_bytes(), 3 * page_fit(256 * K), "full");
        // Small buffers are not kept.
        drop(filled(&recycler, 4 * K));
        assert_eq!(recycler.held_bytes(), 3 * page_fit(256 * K));
        // The workload moves to 200 KiB messages: their buffers push the old size out.
        let smaller: Vec<Bytes> = (0..3).map(|_| filled(&recycler, 200 * K)).collect();
        drop(smaller);
        let held = recycler.held_bytes();
        assert!(held <= 3 * page_fit(256 * K), "{held}");
        assert!(
            held >= 3 * page_fit(200 * K),
            "the new size is kept: {held}"
        );
        let reused = recycler.buffer(200 * K);
        assert_eq!(reused.buf.capacity(), page_fit(200 * K));
        assert!(recycler.held_bytes() < held, "and reused");
        // A buffer that cannot fit even with every other size gone frees nothing.
        let tight = Recycler::new(
            page_fit(256 * K) + page_fit(200 * K),
            RecycleMetrics::unregistered(),
        );
        let (x1, x2, y) = (
            filled(&tight, 256 * K),
            filled(&tight, 256 * K),
            filled(&tight, 200 * K),
        );
        drop(x1);
        drop(y);
        let full = tight.held_bytes();
        assert_eq!(full, page_fit(256 * K) + page_fit(200 * K));
        drop(x2);
        assert_eq!(
            tight.held_bytes(),
            full,
            "kept as it was, the 200 KiB one too"
        );
        // Nothing is kept with no room at all.
        let none = Recycler::new(0, RecycleMetrics::unregistered());
        drop(filled(&none, 256 * K));
        assert_eq!(none.held_bytes(), 0);
    }
}
