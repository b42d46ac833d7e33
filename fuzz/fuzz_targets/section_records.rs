//! A section's record frames, as a reader walks them after the checksum: any bytes must give
//! records or an error, never a panic or an allocation beyond the input's size. The same bytes
//! cut into parts (as a fragment that references its bodies is) must read back the same.
#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_core::flight::section::RecordIter;

fuzz_target!(|data: &[u8]| {
    let section = Bytes::copy_from_slice(data);
    let mut skipping = RecordIter::new(section.clone());
    let _ = skipping.skip_records(data.first().copied().unwrap_or(0) as u64);
    let whole: Vec<_> = RecordIter::new(section.clone()).collect();
    // Cut where the input's last two bytes say.
    let cut = |i: usize| {
        data.get(data.len().wrapping_sub(i))
            .map_or(0, |b| *b as usize)
    };
    let (a, b) = (cut(1) % (data.len() + 1), cut(2) % (data.len() + 1));
    let (a, b) = (a.min(b), a.max(b));
    let parts: Arc<[Bytes]> =
        vec![section.slice(..a), section.slice(a..b), section.slice(b..)].into();
    let split: Vec<_> = RecordIter::over_parts(parts.clone()).collect();
    assert_eq!(whole, split, "a section reads differently in parts");
    let mut skipping = RecordIter::over_parts(parts);
    let _ = skipping.skip_records(data.first().copied().unwrap_or(0) as u64);
});
