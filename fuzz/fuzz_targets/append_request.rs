//! An Append message as it arrives off the wire, parsed without decoding and then validated
//! against the caps: malformed input is a problem to report, never a panic. A valid one encodes
//! to the same bytes whether its bodies are copied or referenced in the message.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_core::flight::section::{encode_wire_chunks, encode_wire_referenced};
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
        let copied = encode_wire_chunks(&request, 7, usize::MAX);
        if let Some(referenced) = encode_wire_referenced(&request, 7, usize::MAX) {
            assert_eq!(copied.len(), 1);
            assert_eq!(referenced.to_bytes(), copied[0].to_bytes());
            assert_eq!(referenced.crc32c(), copied[0].crc32c());
            let a: Vec<_> = referenced.iter().collect();
            let b: Vec<_> = copied[0].iter().collect();
            assert_eq!(a, b);
        }
    }
});
