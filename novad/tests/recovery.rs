//! Durability across crashes and restarts: every acknowledged record survives `kill -9` of novad
//! at any moment, on the local store and on S3; SIGTERM lands what was admitted and exits 0.

mod common;

use std::time::Duration;

use common::*;
use nova_client::Record;
use nova_testkit::{Moto, Novad, NovadBuilder};

async fn crash_rounds(mut builder: impl FnMut() -> NovadBuilder) {
    let mut novad: Novad = builder().start();
    let client = common::client(&novad).await;
    client.create_stream("s").await.unwrap();
    kill_9_rounds(
        &mut novad,
        "s",
        10,
        Duration::from_millis(700),
        Duration::from_millis(300),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_kill_9_on_the_local_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    crash_rounds(|| novad().data_dir(path.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_kill_9_on_s3() {
    let moto = Moto::start();
    moto.create_bucket("crash");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    crash_rounds(|| with_s3(novad().data_dir(path.clone()), &moto, "crash")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lands_what_was_admitted_and_exits_zero() {
    let mut novad = novad().args(["--flight-linger-ms", "200"]).start();
    let client = common::client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    // Admitted but lingering in an open flight when the signal arrives.
    for i in 0..5 {
        session
            .send("s", vec![Record::new(format!("late-{i}"))], None)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let status = tokio::task::spawn_blocking(move || {
        let status = novad.terminate(Duration::from_secs(30));
        (novad, status)
    });
    let mut acks = Vec::new();
    while let Ok(ack) = session.next_ack().await {
        acks.push(ack);
    }
    let (mut novad, status) = status.await.unwrap();
    assert!(
        status.success(),
        "novad exits 0 on SIGTERM: {status}\n{}",
        novad.log()
    );
    assert_eq!(
        acks.len(),
        5,
        "every admitted append was answered before exit"
    );
    assert!(novad.log().contains("novad stopped cleanly"));
    novad.restart();
    let client = common::client(&novad).await;
    assert_eq!(
        read_all(&client, "s").await,
        ["late-0", "late-1", "late-2", "late-3", "late-4"]
    );
    // The restart found everything absorbed: nothing left to settle.
    assert!(!novad.log().contains("recovery settled"), "{}", novad.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_continue_densely_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut novad = novad().data_dir(dir.path()).start();
    let client = common::client(&novad).await;
    client.create_stream("s").await.unwrap();
    let mut session = client.append_session().await.unwrap();
    let mut acked = 0;
    for i in 0..20 {
        let ack = session
            .append("s", records(&format!("b{i}"), 5), None)
            .await
            .unwrap();
        acked = ack.end_seq;
    }
    novad.kill9();
    novad.restart();
    let client = common::client(&novad).await;
    assert_eq!(client.describe_stream("s").await.unwrap().tail_seq, acked);
    assert_eq!(read_all(&client, "s").await.len() as u64, acked);
    // Appends continue densely after the restart.
    let mut session = client.append_session().await.unwrap();
    let ack = session
        .append("s", records("after", 1), None)
        .await
        .unwrap();
    assert_eq!(ack.start_seq, acked);
}
