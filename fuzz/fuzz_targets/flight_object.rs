//! A whole object from the bucket: header, sections, footer, trailer. Parsing must refuse what
//! is malformed, never panic, and a section that passes its checksum must decode.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_core::flight::section::RecordIter;
use nova_core::flight::{ObjectFooter, TailParse, parse_object, parse_tail};

fuzz_target!(|data: &[u8]| {
    // The reader's first step: the object's end, as fetched with a suffix read.
    let _ = matches!(parse_tail(data, data.len() as u64), Ok(TailParse::Footer(_)));
    if let Ok(ObjectFooter::Flight(flight)) = parse_object(data) {
        let object = Bytes::copy_from_slice(data);
        for entry in &flight.sections {
            let start = entry.offset as usize;
            let section = object.slice(start..start + entry.len as usize);
            for record in RecordIter::new(section) {
                let _ = record;
            }
        }
    }
});
