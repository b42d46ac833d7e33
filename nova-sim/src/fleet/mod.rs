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

pub mod client;
pub mod link;
pub mod node;
pub mod plan;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::task::JoinSet;

use nova_core::clock::Clock;
use nova_core::entropy::Entropy;

use crate::metastore::{MetastoreFaults, SimMetastore};
use crate::oracle::Oracle;
use crate::run::Failure;
use crate::store::{SimStore, StoreFaults};
use client::{Outcome, Router};
use node::Node;
use plan::{Event, FleetPlan, MAX_STARS, star_id};

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
    pub clock: Clock,
    pub store: SimStore,
    pub metastore: SimMetastore,
    pub oracle: Arc<Mutex<Oracle>>,
    pub slots: Mutex<Vec<Slot>>,
    /// Streams in use; the next index to give out; the deleted.
    streams: Mutex<(Vec<usize>, usize, HashSet<usize>)>,
    counters: Mutex<Counters>,
    /// Handoffs and takeovers counted by incarnations that are gone.
    fleet_counts: Mutex<(u64, u64)>,
    /// Where each live stream's producer and consumer run.
    clients: Mutex<JoinSet<()>>,
}

impl World {
    pub fn violation(&self, message: String) {
        self.oracle.lock().violation(message);
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
    let plan = FleetPlan::draw(&entropy);
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
        let oracle = world.oracle.lock();
        if !oracle.violations.is_empty() {
            return Err(Failure {
                seed,
                violations: oracle.violations.clone(),
                fleet: true,
            });
        }
        let (acked_batches, refused_batches, unknown_batches) = oracle.counts();
        let (handoffs, takeovers) = *world.fleet_counts.lock();
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
            apply(&world, event).await;
            tracing::info!(?event, "event ended");
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
    end_faults(world).await;
}

async fn apply(world: &Arc<World>, event: Event) {
    let clock = world.clock;
    match event {
        Event::Kill { star, down } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.kills += 1);
            node.kill();
            clock.sleep(down).await;
            world.restart_if_current(&node);
        }
        Event::Pause { star, lasting } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.pauses += 1);
            node.pause();
            clock.sleep(lasting).await;
            node.resume();
        }
        Event::CutMetastore {
            star,
            lasting,
            silent,
        } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.cuts += 1);
            let state = if silent {
                link::LinkState::Silent
            } else {
                link::LinkState::Cut
            };
            cut(&node.meta, state, lasting, clock).await;
        }
        Event::CutStore { star, lasting } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.cuts += 1);
            cut(&node.store, link::LinkState::Cut, lasting, clock).await;
        }
        Event::CutClients { star, lasting } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.cuts += 1);
            cut(&node.clients, link::LinkState::Cut, lasting, clock).await;
        }
        Event::Saturate { star, lasting } => {
            let Some(up) = world.node(star).and_then(|n| n.up()) else {
                return;
            };
            world.count(|c| c.saturations += 1);
            up.fleet.set_saturated(true);
            clock.sleep(lasting).await;
            up.fleet.set_saturated(false);
        }
        Event::Leave {
            star,
            down,
            returns,
        } => {
            let Some(node) = world.node(star) else { return };
            // The last star of the fleet always comes back: a fleet of none leads nothing.
            let others = (0..MAX_STARS)
                .filter(|&i| i != star && world.slots.lock()[i].wanted)
                .count();
            if !returns && others > 0 {
                world.slots.lock()[star].wanted = false;
            }
            node::leave(world, &node).await;
            clock.sleep(down).await;
            world.restart_if_current(&node);
        }
        Event::Join { star } => {
            if world.slots.lock()[star].wanted {
                return;
            }
            world.slots.lock()[star].wanted = true;
            node::start(world, star);
        }
        Event::RollingRestart => {
            world.count(|c| c.rolling_restarts += 1);
            for index in 0..MAX_STARS {
                let Some(node) = world.node(index) else {
                    continue;
                };
                node::leave(world, &node).await;
                world.restart_if_current(&node);
                // The next star once this one is up again, or once whatever else happened to
                // it (another event may have killed the new incarnation) has happened.
                let started = clock.now();
                while let Some(next) = world.node(index) {
                    if next.up().is_some() || clock.since(started) > node::RESTART_LIMIT {
                        break;
                    }
                    clock.sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Event::StallMetastore { lasting } => {
            world.metastore.stall(lasting);
        }
        Event::CreateStream => {
            let index = {
                let mut streams = world.streams.lock();
                let index = streams.1;
                streams.1 += 1;
                index
            };
            if client::create(world, index, Duration::from_secs(30)).await {
                world.count(|c| c.creates += 1);
                world.streams.lock().0.push(index);
                world.serve_stream(index);
            }
        }
        Event::DeleteStream => {
            let victim = {
                let mut streams = world.streams.lock();
                if streams.0.len() <= 1 {
                    return;
                }
                let at = world.entropy.below(streams.0.len() as u64) as usize;
                let victim = streams.0.remove(at);
                streams.2.insert(victim);
                victim
            };
            // From here its records may vanish, whether or not the delete lands.
            world.oracle.lock().delete_stream(victim);
            if client::delete(world, victim, Duration::from_secs(60)).await {
                world.count(|c| c.deletes += 1);
            }
        }
    }
}

/// Cuts `link` for `lasting`, then restores it if nothing else changed it meanwhile.
async fn cut(link: &link::Link, state: link::LinkState, lasting: Duration, clock: Clock) {
    if link.state() != link::LinkState::Up {
        return;
    }
    link.set(state);
    clock.sleep(lasting).await;
    if link.state() == state {
        link.set(link::LinkState::Up);
    }
}

/// Ends every fault, then checks that the fleet converges and that every acknowledged record
/// is there.
async fn end_faults(world: &Arc<World>) {
    let clock = world.clock;
    // The clients stop; whatever they were waiting for may or may not land.
    world.clients.lock().abort_all();
    loop {
        let next = world.clients.lock().try_join_next();
        match next {
            Some(_) => continue,
            None if world.clients.lock().is_empty() => break,
            None => clock.sleep(Duration::from_millis(10)).await,
        }
    }
    world.oracle.lock().process_ended();
    world.store.set_faults(StoreFaults::none());
    world.metastore.set_faults(MetastoreFaults::none());
    for slot in world.slots.lock().iter() {
        if let Some(node) = &slot.node {
            node.resume();
            for link in [&node.meta, &node.store, &node.clients] {
                if matches!(link.state(), link::LinkState::Cut | link::LinkState::Silent) {
                    link.set(link::LinkState::Up);
                }
            }
            if let Some(up) = node.up() {
                up.fleet.set_saturated(false);
            }
        }
    }
    // Stars that are down and wanted start again now (a kill's restart may be pending).
    for index in 0..MAX_STARS {
        let wanted = world.slots.lock()[index].wanted;
        if wanted && world.node(index).is_none() {
            node::start(world, index);
        }
    }
    let bound = world.plan.lease_ttl * LIVENESS_TTLS + LIVENESS_SLACK;
    let ended = clock.now();
    let streams = world.streams.lock().0.clone();
    // Liveness: every stream takes an append again.
    let router = Router::new(world.clone());
    for &index in &streams {
        loop {
            if probe(world, &router, index).await {
                break;
            }
            if clock.since(ended) > bound {
                world.violation(format!(
                    "stream s{index} took no append for {bound:?} after the last fault, with \
                     {} stars running: a stream left without a leader",
                    world.running().len()
                ));
                return;
            }
            clock.sleep(Duration::from_millis(200)).await;
        }
    }
    // Every departed star's chain settled: no chain registered for a star that is not running.
    loop {
        let pending = departed_chains(world);
        if pending.is_empty() {
            break;
        }
        if clock.since(ended) > bound {
            world.violation(format!(
                "departed stars' chains still unsettled {bound:?} after the last fault: {pending:?}"
            ));
            return;
        }
        clock.sleep(Duration::from_millis(200)).await;
    }
    read_back(world, &streams).await;
}

/// Chains registered (`fleet/chains/…`) or being taken over for stars not running now.
fn departed_chains(world: &World) -> Vec<String> {
    let running: HashSet<String> = world
        .running()
        .iter()
        .filter(|n| n.up().is_some())
        .map(|n| n.id.clone())
        .collect();
    world
        .metastore
        .snapshot()
        .keys()
        .filter_map(|key| {
            let key = String::from_utf8_lossy(key);
            let id = key
                .strip_prefix("fleet/chains/")
                .or_else(|| key.strip_prefix("fleet/takeover/"))?;
            (!running.contains(id)).then(|| key.into_owned())
        })
        .collect()
}

/// One append of a record of its own to stream `index`: true once acknowledged.
async fn probe(world: &Arc<World>, router: &Router, index: usize) -> bool {
    let (batch, ids) = world.oracle.lock().new_batch(index, &[16]);
    let records = vec![nova_core::record::Record {
        timestamp: world.clock.unix_ms(),
        headers: vec![],
        body: crate::oracle::body(ids[0], 16),
    }];
    let name = format!("s{index}");
    let outcome = router
        .on_leader(&name, |node, up, state| {
            let records = records.clone();
            async move {
                let charge = nova_chain::admission::encoded_charge(1, 0, 16);
                let admitted = up.star.admission().admit(charge).await;
                let chunks = nova_core::flight::section::encode_chunks(
                    &records,
                    nova_core::limits::MAX_SECTION_BYTES as usize,
                );
                match up.star.submit(state, chunks, 16, None, admitted).await {
                    Ok(receiver) => match receiver.await {
                        Ok(Ok(range)) => Outcome::Done((range.start, range.end, node.id.clone())),
                        Ok(Err(nova_proto::RequestError::OutcomeUnknown(why))) => {
                            Outcome::Unknown(why)
                        }
                        Ok(Err(error)) => Outcome::Refused(error.to_string()),
                        Err(_) => Outcome::Unknown("dropped".into()),
                    },
                    Err(error) => Outcome::Refused(error.to_string()),
                }
            }
        })
        .await;
    let mut oracle = world.oracle.lock();
    match outcome {
        Outcome::Done((start, end, star)) => {
            oracle.acked_by(
                batch,
                start,
                end,
                &format!("a liveness probe's ack from {star}"),
            );
            true
        }
        Outcome::Refused(why) => {
            oracle.refused(batch, &why);
            false
        }
        Outcome::Unknown(_) => {
            oracle.maybe(batch);
            false
        }
    }
}

/// The final check: every stream read from 0 to its tail, entering the fleet at a random star.
async fn read_back(world: &Arc<World>, streams: &[usize]) {
    let router = Router::new(world.clone());
    let mut read_ids = HashSet::new();
    let mut first_seqs = std::collections::HashMap::new();
    for &index in streams {
        let name = format!("s{index}");
        first_seqs.insert(index, 0);
        let mut next = 0;
        let mut attempts = 0;
        loop {
            match client::read(&router, &name, next, 1000).await {
                Outcome::Done(Ok((records, page_next, tail))) => {
                    let mut oracle = world.oracle.lock();
                    for (seq, body) in &records {
                        if *seq != next {
                            oracle.violation(format!(
                                "final read of s{index}: seq {seq} where {next} belonged"
                            ));
                            return;
                        }
                        read_ids.extend(oracle.read(index, *seq, body));
                        next += 1;
                    }
                    oracle.tail(index, tail, true, "the final read");
                    if page_next >= tail {
                        break;
                    }
                    if records.is_empty() {
                        oracle.violation(format!(
                            "final read of s{index} at {next} returned nothing"
                        ));
                        return;
                    }
                }
                Outcome::Done(Err(error)) => {
                    world.violation(format!("final read of s{index} at {next}: {error}"));
                    return;
                }
                Outcome::Refused(why) | Outcome::Unknown(why) => {
                    attempts += 1;
                    if attempts > 100 {
                        world.violation(format!("final read of s{index} at {next}: {why}"));
                        return;
                    }
                    world.clock.sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    world.oracle.lock().settle(&read_ids, &first_seqs);
    check_chains(world);
}

/// Nothing acknowledged past a slot that never landed, in any star's chain.
fn check_chains(world: &World) {
    let objects = world.store.snapshot();
    let mut oracle = world.oracle.lock();
    for index in 0..MAX_STARS {
        crate::run::check_chain_of(&star_id(index), &objects, &mut oracle, &|_| false);
    }
    let _ = BTreeMap::<u8, u8>::new();
}

/// The one-line command that replays a fleet seed exactly, with the stars' logs.
pub fn replay_command(seed: u64) -> String {
    format!("cargo run -p nova-sim -- --fleet --seed {seed} --verbose")
}
