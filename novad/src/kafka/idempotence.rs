//! The idempotent producer: `InitProducerId` hands out producer ids, and each partition keeps,
//! per producer, its last `KAFKA_PRODUCER_BATCHES` batches (epoch, first sequence number,
//! count, and the offset each got or is getting), so a retried batch is answered with its
//! first outcome instead of being written again.
//!
//! Across a restart, takeover or handoff the state is rebuilt from the stream itself: every
//! batch an idempotent producer writes carries a mark on its last record (`ProducerMark`).
//! Producer ids come in blocks from a counter in the catalog, unique across the fleet and
//! across restarts; a batch on a partition this star has no state for (other than the very
//! first batch of a producer this start issued) reads the partition's last
//! `KAFKA_PRODUCER_SCAN_RECORDS` records for the producer's marks first.
//!
//! A batch is reserved in the state before it is submitted, with its outcome still to come,
//! so a retry arriving on another connection while the first attempt is in flight waits for
//! that attempt's answer rather than writing the batch a second time.

use std::collections::{HashMap, VecDeque};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProducerId, ResponseKind,
};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use nova_chain::AppendReply;
use nova_chain::streams::StreamState;
use nova_core::limits::{
    KAFKA_PRODUCER_BATCHES, KAFKA_PRODUCER_SCAN_RECORDS, KAFKA_PRODUCER_STATES,
};
use nova_kafka::errors::KafkaRefusal;
use nova_kafka::mapping::ProducerMark;

use super::Kafka;

/// A batch's outcome: its first offset, or why it was not written.
pub type Outcome = Shared<BoxFuture<'static, Result<u64, KafkaRefusal>>>;

struct Batch {
    base_sequence: i32,
    records: i32,
    outcome: Outcome,
}

#[derive(Default)]
struct ProducerState {
    /// The sequence number the next batch must have when the window's last batches were
    /// found not written and dropped from it (the first of them).
    next: Option<i32>,
    /// The token's name its batches come with ("" when the star checks no tokens): another
    /// token's batches under the same producer id are refused.
    owner: Option<String>,
    epoch: i16,
    batches: VecDeque<Batch>,
}

/// What `learn` found: the term of leadership the producer's state belongs to, and whether
/// the batch is surely new (a producer's first, from an id this start handed out).
#[derive(Debug, Clone, Copy)]
pub struct Learned {
    term: u64,
    fresh: bool,
}

/// The refusal when every producer state has a batch in flight.
fn full() -> KafkaRefusal {
    KafkaRefusal::from(&nova_proto::RequestError::Unavailable(format!(
        "all {KAFKA_PRODUCER_STATES} idempotent producer states here have a batch in flight; \
         retry"
    )))
}

impl ProducerState {
    /// Whether a batch of it is still to be answered.
    fn in_flight(&self) -> bool {
        self.batches
            .iter()
            .any(|b| b.outcome.peek().is_none() && b.outcome.clone().now_or_never().is_none())
    }
}

/// What to do with a batch.
pub enum Verdict {
    /// Write it; hand the append's reply to the reservation once submitted. The outcome is
    /// the batch's answer.
    New(Reservation, Outcome),
    /// Written (or being written) before: answer with that outcome.
    Duplicate(Outcome),
    Refused(KafkaRefusal),
}

/// A batch's place in its producer's state, waiting for its append's reply. Dropped without
/// one, the batch counts as not written, and its retry is written.
pub struct Reservation(oneshot::Sender<oneshot::Receiver<AppendReply>>);

impl Reservation {
    pub fn submitted(self, reply: oneshot::Receiver<AppendReply>) {
        let _ = self.0.send(reply);
    }
}

/// Every partition's producers, by (stream id, term, producer id); at most
/// `KAFKA_PRODUCER_STATES`, the oldest forgotten first (a forgotten producer's next batch reads
/// its marks again). The term of leadership (`StreamState::term`, 0 on a single star) keeps a
/// state from a time this star led the stream before from being used once it leads it again:
/// batches written elsewhere meanwhile are not in it, so the stream is read afresh.
pub struct Producers {
    ids: Mutex<Ids>,
    /// One block taken from the catalog at a time.
    reserving: tokio::sync::Mutex<()>,
    states: Mutex<States>,
}

/// The producer ids this start of the star has taken from the catalog.
#[derive(Default)]
struct Ids {
    /// What is left of the current block.
    left: std::ops::Range<u64>,
    /// The blocks handed out from, latest last (at most `ISSUED_BLOCKS_KEPT`).
    issued: VecDeque<std::ops::Range<u64>>,
    /// Ids below it were handed out before a state was forgotten: theirs may have been, so
    /// their first batch is not taken for one never written before.
    forgotten_below: u64,
}

/// Producer ids taken from the catalog at a time.
const PRODUCER_ID_BLOCK: u64 = 1024;

/// Blocks remembered as this start's: an id from an older block counts as another star's
/// (its first batch on a partition reads the partition's marks, which is only slower).
const ISSUED_BLOCKS_KEPT: usize = 64;

type Key = (u64, u64, i64);

#[derive(Default)]
struct States {
    by_key: HashMap<Key, ProducerState>,
    order: VecDeque<Key>,
}

impl Default for Producers {
    fn default() -> Self {
        Self {
            ids: Mutex::default(),
            reserving: tokio::sync::Mutex::new(()),
            states: Mutex::default(),
        }
    }
}

impl Producers {
    /// Whether `producer_id`'s first batch (epoch 0, sequence 0) needs no reading of the
    /// partition's marks: only when this start handed the id out and no state has been
    /// forgotten since. Never in a fleet: the batch may have been written by another star, or
    /// by this one in an earlier term, with its answer lost.
    fn surely_new(&self, kafka: &Kafka, producer_id: i64) -> bool {
        let id = producer_id as u64;
        let ids = self.ids.lock();
        kafka.ctx.fleet.is_none()
            && id >= ids.forgotten_below
            && ids.issued.iter().any(|block| block.contains(&id))
    }

    /// A state was forgotten: no id handed out so far is taken for new again.
    fn forgot(&self) {
        let mut ids = self.ids.lock();
        ids.forgotten_below = ids.left.start;
    }

    /// A producer id no producer has had, fleet-wide.
    async fn next_id(&self, kafka: &Kafka) -> Result<i64, nova_core::catalog::CatalogError> {
        let take = || self.ids.lock().left.next().map(|id| id as i64);
        if let Some(id) = take() {
            return Ok(id);
        }
        let _reserving = self.reserving.lock().await;
        if let Some(id) = take() {
            return Ok(id);
        }
        let now_ms = nova_core::clock::Clock::system().unix_ms();
        let block = kafka
            .ctx
            .star
            .streams()
            .catalog()
            .reserve_producer_ids(PRODUCER_ID_BLOCK, now_ms)
            .await?;
        let mut ids = self.ids.lock();
        ids.issued.push_back(block.clone());
        if ids.issued.len() > ISSUED_BLOCKS_KEPT {
            ids.issued.pop_front();
        }
        ids.left = block;
        Ok(ids.left.next().map_or(-1, |id| id as i64))
    }

    pub async fn init(
        &self,
        kafka: &Kafka,
        principal: Option<&nova_server::net::Principal>,
        request: InitProducerIdRequest,
    ) -> ResponseKind {
        let mut response = InitProducerIdResponse::default();
        if principal.is_some_and(|p| !p.has(nova_server::net::Scope::Append)) {
            response.error_code = ResponseError::ClusterAuthorizationFailed.code();
            return ResponseKind::InitProducerId(response);
        }
        if request.transactional_id.is_some() {
            response.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
            return ResponseKind::InitProducerId(response);
        }
        // Every call gets a new id, also one that names its old id and epoch to bump
        // (KIP-360, which allows either answer): bumping an id on request would let anyone
        // fence another token's producer.
        match self.next_id(kafka).await {
            Ok(id) => {
                response.producer_id = ProducerId(id);
                response.producer_epoch = 0;
            }
            Err(error) => {
                // Retried by clients as it is (COORDINATOR_NOT_AVAILABLE would send Java's
                // producer looking for a transaction coordinator).
                tracing::warn!(%error, "no Kafka producer id could be taken from the catalog");
                let error = ResponseError::CoordinatorLoadInProgress;
                kafka.metrics.answered("InitProducerId", error);
                response.producer_id = ProducerId(-1);
                response.error_code = error.code();
            }
        }
        ResponseKind::InitProducerId(response)
    }

    /// Reads the marks of `mark`'s producer in `stream`'s last records when this start has
    /// no state for it there, so its retries of batches written before a restart (or before
    /// its state was forgotten) are recognised. Not needed for the first batch of a producer
    /// this start issued. A read that fails is a refusal: going on without the marks could
    /// write a retried batch twice.
    pub async fn learn(
        &self,
        kafka: &Kafka,
        stream: &StreamState,
        mark: &ProducerMark,
    ) -> Result<Learned, KafkaRefusal> {
        let term = stream.term();
        let key = (stream.id(), term, mark.producer_id);
        let fresh =
            mark.epoch == 0 && mark.base_sequence == 0 && self.surely_new(kafka, mark.producer_id);
        let learned = Learned { term, fresh };
        if fresh || self.states.lock().by_key.contains_key(&key) {
            return Ok(learned);
        }
        let unreadable = |e: nova_proto::RequestError| {
            KafkaRefusal::from(&nova_proto::RequestError::Unavailable(format!(
                "the partition's recent records could not be read for producer {}'s batches \
                 ({e}); retry",
                mark.producer_id
            )))
        };
        let star = &kafka.ctx.star;
        let tail = stream.tail();
        let first = star.first_seq(stream).await.map_err(unreadable)?;
        let mut seq = tail.saturating_sub(KAFKA_PRODUCER_SCAN_RECORDS).max(first);
        let mut found = Vec::new();
        while seq < tail {
            let page = star
                .read(
                    stream,
                    seq,
                    kafka.ctx.max_read_records,
                    kafka.ctx.max_read_bytes,
                )
                .await
                .map_err(unreadable)?;
            for record in &page.records {
                if let Some(seen) = ProducerMark::of(&record.record)
                    && seen.producer_id == mark.producer_id
                {
                    // The mark is on a batch's last record: its first offset is before it.
                    let base = record.seq + 1 - (seen.records.max(1) as u64).min(record.seq + 1);
                    found.push((seen, base));
                }
            }
            if page.next_seq <= seq {
                break;
            }
            seq = page.next_seq;
        }
        let mut states = self.states.lock();
        // Another connection of the producer may have learnt (and reserved) meanwhile: its
        // state stands.
        if states.by_key.contains_key(&key) {
            return Ok(learned);
        }
        match states.make_room(key) {
            Some(true) => self.forgot(),
            Some(false) => {}
            None => return Err(full()),
        }
        let state = states.entry(key);
        // Only the latest epoch's batches count.
        let epoch = found.iter().map(|(seen, _)| seen.epoch).max().unwrap_or(0);
        state.epoch = epoch;
        for (seen, offset) in found.into_iter().filter(|(seen, _)| seen.epoch == epoch) {
            state.batches.push_back(Batch {
                base_sequence: seen.base_sequence,
                records: seen.records,
                outcome: futures::future::ready(Ok(offset)).boxed().shared(),
            });
            if state.batches.len() > KAFKA_PRODUCER_BATCHES {
                state.batches.pop_front();
            }
        }
        Ok(learned)
    }

    /// Decides on a batch, reserving it when it is new; `learned` is what `learn` found.
    pub fn check(
        &self,
        stream: &StreamState,
        mark: &ProducerMark,
        owner: &str,
        learned: Learned,
    ) -> Verdict {
        // The state learnt holds within the term it was learnt in: the partition was led
        // elsewhere since, and may hold batches it does not know.
        if stream.term() != learned.term {
            return Verdict::Refused(KafkaRefusal::new(
                ResponseError::NotLeaderOrFollower,
                "the partition's leadership changed while the batch was checked; retry",
            ));
        }
        let key = (stream.id(), learned.term, mark.producer_id);
        let mut states = self.states.lock();
        // Forgotten since it was learnt (other producers' states took its place): without it
        // the batch could be taken for new when it was written before.
        if !learned.fresh && !states.by_key.contains_key(&key) {
            return Verdict::Refused(KafkaRefusal::from(&nova_proto::RequestError::Unavailable(
                format!(
                    "producer {}'s recent batches were forgotten while they were read; retry",
                    mark.producer_id
                ),
            )));
        }
        match states.make_room(key) {
            Some(true) => self.forgot(),
            Some(false) => {}
            None => return Verdict::Refused(full()),
        }
        let state = states.entry(key);
        match &state.owner {
            Some(known) if known != owner => {
                return Verdict::Refused(KafkaRefusal::new(
                    ResponseError::UnknownProducerId,
                    format!("producer {} is another token's", mark.producer_id),
                ));
            }
            Some(_) => {}
            None => state.owner = Some(owner.to_owned()),
        }
        if mark.epoch < state.epoch {
            return Verdict::Refused(KafkaRefusal::new(
                ResponseError::InvalidProducerEpoch,
                format!(
                    "producer {} epoch {} is older than its epoch {} here",
                    mark.producer_id, mark.epoch, state.epoch
                ),
            ));
        }
        if mark.epoch > state.epoch {
            state.epoch = mark.epoch;
            state.batches.clear();
            state.next = None;
        }
        // Batches at the window's end that were not written (refused after their
        // reservation, or never submitted: their reservation dropped) leave it, so the next
        // batch must take their place rather than follow them.
        while let Some(last) = state.batches.back() {
            // Polled once here: a dropped reservation resolves its outcome at once.
            let _ = last.outcome.clone().now_or_never();
            if !not_written(&last.outcome) {
                break;
            }
            state.next = state.batches.pop_back().map(|b| b.base_sequence);
        }
        if let Some(at) = state
            .batches
            .iter()
            .position(|b| b.base_sequence == mark.base_sequence)
        {
            // Not written for sure: refused, or lost with the star. An outcome left unknown
            // (REQUEST_TIMED_OUT: the batch may still land) is answered again as it was,
            // never written a second time.
            if !not_written(&state.batches[at].outcome) {
                return Verdict::Duplicate(state.batches[at].outcome.clone());
            }
            // Not written: it, and whatever came after it, are written again as they come.
            state.batches.truncate(at);
        }
        let expected = state
            .batches
            .back()
            .map(|b| b.base_sequence.wrapping_add(b.records) & i32::MAX)
            .or(state.next);
        if let Some(expected) = expected
            && expected != mark.base_sequence
        {
            return Verdict::Refused(KafkaRefusal::new(
                ResponseError::OutOfOrderSequenceNumber,
                format!(
                    "producer {} sent sequence {}, which does not follow its last batch",
                    mark.producer_id, mark.base_sequence
                ),
            ));
        }
        let (tx, rx) = oneshot::channel::<oneshot::Receiver<AppendReply>>();
        let outcome: Outcome = async move {
            let not_written = || {
                KafkaRefusal::from(&nova_proto::RequestError::Unavailable(
                    "the batch was not written; retry it".into(),
                ))
            };
            let reply = rx.await.map_err(|_| not_written())?;
            match reply.await {
                Ok(Ok(range)) => Ok(range.start),
                Ok(Err(error)) => Err(KafkaRefusal::from(&error)),
                Err(_) => Err(KafkaRefusal::from(&nova_core::refusal::shutting_down())),
            }
        }
        .boxed()
        .shared();
        state.next = None;
        state.batches.push_back(Batch {
            base_sequence: mark.base_sequence,
            records: mark.records,
            outcome: outcome.clone(),
        });
        if state.batches.len() > KAFKA_PRODUCER_BATCHES {
            state.batches.pop_front();
        }
        Verdict::New(Reservation(tx), outcome)
    }
}

/// Whether a batch's outcome says for sure that it was not written: refused, or lost with the
/// star. One left unknown (REQUEST_TIMED_OUT: it may still land) is never written again.
fn not_written(outcome: &Outcome) -> bool {
    matches!(
        outcome.peek(),
        Some(Err(refusal)) if refusal.error != ResponseError::RequestTimedOut
    )
}

impl States {
    /// Makes room for `key`'s state past the cap by forgetting the oldest states with no
    /// batch in flight (a state whose batch is still landing cannot be read back from the
    /// partition yet, so it is kept); whether any was forgotten. `None` when every state has
    /// a batch in flight.
    fn make_room(&mut self, key: Key) -> Option<bool> {
        if self.by_key.contains_key(&key) {
            return Some(false);
        }
        let mut forgot = false;
        let mut looked = 0;
        while self.by_key.len() >= KAFKA_PRODUCER_STATES {
            if looked > self.order.len() {
                return None;
            }
            let oldest = self.order.pop_front()?;
            looked += 1;
            match self.by_key.get(&oldest) {
                Some(state) if state.in_flight() => self.order.push_back(oldest),
                Some(_) => {
                    self.by_key.remove(&oldest);
                    forgot = true;
                }
                None => {}
            }
        }
        self.order.push_back(key);
        Some(forgot)
    }

    fn entry(&mut self, key: Key) -> &mut ProducerState {
        self.by_key.entry(key).or_default()
    }
}
