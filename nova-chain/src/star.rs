//! The star's write path and read path behind one handle: recovery at open, then the packer,
//! the resolver and the absorber as three long-lived tasks joined by bounded queues.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use nova_core::supervisor::Supervisor;

use crate::metrics::Metrics;
use nova_core::catalog::{Catalog, IndexEntry, StorageClass};
use nova_core::flight::section::Fragment;
use nova_core::metastore::Metastore;
use nova_core::object_store::{ObjectStore, StoreStack};
use nova_proto::RequestError;

use crate::absorber::run_absorber;
use crate::admission::{AdmissionBuffer, Admitted};
use crate::config::ChainConfig;
use crate::express::collect::{Collector, run_collector};
use crate::express::lane::{Lane, run_express_resolver};
use crate::express::recover::recover_express;
use crate::flight_build::{AppendReply, Submission};
use crate::monitor::run_monitor;
use crate::packer::Packer;
use crate::reader::{self, Page};
use crate::recovery::{
    LeaderCheck, Recovered, RecoveryError, claim_chain, patiently, probe_store, recover,
};
use crate::resolver::run_resolver;
use crate::shared::Shared;
use crate::streams::{StreamRegistry, StreamState};
use crate::tail_cache::TailCache;

/// Submissions queued for the packer. Each one is already charged to the admission buffer, so
/// this count bounds nothing that the buffer does not; it only keeps the queue short.
const SUBMISSION_QUEUE: usize = 1024;

type BoxedTask = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A chain task's handle: `Err` carries why it failed.
type TaskHandle = nova_core::supervisor::Watched;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("loading the catalog: {0}")]
    Catalog(#[from] crate::streams::LoadError),
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
}

#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error(
        "shutdown deadline passed with {0} appends not yet durable; they failed unacknowledged"
    )]
    DeadlineExceeded(usize),
    #[error("a chain task failed: {0}")]
    TaskFailed(String),
}

/// A star without zone buckets must not leave an express chain behind unsettled: its bundles
/// may hold acknowledged records that only the zones have. The catalog's checkpoint says so,
/// and so does its copy in the bucket (which a rebuilt catalog may be all that is left of).
pub(crate) async fn check_no_express_chain(
    star: &str,
    catalog: &Catalog,
    store: &Arc<dyn ObjectStore>,
    backoff: &crate::config::Backoff,
) -> Result<(), RecoveryError> {
    let checkpoint = patiently("reading the express checkpoint", backoff, || {
        catalog.express_checkpoint(star)
    })
    .await
    .map_err(RecoveryError::Catalog)?;
    let copy = match checkpoint {
        Some(_) => None,
        None => patiently("reading the express checkpoint's copy", backoff, || {
            crate::express::marker::read(store.as_ref(), star)
        })
        .await
        .map_err(|e| RecoveryError::ExpressCheckpointCopy(e.to_string()))?,
    };
    match checkpoint.or(copy) {
        None => Ok(()),
        Some(_) => Err(RecoveryError::ExpressZonesMissing {
            star: star.to_owned(),
        }),
    }
}

/// The express checkpoint as recovery left it, for the collector's first pass.
async fn catalog_express_checkpoint(
    shared: &Shared,
    backoff: &crate::config::Backoff,
) -> Option<nova_core::catalog::ExpressCheckpoint> {
    patiently("reading the express checkpoint", backoff, || {
        shared.catalog.express_checkpoint(&shared.config.star)
    })
    .await
    .ok()
    .flatten()
}

/// What `resolve_refs` found.
#[derive(Debug, Clone)]
pub struct Refs {
    pub refs: Vec<IndexEntry>,
    /// Where the refs end.
    pub next_seq: u64,
    pub tail_seq: u64,
    /// Records from here on are in the star's memory.
    pub hot_from: u64,
}

pub struct Star {
    shared: Arc<Shared>,
    submit: mpsc::Sender<Submission>,
    stop: CancellationToken,
    tasks: tokio::sync::Mutex<Vec<(&'static str, TaskHandle)>>,
    /// Fails when a chain task ends before shutdown asked it to, naming it (and, when the
    /// process shares it, when any other critical task does).
    supervisor: Supervisor,
    recovered: Recovered,
}

impl Star {
    /// Settles the previous chain and starts the write path. Returns only when the star is
    /// ready to accept appends.
    pub async fn open(
        config: ChainConfig,
        store: Arc<dyn ObjectStore>,
        metastore: Arc<dyn Metastore>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StartError> {
        Self::open_supervised(config, store, metastore, metrics, Supervisor::new()).await
    }

    /// As [`Star::open`], with the chain tasks watched by the process's `supervisor`.
    pub async fn open_supervised(
        config: ChainConfig,
        store: Arc<dyn ObjectStore>,
        metastore: Arc<dyn Metastore>,
        metrics: Arc<Metrics>,
        supervisor: Supervisor,
    ) -> Result<Self, StartError> {
        let store = StoreStack::over(store)
            .instrumented(metrics.store.clone(), config.clock)
            .build();
        let catalog = Catalog::new(metastore);
        let backoff = config.backoff();
        // Before the tails are read: no earlier incarnation's absorb can land after this.
        claim_chain(&config.star, &catalog, &backoff).await?;
        // Like recovery, loading waits out outages: a metastore that blinks at start-up should
        // delay the star, not stop it. (Found by the simulation.)
        let streams = Arc::new(
            patiently("loading the catalog", &backoff, || {
                StreamRegistry::load(
                    catalog.clone(),
                    store.clone(),
                    &config.star,
                    metrics.clone(),
                    config.clock,
                    config.max_streams,
                )
            })
            .await?,
        );
        if config.metrics_top_streams > 0 {
            // A star's registry takes its series once; a second star on one registry (tests)
            // keeps the first's.
            let _ = metrics
                .registry
                .register(Box::new(crate::stream_series::StreamSeries::new(
                    &streams,
                    config.metrics_top_streams,
                )));
        }
        probe_store(&config.star, &store, &backoff).await?;
        // One answer per stream for both walks.
        let led = LeaderCheck::new(&config.star, config.leaders.as_deref(), &backoff);
        let mut recovered =
            recover(&config.star, &store, &catalog, &streams, &backoff, &led).await?;
        match &config.express {
            Some(express) => {
                let successor = format!("{}/{}", config.star, recovered.chain.state.epoch);
                let (chain, _) = recover_express(
                    &config.star,
                    express,
                    &store,
                    &catalog,
                    &streams,
                    recovered.chain,
                    &successor,
                    &backoff,
                    &led,
                )
                .await?;
                recovered.chain = chain;
            }
            None => check_no_express_chain(&config.star, &catalog, &store, &backoff).await?,
        }
        let tails: HashMap<_, _> = streams
            .list("", "", usize::MAX)
            .iter()
            .map(|s| (s.id(), s.tail_snapshot()))
            .collect();
        let shared = Arc::new(Shared::new(
            config,
            recovered.chain.state.epoch,
            store,
            catalog,
            streams,
            metrics,
        ));
        let inflight = shared.config.flight_max_inflight.max(1) as usize;
        let (submit, submissions) = mpsc::channel(SUBMISSION_QUEUE);
        let (to_resolver, resolver_rx) = mpsc::channel(inflight);
        let (to_absorber, absorber_rx) =
            mpsc::channel(shared.config.backlog_flights.max(1) as usize);
        let stop = CancellationToken::new();
        // Each chain task runs in a task of its own, awaited by its watch (the layout the
        // simulation's seeds were drawn with).
        let watch = |name: &str, task: BoxedTask| {
            supervisor.watch_spawned(format!("chain {name}"), stop.clone(), task)
        };
        // Should this open be given up part way (a signal during recovery), the tasks already
        // running are stopped as asked, not reported as dying.
        let stop_if_abandoned = stop.clone().drop_guard();
        let next_slot = recovered.chain.state.checkpoint.map_or(0, |slot| slot + 1);
        let mut express_ends = None;
        let lane = shared.config.express.clone().map(|config| {
            let (lane, ends) = Lane::new(config.clone());
            express_ends = Some((config, ends.to_resolver, ends.to_packer));
            (lane, ends.from_resolver)
        });
        let packer = Packer::new(shared.clone(), submissions, to_resolver, next_slot, lane);
        let mut tasks = vec![
            (
                "packer",
                watch("packer", Box::pin(packer.run(stop.clone())) as BoxedTask),
            ),
            (
                "resolver",
                watch(
                    "resolver",
                    Box::pin(run_resolver(shared.clone(), resolver_rx, to_absorber)),
                ),
            ),
            (
                "monitor",
                watch(
                    "monitor",
                    Box::pin(run_monitor(shared.clone(), stop.clone())),
                ),
            ),
            (
                "absorber",
                watch(
                    "absorber",
                    Box::pin(run_absorber(
                        shared.clone(),
                        absorber_rx,
                        recovered.chain,
                        tails,
                    )),
                ),
            ),
        ];
        if let Some((config, bundles, to_packer)) = express_ends {
            let resolver = run_express_resolver(
                shared.clone(),
                config.clone(),
                bundles,
                to_packer,
                stop.clone(),
            );
            tasks.push((
                "express resolver",
                watch("express resolver", Box::pin(resolver)),
            ));
            // The collector starts from the checkpoint recovery left, and follows the absorbs.
            let carried = shared.express_carried.subscribe();
            shared
                .express_carried
                .send_replace(catalog_express_checkpoint(&shared, &backoff).await);
            let collector = run_collector(
                Collector::new(
                    config.zones,
                    shared.config.star.clone(),
                    shared.store.clone(),
                ),
                carried,
                shared.metrics.clone(),
                shared.config.clock,
                stop.clone(),
            );
            tasks.push((
                "express collector",
                watch("express collector", Box::pin(collector)),
            ));
        }
        tracing::info!(
            star = %shared.config.star,
            epoch = shared.epoch,
            streams = shared.streams.len(),
            settled = recovered.settled_flights,
            store = %shared.store.describe(),
            metastore = %shared.catalog.store().describe(),
            "star ready"
        );
        stop_if_abandoned.disarm();
        Ok(Self {
            shared,
            submit,
            stop,
            tasks: tokio::sync::Mutex::new(tasks),
            supervisor,
            recovered,
        })
    }

    /// The first record `stream` still holds (retention trims the front), read from the catalog.
    pub async fn first_seq(&self, stream: &StreamState) -> Result<u64, RequestError> {
        reader::first_seq(&self.shared, stream, true).await
    }

    pub fn streams(&self) -> &Arc<StreamRegistry> {
        &self.shared.streams
    }

    pub fn admission(&self) -> &AdmissionBuffer {
        &self.shared.admission
    }

    pub fn tail_cache(&self) -> &TailCache {
        &self.shared.tail_cache
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn config(&self) -> &ChainConfig {
        &self.shared.config
    }

    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    pub fn recovered(&self) -> &Recovered {
        &self.recovered
    }

    /// How long flight writes have been failing, if they are failing now.
    pub fn store_failing_for(&self) -> Option<Duration> {
        self.shared
            .health
            .writes_failing_since
            .lock()
            .map(|since| self.shared.config.clock.since(since))
    }

    /// Stops acknowledging, for good: pending appends fail as not acknowledged. For a star that
    /// can no longer trust its fleet lease (a successor may be taking its chain over).
    pub fn fence(&self, reason: String) {
        self.shared.fence(reason);
    }

    /// Readies a stream to be led elsewhere: refuses its appends from now on, waits until every
    /// append already admitted is resolved and absorbed (the catalog's tail reaches where the
    /// next append would have started), and drops its records from the tail cache. On `Err`
    /// (the wait ran past `timeout`, or the catalog failed) the stream takes appends again.
    pub async fn release(&self, stream: &StreamState, timeout: Duration) -> Result<(), String> {
        // A handoff and a change of storage class exclude each other: the new leader loads the
        // class from the catalog, so a change landing after it did would be lost to it.
        let Ok(_no_class_change) = stream.class_change.try_lock() else {
            return Err("its storage class is being changed; hand it off later".to_owned());
        };
        stream.set_released(true);
        if let Err(problem) = wait_absorbed(&self.shared, stream, timeout, "the handoff").await {
            stream.set_released(false);
            return Err(problem);
        }
        self.shared.tail_cache.forget_stream(stream.id());
        Ok(())
    }

    /// Changes `stream`'s storage class for the appends admitted from now on. Appends are
    /// refused (retryable, with a short hint) while every append admitted under the old class
    /// lands and is absorbed, so no batch of the old class is in flight when the new one takes
    /// over, and none admitted under the old one can be sequenced under the new one (the
    /// packer refuses a batch whose class changed while it waited). If they do not land within
    /// `timeout` (an object-store outage, express zones down) nothing changes.
    ///
    /// The change runs to its end in a task of its own: a caller that goes away (a deadline, a
    /// reset connection) must not leave the stream refusing appends half way through.
    pub async fn set_storage_class(
        &self,
        stream: &Arc<StreamState>,
        class: StorageClass,
        timeout: Duration,
    ) -> Result<(), RequestError> {
        if class == StorageClass::Express && self.shared.config.express.is_none() {
            return Err(RequestError::InvalidRequest(format!(
                "stream {:?}: storage class EXPRESS needs express zone buckets \
                 (--s3-express-zone), and this star has none configured",
                stream.name()
            )));
        }
        let shared = self.shared.clone();
        let stream = stream.clone();
        tokio::spawn(async move { change_class(&shared, &stream, class, timeout).await })
            .await
            .unwrap_or_else(|e| {
                Err(RequestError::Internal(format!(
                    "a storage class change failed: {e}"
                )))
            })
    }

    /// Why the star refuses appends, if it lost its chain.
    pub fn fenced(&self) -> Option<String> {
        self.shared.fenced()
    }

    /// Hands a charged batch, encoded in chunks (`encode_chunks` with `MAX_SECTION_BYTES`), to
    /// the packer. The receiver resolves with the assigned
    /// range once the batch is durable, or with the reason it was refused or failed.
    pub async fn submit(
        &self,
        stream: Arc<StreamState>,
        chunks: Vec<Fragment>,
        content_bytes: u64,
        match_seq_num: Option<u64>,
        admitted: Admitted,
    ) -> Result<oneshot::Receiver<AppendReply>, RequestError> {
        // An Express batch is charged to the express buffer instead, from here until the
        // Standard store holds it: waiting for room there is Express's admission backpressure.
        // While the express chain is being sealed (zones unreachable) Express appends are
        // refused at once, and one already waiting for room gives up: the room would come only
        // once the zones answer.
        let class = stream.class();
        let admitted = match (
            &class,
            &self.shared.express_buffer,
            &self.shared.config.express,
        ) {
            (StorageClass::Express, Some(express), Some(config)) => {
                let mut down = self.shared.express_down.subscribe();
                let charge = admitted.charged();
                let moved = tokio::select! {
                    // A down lane refuses at once, even when the buffer has room.
                    biased;
                    reason = down.wait_for(Option::is_some) => {
                        let reason = reason
                            .ok()
                            .and_then(|r| r.clone())
                            .unwrap_or_else(|| "the express lane stopped".into());
                        return Err(crate::express::lane::refused_while_down(config, &reason));
                    }
                    moved = express.admit(charge) => moved,
                };
                drop(admitted);
                moved
            }
            _ => admitted,
        };
        let (reply, receiver) = oneshot::channel();
        let submission = Submission {
            express: class == StorageClass::Express,
            stream,
            chunks,
            content_bytes,
            match_seq_num,
            admitted,
            reply,
        };
        self.submit
            .send(submission)
            .await
            .map_err(|_| nova_core::refusal::shutting_down())?;
        Ok(receiver)
    }

    pub async fn read(
        &self,
        stream: &StreamState,
        start_seq: u64,
        max_records: u32,
        max_bytes: u64,
    ) -> Result<Page, RequestError> {
        self.read_within(stream, start_seq, max_records, max_bytes, None)
            .await
    }

    /// [`Star::read`] with the page's charge held to `charge_limit` beyond its first record
    /// (what its client took of its share of the read budget ahead).
    pub async fn read_within(
        &self,
        stream: &StreamState,
        start_seq: u64,
        max_records: u32,
        max_bytes: u64,
        charge_limit: Option<u64>,
    ) -> Result<Page, RequestError> {
        reader::read(
            &self.shared,
            stream,
            start_seq,
            max_records,
            max_bytes,
            charge_limit,
            true,
        )
        .await
    }

    /// [`Star::read`] for a reader that already holds other pages: if the read budget has no
    /// room now, the page comes back empty rather than waiting (waiting while holding could
    /// leave readers waiting on each other).
    pub async fn read_if_room(
        &self,
        stream: &StreamState,
        start_seq: u64,
        max_records: u32,
        max_bytes: u64,
    ) -> Result<Page, RequestError> {
        reader::read(
            &self.shared,
            stream,
            start_seq,
            max_records,
            max_bytes,
            None,
            false,
        )
        .await
    }

    /// Where a read of `stream` from `from_seq` for records at or after `timestamp_ms` (unix ms)
    /// starts: at or after `from_seq`, at or before the first such record (`reader::seek_time`).
    pub async fn seek_time(
        &self,
        stream: &StreamState,
        from_seq: u64,
        timestamp_ms: u64,
    ) -> Result<u64, RequestError> {
        reader::seek_time(&self.shared, stream, from_seq, timestamp_ms).await
    }

    /// Where the stream's records from `start_seq` live in the object store: index entries in
    /// order, at most `max_refs`, up to the first record held in memory, and where that
    /// in-memory stretch begins (`hot_from`): a read tier serves refs itself and sends the rest
    /// to the star.
    pub async fn resolve_refs(
        &self,
        stream: &StreamState,
        start_seq: u64,
        max_refs: usize,
    ) -> Result<Refs, RequestError> {
        reader::check_not_trimmed(&self.shared, stream, start_seq, false).await?;
        let tail = stream.tail();
        let hot_from = self
            .shared
            .tail_cache
            .earliest(stream.id())
            .map_or(tail, |earliest| earliest.clamp(start_seq.min(tail), tail));
        let refs =
            reader::resolve(&self.shared, stream, start_seq, hot_from, max_refs, None).await?;
        if refs.is_empty() && start_seq < hot_from {
            // Nothing where records should be: trimmed since the trim point was last read?
            reader::check_not_trimmed(&self.shared, stream, start_seq, true).await?;
        }
        let next_seq = refs.last().map_or(start_seq, |r| r.end_seq);
        Ok(Refs {
            refs,
            next_seq,
            tail_seq: tail,
            hot_from,
        })
    }

    /// Refreshes the gauges that are ages rather than counts, for a metrics scrape.
    pub fn refresh_gauges(&self) {
        let metrics = &self.shared.metrics;
        metrics.epoch.set(self.shared.epoch as i64);
        metrics
            .stored_bytes
            .set(self.shared.streams.stored_bytes_total() as i64);
        let age = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64());
        metrics
            .oldest_admitted_age
            .set(age(self.shared.admission.oldest_age()));
        metrics.oldest_unabsorbed_age.set(age(self
            .shared
            .pending
            .oldest_age(self.shared.config.clock.now())));
        metrics.store_failing_age.set(age(self.store_failing_for()));
        metrics
            .admission
            .in_use
            .set(self.shared.admission.budget().in_use() as i64);
        metrics
            .backlog
            .in_use
            .set(self.shared.backlog.in_use() as i64);
        if let Some(express) = &self.shared.express_buffer {
            metrics
                .express
                .oldest_admitted_age
                .set(age(express.oldest_age()));
            metrics
                .express
                .buffer
                .in_use
                .set(express.budget().in_use() as i64);
        }
    }

    /// The express buffer, when the star has zone buckets.
    pub fn express_buffer(&self) -> Option<&AdmissionBuffer> {
        self.shared.express_buffer.as_ref()
    }

    /// Resolves if a chain task ends on its own or the star loses its chain: either way
    /// nothing more is acknowledged, so the process should exit loudly (and be restarted, which
    /// settles what it left) rather than linger.
    pub async fn failed(&self) -> String {
        tokio::select! {
            biased;
            reason = self.supervisor.failed() => reason,
            _ = self.shared.lost.cancelled() => self
                .shared
                .fenced()
                .unwrap_or_else(|| "the star lost its chain".into()),
        }
    }

    /// Stops admitting, lands every flight already admitted, absorbs it, and stops the tasks.
    /// Past `deadline` whatever is still unwritten fails unacknowledged.
    pub async fn shutdown(&self, deadline: Duration) -> Result<(), ShutdownError> {
        let clock = self.shared.config.clock;
        let started = clock.now();
        // Creates and deletes in progress finish first (within the deadline): none may land in
        // the catalog after the star has stopped.
        let _ = clock
            .timeout(deadline, self.shared.streams.stop_admin())
            .await;
        let deadline = deadline.saturating_sub(clock.since(started));
        self.stop.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock().await);
        let drain = async {
            for (name, task) in tasks {
                match task.await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => return Err(ShutdownError::TaskFailed(err)),
                    Err(err) => return Err(ShutdownError::TaskFailed(format!("{name}: {err}"))),
                }
            }
            Ok(())
        };
        tokio::pin!(drain);
        match clock.timeout(deadline, &mut drain).await {
            Ok(result) => result,
            Err(_) => {
                let unresolved = self.shared.admission.unresolved();
                self.shared.abandon.cancel();
                // Abandoned work unwinds promptly: every retry loop watches the token.
                let _ = clock.timeout(Duration::from_secs(10), drain).await;
                Err(ShutdownError::DeadlineExceeded(unresolved))
            }
        }
    }
}

/// Waits until every append admitted to `stream` so far is resolved and absorbed: the catalog's
/// tail reaches where the next append would start. The caller has stopped new appends
/// (`set_released`, `set_reclassing`), so `next_seq` no longer moves.
async fn wait_absorbed(
    shared: &Shared,
    stream: &StreamState,
    timeout: Duration,
    what: &str,
) -> Result<(), String> {
    let clock = shared.config.clock;
    let started = clock.now();
    loop {
        let absorbed = shared
            .catalog
            .stream_tail(stream.id())
            .await
            .map(|t| t.tail_seq);
        match absorbed {
            Ok(tail) if tail >= stream.next_seq() => return Ok(()),
            Ok(_) => {}
            Err(err) => return Err(format!("reading the stream's absorbed tail: {err}")),
        }
        if shared.fenced().is_some() || clock.since(started) >= timeout {
            return Err(format!(
                "appends admitted before {what} were not absorbed within {timeout:?}"
            ));
        }
        clock.sleep(Duration::from_millis(20)).await;
    }
}

/// Takes appends again when a change of class ends, however it ends.
struct Reclassing<'a>(&'a StreamState);

impl Drop for Reclassing<'_> {
    fn drop(&mut self) {
        self.0.set_reclassing(false);
    }
}

/// `Star::set_storage_class`, one change of a stream at a time.
async fn change_class(
    shared: &Shared,
    stream: &Arc<StreamState>,
    class: StorageClass,
    timeout: Duration,
) -> Result<(), RequestError> {
    let _one_at_a_time = stream.class_change.lock().await;
    if stream.is_released() {
        return Err(RequestError::Unavailable(format!(
            "stream {:?} is being handed to another star; change its class there",
            stream.name()
        )));
    }
    if stream.class() == class {
        // Nothing in flight changes path, so nothing to pause; the catalog and the manifest
        // are written again, which repairs a change whose manifest write failed.
        return shared.streams.set_class(stream, class).await.map(drop);
    }
    stream.set_reclassing(true);
    let _reclassing = Reclassing(stream);
    wait_absorbed(shared, stream, timeout, "the storage class change")
        .await
        .map_err(|problem| {
            RequestError::Unavailable(format!(
                "stream {:?} keeps its storage class: {problem}; try again",
                stream.name()
            ))
        })?;
    shared.streams.set_class(stream, class).await.map(drop)
}
