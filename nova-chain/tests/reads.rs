//! Reads are held to the read budget: a read that finds it spent after its first section
//! returns a short page (never an empty one), and a read that holds nothing waits for room,
//! its wait counted, until an earlier page is released.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

mod support;

use std::time::Duration;

use nova_chain::ChainConfig;
use support::*;

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
