//! The idempotent producer: `InitProducerId` hands out producer ids, and each partition keeps,
//! per producer, its last `KAFKA_PRODUCER_BATCHES` batches (epoch, first sequence number,
//! count, and the offset each got or is getting), so a retried batch is answered with its
//! first outcome instead of being written again.
//!
//! Across a restart or takeover the state is rebuilt from the stream itself: every batch an
//! idempotent producer writes carries a mark on its last record (`ProducerMark`). A producer
//! id says which start of the star issued it (`star epoch << 32 | counter`); a batch on a
//! partition this start has no state for (other than the very first batch of a producer it
//! issued) reads the partition's last `KAFKA_PRODUCER_SCAN_RECORDS` records for the
//! producer's marks first.
//!
//! A batch is reserved in the state before it is submitted, with its outcome still to come,
//! so a retry arriving on another connection while the first attempt is in flight waits for
//! that attempt's answer rather than writing the batch a second time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};

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

/// Every partition's producers, by (stream id, producer id); at most `KAFKA_PRODUCER_STATES`,
/// the oldest forgotten first (a forgotten producer's next batch reads its marks again).
pub struct Producers {
    epoch: u64,
    next: AtomicU32,
    states: Mutex<States>,
}

#[derive(Default)]
struct States {
    by_key: HashMap<(u64, i64), ProducerState>,
    order: VecDeque<(u64, i64)>,
}

impl Producers {
    /// For the star's current start, whose chain epoch makes its producer ids its own.
    pub fn new(star_epoch: u64) -> Self {
        Self {
            epoch: star_epoch,
            next: AtomicU32::new(0),
            states: Mutex::default(),
        }
    }

    fn issued_here(&self, producer_id: i64) -> bool {
        (producer_id as u64) >> 32 == self.epoch
    }

    pub fn init(
        &self,
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
        let counter = self.next.fetch_add(1, Ordering::Relaxed);
        response.producer_id = ProducerId(((self.epoch << 32) | u64::from(counter)) as i64);
        response.producer_epoch = 0;
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
    ) -> Result<(), KafkaRefusal> {
        let key = (stream.id(), mark.producer_id);
        let brand_new =
            self.issued_here(mark.producer_id) && mark.epoch == 0 && mark.base_sequence == 0;
        if brand_new || self.states.lock().by_key.contains_key(&key) {
            return Ok(());
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
            return Ok(());
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
        Ok(())
    }

    /// Decides on a batch, reserving it when it is new.
    pub fn check(&self, stream: u64, mark: &ProducerMark, owner: &str) -> Verdict {
        let mut states = self.states.lock();
        let state = states.entry((stream, mark.producer_id));
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
    /// The state of `key`, made (forgetting the oldest past the cap) if there is none.
    fn entry(&mut self, key: (u64, i64)) -> &mut ProducerState {
        if !self.by_key.contains_key(&key) {
            while self.by_key.len() >= KAFKA_PRODUCER_STATES {
                let Some(oldest) = self.order.pop_front() else {
                    break;
                };
                self.by_key.remove(&oldest);
            }
            self.order.push_back(key);
        }
        self.by_key.entry(key).or_default()
    }
}
