//! The express quorum write against three zone stores on disk, each behind a fault injector:
//! a quorum acknowledges, a slow or dead minority does not hold it up, a dead majority fails at
//! the deadline as "outcome unknown", another writer's objects fence it, and a lost answer is
//! recognised as ours.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use nova_chain::config::{Backoff, RetryPolicy};
use nova_chain::express::{Outcome, Zone, ZoneAnswer, Zones, publish};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::object_store::faulty::{Fault, FaultyStore};
use nova_core::object_store::{LocalStore, ObjectStore, Op, PutPayload, StoreLimits};

const KEY: &str = "express/star/0000000001/00000000000000000007";
const DEADLINE: Duration = Duration::from_millis(800);

struct World {
    _dir: tempfile::TempDir,
    faults: Vec<Arc<FaultyStore>>,
    zones: Zones,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let mut faults = Vec::new();
    let mut zones = Vec::new();
    for name in ["a", "b", "c"] {
        let disk: Arc<dyn ObjectStore> =
            Arc::new(LocalStore::open(dir.path().join(name), StoreLimits::default()).unwrap());
        let faulty = Arc::new(FaultyStore::new(disk));
        faults.push(faulty.clone());
        zones.push(Zone {
            name: name.into(),
            store: faulty,
        });
    }
    World {
        _dir: dir,
        faults,
        zones: Zones::new(zones).unwrap(),
    }
}

fn backoff() -> Backoff {
    Backoff {
        policy: RetryPolicy {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        },
        clock: Clock::system(),
        entropy: Entropy::seeded(7),
    }
}

/// A bundle-shaped payload: its last two parts identify it.
fn bundle(tag: &str) -> PutPayload {
    PutPayload::from_parts(vec![
        Bytes::from(format!("records of {tag}")),
        Bytes::from(format!("footer of {tag}")),
        Bytes::from_static(b"trailer"),
    ])
}

async fn holds(store: &dyn ObjectStore, payload: &PutPayload) -> bool {
    match store.head(KEY).await {
        Ok(meta) => meta.size == payload.len(),
        Err(_) => false,
    }
}

#[tokio::test]
async fn three_healthy_zones_hold_it_and_a_quorum_acknowledges() {
    let w = world();
    let payload = bundle("x");
    let published = publish(&w.zones, KEY, payload.clone(), DEADLINE, &backoff()).await;
    assert_eq!(published.outcome, Outcome::Quorum);
    assert!(
        published
            .answers
            .iter()
            .filter(|a| **a == ZoneAnswer::Held)
            .count()
            >= 2
    );
    // The third write goes on after the quorum: every zone ends up holding it.
    for _ in 0..100 {
        let mut all = true;
        for zone in w.zones.iter() {
            all &= holds(zone.store.as_ref(), &payload).await;
        }
        if all {
            return;
        }
        Clock::system().sleep(Duration::from_millis(10)).await;
    }
    panic!("not every zone holds the object");
}

#[tokio::test]
async fn a_hung_zone_does_not_hold_up_the_quorum() {
    let w = world();
    w.faults[0].inject(&[Op::PutIfAbsent], "", Fault::Hold, None);
    let published = publish(&w.zones, KEY, bundle("x"), DEADLINE, &backoff()).await;
    assert_eq!(published.outcome, Outcome::Quorum);
    assert_eq!(published.answers[0], ZoneAnswer::Unanswered);
    assert!(published.latencies[1].is_some() && published.latencies[2].is_some());
    w.faults[0].release();
}

#[tokio::test]
async fn two_hung_zones_fail_at_the_deadline_with_the_outcome_unknown() {
    let w = world();
    for zone in &w.faults[..2] {
        zone.inject(&[Op::PutIfAbsent], "", Fault::Hold, None);
    }
    let published = publish(&w.zones, KEY, bundle("x"), DEADLINE, &backoff()).await;
    // Either hung write might still land, so a quorum might hold it.
    assert_eq!(published.outcome, Outcome::Unknown);
    assert_eq!(published.answers[2], ZoneAnswer::Held);
    for zone in &w.faults[..2] {
        zone.release();
    }
}

#[tokio::test]
async fn two_zones_refusing_every_write_fail_it_as_not_held() {
    let w = world();
    for zone in &w.faults[..2] {
        zone.inject(&[Op::PutIfAbsent], "", Fault::Permanent, None);
    }
    let published = publish(&w.zones, KEY, bundle("x"), DEADLINE, &backoff()).await;
    assert_eq!(published.outcome, Outcome::NotHeld);
    assert_eq!(
        published.answers[..2],
        [ZoneAnswer::Rejected, ZoneAnswer::Rejected]
    );
}

#[tokio::test]
async fn another_writers_objects_in_a_majority_fence_it() {
    let w = world();
    let theirs = bundle("the successor's fence");
    for zone in w.zones.iter().take(2) {
        zone.store.put_if_absent(KEY, theirs.clone()).await.unwrap();
    }
    let published = publish(&w.zones, KEY, bundle("zombie"), DEADLINE, &backoff()).await;
    assert_eq!(published.outcome, Outcome::Fenced);
    for zone in w.zones.iter().take(2) {
        assert!(holds(zone.store.as_ref(), &theirs).await, "theirs stays");
    }
}

#[tokio::test]
async fn a_lost_answer_and_a_transient_error_still_count_as_held() {
    let w = world();
    w.faults[0].inject(&[Op::PutIfAbsent], "", Fault::LoseAnswer, Some(1));
    w.faults[1].inject(&[Op::PutIfAbsent], "", Fault::Transient, Some(2));
    w.faults[2].inject(&[Op::PutIfAbsent], "", Fault::Permanent, None);
    let published = publish(&w.zones, KEY, bundle("x"), DEADLINE, &backoff()).await;
    assert_eq!(published.outcome, Outcome::Quorum);
    assert_eq!(
        published.answers,
        [ZoneAnswer::Held, ZoneAnswer::Held, ZoneAnswer::Rejected]
    );
}

fn fence(by: &str) -> nova_core::flight::FenceInfo {
    nova_chain::express::fence_for("star", 1, 7, by, 1)
}

fn fence_bytes(by: &str) -> PutPayload {
    PutPayload::from(nova_core::flight::encode_fence(&fence(by)))
}

/// A real bundle: a flight-format object, so its footer reads as one.
fn real_bundle() -> PutPayload {
    let meta = nova_core::flight::FlightMeta {
        star: "star".into(),
        epoch: 1,
        slot: 7,
        created_at_ms: 1,
    };
    let (payload, _) = nova_core::flight::assemble_flight(meta, Vec::new());
    payload
}

#[tokio::test]
async fn a_successor_plugs_an_empty_slot_and_a_zombie_can_no_longer_reach_a_quorum() {
    let w = world();
    let fate =
        nova_chain::express::plug_or_find(&w.zones, KEY, &fence("successor"), DEADLINE, &backoff())
            .await;
    assert_eq!(
        fate.fate,
        nova_chain::express::SlotFate::Plugged { sole: true }
    );
    let zombie = publish(&w.zones, KEY, real_bundle(), DEADLINE, &backoff()).await;
    assert_eq!(zombie.outcome, Outcome::Fenced);
}

#[tokio::test]
async fn a_bundle_a_quorum_holds_is_found_and_kept() {
    let w = world();
    let bundle = real_bundle();
    for zone in w.zones.iter().take(2) {
        zone.store.put_if_absent(KEY, bundle.clone()).await.unwrap();
    }
    let fate =
        nova_chain::express::plug_or_find(&w.zones, KEY, &fence("successor"), DEADLINE, &backoff())
            .await;
    assert_eq!(
        fate.fate,
        nova_chain::express::SlotFate::Bundle { zones: vec![0, 1] }
    );
}

#[tokio::test]
async fn a_minority_bundle_is_plugged_and_a_split_slot_waits() {
    // One zone holds the bundle: the other two take the fence, a quorum.
    let w = world();
    let bundle = real_bundle();
    w.zones
        .iter()
        .next()
        .unwrap()
        .store
        .put_if_absent(KEY, bundle.clone())
        .await
        .unwrap();
    let fate =
        nova_chain::express::plug_or_find(&w.zones, KEY, &fence("s1"), DEADLINE, &backoff()).await;
    assert_eq!(
        fate.fate,
        nova_chain::express::SlotFate::Plugged { sole: true }
    );

    // One bundle, another successor's fence, and a zone down: neither holds a quorum yet.
    let w = world();
    let mut zones = w.zones.iter();
    zones
        .next()
        .unwrap()
        .store
        .put_if_absent(KEY, bundle)
        .await
        .unwrap();
    zones
        .next()
        .unwrap()
        .store
        .put_if_absent(KEY, fence_bytes("another successor"))
        .await
        .unwrap();
    w.faults[2].inject(&[Op::PutIfAbsent], "", Fault::Permanent, None);
    let fate =
        nova_chain::express::plug_or_find(&w.zones, KEY, &fence("s2"), DEADLINE, &backoff()).await;
    assert_eq!(fate.fate, nova_chain::express::SlotFate::Undecided);
    assert_eq!(fate.foreign_fences, 1, "another successor's fence is seen");
    // With the zone back, the fences make a quorum: plugged.
    w.faults[2].clear();
    let fate =
        nova_chain::express::plug_or_find(&w.zones, KEY, &fence("s2"), DEADLINE, &backoff()).await;
    // Ours and another's: plugged, but not by this caller's fences alone.
    assert_eq!(
        fate.fate,
        nova_chain::express::SlotFate::Plugged { sole: false }
    );
    assert_eq!(fate.foreign_fences, 1);
}

/// A bundle of `slot` of epoch 1 of "star".
fn bundle_at(slot: u64) -> PutPayload {
    let meta = nova_core::flight::FlightMeta {
        star: "star".into(),
        epoch: 1,
        slot,
        created_at_ms: 1,
    };
    nova_core::flight::assemble_flight(meta, Vec::new()).0
}

fn slot_key(slot: u64) -> String {
    nova_core::keys::express_slot_key("star", 1, slot)
}

async fn plant(w: &World, zones: &[usize], slot: u64) {
    for (i, zone) in w.zones.iter().enumerate() {
        if zones.contains(&i) {
            zone.store
                .put_if_absent(&slot_key(slot), bundle_at(slot))
                .await
                .unwrap();
        }
    }
}

fn walk<'a>(w: &'a World, backoff: &'a Backoff) -> nova_chain::express::Walk<'a> {
    nova_chain::express::Walk {
        zones: &w.zones,
        star: "star",
        epoch: 1,
        successor: "successor",
        deadline: DEADLINE,
        backoff,
        undecided_attempts: 2,
    }
}

#[tokio::test]
async fn a_walk_carries_the_quorum_bundles_in_order_and_ends_at_the_first_plug() {
    let w = world();
    plant(&w, &[0, 1], 0).await;
    plant(&w, &[1, 2], 1).await;
    // Slot 2 reached one zone only: never acknowledged. Slot 3 reached a quorum (a pipelined
    // write of the departed star), but after an unacknowledged slot: never acknowledged either.
    plant(&w, &[2], 2).await;
    plant(&w, &[0, 1, 2], 3).await;
    let backoff = backoff();
    let mut carried = Vec::new();
    let end = walk(&w, &backoff)
        .run(0, |slot, bundle| {
            carried.push((slot, bundle.len()));
            async { Ok::<(), nova_chain::express::WalkError>(()) }
        })
        .await
        .unwrap();
    assert_eq!(
        end,
        nova_chain::express::WalkEnd::Plugged {
            slot: 2,
            sole: true
        }
    );
    assert_eq!(
        carried,
        [
            (0, bundle_at(0).len() as usize),
            (1, bundle_at(1).len() as usize)
        ]
    );
    // The departed star, if it is only paused, can no longer get slot 2 to a quorum.
    let zombie = publish(&w.zones, &slot_key(2), bundle_at(2), DEADLINE, &backoff).await;
    assert_eq!(zombie.outcome, Outcome::Fenced);
}

#[tokio::test]
async fn a_walk_waits_on_an_undecided_slot_and_goes_on_once_zones_answer() {
    let w = world();
    plant(&w, &[0], 0).await;
    w.zones
        .iter()
        .nth(1)
        .unwrap()
        .store
        .put_if_absent(&slot_key(0), fence_bytes("another successor"))
        .await
        .unwrap();
    w.faults[2].inject(&[Op::PutIfAbsent], "", Fault::Permanent, None);
    let backoff = backoff();
    let nothing = |_, _| async { Ok::<(), nova_chain::express::WalkError>(()) };
    let end = walk(&w, &backoff).run(0, nothing).await.unwrap();
    assert_eq!(end, nova_chain::express::WalkEnd::Undecided { slot: 0 });
    w.faults[2].clear();
    let end = walk(&w, &backoff).run(0, nothing).await.unwrap();
    assert_eq!(
        end,
        nova_chain::express::WalkEnd::Plugged {
            slot: 0,
            sole: false
        }
    );
}

#[tokio::test]
async fn a_wrong_copy_is_passed_over_for_an_intact_one() {
    let w = world();
    // Zone 0 holds, at slot 0's key, a bundle whose footer names another slot (a copy gone
    // wrong); zones 1 and 2 hold slot 0's bundle. The walk must carry the right one.
    plant(&w, &[1, 2], 0).await;
    w.zones
        .iter()
        .next()
        .unwrap()
        .store
        .put_if_absent(&slot_key(0), bundle_at(5))
        .await
        .unwrap();
    let backoff = backoff();
    let mut carried = Vec::new();
    let end = walk(&w, &backoff)
        .run(0, |slot, bundle| {
            carried.push((slot, bundle));
            async { Ok::<(), nova_chain::express::WalkError>(()) }
        })
        .await
        .unwrap();
    assert_eq!(carried.len(), 1);
    assert_eq!(carried[0].1, bundle_at(0).parts().concat());
    assert_eq!(
        end,
        nova_chain::express::WalkEnd::Plugged {
            slot: 1,
            sole: true
        }
    );
}

#[tokio::test]
async fn a_zone_that_may_have_written_before_a_permanent_error_is_not_counted_out() {
    // Zone 0 holds it. Zone 1's first write lands but its answer is lost, and its retry is
    // refused for good; zone 2 refuses for good. Zone 1 may hold it (it does): with zone 0 that
    // is a quorum, so the producer must not hear "never stored".
    let w = world();
    w.faults[1].inject(&[Op::PutIfAbsent], "", Fault::LoseAnswer, Some(1));
    w.faults[1].inject(
        &[Op::PutIfAbsent, Op::Get, Op::Head],
        "",
        Fault::Permanent,
        None,
    );
    w.faults[2].inject(&[Op::PutIfAbsent], "", Fault::Permanent, None);
    let published = publish(&w.zones, KEY, bundle("x"), DEADLINE, &backoff()).await;
    assert_eq!(published.outcome, Outcome::Unknown);
    assert_eq!(published.answers[1], ZoneAnswer::Unanswered);
    assert_eq!(published.answers[2], ZoneAnswer::Rejected);
}

#[tokio::test]
async fn a_dead_zone_gives_up_its_hold_soon_after_the_quorum() {
    let w = world();
    w.faults[0].inject(&[Op::PutIfAbsent], "", Fault::Hold, None);
    let hold = Arc::new(());
    let deadline = Duration::from_secs(30);
    let published = nova_chain::express::fanout::publish_holding(
        &w.zones,
        KEY,
        bundle("x"),
        deadline,
        &backoff(),
        hold.clone(),
    )
    .await;
    assert_eq!(published.outcome, Outcome::Quorum);
    // The hung zone's write stops after the grace, long before the deadline, and with it the
    // hold on the bundle's bytes.
    let clock = Clock::system();
    let started = clock.now();
    while Arc::strong_count(&hold) > 1 {
        assert!(
            clock.since(started) < Duration::from_secs(10),
            "the dead zone's write still holds the bundle"
        );
        clock.sleep(Duration::from_millis(10)).await;
    }
    w.faults[0].release();
}
