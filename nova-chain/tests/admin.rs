//! Stream creates and deletes whose metastore answer goes missing, or whose caller gives up:
//! the star must end up serving exactly the streams the catalog has.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use nova_chain::Star;
use nova_core::catalog::StorageClass;
use nova_core::metastore::{
    Capabilities, KeyValue, Metastore, MetastoreError, Mutation, Txn, TxnOutcome,
};
use nova_core::metrics::Metrics;
use nova_proto::RequestError;
use support::*;

/// A metastore that, when armed, applies the next commit touching a stream's name and then
/// loses its answer, or holds that commit until released.
#[derive(Debug)]
struct NameCommits {
    inner: Arc<dyn Metastore>,
    lose_answer: AtomicBool,
    hold: AtomicBool,
    held: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl NameCommits {
    fn new(inner: Arc<dyn Metastore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            lose_answer: AtomicBool::new(false),
            hold: AtomicBool::new(false),
            held: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        })
    }
}

fn touches_a_name(txn: &Txn) -> bool {
    txn.mutations.iter().any(|m| match m {
        Mutation::Put(key, _) | Mutation::Delete(key) => key.starts_with(b"n/"),
    })
}

#[async_trait]
impl Metastore for NameCommits {
    fn describe(&self) -> String {
        self.inner.describe()
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
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        self.inner.scan(prefix, start_after, limit).await
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        if touches_a_name(&txn) && self.hold.swap(false, Ordering::AcqRel) {
            self.held.notify_one();
            self.release.notified().await;
        }
        let lose = touches_a_name(&txn) && self.lose_answer.swap(false, Ordering::AcqRel);
        let outcome = self.inner.commit(txn).await?;
        if lose {
            return Err(MetastoreError::Unavailable("answer lost (test)".into()));
        }
        Ok(outcome)
    }
}

async fn open(disk: &Disk, metastore: Arc<NameCommits>) -> Star {
    Star::open(config(), disk.store(), metastore, Arc::new(Metrics::new()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_served() {
    let disk = Disk::new();
    let metastore = NameCommits::new(disk.metastore());
    let star = open(&disk, metastore.clone()).await;
    metastore.lose_answer.store(true, Ordering::Release);
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
    let star = open(&disk, NameCommits::new(disk.metastore())).await;
    assert_eq!(bodies(&star, "s").await, ["after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_the_caller_gave_up_on_still_stops_the_stream() {
    let disk = Disk::new();
    let metastore = NameCommits::new(disk.metastore());
    let star = Arc::new(open(&disk, metastore.clone()).await);
    create(&star, "s").await;
    answer(append(&star, "s", "before").await).await.unwrap();
    metastore.hold.store(true, Ordering::Release);
    let deleting = {
        let star = star.clone();
        tokio::spawn(async move { star.streams().delete("s").await })
    };
    metastore.held.notified().await;
    // The caller gives up while the delete's commit is in the metastore's hands.
    deleting.abort();
    let _ = deleting.await;
    metastore.release.notify_one();
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
