//! One star of the simulated fleet, incarnation by incarnation: started (joining the fleet,
//! recovering its chain), killed, paused, cut off, drained and restarted, as a supervisor and
//! the seed decide.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nova_chain::Star;
use nova_chain::metrics::Metrics;
use nova_core::entropy::Entropy;
use nova_core::metastore::Metastore;
use nova_core::object_store::ObjectStore;
use nova_core::supervisor::Supervisor;
use nova_fleet::{Fleet, FleetConfig, FleetMetrics, JoinError, TakeoverContext};

use super::World;
use super::link::{GatedMetastore, GatedStore, Link, LinkState, Observed};
use super::plan::star_id;

/// How long a start (joining the fleet, then recovery) may take before the run counts the
/// star as one that cannot restart.
pub const RESTART_LIMIT: Duration = Duration::from_secs(600);

/// How long a call waits on a link that drops its packets: the etcd client's and the S3
/// client's request timeouts.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A running star: what its clients reach.
#[derive(Clone)]
pub struct Up {
    pub star: Arc<Star>,
    pub fleet: Arc<Fleet>,
    /// Watches the fleet's loops (renewal, view, takeovers, balancing), as novad's does.
    pub supervisor: Supervisor,
}

/// One incarnation of one star.
pub struct Node {
    pub index: usize,
    pub id: String,
    pub incarnation: u32,
    pub meta: Link,
    pub store: Link,
    pub clients: Link,
    up: Observed<Option<Up>>,
    /// SIGTERM received: new calls are refused while it drains.
    pub stopping: AtomicBool,
}

impl Node {
    pub fn up(&self) -> Option<Up> {
        self.up.get()
    }

    pub fn is_dead(&self) -> bool {
        self.clients.state() == LinkState::Dead
    }

    fn links(&self) -> [&Link; 3] {
        [&self.meta, &self.store, &self.clients]
    }

    /// kill -9: nothing of this incarnation is heard of again.
    pub fn kill(&self) {
        for link in self.links() {
            link.set(LinkState::Dead);
        }
    }

    pub fn pause(&self) {
        for link in self.links() {
            link.set(LinkState::Paused);
        }
    }

    pub fn resume(&self) {
        for link in self.links() {
            if link.state() == LinkState::Paused {
                link.set(LinkState::Up);
            }
        }
    }

    /// Waits while the process is stopped (SIGSTOP): its own code does not run meanwhile.
    async fn running(&self) {
        let link = &self.clients;
        while link.state() == LinkState::Paused {
            let _ = link.reach().await;
        }
    }
}

/// Starts a new incarnation of star `index` and supervises it: it joins, recovers, serves, and
/// when its lease is lost it stops acknowledging, exits, and is started again.
pub fn start(world: &Arc<World>, index: usize) -> Arc<Node> {
    let clock = world.clock;
    let incarnation = {
        let mut slots = world.slots.lock();
        slots[index].incarnations += 1;
        slots[index].incarnations
    };
    let node = Arc::new(Node {
        index,
        id: star_id(index),
        incarnation,
        meta: Link::new(clock, REQUEST_TIMEOUT),
        store: Link::new(clock, REQUEST_TIMEOUT),
        clients: Link::new(clock, REQUEST_TIMEOUT),
        up: Observed::new(None),
        stopping: AtomicBool::new(false),
    });
    world.slots.lock()[index].node = Some(node.clone());
    tokio::spawn(boot(world.clone(), node.clone()));
    node
}

async fn boot(world: Arc<World>, node: Arc<Node>) {
    let clock = world.clock;
    let started = clock.now();
    let booted = clock
        .timeout(RESTART_LIMIT, join_and_open(&world, &node))
        .await;
    let up = match booted {
        Ok(Started::Up(up)) => up,
        // Killed while starting: its successor, if any, is somebody else's business.
        Ok(Started::Killed) => return,
        // It lost its lease while recovering, and a survivor took its chain over: novad exits
        // with the error and its supervisor starts it again.
        Ok(Started::Exited) => {
            node.kill();
            clock.sleep(Duration::from_secs(1)).await;
            world.restart_if_current(&node);
            return;
        }
        Err(_) => {
            if !node.is_dead() {
                world.violation(format!(
                    "{} (incarnation {}) was still starting after {RESTART_LIMIT:?}: a star \
                     that cannot restart",
                    node.id, node.incarnation
                ));
            }
            return;
        }
    };
    world.count(|c| c.starts += 1);
    tracing::info!(
        star = %node.id,
        incarnation = node.incarnation,
        took_ms = clock.since(started).as_millis() as u64,
        epoch = up.star.epoch(),
        "star up"
    );
    node.up.update(|now| {
        *now = Some(up.clone());
        true
    });
    // What novad's main loop does: a lost lease fences the star (it must acknowledge nothing
    // more), and the process exits for its supervisor to start it again.
    let why = tokio::select! {
        biased;
        reason = up.fleet.lost() => reason,
        // Fenced (its chain taken over while it was cut off or paused) or a chain task died:
        // novad exits either way. Only the second is a defect.
        reason = up.star.failed() => {
            if !node.is_dead()
            && !node.stopping.load(Ordering::Acquire)
            && up.star.fenced().is_none()
            {
                world.violation(format!("{}: a chain task died: {reason}", node.id));
            }
            reason
        }
        // A fleet loop that ends before the lease is lost leaves the star in a fleet it no
        // longer renews, watches or balances: novad exits then, and here it is a defect.
        reason = up.supervisor.failed() => {
            if !node.is_dead() && !node.stopping.load(Ordering::Acquire) && !up.fleet.is_lost() {
                world.violation(format!("{}: a fleet task died: {reason}", node.id));
            }
            reason
        }
    };
    node.running().await;
    // A star that was killed says nothing more; one that drains (SIGTERM) gave its lease up on
    // purpose and exits as `leave` says.
    if node.is_dead() || node.stopping.load(Ordering::Acquire) {
        return;
    }
    up.star.fence(why.clone());
    tracing::info!(star = %node.id, "exiting: {why}");
    let _ = up.star.shutdown(Duration::from_secs(1)).await;
    up.fleet.leave(false).await;
    node.kill();
    world.count(|c| c.lease_exits += 1);
    // The supervisor starts it again after a second.
    clock.sleep(Duration::from_secs(1)).await;
    world.restart_if_current(&node);
}

/// How a start ended.
enum Started {
    Up(Up),
    Killed,
    /// Exited with an error that a restart clears.
    Exited,
}

/// Joins the fleet (as a supervisor would, trying again after a failed start) and opens the
/// star.
async fn join_and_open(world: &Arc<World>, node: &Arc<Node>) -> Started {
    let clock = world.star_clock(node.index);
    let metastore: Arc<dyn Metastore> = Arc::new(GatedMetastore {
        metastore: world.metastore.clone(),
        link: node.meta.clone(),
    });
    let store: Arc<dyn ObjectStore> = Arc::new(GatedStore {
        store: world.store.clone(),
        link: node.store.clone(),
    });
    let config = FleetConfig {
        star_id: node.id.clone(),
        advertise: format!("sim://{}", node.id),
        kafka_advertise: String::new(),
        lease_ttl: world.plan.lease_ttl,
        supervisor: Supervisor::new(),
    };
    let fleet = loop {
        if node.is_dead() {
            return Started::Killed;
        }
        let metrics = FleetMetrics::new(&prometheus::Registry::new()).expect("fresh registry");
        match Fleet::join(metastore.clone(), config.clone(), metrics, clock).await {
            Ok(fleet) => break fleet,
            // A second live star with this id is a real refusal, never expected here.
            Err(err @ JoinError::DuplicateId { .. }) => {
                world.violation(format!("{}: {err}", node.id));
                return Started::Killed;
            }
            Err(err) => {
                tracing::info!(star = %node.id, "joining the fleet failed; starting again: {err}");
                clock.sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let mut chain =
        world
            .plan
            .chain_config(&node.id, clock, Entropy::seeded(world.entropy.next_u64()));
    chain.leaders = Some(Arc::new(nova_fleet::LeaderRecords::new(metastore.clone())));
    let backoff = chain.backoff();
    let star = match Star::open(chain, store.clone(), metastore, Arc::new(Metrics::new())).await {
        Ok(star) => Arc::new(star),
        Err(err) => {
            if node.is_dead() {
                return Started::Killed;
            }
            // Recovery meets another owner of the chain only if this star's lease lapsed and a
            // survivor took the chain over meanwhile; anything else is a star that cannot
            // start.
            if fleet.is_lost() {
                tracing::info!(star = %node.id, "lost its lease while recovering: {err}");
                fleet.leave(false).await;
                return Started::Exited;
            }
            world.violation(format!(
                "{} (incarnation {}) could not start: {err}",
                node.id, node.incarnation
            ));
            return Started::Killed;
        }
    };
    fleet.ready().await;
    fleet.start_takeovers(TakeoverContext {
        star: star.clone(),
        store,
        backoff,
        max_streams: world.plan.chain.max_streams,
        adoptions: None,
    });
    fleet.start_balancing(star.clone());
    Started::Up(Up {
        star,
        fleet,
        supervisor: config.supervisor,
    })
}

/// SIGTERM: refuse new calls, drain what was admitted, hand the streams off and leave. A kill
/// meanwhile ends it where it is.
pub async fn leave(world: &World, node: &Node) {
    tokio::select! {
        biased;
        _ = drain_and_leave(world, node) => {}
        _ = node.clients.dead() => {}
    }
}

async fn drain_and_leave(world: &World, node: &Node) {
    if node.stopping.swap(true, Ordering::AcqRel) {
        // A second SIGTERM: the first one's drain goes on; wait for the process to end.
        while !node.is_dead() {
            world.clock.sleep(Duration::from_millis(100)).await;
        }
        return;
    }
    let Some(up) = node.up() else {
        node.kill();
        return;
    };
    tracing::info!(star = %node.id, "draining");
    up.fleet.set_draining().await;
    let drained = up.star.shutdown(Duration::from_secs(5)).await;
    tracing::info!(star = %node.id, ?drained, "drained; leaving");
    up.fleet
        .leave(drained.is_ok() && up.star.fenced().is_none())
        .await;
    tracing::info!(star = %node.id, "left");
    node.kill();
    world.count(|c| c.leaves += 1);
}
