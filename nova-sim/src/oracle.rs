//! What the simulated clients know, and the checks made against it: every acknowledged record
//! is at its seq, no record appears twice, a seq never changes what it holds, a refused batch
//! never appears, a batch appears whole or not at all, and tails never go back.
//!
//! The oracle lives outside the simulated process, so it survives every crash.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use bytes::{BufMut, Bytes, BytesMut};

/// A batch's fate as its producer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Submitted, no answer yet.
    Pending,
    /// Acknowledged at `start..end`.
    Acked { start: u64, end: u64 },
    /// Refused or failed: it must never appear.
    Refused,
    /// The outcome is unknown (a crash, "outcome unknown"): it may appear, once, whole.
    Maybe,
}

#[derive(Debug)]
struct Batch {
    stream: usize,
    first_id: u64,
    len: u64,
    fate: Fate,
    /// When its producer sent it, by the true clock (when the run says).
    submitted_ms: Option<u64>,
}

#[derive(Debug, Default)]
pub struct Oracle {
    batches: Vec<Batch>,
    next_id: u64,
    /// Record id to its batch and body length.
    records: HashMap<u64, (usize, usize)>,
    /// Where each record was seen: (stream, seq).
    seen_at: HashMap<u64, (usize, u64)>,
    /// What each (stream, seq) held when first seen, and who said so.
    holds: HashMap<(usize, u64), (u64, String)>,
    /// Per stream: the end of the highest acknowledgement and the highest tail a read reported.
    acked_end: BTreeMap<usize, u64>,
    read_tail: BTreeMap<usize, u64>,
    /// Admission charges of the batches admitted and not yet answered, and their sum.
    charges: HashMap<usize, u64>,
    charged: u64,
    /// The same for Express batches once their charge has moved to the express buffer.
    express_charges: HashMap<usize, u64>,
    express_charged: u64,
    /// Streams deleted: their records may vanish.
    deleted: std::collections::BTreeSet<usize>,
    /// A running digest of every event, to prove a seed replays exactly.
    digest: Fnv,
    pub violations: Vec<String>,
}

/// A record body: its id, then filler derived from the id, so a read can check it whole.
pub fn body(id: u64, len: usize) -> Bytes {
    let len = len.max(8);
    let mut buf = BytesMut::with_capacity(len);
    buf.put_u64_le(id);
    buf.resize(len, filler(id));
    buf.freeze()
}

/// The record id a body starts with.
pub fn id_of(body: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(body.get(..8)?.try_into().ok()?))
}

fn filler(id: u64) -> u8 {
    (id.wrapping_mul(31) % 251) as u8
}

impl Oracle {
    /// Registers a new batch of records with these body lengths; returns its index and the
    /// records' ids.
    pub fn new_batch(&mut self, stream: usize, lens: &[usize]) -> (usize, Vec<u64>) {
        let index = self.batches.len();
        let first_id = self.next_id;
        let ids: Vec<u64> = (first_id..first_id + lens.len() as u64).collect();
        for (&id, &len) in ids.iter().zip(lens) {
            self.records.insert(id, (index, len.max(8)));
        }
        self.next_id += lens.len() as u64;
        self.batches.push(Batch {
            stream,
            first_id,
            len: lens.len() as u64,
            fate: Fate::Pending,
            submitted_ms: None,
        });
        self.event(&[1, index as u64]);
        (index, ids)
    }

    /// Batch `batch` was sent at `ms` by the true clock: its records are younger than that.
    pub fn submitted(&mut self, batch: usize, ms: u64) {
        if let Some(b) = self.batches.get_mut(batch) {
            b.submitted_ms = Some(ms);
        }
    }

    /// A read of stream `stream`'s trim point (`first_seq`) that returned at true time
    /// `now_ms`: no acknowledged batch sent less than `age_ms` before is below it.
    pub fn check_trim_point(&mut self, stream: usize, first_seq: u64, now_ms: u64, age_ms: u64) {
        let early: Vec<String> = self
            .batches
            .iter()
            .enumerate()
            .filter(|(_, b)| b.stream == stream && !self.deleted.contains(&b.stream))
            .filter_map(|(index, b)| match (b.fate, b.submitted_ms) {
                (Fate::Acked { start, end }, Some(sent))
                    if start < first_seq && sent + age_ms > now_ms =>
                {
                    Some(format!(
                        "retention trimmed stream {stream} to {first_seq}, past batch {index} \
                         ({start}..{end}) sent {} ms before, inside the stream's age of \
                         {age_ms} ms",
                        now_ms - sent
                    ))
                }
                _ => None,
            })
            .collect();
        for message in early {
            self.violation(message);
        }
    }

    /// Retention against the truth, not the catalog's trim point: at true time `now_ms`, every
    /// acknowledged batch of a stream with an age retention (`age_ms` of the stream) sent less
    /// than that age ago was read back whole (its records were written after it was sent, so
    /// no clock that is right can call them old), and every stream with a byte retention kept
    /// at least its limit or all it acknowledged (`kept` of the stream: the bytes read back,
    /// each record's framing counted at `FRAMING` at most).
    pub fn check_retention(
        &mut self,
        read_ids: &std::collections::HashSet<u64>,
        now_ms: u64,
        age_ms: &dyn Fn(usize) -> Option<u64>,
        bytes: &dyn Fn(usize) -> Option<u64>,
        kept: &HashMap<usize, u64>,
    ) {
        let mut acked_bytes: BTreeMap<usize, u64> = BTreeMap::new();
        let mut late = Vec::new();
        for (index, b) in self.batches.iter().enumerate() {
            let Fate::Acked { start, end } = b.fate else {
                continue;
            };
            if self.deleted.contains(&b.stream) {
                continue;
            }
            *acked_bytes.entry(b.stream).or_default() += (b.first_id..b.first_id + b.len)
                .filter_map(|id| self.records.get(&id))
                .map(|&(_, len)| len as u64)
                .sum::<u64>();
            let (Some(age), Some(sent)) = (age_ms(b.stream), b.submitted_ms) else {
                continue;
            };
            let present = (b.first_id..b.first_id + b.len)
                .filter(|id| read_ids.contains(id))
                .count() as u64;
            if sent + age > now_ms && present != b.len {
                late.push(format!(
                    "retention trimmed batch {index} of stream {} ({start}..{end}, {} of {} \
                     records gone), sent {} ms ago, inside the stream's age of {age} ms",
                    b.stream,
                    b.len - present,
                    b.len,
                    now_ms.saturating_sub(sent)
                ));
            }
        }
        for message in late {
            self.violation(message);
        }
        for (stream, acked) in acked_bytes {
            // With an age retention as well, age may trim below the byte limit.
            let (Some(limit), None) = (bytes(stream), age_ms(stream)) else {
                continue;
            };
            let kept = kept.get(&stream).copied().unwrap_or(0);
            if kept < limit.min(acked) {
                self.violation(format!(
                    "stream {stream} kept {kept} bytes under a byte retention of {limit}, having \
                     acknowledged {acked}"
                ));
            }
        }
    }

    /// A batch took `charge` of an admission buffer of `capacity`.
    pub fn admitted(&mut self, batch: usize, charge: u64, capacity: u64) {
        let charge = charge.min(capacity);
        self.charges.insert(batch, charge);
        self.charged += charge;
    }

    /// An Express batch handed to the packer: its charge is in the express buffer from now
    /// until after its answer.
    pub fn admitted_express(&mut self, batch: usize, charge: u64, capacity: u64) {
        let charge = charge.min(capacity);
        self.express_charges.insert(batch, charge);
        self.express_charged += charge;
    }

    /// Express batches handed over and not yet answered all hold their charge in the express
    /// buffer, so together they may never exceed it.
    pub fn check_express_charges(&mut self, capacity: u64) {
        if self.express_charged > capacity {
            self.violation(format!(
                "Express batches handed over and not yet answered hold {} bytes of charge, over the {capacity}-byte express buffer",
                self.express_charged
            ));
        }
    }

    /// What admitted batches hold until they are answered may never exceed the buffer. Checked
    /// when every task that can run has run: an answer sent but not yet taken by its client
    /// would otherwise count twice.
    pub fn check_charges(&mut self, capacity: u64) {
        if self.charged > capacity {
            self.violation(format!(
                "batches admitted and not yet answered hold {} bytes of charge, over the {capacity}-byte admission buffer",
                self.charged
            ));
        }
    }

    fn answered(&mut self, batch: usize) {
        if let Some(charge) = self.charges.remove(&batch) {
            self.charged -= charge;
        }
        if let Some(charge) = self.express_charges.remove(&batch) {
            self.express_charged -= charge;
        }
    }

    pub fn delete_stream(&mut self, stream: usize) {
        self.event(&[7, stream as u64]);
        self.deleted.insert(stream);
    }

    pub fn acked(&mut self, batch: usize, start: u64, end: u64) {
        self.acked_by(batch, start, end, "its acknowledgement");
    }

    /// A batch acknowledged at `start..end` by `source` (in a fleet, the star and its epoch):
    /// no other acknowledgement may ever claim those sequence numbers.
    pub fn acked_by(&mut self, batch: usize, start: u64, end: u64, source: &str) {
        self.event(&[2, batch as u64, start, end]);
        self.answered(batch);
        let (stream, first_id, len) = {
            let b = &self.batches[batch];
            (b.stream, b.first_id, b.len)
        };
        if end - start != len {
            self.violation(format!(
                "batch {batch} of {len} records acknowledged as {start}..{end}"
            ));
        }
        self.batches[batch].fate = Fate::Acked { start, end };
        let acked = self.acked_end.entry(stream).or_default();
        *acked = (*acked).max(end);
        for i in 0..len.min(end - start) {
            self.place(stream, start + i, first_id + i, source);
        }
    }

    pub fn refused(&mut self, batch: usize, why: &str) {
        self.event(&[3, batch as u64]);
        self.answered(batch);
        self.batches[batch].fate = Fate::Refused;
        if let Some((at, id)) = self.seen_in(batch) {
            self.violation(format!(
                "batch {batch} was refused ({why}) but its record {id} is at {at:?}"
            ));
        }
    }

    pub fn maybe(&mut self, batch: usize) {
        self.event(&[4, batch as u64]);
        self.answered(batch);
        self.batches[batch].fate = Fate::Maybe;
    }

    /// The process ended (a crash, or a shutdown): every batch still waiting for its answer
    /// may or may not have landed, and nothing holds admission charges any more.
    pub fn process_ended(&mut self) {
        self.event(&[5]);
        self.charges.clear();
        self.charged = 0;
        self.express_charges.clear();
        self.express_charged = 0;
        for batch in &mut self.batches {
            if batch.fate == Fate::Pending {
                batch.fate = Fate::Maybe;
            }
        }
    }

    /// A record a read returned at `seq` of `stream`, with its body. Returns the record's id
    /// when it is one the producers wrote.
    pub fn read(&mut self, stream: usize, seq: u64, body: &[u8]) -> Option<u64> {
        let Some(id) = id_of(body) else {
            self.violation(format!(
                "stream {stream} seq {seq}: a body of {} bytes",
                body.len()
            ));
            return None;
        };
        let Some(&(batch, len)) = self.records.get(&id) else {
            self.violation(format!("stream {stream} seq {seq}: unknown record id {id}"));
            return None;
        };
        if body.len() != len || body[8..].iter().any(|&b| b != filler(id)) {
            self.violation(format!("stream {stream} seq {seq}: record {id} is corrupt"));
        }
        if self.batches[batch].stream != stream {
            self.violation(format!(
                "record {id} of stream {} was read from stream {stream}",
                self.batches[batch].stream
            ));
        }
        if self.batches[batch].fate == Fate::Refused {
            self.violation(format!(
                "record {id} of refused batch {batch} was read at stream {stream} seq {seq}"
            ));
        }
        self.place(stream, seq, id, "a read");
        Some(id)
    }

    /// A tail a read or a restart reported. `now` says it was taken after every answer the
    /// oracle has seen (a restart's), rather than at some point during a read that other
    /// answers may have overtaken.
    pub fn tail(&mut self, stream: usize, tail: u64, now: bool, source: &str) {
        if self.deleted.contains(&stream) {
            return;
        }
        let acked = self.acked_end.get(&stream).copied().unwrap_or(0);
        let read = self.read_tail.get(&stream).copied().unwrap_or(0);
        if now && tail < acked {
            self.violation(format!(
                "{source}: stream {stream} ends at {tail}, but records up to {acked} were acknowledged"
            ));
        }
        if tail < read {
            self.violation(format!(
                "{source}: stream {stream} ends at {tail}, but a read already saw it end at {read}"
            ));
        }
        self.read_tail.insert(stream, read.max(tail));
    }

    fn place(&mut self, stream: usize, seq: u64, id: u64, source: &str) {
        self.event(&[6, stream as u64, seq, id]);
        match self.holds.get(&(stream, seq)) {
            Some((held, first)) if *held != id => {
                let message = format!(
                    "stream {stream} seq {seq} held record {held} ({first}), then {source} says record {id}"
                );
                self.violation(message);
            }
            Some(_) => {}
            None => {
                self.holds.insert((stream, seq), (id, source.to_owned()));
            }
        }
        match self.seen_at.get(&id) {
            Some(&at) if at != (stream, seq) => self.violation(format!(
                "record {id} appears twice: at stream {} seq {} and at stream {stream} seq {seq} ({source})",
                at.0, at.1
            )),
            Some(_) => {}
            None => {
                self.seen_at.insert(id, (stream, seq));
            }
        }
    }

    fn seen_in(&self, batch: usize) -> Option<((usize, u64), u64)> {
        let b = &self.batches[batch];
        (b.first_id..b.first_id + b.len).find_map(|id| self.seen_at.get(&id).map(|&at| (at, id)))
    }

    /// After a final read of every stream from 0 to its tail (`read_ids` holds every record id
    /// that read returned): every acknowledged record was read, and every batch is whole or
    /// absent.
    /// Checks every batch against what the final read found, from each stream's trim point
    /// (`first_seqs`: records below it were trimmed by retention and are not looked for).
    pub fn settle(
        &mut self,
        read_ids: &std::collections::HashSet<u64>,
        first_seqs: &std::collections::HashMap<usize, u64>,
    ) {
        for index in 0..self.batches.len() {
            let (first_id, len, fate, stream) = {
                let b = &self.batches[index];
                (b.first_id, b.len, b.fate, b.stream)
            };
            let trimmed_to = first_seqs.get(&stream).copied().unwrap_or(0);
            if self.deleted.contains(&self.batches[index].stream) {
                continue;
            }
            let present = (first_id..first_id + len)
                .filter(|id| read_ids.contains(id))
                .count() as u64;
            // Retention trims whole objects, and an object may end inside a batch (one batch can
            // span sections): then exactly its records from the trim point on are there, and
            // they start at the trim point.
            let cut_by_trim = present > 0
                && present < len
                && (first_id + len - present..first_id + len).all(|id| read_ids.contains(&id))
                && self
                    .seen_at
                    .get(&(first_id + len - present))
                    .is_some_and(|&(_, seq)| seq == trimmed_to);
            match fate {
                // Wholly below the trim point: trimmed.
                Fate::Acked { end, .. } if end <= trimmed_to => {}
                Fate::Acked { start, end } if start < trimmed_to && present != end - trimmed_to => {
                    self.violation(format!(
                        "batch {index} ({start}..{end}) holds {present} records from the trim \
                         point {trimmed_to}"
                    ))
                }
                Fate::Acked { start, .. } if start < trimmed_to => {}
                Fate::Acked { start, .. } if present != len => self.violation(format!(
                    "batch {index} was acknowledged at seq {start} but {} of its {len} records are gone",
                    len - present
                )),
                Fate::Refused if present > 0 => self.violation(format!(
                    "batch {index} was refused but {present} of its records are in the stream"
                )),
                Fate::Maybe | Fate::Pending if present != 0 && present != len && !cut_by_trim => {
                    self.violation(format!(
                        "batch {index} is torn: {present} of its {len} records are in the stream"
                    ))
                }
                _ => {}
            }
        }
    }

    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for b in &self.batches {
            match b.fate {
                Fate::Acked { .. } => counts.0 += 1,
                Fate::Refused => counts.1 += 1,
                Fate::Maybe | Fate::Pending => counts.2 += 1,
            }
        }
        counts
    }

    pub fn acked_records(&self) -> u64 {
        self.batches
            .iter()
            .filter(|b| matches!(b.fate, Fate::Acked { .. }))
            .map(|b| b.len)
            .sum()
    }

    /// Whether the record with this body was acknowledged.
    pub fn is_acked(&self, body: &[u8]) -> bool {
        id_of(body)
            .and_then(|id| self.records.get(&id))
            .is_some_and(|&(batch, _)| matches!(self.batches[batch].fate, Fate::Acked { .. }))
    }

    pub fn acked_end(&self, stream: usize) -> u64 {
        self.acked_end.get(&stream).copied().unwrap_or(0)
    }

    /// Whether every batch of `stream` has a known fate (so its tail is known exactly).
    pub fn settled(&self, stream: usize) -> bool {
        self.batches
            .iter()
            .filter(|b| b.stream == stream)
            .all(|b| matches!(b.fate, Fate::Acked { .. } | Fate::Refused))
    }

    pub fn event(&mut self, words: &[u64]) {
        for w in words {
            self.digest.write_u64(*w);
        }
    }

    pub fn digest(&self) -> u64 {
        self.digest.finish()
    }

    pub fn violation(&mut self, message: String) {
        // The first few are enough to diagnose; a broken run can produce thousands.
        if self.violations.len() < 20 {
            self.violations.push(message);
        }
    }
}

/// FNV-1a: a stable hash (std's hasher is randomly keyed per process).
#[derive(Debug)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= *b as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
