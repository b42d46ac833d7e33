//! An Append message as it arrives off the wire, parsed without decoding and then validated
//! against the caps: malformed input is a problem to report, never a panic.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_proto::validate::{AppendCaps, validate_wire};
use nova_proto::wire::WireAppend;

fuzz_target!(|data: &[u8]| {
    let request = WireAppend::parse(Bytes::copy_from_slice(data));
    let caps = AppendCaps {
        max_batch_bytes: 1 << 20,
        max_batch_records: 1000,
        max_record_bytes: 1 << 20,
    };
    if validate_wire(&request, &caps).is_ok() {
        for record in request.records() {
            let _ = record;
        }
    }
});
