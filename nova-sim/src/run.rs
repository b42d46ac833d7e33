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
use nova_core::metrics::Metrics;
use nova_core::object_store::ObjectStore;
use nova_core::record::Record;
use nova_proto::RequestError;

use crate::metastore::{MetastoreFaults, SimMetastore};
use crate::oracle::{Oracle, body};
use crate::plan::{End, Life, Plan, STAR};
use crate::store::{SimStore, StoreFaults};

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

/// Nothing is acknowledged past a slot that did not land: in each epoch of the chain, every
/// flight after the first missing slot holds only records nobody was told are durable (the
/// next start ends the chain at the gap, so those flights are never read).
fn check_chain(world: &World) {
    let objects = world.store.snapshot();
    let mut oracle = world.oracle.lock();
    // An Express stream's records are acknowledged at the zones before a flight carries them;
    // recovery carries them again from the zones.
    let express = |stream: &str| {
        stream
            .strip_prefix('s')
            .and_then(|i| i.parse().ok())
            .is_some_and(|i| class_of(world, i) == StorageClass::Express)
    };
    check_chain_of(STAR, &objects, &mut oracle, &express);
}

/// `check_chain` for the chain of `star` in `objects`, skipping the streams `skip` names.
pub(crate) fn check_chain_of(
    star: &str,
    objects: &BTreeMap<String, Bytes>,
    oracle: &mut Oracle,
    skip: &dyn Fn(&str) -> bool,
) {
    let root = chain_root(star);
    let mut epochs: BTreeMap<u64, BTreeMap<u64, Bytes>> = BTreeMap::new();
    // The auditor's settle markers: slots up to them were settled and may be gone.
    let mut settled: BTreeMap<u64, u64> = BTreeMap::new();
    for (key, object) in objects.range(root.clone()..) {
        let Some(rest) = key.strip_prefix(&root) else {
            break;
        };
        let Some((epoch, slot)) = rest.split_once('/') else {
            continue;
        };
        let Ok(epoch) = epoch.parse::<u64>() else {
            continue;
        };
        if let Some(through) = slot
            .strip_prefix("settled-")
            .and_then(|s| s.parse::<u64>().ok())
        {
            let highest = settled.entry(epoch).or_insert(through);
            *highest = (*highest).max(through);
        } else if let Ok(slot) = slot.parse() {
            epochs
                .entry(epoch)
                .or_default()
                .insert(slot, object.clone());
        }
    }
    for (epoch, slots) in epochs {
        // Up to a settle marker the auditor may have deleted flights (and a late write of one
        // may even have landed again after the delete), so the chain is checked from just past
        // the marker.
        let from = settled.get(&epoch).map_or(0, |through| through + 1);
        let Some(gap) = (from..).find(|slot| !slots.contains_key(slot)) else {
            continue;
        };
        for (slot, object) in slots.range(gap..) {
            let flight = match parse_object(object) {
                Ok(ObjectFooter::Flight(flight)) => flight,
                Ok(ObjectFooter::Fence(_)) => continue,
                Err(err) => {
                    oracle.violation(format!(
                        "{star}: epoch {epoch} slot {slot} does not parse: {err}"
                    ));
                    continue;
                }
            };
            for section in &flight.sections {
                if skip(&section.stream) {
                    continue;
                }
                let range = section.offset as usize..(section.offset + section.len) as usize;
                let acked = RecordIter::new(object.slice(range))
                    .filter_map(Result::ok)
                    .filter(|record| oracle.is_acked(&record.body))
                    .count();
                if acked > 0 {
                    oracle.violation(format!(
                        "{star}: epoch {epoch} slot {slot} holds {acked} acknowledged records of stream {} (seqs {}..{}), past slot {gap} that never landed",
                        section.stream, section.start_seq, section.end_seq
                    ));
                }
            }
        }
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

/// How long settling may take to catch up once the store and the metastore are healthy.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);

/// The clients stop and the faults lift (whatever the wall clock says): the auditor must then
/// settle the star's chain up to its checkpoint of now within `CATCH_UP_LIMIT`, whatever the
/// faults before left behind (a deleted stream's unmarked manifest, a due time from a clock
/// that was ahead). The faults come back after, for the rest of the life.
async fn catch_up(world: &World, index: usize, clock: Clock) {
    world.store.end_outage();
    world.store.set_faults(StoreFaults::none());
    world.metastore.set_faults(MetastoreFaults::none());
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
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
        if clock.since(started) > CATCH_UP_LIMIT {
            world.violation(format!(
                "incarnation {index}: settling did not catch up in {CATCH_UP_LIMIT:?} with the \
                 store and the metastore healthy: cursor {cursor:?}, chain {target:?}"
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
    loop {
        let cursor = catalog.settle_cursor(STAR).await.ok().flatten();
        let settled = cursor.is_some_and(|c| c.cursor.epoch >= star.epoch());
        let collected = catalog.garbage_page(1).await.is_ok_and(|g| g.is_empty());
        let dropped = catalog
            .dropping_streams(1)
            .await
            .is_ok_and(|d| d.is_empty());
        // Late writes of earlier lives land up to two seconds into this one: wait for sweeps
        // begun after that.
        let swept =
            clock.since(started) > Duration::from_secs(3) && auditor.metrics().sweeps.get() >= 4;
        if settled && collected && dropped && swept {
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

/// After the auditor finished: every settled object is referenced by an index entry, no flight
/// is left in an epoch before the star's current one, and every entry's object exists.
async fn check_nothing_left(world: &World, epoch: u64) {
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
    let Ok(streams) = catalog.load_streams().await else {
        world.violation("the final catalog could not be read".into());
        return;
    };
    let objects = world.store.snapshot();
    let mut referenced = HashSet::new();
    for (meta, _) in &streams {
        let Ok(entries) = catalog.index_entries(meta.id, 0, 100_000).await else {
            world.violation(format!("the index of {} could not be read", meta.name));
            return;
        };
        for entry in entries {
            if !objects.contains_key(&entry.object_key) {
                world.violation(format!(
                    "{}'s entry {}..{} points at missing {}",
                    meta.name, entry.start_seq, entry.end_seq, entry.object_key
                ));
            }
            referenced.insert(entry.object_key);
        }
    }
    let root = data_root(STAR);
    for key in objects.keys().filter(|k| k.starts_with(&root)) {
        if !referenced.contains(key) {
            // What the catalog still says of it, for the report: a live stream's entry is in
            // `referenced`, so an entry here is a deleted stream's.
            let writing = catalog.being_written(key).await.ok();
            let entry = match parse_any_data_key(key) {
                Some(data) => catalog
                    .index_entry(data.stream_id, data.end)
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            world.violation(format!(
                "settled object {key} is left unreferenced (being written: {writing:?}; the \
                 index entry at its end: {entry:?})"
            ));
        }
    }
    check_chain_left(world, &objects, epoch);
    let mut trim_points = HashMap::new();
    for (meta, _) in &streams {
        match catalog.first_seq(meta.id).await {
            Ok(first) => trim_points.insert(meta.id, first),
            Err(_) => return world.violation("the final trim points could not be read".into()),
        };
    }
    // A trim queues the markers before it; what stays says where the stream is trimmed to.
    let trims = trims_root(STAR);
    for key in objects.keys().filter(|k| k.starts_with(&trims)) {
        let Some((id, marker)) = parse_trim_marker(&trims, key) else {
            world.violation(format!("{key} is no trim marker"));
            continue;
        };
        match trim_points.get(&id) {
            Some(first) if marker.after >= *first => {}
            Some(first) => world.violation(format!(
                "trim marker {key} is left behind the stream's trim point {first}"
            )),
            None => world.violation(format!("trim marker {key} of a deleted stream is left")),
        }
    }
}

/// What the settle leaves of the chain once it has caught up: of an epoch before `epoch` (the
/// star's current one), at most its fence and its last settle marker; of the current one, its
/// latest settle marker alone and no slot at or below it.
fn check_chain_left(world: &World, objects: &BTreeMap<String, Bytes>, epoch: u64) {
    let root = chain_root(STAR);
    // Per epoch: its slots (with their bytes) and its settle markers.
    type Left<'a> = (Vec<(u64, &'a Bytes)>, Vec<u64>);
    let mut epochs: BTreeMap<u64, Left> = BTreeMap::new();
    // A slot or marker whose PUT landed after its run was collected is the sweep's to find.
    let chain = objects.iter().filter(|(k, _)| k.starts_with(&root));
    for (key, bytes) in chain {
        let Some(e) = parse_epoch(&root, key) else {
            continue;
        };
        let prefix = chain_prefix(STAR, e);
        let (slots, markers) = epochs.entry(e).or_default();
        if let Some(slot) = parse_slot(&prefix, key) {
            slots.push((slot, bytes));
        } else if let Some(through) = parse_settle_marker(&settle_marker_prefix(STAR, e), key) {
            markers.push(through);
        }
    }
    for (e, (slots, markers)) in epochs {
        if e < epoch {
            // Its fence and its last marker stay; its slots go.
            if markers.len() > 1 {
                world.violation(format!(
                    "settled epoch {e} keeps superseded markers {markers:?}"
                ));
            }
            let fences = slots
                .iter()
                .filter(|(_, b)| matches!(parse_object(b), Ok(ObjectFooter::Fence(_))))
                .count();
            if slots.len() > fences.min(1) {
                let slots: Vec<u64> = slots.iter().map(|(s, _)| *s).collect();
                world.violation(format!("settled epoch {e} keeps slots {slots:?}"));
            }
        } else if let Some(&through) = markers.iter().max() {
            if markers.len() > 1 {
                world.violation(format!("epoch {e} keeps superseded markers: {markers:?}"));
            }
            let left: Vec<u64> = slots
                .iter()
                .map(|(s, _)| *s)
                .filter(|s| *s <= through)
                .collect();
            if !left.is_empty() {
                world.violation(format!(
                    "epoch {e} keeps slots {left:?} settled through {through}"
                ));
            }
        }
    }
}

/// The metastore is lost with its disk; `rebuild_catalog` restores it from the bucket alone,
/// retried through faults as an operator would, before the star starts on it.
async fn rebuild(world: &World, index: usize, clock: Clock) -> Result<(), ()> {
    tracing::info!("the metastore is lost; rebuilding the catalog from the bucket");
    world.metastore.wipe();
    // An operator's rebuild runs against a new, quiet metastore: no commit of it lands late
    // (a late one would make its retry find a catalog it did not finish; see docs/testing.md).
    let faults = world.metastore.faults();
    world.metastore.set_faults(MetastoreFaults {
        late: 0.0,
        ..faults.clone()
    });
    let store: Arc<dyn ObjectStore> = Arc::new(world.store.clone());
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
    // Half the rebuilds first find a stream's front object missing from the bucket: the
    // rebuild must refuse, not take the records for trimmed; the object is then put back (the
    // operator restores it) and the rebuild run again.
    let mut hidden = Entropy::seeded(world.seed ^ 0x00f2_070b_1ec7 ^ index as u64)
        .chance(0.5)
        .then(|| hide_a_front_object(world))
        .flatten();
    let mut last = String::new();
    for _ in 0..100 {
        match rebuild_catalog(STAR, &store, &catalog, clock).await {
            Ok(report) => {
                tracing::info!(?report, "catalog rebuilt");
                if let Some((key, object)) = hidden.take() {
                    // Too late: the catalog no longer points at these records.
                    world.store.put_back(&key, object);
                }
                world.metastore.set_faults(faults);
                return Ok(());
            }
            Err(RebuildError::FrontMissing {
                stream,
                trimmed,
                found,
            }) if hidden.is_some() => {
                tracing::info!(
                    stream,
                    trimmed,
                    found,
                    "the rebuild refused a stream missing its front; putting it back"
                );
                if let Some((key, object)) = hidden.take() {
                    world.store.put_back(&key, object);
                }
                // A refused rebuild leaves a catalog being restored: start over on an empty one.
                world.metastore.wipe();
            }
            Err(err) => {
                last = err.to_string();
                tracing::debug!("rebuilding the catalog: {err}");
                clock.sleep(Duration::from_millis(500)).await;
            }
        }
    }
    world.violation(format!(
        "incarnation {index}: the catalog could not be rebuilt from the bucket: {last}"
    ));
    Err(())
}

/// Takes the object holding the lowest records of one stream out of the store (a settled or
/// merged one: records still in chain flights are read from there), returning it. Only a
/// stream with records in a later object loses its front: one whose every object is gone
/// leaves nothing in the bucket to tell that it had records.
fn hide_a_front_object(world: &World) -> Option<(String, Bytes)> {
    let mut objects: BTreeMap<u64, Vec<(u64, u64, String)>> = BTreeMap::new();
    for key in world.store.snapshot().into_keys() {
        if let Some(data) = parse_any_data_key(&key) {
            objects
                .entry(data.stream_id)
                .or_default()
                .push((data.start, data.end, key));
        }
    }
    let fronts: Vec<String> = objects
        .into_values()
        .filter_map(|mut list| {
            list.sort();
            let (_, end, key) = list.first()?.clone();
            // Something past its end that it does not also hold.
            list.iter().any(|(_, e, _)| *e > end).then_some(key)
        })
        .collect();
    if fronts.is_empty() {
        return None;
    }
    let pick = Entropy::seeded(world.seed ^ 0x41de).below(fronts.len() as u64) as usize;
    let key = fronts[pick].clone();
    tracing::info!(
        key,
        "a stream's front object goes missing before the rebuild"
    );
    world.store.take(&key).map(|object| (key, object))
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

impl World {
    /// Picks a stream to delete and puts a new one in its place from the next start on. From
    /// now on the old stream's records may vanish, whether or not its delete lands.
    fn retire_a_stream(&self) -> usize {
        let mut live = self.live_streams.lock();
        let (streams, next) = &mut *live;
        let victim = streams[self.entropy.below(streams.len() as u64) as usize];
        streams.retain(|&s| s != victim);
        streams.push(*next);
        *next += 1;
        self.oracle.lock().delete_stream(victim);
        victim
    }
}

/// Deletes stream `victim` after a while, retrying through faults until the star says it is
/// gone (the process may die first).
async fn delete_stream(cx: Context, victim: usize, after: Duration) {
    cx.clock.sleep(after).await;
    let name = format!("s{victim}");
    for _ in 0..1000 {
        match cx.star.streams().delete(&name).await {
            Ok(()) | Err(RequestError::StreamNotFound(_)) => {
                tracing::info!(stream = name, "deleted");
                return;
            }
            Err(err) => {
                tracing::debug!("deleting {name}: {err}");
                cx.clock.sleep(Duration::from_millis(50)).await;
            }
        }
    }
    cx.oracle.lock().violation(format!(
        "stream {name} could not be deleted in 1,000 attempts"
    ));
}

/// What a client task needs.
#[derive(Clone)]
struct Context {
    star: Arc<Star>,
    oracle: Arc<Mutex<Oracle>>,
    plan: Plan,
    entropy: Entropy,
    /// The star's clock: wall time may be off (monotonic time and timers are true).
    clock: Clock,
    /// The true clock, for the oracle.
    truth: Clock,
}

impl World {
    fn context(&self, star: &Arc<Star>, clock: Clock, truth: Clock) -> Context {
        Context {
            truth,
            star: star.clone(),
            oracle: self.oracle.clone(),
            plan: self.plan.clone(),
            entropy: Entropy::seeded(self.entropy.next_u64()),
            clock,
        }
    }
}

/// One producer per stream: batches of the plan's shape, up to `window` unanswered.
async fn produce(cx: Context, stream_index: usize, stream: Arc<StreamState>) {
    let mut waiting = JoinSet::new();
    for _ in 0..cx.plan.batches_per_life {
        while waiting.len() >= cx.plan.window {
            waiting.join_next().await;
        }
        let lens = cx.plan.batch(&cx.entropy);
        let (batch, ids) = {
            let mut oracle = cx.oracle.lock();
            let (batch, ids) = oracle.new_batch(stream_index, &lens);
            oracle.submitted(batch, cx.truth.unix_ms());
            (batch, ids)
        };
        let records: Vec<Record> = ids
            .iter()
            .zip(&lens)
            .map(|(&id, &len)| Record {
                timestamp: cx.clock.unix_ms(),
                headers: vec![],
                body: body(id, len),
            })
            .collect();
        let content: u64 = records.iter().map(|r| r.body.len() as u64).sum();
        // With nothing unanswered and a known tail, sometimes say where the batch must land:
        // a retry that meets its own earlier attempt is refused, not duplicated.
        let match_seq_num = {
            let oracle = cx.oracle.lock();
            (waiting.is_empty()
                && oracle.settled(stream_index)
                && cx.entropy.chance(cx.plan.match_seq))
            .then(|| oracle.acked_end(stream_index))
        };
        let charge = encoded_charge(records.len() as u64, 0, content);
        let admitted = cx.star.admission().admit(charge).await;
        // An Express batch's charge moves to the express buffer (checked in `watch_budgets`).
        if stream.meta.class == StorageClass::Standard {
            cx.oracle
                .lock()
                .admitted(batch, charge, cx.star.config().admission_bytes);
        }
        let chunks = encode_chunks(&records, MAX_SECTION_BYTES as usize);
        match cx
            .star
            .submit(stream.clone(), chunks, content, match_seq_num, admitted)
            .await
        {
            Ok(receiver) => {
                if let Some(buffer) = cx
                    .star
                    .express_buffer()
                    .filter(|_| stream.meta.class == StorageClass::Express)
                {
                    cx.oracle
                        .lock()
                        .admitted_express(batch, charge, buffer.budget().capacity());
                }
                // The answer is recorded the moment it arrives, not when the window next
                // needs room: an ack the client holds when the process dies counts as one.
                let oracle = cx.oracle.clone();
                waiting.spawn(async move { take_reply(&oracle, batch, receiver.await) });
            }
            Err(err) => cx.oracle.lock().refused(batch, &err.to_string()),
        }
        let pause = cx.entropy.below(10);
        cx.clock.sleep(Duration::from_millis(pause)).await;
    }
    while waiting.join_next().await.is_some() {}
}

fn take_reply(
    oracle: &Mutex<Oracle>,
    batch: usize,
    reply: Result<nova_chain::AppendReply, tokio::sync::oneshot::error::RecvError>,
) {
    let mut oracle = oracle.lock();
    match reply {
        Ok(Ok(range)) => oracle.acked(batch, range.start, range.end),
        Ok(Err(RequestError::OutcomeUnknown(_))) | Err(_) => oracle.maybe(batch),
        Ok(Err(err)) => oracle.refused(batch, &err.to_string()),
    }
}

/// One consumer per stream, following it from the start.
async fn consume(cx: Context, stream_index: usize, stream: Arc<StreamState>) {
    let mut next = 0;
    loop {
        match cx.star.read(&stream, next, 100, 256 * 1024).await {
            Ok(page) => {
                {
                    let mut oracle = cx.oracle.lock();
                    let mut expect = next;
                    for record in &page.records {
                        if record.seq != expect {
                            oracle.violation(format!(
                            "stream {stream_index}: a read from {next} returned seq {} where {expect} belonged",
                            record.seq
                        ));
                        }
                        let _ = oracle.read(stream_index, record.seq, &record.record.body);
                        expect = record.seq + 1;
                    }
                    oracle.tail(stream_index, page.tail_seq, false, "a read");
                }
                next = page.next_seq;
                if next >= page.tail_seq {
                    cx.clock.sleep(Duration::from_millis(20)).await;
                }
            }
            Err(RequestError::DataLoss(why)) => {
                cx.oracle
                    .lock()
                    .violation(format!("stream {stream_index}: data loss at {next}: {why}"));
                return;
            }
            // A live stream's records are never "not found", and a read is never failed for a
            // fault of the server's own: what a consumer may see is retryable, or the stream
            // gone because it was deleted.
            Err(err @ (RequestError::Internal(_) | RequestError::ObjectNotFound(_))) => {
                cx.oracle.lock().violation(format!(
                    "stream {stream_index}: a read at {next} failed with {err:?}, which a consumer \
                     of a live stream must not be told"
                ));
                return;
            }
            // Retryable, but never because the objects kept vanishing under the read: a read
            // resolves its refs again, and its objects outlive the grace period.
            Err(RequestError::Unavailable(why)) if why.contains("was gone each of") => {
                cx.oracle.lock().violation(format!(
                    "stream {stream_index}: a read at {next} ran out of stale-ref retries: {why}"
                ));
                return;
            }
            Err(_) => cx.clock.sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Samples the trim points of the streams with an age retention: none may pass a record sent
/// less than that age ago by the true clock, whatever the star's wall clock says.
async fn watch_trim_points(cx: Context, streams: Vec<(usize, Arc<StreamState>)>, age: Duration) {
    let mut ticker = cx.clock.interval(Duration::from_millis(100));
    loop {
        ticker.tick().await;
        for (i, stream) in &streams {
            let Ok(first) = cx.star.first_seq(stream).await else {
                continue;
            };
            // The time after the read: a trim it saw happened before then.
            let now = cx.truth.unix_ms();
            cx.oracle
                .lock()
                .check_trim_point(*i, first, now, age.as_millis() as u64);
        }
    }
}

/// Samples the star's budgets: none may hold more than its limit.
async fn watch_budgets(cx: Context) {
    let mut ticker = cx.clock.interval(Duration::from_millis(10));
    loop {
        ticker.tick().await;
        // Let every task woken at this instant run first (see `Oracle::check_charges`).
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        cx.oracle
            .lock()
            .check_charges(cx.star.config().admission_bytes);
        if let Some(buffer) = cx.star.express_buffer() {
            cx.oracle
                .lock()
                .check_express_charges(buffer.budget().capacity());
        }
        let star = &cx.star;
        let checks = [
            (
                "admission buffer",
                star.admission().budget().in_use(),
                star.config().admission_bytes,
            ),
            (
                "tail window cache",
                star.tail_cache().used(),
                star.tail_cache().capacity(),
            ),
        ];
        let express = star.express_buffer().map(|buffer| {
            (
                "express buffer",
                buffer.budget().in_use(),
                buffer.budget().capacity(),
            )
        });
        for (what, used, limit) in checks.into_iter().chain(express) {
            if used > limit {
                cx.oracle
                    .lock()
                    .violation(format!("the {what} holds {used} bytes, over its {limit}"));
            }
        }
    }
}

/// The final check: every stream read from 0 to its tail.
async fn read_back(
    world: &World,
    star: &Star,
    streams: &[(usize, Arc<StreamState>)],
    truth: Clock,
) {
    // Taken before the reads: a record read back had to be kept until now at least.
    let now_ms = truth.unix_ms();
    let mut read_ids = HashSet::new();
    let mut first_seqs = HashMap::new();
    let mut kept: HashMap<usize, u64> = HashMap::new();
    let mut retentions = HashMap::new();
    for (i, stream) in streams.iter().cloned() {
        let tail = stream.tail();
        // Retention may have trimmed the stream's front: what is below its trim point is gone,
        // what is from it on must all be there.
        let mut next = match star.first_seq(&stream).await {
            Ok(first) => first,
            Err(err) => {
                world.violation(format!("the trim point of stream {i}: {err}"));
                return;
            }
        };
        if next > 0 && stream.retention().is_unlimited() {
            world.violation(format!("stream {i} without retention starts at {next}"));
        }
        first_seqs.insert(i, next);
        retentions.insert(i, stream.retention());
        while next < tail {
            let page = match star.read(&stream, next, 1000, 4 << 20).await {
                Ok(page) => page,
                Err(err) => {
                    world.violation(format!("final read of stream {i} at {next}: {err}"));
                    return;
                }
            };
            let mut oracle = world.oracle.lock();
            for record in &page.records {
                if record.seq != next {
                    oracle.violation(format!(
                        "final read of stream {i}: seq {} where {next} belonged",
                        record.seq
                    ));
                    return;
                }
                read_ids.extend(oracle.read(i, record.seq, &record.record.body));
                *kept.entry(i).or_default() += record.record.body.len() as u64 + RECORD_FRAMING;
                next += 1;
            }
            if page.records.is_empty() {
                oracle.violation(format!(
                    "final read of stream {i} at {next} returned nothing"
                ));
                return;
            }
        }
    }
    let mut oracle = world.oracle.lock();
    oracle.settle(&read_ids, &first_seqs);
    oracle.check_retention(
        &read_ids,
        now_ms,
        &|i| retentions.get(&i).and_then(|r: &Retention| r.age_ms),
        &|i| retentions.get(&i).and_then(|r: &Retention| r.bytes),
        &kept,
    );
}

/// The most a record's framing in a section takes beside its body (its length, timestamp,
/// headers count and checksum), so that bytes read back bound the bytes a retention kept.
const RECORD_FRAMING: u64 = 64;
