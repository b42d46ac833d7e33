//! A fetch answer as the pieces it is written in: the fields kafka-protocol encodes, and each
//! partition's record batch as it was made, not copied into the answer (a fetch's records are
//! nearly all of its bytes). Written out one piece after another, the pieces are exactly
//! kafka-protocol's encoding of the same answer (checked below for every version served).

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::protocol::Encodable;

/// The versions this writes: 4 (the first with the fields it writes) to 12 (the last without
/// topic ids).
pub const VERSIONS: std::ops::RangeInclusive<i16> = 4..=12;

/// Why an answer could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FetchFrameError {
    #[error("fetch version {0} is not one this writes")]
    Version(i16),
    #[error("encoding a fetch answer: {0}")]
    Encode(String),
}

fn encode_failed(error: impl std::fmt::Display) -> FetchFrameError {
    FetchFrameError::Encode(error.to_string())
}

/// `response` at `version`, after `header` (the frame's response header, already encoded),
/// with the frame's length prefix first: the pieces to write in order.
pub fn fetch_frame(
    header: &[u8],
    response: &FetchResponse,
    version: i16,
) -> Result<Vec<Bytes>, FetchFrameError> {
    if !VERSIONS.contains(&version) {
        return Err(FetchFrameError::Version(version));
    }
    let flexible = version >= 12;
    let mut pieces = Vec::new();
    let mut glue = BytesMut::with_capacity(256);
    glue.put_i32(0); // the frame's length, set at the end
    glue.put_slice(header);
    glue.put_i32(response.throttle_time_ms);
    if version >= 7 {
        glue.put_i16(response.error_code);
        glue.put_i32(response.session_id);
    } else if response.session_id != 0 {
        return Err(FetchFrameError::Encode(
            "a fetch session id set at a version without sessions".into(),
        ));
    }
    put_len(&mut glue, response.responses.len(), flexible);
    for topic in &response.responses {
        put_string(&mut glue, topic.topic.as_str(), flexible);
        put_len(&mut glue, topic.partitions.len(), flexible);
        for partition in &topic.partitions {
            put_partition(&mut glue, &mut pieces, partition, version)?;
        }
        if flexible {
            put_no_tags(&mut glue, topic.unknown_tagged_fields.len())?;
        }
    }
    if flexible {
        put_no_tags(&mut glue, response.unknown_tagged_fields.len())?;
    }
    pieces.push(glue.freeze());
    let total: usize = pieces.iter().map(Bytes::len).sum();
    let mut first = BytesMut::from(&pieces[0][..]);
    first[..4].copy_from_slice(&((total - 4) as i32).to_be_bytes());
    pieces[0] = first.freeze();
    Ok(pieces.into_iter().filter(|p| !p.is_empty()).collect())
}

/// One partition: its fields through kafka-protocol, with its records left out and put back
/// as a piece of their own.
fn put_partition(
    glue: &mut BytesMut,
    pieces: &mut Vec<Bytes>,
    partition: &PartitionData,
    version: i16,
) -> Result<(), FetchFrameError> {
    let flexible = version >= 12;
    let Some(records) = partition.records.as_ref().filter(|r| !r.is_empty()) else {
        partition.encode(glue, version).map_err(encode_failed)?;
        return Ok(());
    };
    // Encoded with empty records, the partition ends in their empty length (and, flexible,
    // its tagged fields' count): the records go in there.
    let without = partition.clone().with_records(Some(Bytes::new()));
    let mut encoded = BytesMut::new();
    without
        .encode(&mut encoded, version)
        .map_err(encode_failed)?;
    let tail = if flexible {
        // With no tagged field set, a version-12 partition ends in the compact length of empty
        // bytes (1) and its tagged fields' count (0). One with a tagged field set is written
        // whole (its records copied), so nothing is cut from the wrong place.
        let tagged = !partition.unknown_tagged_fields.is_empty()
            || partition.diverging_epoch != Default::default()
            || partition.current_leader != Default::default()
            || partition.snapshot_id != Default::default();
        if tagged || !encoded.ends_with(&[1, 0]) {
            partition.encode(glue, version).map_err(encode_failed)?;
            return Ok(());
        }
        2
    } else {
        4
    };
    encoded.truncate(encoded.len() - tail);
    glue.put_slice(&encoded);
    if flexible {
        put_varint(glue, records.len() as u64 + 1);
    } else {
        glue.put_i32(records.len() as i32);
    }
    pieces.push(std::mem::take(glue).freeze());
    pieces.push(records.clone());
    if flexible {
        glue.put_u8(0);
    }
    Ok(())
}

fn put_len(out: &mut BytesMut, len: usize, flexible: bool) {
    if flexible {
        put_varint(out, len as u64 + 1);
    } else {
        out.put_i32(len as i32);
    }
}

fn put_string(out: &mut BytesMut, text: &str, flexible: bool) {
    if flexible {
        put_varint(out, text.len() as u64 + 1);
    } else {
        out.put_i16(text.len() as i16);
    }
    out.put_slice(text.as_bytes());
}

/// The tagged fields of a struct that sets none (one whose client sent unknown ones back is
/// not written here).
fn put_no_tags(out: &mut BytesMut, unknown: usize) -> Result<(), FetchFrameError> {
    if unknown > 0 {
        return Err(FetchFrameError::Encode(
            "a fetch answer with unknown tagged fields".into(),
        ));
    }
    out.put_u8(0);
    Ok(())
}

fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::fetch_response::FetchableTopicResponse;
    use kafka_protocol::protocol::StrBytes;
    use proptest::prelude::*;

    /// A topic's name and its partitions: index and records.
    type Topic = (String, Vec<(i32, Option<Vec<u8>>)>);

    fn response(topics: Vec<Topic>) -> FetchResponse {
        FetchResponse::default()
            .with_throttle_time_ms(7)
            .with_responses(
                topics
                    .into_iter()
                    .map(|(name, partitions)| {
                        FetchableTopicResponse::default()
                            .with_topic(TopicName(StrBytes::from_string(name)))
                            .with_partitions(
                                partitions
                                    .into_iter()
                                    .map(|(index, records)| {
                                        let mut p = PartitionData::default()
                                            .with_partition_index(index)
                                            .with_error_code((index % 3) as i16)
                                            .with_high_watermark(i64::from(index) * 3)
                                            .with_last_stable_offset(9)
                                            .with_log_start_offset(i64::from(index) % 5)
                                            .with_records(records.map(Bytes::from));
                                        if index % 7 == 1 {
                                            // A tagged field (version 12 only) ending in 1.
                                            p.current_leader.leader_epoch = 1;
                                            p.current_leader.leader_id =
                                                kafka_protocol::messages::BrokerId(1);
                                        }
                                        p
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
    }

    proptest! {
        /// The pieces, written one after another, are kafka-protocol's own encoding of the
        /// answer, at every version written; each partition's records are a piece of their
        /// own, not copied.
        #[test]
        fn the_pieces_are_kafka_protocols_encoding(
            version in VERSIONS,
            topics in proptest::collection::vec(
                (
                    "[a-z]{1,12}",
                    proptest::collection::vec(
                        (0i32..100, proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300))),
                        0..4,
                    ),
                ),
                0..3,
            ),
        ) {
            let mut answer = response(topics);
            if version < 12 {
                // Tagged fields exist from version 12 on; kafka-protocol refuses them before.
                for p in answer.responses.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                    p.current_leader = Default::default();
                }
            }
            let header = [0, 0, 0, 42];
            let pieces = fetch_frame(&header, &answer, version).unwrap();
            let mut expected = BytesMut::new();
            expected.put_i32(0);
            expected.put_slice(&header);
            answer.encode(&mut expected, version).unwrap();
            let len = (expected.len() - 4) as i32;
            expected[..4].copy_from_slice(&len.to_be_bytes());
            let written: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            prop_assert_eq!(written, expected.to_vec());
            for records in answer
                .responses
                .iter()
                .flat_map(|t| &t.partitions)
                .filter(|p| p.current_leader == Default::default())
                .filter_map(|p| p.records.as_ref())
                .filter(|r| !r.is_empty())
            {
                prop_assert!(pieces.iter().any(|p| p.as_ptr() == records.as_ptr()));
            }
        }
    }
}
