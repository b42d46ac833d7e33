//! Issue 28's defects found by reading the fleet code, each shown on a small fleet on the
//! simulated store and etcd (simulated time, so a lease of seconds costs nothing): a busy
//! star's renewals, a recovering star's placements, `--max-streams` and deletes across stars,
//! and when a lease can be trusted. The split brain after an unclear handoff and the stuck
//! takeover election are found by seeds (`fleet_seeds.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;

use nova_chain::metrics::Metrics;
use nova_chain::{ChainConfig, RetryPolicy, Star};
use nova_core::catalog::{Retention, StorageClass};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::metastore::{Capabilities, KeyValue, Metastore, MetastoreError, Txn, TxnOutcome};
use nova_fleet::{Fleet, FleetConfig, FleetMetrics};
use nova_sim::metastore::{MetastoreFaults, SimMetastore};
use nova_sim::store::{SimStore, StoreFaults};

const TTL: Duration = Duration::from_secs(3);

fn clock() -> Clock {
    Clock::simulated(UNIX_EPOCH + Duration::from_secs(1_800_000_000))
}

struct World {
    clock: Clock,
    store: SimStore,
    etcd: SimMetastore,
}

impl World {
    fn new() -> Self {
        let clock = clock();
        let store = SimStore::new(StoreFaults::none(), Entropy::seeded(1));
        let etcd = SimMetastore::shared(MetastoreFaults::none(), Entropy::seeded(2));
        store.attach(clock);
        etcd.attach(clock);
        Self { clock, store, etcd }
    }

    async fn join(&self, id: &str, metastore: Arc<dyn Metastore>) -> Arc<Fleet> {
        let config = FleetConfig {
            star_id: id.into(),
            advertise: format!("sim://{id}"),
            kafka_advertise: String::new(),
            lease_ttl: TTL,
            supervisor: nova_core::supervisor::Supervisor::new(),
        };
        let metrics = FleetMetrics::new(&prometheus::Registry::new()).unwrap();
        Fleet::join(metastore, config, metrics, self.clock)
            .await
            .unwrap()
    }

    /// A star `id` that serves: joined, recovered, ready.
    async fn star(&self, id: &str, max_streams: usize) -> (Arc<Fleet>, Arc<Star>) {
        let fleet = self.join(id, Arc::new(self.etcd.clone())).await;
        let config = ChainConfig {
            star: id.into(),
            max_streams,
            retry: RetryPolicy {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(100),
            },
            clock: self.clock,
            entropy: Entropy::seeded(3),
            metrics_top_streams: 0,
            ..ChainConfig::default()
        };
        let star = Star::open(
            config,
            Arc::new(self.store.clone()),
            Arc::new(self.etcd.clone()),
            Arc::new(Metrics::new()),
        )
        .await
        .unwrap();
        fleet.ready().await;
        (fleet, Arc::new(star))
    }
}

fn run<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(test());
}

/// etcd as a star sees it when the metastore's call slots are all taken by its own absorber
/// and redirects: every call but the lease's waits (lease calls bypass the slots).
#[derive(Debug)]
struct Jammed {
    inner: SimMetastore,
    jammed: Arc<AtomicBool>,
}

impl Jammed {
    async fn turn(&self) {
        while self.jammed.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[async_trait]
impl Metastore for Jammed {
    fn describe(&self) -> String {
        "jammed".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        self.turn().await;
        self.inner.get(key).await
    }
    async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        self.turn().await;
        self.inner.scan(prefix, after, limit).await
    }
    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        self.turn().await;
        self.inner.commit(txn).await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<u64, MetastoreError> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: u64) -> Result<Option<Duration>, MetastoreError> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: u64) -> Result<(), MetastoreError> {
        self.inner.revoke_lease(lease).await
    }
}

/// Defect 3: renewals ran in the loop that also publishes the load and refreshes the view,
/// which wait for the metastore's call slots. A star whose slots were all taken missed its
/// renewals and gave up a healthy lease.
#[test]
fn a_busy_star_keeps_its_lease() {
    run(|| async {
        let world = World::new();
        let jammed = Arc::new(AtomicBool::new(false));
        let fleet = world
            .join(
                "busy",
                Arc::new(Jammed {
                    inner: world.etcd.clone(),
                    jammed: jammed.clone(),
                }),
            )
            .await;
        jammed.store(true, Ordering::Release);
        world.clock.sleep(TTL * 10).await;
        assert!(
            !fleet.is_lost(),
            "a star whose renewals reach etcd lost its lease while its other calls queued"
        );
        jammed.store(false, Ordering::Release);
    });
}

/// Defect 4: a star registers before it recovers its chain, and, leading nothing, looked
/// like the least-loaded star of the fleet while it could not serve.
#[test]
fn a_recovering_star_is_placed_nothing() {
    run(|| async {
        let world = World::new();
        let (fleet, star) = world.star("b-serving", 100).await;
        // Registered (as at the start of its recovery) but not serving yet; its id sorts
        // first, so a tie would go its way.
        let recovering = world
            .join("a-recovering", Arc::new(world.etcd.clone()))
            .await;
        for i in 0..6 {
            let (_, leader) = fleet
                .create_stream(
                    &star,
                    &format!("s{i}"),
                    StorageClass::Standard,
                    Retention::default(),
                )
                .await
                .unwrap();
            assert_eq!(
                leader.id, "b-serving",
                "stream s{i} was placed on a star that is still recovering"
            );
        }
        // Once it serves, it takes its share.
        recovering.ready().await;
        let (_, leader) = fleet
            .create_stream(&star, "s6", StorageClass::Standard, Retention::default())
            .await
            .unwrap();
        assert_eq!(leader.id, "a-recovering");
    });
}

/// Defect 5: `--max-streams` counted every stream in the shared catalog, so a fleet held no
/// more streams than one star; and a stream deleted through its leader stayed in the other
/// stars' registries, where creating the name again answered ALREADY_EXISTS.
#[test]
fn max_streams_bounds_each_stars_streams_and_deletes_reach_every_star() {
    run(|| async {
        let world = World::new();
        let (a, star_a) = world.star("a", 2).await;
        let (b, star_b) = world.star("b", 2).await;
        let mut led = std::collections::BTreeMap::<String, usize>::new();
        for i in 0..4 {
            let name = format!("s{i}");
            let (_, leader) = a
                .create_stream(&star_a, &name, StorageClass::Standard, Retention::default())
                .await
                .unwrap_or_else(|e| panic!("creating the {}th stream of a fleet of two stars with --max-streams=2: {e}", i + 1));
            // Taken up where it was placed.
            let on = if leader.id == "a" {
                (&a, &star_a)
            } else {
                (&b, &star_b)
            };
            on.0.route(on.1, &name).await.unwrap();
            *led.entry(leader.id).or_default() += 1;
        }
        assert_eq!(led.values().copied().collect::<Vec<_>>(), [2, 2], "{led:?}");
        // s0 is known to both stars (b learned it when the catalog was loaded or routed it).
        let leader = a.leader_of("s0").await.unwrap().unwrap();
        let (leads, other) = if leader.id == "a" {
            ((&a, &star_a), (&b, &star_b))
        } else {
            ((&b, &star_b), (&a, &star_a))
        };
        let _ = other.0.route(other.1, "s0").await;
        leads.0.delete_stream(leads.1, "s0").await.unwrap();
        other
            .0
            .create_stream(other.1, "s0", StorageClass::Standard, Retention::default())
            .await
            .expect("a name deleted through another star can be created again");
    });
}

/// Defect 6: a put under a lease was taken for a renewal. A star that joined after waiting
/// for its previous registration to lapse, with its keep-alives lost meanwhile, trusted its
/// lease a ttl past the moment etcd let it lapse, and would have acknowledged while a
/// survivor took its chain over.
#[test]
fn trust_in_a_lease_counts_from_its_grant_and_keep_alives_only() {
    run(|| async {
        let world = World::new();
        // A previous incarnation's registration, on a lease that lapses in two seconds.
        let old = world
            .etcd
            .grant_lease(Duration::from_secs(2))
            .await
            .unwrap();
        world
            .etcd
            .commit(Txn::new().put_leased(
                b"fleet/stars/s".to_vec(),
                b"http://old\n1\n0\n0\n0".to_vec(),
                old,
            ))
            .await
            .unwrap();
        // From now on this star's keep-alives are lost on their way.
        world.etcd.set_faults(MetastoreFaults {
            keep_alive_dropped: 1.0,
            ..MetastoreFaults::none()
        });
        let started = world.clock.now();
        let fleet = world.join("s", Arc::new(world.etcd.clone())).await;
        let joined = world.clock.since(started);
        assert!(joined >= Duration::from_secs(2), "joined after {joined:?}");
        // The lease was granted at the start and never renewed: etcd lets it lapse a ttl on.
        world
            .clock
            .sleep_until(started + TTL + Duration::from_millis(100))
            .await;
        assert!(
            !world.etcd.snapshot().contains_key(&b"fleet/stars/s"[..]),
            "etcd let the lease lapse"
        );
        assert!(
            fleet.is_lost(),
            "the star still trusts a lease etcd let lapse {:?} after it was granted",
            TTL
        );
    });
}

/// etcd whose answer to the first commit (a joining star's registration) reaches the star
/// `delay` after the commit applied, as to a star paused just after sending it.
#[derive(Debug)]
struct LateAnswer {
    inner: SimMetastore,
    delay: Duration,
    answered: AtomicBool,
}

#[async_trait]
impl Metastore for LateAnswer {
    fn describe(&self) -> String {
        "late answer".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        self.inner.get(key).await
    }
    async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        self.inner.scan(prefix, after, limit).await
    }
    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        let outcome = self.inner.commit(txn).await;
        if !self.answered.swap(true, Ordering::AcqRel) {
            tokio::time::sleep(self.delay).await;
        }
        outcome
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<u64, MetastoreError> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: u64) -> Result<Option<Duration>, MetastoreError> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: u64) -> Result<(), MetastoreError> {
        self.inner.revoke_lease(lease).await
    }
}

/// Found by fleet seed 31861: a star paused right after sending its registration learned that
/// it had joined only after its lease had lapsed and a survivor had started taking its chain
/// over; its recovery then met the survivor's and the star could not start. A registration
/// answered past the trust window is now a join that failed, and the next one waits for the
/// takeover as any join does.
#[test]
fn a_registration_answered_past_the_lease_is_a_failed_join() {
    run(|| async {
        let world = World::new();
        let late = Arc::new(LateAnswer {
            inner: world.etcd.clone(),
            delay: TTL * 2,
            answered: AtomicBool::new(false),
        });
        let config = FleetConfig {
            star_id: "p".into(),
            advertise: "sim://p".into(),
            kafka_advertise: String::new(),
            lease_ttl: TTL,
            supervisor: nova_core::supervisor::Supervisor::new(),
        };
        let metrics = FleetMetrics::new(&prometheus::Registry::new()).unwrap();
        match Fleet::join(late.clone(), config.clone(), metrics, world.clock).await {
            Err(nova_fleet::JoinError::LeaseExpired { .. }) => {}
            Err(err) => panic!("the join failed otherwise: {err}"),
            Ok(_) => panic!("a star joined on a lease it could no longer trust"),
        }
        let metrics = FleetMetrics::new(&prometheus::Registry::new()).unwrap();
        let fleet = Fleet::join(late, config, metrics, world.clock)
            .await
            .expect("the next join succeeds");
        assert!(!fleet.is_lost());
    });
}
