//! Batches both ways, checked against kafka-protocol's own encoder and decoder.

use bytes::{Bytes, BytesMut};
use indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record as KRecord, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};
use nova_proto::domain::{Record, SequencedRecord};
use proptest::prelude::*;

use crate::batch::{BatchError, Measure, measure, records, split_batches};
use crate::encode::encode_batch;
use crate::mapping::{KafkaHeader, to_kafka, to_nova};

fn kafka_record(
    i: usize,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: &[(String, Option<Vec<u8>>)],
) -> KRecord {
    KRecord {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: 7,
        producer_epoch: 1,
        timestamp_type: TimestampType::Creation,
        offset: i as i64,
        sequence: i as i32,
        timestamp: 1_700_000_000_000 + i as i64 * 3,
        key: key.map(Bytes::from),
        value: value.map(Bytes::from),
        headers: headers
            .iter()
            .map(|(k, v)| (StrBytes::from_string(k.clone()), v.clone().map(Bytes::from)))
            .collect::<IndexMap<_, _>>(),
    }
}

fn produced(records: &[KRecord]) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

fn parse(data: Bytes) -> Result<(Measure, Vec<Record>), BatchError> {
    let mut total = Measure::default();
    let mut out = Vec::new();
    for batch in split_batches(data)? {
        total.add(measure(&batch.records, &batch.header)?);
        records(&batch.records, &batch.header, &mut out)?;
    }
    Ok((total, out))
}

/// A record's key, value and headers (names unique: kafka-protocol keeps them in a map).
type Fields = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(String, Option<Vec<u8>>)>,
);

fn record_strategy() -> impl Strategy<Value = Fields> {
    (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::collection::btree_map(
            "[a-z]{0,4}",
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            0..4,
        )
        .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
    )
}

proptest! {
    #[test]
    fn what_a_kafka_client_encodes_parses_to_the_same_records(
        fields in proptest::collection::vec(record_strategy(), 1..20),
    ) {
        let sent: Vec<KRecord> = fields
            .iter()
            .enumerate()
            .map(|(i, (k, v, h))| kafka_record(i, k.clone(), v.clone(), h))
            .collect();
        let (total, parsed) = parse(produced(&sent)).unwrap();
        prop_assert_eq!(total.records, sent.len() as u64);
        prop_assert_eq!(parsed.len(), sent.len());
        prop_assert_eq!(
            total.content_bytes,
            parsed.iter().map(Record::content_bytes).sum::<u64>()
        );
        for (record, sent) in parsed.iter().zip(&sent) {
            let back = to_kafka(record);
            prop_assert_eq!(back.timestamp, sent.timestamp);
            prop_assert_eq!(&back.key, &sent.key);
            prop_assert_eq!(&back.value, &sent.value);
            let headers: Vec<(String, Option<Bytes>)> = sent
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            prop_assert_eq!(back.headers, headers);
        }
    }

    #[test]
    fn a_fetched_batch_decodes_in_kafka_protocol_to_the_records_stored(
        fields in proptest::collection::vec(record_strategy(), 1..20),
        first_seq in 0u64..1 << 40,
    ) {
        let stored: Vec<SequencedRecord> = fields
            .iter()
            .enumerate()
            .map(|(i, (k, v, h))| SequencedRecord {
                seq: first_seq + i as u64,
                record: to_nova(
                    1_600_000_000_000 + (i as i64 * 7919) % 5000,
                    k.clone().map(Bytes::from),
                    v.clone().map(Bytes::from),
                    h.iter()
                        .map(|(n, v)| KafkaHeader {
                            name: Bytes::from(n.clone()),
                            value: v.clone().map(Bytes::from),
                        })
                        .collect(),
                ),
            })
            .collect();
        let mut encoded = encode_batch(&stored);
        // Ours parses it back exactly...
        let (_, parsed) = parse(encoded.clone()).unwrap();
        let expected: Vec<Record> = stored.iter().map(|r| r.record.clone()).collect();
        prop_assert_eq!(parsed, expected);
        // ...and so does kafka-protocol, offsets included (its crc check too).
        let decoded = RecordBatchDecoder::decode(&mut encoded).unwrap();
        prop_assert_eq!(decoded.records.len(), stored.len());
        for (k, s) in decoded.records.iter().zip(&stored) {
            let kafka = to_kafka(&s.record);
            prop_assert_eq!(k.offset, s.seq as i64);
            prop_assert_eq!(k.timestamp, kafka.timestamp);
            prop_assert_eq!(&k.key, &kafka.key);
            prop_assert_eq!(&k.value, &kafka.value);
            prop_assert_eq!(k.headers.len(), kafka.headers.len());
        }
    }

    #[test]
    fn arbitrary_bytes_are_refused_without_a_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse(Bytes::from(data));
    }

    #[test]
    fn a_flipped_bit_is_caught_by_the_checksum(
        fields in proptest::collection::vec(record_strategy(), 1..5),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let sent: Vec<KRecord> = fields
            .iter()
            .enumerate()
            .map(|(i, (k, v, h))| kafka_record(i, k.clone(), v.clone(), h))
            .collect();
        let mut data = produced(&sent).to_vec();
        // Past the batch length and magic, which fail differently.
        let at = 21 + at.index(data.len() - 21);
        data[at] ^= 1 << bit;
        let refused = matches!(parse(Bytes::from(data)), Err(BatchError::Checksum { .. }));
        prop_assert!(refused);
    }
}

/// Re-signs a batch after its fields were changed, so the parse gets past the checksum.
fn resign(data: &mut [u8]) {
    let crc = crc_fast::crc32_iscsi(&data[21..]);
    data[17..21].copy_from_slice(&crc.to_be_bytes());
}

#[test]
fn hostile_counts_are_refused_before_anything_is_sized_from_them() {
    let sent = [kafka_record(0, None, Some(b"v".to_vec()), &[])];
    // Two billion records declared in a batch of one.
    let mut data = produced(&sent).to_vec();
    data[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    resign(&mut data);
    assert!(matches!(
        parse(Bytes::from(data)),
        Err(BatchError::Truncated(_))
    ));
    // A negative record count.
    let mut data = produced(&sent).to_vec();
    data[57..61].copy_from_slice(&(-5i32).to_be_bytes());
    resign(&mut data);
    assert_eq!(
        parse(Bytes::from(data)).unwrap_err(),
        BatchError::Malformed("a negative record count")
    );
    // A record declaring a billion headers: its last byte is its header count (0); grow it
    // to a varint of 10^9 and fix the lengths around it.
    let mut data = produced(&sent).to_vec();
    let count_at = data.len() - 1;
    assert_eq!(data[count_at], 0);
    data.truncate(count_at);
    let mut raw = 2_000_000_000u64; // zigzag(10^9)
    while raw >= 0x80 {
        data.push((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    data.push(raw as u8);
    let grew = data.len() - count_at - 1;
    let batch_length = (data.len() - 12) as i32;
    data[8..12].copy_from_slice(&batch_length.to_be_bytes());
    // The record's length varint (one byte, right after the header) grows by as much.
    data[61] += 2 * grew as u8;
    resign(&mut data);
    assert!(matches!(
        parse(Bytes::from(data)),
        Err(BatchError::Truncated(_))
    ));
}

#[test]
fn old_message_formats_are_refused_by_name() {
    let mut data = produced(&[kafka_record(0, None, None, &[])]).to_vec();
    data[16] = 1;
    assert_eq!(parse(Bytes::from(data)).unwrap_err(), BatchError::Magic(1));
}
