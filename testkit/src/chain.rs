//! A star on real local storage behind fault-injecting wrappers, for the chain's tests and the
//! auditor's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use nova_chain::admission::encoded_charge;
use nova_chain::metrics::Metrics;
use nova_chain::{AppendReply, ChainConfig, RetryPolicy, Star, StartError};
use nova_core::flight::section::encode_fragment;
use nova_core::metastore::faulty::FaultyMetastore;
use nova_core::metastore::{EmbeddedMetastore, Metastore};
use nova_core::object_store::faulty::FaultyStore;
use nova_core::object_store::{LocalStore, ObjectStore, StoreLimits};
use nova_core::record::Record;

pub const STAR: &str = "star";

/// Storage that outlives the stars opened on it.
pub struct Disk {
    pub dir: tempfile::TempDir,
}

impl Default for Disk {
    fn default() -> Self {
        Self::new()
    }
}

impl Disk {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::new(LocalStore::open(self.dir.path().join("store"), StoreLimits::default()).unwrap())
    }

    pub fn metastore(&self) -> Arc<dyn Metastore> {
        Arc::new(EmbeddedMetastore::open(self.dir.path().join("meta.redb")).unwrap())
    }
}

pub fn config() -> ChainConfig {
    ChainConfig {
        star: STAR.into(),
        flight_linger: Duration::from_millis(5),
        retry: RetryPolicy {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        ..ChainConfig::default()
    }
}

/// A star opened on the disk through fault injectors.
pub struct Faulty {
    pub star: Arc<Star>,
    pub store: FaultyStore,
    pub metastore: FaultyMetastore,
    pub metrics: Arc<Metrics>,
}

pub async fn open_faulty(disk: &Disk, config: ChainConfig) -> Result<Faulty, StartError> {
    let store = FaultyStore::new(disk.store());
    let metastore = FaultyMetastore::new(disk.metastore());
    let metrics = Arc::new(Metrics::new());
    let star = Star::open(
        config,
        Arc::new(store.clone()),
        Arc::new(metastore.clone()),
        metrics.clone(),
    )
    .await?;
    Ok(Faulty {
        star: Arc::new(star),
        store,
        metastore,
        metrics,
    })
}

pub async fn open_plain(disk: &Disk, config: ChainConfig) -> Result<Star, StartError> {
    Star::open(
        config,
        disk.store(),
        disk.metastore(),
        Arc::new(Metrics::new()),
    )
    .await
}

/// Creates a Standard stream, as every test here does first.
pub async fn create(star: &Star, name: &str) {
    star.streams()
        .create(name, nova_core::catalog::StorageClass::Standard)
        .await
        .unwrap();
}

/// Submits one record to `stream` and returns the receiver of its answer.
pub async fn append(
    star: &Star,
    stream: &str,
    body: &str,
) -> tokio::sync::oneshot::Receiver<AppendReply> {
    let state = star.streams().get(stream).unwrap();
    let records = [Record {
        timestamp: 1,
        headers: vec![],
        body: Bytes::from(body.to_owned()),
    }];
    let admitted = star
        .admission()
        .admit(encoded_charge(1, 0, body.len() as u64))
        .await;
    let fragment = encode_fragment(records.iter());
    star.submit(state, vec![fragment], body.len() as u64, None, admitted)
        .await
        .unwrap()
}

/// Waits for an answer, failing the test after 10 s.
pub async fn answer(receiver: tokio::sync::oneshot::Receiver<AppendReply>) -> AppendReply {
    tokio::time::timeout(Duration::from_secs(10), receiver)
        .await
        .expect("an answer within 10s")
        .expect("the star answers")
}

/// Every record body of a stream below its tail.
pub async fn bodies(star: &Star, stream: &str) -> Vec<String> {
    let state = star.streams().get(stream).unwrap();
    let page = star.read(&state, 0, 10_000, 1 << 30).await.unwrap();
    page.records
        .iter()
        .map(|r| String::from_utf8(r.record.body.to_vec()).unwrap())
        .collect()
}
