//! A global allocator that keeps a bounded number of bytes of large freed buffers resident, and
//! hands them out again instead of mapping fresh pages.
//!
//! With the tuning in [`super`], every buffer of [`super::MMAP_THRESHOLD`] or more is mapped on
//! its own and unmapped when freed, so that resident memory follows the formula. The price is
//! that every such buffer is written into pages never touched: each first write to a page
//! faults, and the kernel clears the page. A gateway serving cold reads allocates several such
//! buffers per page it serves (each fetched section's body, hyper's read buffers, the encoded
//! response), and a profile put a third of its CPU in those faults and unmaps.
//!
//! [`Reusing`] keeps up to [`keep_up_to`] bytes of freed mapped buffers, and serves a large
//! allocation from the smallest kept buffer that holds it and is at most twice its size. What a
//! reused buffer holds beyond the new request's last page is returned to the system first
//! (`madvise(MADV_DONTNEED)`), so a live buffer is never resident beyond the size asked for.
//! (A fresh mapping faults in only what is written, so the two differ for a buffer reserved
//! ahead of its bytes: tonic's decoder reserves a message's announced length when its header
//! arrives, and a reused buffer is then resident at that length while the bytes come in.)
//! Memory then stays within the formula plus the kept bytes. When a freed buffer does not fit
//! among the kept ones, the oldest kept ones are unmapped to make room (or it is, when larger
//! than the whole allowance). Zeroed allocations, over-aligned ones and buffers glibc did not
//! map on their own always take the ordinary path.
//!
//! Off (nothing kept) until [`keep_up_to`] is called with more than zero; a process that
//! installs it without calling that behaves exactly as with the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Buffers smaller than this are neither kept nor looked for: glibc serves them from its
/// arenas, whose free memory stays resident, so they do not fault.
pub const MIN_KEPT: usize = super::MMAP_THRESHOLD as usize;

/// The most buffers kept at once, whatever their sizes (the table is a fixed array: an
/// allocator cannot allocate for its own bookkeeping). A gateway page frees a dozen or more
/// large buffers at once (its section bodies, hyper's read buffers, the encoded response):
/// with 64 slots, keeping more bytes (`--recycle-buffer-mib`) made no difference to its page
/// faults, the slots running out first. Public for the tests.
#[doc(hidden)]
pub const SLOTS: usize = 256;

/// malloc's alignment on 64-bit glibc; a larger one goes through `posix_memalign`.
const MALLOC_ALIGN: usize = 16;

static CAPACITY: AtomicUsize = AtomicUsize::new(0);
/// The system's page size, learnt by [`keep_up_to`].
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static REUSED: AtomicU64 = AtomicU64::new(0);
static FRESH: AtomicU64 = AtomicU64::new(0);

/// Keeps at most `bytes` of freed large buffers for reuse from now on (0 keeps none). Those
/// kept beyond a lowered allowance, the oldest first, are unmapped at once. False, keeping
/// none, where the allocator is not glibc's malloc on 64-bit Linux (another malloc preloaded,
/// for one), whose chunk layout the keeping relies on.
pub fn keep_up_to(bytes: usize) -> bool {
    let supported = platform::glibc_malloc_in_use();
    if supported {
        PAGE.store(platform::page_size(), Ordering::Relaxed);
    }
    let capacity = if supported { bytes } else { 0 };
    CAPACITY.store(capacity, Ordering::Relaxed);
    let mut evicted = [0usize; SLOTS];
    let count = table::lock().make_room(0, capacity, &mut evicted);
    free_all(&evicted[..count]);
    supported || bytes == 0
}

/// What [`Reusing`] has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReuseStats {
    /// Bytes of freed buffers kept now.
    pub held: u64,
    /// Large allocations served from a kept buffer.
    pub reused: u64,
    /// Large allocations that found none and were mapped fresh (counted while keeping is on).
    pub fresh: u64,
}

pub fn stats() -> ReuseStats {
    ReuseStats {
        held: table::lock().bytes() as u64,
        reused: REUSED.load(Ordering::Relaxed),
        fresh: FRESH.load(Ordering::Relaxed),
    }
}

/// The global allocator: `#[global_allocator] static A: Reusing = Reusing;` in a binary.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reusing;

// SAFETY: every pointer handed out comes from the system allocator (malloc), directly or after
// a spell among the kept buffers, during which nothing else holds it; every pointer freed goes
// back to it (free) or among the kept buffers. Sizes are glibc's own (malloc_usable_size).
unsafe impl GlobalAlloc for Reusing {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(ptr) = take_kept(layout) {
            return ptr;
        }
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // A fresh mapping is zero already; a kept buffer would need clearing.
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is live and was allocated with `layout` (the caller's contract).
        if unsafe { keep(ptr, layout) } {
            return;
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && keeping(new_size, layout.align()) {
            // SAFETY: `ptr` came from malloc (alignment at most malloc's) and is live.
            let usable = unsafe { platform::usable_size(ptr) };
            if new_size <= usable {
                // A kept buffer larger than asked for: it grows into pages already its own.
                return ptr;
            }
            let new_layout = Layout::from_size_align(new_size, layout.align());
            if let Some(new) = new_layout.ok().and_then(take_kept) {
                // SAFETY: both are live, distinct buffers of at least `layout.size()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size());
                    self.dealloc(ptr, layout);
                }
                return new;
            }
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn keeping(size: usize, align: usize) -> bool {
    platform::SUPPORTED
        && size >= MIN_KEPT
        && align <= MALLOC_ALIGN
        && CAPACITY.load(Ordering::Relaxed) > 0
}

/// A kept buffer for `layout`, its pages past the request given back; `None` when keeping is
/// off or none is large enough.
fn take_kept(layout: Layout) -> Option<*mut u8> {
    if !keeping(layout.size(), layout.align()) {
        return None;
    }
    let taken = table::lock().take(layout.size());
    let Some((ptr, usable)) = taken else {
        FRESH.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    REUSED.fetch_add(1, Ordering::Relaxed);
    let page = PAGE.load(Ordering::Relaxed);
    let start = (ptr + layout.size()).next_multiple_of(page);
    let end = (ptr + usable) / page * page;
    if end > start {
        // SAFETY: [start, end) lies inside this buffer's own mapping, which nothing else uses.
        unsafe { platform::release(start, end - start) };
    }
    Some(ptr as *mut u8)
}

/// Keeps `ptr` when it is a buffer glibc mapped on its own and there is room; false when the
/// caller should free it.
///
/// # Safety
/// `ptr` is live and was allocated with `layout` by this allocator.
unsafe fn keep(ptr: *mut u8, layout: Layout) -> bool {
    if !keeping(layout.size(), layout.align()) {
        return false;
    }
    // SAFETY: `ptr` came from malloc and is live (the caller's contract).
    if !unsafe { platform::mapped_on_its_own(ptr) } {
        return false;
    }
    // SAFETY: as above.
    let usable = unsafe { platform::usable_size(ptr) };
    let mut evicted = [0usize; SLOTS];
    let count = {
        let mut table = table::lock();
        // Read under the lock, so a lowered allowance (which trims under it) is never passed.
        let capacity = CAPACITY.load(Ordering::Relaxed);
        if usable > capacity {
            return false;
        }
        let count = table.make_room(usable, capacity, &mut evicted);
        table.put(ptr as usize, usable);
        count
    };
    free_all(&evicted[..count]);
    true
}

/// Frees buffers taken out of the kept set (outside its lock: unmapping takes a while).
fn free_all(evicted: &[usize]) {
    for &old in evicted {
        // SAFETY: an evicted buffer came from malloc and nothing holds it any more.
        unsafe { libc::free(old as *mut libc::c_void) };
    }
}

mod table {
    use std::sync::{Mutex, MutexGuard};

    use super::SLOTS;

    /// The kept buffers, oldest first, as (address, usable size).
    pub(super) struct Table {
        kept: [(usize, usize); SLOTS],
        len: usize,
        bytes: usize,
    }

    static TABLE: Mutex<Table> = Mutex::new(Table {
        kept: [(0, 0); SLOTS],
        len: 0,
        bytes: 0,
    });

    pub(super) fn lock() -> MutexGuard<'static, Table> {
        // Nothing panics while holding it, so a poisoned lock still holds a whole table.
        TABLE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    impl Table {
        /// Bytes of the buffers kept.
        pub(super) fn bytes(&self) -> usize {
            self.bytes
        }

        /// The smallest kept buffer of at least `size` bytes and at most twice that, taken
        /// out. A much larger one is left for a request of its own size: giving it away would
        /// return most of its resident pages only for them to fault in again later.
        pub(super) fn take(&mut self, size: usize) -> Option<(usize, usize)> {
            let index = (0..self.len)
                .filter(|&i| self.kept[i].1 >= size && self.kept[i].1 / 2 <= size)
                .min_by_key(|&i| self.kept[i].1)?;
            Some(self.remove(index))
        }

        /// Takes out the oldest buffers until one of `usable` bytes fits under `capacity` and
        /// in a slot (with `usable` zero: until what is kept fits under `capacity`); their
        /// addresses go into `evicted` (to be freed outside the lock), and the count is
        /// returned.
        pub(super) fn make_room(
            &mut self,
            usable: usize,
            capacity: usize,
            evicted: &mut [usize; SLOTS],
        ) -> usize {
            // The oldest `count` are counted first and the rest moved down once: the table's
            // lock is global, and shifting it once per evicted buffer would hold it for up to
            // SLOTS times as long.
            let mut count = 0;
            let mut bytes = self.bytes;
            while count < self.len
                && ((usable > 0 && self.len - count == SLOTS) || bytes + usable > capacity)
            {
                evicted[count] = self.kept[count].0;
                bytes -= self.kept[count].1;
                count += 1;
            }
            if count > 0 {
                self.kept.copy_within(count..self.len, 0);
                self.len -= count;
                self.bytes = bytes;
            }
            count
        }

        /// Adds a buffer as the newest (room was made first).
        pub(super) fn put(&mut self, ptr: usize, usable: usize) {
            self.kept[self.len] = (ptr, usable);
            self.len += 1;
            self.bytes += usable;
        }

        fn remove(&mut self, index: usize) -> (usize, usize) {
            let entry = self.kept[index];
            self.kept.copy_within(index + 1..self.len, index);
            self.len -= 1;
            self.bytes -= entry.1;
            entry
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
mod platform {
    pub const SUPPORTED: bool = true;

    /// glibc's flag, in a chunk's size word (the word before the pointer), for a chunk mapped
    /// on its own.
    const IS_MMAPPED: usize = 0x2;

    /// # Safety
    /// `ptr` is live and came from malloc.
    pub unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: the caller's contract.
        unsafe { libc::malloc_usable_size(ptr as *mut libc::c_void) }
    }

    /// Whether glibc mapped this chunk on its own (so its pages past any request belong to it
    /// alone, and freeing it unmaps it).
    ///
    /// # Safety
    /// `ptr` is live and came from malloc.
    pub unsafe fn mapped_on_its_own(ptr: *mut u8) -> bool {
        // SAFETY: every glibc malloc chunk has its size word just before the pointer it hands
        // out ([`glibc_malloc_in_use`] was checked before anything is kept). Volatile: glibc
        // may flip another bit of it under its arena lock.
        let size_word = unsafe { (ptr as *const usize).sub(1).read_volatile() };
        size_word & IS_MMAPPED != 0
    }

    /// Whether `malloc` is glibc's: a buffer of 1 MiB from it shows in glibc's own figure for
    /// buffers mapped on their own. (Another malloc preloaded leaves that figure alone.)
    pub fn glibc_malloc_in_use() -> bool {
        const PROBE: usize = 1 << 20;
        // SAFETY: mallinfo2 reads glibc's bookkeeping; the buffer is freed at once, untouched.
        unsafe {
            let before = libc::mallinfo2().hblkhd;
            // black_box: a compiler may otherwise drop a malloc whose buffer nothing uses.
            let probe = std::hint::black_box(libc::malloc(PROBE));
            if probe.is_null() {
                return false;
            }
            let during = libc::mallinfo2().hblkhd;
            libc::free(probe);
            during >= before + PROBE
        }
    }

    pub fn page_size() -> usize {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page).unwrap_or(4096).max(1)
    }

    /// Gives the pages of [start, start + len) back to the system; they read as zero after.
    ///
    /// # Safety
    /// The range is page-aligned and lies inside a mapping nothing else uses.
    pub unsafe fn release(start: usize, len: usize) {
        // SAFETY: the caller's contract. A failure only leaves the pages resident.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")))]
mod platform {
    pub const SUPPORTED: bool = false;

    pub unsafe fn usable_size(_: *mut u8) -> usize {
        0
    }

    pub unsafe fn mapped_on_its_own(_: *mut u8) -> bool {
        false
    }

    pub unsafe fn release(_: usize, _: usize) {}

    pub fn glibc_malloc_in_use() -> bool {
        false
    }

    pub fn page_size() -> usize {
        4096
    }
}
