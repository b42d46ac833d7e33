//! The auditor: a star's background duties, each run as small jobs under explicit budgets.
//!
//! - **settle** moves each stream's sections out of the chain's multi-stream flights into
//!   per-stream objects and swaps the index entries over (`settle`);
//! - **collect** deletes what nothing references any more once its grace period is over: settled
//!   flights, objects replaced or orphaned, the objects of deleted streams (`collect`);
//! - **rewrite** merges a stream's small settled objects into larger ones, copying server-side
//!   what is large enough to copy (`rewrite`);
//! - **retention** trims streams that have a retention from their front, a whole object at a
//!   time (`retention`);
//! - **drop_deleted** removes a deleted stream's index entries and queues its objects (`drop`);
//! - **sweep** now and then checks every settled object in the bucket against the catalog and
//!   queues any that nothing references or writes (`sweep`).
//!
//! Nothing waits in memory: what is due is read from the catalog each time (the settle cursor
//! against the chain's checkpoint, the garbage queue in due order, the deleted-stream records),
//! a page at a time. Every job is idempotent and may be cut off at any await: a crash, a
//! shutdown or a lost answer leaves the catalog consistent, and the next job picks up from it.
//!
//! Budgets: object-store requests per second (`RateLimited` wraps the store the auditor uses),
//! bytes per second assembled and written (`rewrite`), jobs at once (`workers`), and the fetch
//! cache's disk bytes. A job at a budget waits; the backlog that builds shows as the age of the
//! oldest due duty, `nova_auditor_oldest_due_age_seconds`.
//!
//! The auditor reaches the star only through the object store and the catalog, so it could run
//! in a process of its own.

mod collect;
mod drop;
mod fetch_cache;
pub mod metrics;
mod retention;
mod rewrite;
mod settle;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use nova_core::catalog::{Catalog, CatalogError};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::flight::{FetchError, FormatError};
use nova_core::limits::{KIB, MIB};
use nova_core::object_store::{ObjectStore, StoreError, StoreStack};
use nova_core::rate::RateBudget;
use nova_core::supervisor::{Supervisor, Watched};

use crate::fetch_cache::{CacheError, FetchCache};
use crate::metrics::AuditorMetrics;

/// The defaults of the auditor's flags.
pub mod defaults {
    pub const S3_BUDGET: u32 = 50;
    pub const REWRITE_MIB: u32 = 64;
    pub const WORKERS: u32 = 2;
    pub const FETCH_CACHE_MIB: u64 = 40_960;
    pub const COLLECT_GRACE_SECS: u64 = 600;
    pub const IDLE_MS: u64 = 1000;
    pub const SETTLE_AFTER_SECS: u64 = 30;
    pub const SWEEP_SECS: u64 = 3600;
    pub const REWRITE_MIN_OBJECTS: u64 = 16;
}

#[derive(Debug, Clone)]
pub struct AuditorConfig {
    /// The star whose chain and streams this auditor looks after.
    pub star: String,
    /// Object-store requests per second (`--auditor-s3-budget`).
    pub s3_budget: u32,
    /// MiB per second assembled and written (`--auditor-rewrite-mib`).
    pub rewrite_mib: u32,
    /// Jobs at once (`--auditor-workers`).
    pub workers: u32,
    /// Disk bytes of the fetch cache (`--auditor-fetch-cache-mib`).
    pub fetch_cache_bytes: u64,
    /// Scratch directory of the fetch cache; emptied at start.
    pub fetch_cache_dir: PathBuf,
    /// Flights up to this size are read whole (through the fetch cache); larger ones a section
    /// at a time. novad passes `--flight-max-bytes`.
    pub whole_object_max: u64,
    /// How long an object stays after nothing references it (`--auditor-collect-grace-secs`).
    pub collect_grace: Duration,
    /// How long absorbed flights of the star's current epoch wait before they are settled,
    /// unless a whole window's worth is waiting (`--auditor-settle-after-secs`): settling a
    /// second's flights at a time would make an object per stream per second.
    pub settle_after: Duration,
    /// A run of this many small settled objects of one stream is merged without waiting for
    /// more (`defaults::REWRITE_MIN_OBJECTS`); a run that reaches a merge's size limits is
    /// merged whatever its length.
    pub rewrite_min_objects: usize,
    /// How long a duty with nothing due sleeps before it looks again.
    pub idle: Duration,
    /// How often the sweep passes over every settled object (`--auditor-sweep-secs`).
    pub sweep_every: Duration,
    pub clock: Clock,
    pub entropy: Entropy,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("object store: {0}")]
    Store(#[from] StoreError),
    #[error("catalog: {0}")]
    Catalog(#[from] CatalogError),
    #[error("{0}")]
    Fetch(#[from] FetchError),
    #[error("{key}: {source}")]
    Format { key: String, source: FormatError },
    #[error("{0}")]
    Cache(#[from] CacheError),
    /// The store and the catalog disagree in a way no crash explains; the duty stops short of
    /// doing anything it cannot undo and retries later.
    #[error("{0}")]
    Inconsistent(String),
}

/// What a job found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing was due.
    Idle,
    /// It did a job (or part of one); look again at once.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Duty {
    Settle,
    Collect,
    DropDeleted,
    Rewrite,
    Retention,
    Sweep,
}

/// Every duty, in the order their tasks start.
const ALL_DUTIES: [Duty; 6] = [
    Duty::Settle,
    Duty::Collect,
    Duty::DropDeleted,
    Duty::Rewrite,
    Duty::Retention,
    Duty::Sweep,
];
/// The duties whose backlog counts as due work (the sweep is periodic housekeeping).
const DUE_DUTIES: [Duty; 5] = [
    Duty::Settle,
    Duty::Collect,
    Duty::DropDeleted,
    Duty::Rewrite,
    Duty::Retention,
];

impl Duty {
    fn as_str(self) -> &'static str {
        match self {
            Duty::Settle => "settle",
            Duty::Collect => "collect",
            Duty::DropDeleted => "drop_deleted",
            Duty::Rewrite => "rewrite",
            Duty::Retention => "retention",
            Duty::Sweep => "sweep",
        }
    }

    fn index(self) -> usize {
        match self {
            Duty::Settle => 0,
            Duty::Collect => 1,
            Duty::DropDeleted => 2,
            Duty::Rewrite => 3,
            Duty::Retention => 4,
            // Periodic housekeeping: never counted as due.
            Duty::Sweep => 5,
        }
    }
}

/// The most the auditor's jobs hold in memory at once, for novad's memory formula: a settle job
/// (flights up to `whole_object_max` read whole, records up to `max_record_bytes`) and a rewrite
/// job, which run side by side; the other duties hold a page of keys.
pub fn working_memory(whole_object_max: u64, max_record_bytes: u64) -> u64 {
    settle::working_memory(whole_object_max, max_record_bytes) + rewrite::working_memory()
}

/// Where the sweep stands: the prefix and key its pass has reached (a pass covers this
/// star's prefixes, then each adopted star's), and when the next pass is due (monotonic: a
/// wall clock stepped back must not hold passes up for as long as the step).
#[derive(Debug, Default)]
pub(crate) struct SweepState {
    /// `None` between passes.
    pub root: Option<String>,
    pub after: Option<String>,
    /// In a chain's prefix: how far the collector had deleted it when its sweep began (see
    /// `sweep::chain_reach`).
    pub chain_reach: Option<(u64, Option<u64>)>,
    /// Per chain swept (this star's and the adopted ones'), the latest due time its sweep
    /// queued leftovers at, and when (monotonic): until the queue is past it, or for two grace
    /// periods at most (a due time from a wall clock that was ahead must not hold the chain's
    /// sweep up for as long), that chain is not swept again.
    pub chain_queued: std::collections::HashMap<String, (u64, nova_core::clock::Instant)>,
    pub started: Option<nova_core::clock::Instant>,
    pub next_pass: Option<nova_core::clock::Instant>,
}

/// The chains of departed stars this auditor looks after besides its own: it settles what they
/// absorbed but never settled (see `settle`) and sweeps their settled objects (see `sweep`), so
/// nothing a star that left for good wrote stays forever. Which stars those are is decided
/// outside (novad's fleet elects one adopter per departed star); a clone shares the set.
///
/// A job on an adopted star holds an [`AdoptionGuard`], so whoever ends an adoption can wait
/// for the jobs still running on it ([`Adoptions::wait_idle`]) before the star's own auditor
/// takes over. A star whose jobs fail is retried with exponential backoff, so a chain that
/// cannot be settled does not spend the request budget the star's own duties share.
#[derive(Debug, Clone, Default)]
pub struct Adoptions {
    inner: Arc<Mutex<AdoptionState>>,
}

#[derive(Debug, Default)]
struct AdoptionState {
    stars: Vec<String>,
    /// Jobs running on each star now.
    active: std::collections::HashMap<String, usize>,
    /// Per adopted star, cancelled when it is dropped from the set: its running job stops.
    tokens: std::collections::HashMap<String, CancellationToken>,
    /// Per failing star: the last failure logged (a lasting cause is logged once), failures in
    /// a row, and when (unix ms) it may be tried again.
    failing: std::collections::HashMap<String, Failing>,
    metrics: Option<AuditorMetrics>,
}

#[derive(Debug)]
struct Failing {
    message: String,
    count: u32,
    retry_at_ms: u64,
}

/// The longest wait before an adopted chain that keeps failing is tried again.
const ADOPTED_MAX_BACKOFF: Duration = Duration::from_secs(300);

/// A job running on an adopted star; dropping it ends the job.
#[derive(Debug)]
pub struct AdoptionGuard {
    adoptions: Adoptions,
    star: String,
    cancelled: CancellationToken,
}

impl AdoptionGuard {
    /// Runs `job` until it ends or the star is no longer adopted (then `None`).
    pub(crate) async fn run<T>(&self, job: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            _ = self.cancelled.cancelled() => None,
            out = job => Some(out),
        }
    }
}

impl Drop for AdoptionGuard {
    fn drop(&mut self) {
        let mut state = self.adoptions.inner.lock();
        if let Some(active) = state.active.get_mut(&self.star) {
            *active -= 1;
            if *active == 0 {
                state.active.remove(&self.star);
            }
        }
    }
}

impl Adoptions {
    /// Replaces the adopted stars. Jobs already running on a star no longer adopted finish;
    /// no new one starts.
    pub fn set(&self, stars: impl IntoIterator<Item = String>) {
        let mut stars: Vec<String> = stars.into_iter().collect();
        stars.sort();
        stars.dedup();
        let mut state = self.inner.lock();
        if state.stars != stars {
            tracing::info!(adopted = ?stars, "auditor: the departed stars' chains it looks after");
        }
        state.failing.retain(|star, _| stars.contains(star));
        state.tokens.retain(|star, token| {
            let keep = stars.contains(star);
            if !keep {
                token.cancel();
            }
            keep
        });
        if let Some(metrics) = &state.metrics {
            metrics.adopted_chains.set(stars.len() as i64);
        }
        state.stars = stars;
    }

    pub fn stars(&self) -> Vec<String> {
        self.inner.lock().stars.clone()
    }

    /// Whether a job on `star` is running now.
    pub fn busy(&self, star: &str) -> bool {
        self.inner.lock().active.contains_key(star)
    }

    /// Waits until no job runs on `star` (after `set` dropped it), polling every `every`.
    pub async fn wait_idle(&self, star: &str, clock: &Clock, every: Duration) {
        while self.busy(star) {
            clock.sleep(every).await;
        }
    }

    /// The adopted stars a job may start on at `now_ms` (those not backing off a failure).
    pub(crate) fn due(&self, now_ms: u64) -> Vec<String> {
        let state = self.inner.lock();
        state
            .stars
            .iter()
            .filter(|star| {
                state
                    .failing
                    .get(*star)
                    .is_none_or(|f| f.retry_at_ms <= now_ms)
            })
            .cloned()
            .collect()
    }

    /// Starts a job on `star`, unless it is no longer adopted.
    pub(crate) fn enter(&self, star: &str) -> Option<AdoptionGuard> {
        let mut state = self.inner.lock();
        if !state.stars.iter().any(|s| s == star) {
            return None;
        }
        *state.active.entry(star.to_owned()).or_default() += 1;
        let cancelled = state.tokens.entry(star.to_owned()).or_default().clone();
        Some(AdoptionGuard {
            adoptions: self.clone(),
            star: star.to_owned(),
            cancelled,
        })
    }

    pub(crate) fn succeeded(&self, star: &str) {
        if self.inner.lock().failing.remove(star).is_some() {
            tracing::info!(star, "auditor: the adopted chain settles again");
        }
    }

    pub(crate) fn failed(&self, star: &str, err: &AuditError, now_ms: u64, idle: Duration) {
        let message = err.to_string();
        let mut state = self.inner.lock();
        if let Some(metrics) = &state.metrics {
            metrics.adopted_failures.inc();
        }
        let count = state
            .failing
            .get(star)
            .map_or(1, |f| f.count.saturating_add(1));
        let wait = (idle * 2u32.saturating_pow(count.min(16))).min(ADOPTED_MAX_BACKOFF);
        let logged = state
            .failing
            .get(star)
            .is_some_and(|f| f.message == message);
        if !logged {
            tracing::warn!(
                star,
                retry_in_ms = wait.as_millis() as u64,
                "auditor: a job on an adopted chain failed; it is tried again with backoff, \
                 never ahead of the star's own duties: {message}"
            );
        }
        state.failing.insert(
            star.to_owned(),
            Failing {
                message,
                count,
                retry_at_ms: now_ms.saturating_add(wait.as_millis() as u64),
            },
        );
    }
}

/// What every job shares.
pub(crate) struct Ctx {
    pub config: AuditorConfig,
    /// The object store behind the request budget: everything the auditor asks goes through it.
    pub store: Arc<dyn ObjectStore>,
    pub catalog: Catalog,
    pub metrics: AuditorMetrics,
    pub cache: FetchCache,
    pub adoptions: Adoptions,
    rewrite: RateBudget,
    workers: Arc<Semaphore>,
    /// Since when (unix ms) each duty has had work due; `None` while it has none.
    due_since: Mutex<[Option<u64>; ALL_DUTIES.len()]>,
    pub(crate) sweep: Mutex<SweepState>,
    pub(crate) rewrite_state: Mutex<rewrite::RewriteState>,
    pub(crate) retention_state: Mutex<retention::RetentionState>,
    /// Since when (monotonic) absorbed flights have waited to be settled, due or not yet.
    pub(crate) settle_pending_since: Mutex<Option<nova_core::clock::Instant>>,
}

/// Units of the rewrite budget: 64 KiB, so small objects are charged fairly and a second's
/// burst at the default is 1024 units.
const REWRITE_UNIT: u64 = 64 * KIB;

impl Ctx {
    /// When garbage queued now comes due.
    pub fn due_at(&self) -> u64 {
        self.due_after(self.config.collect_grace)
    }

    /// `wait` from `now` on the monotonic clock; a wait too long to represent (a flag set to
    /// mean "never") is a century.
    pub(crate) fn after(
        now: nova_core::clock::Instant,
        wait: Duration,
    ) -> nova_core::clock::Instant {
        now.checked_add(wait)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
    }

    fn due_after(&self, wait: Duration) -> u64 {
        self.config
            .clock
            .unix_ms()
            .saturating_add(wait.as_millis() as u64)
    }

    /// When the intent for an object written now comes due: after twice the grace and at least
    /// a second, so the write and its swap finish long before a collector can claim it (a
    /// claimed intent refuses the swap, and the settle would start over).
    pub fn intent_due_at(&self) -> u64 {
        self.due_after((2 * self.config.collect_grace).max(Duration::from_secs(1)))
    }

    /// Waits until `bytes` more may be assembled and written.
    pub async fn charge_rewrite(&self, bytes: u64) {
        let waited = self.rewrite.take(bytes.div_ceil(REWRITE_UNIT)).await;
        self.metrics
            .budget_wait_seconds
            .with_label_values(&["rewrite_bytes"])
            .inc_by(waited.as_secs_f64());
    }

    /// Records whether `duty` has work due, and since when (the earliest known moment).
    pub fn set_due(&self, duty: Duty, since_ms: Option<u64>) {
        self.due_since.lock()[duty.index()] = since_ms;
    }

    /// Marks `duty` as having work due from now on, unless it already had.
    pub fn mark_due(&self, duty: Duty) {
        let now = self.config.clock.unix_ms();
        self.due_since.lock()[duty.index()].get_or_insert(now);
    }

    /// Moves the due mark of `duty` later (its oldest due work was done) or earlier.
    pub fn due_from(&self, duty: Duty, since_ms: u64) {
        let now = self.config.clock.unix_ms();
        self.due_since.lock()[duty.index()] = Some(since_ms.min(now));
    }

    fn publish_due(&self) {
        let now = self.config.clock.unix_ms();
        let due = *self.due_since.lock();
        let mut oldest = 0.0f64;
        for duty in DUE_DUTIES {
            let age =
                due[duty.index()].map_or(0.0, |since| now.saturating_sub(since) as f64 / 1000.0);
            self.metrics
                .due_age
                .with_label_values(&[duty.as_str()])
                .set(age);
            oldest = oldest.max(age);
        }
        self.metrics.oldest_due_age.set(oldest);
    }

    async fn worker(&self) -> Option<OwnedSemaphorePermit> {
        let started = self.config.clock.now();
        let permit = self.workers.clone().acquire_owned().await.ok()?;
        self.metrics
            .budget_wait_seconds
            .with_label_values(&["workers"])
            .inc_by(self.config.clock.since(started).as_secs_f64());
        Some(permit)
    }
}

/// A running auditor; `stop` ends it.
pub struct Auditor {
    ctx: Arc<Ctx>,
    stop: CancellationToken,
    tasks: Vec<Watched>,
}

impl Auditor {
    /// Starts every duty. `store` is the star's store; the auditor puts its own request budget in
    /// front of it.
    pub fn start(
        config: AuditorConfig,
        store: Arc<dyn ObjectStore>,
        catalog: Catalog,
        registry: &prometheus::Registry,
    ) -> std::io::Result<Self> {
        Self::start_supervised(config, store, catalog, registry, &Supervisor::new())
    }

    /// As [`Auditor::start`], with the duties watched by the process's `supervisor`: a duty
    /// that stops or panics before [`Auditor::stop`] fails it, naming the duty.
    pub fn start_supervised(
        config: AuditorConfig,
        store: Arc<dyn ObjectStore>,
        catalog: Catalog,
        registry: &prometheus::Registry,
        supervisor: &Supervisor,
    ) -> std::io::Result<Self> {
        let metrics = AuditorMetrics::register(registry);
        let budget = RateBudget::new(config.s3_budget, config.clock);
        let store = StoreStack::over(store)
            .rate_limited(budget, metrics.store.clone())
            .build();
        let cache = FetchCache::open(
            &config.fetch_cache_dir,
            config.fetch_cache_bytes,
            metrics.clone(),
        )?;
        let workers = config.workers.max(1);
        metrics.workers.set(workers as i64);
        let rewrite_units =
            (config.rewrite_mib.max(1) as u64 * MIB / REWRITE_UNIT).min(u32::MAX as u64) as u32;
        let adoptions = Adoptions::default();
        adoptions.inner.lock().metrics = Some(metrics.clone());
        let ctx = Arc::new(Ctx {
            adoptions,
            rewrite: RateBudget::new(rewrite_units, config.clock),
            workers: Arc::new(Semaphore::new(workers as usize)),
            due_since: Mutex::new([None; ALL_DUTIES.len()]),
            sweep: Mutex::new(SweepState::default()),
            rewrite_state: Mutex::new(rewrite::RewriteState::default()),
            retention_state: Mutex::new(retention::RetentionState::default()),
            settle_pending_since: Mutex::new(None),
            config,
            store,
            catalog,
            metrics,
            cache,
        });
        tracing::info!(
            s3_budget = ctx.config.s3_budget,
            rewrite_mib = ctx.config.rewrite_mib,
            workers,
            fetch_cache_bytes = ctx.config.fetch_cache_bytes,
            collect_grace_secs = ctx.config.collect_grace.as_secs(),
            "auditor started"
        );
        let stop = CancellationToken::new();
        let mut tasks: Vec<Watched> = ALL_DUTIES
            .into_iter()
            .map(|duty| {
                supervisor.watch(
                    format!("auditor {}", duty.as_str()),
                    stop.clone(),
                    run_duty(ctx.clone(), duty, stop.clone()),
                )
            })
            .collect();
        tasks.push(supervisor.watch(
            "auditor ages",
            stop.clone(),
            publish_ages(ctx.clone(), stop.clone()),
        ));
        Ok(Self { ctx, stop, tasks })
    }

    pub fn metrics(&self) -> &AuditorMetrics {
        &self.ctx.metrics
    }

    /// The departed stars whose chains this auditor looks after, to be set by whoever elects
    /// adopters.
    pub fn adoptions(&self) -> Adoptions {
        self.ctx.adoptions.clone()
    }

    /// Stops every duty where it is: each is safe to cut off mid-job.
    pub async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

async fn run_duty(ctx: Arc<Ctx>, duty: Duty, stop: CancellationToken) {
    let mut failures: u32 = 0;
    loop {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            permit = ctx.worker() => match permit {
                Some(permit) => permit,
                None => return,
            },
        };
        ctx.metrics.workers_busy.inc();
        let result = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            result = step(&ctx, duty) => Some(result),
        };
        ctx.metrics.workers_busy.dec();
        drop(permit);
        let Some(result) = result else { return };
        let pause = match result {
            Ok(Step::Done) => {
                failures = 0;
                ctx.metrics
                    .jobs
                    .with_label_values(&[duty.as_str(), "done"])
                    .inc();
                Duration::ZERO
            }
            Ok(Step::Idle) => {
                failures = 0;
                ctx.metrics
                    .jobs
                    .with_label_values(&[duty.as_str(), "idle"])
                    .inc();
                ctx.config.idle
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                ctx.metrics
                    .jobs
                    .with_label_values(&[duty.as_str(), "failed"])
                    .inc();
                let pause = (ctx.config.idle * 2u32.saturating_pow(failures.min(6)))
                    .min(Duration::from_secs(60));
                tracing::warn!(
                    duty = duty.as_str(),
                    failures,
                    retry_in_ms = pause.as_millis() as u64,
                    "auditor job failed; the work stays due: {err}"
                );
                pause
            }
        };
        ctx.publish_due();
        if !pause.is_zero() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = ctx.config.clock.sleep(pause) => {}
            }
        }
    }
}

/// Keeps the due ages current while jobs wait at a budget: a backlog must read as a growing age
/// even while no job finishes.
async fn publish_ages(ctx: Arc<Ctx>, stop: CancellationToken) {
    let period = ctx.config.idle.min(Duration::from_secs(1));
    loop {
        ctx.publish_due();
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = ctx.config.clock.sleep(period) => {}
        }
    }
}

async fn step(ctx: &Ctx, duty: Duty) -> Result<Step, AuditError> {
    match duty {
        Duty::Settle => settle::step(ctx).await,
        Duty::Collect => collect::step(ctx).await,
        Duty::DropDeleted => drop::step(ctx).await,
        Duty::Rewrite => rewrite::step(ctx).await,
        Duty::Retention => retention::step(ctx).await,
        Duty::Sweep => sweep::step(ctx).await,
    }
}
