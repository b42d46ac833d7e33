//! The tail window cache keeps recent flights within its budget, evicting the oldest first; a
//! flight larger than the whole cache is skipped; reads of anything not cached come from the
//! object store with ranged GETs and return the same records.

mod common;

use common::*;
use nova_client::Record;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_and_skipped_flights_are_read_from_the_object_store() {
    let novad = novad()
        .args(["--tail-window-cache-mib", "1", "--flight-linger-ms", "1"])
        .start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    // 12 flights of ~200 KiB: the cache holds about five, the oldest go first.
    let mut expected = Vec::new();
    for flight in 0..12 {
        let batch: Vec<_> = (0..4)
            .map(|i| Record::new(format!("{flight}-{i}-{}", "x".repeat(50_000))))
            .collect();
        expected.extend(
            batch
                .iter()
                .map(|r| String::from_utf8(r.body.to_vec()).unwrap()),
        );
        session.append("s", batch, None).await.unwrap();
    }
    let evicted = novad
        .metric("nova_tail_cache_evicted_flights_total")
        .unwrap();
    assert!(evicted >= 6.0, "old flights were evicted: {evicted}");
    let used = novad.metric("nova_tail_cache_used_bytes").unwrap();
    assert!(
        used <= (1 << 20) as f64,
        "the cache stays in its budget: {used}"
    );
    assert_peak_rss_within_formula(&novad, 1);

    // A single flight of 1.5 MiB cannot fit a 1 MiB cache at all.
    let huge: Vec<_> = (0..3)
        .map(|i| Record::new(format!("huge-{i}-{}", "y".repeat(500_000))))
        .collect();
    expected.extend(
        huge.iter()
            .map(|r| String::from_utf8(r.body.to_vec()).unwrap()),
    );
    session.append("s", huge, None).await.unwrap();
    assert_eq!(
        novad.metric("nova_tail_cache_skipped_flights_total"),
        Some(1.0)
    );
    assert!(
        novad
            .log()
            .contains("larger than the whole tail window cache")
    );

    let misses_before = novad.metric("nova_tail_cache_misses_total").unwrap();
    let stored = read_all(&client, "s").await;
    assert_eq!(stored, expected, "every record, cached or not");
    let misses = novad.metric("nova_tail_cache_misses_total").unwrap();
    assert!(
        misses > misses_before,
        "the early records came from the object store"
    );
    let gets = novad
        .metrics()
        .lines()
        .find(|l| l.starts_with("nova_object_store_requests_total{op=\"get\",outcome=\"ok\"}"))
        .map(str::to_owned);
    assert!(gets.is_some(), "ranged GETs served the misses");
}

/// Once a flight has landed and the cache lets it go, its append buffers are kept (within
/// `--recycle-buffer-mib`) and the next appends of their size are copied into them: every
/// record still reads back as it was written, from the cache and from the object store, and
/// resident memory stays within the formula, which counts what is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_buffers_are_reused_after_their_records_leave_memory() {
    let novad = novad()
        .args([
            "--tail-window-cache-mib",
            "1",
            "--flight-linger-ms",
            "1",
            "--recycle-buffer-mib",
            "2",
        ])
        .start();
    let client = client(&novad).await;
    client.create_stream("r").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    // Batches of the same size (about 200 KiB each), each with its own content.
    let mut expected = Vec::new();
    for batch in 0..40 {
        let records: Vec<_> = (0..4)
            .map(|i| {
                Record::new(format!(
                    "{batch:02}-{i}-{}",
                    char::from(b'a' + (batch % 26) as u8)
                        .to_string()
                        .repeat(50_000)
                ))
            })
            .collect();
        expected.extend(
            records
                .iter()
                .map(|r| String::from_utf8(r.body.to_vec()).unwrap()),
        );
        session.append("r", records, None).await.unwrap();
    }
    let reused = novad
        .metric("nova_recycle_buffers_total{source=\"reused\"}")
        .unwrap_or(0.0);
    assert!(reused >= 10.0, "buffers were reused: {reused}");
    let kept = novad.metric("nova_recycle_buffer_bytes").unwrap();
    assert!(
        kept <= (2 << 20) as f64,
        "what is kept stays in its budget: {kept}"
    );
    assert_eq!(
        novad.metric("nova_memory_formula_bytes{term=\"recycle\"}"),
        Some((2 << 20) as f64)
    );
    assert_eq!(
        read_all(&client, "r").await,
        expected,
        "every record as written"
    );
    assert_peak_rss_within_formula(&novad, 1);
}
