//! The Express lane of the write path: the packer's bundle (`Lane`) and the express resolver
//! (`run_express_resolver`), which acknowledges bundles in slot order as their quorums hold
//! them and hands their sections back to the packer for the next Standard flight.
//!
//! ```text
//! packer ─bundle─▶ publish (every zone) ─▶ express resolver ─ack─▶ session
//!   ▲                                        │ (slot order; pins runs, moves tails)
//!   └──────────── carried sections ◀─────────┘ into the next Standard flight
//! ```
//!
//! A bundle that misses its quorum is answered at once (fail fast), and so is every bundle
//! after it in the pipeline: none may be acknowledged ahead of a slot that is not. The packer
//! then refuses Express appends (UNAVAILABLE with a retry hint) while the resolver seals the
//! express epoch: it plugs the first slot a quorum does not hold, carries the failed bundles a
//! quorum does hold after all, rolls the streams of the others back to their tails and reopens
//! the lane in a fresh express epoch. Memory never waits on a dead zone: everything the lane
//! holds is charged to the express buffer, and new Express appends are refused while sealing.

use std::collections::VecDeque;
use std::sync::Arc;

use nova_core::clock::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use nova_core::flight::{FlightMeta, assemble_flight};
use nova_core::keys::express_slot_key;
use nova_proto::RequestError;

use super::fanout::{Outcome, Publication, ZoneAnswer, publish_holding};
use super::slot::{SlotFate, fence_for, plug_or_find};
use super::{
    BUNDLE_MAX_BYTES, ExpressConfig, GENERATIONS_PER_EPOCH, MAX_BUNDLES_IN_FLIGHT, express_epoch,
};
use crate::admission::Admitted;
use crate::flight_build::{
    Batch, BundleHold, Carried, FLIGHT_MAX_OPS, OpenFlight, Section, cached_run, count_appended,
    section_inputs,
};
use crate::shared::Shared;
use crate::stall::{Stall, StallCause};
use crate::streams::StreamState;

/// From the packer to the express resolver, in slot order.
pub(crate) enum ToLane {
    Bundle(InBundle),
    /// The lane went down: no bundle of the current express epoch follows.
    Sealed,
}

/// From the express resolver back to the packer.
pub(crate) enum FromLane {
    /// An acknowledged bundle, for the next Standard flight.
    Carry(Carried),
    /// A bundle missed its quorum: refuse Express appends and stop publishing.
    Failed { reason: String },
    /// The failed express epoch is sealed: roll these streams back to their tails and continue
    /// in the next express epoch.
    Reopen { rollback: Vec<Arc<StreamState>> },
}

/// A bundle being published.
pub(crate) struct InBundle {
    epoch: u64,
    slot: u64,
    key: String,
    sections: Vec<Section>,
    batches: Vec<Batch>,
    hold: BundleHold,
    publish: JoinHandle<Publication>,
    _publishing: OwnedSemaphorePermit,
}

/// Whether the open bundle should close now, and when to look again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BundleState {
    pub due: bool,
    pub wake: Option<Instant>,
}

/// The packer's side of the lane.
pub(crate) struct Lane {
    config: ExpressConfig,
    pub bundle: Option<OpenFlight>,
    pub publishing: Arc<Semaphore>,
    to_resolver: Option<mpsc::Sender<ToLane>>,
    generation: u64,
    next_slot: u64,
    /// Why Express appends are refused right now.
    down: Option<String>,
    /// Streams whose batches were refused unsent when the lane went down.
    rollback: Vec<Arc<StreamState>>,
    stopping: bool,
}

/// The channels between the packer and the express resolver.
pub(crate) struct LaneEnds {
    pub to_resolver: mpsc::Receiver<ToLane>,
    pub to_packer: mpsc::Sender<FromLane>,
    pub from_resolver: mpsc::Receiver<FromLane>,
}

impl Lane {
    pub fn new(config: ExpressConfig) -> (Self, LaneEnds) {
        // Every bundle in the queue holds a publishing permit, and at most one `Sealed` is
        // outstanding, so the packer never waits to hand a bundle over.
        let (to_resolver, resolver_rx) = mpsc::channel(MAX_BUNDLES_IN_FLIGHT + 1);
        let (to_packer, from_resolver) = mpsc::channel(MAX_BUNDLES_IN_FLIGHT);
        let lane = Self {
            config,
            bundle: None,
            publishing: Arc::new(Semaphore::new(MAX_BUNDLES_IN_FLIGHT)),
            to_resolver: Some(to_resolver),
            generation: 0,
            next_slot: 0,
            down: None,
            rollback: Vec::new(),
            stopping: false,
        };
        let ends = LaneEnds {
            to_resolver: resolver_rx,
            to_packer,
            from_resolver,
        };
        (lane, ends)
    }

    /// Why an Express append is refused now, if it is.
    pub fn refusal(lane: Option<&Lane>) -> Option<RequestError> {
        match lane {
            None => Some(RequestError::InvalidRequest(
                "this stream is EXPRESS, and this star has no express zone buckets \
                 (--s3-express-zone)"
                    .into(),
            )),
            Some(lane) => lane
                .down
                .as_ref()
                .map(|reason| refused_while_down(&lane.config, reason)),
        }
    }

    pub fn state(&self, now: Instant, stopping: bool) -> BundleState {
        match &self.bundle {
            None => BundleState {
                due: false,
                wake: None,
            },
            Some(bundle) => {
                let until = bundle.opened + self.config.linger;
                BundleState {
                    due: stopping
                        || now >= until
                        || bundle.bytes >= BUNDLE_MAX_BYTES
                        || bundle.ops() >= FLIGHT_MAX_OPS,
                    wake: Some(until),
                }
            }
        }
    }

    /// No more submissions: once the last bundle is handed over, the resolver is told so.
    pub fn drained(&mut self) {
        self.stopping = true;
        if self.bundle.is_none() {
            self.to_resolver = None;
        }
    }

    pub async fn close_bundle(&mut self, shared: &Arc<Shared>, publishing: OwnedSemaphorePermit) {
        let Some(mut bundle) = self.bundle.take() else {
            return;
        };
        let Some(sender) = self.to_resolver.clone() else {
            bundle.fail(shared, &nova_core::refusal::shutting_down());
            return;
        };
        if self.stopping {
            self.to_resolver = None;
        }
        if let Some(reason) = shared.fenced() {
            bundle.fail(shared, &nova_core::refusal::fenced(reason));
            return;
        }
        let epoch = express_epoch(shared.epoch, self.generation);
        let slot = self.next_slot;
        self.next_slot += 1;
        let star = &shared.config.star;
        let key = express_slot_key(star, epoch, slot);
        let meta = FlightMeta {
            star: star.clone(),
            epoch,
            slot,
            created_at_ms: shared.config.clock.unix_ms(),
        };
        let (payload, _footer) = assemble_flight(meta, section_inputs(&bundle.sections));
        // The batches keep one unit each (their age); the bytes move to the shared hold.
        let hold: BundleHold = Arc::new(
            bundle
                .batches
                .iter_mut()
                .filter_map(|batch| {
                    let charged = batch._charge.charged();
                    batch._charge.split_off(charged)
                })
                .collect(),
        );
        let zones = self.config.zones.clone();
        let deadline = self.config.publish_deadline;
        let backoff = shared.config.backoff();
        let publish_key = key.clone();
        let writes_hold = hold.clone();
        let publish = tokio::spawn(async move {
            publish_holding(
                &zones,
                &publish_key,
                payload,
                deadline,
                &backoff,
                writes_hold,
            )
            .await
        });
        shared.metrics.express.bundles_in_flight.inc();
        let in_bundle = InBundle {
            epoch,
            slot,
            key,
            sections: bundle.sections,
            batches: bundle.batches,
            hold,
            publish,
            _publishing: publishing,
        };
        if let Err(mpsc::error::SendError(ToLane::Bundle(lost))) =
            sender.send(ToLane::Bundle(in_bundle)).await
        {
            // The resolver ends only after the packer hangs up, or by failing: nothing after
            // this bundle can be acknowledged in order any more.
            shared.fence(format!(
                "express bundle {} was abandoned with the express resolver gone",
                lost.key
            ));
            for batch in lost.batches {
                batch.fail(RequestError::OutcomeUnknown(format!(
                    "express bundle {} was abandoned while being published",
                    lost.key
                )));
            }
        }
    }

    /// A bundle missed its quorum: refuse Express appends, refuse the open bundle's batches
    /// unsent, and tell the resolver no bundle of this express epoch follows.
    pub async fn seal(&mut self, shared: &Shared, reason: String) {
        if self.down.is_some() {
            return;
        }
        tracing::warn!("express appends are refused while the express chain is sealed: {reason}");
        self.down = Some(reason.clone());
        shared.express_down.send_replace(Some(reason));
        shared.metrics.express.down.set(1);
        if let Some(bundle) = self.bundle.take() {
            self.rollback
                .extend(bundle.batches.iter().map(|b| b.stream.clone()));
            let refusal = Lane::refusal(Some(self)).unwrap_or_else(|| {
                RequestError::Unavailable("express appends are refused for now".into())
            });
            bundle.fail(shared, &refusal);
        }
        if let Some(sender) = &self.to_resolver {
            // Room is reserved for it (see `new`).
            let _ = sender.send(ToLane::Sealed).await;
        }
    }

    /// The express epoch is sealed: streams whose batches were not acknowledged continue from
    /// their tails, in a fresh express epoch.
    pub fn reopen(&mut self, shared: &Shared, rollback: Vec<Arc<StreamState>>) {
        for stream in rollback.iter().chain(&self.rollback) {
            let _admitting = stream.admitting();
            stream.set_next_seq(stream.tail());
        }
        self.rollback.clear();
        self.generation += 1;
        self.next_slot = 0;
        if self.generation >= GENERATIONS_PER_EPOCH {
            shared.fence(format!(
                "the express chain was sealed {GENERATIONS_PER_EPOCH} times in one chain epoch; \
                 restarting the star begins a new one"
            ));
        }
        self.down = None;
        shared.express_down.send_replace(None);
        shared.metrics.express.down.set(0);
        shared.metrics.express.repairs.inc();
        tracing::info!(
            express_epoch = express_epoch(shared.epoch, self.generation),
            "the express chain is sealed; express appends are accepted again"
        );
    }
}

/// The answer to an Express append while the express chain is being sealed.
pub(crate) fn refused_while_down(config: &ExpressConfig, reason: &str) -> RequestError {
    RequestError::UnavailableFor {
        reason: format!("express appends are refused for now: {reason}"),
        retry_after: config.retry_hint(),
    }
}

/// A failed bundle kept until sealing decides its slot: a quorum may hold it after all.
struct Kept {
    slot: u64,
    sections: Vec<Section>,
    charges: Vec<Admitted>,
    hold: BundleHold,
}

/// A missed quorum being handled: the express epoch and the bundles from the failed slot on.
struct Failure {
    epoch: u64,
    from_slot: u64,
    kept: VecDeque<Kept>,
}

pub(crate) async fn run_express_resolver(
    shared: Arc<Shared>,
    config: ExpressConfig,
    mut items: mpsc::Receiver<ToLane>,
    packer: mpsc::Sender<FromLane>,
    stop: CancellationToken,
) {
    let mut failure: Option<Failure> = None;
    while let Some(item) = items.recv().await {
        match item {
            ToLane::Bundle(mut bundle) => {
                let publication = match (&mut bundle.publish).await {
                    Ok(publication) => publication,
                    Err(join) => {
                        tracing::error!(key = bundle.key, "an express publish task died: {join}");
                        Publication {
                            outcome: Outcome::Unknown,
                            answers: vec![ZoneAnswer::Unanswered; config.zones.len()],
                            latencies: vec![None; config.zones.len()],
                        }
                    }
                };
                shared.metrics.express.bundles_in_flight.dec();
                observe(&shared, &config, &publication);
                let fenced = shared.fenced();
                match &mut failure {
                    None if publication.outcome == Outcome::Quorum && fenced.is_none() => {
                        let carried = acknowledge(&shared, bundle);
                        if let Err(mpsc::error::SendError(FromLane::Carry(lost))) =
                            packer.send(FromLane::Carry(carried)).await
                        {
                            // Only at a shutdown that abandoned the packer: the zones hold the
                            // bundle, and the next recovery carries it.
                            shared.keep_until_exit(lost);
                            break;
                        }
                    }
                    None => {
                        let reason = match &fenced {
                            Some(reason) => reason.clone(),
                            None => missed(&config, &bundle.key, &publication),
                        };
                        if publication.outcome == Outcome::Fenced {
                            shared.fence(format!(
                                "express slot {} holds another writer's objects in a quorum of \
                                 zones: this star no longer owns its express chain",
                                bundle.key
                            ));
                        }
                        let kept = refuse(&shared, &config, bundle, &publication, &reason);
                        failure = Some(Failure {
                            epoch: kept.0,
                            from_slot: kept.1.slot,
                            kept: VecDeque::from([kept.1]),
                        });
                        let _ = packer.send(FromLane::Failed { reason }).await;
                    }
                    Some(failure) => {
                        let reason = format!(
                            "an earlier express bundle missed its quorum, and bundles are \
                             acknowledged in order (bundle {})",
                            bundle.key
                        );
                        let (_, kept) = refuse(&shared, &config, bundle, &publication, &reason);
                        failure.kept.push_back(kept);
                    }
                }
            }
            ToLane::Sealed => {
                let Some(failed) = failure.take() else {
                    continue;
                };
                if shared.fenced().is_some() {
                    // A fenced star exits; its successor walks the express chain.
                    continue;
                }
                match seal(&shared, &config, failed, &packer, &stop).await {
                    Some(rollback) => {
                        let _ = packer.send(FromLane::Reopen { rollback }).await;
                    }
                    // Shutting down: the next recovery walks the express epoch instead.
                    None => break,
                }
            }
        }
    }
}

/// Records each zone's latency and, for a quorum, the quorum's.
fn observe(shared: &Shared, config: &ExpressConfig, publication: &Publication) {
    let metrics = &shared.metrics.express;
    let mut held: Vec<f64> = Vec::new();
    for (zone, latency) in config.zones.iter().zip(&publication.latencies) {
        if let Some(latency) = latency {
            metrics
                .zone_latency
                .with_label_values(&[&zone.name])
                .observe(latency.as_secs_f64());
            held.push(latency.as_secs_f64());
        }
    }
    if publication.outcome == Outcome::Quorum {
        held.sort_by(f64::total_cmp);
        if let Some(quorum) = held.get(config.zones.quorum() - 1) {
            metrics.quorum_latency.observe(*quorum);
        }
    }
}

/// Why a bundle missed its quorum, naming the zones that did not hold it.
fn missed(config: &ExpressConfig, key: &str, publication: &Publication) -> String {
    let zones: Vec<String> = config
        .zones
        .iter()
        .zip(&publication.answers)
        .filter(|(_, answer)| **answer != ZoneAnswer::Held)
        .map(|(zone, answer)| format!("{} {}", zone.name, describe(*answer)))
        .collect();
    format!(
        "express bundle {key} did not reach a quorum of {} of {} zones within {:?} ({})",
        config.zones.quorum(),
        config.zones.len(),
        config.publish_deadline,
        zones.join(", ")
    )
}

fn describe(answer: ZoneAnswer) -> &'static str {
    match answer {
        ZoneAnswer::Held => "held it",
        ZoneAnswer::Refused => "holds another writer's object",
        ZoneAnswer::Rejected => "rejected the write",
        ZoneAnswer::Unanswered => "did not answer",
    }
}

/// Readable first (pinned runs), then the tails move, then the acks go out. The sections and
/// charges go on to a Standard flight.
fn acknowledge(shared: &Shared, bundle: InBundle) -> Carried {
    for section in &bundle.sections {
        shared.tail_cache.pin(cached_run(section));
        // The bytes count as stored once a Standard flight holds them.
        section.stream.advance_tail(section.end_seq(), 0);
    }
    let metrics = &shared.metrics.express;
    metrics.bundles_acked.inc();
    let mut charges = Vec::with_capacity(bundle.batches.len());
    for batch in bundle.batches {
        count_appended(shared, &batch);
        metrics.acks.inc();
        let Batch {
            range,
            _charge,
            reply,
            ..
        } = batch;
        let _ = reply.send(Ok(range));
        charges.push(_charge);
    }
    Carried {
        epoch: bundle.epoch,
        slot: bundle.slot,
        sections: bundle.sections,
        charges,
        hold: bundle.hold,
    }
}

/// Answers a bundle that cannot be acknowledged: "outcome unknown" where a quorum may hold it
/// (sealing may yet carry it), UNAVAILABLE with a retry hint where it never can. Keeps its
/// sections and charges for sealing.
fn refuse(
    shared: &Shared,
    config: &ExpressConfig,
    bundle: InBundle,
    publication: &Publication,
    reason: &str,
) -> (u64, Kept) {
    let never = matches!(publication.outcome, Outcome::NotHeld | Outcome::Fenced);
    let (error, answer) = if never {
        (
            RequestError::UnavailableFor {
                reason: reason.to_owned(),
                retry_after: config.retry_hint(),
            },
            "unavailable",
        )
    } else {
        (
            RequestError::OutcomeUnknown(reason.to_owned()),
            "outcome_unknown",
        )
    };
    shared
        .metrics
        .express
        .deadline_failures
        .with_label_values(&[answer])
        .inc();
    let mut charges = Vec::with_capacity(bundle.batches.len());
    for batch in bundle.batches {
        let Batch { _charge, reply, .. } = batch;
        let _ = reply.send(Err(error.clone()));
        charges.push(_charge);
    }
    let kept = Kept {
        slot: bundle.slot,
        sections: bundle.sections,
        charges,
        hold: bundle.hold,
    };
    (bundle.epoch, kept)
}

/// Seals the failed express epoch: from the failed slot on, carries each bundle a quorum holds
/// after all and plugs the first slot it does not. Returns the streams to roll back (those of
/// the bundles past the plug), or `None` when shutdown interrupted it.
async fn seal(
    shared: &Shared,
    config: &ExpressConfig,
    failure: Failure,
    packer: &mpsc::Sender<FromLane>,
    stop: &CancellationToken,
) -> Option<Vec<Arc<StreamState>>> {
    let Failure {
        epoch,
        from_slot,
        mut kept,
    } = failure;
    let star = &shared.config.star;
    let backoff = shared.config.backoff();
    let clock = shared.config.clock;
    let mut slot = from_slot;
    let mut attempt = 0u32;
    let mut stall: Option<Stall> = None;
    loop {
        let key = express_slot_key(star, epoch, slot);
        let fence = fence_for(
            star,
            epoch,
            slot,
            &format!("{star}/{epoch}/sealed"),
            clock.unix_ms(),
        );
        let found = tokio::select! {
            found = plug_or_find(&config.zones, &key, &fence, config.publish_deadline, &backoff) => found,
            _ = stop.cancelled() => return None,
            _ = shared.abandon.cancelled() => return None,
        };
        if found.foreign_fences > 0 {
            // A successor (a restart or a takeover elsewhere) is plugging this express chain:
            // this star is a zombie. Reopening in a next express epoch would write where no
            // successor looks.
            shared.fence(format!(
                "express slot {key} holds another writer's fence in {} zone(s): a successor \
                 has taken this star's express chain over",
                found.foreign_fences
            ));
            return None;
        }
        match found.fate {
            SlotFate::Plugged { .. } => break,
            SlotFate::Bundle { .. } => {
                let Some(bundle) = kept.pop_front().filter(|b| b.slot == slot) else {
                    shared.fence(format!(
                        "express slot {key} holds a bundle this star has no record of writing"
                    ));
                    return None;
                };
                tracing::info!(
                    key,
                    "a bundle that missed its deadline reached its quorum after all; its records are kept"
                );
                for section in &bundle.sections {
                    shared.tail_cache.pin(cached_run(section));
                    section.stream.advance_tail(section.end_seq(), 0);
                }
                let carried = Carried {
                    epoch,
                    slot,
                    sections: bundle.sections,
                    charges: bundle.charges,
                    hold: bundle.hold,
                };
                if let Err(mpsc::error::SendError(FromLane::Carry(lost))) =
                    packer.send(FromLane::Carry(carried)).await
                {
                    // Shutting down: the next recovery carries it from the zones.
                    shared.keep_until_exit(lost);
                    return None;
                }
                slot += 1;
                attempt = 0;
                stall = None;
            }
            SlotFate::Undecided => {
                attempt += 1;
                stall.get_or_insert_with(|| {
                    Stall::begin(
                        shared.metrics.clone(),
                        clock,
                        "express_chain",
                        StallCause::ExpressZoneUnreachable,
                        &format!(
                            "express slot {key} is held by no quorum of zones, as bundle or as \
                             fence; Express appends are refused until the zones answer"
                        ),
                    )
                });
                tokio::select! {
                    _ = clock.sleep(backoff.delay(attempt)) => {}
                    _ = stop.cancelled() => return None,
                    _ = shared.abandon.cancelled() => return None,
                }
            }
        }
    }
    drop(stall);
    let rollback = kept
        .iter()
        .flat_map(|bundle| bundle.sections.iter().map(|s| s.stream.clone()))
        .collect();
    Some(rollback)
}
