//! Records as the star holds them: body and header slices share the buffers they arrived in,
//! so validating a request copies no payload.

use bytes::Bytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: Bytes,
    pub value: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Milliseconds since the Unix epoch.
    pub timestamp: u64,
    pub headers: Vec<Header>,
    pub body: Bytes,
}

impl Record {
    /// A record with just a body; the star stamps its timestamp.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            timestamp: 0,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub fn with_header(mut self, name: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        self.headers.push(Header {
            name: name.into(),
            value: value.into(),
        });
        self
    }

    /// The bytes a producer chose to store: body plus header names and values. Record caps, batch
    /// caps and read caps are all measured in these.
    pub fn content_bytes(&self) -> u64 {
        let headers: usize = self
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.len())
            .sum();
        (self.body.len() + headers) as u64
    }
}

/// A record with the sequence number the star assigned to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequencedRecord {
    pub seq: u64,
    pub record: Record,
}
