//! Stream manifests and the object keys a rebuild lists from the bucket.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nova_core::keys::{parse_slot, parse_stream_manifest};
use nova_core::manifest::StreamManifest;

fuzz_target!(|data: &[u8]| {
    let _ = StreamManifest::decode(data);
    if let Ok(key) = std::str::from_utf8(data) {
        let _ = parse_slot("chain/nova/0000000001/", key);
        let _ = parse_stream_manifest("streams/nova/", key);
    }
});
