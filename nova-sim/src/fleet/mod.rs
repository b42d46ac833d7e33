//! A fleet seed: two to five real stars (the chain, and the fleet library that places,
//! redirects, hands off and takes over) on one simulated store and one simulated etcd, with
//! producers and consumers that route as the SDK does, while the seed kills, pauses and cuts
//! stars off, saturates them, restarts them one by one, adds and drains them, and creates and
//! deletes streams. Then every fault ends and the run checks:
//!
//! - no two acknowledgements ever claimed one sequence number of a stream for different
//!   records (each is recorded with the star, incarnation and epoch that gave it);
//! - every acknowledged record reads back exactly once, at its sequence number, through any
//!   star; a refused batch never appears; a batch appears whole or not at all;
//! - a stream's tail as its leader reports it never goes back;
//! - every star that was started again came up (none waits for ever);
//! - every departed star's chain is settled, and every stream takes appends again, within
//!   `LIVENESS_BOUND` of the last fault (liveness, while a healthy star exists).
//!
//! Everything runs on one current-thread runtime with its clock paused, so all the stars share
//! simulated time and the seed replays exactly.

mod checks;
pub mod client;
mod events;
pub mod link;
pub mod node;
pub mod plan;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::task::JoinSet;

use nova_core::clock::{Clock, ClockSkew};
use nova_core::entropy::Entropy;

use crate::metastore::SimMetastore;
use crate::oracle::Oracle;
use crate::run::Failure;
use crate::store::SimStore;
use node::Node;
use plan::{FleetPlan, MAX_STARS};

/// Once every fault has ended, how long the fleet may take to settle every departed star's
/// chain and lead every stream again: a lease lapsing (one ttl), a survivor noticing (a third
/// of one), settling the chain, and the stream placed on the next request, with room for
/// recoveries that retry. In lease ttls.
pub const LIVENESS_TTLS: u32 = 12;
/// ... plus this, for stars still recovering when the faults end.
pub const LIVENESS_SLACK: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub starts: u64,
    pub kills: u64,
    pub pauses: u64,
    pub cuts: u64,
    pub leaves: u64,
    pub lease_exits: u64,
    pub saturations: u64,
    pub rolling_restarts: u64,
    pub creates: u64,
    pub deletes: u64,
}

impl Counters {
    pub fn add(&mut self, other: &Counters) {
        self.starts += other.starts;
        self.kills += other.kills;
        self.pauses += other.pauses;
        self.cuts += other.cuts;
        self.leaves += other.leaves;
        self.lease_exits += other.lease_exits;
        self.saturations += other.saturations;
        self.rolling_restarts += other.rolling_restarts;
        self.creates += other.creates;
        self.deletes += other.deletes;
    }
}

#[derive(Debug, Clone)]
pub struct FleetReport {
    pub seed: u64,
    pub stars: usize,
    pub acked_batches: usize,
    pub refused_batches: usize,
    pub unknown_batches: usize,
    pub acked_records: u64,
    pub counters: Counters,
    pub handoffs: u64,
    pub takeovers: u64,
    pub simulated: Duration,
    pub digest: u64,
}

/// A star id's place in the seed's list.
pub fn plan_index(id: &str) -> Option<usize> {
    id.strip_prefix("star-")?
        .parse()
        .ok()
        .filter(|&i| i < MAX_STARS)
}

#[derive(Default)]
pub struct Slot {
    pub node: Option<Arc<Node>>,
    pub incarnations: u32,
    /// Started again whenever it exits (false once it left for good).
    pub wanted: bool,
}

pub struct World {
    pub seed: u64,
    pub plan: FleetPlan,
    pub entropy: Entropy,
    /// The true time: the store's, the metastore's, and every star's monotonic clock.
    pub clock: Clock,
    /// How far each star's wall clock is off (see `star_clock`).
    skews: Vec<&'static ClockSkew>,
    pub store: SimStore,
    pub metastore: SimMetastore,
    pub oracle: Arc<Mutex<Oracle>>,
    pub slots: Mutex<Vec<Slot>>,
    /// Streams in use; the next index to give out; the deleted.
    streams: Mutex<(Vec<usize>, usize, HashSet<usize>)>,
    counters: Mutex<Counters>,
    /// Handoffs and takeovers counted by incarnations that are gone.
    fleet_counts: Mutex<(u64, u64, u64)>,
    /// Where each live stream's producer and consumer run.
    clients: Mutex<JoinSet<()>>,
}

impl World {
    pub fn violation(&self, message: String) {
        self.oracle.lock().violation(message);
    }

    /// Star `index`'s clock: the true one, with a wall clock of its own that the seed steps.
    pub fn star_clock(&self, index: usize) -> Clock {
        self.clock.skewed(self.skews[index])
    }

    /// Steps star `index`'s wall clock to `error_ms` off.
    pub fn step_clock(&self, index: usize, error_ms: i64) {
        self.skews[index].set_ms(error_ms);
    }

    pub fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.counters.lock());
    }

    /// The current incarnation of star `index`, unless it is dead.
    pub fn node(&self, index: usize) -> Option<Arc<Node>> {
        self.slots
            .lock()
            .get(index)?
            .node
            .clone()
            .filter(|node| !node.is_dead())
    }

    /// Every incarnation alive now.
    pub fn running(&self) -> Vec<Arc<Node>> {
        self.slots
            .lock()
            .iter()
            .filter_map(|slot| slot.node.clone())
            .filter(|node| !node.is_dead())
            .collect()
    }

    pub fn is_deleted(&self, stream: usize) -> bool {
        self.streams.lock().2.contains(&stream)
    }

    /// Starts star `node.index` again if `node` is still its current incarnation and the star
    /// is wanted.
    pub fn restart_if_current(self: &Arc<Self>, node: &Node) {
        let again = {
            let slots = self.slots.lock();
            let slot = &slots[node.index];
            slot.wanted
                && slot
                    .node
                    .as_ref()
                    .is_some_and(|n| n.incarnation == node.incarnation)
        };
        if again {
            self.retire(node);
            node::start(self, node.index);
        }
    }

    /// Counts what a finished incarnation's fleet did.
    fn retire(&self, node: &Node) {
        if let Some(up) = node.up() {
            let metrics = up.fleet.metrics();
            let mut counts = self.fleet_counts.lock();
            counts.0 += metrics.handoffs("saturated") + metrics.handoffs("leaving");
            counts.1 += metrics.takeovers();
            counts.2 += up.star.metrics().deposed_streams.get();
        }
    }

    /// Starts a producer and a consumer on stream `index`.
    fn serve_stream(self: &Arc<Self>, index: usize) {
        let mut clients = self.clients.lock();
        clients.spawn(client::produce(self.clone(), index));
        clients.spawn(client::consume(self.clone(), index));
    }
}

pub fn run_fleet_seed(seed: u64) -> Result<FleetReport, Failure> {
    let entropy = Entropy::seeded(seed);
    let mut plan = FleetPlan::draw(&entropy);
    plan.draw_clock_steps(&Entropy::seeded(seed ^ 0x0c10_c57e_9000));
    tracing::info!(?plan, "fleet seed {seed}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let clock = runtime.block_on(async {
        Clock::simulated(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
    });
    let store = SimStore::new(plan.store.clone(), Entropy::seeded(entropy.next_u64()));
    let metastore =
        SimMetastore::shared(plan.metastore.clone(), Entropy::seeded(entropy.next_u64()));
    store.attach(clock);
    metastore.attach(clock);
    let world = Arc::new(World {
        seed,
        entropy,
        clock,
        // One per star id for the whole run (a star's clock outlives its incarnations).
        skews: (0..MAX_STARS)
            .map(|_| &*Box::leak(Box::default()))
            .collect(),
        store,
        metastore,
        oracle: Arc::default(),
        slots: Mutex::new((0..MAX_STARS).map(|_| Slot::default()).collect()),
        streams: Mutex::new(((0..plan.streams).collect(), plan.streams, HashSet::new())),
        counters: Mutex::default(),
        fleet_counts: Mutex::default(),
        clients: Mutex::new(JoinSet::new()),
        plan,
    });
    let started = runtime.block_on(async { clock.now() });
    runtime.block_on(run(&world));
    let simulated = runtime.block_on(async { clock.since(started) });
    let report = {
        for slot in world.slots.lock().iter() {
            if let Some(node) = &slot.node {
                world.retire(node);
            }
        }
        let deposed = world.fleet_counts.lock().2;
        if deposed > 0 {
            // Detected and contained, but a second writer should never exist at all.
            world.violation(format!(
                "{deposed} streams were deposed: a star found another leading a stream it held \
                 records of"
            ));
        }
        let oracle = world.oracle.lock();
        if !oracle.violations.is_empty() {
            return Err(Failure {
                seed,
                violations: oracle.violations.clone(),
                fleet: true,
            });
        }
        let (acked_batches, refused_batches, unknown_batches) = oracle.counts();
        let (handoffs, takeovers, _) = *world.fleet_counts.lock();
        FleetReport {
            seed,
            stars: world.plan.stars,
            acked_batches,
            refused_batches,
            unknown_batches,
            acked_records: oracle.acked_records(),
            counters: world.counters.lock().clone(),
            handoffs,
            takeovers,
            simulated,
            digest: oracle.digest(),
        }
    };
    // Every task still alive (killed stars' hung calls among them) goes with the runtime.
    drop(runtime);
    Ok(report)
}

async fn run(world: &Arc<World>) {
    for index in 0..world.plan.stars {
        world.slots.lock()[index].wanted = true;
        node::start(world, index);
    }
    let streams = world.streams.lock().0.clone();
    for index in streams {
        if !client::create(world, index, Duration::from_secs(120)).await {
            world.violation(format!("stream s{index} could not be created at the start"));
            return;
        }
        world.serve_stream(index);
    }
    let mut events = JoinSet::new();
    for (at, event) in world.plan.events.clone() {
        let world = world.clone();
        events.spawn(async move {
            world.clock.sleep(at).await;
            tracing::info!(?event, "event");
            events::apply(&world, event).await;
            tracing::info!(?event, "event ended");
        });
    }
    for (at, star, error) in world.plan.clock_steps.clone() {
        let world = world.clone();
        events.spawn(async move {
            world.clock.sleep(at).await;
            tracing::info!(star, error_ms = error, "a star's wall clock steps");
            world.step_clock(star, error);
        });
    }
    world.clock.sleep(world.plan.run_for).await;
    // Events still running (a pause, a drain, a rolling restart) run to their end: cut off half
    // way, they would leave a star draining for ever.
    let finished = async { while events.join_next().await.is_some() {} };
    if world
        .clock
        .timeout(node::RESTART_LIMIT, finished)
        .await
        .is_err()
    {
        world.violation(format!(
            "the seed's events were still running {:?} after the run ended",
            node::RESTART_LIMIT
        ));
        return;
    }
    checks::end_faults(world).await;
}
