//! The reusing allocator installed as this test binary's global allocator: freed large buffers
//! are kept up to the allowance and served again, with their pages past the new request given
//! back, so a reused buffer is no more resident than a fresh one.
#![cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]

use std::sync::Mutex;

use nova_core::allocator::reuse::{self, Reusing};

#[global_allocator]
static ALLOCATOR: Reusing = Reusing;

const KIB: usize = 1024;
const PAGE: usize = 4096;

/// The allowance and the figures are process-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    nova_core::allocator::tune();
    // Start each test with nothing kept.
    assert!(reuse::keep_up_to(0));
    drop(vec![1u8; 256 * KIB]);
    guard
}

/// Whether each page of [start, start + len) is resident.
fn resident_pages(start: usize, len: usize) -> Vec<bool> {
    let first = start / PAGE * PAGE;
    let pages = (start + len - first).div_ceil(PAGE);
    let mut flags = vec![0u8; pages];
    // SAFETY: the range covers pages of a live mapping; `flags` has one byte per page.
    let rc = unsafe { libc::mincore(first as *mut libc::c_void, pages * PAGE, flags.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    flags.iter().map(|f| f & 1 == 1).collect()
}

/// Fills `count` buffers of `len` bytes, all live at once, then frees them.
fn fill_and_free(count: usize, len: usize) {
    let buffers: Vec<Vec<u8>> = (0..count).map(|_| filled(len)).collect();
    drop(buffers);
}

fn filled(len: usize) -> Vec<u8> {
    let mut buffer = Vec::with_capacity(len);
    buffer.resize(len, 7u8);
    buffer
}

#[test]
fn a_freed_buffer_serves_a_smaller_one_with_its_tail_given_back() {
    let _serial = serial();
    assert!(reuse::keep_up_to(8 << 20), "glibc malloc on 64-bit Linux");
    let before = reuse::stats();
    let big = filled(1024 * KIB);
    let address = big.as_ptr() as usize;
    drop(big);
    let kept = reuse::stats();
    assert!(kept.held >= 1024 * KIB as u64, "{kept:?}");

    let mut small = Vec::<u8>::with_capacity(600 * KIB);
    assert_eq!(
        small.as_ptr() as usize,
        address,
        "the kept buffer is served again"
    );
    let after = reuse::stats();
    assert_eq!(after.reused, before.reused + 1, "{after:?}");
    assert_eq!(after.held, 0, "taken out of the kept set: {after:?}");
    // Its pages up to the request are still resident (no fault to write them); those past
    // the request's last page were given back.
    let pages = resident_pages(address, 1024 * KIB - PAGE);
    let needed = (address + 600 * KIB).div_ceil(PAGE) - address / PAGE;
    assert!(
        pages[..needed].iter().all(|&r| r),
        "the head stays resident"
    );
    assert!(
        pages[needed..].iter().all(|&r| !r),
        "the tail was given back"
    );
    small.resize(600 * KIB, 3);
    assert!(small.iter().all(|&b| b == 3));
}

#[test]
fn what_is_kept_stays_within_the_allowance() {
    let _serial = serial();
    reuse::keep_up_to(2 << 20);
    fill_and_free(6, 700 * KIB);
    let stats = reuse::stats();
    assert!(stats.held <= 2 << 20, "{stats:?}");
    assert!(
        stats.held >= 1400 * KIB as u64,
        "two of them fit: {stats:?}"
    );
    // Lowered: what no longer fits is unmapped at once, oldest first.
    reuse::keep_up_to(800 * KIB);
    let lowered = reuse::stats();
    assert!(lowered.held <= 800 * KIB as u64, "{lowered:?}");
    assert!(
        lowered.held >= 700 * KIB as u64,
        "the newest stays: {lowered:?}"
    );
}

#[test]
fn at_most_slots_buffers_are_kept() {
    let _serial = serial();
    // Room for far more bytes than the slots hold, so the slots are what binds.
    reuse::keep_up_to((reuse::SLOTS + 6) * 256 * KIB);
    fill_and_free(reuse::SLOTS + 6, 130 * KIB);
    let slots = reuse::SLOTS as u64;
    let one = reuse::stats().held / slots;
    assert_eq!(reuse::stats().held, slots * one, "SLOTS of the same size");
    assert!((130 * KIB as u64..140 * KIB as u64).contains(&one), "{one}");
}

#[test]
fn a_buffer_grows_in_place_into_the_rest_of_a_kept_one() {
    let _serial = serial();
    reuse::keep_up_to(8 << 20);
    drop(filled(1024 * KIB));
    let mut growing = Vec::<u8>::with_capacity(600 * KIB);
    let address = growing.as_ptr() as usize;
    let reused = reuse::stats().reused;
    growing.resize(600 * KIB, 5);
    growing.reserve_exact(300 * KIB);
    assert_eq!(growing.as_ptr() as usize, address, "grown where it was");
    assert_eq!(reuse::stats().reused, reused, "no other buffer taken");
    growing.resize(900 * KIB, 6);
    assert!(growing[..600 * KIB].iter().all(|&b| b == 5));
    assert!(growing[600 * KIB..].iter().all(|&b| b == 6));
}

#[test]
fn buffers_from_the_arenas_are_never_kept() {
    let _serial = serial();
    reuse::keep_up_to(8 << 20);
    // Raise glibc's threshold so that a 256 KiB buffer comes from an arena, not a mapping of
    // its own: its pages are not its alone, so it must go back to glibc.
    // SAFETY: mallopt only changes malloc's parameters.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20) };
    let from_arena = filled(256 * KIB);
    drop(from_arena);
    let held = reuse::stats().held;
    // SAFETY: as above; back to Nova's setting.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, nova_core::allocator::MMAP_THRESHOLD) };
    assert_eq!(held, 0, "an arena chunk is not kept");
}

#[test]
fn a_growing_buffer_moves_into_a_kept_one_with_its_contents() {
    let _serial = serial();
    assert!(reuse::keep_up_to(8 << 20), "glibc malloc on 64-bit Linux");
    let kept = filled(2048 * KIB);
    let address = kept.as_ptr() as usize;
    drop(kept);
    let before = reuse::stats();
    let mut growing: Vec<u8> = (0..200 * KIB).map(|i| i as u8).collect();
    growing.reserve_exact(1500 * KIB);
    assert_eq!(growing.as_ptr() as usize, address);
    assert_eq!(reuse::stats().reused, before.reused + 1);
    assert!(growing.iter().enumerate().all(|(i, &b)| b == i as u8));
}

#[test]
fn zeroed_buffers_are_never_served_from_kept_ones() {
    let _serial = serial();
    assert!(reuse::keep_up_to(8 << 20), "glibc malloc on 64-bit Linux");
    drop(filled(1024 * KIB));
    let zeroed = vec![0u8; 900 * KIB];
    assert!(zeroed.iter().all(|&b| b == 0));
    assert!(reuse::stats().held >= 1024 * KIB as u64, "still kept");
}

#[test]
fn nothing_is_kept_while_the_allowance_is_zero() {
    let _serial = serial();
    let before = reuse::stats();
    drop(filled(1024 * KIB));
    let after = reuse::stats();
    assert_eq!(after.held, 0);
    assert_eq!(after.reused, before.reused);
    assert_eq!(after.fresh, before.fresh, "not even counted");
}

#[test]
fn a_kept_buffer_over_twice_the_request_is_left_for_a_larger_one() {
    let _serial = serial();
    assert!(reuse::keep_up_to(8 << 20), "glibc malloc on 64-bit Linux");
    drop(filled(2048 * KIB));
    let before = reuse::stats();
    let small = filled(600 * KIB);
    assert_eq!(reuse::stats().reused, before.reused, "mapped fresh instead");
    assert!(reuse::stats().held >= 2048 * KIB as u64);
    drop(small);
    let large = Vec::<u8>::with_capacity(1500 * KIB);
    assert_eq!(reuse::stats().reused, before.reused + 1);
    drop(large);
}
