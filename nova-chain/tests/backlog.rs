//! The backlog budget: when absorbs cannot keep up, appends block (they are not refused), the
//! stall is counted once with its diagnosed cause, and everything completes once the absorb
//! catches up. The metastore here is the real embedded one behind a fault injector that holds
//! commits.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

use std::sync::Arc;
use std::time::Duration;

use nova_chain::metrics::Metrics;
use nova_chain::{ChainConfig, Star};
use nova_core::catalog::StorageClass;
use nova_core::metastore::EmbeddedMetastore;
use nova_core::metastore::faulty::{CommitFault, FaultyMetastore};
use nova_core::object_store::{LocalStore, StoreLimits};
use nova_testkit::chain::append;

struct Harness {
    star: Arc<Star>,
    metrics: Arc<Metrics>,
    metastore: FaultyMetastore,
    _dir: tempfile::TempDir,
}

async fn harness(slow_after: Duration) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let metastore = FaultyMetastore::new(Arc::new(
        EmbeddedMetastore::open(dir.path().join("meta.redb")).unwrap(),
    ));
    let store =
        Arc::new(LocalStore::open(dir.path().join("store"), StoreLimits::default()).unwrap());
    let metrics = Arc::new(Metrics::new());
    let config = ChainConfig {
        backlog_flights: 2,
        flight_linger: Duration::from_millis(5),
        metastore_slow_after: slow_after,
        ..ChainConfig::default()
    };
    let star = Arc::new(
        Star::open(config, store, Arc::new(metastore.clone()), metrics.clone())
            .await
            .unwrap(),
    );
    star.streams()
        .create("s", StorageClass::Standard)
        .await
        .unwrap();
    Harness {
        star,
        metrics,
        metastore,
        _dir: dir,
    }
}

async fn stall_counts(harness: &Harness, cause: &str) -> u64 {
    harness
        .metrics
        .stalls
        .with_label_values(&["chain_backlog", cause])
        .get()
}

async fn run_backlog_stall(slow_after: Duration, expected_cause: &str) {
    let h = harness(slow_after).await;
    // Hold every absorb: flights land and are acknowledged, but none is absorbed.
    h.metastore.inject(CommitFault::Hold, None);
    let mut acked = Vec::new();
    for body in ["a", "b"] {
        let ack = tokio::time::timeout(Duration::from_secs(10), append(&h.star, "s", body).await)
            .await
            .expect("the first flights fit in the backlog")
            .unwrap()
            .unwrap();
        acked.push(ack);
        // One record per flight: wait past the linger.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the absorber get stuck inside its commit for a while before the budget runs out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let blocked = append(&h.star, "s", "c").await;
    tokio::pin!(blocked);
    let waited = tokio::time::timeout(Duration::from_millis(500), &mut blocked).await;
    assert!(
        waited.is_err(),
        "with the backlog spent the append blocks instead of failing"
    );
    assert_eq!(
        stall_counts(&h, expected_cause).await,
        1,
        "the stall is counted once with its cause"
    );
    assert_eq!(h.metrics.backlog.in_use.get(), 2);

    h.metastore.clear();
    let ack = tokio::time::timeout(Duration::from_secs(10), blocked)
        .await
        .expect("the append completes once the absorb catches up")
        .unwrap()
        .unwrap();
    assert_eq!((ack.start, ack.end), (2, 3));
    assert_eq!(
        stall_counts(&h, expected_cause).await,
        1,
        "one stall, however long it lasted"
    );
    let seconds = h
        .metrics
        .stall_seconds
        .with_label_values(&["chain_backlog", expected_cause])
        .get();
    assert!(seconds > 0.4, "the stall's duration is recorded: {seconds}");
    let page = h
        .star
        .read(&h.star.streams().get("s").unwrap(), 0, 10, 1 << 20)
        .await
        .unwrap();
    let bodies: Vec<_> = page.records.iter().map(|r| r.record.body.clone()).collect();
    assert_eq!(bodies, ["a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_metastore_stalls_appends_and_is_named() {
    run_backlog_stall(Duration::from_millis(100), "metastore_slow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absorb_that_falls_behind_is_named_absorb_lag() {
    // With a threshold no commit reaches, a held absorb reads as lag, not a slow metastore.
    run_backlog_stall(Duration::from_secs(3600), "absorb_lag").await;
}
