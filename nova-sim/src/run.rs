//! One seed: the real star opened, loaded, killed or shut down, and reopened, several times,
//! on the simulated store and metastore; then a final start without faults that reads every
//! stream back for the oracle.
//!
//! Each incarnation runs on a fresh current-thread tokio runtime started with its clock paused:
//! time moves only when every task waits, so a run takes the CPU time it needs, not the time
//! it simulates, and the same seed makes the same choices in the same order. A crash is the
//! runtime dropped mid-run: every task of the star is dropped at the await it was in, and only
//! the store and the metastore remain.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::task::JoinSet;

use nova_auditor::{Auditor, AuditorConfig};
use nova_chain::Star;
use nova_chain::admission::encoded_charge;
use nova_chain::metrics::Metrics;
use nova_chain::rebuild::{RebuildError, rebuild_catalog};
use nova_chain::streams::StreamState;
use nova_core::catalog::Catalog;
use nova_core::catalog::{Retention, StorageClass};
use nova_core::clock::{Clock, ClockSkew};
use nova_core::entropy::Entropy;
use nova_core::flight::section::{RecordIter, encode_chunks};
use nova_core::flight::{ObjectFooter, parse_object};
use nova_core::keys::{
    chain_prefix, chain_root, data_root, parse_any_data_key, parse_epoch, parse_settle_marker,
    parse_slot, parse_trim_marker, settle_marker_prefix, trims_root,
};
use nova_core::limits::MAX_SECTION_BYTES;
use nova_core::object_store::ObjectStore;
use nova_core::record::Record;
use nova_proto::RequestError;

use crate::metastore::{MetastoreFaults, SimMetastore};
use crate::oracle::{Oracle, body};
use crate::plan::{End, Life, Plan, STAR};
use crate::store::{SimStore, StoreFaults};

mod checks;
mod clients;

use checks::*;
use clients::*;

pub(crate) use checks::check_chain_of;

/// Virtual time a restart may take before the run counts as a star that stays down.
const RESTART_LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    pub lives: usize,
    pub crashes: usize,
    pub acked_batches: usize,
    pub refused_batches: usize,
    pub unknown_batches: usize,
    pub acked_records: u64,
    pub simulated: Duration,
    /// What the auditors of every incarnation did.
    pub audited: Audited,
    /// Identical for two runs of one seed: the proof that it replays.
    pub digest: u64,
}

/// What the auditors of a seed's incarnations did, from their metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Audited {
    pub settled_flights: u64,
    /// Chain slots and settled objects deleted.
    pub collected_objects: u64,
    /// Settled objects the rewrite merged into larger ones.
    pub merged_objects: u64,
    /// Records retention trimmed.
    pub trimmed_records: u64,
    /// Trims by age refused because the star's and the store's clocks disagreed.
    pub refused_trims: u64,
    /// Merges dropped because the store composed an object of the wrong size.
    pub rejected_merges: u64,
    /// Queued deletions a clock that was ahead had dated in the future, brought back.
    pub redated_garbage: u64,
}

impl Audited {
    fn count(&mut self, metrics: &nova_auditor::metrics::AuditorMetrics) {
        self.settled_flights += metrics.settled_flights.get();
        self.collected_objects += ["chain_slot", "settled", "orphan"]
            .iter()
            .map(|kind| metrics.deleted_objects.with_label_values(&[kind]).get())
            .sum::<u64>();
        self.merged_objects += metrics.rewritten_objects.get();
        self.trimmed_records += metrics.trimmed_records.get();
        self.refused_trims += metrics.refused_trims.with_label_values(&["clock"]).get();
        self.rejected_merges += metrics.rejected_merges.get();
        self.redated_garbage += metrics.redated_garbage.get();
    }

    pub fn add(&mut self, other: &Audited) {
        self.settled_flights += other.settled_flights;
        self.collected_objects += other.collected_objects;
        self.merged_objects += other.merged_objects;
        self.trimmed_records += other.trimmed_records;
        self.refused_trims += other.refused_trims;
        self.rejected_merges += other.rejected_merges;
        self.redated_garbage += other.redated_garbage;
    }
}

#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub violations: Vec<String>,
    /// A fleet seed (`run_fleet_seed`), replayed with `--fleet`.
    pub fleet: bool,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} failed:", self.seed)?;
        for v in &self.violations {
            writeln!(f, "  - {v}")?;
        }
        let replay = if self.fleet {
            replay_fleet_command(self.seed)
        } else {
            replay_command(self.seed)
        };
        write!(f, "replay it with: {replay}")
    }
}

/// The one-line command that replays a seed exactly, with the star's logs.
pub fn replay_command(seed: u64) -> String {
    format!("cargo run -p nova-sim -- --seed {seed} --verbose")
}

/// The one-line command that replays a fleet seed exactly, with the stars' logs.
pub fn replay_fleet_command(seed: u64) -> String {
    format!("cargo run -p nova-sim -- --fleet --seed {seed} --verbose")
}

/// What outlives a crash.
struct World {
    seed: u64,
    plan: Plan,
    entropy: Entropy,
    store: SimStore,
    metastore: SimMetastore,
    oracle: Arc<Mutex<Oracle>>,
    /// The express zone buckets (three, when the seed has them).
    zones: Vec<SimStore>,
    /// Wall time carried from one incarnation to the next.
    wall: SystemTime,
    /// Decides when the metastore is lost and the catalog rebuilt from the bucket. Apart from
    /// `entropy` so that adding this left every other seed's run as it was.
    rebuilds: Entropy,
    /// The streams in use (stream `i` is named `s{i}`), and the next index to give out.
    live_streams: Mutex<(Vec<usize>, usize)>,
    simulated: Duration,
    /// Where the auditor's fetch cache would keep flights (its budget here is zero: every
    /// flight is read in ranges, so no disk I/O runs outside the simulated clock).
    scratch: tempfile::TempDir,
    /// What the auditors of the incarnations did.
    audited: Mutex<Audited>,
    /// How far the star's wall clock is off (the store's, the metastore's and the oracle's
    /// are true); one per seed, so it lives as long as the process.
    skew: &'static ClockSkew,
}

pub fn run_seed(seed: u64) -> Result<Report, Failure> {
    let entropy = Entropy::seeded(seed);
    let plan = Plan::draw(
        &entropy,
        &Entropy::seeded(seed ^ 0xa0d1_7042_5e77_1e00),
        &Entropy::seeded(seed ^ 0xe9b7_e55a_2017_0c11),
        &Entropy::seeded(seed ^ 0xc10c_4a2a_7d5e_0034),
    );
    tracing::info!(?plan, "seed {seed}");
    let zone_entropy = Entropy::seeded(seed ^ 0x2083_5a11_90e5);
    let zones = match &plan.express {
        Some(express) => (0..3)
            .map(|_| {
                SimStore::new(
                    express.zone_faults.clone(),
                    Entropy::seeded(zone_entropy.next_u64()),
                )
            })
            .collect(),
        None => Vec::new(),
    };
    let mut world = World {
        seed,
        zones,
        store: SimStore::new(plan.store.clone(), Entropy::seeded(entropy.next_u64())),
        metastore: SimMetastore::new(plan.metastore.clone(), Entropy::seeded(entropy.next_u64())),
        plan,
        entropy,
        oracle: Arc::default(),
        wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        simulated: Duration::ZERO,
        live_streams: Mutex::default(),
        rebuilds: Entropy::seeded(seed ^ 0x5eed_0f4e_b11d),
        scratch: tempfile::tempdir().expect("a scratch directory"),
        audited: Mutex::default(),
        skew: Box::leak(Box::default()),
    };
    *world.live_streams.lock() = ((0..world.plan.streams).collect(), world.plan.streams);
    let lives = world.plan.lives.clone();
    let mut crashes = 0;
    for (index, life) in lives.iter().enumerate() {
        tracing::info!(seed, life = index, ?life, "incarnation starts");
        let ended = incarnation(&mut world, index, Some(life));
        if matches!(life.end, End::Crash) {
            crashes += 1;
        }
        if ended.is_err() || !world.oracle.lock().violations.is_empty() {
            return Err(world.failure());
        }
    }
    // The last start: no faults, read everything back.
    world.store.set_faults(StoreFaults::none());
    for zone in &world.zones {
        zone.set_faults(StoreFaults::none());
    }
    world.metastore.set_faults(MetastoreFaults::none());
    tracing::info!(seed, "final incarnation: reading every stream back");
    if incarnation(&mut world, lives.len(), None).is_err()
        || !world.oracle.lock().violations.is_empty()
    {
        return Err(world.failure());
    }
    let audited = *world.audited.lock();
    let oracle = world.oracle.lock();
    let (acked_batches, refused_batches, unknown_batches) = oracle.counts();
    Ok(Report {
        seed,
        lives: lives.len(),
        crashes,
        acked_batches,
        refused_batches,
        unknown_batches,
        acked_records: oracle.acked_records(),
        simulated: world.simulated,
        audited,
        digest: oracle.digest(),
    })
}

impl World {
    fn failure(&self) -> Failure {
        Failure {
            seed: self.seed,
            violations: self.oracle.lock().violations.clone(),
            fleet: false,
        }
    }

    fn violation(&self, message: String) {
        self.oracle.lock().violation(message);
    }
}

/// Runs one incarnation to its end; `None` is the final, fault-free check. `Err` when the
/// star could not start.
fn incarnation(world: &mut World, index: usize, life: Option<&Life>) -> Result<(), ()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    // The true clock: the store's, the metastore's and the oracle's. The star and its auditor
    // read a wall clock that may be off by the seed's errors.
    let truth = runtime.block_on(async { Clock::simulated(world.wall) });
    world.store.attach(truth);
    for zone in &world.zones {
        zone.attach(truth);
    }
    world.metastore.attach(truth);
    match life {
        Some(_) => {
            if let Some(error) = world.plan.hazards.clock.get(index).and_then(|c| c.0) {
                world.skew.set_ms(error);
            }
        }
        // Corrected before the final check.
        None => world.skew.set_ms(0),
    }
    let clock = truth.skewed(world.skew);
    let started = runtime.block_on(async { truth.now() });
    let outcome = runtime.block_on(live(world, index, life, clock, truth));
    world.simulated += runtime.block_on(async { truth.since(started) });
    world.wall = runtime.block_on(async { truth.wall() });
    // The crash, or the end of a shutdown: every task still alive is dropped where it waits.
    drop(runtime);
    world.oracle.lock().process_ended();
    let most = world.store.most_chain_writes();
    if most > world.plan.chain.flight_max_inflight as usize {
        world.violation(format!(
            "incarnation {index}: {most} chain writes ran at once, over --flight-max-inflight={}",
            world.plan.chain.flight_max_inflight
        ));
    }
    check_chain(world);
    outcome
}

/// With zones, the odd-numbered streams are Express.
fn class_of(world: &World, stream: usize) -> StorageClass {
    if world.plan.express.is_some() && stream % 2 == 1 {
        StorageClass::Express
    } else {
        StorageClass::Standard
    }
}

async fn live(
    world: &World,
    index: usize,
    life: Option<&Life>,
    clock: Clock,
    truth: Clock,
) -> Result<(), ()> {
    // Writes the last incarnation left landing late may land during this one's recovery.
    world.store.resume_late_writes();
    for zone in &world.zones {
        zone.resume_late_writes();
    }
    if index > 0 && world.rebuilds.chance(0.1) {
        rebuild(world, index, clock).await?;
    }
    let config = world.plan.chain_config(
        Entropy::seeded(world.entropy.next_u64()),
        clock,
        &world.zones,
    );
    let open = Star::open(
        config,
        Arc::new(world.store.clone()),
        Arc::new(world.metastore.clone()),
        Arc::new(Metrics::new()),
    );
    let star = match clock.timeout(RESTART_LIMIT, open).await {
        Ok(Ok(star)) => Arc::new(star),
        Ok(Err(err)) => {
            world.violation(format!(
                "incarnation {index}: the star could not start: {err}"
            ));
            return Err(());
        }
        Err(_) => {
            world.violation(format!(
                "incarnation {index}: the star was still starting after {RESTART_LIMIT:?}"
            ));
            return Err(());
        }
    };
    let streams = open_streams(world, &star, clock).await?;
    for (i, stream) in streams.iter().cloned() {
        world
            .oracle
            .lock()
            .tail(i, stream.tail(), true, &format!("restart {index}"));
    }
    let Some(life) = life else {
        // Without faults, the auditor (when the seed runs one) must finish everything it has
        // due, and the streams then read back from what it left.
        if let Some(auditor) = start_auditor(world, index, clock, true) {
            audit_to_the_end(world, &star, &auditor, clock).await;
            world.audited.lock().count(auditor.metrics());
            auditor.stop().await;
        }
        read_back(world, &star, &streams, truth).await;
        if world.plan.auditor.is_some() {
            check_nothing_left(world, star.epoch()).await;
        }
        let _ = star.shutdown(Duration::from_secs(10)).await;
        return Ok(());
    };
    let auditor = start_auditor(world, index, clock, false);
    let mut tasks = JoinSet::new();
    for (i, stream) in streams.iter().cloned() {
        tasks.spawn(produce(
            world.context(&star, clock, truth),
            i,
            stream.clone(),
        ));
        tasks.spawn(consume(
            world.context(&star, clock, truth),
            i,
            stream.clone(),
        ));
    }
    tasks.spawn(watch_budgets(world.context(&star, clock, truth)));
    if let Some(age) = world.plan.hazards.retention_age {
        let aged: Vec<_> = streams
            .iter()
            .filter(|(_, s)| s.retention().age_ms.is_some() && s.retention().bytes.is_none())
            .cloned()
            .collect();
        tasks.spawn(watch_trim_points(
            world.context(&star, clock, truth),
            aged,
            age,
        ));
    }
    if world.entropy.chance(world.plan.delete) {
        // A delete in the middle of the run, while its stream is being appended to and read.
        let victim = world.retire_a_stream();
        let after = Duration::from_millis(world.entropy.below(life.run_for.as_millis() as u64));
        tasks.spawn(delete_stream(
            world.context(&star, clock, truth),
            victim,
            after,
        ));
    }
    if let Some((after, lasting, up)) = world
        .plan
        .express
        .as_ref()
        .and_then(|e| e.outages.get(index).copied().flatten())
    {
        // Two zones of three out at once: no quorum, so Express appends fail fast and the
        // express chain is sealed once they are back.
        let down: Vec<SimStore> = (0..3)
            .filter(|z| *z != up)
            .map(|z| world.zones[z].clone())
            .collect();
        tasks.spawn(async move {
            clock.sleep(after).await;
            tracing::info!(?lasting, "two express zones go out");
            for zone in &down {
                zone.outage(lasting);
            }
        });
    }
    if let Some((after, error)) = world.plan.hazards.clock.get(index).and_then(|c| c.1) {
        let skew = world.skew;
        tasks.spawn(async move {
            clock.sleep(after).await;
            tracing::info!(error_ms = error, "the star's wall clock steps");
            skew.set_ms(error);
        });
    }
    if let Some((after, lasting)) = life.outage {
        let store = world.store.clone();
        tasks.spawn(async move {
            clock.sleep(after).await;
            tracing::info!(?lasting, "store outage begins");
            store.outage(lasting);
        });
    }
    tokio::select! {
        biased;
        why = star.failed() => {
            world.violation(format!("incarnation {index}: the star failed while running: {why}"));
            return Err(());
        }
        _ = clock.sleep(life.run_for) => {}
    }
    if auditor.is_some() && world.plan.hazards.catch_up.get(index) == Some(&true) {
        tasks.abort_all();
        catch_up(world, index, clock).await;
    }
    if let Some(auditor) = &auditor {
        world.audited.lock().count(auditor.metrics());
    }
    match life.end {
        End::Crash => tracing::info!("crash"),
        End::Shutdown(deadline) => {
            tracing::info!(?deadline, "shutdown");
            if let Some(auditor) = auditor {
                auditor.stop().await;
            }
            let result = star.shutdown(deadline).await;
            tracing::info!(?result, "shutdown ended");
            // Let the producers take their last answers before the process goes.
            clock.sleep(Duration::from_millis(1)).await;
            tasks.abort_all();
        }
    }
    Ok(())
}

fn start_auditor(world: &World, index: usize, clock: Clock, final_check: bool) -> Option<Auditor> {
    let plan = world.plan.auditor.as_ref()?;
    let config = AuditorConfig {
        star: STAR.into(),
        s3_budget: plan.s3_budget,
        rewrite_mib: plan.rewrite_mib,
        workers: plan.workers,
        fetch_cache_bytes: 0,
        fetch_cache_dir: world.scratch.path().join(format!("fetch-cache-{index}")),
        whole_object_max: world.plan.chain.flight_max_bytes,
        collect_grace: plan.collect_grace,
        settle_after: plan.settle_after,
        rewrite_min_objects: plan.rewrite_min_objects,
        idle: plan.idle,
        // The final check sweeps every second, to see late writes of earlier lives land.
        sweep_every: if final_check {
            Duration::from_secs(1)
        } else {
            plan.sweep_every
        },
        clock,
        // Not drawn from `entropy`, so the rest of the run draws what it always did.
        entropy: Entropy::seeded(world.seed ^ 0xa0d1_7042 ^ ((index as u64) << 40)),
    };
    let auditor = Auditor::start(
        config,
        Arc::new(world.store.clone()),
        Catalog::new(Arc::new(world.metastore.clone())),
        &prometheus::Registry::new(),
    )
    .expect("the auditor starts");
    Some(auditor)
}

/// How long settling may take to catch up once the store and the metastore are healthy, on
/// top of the time the rewrite budget needs (see `catch_up_limit`).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);

/// How long settling may take to catch up with the chain the store holds: `CATCH_UP_LIMIT`,
/// plus twice the time the plan's rewrite budget takes to write out every byte of the chain
/// (settled objects are charged to it, and merges share it). A seed can leave a hundred MiB
/// of flights to a budget of 1 MiB/s: the auditor keeping to its budget is not a failure.
fn catch_up_limit(world: &World) -> Duration {
    let Some(auditor) = &world.plan.auditor else {
        return CATCH_UP_LIMIT;
    };
    let root = chain_root(STAR);
    let chain: u64 = world
        .store
        .snapshot()
        .range(root.clone()..)
        .take_while(|(key, _)| key.starts_with(&root))
        .map(|(_, object)| object.len() as u64)
        .sum();
    let per_second = u64::from(auditor.rewrite_mib.max(1)) << 20;
    CATCH_UP_LIMIT + Duration::from_secs_f64(2.0 * chain as f64 / per_second as f64)
}

/// The clients stop and the faults lift (whatever the wall clock says): the auditor must then
/// settle the star's chain up to its checkpoint of now within `catch_up_limit`, whatever the
/// faults before left behind (a deleted stream's unmarked manifest, a due time from a clock
/// that was ahead). The faults come back after, for the rest of the life.
async fn catch_up(world: &World, index: usize, clock: Clock) {
    world.store.end_outage();
    world.store.set_faults(StoreFaults::none());
    world.metastore.set_faults(MetastoreFaults::none());
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
    let limit = catch_up_limit(world);
    let started = clock.now();
    let mut target = None;
    loop {
        if target.is_none() {
            match catalog.chain(STAR).await {
                Ok(Some(chain)) => target = Some(chain.state),
                // Nothing written yet: nothing to settle.
                Ok(None) => break,
                Err(_) => {}
            }
        }
        let cursor = catalog.settle_cursor(STAR).await.ok().flatten();
        let caught_up = target.is_some_and(|chain| {
            cursor.is_some_and(|c| {
                c.cursor.epoch > chain.epoch
                    || (c.cursor.epoch == chain.epoch
                        && chain
                            .checkpoint
                            .is_none_or(|last| c.cursor.next_slot > last))
            })
        });
        if caught_up {
            break;
        }
        if clock.since(started) > limit {
            world.violation(format!(
                "incarnation {index}: settling did not catch up in {limit:?} with the store and \
                 the metastore healthy: cursor {cursor:?}, chain {target:?}"
            ));
            break;
        }
        clock.sleep(Duration::from_millis(200)).await;
    }
    world.store.set_faults(world.plan.store.clone());
    world.metastore.set_faults(world.plan.metastore.clone());
}

/// How long the fault-free auditor may take to finish what a seed left it.
const AUDIT_LIMIT: Duration = Duration::from_secs(600);

/// Waits until the auditor has settled every epoch before the star's current one, emptied its
/// garbage queue and dropped every deleted stream (or records a violation after `AUDIT_LIMIT`).
async fn audit_to_the_end(world: &World, star: &Star, auditor: &Auditor, clock: Clock) {
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
    let started = clock.now();
    // The sweep passes counted when the queue was last seen turning empty.
    let mut emptied_at: Option<u64> = None;
    loop {
        let cursor = catalog.settle_cursor(STAR).await.ok().flatten();
        let settled = cursor.is_some_and(|c| c.cursor.epoch >= star.epoch());
        let collected = catalog.garbage_page(1).await.is_ok_and(|g| g.is_empty());
        let sweeps = auditor.metrics().sweeps.get();
        if collected {
            emptied_at.get_or_insert(sweeps);
        } else {
            emptied_at = None;
        }
        let dropped = catalog
            .dropping_streams(1)
            .await
            .is_ok_and(|d| d.is_empty());
        // Late writes of earlier lives land up to two seconds into this one: wait for sweeps
        // begun after that. And a pass sweeps a chain only as far as the collector has got
        // (while the queue holds anything due before the chain's last run, that is where its
        // collected mark says), so wait for a whole pass begun once the queue was empty.
        let swept = clock.since(started) > Duration::from_secs(3)
            && sweeps >= 4
            && emptied_at.is_some_and(|at| sweeps >= at + 2);
        // Stopping the auditor cuts a job where it waits, as a crash would; a settle job cut
        // between its marker and its commit leaves slots for the next start to queue, which
        // this final check would count as left behind. So stop only between jobs: nothing
        // below awaits before the caller cancels them.
        let between_jobs = auditor.metrics().workers_busy.get() == 0;
        if settled && collected && dropped && swept && between_jobs {
            return;
        }
        if clock.since(started) > AUDIT_LIMIT {
            let queued = catalog.garbage_page(3).await.unwrap_or_default();
            world.violation(format!(
                "the auditor did not finish in {AUDIT_LIMIT:?} without faults: settled {settled}, \
                 collected {collected}, dropped {dropped}, swept {swept} (cursor {cursor:?}; \
                 first queued {queued:?}, now {})",
                clock.unix_ms()
            ));
            return;
        }
        clock.sleep(Duration::from_millis(200)).await;
    }
}

/// Creates the streams on the first start (retrying through faults) and finds them after.
async fn open_streams(
    world: &World,
    star: &Star,
    clock: Clock,
) -> Result<Vec<(usize, Arc<StreamState>)>, ()> {
    let mut streams = Vec::new();
    let live = world.live_streams.lock().0.clone();
    for i in live {
        let name = format!("s{i}");
        let mut attempts = 0;
        let stream = loop {
            if let Some(stream) = star.streams().get(&name) {
                break stream;
            }
            // The even-numbered streams have a retention: by bytes, by age, or (with both
            // drawn) by bytes for every fourth stream and by age for the others, so each is
            // checked alone.
            let bytes = world
                .plan
                .auditor
                .as_ref()
                .and_then(|a| a.retention_bytes)
                .filter(|_| i % 2 == 0);
            let age = world
                .plan
                .hazards
                .retention_age
                .filter(|_| i % 2 == 0 && world.plan.auditor.is_some())
                .map(|age| age.as_millis() as u64);
            let (age_ms, bytes) = match (age, bytes) {
                (Some(_), Some(_)) if i % 4 == 0 => (None, bytes),
                (Some(_), Some(_)) => (age, None),
                other => other,
            };
            let retention = Retention { age_ms, bytes };
            match star
                .streams()
                .create_with(&name, class_of(world, i), retention)
                .await
            {
                Ok(stream) => break stream,
                Err(err) if attempts < 1000 => {
                    attempts += 1;
                    tracing::debug!("creating {name}: {err}");
                    clock.sleep(Duration::from_millis(50)).await;
                }
                Err(err) => {
                    world.violation(format!("stream {name} could not be created: {err}"));
                    return Err(());
                }
            }
        };
        streams.push((i, stream));
    }
    Ok(streams)
}
