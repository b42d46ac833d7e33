//! The auditor in a real novad on a real S3-compatible server (moto): settling and collecting
//! keep every read whole on the star and on a gateway, the request budget holds as the server
//! counts it, an idle auditor asks nothing, the rewrite copies large objects server-side (as the
//! server records it), retention set with the CLI trims and reads below the trim point answer
//! OUT_OF_RANGE everywhere, and kill -9 in the middle of the duties loses and leaks nothing.

#![allow(
    clippy::disallowed_methods,
    reason = "real processes on the real clock"
)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nova_client::{Client, Producer, ProducerConfig, Record, Retention};
use nova_core::catalog::{Catalog, Garbage};
use nova_core::flight::{ObjectFooter, fetch_footer};
use nova_core::keys::{data_root, parse_data_key};
use nova_core::metastore::EmbeddedMetastore;
use nova_core::object_store::{ObjectStore, S3Config, S3Store};
use nova_testkit::{Moto, Novad, NovadBuilder, nova_at, succeeded, workspace_binary};

use common::*;

const BUCKET: &str = "audited";

async fn bucket(moto: &Moto) -> Arc<dyn ObjectStore> {
    let mut config = S3Config::new(BUCKET);
    config.endpoint = Some(moto.endpoint());
    config.credentials = Some(("test".into(), "testtest".into()));
    Arc::new(S3Store::new(config).await)
}

/// A gateway on `moto`'s bucket in front of `novad`.
fn gateway(moto: &Moto, novad: &Novad) -> Novad {
    via_endpoint(
        NovadBuilder::gateway(workspace_binary("novagateway")),
        &moto.endpoint(),
        BUCKET,
    )
    .args(["--star", &novad.url()])
    .start()
}

/// A star on `moto` with a small tail cache (reads come from the bucket) and the auditor on.
fn star(moto: &Moto, auditor: &[&str]) -> NovadBuilder {
    novad_on_s3(moto, BUCKET)
        .args(["--tail-window-cache-mib", "1", "--flight-linger-ms", "5"])
        .args([
            "--auditor-idle-ms",
            "100",
            "--auditor-settle-after-secs",
            "0",
        ])
        .args(auditor.iter().copied())
}

/// Appends `batches` batches of 10 records to each of `streams` new streams, all streams at
/// once, so flights hold sections of many streams. Returns what each stream holds.
async fn load(novad: &Novad, streams: usize, batches: usize) -> BTreeMap<String, Vec<String>> {
    let mut tasks = Vec::new();
    for s in 0..streams {
        let url = novad.url();
        tasks.push(tokio::spawn(async move {
            let name = format!("s{s}");
            let client = Client::connect(&url).await.unwrap();
            client.create_stream(&name).await.unwrap();
            let producer = Producer::new(client, &name, ProducerConfig::default())
                .await
                .unwrap();
            let mut bodies = Vec::new();
            for b in 0..batches {
                for i in 0..10 {
                    let body = format!("{name}-{b}-{i}");
                    producer.append(Record::new(body.clone())).await.unwrap();
                    bodies.push(body);
                }
                producer.flush().await.unwrap();
            }
            producer.close().await.unwrap();
            (name, bodies)
        }));
    }
    let mut out = BTreeMap::new();
    for task in tasks {
        let (name, bodies) = task.await.unwrap();
        out.insert(name, bodies);
    }
    out
}

/// Chain objects that are flights, not fences or settle markers.
async fn flights(store: &dyn ObjectStore) -> usize {
    let mut count = 0;
    let mut after: Option<String> = None;
    loop {
        let page = store.list("chain/", after.as_deref(), 1000).await.unwrap();
        for object in &page.objects {
            if object.key.contains("/settled-") {
                continue;
            }
            if let Ok(ObjectFooter::Flight(_)) = fetch_footer(store, &object.key).await {
                count += 1;
            }
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return count,
        }
    }
}

async fn settled_objects(store: &dyn ObjectStore) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(&data_root("nova"), after.as_deref(), 1000)
            .await
            .unwrap();
        out.extend(page.objects.iter().map(|o| o.key.clone()));
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

/// What a stopped novad's catalog and its bucket say about the settled objects.
struct CatalogAudit {
    /// Settled objects in the bucket, in key order.
    settled: Vec<String>,
    /// Objects the live streams' index entries reference.
    referenced: std::collections::BTreeSet<String>,
    /// Objects the garbage queue holds for deletion.
    queued: std::collections::BTreeSet<String>,
    /// Objects deleted streams' entries, still to be dropped, reference.
    dropping: std::collections::BTreeSet<String>,
    dropping_streams: usize,
}

/// Reads the catalog of a stopped `novad`, checking each live stream's index as it goes: no
/// gaps, up to its tail, every entry's object in the bucket.
async fn audit_catalog(novad: &Novad, store: &dyn ObjectStore) -> CatalogAudit {
    let catalog = Catalog::new(Arc::new(
        EmbeddedMetastore::open(novad.data_dir().join("metastore.redb")).unwrap(),
    ));
    let mut referenced = std::collections::BTreeSet::new();
    for (meta, tail) in catalog.load_streams().await.unwrap() {
        let mut next = catalog.first_seq(meta.id).await.unwrap();
        for entry in catalog.index_entries(meta.id, next, 100_000).await.unwrap() {
            assert_eq!(entry.start_seq, next, "a gap in {}'s index", meta.name);
            next = entry.end_seq;
            assert!(store.head(&entry.object_key).await.is_ok(), "{entry:?}");
            referenced.insert(entry.object_key);
        }
        assert_eq!(next, tail.tail_seq);
    }
    let queued = catalog
        .garbage_page(100_000)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|queued| match queued.item {
            Garbage::Object { key, .. } | Garbage::Again { key } => Some(key),
            Garbage::ChainSlots { .. } => None,
        })
        .collect();
    let streams = catalog.dropping_streams(100).await.unwrap();
    let mut dropping = std::collections::BTreeSet::new();
    for (stream, _) in &streams {
        for entry in catalog.index_entries(stream.id, 0, 100_000).await.unwrap() {
            dropping.insert(entry.object_key);
        }
    }
    let mut settled = settled_objects(store).await;
    settled.sort();
    CatalogAudit {
        settled,
        referenced,
        queued,
        dropping,
        dropping_streams: streams.len(),
    }
}

fn sum(novad: &Novad, prefix: &str) -> f64 {
    novad
        .metrics()
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_settled(store: &dyn ObjectStore, novad: &Novad, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let idle = novad.metric("nova_auditor_oldest_due_age_seconds") == Some(0.0);
        if flights(store).await == 0 && idle {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the auditor did not settle and collect within {within:?}:\n{}",
            novad.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads every stream again and again until told to stop, checking each page against what was
/// appended: a reader running through settling and collection never fails and never sees a gap.
fn keep_reading(
    url: String,
    expected: BTreeMap<String, Vec<String>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let client = Client::connect(&url).await.unwrap();
        let mut passes = 0;
        while !stop.load(Ordering::SeqCst) {
            for (name, bodies) in &expected {
                let mut next = 0u64;
                while (next as usize) < bodies.len() {
                    let page = client
                        .read(name, next, 0)
                        .await
                        .unwrap_or_else(|e| panic!("reading {name} at {next} via {url}: {e}"));
                    assert!(!page.records.is_empty(), "an empty page below the tail");
                    for record in &page.records {
                        assert_eq!(record.seq, next, "a gap in {name} via {url}");
                        assert_eq!(record.record.body, bodies[next as usize].as_bytes());
                        next += 1;
                    }
                }
            }
            passes += 1;
        }
        passes
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settling_and_collecting_keep_every_read_whole_on_the_star_and_a_gateway() {
    let moto = Moto::start();
    let novad = star(&moto, &["--auditor-collect-grace-secs", "1"]).start();
    let gateway = gateway(&moto, &novad);
    let store = bucket(&moto).await;

    let expected = load(&novad, 6, 40).await;
    let stop = Arc::new(AtomicBool::new(false));
    let readers =
        [novad.url(), gateway.url()].map(|url| keep_reading(url, expected.clone(), stop.clone()));
    wait_settled(store.as_ref(), &novad, Duration::from_secs(120)).await;
    // A little longer, so readers holding refs from before the last collection meet it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        assert!(reader.await.unwrap() > 0, "a reader finished no pass");
    }

    // Every stream's records are in objects of its own; the flights are gone.
    let settled = settled_objects(store.as_ref()).await;
    let owners: std::collections::BTreeSet<u64> = settled
        .iter()
        .filter_map(|k| parse_data_key(&data_root("nova"), k))
        .map(|d| d.stream_id)
        .collect();
    assert_eq!(owners.len(), 6, "{settled:?}");
    for url in [novad.url(), gateway.url()] {
        let client = Client::connect(&url).await.unwrap();
        for (name, bodies) in &expected {
            assert_eq!(&read_all(&client, name).await, bodies, "{name} via {url}");
        }
    }
    assert!(
        novad
            .metric("nova_auditor_settled_flights_total")
            .unwrap_or(0.0)
            > 1.0
    );

    // Nothing due: the auditor asks the object store nothing, as the server sees it. (The
    // gateway, which probes the store every few seconds, has done its part.)
    drop(gateway);
    let before = moto.requests().len();
    let issued = sum(&novad, "nova_auditor_requests_total");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        moto.requests().len(),
        before,
        "requests while nothing was due"
    );
    assert_eq!(sum(&novad, "nova_auditor_requests_total"), issued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_request_budget_holds_at_the_server_and_the_backlog_shows_as_age() {
    let moto = Moto::start();
    let novad = star(
        &moto,
        &[
            "--auditor-s3-budget",
            "5",
            "--auditor-collect-grace-secs",
            "1",
        ],
    )
    .start();
    let store = bucket(&moto).await;
    let expected = load(&novad, 4, 30).await;

    // Appends are done: from here on only the auditor asks the server anything.
    let window = Duration::from_secs(6);
    let before = moto.requests().len();
    tokio::time::sleep(window).await;
    let issued = moto.requests().len() - before;
    // Five a second, and a second's burst.
    assert!(
        issued <= 5 * window.as_secs() as usize + 5,
        "{issued} requests in {window:?} at --auditor-s3-budget 5"
    );
    assert!(issued > 0, "the auditor had work and issued nothing");
    let age = novad
        .metric("nova_auditor_oldest_due_age_seconds")
        .unwrap_or(0.0);
    assert!(age >= 3.0, "the backlog's age is {age}s");
    assert!(
        novad
            .metric("nova_auditor_request_budget_wait_seconds_total")
            .unwrap_or(0.0)
            > 1.0
    );

    // It gets there in the end, and nothing is lost.
    wait_settled(store.as_ref(), &novad, Duration::from_secs(180)).await;
    let client = client(&novad).await;
    for (name, bodies) in &expected {
        assert_eq!(&read_all(&client, name).await, bodies);
    }
}

/// kill -9 while the auditor settles, merges, trims (s0 by age, s1 by bytes), collects and drops
/// a deleted stream, again and again: no acknowledged record is lost (nor one retention has not
/// trimmed), no entry points at a missing object, and once it has finished no object it wrote is
/// left unreferenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_the_duties_loses_and_leaks_nothing() {
    let moto = Moto::start();
    // Merging every two settled objects, so the rewrite is under way across the kills too.
    let mut novad = star(
        &moto,
        &[
            "--auditor-collect-grace-secs",
            "1",
            "--auditor-rewrite-min-objects",
            "2",
        ],
    )
    .start();
    let store = bucket(&moto).await;
    let mut expected = load(&novad, 5, 40).await;
    let limits = [
        (
            "s0",
            Retention {
                age: Some(Duration::from_secs(2)),
                bytes: None,
            },
        ),
        (
            "s1",
            Retention {
                age: None,
                bytes: Some(2000),
            },
        ),
    ];
    for (name, retention) in limits {
        client(&novad)
            .await
            .reconfigure_stream(name, retention)
            .await
            .unwrap();
    }
    let delays = [150u64, 400, 50, 900, 250, 600, 100, 1200];
    for (round, delay) in delays.into_iter().enumerate() {
        if round == 3 {
            // A delete for the drop duty to work on across the kills.
            client(&novad).await.delete_stream("s4").await.unwrap();
            expected.remove("s4");
        }
        // More appends each round, so settling always has work.
        let more = load_more(&novad, &mut expected, round).await;
        assert!(more > 0);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        novad.kill9();
        novad.restart();
        let client = client(&novad).await;
        for (name, bodies) in &expected {
            let (first, read) = read_retained(&client, name).await;
            assert_eq!(read, bodies[first as usize..], "{name} after kill {round}");
        }
    }
    wait_settled(store.as_ref(), &novad, Duration::from_secs(120)).await;
    // Long enough for s0's records to pass their age.
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_settled(store.as_ref(), &novad, Duration::from_secs(120)).await;
    let client = client(&novad).await;
    for (name, bodies) in &expected {
        let (first, read) = read_retained(&client, name).await;
        assert_eq!(read, bodies[first as usize..], "{name}");
        if limits.iter().any(|(limited, _)| limited == name) {
            assert!(first > 0, "{name} was never trimmed");
        } else {
            assert_eq!(first, 0, "{name} has no retention");
        }
    }
    drop(client);

    // With novad down, its catalog can be read: every entry points at an object that exists, and
    // every settled object is referenced or queued for collection (a deleted stream's objects
    // among them). "Settled" above says nothing is due, not that nothing is queued: what the
    // last minutes' drop, trims and rewrites retired waits out its grace. So novad runs again
    // until the queue has taken all of it, and nothing that was neither referenced nor queued
    // may ever be seen.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let settled = loop {
        novad.terminate(Duration::from_secs(20));
        let audit = audit_catalog(&novad, store.as_ref()).await;
        let waiting: Vec<&String> = audit
            .settled
            .iter()
            .filter(|key| !audit.referenced.contains(*key))
            .collect();
        for key in &waiting {
            assert!(
                audit.queued.contains(*key) || audit.dropping.contains(*key),
                "{key} is settled, and neither referenced nor queued for collection:\n{}",
                novad.log()
            );
        }
        if waiting.is_empty() && audit.dropping_streams == 0 {
            break audit.settled;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still waiting for collection: {waiting:?}, {} deleted streams to drop",
            audit.dropping_streams
        );
        eprintln!(
            "queued for collection, not yet collected: {waiting:?}; {} deleted streams to drop",
            audit.dropping_streams
        );
        novad.restart();
        tokio::time::sleep(Duration::from_secs(2)).await;
        wait_settled(store.as_ref(), &novad, Duration::from_secs(120)).await;
    };
    assert!(
        settled
            .iter()
            .any(|k| parse_data_key(&data_root("nova"), k).is_some_and(|d| d.rewritten)),
        "the rewrite merged nothing: {settled:?}"
    );
}

/// Five more batches on every stream still in `expected`.
async fn load_more(
    novad: &Novad,
    expected: &mut BTreeMap<String, Vec<String>>,
    round: usize,
) -> usize {
    let client = client(novad).await;
    let mut added = 0;
    for (name, bodies) in expected.iter_mut() {
        let producer = Producer::new(client.clone(), name, ProducerConfig::default())
            .await
            .unwrap();
        for b in 0..5 {
            let body = format!("{name}-r{round}-{b}");
            producer.append(Record::new(body.clone())).await.unwrap();
            producer.flush().await.unwrap();
            bodies.push(body);
            added += 1;
        }
        producer.close().await.unwrap();
    }
    added
}

/// Runs the `nova` CLI against `url`; its standard output, or a panic with its error.
fn nova(url: &str, args: &[&str]) -> String {
    succeeded(nova_at(url, args, b""))
}

/// A stream first settled as one object past S3's 5 MiB multipart minimum, then a small one:
/// the rewrite merges the two, and the server records the large one's bytes arriving as an
/// UploadPartCopy, not through the star.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rewrite_copies_large_objects_server_side_as_the_server_records_it() {
    let moto = Moto::start();
    // Flights wait two seconds to settle, so the large records settle as one object.
    let novad = novad_on_s3(&moto, BUCKET)
        .args(["--tail-window-cache-mib", "1", "--flight-linger-ms", "5"])
        .args([
            "--auditor-idle-ms",
            "100",
            "--auditor-settle-after-secs",
            "2",
        ])
        .args(["--auditor-collect-grace-secs", "1"])
        .args(["--auditor-rewrite-min-objects", "2"])
        .start();
    let store = bucket(&moto).await;
    let client = client(&novad).await;
    client.create_stream("big").await.unwrap();
    let producer = Producer::new(client.clone(), "big", ProducerConfig::default())
        .await
        .unwrap();
    let mut expected = Vec::new();
    for i in 0..6 {
        let body = format!("{i:03}{}", "x".repeat(950 * 1024));
        producer.append(Record::new(body.clone())).await.unwrap();
        expected.push(body);
    }
    producer.flush().await.unwrap();
    wait_settled(store.as_ref(), &novad, Duration::from_secs(60)).await;
    let settled = settled_objects(store.as_ref()).await;
    assert_eq!(settled.len(), 1, "{settled:?}");
    assert!(store.head(&settled[0]).await.unwrap().size > 5 << 20);

    moto.start_recording();
    producer.append(Record::new("small")).await.unwrap();
    producer.flush().await.unwrap();
    expected.push("small".into());
    let merged = || async {
        settled_objects(store.as_ref())
            .await
            .iter()
            .any(|k| parse_data_key(&data_root("nova"), k).is_some_and(|d| d.rewritten))
    };
    for _ in 0..300 {
        if merged().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    moto.stop_recording();
    assert!(merged().await, "nothing merged:\n{}", novad.log());
    assert!(
        moto.recorded_part_copies() >= 1,
        "the server recorded no UploadPartCopy"
    );
    assert!(
        novad
            .metric("nova_auditor_copied_bytes_total")
            .unwrap_or(0.0)
            > (5 << 20) as f64
    );
    assert_eq!(read_all(&client, "big").await, expected);
    producer.close().await.unwrap();
}

/// Retention set with the CLI trims the stream's front; `describe` names the first seq; a read
/// below it answers OUT_OF_RANGE with that seq, on the star and on a gateway; reads from it are
/// whole; and a reconfigure to retention by age trims what is older.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_from_the_cli_trims_and_reads_below_are_out_of_range_everywhere() {
    let moto = Moto::start();
    let novad = star(&moto, &["--auditor-collect-grace-secs", "1"]).start();
    let gateway = gateway(&moto, &novad);
    let store = bucket(&moto).await;
    nova(
        &novad.url(),
        &["stream", "create", "logs", "--retention-bytes", "4KiB"],
    );
    let client = client(&novad).await;
    let producer = Producer::new(client.clone(), "logs", ProducerConfig::default())
        .await
        .unwrap();
    // One ~1 KB record per settle window: an object each.
    let bodies: Vec<String> = (0..10)
        .map(|i| format!("{i:02}{}", "y".repeat(1000)))
        .collect();
    for body in &bodies {
        producer.append(Record::new(body.clone())).await.unwrap();
        producer.flush().await.unwrap();
        wait_settled(store.as_ref(), &novad, Duration::from_secs(60)).await;
    }
    for _ in 0..300 {
        if client.describe_stream("logs").await.unwrap().first_seq >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A stream keeps at least its byte limit: four of these records are just short of 4 KiB
    // (with their framing), so five stay.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut first = client.describe_stream("logs").await.unwrap().first_seq;
    assert_eq!(first, 5, "{}", novad.log());
    assert!(nova(&novad.url(), &["stream", "describe", "logs"]).contains("records:        5.."));
    for url in [novad.url(), gateway.url()] {
        let reader = Client::connect(&url).await.unwrap();
        let err = reader.read("logs", 2, 0).await.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::OutOfRange), "{err} via {url}");
        assert_eq!(err.first_seq(), Some(5), "{err} via {url}");
        assert!(
            err.to_string().contains("first available record is 5"),
            "{err}"
        );
        let page = reader.read("logs", 5, 0).await.unwrap();
        let got: Vec<&[u8]> = page.records.iter().map(|r| &r.record.body[..]).collect();
        let want: Vec<&[u8]> = bodies[5..].iter().map(|b| b.as_bytes()).collect();
        assert_eq!(got, want, "via {url}");
        // A read by time asks for what the stream holds from then on: from its first record,
        // not an error about what retention took.
        let page = nova_client::Consumer::new(reader.clone(), "logs", 0)
            .from_time(1)
            .next_page()
            .await
            .unwrap_or_else(|e| panic!("a read by time via {url}: {e}"));
        assert_eq!(page.records.first().map(|r| r.seq), Some(5), "via {url}");
    }

    // By age instead: everything older than a second goes.
    let out = nova(
        &novad.url(),
        &[
            "stream",
            "reconfigure",
            "logs",
            "--retention-age",
            "1s",
            "--retention-bytes",
            "none",
        ],
    );
    assert!(
        out.contains("retention:      age 1s, size no limit"),
        "{out}"
    );
    for _ in 0..300 {
        first = client.describe_stream("logs").await.unwrap().first_seq;
        if first == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(first, 10);
    let err = client.read("logs", 9, 0).await.unwrap_err();
    assert_eq!(err.first_seq(), Some(10));
    producer.close().await.unwrap();
}

/// A stream's records from its first available one to its tail, starting over when retention
/// trims under the read; with the first seq read.
async fn read_retained(client: &Client, name: &str) -> (u64, Vec<String>) {
    'again: loop {
        let first = client.describe_stream(name).await.unwrap().first_seq;
        let (mut next, mut out) = (first, Vec::new());
        loop {
            let page = match client.read(name, next, 0).await {
                Ok(page) => page,
                Err(err) if err.code() == Some(tonic::Code::OutOfRange) => continue 'again,
                Err(err) => panic!("reading {name} at {next}: {err}"),
            };
            for r in &page.records {
                assert_eq!(r.seq, next, "a gap in {name}");
                out.push(String::from_utf8(r.record.body.to_vec()).expect("utf8 body"));
                next += 1;
            }
            if page.records.is_empty() || next >= page.tail_seq {
                return (first, out);
            }
        }
    }
}
