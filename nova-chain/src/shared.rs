//! State the chain's tasks share.

use nova_core::clock::Instant;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use nova_core::budget::Budget;
use nova_core::catalog::{Catalog, ExpressCheckpoint};
use nova_core::object_store::ObjectStore;

use crate::admission::AdmissionBuffer;
use crate::config::ChainConfig;
use crate::pending::PendingIndex;
use crate::stall::{Stall, StallCause};
use crate::streams::StreamRegistry;
use crate::tail_cache::TailCache;

#[derive(Debug)]
pub(crate) struct Shared {
    pub config: ChainConfig,
    /// The epoch this star writes: its slot keys live under it.
    pub epoch: u64,
    pub store: Arc<dyn ObjectStore>,
    pub catalog: Catalog,
    /// The catalog on the metastore's priority lane: what the absorb reads and commits with.
    pub absorb_catalog: Catalog,
    pub streams: Arc<StreamRegistry>,
    pub metrics: Arc<Metrics>,
    pub admission: AdmissionBuffer,
    /// `--s3-express-memory-buffer-mib`: Express batches from admission until the Standard
    /// store holds them. `None` without zone buckets.
    pub express_buffer: Option<AdmissionBuffer>,
    pub backlog: Budget,
    /// Why Express appends are refused right now (a bundle missed its quorum and the express
    /// chain is being sealed), `None` while they are accepted. Appends waiting for room in the
    /// express buffer give up when it is set, so nothing waits on a dead zone.
    pub express_down: tokio::sync::watch::Sender<Option<String>>,
    /// Acknowledged Express records whose flight failed (the star is fenced or shutting down),
    /// with their pins and express-buffer charges: kept until the star is dropped, so they stay
    /// readable while it still serves reads and their memory stays inside the express buffer.
    /// Its successor carries them again from the zones. Bounded by the express buffer.
    pub express_leftovers: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    /// How far the catalog's express checkpoint has moved: the zone collector follows it.
    pub express_carried: tokio::sync::watch::Sender<Option<ExpressCheckpoint>>,
    /// What reads hold beyond the tail cache (`--read-memory-mib`).
    pub read_budget: Budget,
    pub tail_cache: TailCache,
    pub pending: PendingIndex,
    /// Set once the star has lost its chain; nothing is acknowledged after that.
    fenced: Mutex<Option<String>>,
    /// Cancelled with `fenced`: a star without its chain should exit so that its supervisor
    /// restarts it, and recovery settles what it left.
    pub lost: CancellationToken,
    pub health: Health,
    /// The backlog stall in progress and when a flight last waited in it.
    pub backlog_stall: Mutex<Option<(Stall, Instant)>>,
    /// Cancelled when shutdown's deadline passes: writes and commits still retrying give up,
    /// and whatever they carried fails unacknowledged.
    pub abandon: CancellationToken,
}

/// What the write and absorb paths last saw, for diagnosing stalls.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// When flight writes started failing, if they are failing now.
    pub writes_failing_since: Mutex<Option<Instant>>,
    /// Whether the last failure was permanent: the store refuses, rather than fails to answer.
    pub writes_rejecting: AtomicBool,
    /// When the absorb commit in progress started.
    pub commit_started: Mutex<Option<Instant>>,
    /// Whether the last absorb commit attempt failed.
    pub commit_failing: Mutex<bool>,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: ChainConfig,
        epoch: u64,
        store: Arc<dyn ObjectStore>,
        catalog: Catalog,
        streams: Arc<StreamRegistry>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            admission: AdmissionBuffer::new(
                config.admission_bytes,
                metrics.admission.clone(),
                config.clock,
            ),
            express_buffer: config.express.as_ref().map(|express| {
                AdmissionBuffer::new(
                    express.buffer_bytes,
                    metrics.express.buffer.clone(),
                    config.clock,
                )
            }),
            backlog: Budget::new(
                config.backlog_flights as u64,
                metrics.backlog.clone(),
                config.clock,
            ),
            express_down: tokio::sync::watch::Sender::new(None),
            express_leftovers: Mutex::new(Vec::new()),
            express_carried: tokio::sync::watch::Sender::new(None),
            read_budget: Budget::new(config.read_bytes, metrics.read_memory.clone(), config.clock),
            tail_cache: TailCache::new(config.tail_cache_bytes, metrics.tail_cache.clone()),
            pending: PendingIndex::default(),
            fenced: Mutex::new(None),
            lost: CancellationToken::new(),
            health: Health::default(),
            backlog_stall: Mutex::new(None),
            abandon: CancellationToken::new(),
            config,
            epoch,
            store,
            absorb_catalog: catalog.prioritised(),
            catalog,
            streams,
            metrics,
        }
    }

    pub fn fenced(&self) -> Option<String> {
        self.fenced.lock().clone()
    }

    /// Keeps what a failed flight carried for the express chain until the star is dropped (see
    /// `express_leftovers`).
    pub fn keep_until_exit<T: Send + 'static>(&self, leftover: T) {
        self.express_leftovers.lock().push(Box::new(leftover));
    }

    pub fn fence(&self, reason: String) {
        let mut fenced = self.fenced.lock();
        if fenced.is_none() {
            tracing::error!(
                "{reason}; this star refuses appends from now on and acknowledges nothing more"
            );
            *fenced = Some(reason);
            self.metrics.fenced.set(1);
            self.lost.cancel();
        }
    }

    /// Why the backlog budget is spent right now.
    pub fn diagnose_backlog(&self) -> StallCause {
        let slow_commit = self
            .health
            .commit_started
            .lock()
            .is_some_and(|at| self.config.clock.since(at) >= self.config.metastore_slow_after);
        if slow_commit || *self.health.commit_failing.lock() {
            StallCause::MetastoreSlow
        } else {
            StallCause::AbsorbLag
        }
    }

    /// Why appends are waiting for the admission buffer right now.
    pub fn diagnose_admission(&self) -> StallCause {
        if self.health.writes_rejecting.load(Ordering::Acquire) {
            StallCause::ObjectStoreRejecting
        } else if self.writes_failing() {
            StallCause::ObjectStoreUnavailable
        } else if self.backlog.in_use() >= self.backlog.capacity() {
            self.diagnose_backlog()
        } else {
            StallCause::WriteThroughput
        }
    }

    pub fn writes_failing(&self) -> bool {
        self.health.writes_failing_since.lock().is_some()
    }
}
