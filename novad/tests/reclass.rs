//! Changing a stream's storage class while a producer appends to it: appends pause while those
//! admitted under the old class land, then go on under the new one; every record is stored
//! once and in order, across Standard → Express → Standard and a kill -9 after; a star without
//! zone buckets refuses the change and keeps the class.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use nova_client::{
    Client, Producer, ProducerConfig, Record, Retention, StorageClass, StreamConfig,
};

fn with_zones(dir: &std::path::Path) -> nova_testkit::NovadBuilder {
    let mut builder = novad();
    for zone in ["a", "b", "c"] {
        let path = dir.join(zone);
        std::fs::create_dir_all(&path).unwrap();
        builder = builder.args([
            "--s3-express-zone".to_owned(),
            format!("name={zone},dir={}", path.display()),
        ]);
    }
    builder
}

/// Sets the stream's class; returns the class the answer reports (the stream as it is when
/// answered: another change may have followed this one).
async fn reconfigure(client: &Client, class: StorageClass) -> StorageClass {
    let config = StreamConfig {
        storage_class: class,
        retention: Retention::default(),
    };
    client
        .reconfigure_stream_configured("moving", config)
        .await
        .expect("reconfigure")
        .storage_class
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_changes_class_under_a_live_producer_and_keeps_every_record_once() {
    let zones = tempfile::tempdir().unwrap();
    let mut novad = with_zones(zones.path()).start();
    let client = client(&novad).await;
    client.create_stream("moving").await.unwrap();

    // A producer appending as fast as acks come, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let producing = tokio::spawn({
        let client = client.clone();
        let stop = stop.clone();
        async move {
            let config = ProducerConfig {
                linger: Duration::from_millis(1),
                batch_records: 20,
                ..ProducerConfig::default()
            };
            let producer = Producer::new(client, "moving", config).await.unwrap();
            let mut sent = 0u64;
            let mut last = None;
            while !stop.load(Ordering::Relaxed) {
                last = Some(
                    producer
                        .append(Record::new(format!("r{sent}")))
                        .await
                        .unwrap(),
                );
                sent += 1;
                if sent.is_multiple_of(100) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            producer.close().await.unwrap();
            if let Some(last) = last {
                assert_eq!(last.wait().await.unwrap(), sent - 1);
            }
            sent
        }
    });
    let acked =
        |novad: &nova_testkit::Novad| novad.metric("nova_express_acks_total").unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(acked(&novad), 0.0, "a Standard stream goes through no zone");
    assert_eq!(
        reconfigure(&client, StorageClass::Express).await,
        StorageClass::Express
    );
    let before = acked(&novad);
    eventually(
        Duration::from_secs(20),
        "the producer's appends acknowledged at the zones after the change",
        || acked(&novad) > before,
    )
    .await;
    assert_eq!(
        reconfigure(&client, StorageClass::Standard).await,
        StorageClass::Standard
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = acked(&novad);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(acked(&novad), after, "and back on Standard, none are");
    stop.store(true, Ordering::Relaxed);
    let sent = producing.await.unwrap();
    assert!(
        sent > 200,
        "the producer kept going through both changes ({sent})"
    );

    let want: Vec<String> = (0..sent).map(|i| format!("r{i}")).collect();
    assert_eq!(read_all(&client, "moving").await, want);
    // Acknowledged means durable, whatever class acknowledged it.
    novad.kill9();
    novad.restart();
    let client = common::client(&novad).await;
    assert_eq!(read_all(&client, "moving").await, want);
    let info = client.describe_stream("moving").await.unwrap();
    assert_eq!(info.storage_class, StorageClass::Standard);
}

/// Changes that overlap (two admins at once, in both directions) run one after the other:
/// never are batches of both classes of one stream in flight together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_changes_take_turns_and_keep_every_record_once() {
    let zones = tempfile::tempdir().unwrap();
    let novad = with_zones(zones.path()).start();
    let client = client(&novad).await;
    client.create_stream("moving").await.unwrap();
    let producer = Producer::new(
        client.clone(),
        "moving",
        ProducerConfig {
            linger: Duration::from_millis(1),
            batch_records: 10,
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();
    let mut sent = 0u64;
    for round in 0..15 {
        let changes = tokio::spawn({
            let client = client.clone();
            async move {
                tokio::join!(
                    reconfigure(&client, StorageClass::Express),
                    reconfigure(&client, StorageClass::Standard),
                    reconfigure(&client, StorageClass::Express),
                );
            }
        });
        while !changes.is_finished() || sent < (round + 1) * 100 {
            producer
                .append(Record::new(format!("r{sent}")))
                .await
                .unwrap();
            sent += 1;
            if sent.is_multiple_of(20) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        changes.await.unwrap();
    }
    producer.close().await.unwrap();
    let want: Vec<String> = (0..sent).map(|i| format!("r{i}")).collect();
    assert_eq!(read_all(&client, "moving").await, want);
}

#[tokio::test]
async fn a_star_without_zones_refuses_the_change_and_keeps_the_class() {
    let novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("plain").await.unwrap();
    let config = StreamConfig {
        storage_class: StorageClass::Express,
        retention: Retention::default(),
    };
    let err = client
        .reconfigure_stream_configured("plain", config)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("--s3-express-zone"), "{err}");
    let info = client.describe_stream("plain").await.unwrap();
    assert_eq!(info.storage_class, StorageClass::Standard);
    // The stream still takes appends.
    let mut session = client.append_session().await.unwrap();
    session
        .append("plain", records("p", 2), None)
        .await
        .unwrap();
}
