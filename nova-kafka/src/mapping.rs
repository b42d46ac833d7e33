//! How Kafka's topics and records map onto Nova's streams and records, both ways.
//!
//! **Topics.** Partition `p` of topic `t` is the stream `t/p` (`orders/0`, `orders/1`, …).
//! Kafka topic names never hold a `/`, so the mapping is one to one, and a stream whose name
//! does not have that shape is simply not a topic to Kafka clients.
//!
//! **Records.** A Kafka record has a timestamp, a key and a value (either may be null) and
//! headers (a UTF-8 name, a value that may be null). A Nova record has a timestamp, headers
//! (byte names and values) and a body. The value is the body; the key is a header with an
//! empty name, first; Kafka headers follow in order. What Nova has no slot for is written as
//! a header whose name starts with the byte 0xFF, which is not UTF-8 and so never the name of
//! a Kafka header:
//!
//! - `0xFF kafka:no-key`, first: the record has no key, though its first Kafka header has an
//!   empty name (which would otherwise read back as the key);
//! - `0xFF kafka:null-value`, last: the value is null (a tombstone), not empty;
//! - `0xFF kafka:null:NAME`: a Kafka header `NAME` whose value is null;
//! - `0xFF kafka:producer`, on the last record of a batch an idempotent producer sent: its
//!   producer id, epoch, first sequence number and record count (`ProducerMark`), from which a
//!   restarted star learns what that producer already wrote. Kafka clients do not see it.
//!
//! Read through Nova's own API, a record produced by a Kafka client shows its key as the
//! empty-named header; a record appended through Nova's API reads through Kafka with that
//! header as its key. Header names that are not UTF-8 (possible only through Nova's API) are
//! read through Kafka with each invalid sequence replaced by U+FFFD.

use bytes::{BufMut, Bytes, BytesMut};
use nova_proto::domain::{Header, Record};

/// Marks a record without a key whose first Kafka header has an empty name.
pub const NO_KEY: &[u8] = b"\xffkafka:no-key";
/// Marks a record whose value is null.
pub const NULL_VALUE: &[u8] = b"\xffkafka:null-value";
/// Prefixes the name of a Kafka header whose value is null.
pub const NULL_HEADER: &[u8] = b"\xffkafka:null:";

/// Names the mark an idempotent producer's batch carries on its first record.
pub const PRODUCER: &[u8] = b"\xffkafka:producer";

/// What an idempotent producer's batch was: enough to answer its retry with the offset it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerMark {
    pub producer_id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
    pub records: i32,
}

impl ProducerMark {
    const BYTES: usize = 18;

    pub fn header(&self) -> Header {
        let mut value = BytesMut::with_capacity(Self::BYTES);
        value.put_i64(self.producer_id);
        value.put_i16(self.epoch);
        value.put_i32(self.base_sequence);
        value.put_i32(self.records);
        Header {
            name: Bytes::from_static(PRODUCER),
            value: value.freeze(),
        }
    }

    /// The mark on `record`, if it has one.
    pub fn of(record: &Record) -> Option<Self> {
        let header = record.headers.iter().find(|h| h.name == PRODUCER)?;
        let value: &[u8; Self::BYTES] = header.value[..].try_into().ok()?;
        Some(Self {
            producer_id: i64::from_be_bytes(value[0..8].try_into().ok()?),
            epoch: i16::from_be_bytes(value[8..10].try_into().ok()?),
            base_sequence: i32::from_be_bytes(value[10..14].try_into().ok()?),
            records: i32::from_be_bytes(value[14..18].try_into().ok()?),
        })
    }
}

/// The longest topic name Kafka allows.
pub const MAX_TOPIC_BYTES: usize = 249;

/// A Kafka header as received; its name was checked to be UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaHeader {
    pub name: Bytes,
    pub value: Option<Bytes>,
}

/// A Kafka record's fields as a fetch sends them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// A produced record as a Nova record. A timestamp Kafka leaves unset (negative) becomes 0,
/// which the star stamps with its arrival time.
pub fn to_nova(
    timestamp: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Vec<KafkaHeader>,
) -> Record {
    let no_key = key.is_none() && headers.first().is_some_and(|h| h.name.is_empty());
    let capacity =
        usize::from(key.is_some() || no_key) + headers.len() + usize::from(value.is_none());
    let mut out = Vec::with_capacity(capacity);
    match key {
        Some(key) => out.push(Header {
            name: Bytes::new(),
            value: key,
        }),
        None if no_key => out.push(Header {
            name: Bytes::from_static(NO_KEY),
            value: Bytes::new(),
        }),
        None => {}
    }
    for header in headers {
        out.push(match header.value {
            Some(value) => Header {
                name: header.name,
                value,
            },
            None => {
                let mut name = BytesMut::with_capacity(NULL_HEADER.len() + header.name.len());
                name.put_slice(NULL_HEADER);
                name.put_slice(&header.name);
                Header {
                    name: name.freeze(),
                    value: Bytes::new(),
                }
            }
        });
    }
    if value.is_none() {
        out.push(Header {
            name: Bytes::from_static(NULL_VALUE),
            value: Bytes::new(),
        });
    }
    Record {
        timestamp: u64::try_from(timestamp).unwrap_or(0),
        headers: out,
        body: value.unwrap_or_default(),
    }
}

/// A Nova record as a Kafka record.
pub fn to_kafka(record: &Record) -> KafkaRecord {
    let mut key = None;
    let mut value = Some(record.body.clone());
    let mut headers = Vec::with_capacity(record.headers.len());
    for (i, header) in record.headers.iter().enumerate() {
        let name = &header.name[..];
        if i == 0 && name.is_empty() {
            key = Some(header.value.clone());
        } else if (i == 0 && name == NO_KEY) || name == PRODUCER {
        } else if name == NULL_VALUE {
            value = None;
        } else if let Some(name) = name.strip_prefix(NULL_HEADER) {
            headers.push((String::from_utf8_lossy(name).into_owned(), None));
        } else {
            headers.push((
                String::from_utf8_lossy(name).into_owned(),
                Some(header.value.clone()),
            ));
        }
    }
    KafkaRecord {
        timestamp: i64::try_from(record.timestamp).unwrap_or(i64::MAX),
        key,
        value,
        headers,
    }
}

/// Why `topic` is not a name Kafka allows, if it is not: 1 to 249 of ASCII letters, digits,
/// `.`, `_` and `-`, and neither `.` nor `..`.
pub fn invalid_topic(topic: &str) -> Option<&'static str> {
    if topic.is_empty() {
        Some("is empty")
    } else if topic.len() > MAX_TOPIC_BYTES {
        Some("is longer than 249 characters")
    } else if topic == "." || topic == ".." {
        Some("is '.' or '..'")
    } else if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("holds a character other than ASCII letters, digits, '.', '_' and '-'")
    } else {
        None
    }
}

/// The stream that holds partition `partition` of `topic`.
pub fn stream_of(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}

/// The topic and partition a stream holds, when its name has the shape `topic/partition`.
pub fn topic_of(stream: &str) -> Option<(&str, i32)> {
    let (topic, partition) = stream.rsplit_once('/')?;
    if invalid_topic(topic).is_some()
        || partition.is_empty()
        || !partition.bytes().all(|b| b.is_ascii_digit())
        || (partition.len() > 1 && partition.starts_with('0'))
    {
        return None;
    }
    Some((topic, partition.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = KafkaHeader> {
        (
            "[a-z]{0,3}",
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
        )
            .prop_map(|(name, value)| KafkaHeader {
                name: Bytes::from(name),
                value: value.map(Bytes::from),
            })
    }

    proptest! {
        #[test]
        fn a_kafka_record_round_trips_through_nova(
            timestamp in 0i64..i64::MAX,
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
            value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
            headers in proptest::collection::vec(header(), 0..4),
        ) {
            let key = key.map(Bytes::from);
            let value = value.map(Bytes::from);
            let nova = to_nova(timestamp, key.clone(), value.clone(), headers.clone());
            let back = to_kafka(&nova);
            prop_assert_eq!(back.timestamp, timestamp);
            prop_assert_eq!(back.key, key);
            prop_assert_eq!(back.value, value);
            let expected: Vec<(String, Option<Bytes>)> = headers
                .into_iter()
                .map(|h| (String::from_utf8(h.name.to_vec()).unwrap(), h.value))
                .collect();
            prop_assert_eq!(back.headers, expected);
        }
    }

    #[test]
    fn nova_sees_the_key_as_the_first_header_and_the_value_as_the_body() {
        let record = to_nova(
            7,
            Some(Bytes::from_static(b"k")),
            Some(Bytes::from_static(b"v")),
            vec![KafkaHeader {
                name: Bytes::from_static(b"trace"),
                value: Some(Bytes::from_static(b"1")),
            }],
        );
        let expected = Record::new("v")
            .with_header("", "k")
            .with_header("trace", "1");
        assert_eq!(
            record,
            Record {
                timestamp: 7,
                ..expected
            }
        );
        // A record appended through Nova's API with no empty-named header has no key.
        let plain = to_kafka(&Record::new("body").with_header("a", "b"));
        assert_eq!(plain.key, None);
        assert_eq!(plain.value.as_deref(), Some(&b"body"[..]));
        assert_eq!(
            plain.headers,
            vec![("a".into(), Some(Bytes::from_static(b"b")))]
        );
    }

    #[test]
    fn a_producer_mark_reads_back_and_is_hidden_from_kafka() {
        let mark = ProducerMark {
            producer_id: 1 << 40,
            epoch: 3,
            base_sequence: i32::MAX - 1,
            records: 7,
        };
        let mut record = to_nova(1, None, Some(Bytes::from_static(b"v")), Vec::new());
        record.headers.push(mark.header());
        assert_eq!(ProducerMark::of(&record), Some(mark));
        let kafka = to_kafka(&record);
        assert!(kafka.headers.is_empty(), "{kafka:?}");
        assert_eq!(ProducerMark::of(&Record::new("plain")), None);
    }

    #[test]
    fn topics_map_to_streams_one_to_one() {
        assert_eq!(stream_of("orders", 3), "orders/3");
        assert_eq!(topic_of("orders/3"), Some(("orders", 3)));
        assert_eq!(topic_of("a.b_c-d/0"), Some(("a.b_c-d", 0)));
        for not_a_topic in [
            "orders",
            "orders/",
            "orders/03",
            "orders/-1",
            "a/b/1",
            "./1",
            "o rders/1",
            "orders/99999999999",
        ] {
            assert_eq!(topic_of(not_a_topic), None, "{not_a_topic}");
        }
        assert!(invalid_topic(&"x".repeat(250)).is_some());
        assert!(invalid_topic(&"x".repeat(249)).is_none());
    }
}
