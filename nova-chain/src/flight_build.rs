//! What the packer builds flights from, and what travels with a flight until it resolves: a
//! sequenced batch, a stream's section of a flight, the open flight, the flight in the air,
//! and the Express bundle a Standard flight carries. The packer, the Express lane and the
//! resolver all use these; none of them owns them.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use nova_core::budget::BudgetPermit;
use nova_core::clock::Instant;
use nova_core::flight::section::Fragment;
use nova_core::flight::{FlightFooter, SectionInput};
use nova_core::limits::MAX_SECTION_BYTES;
use nova_core::metastore::Compare;
use nova_proto::RequestError;

use crate::admission::Admitted;
use crate::shared::Shared;
use crate::streams::StreamState;
use crate::tail_cache::CachedRun;
use crate::writer::WriteError;

/// Sequence numbers `[start, end)` assigned to an acknowledged batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRange {
    pub start: u64,
    pub end: u64,
}

pub type AppendReply = Result<AckRange, RequestError>;

/// A charged, encoded batch on its way to the packer.
#[derive(Debug)]
pub(crate) struct Submission {
    pub stream: Arc<StreamState>,
    /// Charged and to be written as Express: the stream's class when it was submitted.
    pub express: bool,
    /// The batch's records, encoded in chunks of at most `MAX_SECTION_BYTES`.
    pub chunks: Vec<Fragment>,
    pub content_bytes: u64,
    pub match_seq_num: Option<u64>,
    pub admitted: Admitted,
    pub reply: oneshot::Sender<AppendReply>,
}

/// A sequenced batch waiting for its flight to land.
#[derive(Debug)]
pub(crate) struct Batch {
    pub stream: Arc<StreamState>,
    /// The stream's leadership when the batch was sequenced (in a fleet): its absorb holds only
    /// while the leadership still does.
    pub leadership: Option<Compare>,
    pub range: AckRange,
    pub content_bytes: u64,
    /// The batch's admission charge, released when the batch is dropped at resolution.
    pub _charge: Admitted,
    pub reply: oneshot::Sender<AppendReply>,
}

impl Batch {
    pub fn fail(self, error: RequestError) {
        // The producer may have gone; its batch still resolves (and releases its charge) here.
        let _ = self.reply.send(Err(error));
    }
}

#[derive(Debug)]
pub(crate) struct Section {
    pub stream: Arc<StreamState>,
    /// The stream's leadership (in a fleet) its records were sequenced under: one per section,
    /// so a section's index entry holds only while that leadership does.
    pub leadership: Option<Compare>,
    pub start_seq: u64,
    pub fragments: Vec<(u64, Fragment)>,
    /// Encoded bytes of the fragments.
    pub bytes: u64,
}

pub(crate) struct OpenFlight {
    pub(crate) opened: Instant,
    pub(crate) bytes: u64,
    pub(crate) sections: Vec<Section>,
    section_of: HashMap<u64, usize>,
    pub(crate) batches: Vec<Batch>,
    /// Express bundles carried into this flight (`None` for a bundle itself).
    pub(crate) express: ExpressCarry,
}

/// What a Standard flight carries for the express chain: the last bundle whose sections it
/// holds (its absorb moves the express checkpoint there), the pinned runs to unpin once the
/// sections are readable from the flight, and the batches' express-buffer charges.
#[derive(Default)]
pub(crate) struct ExpressCarry {
    pub through: Option<(u64, u64)>,
    pub pinned: Vec<(u64, u64)>,
    pub charges: Vec<Admitted>,
    /// The carried bundles' bytes (`BundleHold`), released with the charges.
    pub holds: Vec<BundleHold>,
}

/// A flight is full at this many absorb operations (a section's index entry, a stream's tail),
/// so that its absorb fits one metastore transaction (etcd takes 128 by default) beside the
/// chain move. One batch may still carry a flight past it (a 100 MiB batch is 100 sections);
/// such an absorb spills its entries into transactions of their own.
pub(crate) const FLIGHT_MAX_OPS: usize = 96;

impl OpenFlight {
    /// What absorbing this flight writes: an index entry per section, a tail per stream.
    pub(crate) fn ops(&self) -> usize {
        self.sections.len() + self.section_of.len()
    }

    pub(crate) fn new(opened: Instant) -> Self {
        Self {
            opened,
            bytes: 0,
            sections: Vec::new(),
            section_of: HashMap::new(),
            batches: Vec::new(),
            express: ExpressCarry::default(),
        }
    }

    /// Adds a sequenced batch's chunks, starting at `range.start`.
    pub(crate) fn add_batch(&mut self, batch: Batch, chunks: Vec<Fragment>) {
        let mut seq = batch.range.start;
        for chunk in chunks {
            let records = chunk.records;
            self.add_chunk(&batch.stream, batch.leadership.as_ref(), seq, chunk);
            seq += records;
        }
        self.batches.push(batch);
    }

    /// Adds an acknowledged bundle's sections, its pinned runs and its charges.
    pub(crate) fn add_carried(&mut self, carried: Carried) {
        for section in carried.sections {
            let end = section.end_seq();
            self.express.pinned.push((section.stream.id(), end));
            for (seq, fragment) in section.fragments {
                self.add_chunk(&section.stream, section.leadership.as_ref(), seq, fragment);
            }
        }
        self.express.charges.extend(carried.charges);
        self.express.holds.push(carried.hold);
        self.express.through = Some((carried.epoch, carried.slot));
    }

    /// Adds a chunk starting at `seq`, sequenced under `leadership`, to the stream's current
    /// section, or to a new section of the stream's when the current one would grow past
    /// `MAX_SECTION_BYTES` or was sequenced under another leadership (the stream was taken up
    /// again meanwhile).
    pub(crate) fn add_chunk(
        &mut self,
        stream: &Arc<StreamState>,
        leadership: Option<&Compare>,
        seq: u64,
        chunk: Fragment,
    ) {
        let len = chunk.len();
        let current = self
            .section_of
            .get(&stream.id())
            .copied()
            .filter(|&i| self.sections[i].bytes + len <= MAX_SECTION_BYTES)
            .filter(|&i| self.sections[i].leadership.as_ref() == leadership);
        let index = match current {
            Some(index) => index,
            None => {
                self.sections.push(Section {
                    stream: stream.clone(),
                    leadership: leadership.cloned(),
                    start_seq: seq,
                    fragments: Vec::new(),
                    bytes: 0,
                });
                let index = self.sections.len() - 1;
                self.section_of.insert(stream.id(), index);
                index
            }
        };
        let section = &mut self.sections[index];
        section.bytes += len;
        section.fragments.push((seq, chunk));
        self.bytes += len;
    }

    /// Answers the flight's batches with `error`. Carried express records stay acknowledged
    /// (a quorum of zones holds them, and the chain's next owner carries them again), and
    /// readable until the star exits (`Shared::keep_until_exit`).
    pub(crate) fn fail(self, shared: &Shared, error: &RequestError) {
        for batch in self.batches {
            batch.fail(error.clone());
        }
        if !self.express.pinned.is_empty() {
            shared.keep_until_exit(self.express);
        }
    }
}

impl Section {
    /// The sequence number after the section's last record.
    pub fn end_seq(&self) -> u64 {
        self.start_seq + self.fragments.iter().map(|(_, f)| f.records).sum::<u64>()
    }
}

/// A flight handed to its writer, travelling to the resolver in slot order.
pub(crate) struct InFlight {
    pub slot: u64,
    pub key: String,
    pub footer: FlightFooter,
    pub sections: Vec<Section>,
    pub batches: Vec<Batch>,
    pub bytes: u64,
    pub write: tokio::task::JoinHandle<Result<(), WriteError>>,
    pub backlog: BudgetPermit,
    pub _writing: OwnedSemaphorePermit,
    pub express: ExpressCarry,
}

/// A bundle's bytes in the express buffer, shared by the bundle and every zone write still
/// sending it: the writes that go on after a quorum (or past a failure) hold the payload, so
/// the charge returns only once the last of them ends and the Standard store holds the records.
pub(crate) type BundleHold = Arc<Vec<BudgetPermit>>;

/// An acknowledged bundle on its way into a Standard flight.
pub(crate) struct Carried {
    pub epoch: u64,
    pub slot: u64,
    pub sections: Vec<Section>,
    /// The batches' express-buffer charges, released once a flight holds the sections.
    pub charges: Vec<Admitted>,
    pub hold: BundleHold,
}

/// The flight format's view of packed sections (the fragments are shared, not copied).
pub(crate) fn section_inputs(sections: &[Section]) -> Vec<SectionInput> {
    sections
        .iter()
        .map(|s| SectionInput {
            stream_id: s.stream.id(),
            stream: s.stream.name().to_owned(),
            start_seq: s.start_seq,
            fragments: s.fragments.iter().map(|(_, f)| f.clone()).collect(),
        })
        .collect()
}

/// Counts an acknowledged batch in the append metrics: the totals, and the stream's own counts
/// (exported for the busiest streams only, `stream_series`).
pub(crate) fn count_appended(shared: &Shared, batch: &Batch) {
    let records = batch.range.end - batch.range.start;
    shared.metrics.appended_records.inc_by(records);
    shared.metrics.appended_bytes.inc_by(batch.content_bytes);
    batch.stream.count_appended(records, batch.content_bytes);
}

pub(crate) fn cached_run(section: &Section) -> CachedRun {
    CachedRun {
        stream_id: section.stream.id(),
        start_seq: section.start_seq,
        end_seq: section.end_seq(),
        fragments: section.fragments.clone(),
    }
}
