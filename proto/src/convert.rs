//! Conversions between the wire messages and the domain types, in both directions, so the
//! server and the SDK translate records the same way.

use crate::domain::{Header, Record, SequencedRecord};
use crate::v1;

impl From<v1::Header> for Header {
    fn from(h: v1::Header) -> Self {
        Header {
            name: h.name,
            value: h.value,
        }
    }
}

impl From<Header> for v1::Header {
    fn from(h: Header) -> Self {
        v1::Header {
            name: h.name,
            value: h.value,
        }
    }
}

/// A zero timestamp asks the star to stamp the record on admission.
impl From<Record> for v1::Record {
    fn from(r: Record) -> Self {
        v1::Record {
            body: r.body,
            headers: r.headers.into_iter().map(Into::into).collect(),
            timestamp: (r.timestamp != 0).then_some(r.timestamp),
        }
    }
}

impl From<SequencedRecord> for v1::SequencedRecord {
    fn from(r: SequencedRecord) -> Self {
        v1::SequencedRecord {
            seq: r.seq,
            body: r.record.body,
            headers: r.record.headers.into_iter().map(Into::into).collect(),
            timestamp: r.record.timestamp,
        }
    }
}

impl From<v1::SequencedRecord> for SequencedRecord {
    fn from(r: v1::SequencedRecord) -> Self {
        SequencedRecord {
            seq: r.seq,
            record: Record {
                timestamp: r.timestamp,
                headers: r.headers.into_iter().map(Into::into).collect(),
                body: r.body,
            },
        }
    }
}

impl v1::Record {
    /// The domain record, stamped with `now_ms` when the producer sent no timestamp.
    pub fn into_domain(self, now_ms: u64) -> Record {
        Record {
            timestamp: self.timestamp.unwrap_or(now_ms),
            headers: self.headers.into_iter().map(Into::into).collect(),
            body: self.body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn records_survive_the_round_trip() {
        let record = Record {
            timestamp: 5,
            headers: vec![Header {
                name: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v"),
            }],
            body: Bytes::from_static(b"body"),
        };
        let wire: v1::Record = record.clone().into();
        assert_eq!(wire.clone().into_domain(99), record);
        let unstamped: v1::Record = Record::new("x").into();
        assert_eq!(unstamped.timestamp, None);
        assert_eq!(unstamped.into_domain(99).timestamp, 99);
        let sequenced = SequencedRecord { seq: 3, record };
        let back: SequencedRecord = v1::SequencedRecord::from(sequenced.clone()).into();
        assert_eq!(back, sequenced);
    }
}
