//! A star that finds another writer's object at its next chain slot has lost its chain: it
//! fails the pending appends with UNAVAILABLE, never acknowledges them nor anything after, and
//! exits non-zero so that its supervisor restarts it (and recovery settles what it left).

mod common;

use std::time::Duration;

use tonic::Code;

use common::*;
use nova_client::Error;
use nova_testkit::Moto;

fn expect_unavailable<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::Status { code, message, .. }) => {
            assert_eq!(code, Code::Unavailable, "{message}");
            message
        }
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
}

#[tokio::test]
async fn a_taken_slot_fails_appends_instead_of_acknowledging_them() {
    let mut novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    session.append("s", records("mine", 2), None).await.unwrap();

    // Another writer takes the next slots of this star's chain (epoch 1, slot 0 is ours).
    let chain = novad.data_dir().join("store/objects/chain/nova/0000000001");
    for slot in 1..50 {
        std::fs::write(
            chain.join(format!("{slot:020}")),
            b"another writer's flight",
        )
        .unwrap();
    }

    let message = expect_unavailable(session.append("s", records("lost", 3), None).await);
    assert!(message.contains("no longer owns its chain"), "{message}");
    // Nothing after the fence is acknowledged either: the star exits rather than linger.
    assert!(
        session
            .append("s", records("later", 1), None)
            .await
            .is_err()
    );
    let status = wait_exit(&mut novad, Duration::from_secs(30));
    assert!(!status.success(), "a fenced star exits non-zero");
    assert!(novad.log().contains("no longer owns its chain"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stars_on_one_chain_never_both_acknowledge() {
    let moto = Moto::start();
    let first = novad_on_s3(&moto, "shared").start();
    // Same bucket, same star id, its own metastore: it believes the chain is new.
    let mut second = novad_on_s3(&moto, "shared").start();
    let a = client(&first).await;
    let b = client(&second).await;
    a.create_stream("s").await.unwrap();
    b.create_stream("s").await.unwrap();
    let mut first_session = a.append_session().await.unwrap();
    first_session
        .append("s", records("first", 3), None)
        .await
        .unwrap();

    let mut second_session = b.append_session().await.unwrap();
    let message = expect_unavailable(second_session.append("s", records("second", 3), None).await);
    assert!(message.contains("another writer"), "{message}");
    let status = wait_exit(&mut second, Duration::from_secs(30));
    assert!(!status.success(), "the fenced star exits");

    // A third star with the same id and a fresh metastore now finds the chain in the bucket
    // and refuses to start beside it.
    let mut third = novad_on_s3(&moto, "shared").start_detached();
    let status = wait_exit(&mut third, Duration::from_secs(60));
    assert!(!status.success());
    assert!(third.log().contains("--rebuild-catalog"), "{}", third.log());

    // The first star still owns its chain and carries on.
    tokio::time::sleep(Duration::from_millis(100)).await;
    first_session
        .append("s", records("first-again", 1), None)
        .await
        .unwrap();
    assert_eq!(read_all(&a, "s").await.len(), 4);
}
