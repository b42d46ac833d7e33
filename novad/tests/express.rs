//! The express quorum write against three real S3-compatible servers (moto), one per zone:
//! with one zone down a quorum still holds each object; with two down the write fails at the
//! deadline without a quorum; with the zones back, writes reach a quorum again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use nova_chain::config::{Backoff, RetryPolicy};
use nova_chain::express::{Outcome, Zone, ZoneAnswer, Zones, publish};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::object_store::{ObjectStore, PutPayload, S3Config, S3Store, StoreLimits};
use nova_testkit::Moto;

const DEADLINE: Duration = Duration::from_secs(2);

async fn zone(moto: &Moto, name: &str) -> Zone {
    moto.create_bucket("zone");
    let mut config = S3Config::new("zone");
    config.endpoint = Some(moto.endpoint());
    config.credentials = Some(("test".into(), "testtest".into()));
    // One attempt per request, well inside the deadline: the fanout retries on its own.
    config.max_attempts = 1;
    config.limits = StoreLimits {
        request_timeout: Duration::from_millis(500),
        ..StoreLimits::default()
    };
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(config).await);
    Zone {
        name: name.into(),
        store,
    }
}

fn backoff() -> Backoff {
    Backoff {
        policy: RetryPolicy {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        clock: Clock::system(),
        entropy: Entropy::from_os(),
    }
}

fn bundle(slot: u64) -> PutPayload {
    PutPayload::from_parts(vec![
        Bytes::from(vec![slot as u8; 4096]),
        Bytes::from(format!("footer of slot {slot}")),
        Bytes::from_static(b"trailer"),
    ])
}

fn key(slot: u64) -> String {
    format!("express/star/0000000001/{slot:020}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_real_zones_holds_each_write_through_one_zone_down_not_two() {
    let motos = [Moto::start(), Moto::start(), Moto::start()];
    let mut zones = Vec::new();
    for (moto, name) in motos.iter().zip(["a", "b", "c"]) {
        zones.push(zone(moto, name).await);
    }
    let zones = Zones::new(zones).unwrap();
    assert_eq!(zones.quorum(), 2);

    let all_up = publish(&zones, &key(1), bundle(1), DEADLINE, &backoff()).await;
    assert_eq!(all_up.outcome, Outcome::Quorum);

    motos[0].pause();
    let one_down = publish(&zones, &key(2), bundle(2), DEADLINE, &backoff()).await;
    assert_eq!(one_down.outcome, Outcome::Quorum);
    assert_ne!(one_down.answers[0], ZoneAnswer::Held);

    motos[1].pause();
    let two_down = publish(&zones, &key(3), bundle(3), DEADLINE, &backoff()).await;
    assert_ne!(two_down.outcome, Outcome::Quorum, "{two_down:?}");
    assert_eq!(two_down.answers[2], ZoneAnswer::Held);
    assert_eq!(
        two_down.answers[..2],
        [ZoneAnswer::Unanswered, ZoneAnswer::Unanswered]
    );

    motos[0].resume();
    motos[1].resume();
    let back = publish(&zones, &key(4), bundle(4), DEADLINE, &backoff()).await;
    assert_eq!(back.outcome, Outcome::Quorum);
    // Slot 3 was never acknowledged; a retry of the very same write now reaches a quorum (what
    // a recovery does with a bundle a minority holds, before deciding its slot).
    let retried = publish(&zones, &key(3), bundle(3), DEADLINE, &backoff()).await;
    assert_eq!(retried.outcome, Outcome::Quorum);
    // Zone c held it already, and a and b too once resumed (the paused writes landed late):
    // whichever answered first, each recognised the object as this write's own.
    assert!(
        retried
            .answers
            .iter()
            .all(|a| matches!(a, ZoneAnswer::Held | ZoneAnswer::Unanswered)),
        "recognised as its own: {retried:?}"
    );
}
