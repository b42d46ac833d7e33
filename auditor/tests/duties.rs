//! The auditor's duties against a real star on a local store and the embedded metastore: what
//! settling and collecting leave behind, that reads see the same records throughout, that a
//! duty cut off anywhere loses and leaks nothing, and that an idle auditor asks nothing.

#![allow(
    clippy::disallowed_methods,
    reason = "a star on a real disk and the real embedded metastore runs on the real clock"
)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use nova_auditor::{Auditor, AuditorConfig};
use nova_chain::Star;
use nova_chain::metrics::Metrics;
use nova_core::catalog::Catalog;
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::keys::{data_root, parse_data_key};
use nova_core::metastore::Metastore;
use nova_core::object_store::ObjectStore;
use nova_testkit::chain::*;

/// The disk, and the one handle on its metastore every star and auditor of a test shares (the
/// embedded metastore is one process's file).
struct World {
    disk: Disk,
    meta: Arc<dyn Metastore>,
}

impl World {
    fn new() -> Self {
        let disk = Disk::new();
        let meta = disk.metastore();
        Self { disk, meta }
    }

    fn catalog(&self) -> Catalog {
        Catalog::new(self.meta.clone())
    }

    async fn star(&self) -> Star {
        Star::open(
            config(),
            self.disk.store(),
            self.meta.clone(),
            Arc::new(Metrics::new()),
        )
        .await
        .unwrap()
    }
}

const STREAMS: usize = 5;

fn auditor_config(disk: &Disk, grace: Duration) -> AuditorConfig {
    AuditorConfig {
        star: STAR.into(),
        s3_budget: 10_000,
        rewrite_mib: 1024,
        workers: 2,
        fetch_cache_bytes: 64 << 20,
        fetch_cache_dir: disk.dir.path().join("fetch-cache"),
        whole_object_max: 8 << 20,
        collect_grace: grace,
        settle_after: Duration::ZERO,
        rewrite_min_objects: nova_auditor::defaults::REWRITE_MIN_OBJECTS as usize,
        sweep_every: Duration::from_secs(3600),
        idle: Duration::from_millis(20),
        clock: Clock::system(),
        entropy: Entropy::from_os(),
    }
}

fn start(world: &World, grace: Duration) -> Auditor {
    start_with(world, auditor_config(&world.disk, grace))
}

fn start_with(world: &World, config: AuditorConfig) -> Auditor {
    Auditor::start(
        config,
        world.disk.store(),
        world.catalog(),
        &prometheus::Registry::new(),
    )
    .unwrap()
}

/// Streams s0.. with records appended interleaved, many per flight; returns each stream's
/// bodies as the writing star served them.
async fn load(world: &World, rounds: usize) -> BTreeMap<String, Vec<String>> {
    load_padded(world, rounds, 0).await
}

/// As `load`, each record padded with `pad` bytes.
async fn load_padded(world: &World, rounds: usize, pad: usize) -> BTreeMap<String, Vec<String>> {
    let padding = "p".repeat(pad);
    let star = world.star().await;
    for i in 0..STREAMS {
        create(&star, &format!("s{i}")).await;
    }
    // Each round's appends share a flight or two; rounds land one after another.
    for round in 0..rounds {
        let mut answers = Vec::new();
        for i in 0..STREAMS {
            let stream = format!("s{i}");
            answers.push(append(&star, &stream, &format!("{stream}-{round}{padding}")).await);
        }
        for reply in answers {
            answer(reply).await.unwrap();
        }
    }
    let mut before = BTreeMap::new();
    for i in 0..STREAMS {
        let stream = format!("s{i}");
        before.insert(stream.clone(), bodies(&star, &stream).await);
    }
    star.shutdown(Duration::from_secs(5)).await.unwrap();
    before
}

async fn read_all(star: &Star) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for i in 0..STREAMS {
        let stream = format!("s{i}");
        out.insert(stream.clone(), bodies(star, &stream).await);
    }
    out
}

/// Chain objects that are flights (not fences or settle markers).
async fn flights(store: &dyn ObjectStore) -> Vec<String> {
    let mut out = Vec::new();
    for object in store.list("chain/", None, 1000).await.unwrap().objects {
        if object.key.contains("/settled-") {
            continue;
        }
        // Collected since the listing: not a flight any more.
        let Ok(footer) = nova_core::flight::fetch_footer(store, &object.key).await else {
            continue;
        };
        if matches!(footer, nova_core::flight::ObjectFooter::Flight(_)) {
            out.push(object.key);
        }
    }
    out
}

async fn data_objects(store: &dyn ObjectStore) -> Vec<String> {
    store
        .list(&data_root(STAR), None, 1000)
        .await
        .unwrap()
        .objects
        .into_iter()
        .map(|o| o.key)
        .collect()
}

/// Every index entry of every stream, checked to point at an object that exists; returns the
/// objects referenced.
async fn check_index(catalog: &Catalog, store: &dyn ObjectStore) -> Vec<String> {
    let mut referenced = Vec::new();
    for (meta, tail) in catalog.load_streams().await.unwrap() {
        let entries = catalog.index_entries(meta.id, 0, 10_000).await.unwrap();
        let mut next = 0;
        for entry in entries {
            assert_eq!(entry.start_seq, next, "index of {} has a gap", meta.name);
            next = entry.end_seq;
            assert!(
                store.head(&entry.object_key).await.is_ok(),
                "{} points at missing {}",
                meta.name,
                entry.object_key
            );
            referenced.push(entry.object_key);
        }
        assert_eq!(next, tail.tail_seq, "index of {} ends short", meta.name);
    }
    referenced
}

async fn wait_settled_and_collected(store: &dyn ObjectStore, catalog: &Catalog) {
    for _ in 0..1000 {
        let settled = flights(store).await.is_empty();
        let collected = catalog.garbage_page(1).await.unwrap().is_empty();
        if settled && collected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the auditor did not settle and collect everything within 20 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_streams_live_in_objects_of_their_own_and_read_the_same() {
    let world = World::new();
    let before = load(&world, 60).await;
    let store = world.disk.store();
    assert!(flights(store.as_ref()).await.len() > 1);
    // A restarted star has nothing in its tail cache: every read comes from the bucket.
    let star = world.star().await;
    let auditor = start(&world, Duration::from_millis(100));
    let catalog = world.catalog();
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    assert_eq!(read_all(&star).await, before);
    // Each stream's records are in objects of its own, every one of them referenced.
    let referenced = check_index(&catalog, store.as_ref()).await;
    let mut data = data_objects(store.as_ref()).await;
    data.sort();
    let mut referenced_sorted = referenced.clone();
    referenced_sorted.sort();
    assert_eq!(data, referenced_sorted, "settled objects nobody references");
    let streams_seen: std::collections::BTreeSet<u64> = data
        .iter()
        .map(|k| parse_data_key(&data_root(STAR), k).unwrap().stream_id)
        .collect();
    assert_eq!(streams_seen.len(), STREAMS);
    assert!(auditor.metrics().settled_flights.get() > 1);

    // Idle now: over half a second the auditor asks the object store nothing.
    let asked = || -> u64 {
        [
            "put",
            "get",
            "head",
            "list",
            "delete",
            "put_if_absent",
            "compose",
        ]
        .iter()
        .map(|op| {
            auditor
                .metrics()
                .store
                .issued
                .with_label_values(&[op])
                .get()
        })
        .sum()
    };
    let idle_from = asked();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(asked(), idle_from, "an idle auditor issued requests");
    assert_eq!(auditor.metrics().oldest_due_age.get(), 0.0);

    // Appends after settling are settled too, and reads span both.
    answer(append(&star, "s0", "late").await).await.unwrap();
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    let mut expected = before["s0"].clone();
    expected.push("late".into());
    assert_eq!(bodies(&star, "s0").await, expected);
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_streams_objects_are_reclaimed() {
    let world = World::new();
    let before = load(&world, 30).await;
    let star = world.star().await;
    let store = world.disk.store();
    let catalog = world.catalog();
    let auditor = start(&world, Duration::from_millis(50));
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    let victim = catalog.stream("s1").await.unwrap().unwrap().id;
    let owned = |keys: &[String]| {
        keys.iter()
            .filter(|k| parse_data_key(&data_root(STAR), k).unwrap().stream_id == victim)
            .count()
    };
    assert!(owned(&data_objects(store.as_ref()).await) > 0);
    star.streams().delete("s1").await.unwrap();
    for _ in 0..1000 {
        if owned(&data_objects(store.as_ref()).await) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        owned(&data_objects(store.as_ref()).await),
        0,
        "s1's objects remain"
    );
    assert!(
        catalog
            .index_entries(victim, 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(auditor.metrics().reclaimed_bytes.get() > 0);
    // The others are untouched.
    for (name, bodies_before) in &before {
        if name != "s1" {
            assert_eq!(&bodies(&star, name).await, bodies_before);
        }
    }
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// An absorb built while a stream was live can land after the stream was deleted and its drop
/// had finished (retried through metastore faults, or applied late by the metastore): it
/// writes the stream's index entries and tail back. The settle must not take them for a live
/// stream's (it would move them into a settled object nothing drops again): it opens the drop
/// again, and the entries, the tail and the flights go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_an_absorb_brings_back_after_a_drop_are_dropped_again() {
    use nova_core::catalog::AbsorbBatch;

    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let star = world.star().await;
    create(&star, "gone").await;
    create(&star, "kept").await;
    for i in 0..3 {
        for stream in ["gone", "kept"] {
            answer(append(&star, stream, &format!("{stream}-{i}")).await)
                .await
                .unwrap();
        }
    }
    let id = catalog.stream("gone").await.unwrap().unwrap().id;
    let mut entries = Vec::new();
    for _ in 0..500 {
        entries = catalog.index_entries(id, 0, 100).await.unwrap();
        if entries.last().is_some_and(|e| e.end_seq == 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(entries.last().map(|e| e.end_seq), Some(3), "not absorbed");
    let tail = catalog.stream_tail(id).await.unwrap();
    star.streams().delete("gone").await.unwrap();
    star.shutdown(Duration::from_secs(5)).await.unwrap();

    // The drop runs to its end; the flights wait (a long settle delay).
    let waiting = AuditorConfig {
        settle_after: Duration::from_secs(3600),
        ..auditor_config(&world.disk, Duration::from_millis(50))
    };
    let auditor = start_with(&world, waiting);
    for _ in 0..500 {
        if catalog.dropping_streams(1).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(catalog.dropping_streams(1).await.unwrap().is_empty());
    assert!(catalog.index_entries(id, 0, 1).await.unwrap().is_empty());
    auditor.stop().await;

    // The late absorb lands.
    let chain = catalog.chain(STAR).await.unwrap().unwrap();
    let late = AbsorbBatch {
        entries,
        tails: vec![(id, tail)],
        ..AbsorbBatch::default()
    };
    catalog
        .absorb(STAR, Some(chain.version), chain.state, late)
        .await
        .unwrap();

    let auditor = start(&world, Duration::from_millis(50));
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    for _ in 0..500 {
        if catalog.index_entries(id, 0, 1).await.unwrap().is_empty()
            && catalog.dropping_streams(1).await.unwrap().is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        catalog.index_entries(id, 0, 1).await.unwrap().is_empty(),
        "the deleted stream's entries stay"
    );
    assert_eq!(
        catalog.stream_tail(id).await.unwrap().tail_seq,
        0,
        "its tail stays"
    );
    let owned: Vec<String> = data_objects(store.as_ref())
        .await
        .into_iter()
        .filter(|k| parse_data_key(&data_root(STAR), k).is_some_and(|d| d.stream_id == id))
        .collect();
    assert!(
        owned.is_empty(),
        "settled objects of the deleted stream: {owned:?}"
    );
    // The live stream reads as before, from what the settle left.
    let star = world.star().await;
    assert_eq!(bodies(&star, "kept").await, ["kept-0", "kept-1", "kept-2"]);
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The auditor stopped at arbitrary points of its jobs (any await: a crash, as far as the
/// catalog and the bucket can tell), again and again until it is done: no record lost, no entry
/// pointing at a missing object, and once it has finished nothing left over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duties_cut_off_anywhere_lose_and_leak_nothing() {
    let world = World::new();
    let before = load(&world, 80).await;
    let store = world.disk.store();
    let catalog = world.catalog();
    let entropy = Entropy::from_os();
    for round in 0..40u64 {
        // Grace zero: whatever is queued may go at once, the harshest case for readers of refs.
        let auditor = start(&world, Duration::ZERO);
        tokio::time::sleep(Duration::from_micros(200 + entropy.below(6000))).await;
        auditor.stop().await;
        check_index(&catalog, store.as_ref()).await;
        if round % 10 == 9 {
            let star = world.star().await;
            assert_eq!(read_all(&star).await, before, "after round {round}");
            star.shutdown(Duration::from_secs(5)).await.unwrap();
        }
    }
    let auditor = start(&world, Duration::ZERO);
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    auditor.stop().await;
    let mut referenced = check_index(&catalog, store.as_ref()).await;
    let mut data = data_objects(store.as_ref()).await;
    referenced.sort();
    data.sort();
    assert_eq!(data, referenced, "objects leaked past a completed pass");
    let star = world.star().await;
    assert_eq!(read_all(&star).await, before);
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The metastore is lost at arbitrary points of the auditor's work and the catalog rebuilt from
/// the bucket: every record reads the same, and an auditor on the rebuilt catalog finishes the
/// job without leaving anything behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_rebuilt_from_the_bucket_mid_settle_reads_the_same() {
    use nova_chain::rebuild::rebuild_catalog;
    use nova_core::metastore::EmbeddedMetastore;

    let entropy = Entropy::from_os();
    for case in 0..4u64 {
        let world = World::new();
        let before = load(&world, 40).await;
        let store = world.disk.store();
        // Part of the work done, cut off somewhere (the last case: all of it).
        let auditor = start(&world, Duration::ZERO);
        if case == 3 {
            wait_settled_and_collected(store.as_ref(), &world.catalog()).await;
        } else {
            tokio::time::sleep(Duration::from_micros(500 + entropy.below(20_000))).await;
        }
        auditor.stop().await;

        let rebuilt = World {
            meta: Arc::new(
                EmbeddedMetastore::open(world.disk.dir.path().join(format!("rebuilt-{case}")))
                    .unwrap(),
            ),
            disk: world.disk,
        };
        let report = rebuild_catalog(STAR, &store, &rebuilt.catalog(), Clock::system())
            .await
            .unwrap();
        let star = rebuilt.star().await;
        assert_eq!(read_all(&star).await, before, "case {case}: {report:?}");
        check_index(&rebuilt.catalog(), store.as_ref()).await;

        let auditor = start(&rebuilt, Duration::ZERO);
        wait_settled_and_collected(store.as_ref(), &rebuilt.catalog()).await;
        auditor.stop().await;
        let mut referenced = check_index(&rebuilt.catalog(), store.as_ref()).await;
        let mut data = data_objects(store.as_ref()).await;
        referenced.sort();
        data.sort();
        assert_eq!(data, referenced, "case {case}: objects left behind");
        assert_eq!(read_all(&star).await, before, "case {case} after settling");
        star.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

/// Absorbed flights of the current epoch wait `settle_after` (unless a window's worth is
/// waiting), so a quiet star settles in larger windows; the wait is not counted as due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flights_wait_settle_after_before_they_are_settled() {
    let world = World::new();
    let star = world.star().await;
    create(&star, "s").await;
    for i in 0..5 {
        answer(append(&star, "s", &format!("r{i}")).await)
            .await
            .unwrap();
    }
    let config = AuditorConfig {
        settle_after: Duration::from_millis(1500),
        ..auditor_config(&world.disk, Duration::from_millis(50))
    };
    let auditor = start_with(&world, config);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        auditor.metrics().settled_flights.get(),
        0,
        "settled too early"
    );
    assert_eq!(
        auditor.metrics().oldest_due_age.get(),
        0.0,
        "waiting is not due"
    );
    let store = world.disk.store();
    wait_settled_and_collected(store.as_ref(), &world.catalog()).await;
    assert!(auditor.metrics().settled_flights.get() >= 5);
    assert_eq!(bodies(&star, "s").await, ["r0", "r1", "r2", "r3", "r4"]);
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A settled object nothing references and nothing writes (a PUT that landed after its intent
/// was collected, or after the catalog was rebuilt) is found by the sweep and collected; one
/// being written is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_collects_settled_objects_nothing_references() {
    let world = World::new();
    let store = world.disk.store();
    let stray = nova_core::keys::data_key(STAR, 9, 0, 10, 7);
    let writing = nova_core::keys::data_key(STAR, 9, 10, 20, 8);
    // A departed star's stray object, swept once (and only once) its prefix is adopted.
    let departed = nova_core::keys::data_key("departed", 9, 20, 30, 9);
    for key in [&stray, &writing, &departed] {
        store
            .put(key, bytes::Bytes::from_static(b"bytes").into())
            .await
            .unwrap();
    }
    // An intent far in the future: the object is being written.
    world
        .catalog()
        .queue_intent(u64::MAX / 2, &writing, 5)
        .await
        .unwrap();
    let config = AuditorConfig {
        sweep_every: Duration::from_millis(200),
        ..auditor_config(&world.disk, Duration::from_millis(50))
    };
    let auditor = start_with(&world, config);
    for _ in 0..500 {
        if store.head(&stray).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(store.head(&stray).await.is_err(), "the stray object stays");
    assert!(
        store.head(&writing).await.is_ok(),
        "an object being written went"
    );
    assert!(auditor.metrics().swept_objects.get() >= 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        store.head(&departed).await.is_ok(),
        "another star's prefix was swept without adopting it"
    );
    auditor.adoptions().set(["departed".to_owned()]);
    for _ in 0..500 {
        if store.head(&departed).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        store.head(&departed).await.is_err(),
        "the adopted star's stray object stays"
    );
    auditor.stop().await;
}

/// What a PUT that timed out left landing after its run was collected is swept, in this
/// star's chain and in an adopted star's chain and trim markers: in an epoch past, every slot
/// but its fence (slot 0 in an epoch without a marker) and every settle marker but its last;
/// in the epoch being collected, what the collector has passed. While the queue may still hold
/// a slot, it is not queued again; once the queue has nothing left of the chain, everything
/// below the settle cursor goes. Nothing at or past the cursor is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_collects_chain_leftovers_below_the_settle_cursor() {
    use nova_core::catalog::{Garbage, SettleCursor};
    use nova_core::keys::{TrimMarker, settle_marker_key, slot_key, trim_marker_key};

    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let now = Clock::system().unix_ms();
    // Something of the chains' still queued, due before their latest due time: the sweep
    // goes only as far as the collector has collected.
    let waiting = Garbage::Object {
        key: "elsewhere".into(),
        bytes: 0,
    };
    let held = catalog
        .queue_garbage(&[(now + 60_000, waiting)])
        .await
        .unwrap();
    let (mut stray, mut queued, mut kept) = (Vec::new(), Vec::new(), Vec::new());
    let mut fences = Vec::new();
    for star in [STAR, "departed"] {
        // Epoch 1 ended: settled through slot 4, fenced at 5; slot 7 was never acknowledged.
        // Epoch 2 is the cursor's, at slot 5, and collected through slot 2 (the run queued
        // here); slot 3 and the marker slot 3's run superseded may still be queued. Epoch 3 is
        // not reached yet.
        // Epoch 0 has no marker. In this star's chain it had nothing to settle: fenced at
        // slot 0, and slot 2's PUT landed after the fence. In the departed one slot 0 is no
        // fence (its markers are not what a settle leaves), so the epoch is left alone.
        if star == STAR {
            fences.push(slot_key(star, 0, 0));
            stray.push(slot_key(star, 0, 2));
        } else {
            kept.extend([slot_key(star, 0, 0), slot_key(star, 0, 2)]);
        }
        stray.extend([
            slot_key(star, 1, 3),
            slot_key(star, 1, 7),
            settle_marker_key(star, 1, 2),
            slot_key(star, 2, 1),
            settle_marker_key(star, 2, 1),
        ]);
        queued.extend([slot_key(star, 2, 3), settle_marker_key(star, 2, 2)]);
        kept.extend([
            slot_key(star, 1, 5),
            settle_marker_key(star, 1, 4),
            slot_key(star, 2, 5),
            slot_key(star, 2, 6),
            settle_marker_key(star, 2, 4),
            slot_key(star, 3, 0),
        ]);
        // The departed chain's latest due time is earlier: once all it queued is collected,
        // what this star's chain has queued (later) does not hold it back.
        let last_due_ms = if star == STAR {
            now + 90_000
        } else {
            now + 85_000
        };
        let cursor = SettleCursor {
            epoch: 2,
            next_slot: 5,
            last_due_ms,
        };
        let run = Garbage::ChainSlots {
            star: star.to_owned(),
            epoch: 2,
            from: 0,
            to: 2,
            bytes: 0,
        };
        catalog
            .advance_settle(star, None, cursor, &[(0, run)])
            .await
            .unwrap();
    }
    // A trim marker of a stream that no longer exists, under the departed star's prefix.
    let marker = TrimMarker {
        after: 10,
        committed: 0,
    };
    stray.push(trim_marker_key("departed", 9, marker));
    for key in stray.iter().chain(&queued).chain(&kept) {
        store
            .put(key, bytes::Bytes::from_static(b"bytes").into())
            .await
            .unwrap();
    }
    for key in &fences {
        let fence = nova_core::flight::FenceInfo {
            star: STAR.to_owned(),
            epoch: 0,
            slot: 0,
            fenced_by: STAR.to_owned(),
            fenced_at_ms: now,
        };
        let bytes = nova_core::flight::encode_fence(&fence);
        store.put(key, bytes.into()).await.unwrap();
    }
    let config = AuditorConfig {
        sweep_every: Duration::from_millis(200),
        ..auditor_config(&world.disk, Duration::from_millis(50))
    };
    let auditor = start_with(&world, config);
    auditor.adoptions().set(["departed".to_owned()]);
    // Waits until every key of `keys` is queued for collection or gone.
    let taken = |keys: Vec<String>| {
        let (store, catalog) = (store.clone(), catalog.clone());
        async move {
            let mut left = Vec::new();
            for _ in 0..500 {
                let queue: Vec<String> = catalog
                    .garbage_page(1000)
                    .await
                    .unwrap()
                    .into_iter()
                    .filter_map(|q| match q.item {
                        Garbage::Object { key, .. } => Some(key),
                        _ => None,
                    })
                    .collect();
                left.clear();
                for key in &keys {
                    if !queue.contains(key) && store.head(key).await.is_ok() {
                        left.push(key.clone());
                    }
                }
                if left.is_empty() {
                    return queue;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("neither queued nor gone: {left:?}");
        }
    };
    taken(stray).await;
    // Two passes more, to see that what the queue may still hold is not queued again.
    let passes = auditor.metrics().sweeps.get();
    while auditor.metrics().sweeps.get() < passes + 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let queue = taken(Vec::new()).await;
    for key in queued.iter().chain(&kept).chain(&fences) {
        assert!(!queue.contains(key), "{key} was queued");
        assert!(store.head(key).await.is_ok(), "{key} went");
    }
    // Once the collector has gone through everything queued, the rest below the cursor goes.
    // The collector is played here by forgetting whatever is queued, as often as the sweep
    // queues more: the queue is shared, so one chain's leftovers, queued first, hold the other
    // chain back until they are collected too.
    let page = catalog.garbage_page(1000).await.unwrap();
    assert!(page.iter().any(|q| (q.key.clone(), q.version) == held[0]));
    let mut seen = HashSet::new();
    for _ in 0..500 {
        for waiting in catalog.garbage_page(1000).await.unwrap() {
            if let Garbage::Object { key, .. } = &waiting.item {
                seen.insert(key.clone());
            }
            catalog.forget_garbage(&waiting).await.unwrap();
        }
        if queued.iter().all(|key| seen.contains(key)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let missed: Vec<_> = queued.iter().filter(|key| !seen.contains(*key)).collect();
    assert!(missed.is_empty(), "never queued: {missed:?}");
    for key in kept.iter().chain(&fences) {
        assert!(!seen.contains(key), "{key} was queued");
        assert!(store.head(key).await.is_ok(), "{key} went");
    }
    auditor.stop().await;
}

/// The objects one stream's index entries reference, in order, each once.
async fn objects_of(catalog: &Catalog, stream: &str) -> Vec<String> {
    let id = catalog.stream(stream).await.unwrap().unwrap().id;
    let mut out: Vec<String> = Vec::new();
    for entry in catalog.index_entries(id, 0, 10_000).await.unwrap() {
        if out.last() != Some(&entry.object_key) {
            out.push(entry.object_key);
        }
    }
    out
}

/// A stream settled window after window ends up in few objects: small settled objects merge
/// into one, a settled object past S3's multipart minimum is copied into it by the store rather
/// than through the auditor, merged objects are never merged again, and every read returns the
/// same records before, during and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_settled_objects_merge_and_large_ones_are_copied() {
    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let star = world.star().await;
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for stream in ["big", "quiet"] {
        create(&star, stream).await;
    }
    // First "big" gets one settled object of six ~950 KiB records: over 5 MiB, so a copy.
    for i in 0..6 {
        let body = format!("{i:03}{}", "x".repeat(950 * 1024));
        answer(append(&star, "big", &body).await).await.unwrap();
        expected.entry("big".into()).or_default().push(body);
    }
    let auditor = start(&world, Duration::from_millis(50));
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    // Then window after window of one small record each.
    for phase in 0..17 {
        for stream in ["big", "quiet"] {
            let body = format!("{stream}-{phase}");
            answer(append(&star, stream, &body).await).await.unwrap();
            expected.entry(stream.into()).or_default().push(body);
        }
        wait_settled_and_collected(store.as_ref(), &catalog).await;
        assert_eq!(bodies(&star, "quiet").await, expected["quiet"]);
    }
    let root = data_root(STAR);
    let rewritten = |key: &String| parse_data_key(&root, key).is_some_and(|d| d.rewritten);
    for _ in 0..1000 {
        let big = objects_of(&catalog, "big").await;
        let quiet = objects_of(&catalog, "quiet").await;
        // Each merges as soon as 16 objects wait; what settles after that waits for more.
        let merged =
            |objects: &[String]| objects.len() <= 3 && objects.first().is_some_and(rewritten);
        if merged(&big) && merged(&quiet) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for stream in ["big", "quiet"] {
        let objects = objects_of(&catalog, stream).await;
        assert!(
            objects.len() <= 3 && objects.first().is_some_and(rewritten),
            "{stream} is still in {} objects: {objects:?}",
            objects.len()
        );
        assert_eq!(bodies(&star, stream).await, expected[stream]);
    }
    let copied = auditor.metrics().copied_bytes.get();
    assert!(copied > 5 << 20, "the large object was copied: {copied}");
    assert!(auditor.metrics().rewritten_objects.get() >= 30);
    // The sources go once their grace is over; every entry points at an object that exists and
    // nothing else is left.
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    let mut referenced = check_index(&catalog, store.as_ref()).await;
    referenced.sort();
    referenced.dedup();
    let mut data = data_objects(store.as_ref()).await;
    data.sort();
    assert_eq!(data, referenced);
    // Merged objects stay as they are: another pass finds nothing to do.
    let written = auditor
        .metrics()
        .written_objects
        .with_label_values(&["rewrite"])
        .get();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        auditor
            .metrics()
            .written_objects
            .with_label_values(&["rewrite"])
            .get(),
        written
    );
    // A restarted star reads the merged objects from the bucket alone.
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
    let star = world.star().await;
    for stream in ["big", "quiet"] {
        assert_eq!(bodies(&star, stream).await, expected[stream]);
    }
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Retention trims a stream from the front, an object at a time: by bytes down to what the
/// limit keeps, by age everything older than the limit. Reads below the trim point are told the
/// first record still held; reads from it return what was appended; a stream without retention
/// keeps everything; the trimmed objects are collected; and a catalog rebuilt from the bucket
/// alone knows every trim point, a stream trimmed to nothing included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_by_bytes_and_by_age_and_reads_below_are_out_of_range() {
    use nova_core::catalog::{Retention, StorageClass};
    use nova_proto::RequestError;
    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let star = world.star().await;
    let limits = [
        (
            "sized",
            Retention {
                age_ms: None,
                bytes: Some(3000),
            },
        ),
        (
            "aged",
            Retention {
                age_ms: Some(1500),
                bytes: None,
            },
        ),
        (
            "emptied",
            Retention {
                age_ms: Some(1500),
                bytes: None,
            },
        ),
        ("forever", Retention::default()),
    ];
    for (name, retention) in limits {
        star.streams()
            .create_with(name, StorageClass::Standard, retention)
            .await
            .unwrap();
    }
    let auditor = start(&world, Duration::from_millis(50));
    let body = |stream: &str, i: usize| format!("{stream}-{i}-{}", "x".repeat(1000));
    // Eight settle windows of one ~1 KB record each: one object per stream per window.
    for i in 0..8 {
        for (name, _) in limits {
            answer(append(&star, name, &body(name, i)).await)
                .await
                .unwrap();
        }
        wait_settled_and_collected(store.as_ref(), &catalog).await;
    }
    let id = |name: &str| star.streams().get(name).unwrap().id();
    let wait_first = |name: &'static str, at_least: u64| {
        let catalog = world.catalog();
        let id = id(name);
        async move {
            for _ in 0..500 {
                if catalog.first_seq(id).await.unwrap() >= at_least {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("{name} was not trimmed to {at_least} within 10 s");
        }
    };
    // By bytes: 3000 bytes are three of these records and a bit; the fourth from the end goes
    // once the stream holds 3000 bytes without it.
    wait_first("sized", 5).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = catalog.first_seq(id("sized")).await.unwrap();
    assert_eq!(
        first, 5,
        "sized keeps the three records that hold at least 3000 bytes"
    );
    let sized = star.streams().get("sized").unwrap();
    match star.read(&sized, 2, 100, 1 << 20).await {
        Err(RequestError::Trimmed { first_seq, seq, .. }) => {
            assert_eq!((first_seq, seq), (5, 2));
        }
        other => panic!("a read below the trim point answered {other:?}"),
    }
    let page = star.read(&sized, 5, 100, 1 << 20).await.unwrap();
    let kept: Vec<String> = page
        .records
        .iter()
        .map(|r| String::from_utf8_lossy(&r.record.body).into_owned())
        .collect();
    assert_eq!(kept, (5..8).map(|i| body("sized", i)).collect::<Vec<_>>());
    // By age: everything appended more than 1.5 s ago goes; a new record stays.
    wait_first("aged", 8).await;
    wait_first("emptied", 8).await;
    answer(append(&star, "aged", &body("aged", 8)).await)
        .await
        .unwrap();
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    let aged = star.streams().get("aged").unwrap();
    let page = star.read(&aged, 8, 100, 1 << 20).await.unwrap();
    assert_eq!(page.records.len(), 1);
    assert_eq!(catalog.first_seq(id("aged")).await.unwrap(), 8);
    assert!(matches!(
        star.read(&aged, 0, 100, 1 << 20).await,
        Err(RequestError::Trimmed { first_seq: 8, .. })
    ));
    // Without retention nothing goes.
    assert_eq!(catalog.first_seq(id("forever")).await.unwrap(), 0);
    assert_eq!(bodies(&star, "forever").await.len(), 8);
    let trimmed = |reason: &str| {
        auditor
            .metrics()
            .trimmed_bytes
            .with_label_values(&[reason])
            .get()
    };
    assert!(trimmed("bytes") >= 5000 && trimmed("age") >= 8000);
    // The trimmed objects are collected, and nothing else is left.
    wait_settled_and_collected(store.as_ref(), &catalog).await;
    let mut data = data_objects(store.as_ref()).await;
    data.sort();
    let mut referenced: Vec<String> = Vec::new();
    for name in ["sized", "aged", "emptied", "forever"] {
        let first = catalog.first_seq(id(name)).await.unwrap();
        for entry in catalog.index_entries(id(name), first, 100).await.unwrap() {
            assert!(store.head(&entry.object_key).await.is_ok());
            referenced.push(entry.object_key);
        }
    }
    referenced.sort();
    referenced.dedup();
    assert_eq!(data, referenced);
    auditor.stop().await;
    // A restarted star still refuses reads below the trim point.
    star.shutdown(Duration::from_secs(5)).await.unwrap();
    let star = world.star().await;
    let sized = star.streams().get("sized").unwrap();
    assert!(matches!(
        star.read(&sized, 0, 100, 1 << 20).await,
        Err(RequestError::Trimmed { first_seq: 5, .. })
    ));
    star.shutdown(Duration::from_secs(5)).await.unwrap();
    // The catalog rebuilt from the bucket alone: every stream starts where it was trimmed, the
    // emptied one included (its next record is 8, not 0), and reads are as before.
    let rebuilt = World {
        meta: Arc::new(
            nova_core::metastore::EmbeddedMetastore::open(world.disk.dir.path().join("rebuilt"))
                .unwrap(),
        ),
        disk: world.disk,
    };
    nova_chain::rebuild::rebuild_catalog(STAR, &store, &rebuilt.catalog(), Clock::system())
        .await
        .unwrap();
    let star = rebuilt.star().await;
    for (name, first, tail) in [
        ("sized", 5, 8),
        ("aged", 8, 9),
        ("emptied", 8, 8),
        ("forever", 0, 8),
    ] {
        let state = star.streams().get(name).unwrap();
        assert_eq!(state.tail(), tail, "{name}'s tail");
        assert_eq!(
            star.first_seq(&state).await.unwrap(),
            first,
            "{name}'s first seq"
        );
        if first > 0 {
            assert!(matches!(
                star.read(&state, first - 1, 100, 1 << 20).await,
                Err(RequestError::Trimmed { .. })
            ));
        }
    }
    assert_eq!(
        bodies(&star, "forever").await,
        (0..8).map(|i| body("forever", i)).collect::<Vec<_>>()
    );
    let reply = answer(append(&star, "emptied", "next").await)
        .await
        .unwrap();
    assert_eq!(
        (reply.start, reply.end),
        (8, 9),
        "the emptied stream carries on at 8"
    );
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// In a fleet a stream's settled objects sit under the prefixes of the stars that settled them;
/// another star's retention trimming them queues them too, so they are collected without
/// waiting for the owner's sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_collects_objects_under_another_stars_prefix() {
    use nova_core::catalog::Retention;
    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let star = world.star().await;
    star.streams()
        .create("moved", nova_core::catalog::StorageClass::Standard)
        .await
        .unwrap();
    // Settled by this star's auditor: objects under data/{STAR}/.
    let owner = start(&world, Duration::from_millis(50));
    for i in 0..4 {
        answer(append(&star, "moved", &format!("{i}-{}", "x".repeat(1000))).await)
            .await
            .unwrap();
        wait_settled_and_collected(store.as_ref(), &catalog).await;
    }
    owner.stop().await;
    let settled = data_objects(store.as_ref()).await;
    assert!(settled.len() >= 2, "{settled:?}");
    // Another star's auditor trims the stream to nothing (by age).
    star.streams()
        .set_retention(
            "moved",
            Retention {
                age_ms: Some(1),
                bytes: None,
            },
        )
        .await
        .unwrap();
    let config = AuditorConfig {
        star: "another".into(),
        ..auditor_config(&world.disk, Duration::from_millis(50))
    };
    let other = start_with(&world, config);
    for _ in 0..500 {
        if data_objects(store.as_ref()).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        data_objects(store.as_ref()).await,
        Vec::<String>::new(),
        "objects trimmed by another star stay"
    );
    assert!(other.metrics().trimmed_records.get() >= 4);
    other.stop().await;
}

/// An auditor whose wall clock is an hour ahead takes every record for old. Retention by age
/// asks the store's clock too (each object's Last-Modified against a probe's), so nothing is
/// trimmed until the store agrees the age has passed; the refusals are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_by_age_waits_for_the_store_clock_to_agree() {
    use nova_core::catalog::{Retention, StorageClass};
    use std::time::SystemTime;
    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let star = world.star().await;
    let retention = Retention {
        age_ms: Some(3000),
        bytes: None,
    };
    star.streams()
        .create_with("aged", StorageClass::Standard, retention)
        .await
        .unwrap();
    let mut config = auditor_config(&world.disk, Duration::from_millis(50));
    // Not paused: this clock runs at the real pace, an hour ahead of the star's.
    config.clock = Clock::simulated(SystemTime::now() + Duration::from_secs(3600));
    let auditor = start_with(&world, config);
    let written = std::time::Instant::now();
    for i in 0..3 {
        answer(append(&star, "aged", &format!("{i}-{}", "x".repeat(1000))).await)
            .await
            .unwrap();
        wait_settled_and_collected(store.as_ref(), &catalog).await;
    }
    let id = star.streams().get("aged").unwrap().id();
    let refused = || {
        auditor
            .metrics()
            .refused_trims
            .with_label_values(&["clock"])
            .get()
    };
    for _ in 0..250 {
        if refused() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused() > 0, "no trim was refused for the clock");
    assert!(
        written.elapsed() < Duration::from_secs(3),
        "too slow to tell: the records are really old by now"
    );
    assert_eq!(catalog.first_seq(id).await.unwrap(), 0, "trimmed too early");
    // Once the store's clock also says three seconds passed (and a second for its grain),
    // the records go.
    for _ in 0..500 {
        if catalog.first_seq(id).await.unwrap() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(catalog.first_seq(id).await.unwrap(), 3);
    assert!(
        written.elapsed() >= Duration::from_secs(3),
        "trimmed before the store's clock said the age had passed"
    );
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Deletions queued by a clock an hour ahead would wait an hour, unseen by the due age: the
/// collector brings them back to what an honest clock would date them now and two minutes,
/// keeping their order. A clock that is behind (an hour, here) does not take honest items for
/// future ones: it judges by the later of its own clock and the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_dated_by_a_clock_far_ahead_are_brought_back() {
    use nova_core::catalog::Garbage;
    use std::time::SystemTime;
    let world = World::new();
    let store = world.disk.store();
    let catalog = world.catalog();
    let now = Clock::system().unix_ms();
    // Due within what an honest clock gives an intent queued now (a second and a second).
    let honest_due = now + 1_500;
    let items = [
        (now + 3_600_000, "junk/ahead-0"),
        (now + 3_600_000, "junk/ahead-1"),
        (now + 3_600_050, "junk/ahead-2"),
        (honest_due, "junk/honest"),
    ];
    for (due, key) in items {
        store
            .put(key, bytes::Bytes::from_static(b"x").into())
            .await
            .unwrap();
        let item = Garbage::Object {
            key: key.into(),
            bytes: 1,
        };
        catalog.queue_garbage(&[(due, item)]).await.unwrap();
    }
    let queued = || async {
        catalog
            .garbage_page(10)
            .await
            .unwrap()
            .into_iter()
            .map(|q| match q.item {
                Garbage::Object { key, .. } => (q.due_ms, key),
                other => panic!("{other:?} queued"),
            })
            .collect::<Vec<_>>()
    };
    // An hour behind: the hour-ahead items are two hours ahead to it, and brought back (it
    // does not collect them: by its clock nothing is due yet); the honest one stays as it is.
    let mut config = auditor_config(&world.disk, Duration::from_millis(50));
    config.clock = Clock::simulated(SystemTime::now() - Duration::from_secs(3600));
    let behind = start_with(&world, config);
    for _ in 0..250 {
        if behind.metrics().redated_garbage.get() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(behind.metrics().redated_garbage.get(), 3);
    behind.stop().await;
    let after = queued().await;
    let keys: Vec<&str> = after.iter().map(|(_, key)| key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "junk/honest",
            "junk/ahead-0",
            "junk/ahead-1",
            "junk/ahead-2"
        ],
        "the order changed: {after:?}"
    );
    assert_eq!(after[0].0, honest_due, "an honest item was re-dated");
    // Back to just past what an honest clock gives an intent now (two seconds here) and the
    // two-minute allowance.
    assert!(
        after[1].0 > now + 120_000 && after[3].0 < now + 130_000,
        "not brought back to the allowance: {after:?}"
    );
    // Nothing went before its (new) time.
    let pending: Vec<String> = after[1..].iter().map(|(_, key)| key.clone()).collect();
    for key in pending {
        assert!(store.head(&key).await.is_ok(), "{key} went before its time");
    }
}

/// The rewrite byte rate (`--auditor-rewrite-mib`) and the worker bound (`--auditor-workers`)
/// hold: at 1 MiB a second, settling about 4 MiB takes seconds and is counted as waiting on
/// the rewrite budget, and with one worker no two jobs ever run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rewrite_byte_rate_and_the_worker_bound_hold() {
    let world = World::new();
    // 5 streams × 16 rounds × 48 KiB ≈ 3.75 MiB to settle.
    let before = load_padded(&world, 16, 48 << 10).await;
    let star = world.star().await;
    let config = AuditorConfig {
        rewrite_mib: 1,
        workers: 1,
        ..auditor_config(&world.disk, Duration::from_millis(100))
    };
    let started = std::time::Instant::now();
    let auditor = start_with(&world, config);
    let busiest = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let sampling = {
        let busy = auditor.metrics().workers_busy.clone();
        let busiest = busiest.clone();
        tokio::spawn(async move {
            loop {
                busiest.fetch_max(busy.get(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let store = world.disk.store();
    wait_settled_and_collected(store.as_ref(), &world.catalog()).await;
    let took = started.elapsed();
    sampling.abort();
    assert_eq!(read_all(&star).await, before);
    let waited = |budget: &str| {
        auditor
            .metrics()
            .budget_wait_seconds
            .with_label_values(&[budget])
            .get()
    };
    // A second's burst is allowed; the rest of the ~3.75 MiB waits for the rate.
    assert!(
        waited("rewrite_bytes") >= 1.0 && took >= Duration::from_secs(2),
        "the rewrite rate held: waited {}s, settled in {took:?}",
        waited("rewrite_bytes")
    );
    assert_eq!(
        busiest.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one worker: never more than one job at once"
    );
    assert_eq!(auditor.metrics().workers.get(), 1);
    auditor.stop().await;
    star.shutdown(Duration::from_secs(5)).await.unwrap();
}
