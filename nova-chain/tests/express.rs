//! Express fencing across express epochs, in process: a star (the zombie) and its successor
//! share one metastore and one set of zone stores, as a paused star and the star that took its
//! chain over do. Whatever the zombie does after the successor's recovery, it acknowledges
//! nothing more, and the successor holds every record the zombie acknowledged before.

#![allow(
    clippy::disallowed_methods,
    reason = "stars on a real disk and the real embedded metastore run on the real clock"
)]

use std::sync::Arc;
use std::time::Duration;

use nova_chain::express::{ExpressConfig, Zone, Zones};
use nova_chain::metrics::Metrics;
use nova_chain::{ChainConfig, Star};
use nova_core::catalog::StorageClass;
use nova_core::flight::{ObjectFooter, fetch_footer};
use nova_core::keys::express_root;
use nova_core::metastore::Metastore;
use nova_core::object_store::faulty::{Fault, FaultyStore};
use nova_core::object_store::{LocalStore, ObjectStore, Op, StoreLimits};
use nova_testkit::chain::{Disk, answer, append, bodies};
use nova_testkit::eventually;

struct World {
    disk: Disk,
    metastore: Arc<dyn Metastore>,
    faults: Vec<Arc<FaultyStore>>,
    zones: Zones,
}

impl World {
    fn new() -> Self {
        let disk = Disk::new();
        let metastore = disk.metastore();
        let mut faults = Vec::new();
        let mut zones = Vec::new();
        for name in ["a", "b", "c"] {
            let store: Arc<dyn ObjectStore> = Arc::new(
                LocalStore::open(disk.dir.path().join(name), StoreLimits::default()).unwrap(),
            );
            let faulty = Arc::new(FaultyStore::new(store));
            faults.push(faulty.clone());
            zones.push(Zone {
                name: name.into(),
                store: faulty,
            });
        }
        Self {
            disk,
            metastore,
            faults,
            zones: Zones::new(zones).unwrap(),
        }
    }

    fn config(&self) -> ChainConfig {
        ChainConfig {
            express: Some(ExpressConfig {
                zones: self.zones.clone(),
                publish_deadline: Duration::from_millis(300),
                linger: Duration::from_millis(2),
                buffer_bytes: 4 << 20,
            }),
            ..nova_testkit::chain::config()
        }
    }

    /// A star on the shared metastore and stores: a second one opened while the first still
    /// runs is its successor, and the first a zombie.
    async fn open(&self) -> (Arc<Star>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let star = Star::open(
            self.config(),
            self.disk.store(),
            self.metastore.clone(),
            metrics.clone(),
        )
        .await
        .unwrap();
        (Arc::new(star), metrics)
    }

    /// Waits until the catalog holds `records` records of `stream`: the zombie's absorbs are
    /// done, so the successor's recovery does not race them (two live stars on one catalog
    /// is the test's doing; a real successor retries a recovery that meets a conflict).
    async fn absorbed(&self, stream: &str, records: u64) {
        let catalog = nova_core::catalog::Catalog::new(self.metastore.clone());
        let id = catalog.stream(stream).await.unwrap().unwrap().id;
        for _ in 0..2000 {
            if catalog.stream_tail(id).await.unwrap().tail_seq >= records {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{stream} never reached {records} absorbed records");
    }

    /// Keys of the star's express chain that hold fences, in zone `zone`.
    async fn fences(&self, zone: usize) -> Vec<String> {
        let store = self.zones.iter().nth(zone).unwrap().store.clone();
        let page = store
            .list(&express_root(nova_testkit::chain::STAR), None, 1000)
            .await
            .unwrap();
        let mut fences = Vec::new();
        for object in page.objects {
            if let Ok(ObjectFooter::Fence(_)) = fetch_footer(store.as_ref(), &object.key).await {
                fences.push(object.key);
            }
        }
        fences
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_sealed_and_moved_on_acknowledges_nothing_after_its_successor_recovers() {
    let w = World::new();
    let (zombie, zombie_metrics) = w.open().await;
    zombie
        .streams()
        .create("x", StorageClass::Express)
        .await
        .unwrap();
    let mut acked = Vec::new();
    for i in 0..5 {
        let body = format!("before-{i}");
        answer(append(&zombie, "x", &body).await)
            .await
            .expect("acknowledged at a quorum");
        acked.push(body);
    }

    // Two zones refuse every write: the next bundle misses its quorum, and once they answer
    // again the zombie seals that express epoch with its own fences and moves to the next.
    for zone in &w.faults[..2] {
        zone.inject(&[Op::PutIfAbsent], "", Fault::Permanent, None);
    }
    assert!(answer(append(&zombie, "x", "missed").await).await.is_err());
    for zone in &w.faults[..2] {
        zone.clear();
    }
    eventually(
        Duration::from_secs(20),
        "the zombie reopens its lane",
        || zombie_metrics.express.repairs.get() >= 1,
    )
    .await;

    // The successor recovers the chain while the zombie still runs, then collects the zone
    // copies behind its checkpoint.
    w.absorbed("x", acked.len() as u64).await;
    let (successor, successor_metrics) = w.open().await;
    assert_eq!(
        bodies(&successor, "x").await,
        acked,
        "every acknowledged record"
    );
    eventually(Duration::from_secs(20), "the successor collects", || {
        successor_metrics.express.collected.get() > 0
    })
    .await;
    // The zombie, which never learnt of its successor, writes its first bundle of the express
    // epoch it moved to, which the successor's walk went on into and plugged: refused.
    let late = answer(append(&zombie, "x", "zombie").await).await;
    assert!(late.is_err(), "a zombie acknowledged {late:?}");
    assert!(zombie.fenced().is_some(), "the zombie fences itself");
    assert_eq!(bodies(&successor, "x").await, acked);
    // Collection behind the successor's checkpoint left the fences: the zombie's own seal and
    // the successor's plug of the epoch after it.
    for zone in 0..3 {
        assert!(
            w.fences(zone).await.len() >= 2,
            "zone {zone} keeps its fences"
        );
    }

    // The successor carries on from the tail.
    let ack = answer(append(&successor, "x", "after").await)
        .await
        .expect("the successor appends");
    assert_eq!(ack.start, acked.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_never_sealed_is_refused_at_its_next_slot() {
    let w = World::new();
    let (zombie, _) = w.open().await;
    zombie
        .streams()
        .create("x", StorageClass::Express)
        .await
        .unwrap();
    answer(append(&zombie, "x", "one").await).await.unwrap();
    w.absorbed("x", 1).await;
    let (successor, _) = w.open().await;
    // The successor's collector makes its first pass at start; the plug it must leave alone
    // is the only object in its way.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let late = answer(append(&zombie, "x", "two").await).await;
    assert!(late.is_err(), "a zombie acknowledged {late:?}");
    assert_eq!(bodies(&successor, "x").await, ["one"]);
}
