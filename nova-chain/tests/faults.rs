//! The chain under faults that once lost acknowledged records or kept a star down: a flight
//! abandoned at shutdown while a later one landed, a commit that landed but lost its answer, a
//! store that refuses writes, a store without exclusive creates, and a bucket holding a chain
//! the metastore does not know.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

use std::time::Duration;

use nova_chain::StartError;
use nova_core::catalog::{Catalog, ChainState, StorageClass};
use nova_core::keys::slot_key;
use nova_core::metastore::faulty::CommitFault;
use nova_core::object_store::Op;
use nova_core::object_store::faulty::Fault;
use nova_proto::RequestError;
use nova_testkit::chain::*;
use nova_testkit::eventually;

/// Shutdown gives up on a flight whose write hangs while the flight after it has landed. The
/// later flight must not be acknowledged: the next start fences the abandoned slot, and the
/// later flight is never settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_past_an_abandoned_flight_is_acknowledged() {
    let disk = Disk::new();
    let f = open_faulty(&disk, config()).await.unwrap();
    create(&f.star, "s").await;
    let epoch = f.star.epoch();
    f.store.inject(
        &[Op::PutIfAbsent],
        &slot_key(STAR, epoch, 0),
        Fault::Hold,
        None,
    );
    let first = append(&f.star, "s", "a").await;
    // Past the linger, so "b" goes into the next flight.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = append(&f.star, "s", "b").await;
    let store = disk.store();
    let landed = slot_key(STAR, epoch, 1);
    for _ in 0..500 {
        if store.head(&landed).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.head(&landed).await.expect("the second flight landed");

    let shutdown = f.star.shutdown(Duration::from_millis(300)).await;
    assert!(shutdown.is_err(), "the held flight never landed");
    let first = answer(first).await;
    assert!(
        matches!(first, Err(RequestError::OutcomeUnknown(_))),
        "an abandoned write may still land: {first:?}"
    );
    let second = answer(second).await;
    assert!(
        second.is_err(),
        "a flight past an abandoned slot must not be acknowledged: {second:?}"
    );
    f.store.clear();
    drop(f);

    let star = open_plain(&disk, config()).await.unwrap();
    assert_eq!(star.recovered().orphaned_slots, 1);
    assert!(bodies(&star, "s").await.is_empty());
    let next = answer(append(&star, "s", "c").await).await.unwrap();
    assert_eq!((next.start, next.end), (0, 1));
}

/// Shutdown gives up on a flight still waiting for a backlog permit: its records have
/// sequence numbers, but it has no slot. The chain must end there: were a permit freed
/// meanwhile to let a later flight take the next slot, that flight's records would not
/// continue the stream's, and the next start would refuse the chain (simulation seed 328386).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_abandoned_before_its_slot_ends_the_chain() {
    let disk = Disk::new();
    let one_flight = nova_chain::config::ChainConfig {
        backlog_flights: 1,
        ..config()
    };
    let f = open_faulty(&disk, one_flight).await.unwrap();
    create(&f.star, "s").await;
    // The first flight's absorb is held, so the backlog of one flight stays spent.
    f.metastore.inject(CommitFault::Hold, None);
    answer(append(&f.star, "s", "a").await).await.unwrap();
    let second = append(&f.star, "s", "b").await;
    let metrics = f.metrics.clone();
    eventually(Duration::from_secs(10), "the second flight to wait", || {
        nova_chain::metrics::STALL_CAUSES[..3]
            .iter()
            .map(|cause| {
                metrics
                    .stalls
                    .with_label_values(&["chain_backlog", cause])
                    .get()
            })
            .sum::<u64>()
            >= 1
    })
    .await;
    let _ = f.star.shutdown(Duration::from_millis(300)).await;
    assert!(
        answer(second).await.is_err(),
        "the abandoned flight's append failed"
    );
    assert!(
        f.star.fenced().is_some(),
        "a flight abandoned after its records were sequenced ends the chain"
    );
    let epoch = f.star.epoch();
    f.metastore.clear();
    drop(f);
    assert!(
        disk.store().head(&slot_key(STAR, epoch, 1)).await.is_err(),
        "no flight is written past shutdown's deadline"
    );
    let star = open_plain(&disk, config()).await.unwrap();
    assert_eq!(bodies(&star, "s").await, ["a"]);
    let next = answer(append(&star, "s", "c").await).await.unwrap();
    assert_eq!((next.start, next.end), (1, 2));
}

/// A commit that landed but answered with an error makes the retry meet a version conflict;
/// the star must recognise its own commit rather than fence itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absorb_whose_answer_was_lost_does_not_fence_the_star() {
    let disk = Disk::new();
    let f = open_faulty(&disk, config()).await.unwrap();
    create(&f.star, "s").await;
    f.metastore.inject(CommitFault::LoseAnswer, Some(1));
    answer(append(&f.star, "s", "a").await).await.unwrap();
    let metrics = f.metrics.clone();
    eventually(Duration::from_secs(10), "the absorb", || {
        metrics.flights_absorbed.get() >= 1
    })
    .await;
    assert_eq!(f.star.fenced(), None);
    answer(append(&f.star, "s", "b").await).await.unwrap();
    f.star.shutdown(Duration::from_secs(5)).await.unwrap();
    drop(f);
    let star = open_plain(&disk, config()).await.unwrap();
    assert_eq!(bodies(&star, "s").await, ["a", "b"]);
}

/// Recovery's own commits meet the same ambiguity: a start-up whose epoch move landed without
/// an answer still starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_commit_whose_answer_was_lost_still_starts() {
    let disk = Disk::new();
    {
        let star = open_plain(&disk, config()).await.unwrap();
        create(&star, "s").await;
        answer(append(&star, "s", "a").await).await.unwrap();
        // Stop without absorbing: the next start settles the flight.
        star.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    let store = nova_core::object_store::faulty::FaultyStore::new(disk.store());
    let metastore = nova_core::metastore::faulty::FaultyMetastore::new(disk.metastore());
    metastore.inject(CommitFault::LoseAnswer, Some(2));
    let star = nova_chain::Star::open(
        config(),
        std::sync::Arc::new(store),
        std::sync::Arc::new(metastore),
        std::sync::Arc::new(nova_chain::metrics::Metrics::new()),
    )
    .await
    .expect("recovery recognises its own commits");
    assert_eq!(bodies(&star, "s").await, ["a"]);
}

/// A star whose chain another writer took stops acknowledging and reports itself failed, so
/// novad exits and its supervisor restarts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_star_reports_itself_failed() {
    let disk = Disk::new();
    let f = open_faulty(&disk, config()).await.unwrap();
    create(&f.star, "s").await;
    // Another process moves the chain to a new epoch, as a successor's recovery does.
    let catalog = Catalog::new(std::sync::Arc::new(f.metastore.clone()));
    let chain = catalog.chain(STAR).await.unwrap().unwrap();
    catalog
        .set_chain(
            STAR,
            Some(chain.version),
            ChainState {
                epoch: chain.state.epoch + 1,
                checkpoint: None,
            },
        )
        .await
        .unwrap();
    let _pending = append(&f.star, "s", "a").await;
    let failed = tokio::time::timeout(Duration::from_secs(10), f.star.failed())
        .await
        .expect("the fenced star reports itself failed");
    assert!(failed.contains("another process owns it"), "{failed}");
    assert_eq!(f.metrics.fenced.get(), 1);
}

/// A store that refuses writes with a permanent error is retried (an operator can fix
/// credentials without a restart) but loudly: a gauge, and appends block rather than fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_writes_is_reported_and_recovers() {
    let disk = Disk::new();
    let f = open_faulty(&disk, config()).await.unwrap();
    create(&f.star, "s").await;
    f.store
        .inject(&[Op::PutIfAbsent], "chain/", Fault::Permanent, None);
    let mut pending = append(&f.star, "s", "a").await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut pending)
            .await
            .is_err(),
        "the append blocks while the store refuses"
    );
    assert_eq!(f.metrics.store_rejecting.get(), 1);
    f.store.clear();
    let ack = answer(pending).await.unwrap();
    assert_eq!((ack.start, ack.end), (0, 1));
    assert_eq!(f.metrics.store_rejecting.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_exclusive_creates_is_refused_at_start() {
    let disk = Disk::new();
    let store = nova_core::object_store::faulty::FaultyStore::new(disk.store());
    store.ignore_conditions(true);
    let opened = nova_chain::Star::open(
        config(),
        std::sync::Arc::new(store),
        disk.metastore(),
        std::sync::Arc::new(nova_chain::metrics::Metrics::new()),
    )
    .await;
    let err = opened.err().expect("refused").to_string();
    assert!(err.contains("conditional creates"), "{err}");
}

/// A metastore that knows no chain beside a bucket that holds one (a lost data directory, or
/// two stars sharing a --star-id) must not start a fresh chain over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_unknown_to_the_metastore_is_refused() {
    let disk = Disk::new();
    {
        let star = open_plain(&disk, config()).await.unwrap();
        create(&star, "s").await;
        answer(append(&star, "s", "a").await).await.unwrap();
        star.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    std::fs::remove_file(disk.dir.path().join("meta.redb")).unwrap();
    let err = match open_plain(&disk, config()).await {
        Ok(_) => panic!("started beside a chain it does not know"),
        Err(err) => err,
    };
    assert!(matches!(
        err,
        StartError::Recovery(nova_chain::recovery::RecoveryError::UnknownChain { .. })
    ));
    let message = err.to_string();
    assert!(message.contains("--rebuild-catalog"), "{message}");
    assert!(message.contains("--star-id"), "{message}");
}

/// What a deleted stream leaves behind does not accumulate: its metric series go, the absorber
/// forgets its tail (and removes the tail key it may have written back), and the stream count
/// has a cap with a clear refusal past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_streams_leave_nothing_that_grows() {
    let disk = Disk::new();
    let f = open_faulty(
        &disk,
        nova_chain::ChainConfig {
            max_streams: 3,
            ..config()
        },
    )
    .await
    .unwrap();
    for name in ["a", "b", "c"] {
        create(&f.star, name).await;
    }
    let refused = f
        .star
        .streams()
        .create("d", StorageClass::Standard)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("--max-streams"), "{refused}");
    assert!(
        matches!(refused, RequestError::LimitReached { .. }),
        "{refused:?}"
    );
    assert_eq!(f.metrics.streams.get(), 3);

    answer(append(&f.star, "a", "x").await).await.unwrap();
    let rendered = f.metrics.render();
    assert!(
        rendered.contains("stream=\"a\""),
        "series exist while the stream does"
    );
    let id = f.star.streams().get("a").unwrap().id();
    f.star.streams().delete("a").await.unwrap();
    assert!(
        !f.metrics.render().contains("stream=\"a\""),
        "a deleted stream's series are dropped"
    );
    // Another flight makes the absorber commit; the deleted stream's tail key is gone after.
    answer(append(&f.star, "b", "y").await).await.unwrap();
    let metrics = f.metrics.clone();
    eventually(Duration::from_secs(10), "two absorbs", || {
        metrics.flights_absorbed.get() >= 2
    })
    .await;
    let mut key = b"t/".to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    use nova_core::metastore::Metastore;
    assert!(
        f.metastore.get(&key).await.unwrap().is_none(),
        "the deleted stream's tail key is not written back"
    );
    // With one stream gone, a create fits under the cap again.
    create(&f.star, "d").await;
}

/// A backlog stall that blocks many flights is one stall, logged and counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_stall_is_counted_once_per_episode() {
    let disk = Disk::new();
    let f = open_faulty(
        &disk,
        nova_chain::ChainConfig {
            backlog_flights: 1,
            ..config()
        },
    )
    .await
    .unwrap();
    create(&f.star, "s").await;
    // Hold every absorb: one flight fills the backlog, the ones after it wait.
    f.metastore.inject(CommitFault::Hold, None);
    let mut pending = Vec::new();
    for i in 0..6 {
        pending.push(append(&f.star, "s", &format!("r{i}")).await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.metastore.clear();
    for receiver in pending {
        answer(receiver).await.unwrap();
    }
    let stalls: u64 = nova_chain::metrics::STALL_CAUSES
        .iter()
        .map(|cause| {
            f.metrics
                .stalls
                .with_label_values(&["chain_backlog", cause])
                .get()
        })
        .sum();
    assert_eq!(stalls, 1, "one stall for the whole episode");
}
