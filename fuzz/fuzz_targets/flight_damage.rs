//! The corruption property: a valid flight built from the input, then one bit flipped or its
//! end cut off. Parsing must notice (header, footer and section checksums), and never panic.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_core::flight::section::encode_fragment;
use nova_core::flight::{FlightMeta, SectionInput, assemble_flight, parse_object};
use nova_core::record::Record;

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let (control, body) = data.split_at(6);
    let records: Vec<Record> = body
        .chunks(1 + control[0] as usize % 64)
        .map(|chunk| Record {
            timestamp: 7,
            headers: vec![],
            body: Bytes::copy_from_slice(chunk),
        })
        .collect();
    let sections = records
        .chunks(1 + control[1] as usize % 8)
        .enumerate()
        .map(|(i, batch)| SectionInput {
            stream_id: i as u64 + 1,
            stream: format!("s{i}"),
            start_seq: 0,
            fragments: vec![encode_fragment(batch.iter())],
        })
        .collect();
    let meta = FlightMeta {
        star: "fuzz".into(),
        epoch: 1,
        slot: 0,
        created_at_ms: 0,
    };
    let object = assemble_flight(meta, sections).0.to_bytes();
    assert!(parse_object(&object).is_ok(), "a fresh flight parses");
    let at = u32::from_le_bytes([control[2], control[3], control[4], 0]) as usize % object.len();
    if control[5] & 0x80 == 0 {
        let mut flipped = object.to_vec();
        flipped[at] ^= 1 << (control[5] & 7);
        assert!(parse_object(&flipped).is_err(), "a flipped bit at {at} went unnoticed");
    } else {
        assert!(parse_object(&object[..at]).is_err(), "a cut at {at} went unnoticed");
    }
});
