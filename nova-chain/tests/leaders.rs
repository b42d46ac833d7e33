//! Recovery in a fleet leaves out what a second writer left in its chain: the sections of a
//! stream whose leader record names another star, in Standard flights and in the Express
//! bundles recovery carries, and the star still starts. (A second writer only exists if a
//! defect let one; these tests build the state such a star would leave by hand.)

#![allow(
    clippy::disallowed_methods,
    reason = "stars on a real disk and the real embedded metastore run on the real clock"
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::Mutex;

use nova_chain::admission::encoded_charge;
use nova_chain::express::{ExpressConfig, Zone, Zones};
use nova_chain::metrics::Metrics;
use nova_chain::streams::StreamState;
use nova_chain::{ChainConfig, Leaders, Star};
use nova_core::catalog::{AbsorbBatch, Catalog, ChainState, StorageClass, StreamTail};
use nova_core::flight::section::encode_fragment;
use nova_core::flight::{FlightMeta, SectionInput, assemble_flight};
use nova_core::keys::{chain_root, slot_key};
use nova_core::metastore::faulty::{CommitFault, FaultyMetastore};
use nova_core::metastore::{Metastore, MetastoreError};
use nova_core::object_store::faulty::Fault;
use nova_core::object_store::{LocalStore, ObjectStore, Op, StoreLimits};
use nova_core::record::Record;
use nova_testkit::chain::{Disk, STAR, answer, bodies};

/// Leader records as a test sets them: each answer is given once, then the stream's record
/// reads as naming no star (as if it had been cleared meanwhile).
#[derive(Debug, Default)]
struct Answers(Mutex<HashMap<String, Vec<String>>>);

impl Answers {
    fn once(stream: &str, leader: &str) -> Arc<Self> {
        let answers = Self::default();
        answers
            .0
            .lock()
            .insert(stream.into(), vec![leader.to_owned()]);
        Arc::new(answers)
    }
}

impl Leaders for Answers {
    fn leader<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, MetastoreError>> {
        let answer = self.0.lock().get_mut(stream).and_then(|a| a.pop());
        Box::pin(async move { Ok(answer) })
    }
}

fn records(bodies: &[&str]) -> Vec<Record> {
    bodies
        .iter()
        .map(|b| Record {
            timestamp: 1,
            headers: vec![],
            body: Bytes::from(b.to_string()),
        })
        .collect()
}

fn section(stream_id: u64, stream: &str, start_seq: u64, bodies: &[&str]) -> SectionInput {
    SectionInput {
        stream_id,
        stream: stream.into(),
        start_seq,
        fragments: vec![encode_fragment(records(bodies).iter())],
    }
}

/// Another star ("b") leads `stream` and has absorbed it to `tail`.
async fn led_elsewhere(catalog: &Catalog, stream_id: u64, tail: u64) {
    let chain = catalog
        .set_chain(
            "b",
            None,
            ChainState {
                epoch: 1,
                checkpoint: None,
            },
        )
        .await
        .unwrap();
    catalog
        .absorb(
            "b",
            Some(chain.version),
            ChainState {
                epoch: 1,
                checkpoint: None,
            },
            AbsorbBatch {
                tails: vec![(
                    stream_id,
                    StreamTail {
                        tail_seq: tail,
                        stored_bytes: 1,
                    },
                )],
                ..AbsorbBatch::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_leaves_out_a_second_writers_standard_sections_and_the_star_starts() {
    // b's record read once, then cleared: read again at the second flight it would name no
    // star, and s 3..5, continuing b's tail, would be settled over b's leadership.
    standard_case(Answers::once("s", "b"), 3).await;
    // b's record cleared before the restart (b departed and was taken over): the sections
    // fall below the tail b left.
    standard_case(Arc::new(Answers::default()), 5).await;
}

/// The star wrote (and acknowledged) s 2..3 and 3..5 after its leadership of s had moved to b,
/// which took s up at 2 and has absorbed it to `b_tail`; its records of t are its own.
async fn standard_case(leaders: Arc<Answers>, b_tail: u64) {
    let disk = Disk::new();
    let store = disk.store();
    let metastore = disk.metastore();
    let catalog = Catalog::new(metastore.clone());
    let s = catalog
        .create_stream("s", StorageClass::Standard, 1)
        .await
        .unwrap();
    let t = catalog
        .create_stream("t", StorageClass::Standard, 1)
        .await
        .unwrap();
    catalog
        .set_chain(
            STAR,
            None,
            ChainState {
                epoch: 4,
                checkpoint: None,
            },
        )
        .await
        .unwrap();
    led_elsewhere(&catalog, s.id, b_tail).await;
    for (slot, s_section, t_section) in [
        (
            0,
            section(s.id, "s", 2, &["s2"]),
            section(t.id, "t", 0, &["t0"]),
        ),
        (
            1,
            section(s.id, "s", 3, &["s3", "s4"]),
            section(t.id, "t", 1, &["t1"]),
        ),
    ] {
        let meta = FlightMeta {
            star: STAR.into(),
            epoch: 4,
            slot,
            created_at_ms: 1,
        };
        let (payload, _) = assemble_flight(meta, vec![s_section, t_section]);
        store.put(&slot_key(STAR, 4, slot), payload).await.unwrap();
    }
    let config = ChainConfig {
        leaders: Some(leaders),
        ..nova_testkit::chain::config()
    };
    let star = Star::open(config, store, metastore, Arc::new(Metrics::new()))
        .await
        .expect("a chain holding a second writer's sections still settles");
    assert_eq!(bodies(&star, "t").await, ["t0", "t1"]);
    assert_eq!(catalog.stream_tail(s.id).await.unwrap().tail_seq, b_tail);
    assert_eq!(star.streams().get("s").unwrap().tail(), b_tail);
}

/// Creates Express streams x and y on `writer` and has three records of each acknowledged at
/// the zones, one batch per stream.
async fn write_x_and_y(writer: &Star) -> (Arc<StreamState>, Arc<StreamState>) {
    let mut created = Vec::new();
    for (name, bodies) in [("x", ["x0", "x1", "x2"]), ("y", ["y0", "y1", "y2"])] {
        let stream = writer
            .streams()
            .create(name, StorageClass::Express)
            .await
            .unwrap();
        let bytes = bodies.iter().map(|b| b.len() as u64).sum();
        let admitted = writer.admission().admit(encoded_charge(3, 0, bytes)).await;
        let fragment = encode_fragment(records(&bodies).iter());
        let reply = writer
            .submit(stream.clone(), vec![fragment], bytes, None, admitted)
            .await
            .unwrap();
        answer(reply).await.expect("acknowledged at the zones");
        created.push(stream);
    }
    let y = created.pop().unwrap();
    (created.pop().unwrap(), y)
}

fn zones(disk: &Disk) -> Zones {
    let zones = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            let store: Arc<dyn ObjectStore> = Arc::new(
                LocalStore::open(disk.dir.path().join(name), StoreLimits::default()).unwrap(),
            );
            Zone {
                name: name.into(),
                store,
            }
        })
        .collect();
    Zones::new(zones).unwrap()
}

fn express_config(zones: &Zones, leaders: Option<Arc<dyn Leaders>>) -> ChainConfig {
    ChainConfig {
        express: Some(ExpressConfig {
            zones: zones.clone(),
            publish_deadline: Duration::from_millis(300),
            linger: Duration::from_millis(2),
            buffer_bytes: 4 << 20,
        }),
        leaders,
        ..nova_testkit::chain::config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_carries_no_second_writers_express_bundle_and_the_star_starts() {
    // While b's record names b, and once it is cleared (b's records below the bundle's end).
    express_case(Answers::once("x", "b")).await;
    express_case(Arc::new(Answers::default())).await;
}

async fn express_case(leaders: Arc<Answers>) {
    let disk = Disk::new();
    let zones = zones(&disk);
    let writer = nova_testkit::chain::open_faulty(&disk, express_config(&zones, None))
        .await
        .unwrap();
    // Its Standard flights never land, so its express bundles are left for recovery to carry.
    writer.store.inject(
        &[Op::PutIfAbsent, Op::Put],
        &chain_root(STAR),
        Fault::Hold,
        None,
    );
    let (x, _) = write_x_and_y(&writer.star).await;
    // Meanwhile b took x up at 0 and absorbed one record of its own: the writer's bundle
    // x 0..3 overlaps b's records.
    let metastore: Arc<dyn Metastore> = Arc::new(writer.metastore.clone());
    let catalog = Catalog::new(metastore.clone());
    led_elsewhere(&catalog, x.id(), 1).await;
    let successor = Star::open(
        express_config(&zones, Some(leaders)),
        disk.store(),
        metastore,
        Arc::new(Metrics::new()),
    )
    .await
    .expect("an express chain holding a second writer's bundle still settles");
    assert_eq!(bodies(&successor, "y").await, ["y0", "y1", "y2"]);
    assert_eq!(catalog.stream_tail(x.id()).await.unwrap().tail_seq, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_walks_of_one_recovery_take_one_answer_per_stream() {
    let disk = Disk::new();
    let zones = zones(&disk);
    let store = disk.store();
    let metastore = disk.metastore();
    // The writer's absorbs never land: its Standard flights carrying the express bundles do,
    // and are left for recovery to settle, the bundles for it to walk again.
    let held = FaultyMetastore::new(metastore.clone());
    let writer = Star::open(
        express_config(&zones, None),
        store.clone(),
        Arc::new(held.clone()),
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    held.inject_for_keys(CommitFault::Hold, None, b"c/");
    let (x, _) = write_x_and_y(&writer).await;
    let mut landed = 0;
    for _ in 0..500 {
        landed = store
            .list(&chain_root(STAR), None, 100)
            .await
            .unwrap()
            .objects
            .len();
        if landed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(landed > 0, "the writer's Standard flights never landed");
    // b took x up at 0 and has absorbed nothing yet. Its record is read once: the Express walk
    // asking again would find it cleared and carry x 0..3 over b's leadership (continuing b's
    // tail, nothing else would stop it), after the Standard walk left the same records out.
    let catalog = Catalog::new(metastore.clone());
    led_elsewhere(&catalog, x.id(), 0).await;
    let successor = Star::open(
        express_config(&zones, Some(Answers::once("x", "b"))),
        store,
        metastore,
        Arc::new(Metrics::new()),
    )
    .await
    .expect("a chain holding a second writer's records still settles");
    assert_eq!(bodies(&successor, "y").await, ["y0", "y1", "y2"]);
    assert_eq!(catalog.stream_tail(x.id()).await.unwrap().tail_seq, 0);
    drop(writer);
}
