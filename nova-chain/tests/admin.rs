//! Stream creates and deletes whose metastore answer goes missing, or whose caller gives up:
//! the star must end up serving exactly the streams the catalog has.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

use std::sync::Arc;
use std::time::Duration;

use nova_chain::Star;
use nova_chain::metrics::Metrics;
use nova_core::catalog::StorageClass;
use nova_core::metastore::faulty::{CommitFault, FaultyMetastore};
use nova_proto::RequestError;
use nova_testkit::chain::*;
use nova_testkit::eventually;

/// Stream names live under `n/` in the catalog: faults aimed there hit creates and deletes only.
const NAMES: &[u8] = b"n/";

async fn open(disk: &Disk, metastore: FaultyMetastore) -> Star {
    Star::open(
        config(),
        disk.store(),
        Arc::new(metastore),
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_served() {
    let disk = Disk::new();
    let metastore = FaultyMetastore::new(disk.metastore());
    let star = open(&disk, metastore.clone()).await;
    metastore.inject_for_keys(CommitFault::LoseAnswer, Some(1), NAMES);
    // The catalog is asked, finds the stream this create wrote, and serves it.
    let created = star.streams().create("s", StorageClass::Standard).await;
    assert!(created.is_ok(), "{created:?}");
    assert!(star.streams().get("s").is_some());
    let reply = answer(append(&star, "s", "after").await).await.unwrap();
    assert_eq!(reply.start, 0);
    star.shutdown(Duration::from_secs(5)).await.unwrap();
    drop((star, metastore));
    // Its manifest is live: a catalog rebuilt from the bucket would have it.
    let store = disk.store();
    let manifests = store.list("streams/", None, 100).await.unwrap().objects;
    let manifest = store
        .get(&manifests[0].key, nova_core::object_store::GetRange::All)
        .await
        .unwrap();
    let manifest = nova_core::manifest::StreamManifest::decode(&manifest.bytes).unwrap();
    assert!(
        !manifest.deleted,
        "a created stream's manifest says deleted"
    );
    let star = open(&disk, FaultyMetastore::new(disk.metastore())).await;
    assert_eq!(bodies(&star, "s").await, ["after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_the_caller_gave_up_on_still_stops_the_stream() {
    let disk = Disk::new();
    let metastore = FaultyMetastore::new(disk.metastore());
    let star = Arc::new(open(&disk, metastore.clone()).await);
    create(&star, "s").await;
    answer(append(&star, "s", "before").await).await.unwrap();
    metastore.inject_for_keys(CommitFault::Hold, Some(1), NAMES);
    let deleting = {
        let star = star.clone();
        tokio::spawn(async move { star.streams().delete("s").await })
    };
    metastore.wait_held().await;
    // The caller gives up while the delete's commit is in the metastore's hands.
    deleting.abort();
    let _ = deleting.await;
    metastore.clear();
    eventually(
        Duration::from_secs(5),
        "the stream to stop being served",
        || star.streams().get("s").is_none(),
    )
    .await;
    assert!(matches!(
        star.streams().get_or_not_found("s"),
        Err(RequestError::StreamNotFound(_))
    ));
}
