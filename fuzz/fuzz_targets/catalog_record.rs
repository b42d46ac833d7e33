//! Catalog records as the metastore hands them back: every decoder over any key and value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte splits the input into a key and a value.
    let split = data.first().map_or(0, |b| *b as usize).min(data.len());
    let (key, value) = data.split_at(split);
    let _ = nova_core::catalog::decode_every_kind(key, value);
});
