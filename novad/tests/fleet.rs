//! A fleet of real stars on a real etcd and a real S3-compatible server (moto): placement,
//! redirects the SDK follows, one live star per --star-id, and stars coming and going.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use nova_client::{Client, Producer, ProducerConfig, Record};
use nova_testkit::{Etcd, Moto, Novad, NovadBuilder};

use common::{client, eventually, novad, read_all, wait_exit, with_s3};

const BUCKET: &str = "fleet";
const TTL_SECS: u64 = 3;

fn star(etcd: &Etcd, moto: &Moto, id: &str) -> NovadBuilder {
    with_s3(novad(), moto, BUCKET).args([
        "--metastore",
        &etcd.url(),
        "--star-id",
        id,
        "--lease-ttl-secs",
        &TTL_SECS.to_string(),
    ])
}

fn fleet(n: usize) -> (Etcd, Moto, Vec<Novad>) {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let stars = (0..n)
        .map(|i| star(&etcd, &moto, &format!("star-{i}")).start())
        .collect();
    (etcd, moto, stars)
}

/// Which star leads each stream, by `DescribeStream`.
async fn leaders(client: &Client, streams: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stream in streams {
        let info = client.describe_stream(stream).await.expect("describe");
        out.insert(stream.clone(), info.leader_id.clone());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_spread_over_the_stars_and_every_star_redirects_to_the_leader() {
    let (_etcd, _moto, stars) = fleet(3);
    let first = client(&stars[0]).await;
    let streams: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
    for stream in &streams {
        let info = first.create_stream(stream).await.expect("create");
        assert!(!info.leader_id.is_empty(), "a created stream has a leader");
    }
    let placed = leaders(&first, &streams).await;
    let used: BTreeSet<&String> = placed.values().collect();
    assert!(
        used.len() >= 2,
        "six streams created through one star all went to {used:?}; stars seen: {:?}\n{}",
        stars[0].metric("nova_fleet_stars"),
        stars[0].log()
    );

    // Producers connected to the first star are redirected to each leader; every append lands.
    for stream in &streams {
        let producer = Producer::new(first.clone(), stream.clone(), ProducerConfig::default())
            .await
            .expect("producer");
        for i in 0..20 {
            producer
                .append(Record::new(format!("{stream}-{i}")))
                .await
                .expect("append");
        }
        producer.close().await.expect("close");
    }
    // Any star answers for any stream: reads through each follow the redirect.
    for (i, novad) in stars.iter().enumerate() {
        let id = format!("star-{i}");
        let other = client(novad).await;
        for stream in &streams {
            let read = read_all(&other, stream).await;
            let expected: Vec<String> = (0..20).map(|i| format!("{stream}-{i}")).collect();
            assert_eq!(read, expected, "{stream} read through {id}");
        }
        // Asked directly, the leader answers and every other star redirects, naming the leader.
        for stream in &streams {
            let answer = other
                .raw()
                .describe_stream(nova_proto::v1::DescribeStreamRequest {
                    stream: stream.clone(),
                })
                .await;
            let leader = &placed[stream];
            match answer {
                Ok(info) => {
                    assert_eq!(&id, leader, "{id} answered for {stream}");
                    let info = info.into_inner().info.expect("info");
                    assert_eq!(&info.leader_id, leader);
                }
                Err(status) => {
                    assert_ne!(&id, leader, "the leader of {stream} redirected");
                    assert_eq!(status.code(), tonic::Code::Unavailable);
                    assert!(status.message().contains(leader.as_str()), "{status:?}");
                    assert!(nova_proto::error::leader(&status).is_some());
                }
            }
        }
    }
    let redirects: f64 = stars
        .iter()
        .filter_map(|s| s.metric("nova_fleet_redirects_total"))
        .sum();
    assert!(redirects > 0.0, "redirects are counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_star_with_the_same_id_is_refused() {
    let (etcd, moto, _stars) = fleet(1);
    let mut twin = star(&etcd, &moto, "star-0").start_detached();
    let status = wait_exit(&mut twin, Duration::from_secs(60));
    assert!(!status.success());
    let log = twin.log();
    assert!(
        log.contains("another live star is registered with --star-id \"star-0\""),
        "{log}"
    );
}

/// A star killed without leaving comes back under its own id once its old lease lapses, settles
/// its chain, and leads its streams again: nothing it acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_restarted_after_kill_9_leads_its_streams_again() {
    let (_etcd, _moto, mut stars) = fleet(2);
    let first = client(&stars[0]).await;
    let streams: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    for stream in &streams {
        first.create_stream(stream).await.expect("create");
    }
    for stream in &streams {
        let producer = Producer::new(first.clone(), stream.clone(), ProducerConfig::default())
            .await
            .expect("producer");
        for i in 0..10 {
            producer
                .append(Record::new(format!("{stream}-{i}")))
                .await
                .expect("append");
        }
        producer.close().await.expect("close");
    }
    let before = leaders(&first, &streams).await;
    stars[1].kill9();
    stars[1].restart();
    eventually(
        Duration::from_secs(30),
        "the restarted star to lead again",
        || stars[1].log().contains("joined the fleet"),
    )
    .await;
    let after = client(&stars[1]).await;
    for stream in &streams {
        let read = read_all(&after, stream).await;
        let expected: Vec<String> = (0..10).map(|i| format!("{stream}-{i}")).collect();
        assert_eq!(read, expected, "{stream}");
    }
    assert_eq!(leaders(&after, &streams).await, before);
}
