//! The idempotent producer: `InitProducerId` hands out producer ids, and each partition keeps,
//! per producer, its last `KAFKA_PRODUCER_BATCHES` batches (epoch, first sequence number,
//! count, and the offset each got or is getting), so a retried batch is answered with its
//! first outcome instead of being written again.
//!
//! Across a restart or takeover the state is rebuilt from the stream itself: every batch an
//! idempotent producer writes carries a mark on its first record (`ProducerMark`). A producer
//! id says which start of the star issued it (`star epoch << 32 | counter`); the first batch
//! from a producer issued by an earlier start, on a partition this start has no state for,
//! reads the partition's last `KAFKA_PRODUCER_SCAN_RECORDS` records for its marks first.
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
        if request.producer_id.0 >= 0 && request.producer_epoch >= 0 {
            // KIP-360: a producer that lost track of a batch bumps its epoch and carries on.
            response.producer_id = request.producer_id;
            response.producer_epoch = request.producer_epoch.checked_add(1).unwrap_or(0);
        } else {
            let counter = self.next.fetch_add(1, Ordering::Relaxed);
            response.producer_id = ProducerId(((self.epoch << 32) | u64::from(counter)) as i64);
            response.producer_epoch = 0;
        }
        ResponseKind::InitProducerId(response)
    }

    /// Reads the marks of `mark`'s producer in `stream`'s last records when this start knows
    /// nothing of it there yet.
    pub async fn learn(&self, kafka: &Kafka, stream: &StreamState, mark: &ProducerMark) {
        let key = (stream.id(), mark.producer_id);
        if self.issued_here(mark.producer_id) || self.states.lock().by_key.contains_key(&key) {
            return;
        }
        let star = &kafka.ctx.star;
        let tail = stream.tail();
        let Ok(first) = star.first_seq(stream).await else {
            return;
        };
        let mut seq = tail.saturating_sub(KAFKA_PRODUCER_SCAN_RECORDS).max(first);
        let mut found = Vec::new();
        while seq < tail {
            let Ok(page) = star
                .read(
                    stream,
                    seq,
                    kafka.ctx.max_read_records,
                    kafka.ctx.max_read_bytes,
                )
                .await
            else {
                return;
            };
            for record in &page.records {
                if let Some(seen) = ProducerMark::of(&record.record)
                    && seen.producer_id == mark.producer_id
                {
                    found.push((seen, record.seq));
                }
            }
            if page.next_seq <= seq {
                break;
            }
            seq = page.next_seq;
        }
        let mut states = self.states.lock();
        let state = states.entry(key);
        for (seen, offset) in found {
            if seen.epoch > state.epoch {
                state.epoch = seen.epoch;
                state.batches.clear();
            }
            state.batches.push_back(Batch {
                base_sequence: seen.base_sequence,
                records: seen.records,
                outcome: futures::future::ready(Ok(offset)).boxed().shared(),
            });
            if state.batches.len() > KAFKA_PRODUCER_BATCHES {
                state.batches.pop_front();
            }
        }
    }

    /// Decides on a batch, reserving it when it is new.
    pub fn check(&self, stream: u64, mark: &ProducerMark) -> Verdict {
        let mut states = self.states.lock();
        let state = states.entry((stream, mark.producer_id));
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
        }
        if let Some(at) = state
            .batches
            .iter()
            .position(|b| b.base_sequence == mark.base_sequence)
        {
            let failed = matches!(state.batches[at].outcome.peek(), Some(Err(_)));
            if !failed {
                return Verdict::Duplicate(state.batches[at].outcome.clone());
            }
            // Not written: it, and whatever came after it, are written again as they come.
            state.batches.truncate(at);
        }
        let expected = state
            .batches
            .back()
            .map(|b| b.base_sequence.wrapping_add(b.records) & i32::MAX);
        if let Some(expected) = expected
            && expected != mark.base_sequence
        {
            return Verdict::Refused(KafkaRefusal::new(
                ResponseError::OutOfOrderSequenceNumber,
                format!(
                    "producer {} sent sequence {} where {expected} was next",
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
