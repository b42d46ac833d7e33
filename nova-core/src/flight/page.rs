//! Building one page of a stream from sections (or fragments) of encoded records: a page stops
//! at the tail, at its record cap, or before the record that would take it past its byte cap,
//! but always holds at least one record.

use bytes::Bytes;

use super::FormatError;
use super::section::RecordIter;
use crate::record::SequencedRecord;

pub struct PageBuilder {
    pub records: Vec<SequencedRecord>,
    /// Content bytes taken so far.
    pub bytes: u64,
    pub max_records: usize,
    pub max_bytes: u64,
    /// The next record the page wants.
    pub next_seq: u64,
    pub tail: u64,
    /// Set when the next record would pass the byte cap.
    capped: bool,
}

impl PageBuilder {
    pub fn new(start_seq: u64, tail: u64, max_records: usize, max_bytes: u64) -> Self {
        Self {
            records: Vec::new(),
            bytes: 0,
            max_records,
            max_bytes,
            next_seq: start_seq,
            tail,
            capped: false,
        }
    }

    pub fn full(&self) -> bool {
        self.capped || self.next_seq >= self.tail || self.records.len() >= self.max_records
    }

    /// Offers the records of a section starting at `first_seq`; takes those from `next_seq` on
    /// until the page is full. A section offered to a page that is not full must hold its next
    /// record (the index or refs that named it said so): one that moves the page on by none
    /// is corrupt.
    pub fn take_from(&mut self, first_seq: u64, section: Bytes) -> Result<(), FormatError> {
        let before = self.next_seq;
        self.take_records(first_seq, RecordIter::new(section))?;
        if self.next_seq == before && !self.full() {
            return Err(FormatError::corrupt(format!(
                "a section from record {first_seq} holds no record {before}, though it was \
                 named as holding it"
            )));
        }
        Ok(())
    }

    /// `take_from` for records already being iterated (a fragment in several parts).
    pub fn take_records(
        &mut self,
        first_seq: u64,
        mut iter: RecordIter,
    ) -> Result<(), FormatError> {
        if self.next_seq > first_seq {
            iter.skip_records(self.next_seq - first_seq)?;
        }
        for record in iter {
            if self.full() {
                break;
            }
            let record = record?;
            let size = record.content_bytes();
            if !self.records.is_empty() && self.bytes + size > self.max_bytes {
                // This record starts the next page.
                self.capped = true;
                break;
            }
            self.bytes += size;
            self.records.push(SequencedRecord {
                seq: self.next_seq,
                record,
            });
            self.next_seq += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::section::encode_fragment;
    use crate::record::Record;

    fn records(n: usize, size: usize) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                timestamp: i as u64,
                headers: vec![],
                body: Bytes::from(vec![i as u8; size]),
            })
            .collect()
    }

    fn builder(start: u64, tail: u64, max_records: usize, max_bytes: u64) -> PageBuilder {
        PageBuilder::new(start, tail, max_records, max_bytes)
    }

    #[test]
    fn the_byte_cap_returns_a_short_page() {
        let fragment = encode_fragment(records(10, 100).iter());
        let mut page = builder(0, 10, 100, 350);
        page.take_records(0, fragment.iter()).unwrap();
        assert_eq!(
            page.records.len(),
            3,
            "a fourth record would pass 350 bytes"
        );
        assert_eq!(page.next_seq, 3);
        assert!(page.full());
    }

    #[test]
    fn one_record_is_always_served() {
        let fragment = encode_fragment(records(2, 1000).iter());
        let mut page = builder(0, 2, 100, 10);
        page.take_records(0, fragment.iter()).unwrap();
        assert_eq!(page.records.len(), 1);
        assert_eq!(page.records[0].record.body.len(), 1000);
    }

    #[test]
    fn the_record_cap_and_the_tail_stop_a_page() {
        let fragment = encode_fragment(records(10, 1).iter());
        let mut page = builder(2, 10, 4, 1 << 20);
        page.take_from(0, fragment.to_bytes()).unwrap();
        let seqs: Vec<u64> = page.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [2, 3, 4, 5]);

        let mut page = builder(7, 9, 100, 1 << 20);
        page.take_records(0, fragment.iter()).unwrap();
        let seqs: Vec<u64> = page.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [7, 8], "nothing past the tail");
    }

    #[test]
    fn a_section_that_moves_the_page_on_by_nothing_is_corrupt() {
        // Records 0..10, offered to a page that wants record 10 (its tail is further on).
        let fragment = encode_fragment(records(10, 1).iter());
        let mut page = builder(10, 20, 100, 1 << 20);
        assert!(page.take_from(0, fragment.to_bytes()).is_err());
        // A full page takes nothing, and that is no error.
        let mut page = builder(0, 20, 2, 1 << 20);
        page.take_from(0, fragment.to_bytes()).unwrap();
        page.take_from(0, fragment.to_bytes()).unwrap();
    }
}
