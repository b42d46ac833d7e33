//! The memory allocator's settings and statistics, so that resident memory follows the memory
//! formula and not only the budgets' accounting.
//!
//! Nova's servers use glibc's malloc, tuned at start-up. Left alone it serves a long-running,
//! many-threaded server badly: each busy thread gets an arena of its own (up to eight per
//! core), a freed large buffer raises the size above which buffers are mapped on their own, so
//! later large buffers come from the arenas instead, and memory freed inside an arena stays
//! resident. Two hundred readers of 8 MiB pages then left a release-build star holding over a
//! gigabyte while its read budget never passed 64 MiB. Tuned:
//!
//! - at most [`ARENAS`] arenas (`M_ARENA_MAX`), so freed memory is shared across threads
//!   instead of stranded in one thread's arena;
//! - buffers of [`MMAP_THRESHOLD`] or more are mapped on their own and unmapped when freed
//!   (`M_MMAP_THRESHOLD`, which also stops glibc from raising it), so a page, a section or a
//!   flight gives its memory back the moment it is dropped;
//! - every [`TRIM_EVERY`], when the memory free inside the arenas has grown by more than
//!   [`TRIM_ABOVE`] since the last trim, `malloc_trim` returns the free pages to the system.
//!   (A trim hands pages back without taking them out of the arenas' free lists, so the free
//!   figure does not fall after it: the growth, not the level, says there is more to return.)
//!
//! Each setting an operator gives in glibc's own environment variables (`MALLOC_ARENA_MAX`,
//! `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`) wins over Nova's. docs/budgets.md has
//! the measurements behind the choice (against jemalloc and mimalloc too).

pub mod reuse;

use std::time::Duration;

/// The most arenas the servers' threads share.
pub const ARENAS: i32 = 2;

/// Allocations of this size or more are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD: i32 = 128 * 1024;

/// The free space at the top of an arena above which glibc shrinks it at once.
pub const TRIM_THRESHOLD: i32 = 1024 * 1024;

/// How often free memory inside the arenas is looked at, and returned when there is enough.
pub const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Growth of the free memory inside the arenas worth a `malloc_trim`.
pub const TRIM_ABOVE: u64 = 8 << 20;

/// What the allocator holds, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// In use by the program.
    pub allocated: u64,
    /// Taken from the system: the arenas plus the buffers mapped on their own.
    pub mapped: u64,
    /// Free inside the arenas: held by the allocator, not by the program. Resident unless a
    /// trim has returned its pages since (a trim does not lower this figure).
    pub retained: u64,
}

/// Set to `off`, leaves glibc's defaults alone (to measure what the tuning is worth; see
/// `benches/resident.sh`).
pub const TUNING_ENV: &str = "NOVA_MALLOC_TUNING";

/// Applies the settings above. Call it first thing in `main`, before any thread starts: the
/// arena limit only binds arenas created after it.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var(TUNING_ENV).is_ok_and(|v| v == "off") {
            return;
        }
        let set = |variable: &str, parameter: libc::c_int, value: libc::c_int| {
            if std::env::var_os(variable).is_none() {
                // SAFETY: mallopt only changes malloc's parameters; any value is accepted or
                // refused (returning 0), never unsafe.
                unsafe { libc::mallopt(parameter, value) };
            }
        };
        set("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, ARENAS);
        set(
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
        );
        set(
            "MALLOC_TRIM_THRESHOLD_",
            libc::M_TRIM_THRESHOLD,
            TRIM_THRESHOLD,
        );
    }
}

/// The allocator's figures now, where the allocator can tell.
pub fn stats() -> Option<AllocatorStats> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads malloc's own bookkeeping (under its locks).
        let info = unsafe { libc::mallinfo2() };
        Some(AllocatorStats {
            allocated: (info.uordblks + info.hblkhd) as u64,
            mapped: (info.arena + info.hblkhd) as u64,
            retained: info.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Returns the free memory inside the arenas to the system when it has grown by more than
/// [`TRIM_ABOVE`] since `*last` (the free figure after the previous trim); true when it
/// trimmed.
pub fn trim_if_worth_it(last: &mut u64) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let Some(now) = stats() else {
            return false;
        };
        if now.retained <= last.saturating_add(TRIM_ABOVE) {
            // Reused or still small: remember the lower level, so growth is measured from it.
            *last = (*last).min(now.retained);
            return false;
        }
        // SAFETY: malloc_trim releases free memory only; it takes malloc's locks.
        unsafe { libc::malloc_trim(0) };
        *last = stats().map_or(now.retained, |s| s.retained);
        return true;
    }
    #[allow(unreachable_code, reason = "the trim exists only on glibc")]
    {
        let _ = last;
        false
    }
}

/// Trims every [`TRIM_EVERY`] for as long as it runs (spawn it on the server's runtime, which
/// it leaves to a blocking thread for the trim itself: it walks every arena).
pub async fn trim_periodically(clock: crate::clock::Clock, trims: prometheus::IntCounter) {
    let mut last = 0;
    loop {
        clock.sleep(TRIM_EVERY).await;
        let trimmed = tokio::task::spawn_blocking(move || {
            let mut level = last;
            let trimmed = trim_if_worth_it(&mut level);
            (trimmed, level)
        })
        .await;
        if let Ok((trimmed, level)) = trimmed {
            last = level;
            if trimmed {
                trims.inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_large_buffer_leaves_nothing_resident() {
        tune();
        let before = stats().expect("glibc reports its figures");
        let buffer = vec![7u8; 8 << 20];
        let during = stats().unwrap();
        assert!(
            during.allocated >= before.allocated + (8 << 20),
            "{before:?} {during:?}"
        );
        drop(buffer);
        let after = stats().unwrap();
        // Mapped on its own and unmapped at free: not retained inside an arena.
        assert!(
            after.retained < before.retained + (1 << 20),
            "{before:?} {after:?}"
        );
        assert!(after.mapped < during.mapped, "{during:?} {after:?}");
    }
}
