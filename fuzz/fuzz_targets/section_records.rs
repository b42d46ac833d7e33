//! A section's record frames, as a reader walks them after the checksum: any bytes must give
//! records or an error, never a panic or an allocation beyond the input's size.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_core::flight::section::RecordIter;

fuzz_target!(|data: &[u8]| {
    let section = Bytes::copy_from_slice(data);
    let mut skipping = RecordIter::new(section.clone());
    let _ = skipping.skip_records(data.first().copied().unwrap_or(0) as u64);
    for record in RecordIter::new(section) {
        if record.is_err() {
            break;
        }
    }
});
