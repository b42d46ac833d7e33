//! A produce request's records field as a Kafka client (or anyone) sends it: split into
//! batches, measured and turned into records without a panic and without sizing anything from
//! a declared count. Whatever parses is written back out for a fetch, and that parses to the
//! same records.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nova_kafka::batch::{Codec, measure, records, split_batches};
use nova_kafka::encode::encode_batch;
use nova_proto::domain::SequencedRecord;

fuzz_target!(|data: &[u8]| {
    let Ok(batches) = split_batches(Bytes::copy_from_slice(data)) else {
        return;
    };
    for batch in batches {
        if batch.header.codec() != Ok(Codec::None) {
            continue;
        }
        let Ok(measured) = measure(&batch.records, &batch.header) else {
            continue;
        };
        let mut out = Vec::new();
        records(&batch.records, &batch.header, &mut out).expect("what measured parses");
        assert_eq!(out.len() as u64, measured.records);
        if out.is_empty() {
            continue;
        }
        let stored: Vec<SequencedRecord> = out
            .into_iter()
            .enumerate()
            .map(|(i, record)| SequencedRecord {
                seq: i as u64,
                record,
            })
            .collect();
        let written = encode_batch(&stored);
        let again = split_batches(written).expect("a written batch splits");
        let mut back = Vec::new();
        for batch in again {
            records(&batch.records, &batch.header, &mut back).expect("a written batch parses");
        }
        let expected: Vec<_> = stored.into_iter().map(|s| s.record).collect();
        assert_eq!(back, expected);
    }
});
