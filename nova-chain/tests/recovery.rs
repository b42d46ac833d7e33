//! Recovery settles the chain a star left behind: it absorbs the slots past the checkpoint in
//! order, fences the first empty slot so a stale writer can never land it, leaves slots past the
//! gap (never acknowledged) alone, and starts a fresh epoch.

use std::sync::Arc;

use bytes::Bytes;

use nova_chain::metrics::Metrics;
use nova_chain::{ChainConfig, Star};
use nova_core::catalog::{AbsorbBatch, Catalog, ChainState, IndexEntry, StorageClass, StreamTail};
use nova_core::flight::section::encode_fragment;
use nova_core::flight::{FlightMeta, ObjectFooter, SectionInput, assemble_flight, fetch_footer};
use nova_core::keys::slot_key;
use nova_core::metastore::EmbeddedMetastore;
use nova_core::object_store::{CreateOutcome, LocalStore, ObjectStore, PutPayload, StoreLimits};
use nova_core::record::Record;

fn flight(
    star: &str,
    epoch: u64,
    slot: u64,
    stream_id: u64,
    start: u64,
    bodies: &[&str],
) -> PutPayload {
    let records: Vec<Record> = bodies
        .iter()
        .map(|b| Record {
            timestamp: 7,
            headers: vec![],
            body: Bytes::from(b.to_string()),
        })
        .collect();
    let (payload, _) = assemble_flight(
        FlightMeta {
            star: star.into(),
            epoch,
            slot,
            created_at_ms: 1,
        },
        vec![SectionInput {
            stream_id,
            stream: "s".into(),
            start_seq: start,
            fragments: vec![encode_fragment(records.iter())],
        }],
    );
    payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_past_the_checkpoint_are_settled_up_to_the_first_gap_which_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let meta_path = dir.path().join("meta.redb");
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path().join("store"), StoreLimits::default()).unwrap());
    let star = "star-a";
    // The state a crashed star leaves: a stream, a chain at epoch 4 with slot 0 absorbed,
    // slots 1 and 2 written (acknowledged, not absorbed), slot 3 never written, slot 4 written
    // by a flight whose predecessor never landed (so it was never acknowledged).
    let stream_id = {
        let metastore = Arc::new(EmbeddedMetastore::open(&meta_path).unwrap());
        let catalog = Catalog::new(metastore);
        let stream = catalog
            .create_stream("s", StorageClass::Standard, 1)
            .await
            .unwrap();
        let chain = catalog
            .set_chain(
                star,
                None,
                ChainState {
                    epoch: 4,
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        let absorbed = flight(star, 4, 0, stream.id, 0, &["a", "b"]);
        store.put(&slot_key(star, 4, 0), absorbed).await.unwrap();
        let ObjectFooter::Flight(footer) = fetch_footer(store.as_ref(), &slot_key(star, 4, 0))
            .await
            .unwrap()
        else {
            panic!("a flight");
        };
        let section = &footer.sections[0];
        let entry = IndexEntry {
            stream_id: stream.id,
            start_seq: 0,
            end_seq: 2,
            object_key: slot_key(star, 4, 0),
            offset: section.offset,
            len: section.len,
            crc32c: section.crc32c,
            created_at_ms: footer.meta.created_at_ms,
        };
        let tail = StreamTail {
            tail_seq: 2,
            stored_bytes: section.len,
        };
        catalog
            .absorb(
                star,
                Some(chain.version),
                ChainState {
                    epoch: 4,
                    checkpoint: Some(0),
                },
                AbsorbBatch {
                    entries: vec![entry],
                    tails: vec![(stream.id, tail)],
                    ..AbsorbBatch::default()
                },
            )
            .await
            .unwrap();
        store
            .put(
                &slot_key(star, 4, 1),
                flight(star, 4, 1, stream.id, 2, &["c"]),
            )
            .await
            .unwrap();
        store
            .put(
                &slot_key(star, 4, 2),
                flight(star, 4, 2, stream.id, 3, &["d", "e"]),
            )
            .await
            .unwrap();
        store
            .put(
                &slot_key(star, 4, 4),
                flight(star, 4, 4, stream.id, 9, &["orphan"]),
            )
            .await
            .unwrap();
        stream.id
    };

    let metastore = Arc::new(EmbeddedMetastore::open(&meta_path).unwrap());
    let config = ChainConfig {
        star: star.into(),
        ..ChainConfig::default()
    };
    let opened = Star::open(config, store.clone(), metastore, Arc::new(Metrics::new()))
        .await
        .unwrap();
    assert_eq!(opened.recovered().settled_flights, 2);
    assert_eq!(opened.recovered().orphaned_slots, 1);
    assert_eq!(opened.epoch(), 5, "a fresh epoch");
    let stream = opened.streams().get("s").unwrap();
    assert_eq!(stream.id(), stream_id);
    assert_eq!(stream.tail(), 5, "settled up to the gap, nothing past it");
    let page = opened.read(&stream, 0, 100, 1 << 20).await.unwrap();
    let bodies: Vec<_> = page.records.iter().map(|r| r.record.body.clone()).collect();
    assert_eq!(bodies, ["a", "b", "c", "d", "e"]);

    // The gap is fenced: the old incarnation's write to slot 3 can never land.
    let late = store
        .put_if_absent(
            &slot_key(star, 4, 3),
            flight(star, 4, 3, stream_id, 5, &["late"]),
        )
        .await
        .unwrap();
    assert_eq!(late, CreateOutcome::AlreadyExists);
    assert!(matches!(
        fetch_footer(store.as_ref(), &slot_key(star, 4, 3))
            .await
            .unwrap(),
        ObjectFooter::Fence(_)
    ));
}

fn records(bodies: &[&str]) -> Vec<Record> {
    bodies
        .iter()
        .map(|b| Record {
            timestamp: 7,
            headers: vec![],
            body: Bytes::from(b.to_string()),
        })
        .collect()
}

/// A catalog holding `streams` and a chain for `star` at epoch 1, as a star left it before
/// writing anything; returns the streams' ids.
async fn catalog_with_chain(dir: &std::path::Path, star: &str, streams: &[&str]) -> Vec<u64> {
    let catalog = Catalog::new(Arc::new(
        EmbeddedMetastore::open(dir.join("meta.redb")).unwrap(),
    ));
    let mut ids = Vec::new();
    for name in streams {
        let meta = catalog
            .create_stream(name, StorageClass::Standard, 1)
            .await
            .unwrap();
        ids.push(meta.id);
    }
    catalog
        .set_chain(
            star,
            None,
            ChainState {
                epoch: 1,
                checkpoint: None,
            },
        )
        .await
        .unwrap();
    ids
}

async fn open_star(
    dir: &std::path::Path,
    store: Arc<dyn ObjectStore>,
    star: &str,
) -> Result<Star, nova_chain::StartError> {
    let metastore = Arc::new(EmbeddedMetastore::open(dir.join("meta.redb")).unwrap());
    let config = ChainConfig {
        star: star.into(),
        ..ChainConfig::default()
    };
    Star::open(config, store, metastore, Arc::new(Metrics::new())).await
}

/// A stream that wrote more than one section into a flight (over 1 MiB, or one large batch)
/// has each section continue the previous one. Recovery used to compare every section with the
/// absorbed tail and refused to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_with_several_sections_of_one_stream_is_settled() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path().join("store"), StoreLimits::default()).unwrap());
    let star = "star-b";
    let ids = catalog_with_chain(dir.path(), star, &["s", "t"]).await;
    let (s_id, t_id) = (ids[0], ids[1]);
    let section = |stream_id, name: &str, start, bodies: &[&str]| SectionInput {
        stream_id,
        stream: name.into(),
        start_seq: start,
        fragments: vec![encode_fragment(records(bodies).iter())],
    };
    let meta = |slot| FlightMeta {
        star: star.into(),
        epoch: 1,
        slot,
        created_at_ms: 1,
    };
    let (first, footer) = assemble_flight(
        meta(0),
        vec![
            section(s_id, "s", 0, &["a", "b"]),
            section(t_id, "t", 0, &["x"]),
            section(s_id, "s", 2, &["c"]),
        ],
    );
    let s_bytes: u64 = footer
        .sections
        .iter()
        .filter(|e| e.stream_id == s_id)
        .map(|e| e.len)
        .sum();
    store.put(&slot_key(star, 1, 0), first).await.unwrap();
    let (second, _) = assemble_flight(
        meta(1),
        vec![
            section(s_id, "s", 3, &["d"]),
            section(s_id, "s", 4, &["e", "f"]),
        ],
    );
    store.put(&slot_key(star, 1, 1), second).await.unwrap();

    let opened = open_star(dir.path(), store.clone(), star)
        .await
        .expect("recovery settles flights with several sections of one stream");
    assert_eq!(opened.recovered().settled_flights, 2);
    let s = opened.streams().get("s").unwrap();
    let t = opened.streams().get("t").unwrap();
    assert_eq!((s.tail(), t.tail()), (6, 1));
    let page = opened.read(&s, 0, 100, 1 << 20).await.unwrap();
    let bodies: Vec<_> = page.records.iter().map(|r| r.record.body.clone()).collect();
    assert_eq!(bodies, ["a", "b", "c", "d", "e", "f"]);
    assert!(
        s.stored_bytes() > s_bytes,
        "stored bytes count every section of both flights"
    );
    opened
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop(opened);

    // The tails were recorded in the catalog too: a second restart finds the same.
    let again = open_star(dir.path(), store, star).await.unwrap();
    let s2 = again.streams().get("s").unwrap();
    assert_eq!(s2.tail(), 6);
    assert_eq!(s2.stored_bytes(), s.stored_bytes());
}

/// A flight whose footer names another chain's slot is never adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_written_for_another_slot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path().join("store"), StoreLimits::default()).unwrap());
    let star = "star-c";
    let s_id = catalog_with_chain(dir.path(), star, &["s"]).await[0];
    // Another star's flight, copied under this star's first slot.
    store
        .put(
            &slot_key(star, 1, 0),
            flight("someone-else", 1, 0, s_id, 0, &["foreign"]),
        )
        .await
        .unwrap();
    let err = match open_star(dir.path(), store, star).await {
        Ok(_) => panic!("a foreign flight must not be settled"),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains("does not belong to this star's chain"),
        "{err}"
    );
    assert!(err.contains("--star-id"), "{err}");
}
