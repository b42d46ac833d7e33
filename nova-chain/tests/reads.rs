//! Reads are held to the read budget: a read that finds it spent after its first section
//! returns a short page (never an empty one), and a read that holds nothing waits for room,
//! its wait counted, until an earlier page is released.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

use std::time::Duration;

use nova_chain::ChainConfig;
use nova_core::object_store::Op;
use nova_core::object_store::faulty::Fault;
use nova_testkit::chain::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_held_to_the_read_budget() {
    let disk = Disk::new();
    let config = ChainConfig {
        read_bytes: 64 * 1024,
        // Nothing cached: every read fetches sections from the store.
        tail_cache_bytes: 0,
        ..config()
    };
    let f = open_faulty(&disk, config).await.unwrap();
    let star = f.star.clone();
    create(&star, "s").await;
    let body = "r".repeat(10 * 1024);
    for _ in 0..20 {
        // One record per flight: each is a section of its own.
        answer(append(&star, "s", &body).await).await.unwrap();
    }
    let stream = star.streams().get("s").unwrap();

    let page = star.read(&stream, 0, 1000, 1 << 30).await.unwrap();
    assert!(
        !page.records.is_empty() && page.records.len() < 20,
        "the budget ends the page short, after at least one record: {} records",
        page.records.len()
    );
    assert!(page.charge.bytes() <= 64 * 1024, "{}", page.charge.bytes());
    assert_eq!(
        f.metrics.read_memory.in_use.get() as u64,
        page.charge.bytes()
    );

    // With the budget held by that page, the next read waits for room.
    let second = {
        let star = star.clone();
        let stream = stream.clone();
        tokio::spawn(async move { star.read(&stream, 0, 1000, 1 << 30).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "a read that holds nothing waits for room"
    );
    assert_eq!(f.metrics.read_memory.waiters.get(), 1);
    drop(page);
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the read proceeds once the page is released")
        .unwrap()
        .unwrap();
    assert!(!second.records.is_empty());
    drop(second);
    assert_eq!(f.metrics.read_memory.in_use.get(), 0);
}

/// A read given a charge limit (what its token took of its share ahead) ends its page short at
/// it, after at least one record, however much room the budget has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_within_a_limit_ends_short_at_it() {
    let disk = Disk::new();
    let config = ChainConfig {
        read_bytes: 1 << 20,
        tail_cache_bytes: 0,
        ..config()
    };
    let f = open_faulty(&disk, config).await.unwrap();
    let star = f.star.clone();
    create(&star, "s").await;
    let body = "r".repeat(10 * 1024);
    for _ in 0..20 {
        answer(append(&star, "s", &body).await).await.unwrap();
    }
    let stream = star.streams().get("s").unwrap();
    let whole = star.read(&stream, 0, 1000, 1 << 30).await.unwrap();
    assert_eq!(whole.records.len(), 20);
    drop(whole);
    let limited = star
        .read_within(&stream, 0, 1000, 1 << 30, Some(64 * 1024))
        .await
        .unwrap();
    assert!(
        !limited.records.is_empty() && limited.records.len() < 20,
        "{} records within the limit",
        limited.records.len()
    );
    assert!(
        limited.charge.bytes() <= 64 * 1024,
        "{}",
        limited.charge.bytes()
    );
    // A limit below one record's charge still serves that record.
    let one = star
        .read_within(&stream, 0, 1000, 1 << 30, Some(1))
        .await
        .unwrap();
    assert_eq!(one.records.len(), 1);
}

/// A read whose object is gone every time it resolves its refs again (here deleted behind the
/// star's back; normally the auditor moving records faster than the read fetches them) is
/// answered UNAVAILABLE, retryable, saying why: never "not found", which a client takes for a
/// deleted stream, nor INTERNAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_objects_keep_vanishing_is_unavailable() {
    use nova_proto::RequestError;
    let disk = Disk::new();
    let config = ChainConfig {
        tail_cache_bytes: 0,
        ..config()
    };
    let f = open_faulty(&disk, config).await.unwrap();
    let star = f.star.clone();
    create(&star, "s").await;
    answer(append(&star, "s", "gone").await).await.unwrap();
    let stream = star.streams().get("s").unwrap();
    assert_eq!(
        star.read(&stream, 0, 10, 1 << 20)
            .await
            .unwrap()
            .records
            .len(),
        1
    );
    let store = disk.store();
    let listed = store.list("chain/", None, 1000).await.unwrap();
    for object in &listed.objects {
        store.delete(&object.key).await.unwrap();
    }
    match star.read(&stream, 0, 10, 1 << 20).await {
        Err(RequestError::Unavailable(message)) => {
            assert!(
                message.contains("\"s\"") && message.contains("try again"),
                "{message}"
            );
        }
        other => panic!(
            "a read whose object is gone answered {:?}",
            other.map(|p| p.records.len())
        ),
    }
}

/// A cold read keeps up to 8 GETs running: the next starts as any of them lands, so one slow
/// GET holds back neither the 7 after it nor the ones after those, and never more than 8 run
/// at once. Sections are still served in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_read_slides_its_window_of_eight_gets() {
    let disk = Disk::new();
    let config = ChainConfig {
        tail_cache_bytes: 0,
        ..config()
    };
    let f = open_faulty(&disk, config).await.unwrap();
    let star = f.star.clone();
    create(&star, "s").await;
    for i in 0..20 {
        // One record per flight: each is a section, and an object, of its own.
        answer(append(&star, "s", &format!("record {i}")).await)
            .await
            .unwrap();
    }
    let stream = star.streams().get("s").unwrap();
    let mut keys: Vec<String> = disk
        .store()
        .list("chain/", None, 1000)
        .await
        .unwrap()
        .objects
        .into_iter()
        .map(|o| o.key)
        .collect();
    keys.sort();
    assert_eq!(keys.len(), 20, "{keys:?}");
    // The first section's GET is held, and so are the 9th to the 16th, each once.
    for key in std::iter::once(&keys[0]).chain(&keys[8..16]) {
        f.store.inject(&[Op::Get], key, Fault::Hold, Some(1));
    }
    let read = {
        let star = star.clone();
        let stream = stream.clone();
        tokio::spawn(async move { star.read(&stream, 0, 1000, 1 << 30).await })
    };
    // The 2nd to the 8th land while the first is held, and the 9th to the 15th start.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f.store.rules_left() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sections after a held one were not fetched: {} holds unused",
            f.store.rules_left()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Eight running (the first, and the 9th to the 15th): the 16th waits for one to land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(f.store.rules_left(), 1, "more than 8 GETs in flight");
    f.store.clear();
    let page = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the read ends once its GETs are let go")
        .unwrap()
        .unwrap();
    let bodies: Vec<String> = page
        .records
        .iter()
        .map(|r| String::from_utf8_lossy(&r.record.body).into_owned())
        .collect();
    let expected: Vec<String> = (0..20).map(|i| format!("record {i}")).collect();
    assert_eq!(bodies, expected);
}
