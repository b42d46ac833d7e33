//! Rebuilding a catalog from the bucket: each star restores only its own streams from a shared
//! bucket, a rebuild interrupted half-way is run again to completion, and a star refuses to
//! start on a half-restored catalog.

use std::sync::Arc;
use std::time::Duration;

use nova_chain::metrics::Metrics;
use nova_chain::rebuild::rebuild_catalog;
use nova_chain::{ChainConfig, Star, StartError};
use nova_core::catalog::Catalog;
use nova_core::clock::Clock;
use nova_core::metastore::{EmbeddedMetastore, Metastore};
use nova_core::object_store::faulty::{Fault, FaultyStore};
use nova_core::object_store::{ObjectStore, Op};
use nova_testkit::chain::*;

fn named(star: &str) -> ChainConfig {
    ChainConfig {
        star: star.into(),
        ..config()
    }
}

async fn open(
    star: &str,
    store: Arc<dyn ObjectStore>,
    metastore: Arc<dyn Metastore>,
) -> Result<Star, StartError> {
    Star::open(named(star), store, metastore, Arc::new(Metrics::new())).await
}

fn metastore(disk: &Disk, name: &str) -> Arc<dyn Metastore> {
    Arc::new(EmbeddedMetastore::open(disk.dir.path().join(name)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stars_sharing_a_bucket_rebuild_only_their_own_streams() {
    let disk = Disk::new();
    for (star, bodies) in [("a", ["a1", "a2"]), ("b", ["b1", "b2"])] {
        let opened = open(star, disk.store(), metastore(&disk, star))
            .await
            .unwrap();
        // Both catalogs hand out id 1 to a stream named "x".
        create(&opened, "x").await;
        for body in bodies {
            answer(append(&opened, "x", body).await).await.unwrap();
        }
        if star == "b" {
            opened.streams().delete("x").await.unwrap();
        }
        opened.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    std::fs::remove_file(disk.dir.path().join("a")).unwrap();
    let catalog = Catalog::new(metastore(&disk, "a"));
    let report = rebuild_catalog("a", &disk.store(), &catalog, Clock::system())
        .await
        .unwrap();
    assert_eq!((report.streams, report.records), (1, 2));
    drop(catalog);
    let star = open("a", disk.store(), metastore(&disk, "a"))
        .await
        .unwrap();
    assert_eq!(bodies(&star, "x").await, ["a1", "a2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_rebuild_is_refused_at_start_and_completes_when_run_again() {
    let disk = Disk::new();
    {
        let star = open(STAR, disk.store(), metastore(&disk, "m"))
            .await
            .unwrap();
        create(&star, "s").await;
        for body in ["one", "two", "three"] {
            answer(append(&star, "s", body).await).await.unwrap();
        }
        star.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    std::fs::remove_file(disk.dir.path().join("m")).unwrap();

    // The listing of the chain fails for good half-way through the rebuild.
    let faulty = FaultyStore::new(disk.store());
    faulty.inject(&[Op::List], "chain/", Fault::Permanent, None);
    let faulty: Arc<dyn ObjectStore> = Arc::new(faulty);
    {
        let catalog = Catalog::new(metastore(&disk, "m"));
        assert!(
            rebuild_catalog(STAR, &faulty, &catalog, Clock::system())
                .await
                .is_err()
        );
    }
    let refused = open(STAR, disk.store(), metastore(&disk, "m")).await;
    let err = refused
        .err()
        .expect("a half-restored catalog is refused")
        .to_string();
    assert!(err.contains("--rebuild-catalog"), "{err}");

    {
        let catalog = Catalog::new(metastore(&disk, "m"));
        let report = rebuild_catalog(STAR, &disk.store(), &catalog, Clock::system())
            .await
            .unwrap();
        assert_eq!(report.records, 3);
    }
    let star = open(STAR, disk.store(), metastore(&disk, "m"))
        .await
        .unwrap();
    assert_eq!(bodies(&star, "s").await, ["one", "two", "three"]);
    let next = answer(append(&star, "s", "four").await).await.unwrap();
    assert_eq!(next.start, 3);
}
