//! The packer: the one task that sequences appends. It assigns sequence numbers in admission
//! order, packs batches from every stream into the open flight, and closes the flight by size or
//! linger, handing it to a writer at the next slot.
//!
//! Because one task does all of this, a stream's sequence numbers are dense and follow
//! admission order, and a stream's records within a flight form one contiguous section.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use nova_core::clock::{Clock, Instant};
use tokio_util::sync::CancellationToken;

use nova_core::budget::BudgetPermit;
use nova_core::flight::{FlightMeta, assemble_flight};
use nova_core::keys::slot_key;
use nova_proto::RequestError;

use nova_core::catalog::StorageClass;

use crate::express::lane::{FromLane, Lane};
use crate::flight_build::{
    AckRange, Batch, FLIGHT_MAX_OPS, InFlight, OpenFlight, Submission, section_inputs,
};
use crate::shared::Shared;
use crate::stall::{Stall, StallCause};
use crate::writer::write_flight;

pub(crate) struct Packer {
    shared: Arc<Shared>,
    submissions: mpsc::Receiver<Submission>,
    resolver: mpsc::Sender<InFlight>,
    /// Flights being written at once (`--flight-max-inflight`).
    writing: Arc<Semaphore>,
    next_slot: u64,
    open: Option<OpenFlight>,
    /// The Express lane, with zone buckets.
    express: Option<Lane>,
    /// What the express resolver sends back: acknowledged bundles to carry, failures, reopens.
    from_lane: Option<mpsc::Receiver<FromLane>>,
}

impl Packer {
    pub fn new(
        shared: Arc<Shared>,
        submissions: mpsc::Receiver<Submission>,
        resolver: mpsc::Sender<InFlight>,
        next_slot: u64,
        express: Option<(Lane, mpsc::Receiver<FromLane>)>,
    ) -> Self {
        let (express, from_lane) = express.unzip();
        let writers = shared.config.flight_max_inflight.max(1);
        shared
            .metrics
            .flights_in_flight_capacity
            .set(writers as i64);
        let writing = Arc::new(Semaphore::new(writers as usize));
        Self {
            shared,
            submissions,
            resolver,
            writing,
            next_slot,
            open: None,
            express,
            from_lane,
        }
    }

    /// Runs until `stop` fires and every submission already queued is packed and handed on.
    ///
    /// A flight is *due* once it is full, or its linger has passed and it is less than half
    /// full, or twice its linger has passed; it closes when a writer is free. While every
    /// writer is busy a due flight keeps taking batches until it is full. Under load both rules
    /// grow flights toward `--flight-max-bytes` (fewer, fuller PUTs) instead of closing them
    /// small on the timer; a lightly loaded star still closes each flight one linger after its
    /// first batch.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut stopping = false;
        let mut drained = false;
        let mut writer_stall: Option<Stall> = None;
        let clock = self.shared.config.clock;
        loop {
            let (bytes, ops, linger_until) = match &self.open {
                Some(open) => (
                    open.bytes,
                    open.ops(),
                    Some(open.opened + self.shared.config.flight_linger),
                ),
                None => (0, 0, None),
            };
            let max = self.shared.config.flight_max_bytes;
            let full = bytes >= max || ops >= FLIGHT_MAX_OPS;
            let now = clock.now();
            let lingered = linger_until.is_some_and(|at| now >= at);
            let overdue =
                linger_until.is_some_and(|at| now >= at + self.shared.config.flight_linger);
            // A flight that filled half its size within one linger is on a busy star: give it
            // up to one more linger to fill, so busy stars write full flights. A light one
            // closes after one linger. At shutdown, everything closes at once.
            let half_full = bytes.saturating_mul(2) >= max;
            let due =
                self.open.is_some() && (full || overdue || (lingered && !half_full) || stopping);
            let bundle = self
                .express
                .as_ref()
                .map(|lane| lane.state(clock.now(), stopping));
            let bundle_due = bundle.is_some_and(|b| b.due);
            let bundle_wake = bundle.and_then(|b| b.wake);
            let publishing = self.express.as_ref().map(|lane| lane.publishing.clone());
            if drained && self.open.is_none() && self.from_lane.is_none() {
                break;
            }
            self.track_writer_stall(due, &mut writer_stall);
            tokio::select! {
                biased;
                _ = stop.cancelled(), if !stopping => {
                    // New submissions are refused from here; queued ones still get packed.
                    stopping = true;
                    self.submissions.close();
                }
                // Carried bundles come first: their records are acknowledged, and their
                // express-buffer charges return only once a flight holds them.
                message = recv_from(&mut self.from_lane), if self.from_lane.is_some() && !full => {
                    match message {
                        Some(message) => self.on_lane(message).await,
                        None => self.from_lane = None,
                    }
                }
                permit = acquire(publishing), if bundle_due => {
                    if let (Some(lane), Ok(permit)) = (self.express.as_mut(), permit) {
                        lane.close_bundle(&self.shared, permit).await;
                    }
                }
                writer = self.writing.clone().acquire_owned(), if due => {
                    writer_stall = None;
                    match writer {
                        Ok(writer) => self.close_flight(writer).await,
                        Err(_) => self.fail_open(),
                    }
                }
                _ = self.shared.abandon.cancelled(), if due => self.fail_open(),
                submission = self.submissions.recv(), if !full && !drained => match submission {
                    Some(submission) => self.admit(submission),
                    None => {
                        drained = true;
                        // The last bundle is closed (the lane is stopping); once it and every
                        // bundle before it are resolved, the express resolver hangs up and
                        // `from_lane` ends.
                        if let Some(lane) = &mut self.express {
                            lane.drained();
                        }
                    }
                },
                _ = sleep_until(clock, bundle_wake), if bundle_wake.is_some() && !bundle_due => {}
                _ = sleep_until(clock, linger_until), if linger_until.is_some() && !lingered => {}
                _ = sleep_until(clock, linger_until.map(|at| at + self.shared.config.flight_linger)),
                    if lingered && !due => {}
            }
        }
    }

    /// Counts a stall while a due flight waits for a writer and the writers are all retrying
    /// failed writes. Every writer busy with healthy writes is ordinary pipelining.
    fn track_writer_stall(&self, due: bool, stall: &mut Option<Stall>) {
        let blocked = due && self.writing.available_permits() == 0 && self.shared.writes_failing();
        if !blocked {
            *stall = None;
        } else {
            let cause = match self.shared.diagnose_admission() {
                StallCause::ObjectStoreRejecting => StallCause::ObjectStoreRejecting,
                _ => StallCause::ObjectStoreUnavailable,
            };
            if stall.as_ref().is_none_or(|s| s.cause() != cause) {
                *stall = None;
                *stall = Some(Stall::begin(
                    self.shared.metrics.clone(),
                    self.shared.config.clock,
                    "flights_in_flight",
                    cause,
                    "every flight writer is retrying a failed write (--flight-max-inflight)",
                ));
            }
        }
    }

    fn fail_open(&mut self) {
        if let Some(flight) = self.open.take() {
            self.abandon(flight);
        }
    }

    /// Fails a flight that shutdown abandoned before it had a slot. Its records were given
    /// sequence numbers, so the chain ends here: a later flight written at the next slot (a
    /// backlog permit freed meanwhile) would skip them, and recovery would find the stream's
    /// records discontinuous and refuse to start.
    fn abandon(&self, flight: OpenFlight) {
        self.shared.fence(
            "a flight was abandoned at shutdown before it was written; the chain ends before it"
                .into(),
        );
        flight.fail(&self.shared, &abandoned());
    }

    /// `flight`, unless the star is fenced: then it is failed with the fence's reason.
    fn unless_fenced(&self, flight: OpenFlight) -> Option<OpenFlight> {
        match self.shared.fenced() {
            Some(reason) => {
                flight.fail(&self.shared, &nova_core::refusal::fenced(reason));
                None
            }
            None => Some(flight),
        }
    }

    fn admit(&mut self, sub: Submission) {
        if let Some(reason) = self.shared.fenced() {
            let _ = sub.reply.send(Err(nova_core::refusal::fenced(reason)));
            return;
        }
        let stream = sub.stream.clone();
        let admitting = stream.admitting();
        if let Some(refusal) = sub.stream.refusal() {
            let _ = sub.reply.send(Err(refusal));
            return;
        }
        let express = sub.express;
        if express != (sub.stream.class() == StorageClass::Express) {
            // The stream's class changed while this batch waited: it was charged for the other
            // one. Nothing was sequenced; the producer sends it again under the new class.
            let _ = sub.reply.send(Err(RequestError::UnavailableFor {
                reason: format!(
                    "stream {:?} changed its storage class while this append waited; retry",
                    sub.stream.name()
                ),
                retry_after: Duration::from_millis(100),
            }));
            return;
        }
        // Before the sequence check: while the express chain is down, a producer resending at
        // its durable tail would otherwise hear of a batch held for sealing (its own, whose
        // outcome is unknown) instead of why Express appends are refused.
        if express && let Some(refusal) = Lane::refusal(self.express.as_ref()) {
            let _ = sub.reply.send(Err(refusal));
            return;
        }
        let next = sub.stream.next_seq();
        if let Some(expected) = sub.match_seq_num
            && expected != next
        {
            self.shared
                .metrics
                .rejections
                .with_label_values(&["match_seq_num"])
                .inc();
            let _ = sub.reply.send(Err(RequestError::SeqMismatch {
                stream: sub.stream.name().to_owned(),
                expected,
                next_seq: next,
            }));
            return;
        }
        let records: u64 = sub.chunks.iter().map(|c| c.records).sum();
        let range = AckRange {
            start: next,
            end: next + records,
        };
        sub.stream.set_next_seq(range.end);
        let leadership = sub.stream.leadership();
        drop(admitting);
        let clock = self.shared.config.clock;
        let batch = Batch {
            leadership,
            stream: sub.stream,
            range,
            content_bytes: sub.content_bytes,
            _charge: sub.admitted,
            reply: sub.reply,
        };
        let open = match &mut self.express {
            Some(lane) if express => lane
                .bundle
                .get_or_insert_with(|| OpenFlight::new(clock.now())),
            _ => self
                .open
                .get_or_insert_with(|| OpenFlight::new(clock.now())),
        };
        open.add_batch(batch, sub.chunks);
    }

    /// Handles what the express resolver sends back.
    async fn on_lane(&mut self, message: FromLane) {
        let Some(lane) = self.express.as_mut() else {
            return;
        };
        match message {
            FromLane::Carry(carried) => {
                let clock = self.shared.config.clock;
                self.open
                    .get_or_insert_with(|| OpenFlight::new(clock.now()))
                    .add_carried(carried);
            }
            FromLane::Failed { reason } => lane.seal(&self.shared, reason).await,
            FromLane::Reopen { rollback } => lane.reopen(&self.shared, rollback),
        }
    }

    /// Closes the open flight (if any) and starts its write with `writing`. Waits, counted as a
    /// stall, while the backlog budget is spent.
    async fn close_flight(&mut self, writing: OwnedSemaphorePermit) {
        let Some(flight) = self.open.take() else {
            return;
        };
        let Some(flight) = self.unless_fenced(flight) else {
            return;
        };
        let Some(backlog) = self.backlog_permit().await else {
            self.abandon(flight);
            return;
        };
        // The wait may have been long: a fence raised meanwhile (another writer's object at a
        // slot) means this star no longer owns the chain, and writes nothing more to it.
        let Some(flight) = self.unless_fenced(flight) else {
            return;
        };
        let slot = self.next_slot;
        self.next_slot += 1;
        let shared = &self.shared;
        let key = slot_key(&shared.config.star, shared.epoch, slot);
        let inputs = section_inputs(&flight.sections);
        let meta = FlightMeta {
            star: shared.config.star.clone(),
            epoch: shared.epoch,
            slot,
            created_at_ms: shared.config.clock.unix_ms(),
        };
        let (payload, footer) = assemble_flight(meta, inputs);
        let bytes = payload.len();
        let write = tokio::spawn(write_flight(shared.clone(), key.clone(), payload));
        shared.metrics.flights_in_flight.inc();
        let in_flight = InFlight {
            slot,
            key,
            footer,
            sections: flight.sections,
            batches: flight.batches,
            bytes,
            write,
            backlog,
            _writing: writing,
            express: flight.express,
        };
        // The resolver's queue holds as many flights as there are writer permits, so this
        // only waits if the resolver has stopped, which happens only at shutdown.
        if let Err(mpsc::error::SendError(lost)) = self.resolver.send(in_flight).await {
            // The write may already be on its way (a request sent, or blocking work that
            // finishes anyway): the slot may land, so the chain ends here.
            lost.write.abort();
            shared.fence(format!(
                "flight {} was abandoned with the resolver gone; the chain ends before it",
                lost.key
            ));
            let error = RequestError::OutcomeUnknown(format!(
                "flight {} was abandoned at shutdown while being written",
                lost.key
            ));
            for batch in lost.batches {
                batch.fail(error.clone());
            }
            if !lost.express.pinned.is_empty() {
                shared.keep_until_exit(lost.express);
            }
        }
    }

    /// A backlog permit for the next flight, waiting while the backlog is spent. Every flight
    /// that waits in one episode shares one stall (logged and counted once); the monitor ends
    /// it once nothing has waited for a while.
    async fn backlog_permit(&mut self) -> Option<BudgetPermit> {
        let shared = self.shared.clone();
        // Past shutdown's deadline no flight starts, even one a permit is free for.
        if shared.abandon.is_cancelled() {
            return None;
        }
        if let Some(permit) = shared.backlog.try_acquire(1) {
            return Some(permit);
        }
        {
            let mut stall = shared.backlog_stall.lock();
            if stall.is_none() {
                let detail = format!(
                    "{} flights acknowledged but not absorbed (--s3-chain-backlog-flights)",
                    shared.backlog.capacity()
                );
                let begun = Stall::begin_episode(
                    shared.metrics.clone(),
                    shared.config.clock,
                    "chain_backlog",
                    shared.diagnose_backlog(),
                    &detail,
                );
                *stall = Some((begun, shared.config.clock.now()));
            }
        }
        let started = shared.config.clock.now();
        let permit = tokio::select! {
            biased;
            _ = shared.abandon.cancelled() => None,
            permit = shared.backlog.acquire(1) => Some(permit),
        };
        if let Some((stall, last)) = &mut *shared.backlog_stall.lock() {
            stall.waited(shared.config.clock.since(started));
            *last = shared.config.clock.now();
        }
        permit
    }
}

fn abandoned() -> RequestError {
    RequestError::Unavailable("the star shut down before this append was durable; retry it".into())
}

async fn recv_from<T>(receiver: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match receiver {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

async fn acquire(
    semaphore: Option<Arc<Semaphore>>,
) -> Result<OwnedSemaphorePermit, tokio::sync::AcquireError> {
    match semaphore {
        Some(semaphore) => semaphore.acquire_owned().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(clock: Clock, deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => clock.sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
