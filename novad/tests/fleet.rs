//! A fleet of real stars on a real etcd and a real S3-compatible server (moto): placement,
//! redirects the SDK follows, one live star per --star-id, and stars coming and going.

mod common;
mod fleet_common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use nova_client::{Client, Producer, ProducerConfig, Record};
use nova_core::flight::{ObjectFooter, fetch_footer};
use nova_core::object_store::{ObjectStore, S3Config, S3Store};
use nova_testkit::history::History;
use nova_testkit::{Etcd, Moto, Novad, NovadBuilder};

use common::{client, eventually, read_all, wait_exit};
use fleet_common::*;

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
    // Every star lists every stream, wherever it was created.
    for novad in &stars {
        use futures::StreamExt;
        let listed: Vec<String> = client(novad)
            .await
            .list_all_streams("s")
            .map(|info| info.expect("list").name)
            .collect()
            .await;
        assert_eq!(listed, streams, "listed through {}", novad.url());
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
    let streams = create_streams(&first, "k", 4).await;
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
    stars[1].kill9();
    // Back at once under its id: it waits out its old lease (or the survivor's takeover of its
    // chain, whichever began first), then joins and serves again.
    stars[1].restart();
    eventually(
        Duration::from_secs(30),
        "the restarted star to join",
        || stars[1].log().contains("joined the fleet"),
    )
    .await;
    let after = client(&stars[1]).await;
    for stream in &streams {
        let read = read_all_patiently(&after, stream).await;
        let expected: Vec<String> = (0..10).map(|i| format!("{stream}-{i}")).collect();
        assert_eq!(read, expected, "{stream}");
    }
    let led: BTreeSet<String> = leaders(&after, &streams).await.into_values().collect();
    assert!(!led.is_empty() && led.iter().all(|l| l == "star-0" || l == "star-1"));
}

/// kill -9 of a star under load: a survivor takes its chain over after its lease lapses, its
/// streams are led again, and every producer carries on: every acknowledged record reads back
/// at its seq, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_star_under_load_is_taken_over_without_losing_a_record() {
    let (_etcd, _moto, mut stars) = fleet(3);
    let entry = client(&stars[0]).await;
    let streams = create_streams(&entry, "t", 6).await;
    let victim = victim(&entry, &streams).await;
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 600, &history);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stars[victim].kill9();
    finish(&entry, &streams, running, 600, &history).await;
    let after = leaders(&entry, &streams).await;
    assert!(
        after.values().all(|l| *l != format!("star-{victim}")),
        "streams still led by the killed star: {after:?}"
    );
    let takeovers: f64 = stars
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .filter_map(|(_, s)| s.metric("nova_fleet_takeovers_total"))
        .sum();
    assert_eq!(takeovers, 1.0, "one survivor took the chain over");
}

/// A star paused (SIGSTOP) past its lease is taken over; resumed, it acknowledges nothing more
/// (it finds its lease gone, stops leading and exits for its supervisor to restart it), and
/// nothing it acknowledged before the pause is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_paused_past_its_lease_is_taken_over_and_acknowledges_nothing_more() {
    let (_etcd, _moto, mut stars) = fleet(3);
    let entry = client(&stars[0]).await;
    let streams = create_streams(&entry, "p", 6).await;
    let victim = victim(&entry, &streams).await;
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 600, &history);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stars[victim].pause();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    eventually(
        Duration::from_secs(30),
        "a survivor to take the chain over",
        || {
            survivors
                .iter()
                .filter_map(|i| stars[*i].metric("nova_fleet_takeovers_total"))
                .sum::<f64>()
                >= 1.0
        },
    )
    .await;
    stars[victim].resume();
    let status = wait_exit(&mut stars[victim], Duration::from_secs(30));
    assert!(
        !status.success(),
        "a star that lost its lease exits to be restarted"
    );
    let log = stars[victim].log();
    assert!(
        log.contains("fleet lease") || log.contains("no longer owns its chain"),
        "{log}"
    );
    finish(&entry, &streams, running, 600, &history).await;
    // Restarted, it rejoins as a fresh incarnation and may lead again.
    stars[victim].kill9();
    stars[victim].restart();
    eventually(Duration::from_secs(30), "the star to rejoin", || {
        stars[victim].log().contains("joined the fleet")
    })
    .await;
}

/// Budgets small enough that a star's saturation is set by its sessions: 48 MiB of fixed terms
/// and 8 MiB per session under a 64 MiB ceiling reads 0.75 idle (clear: below 0.9 − 0.1),
/// 0.875 with one session, and saturated from two.
const SMALL_BUDGETS: [&str; 17] = [
    // The admission term is at least what the largest batch can hold.
    "--max-batch-bytes",
    "1MiB",
    "--s3-memory-buffer-mib",
    "16",
    "--tail-window-cache-mib",
    "16",
    "--read-memory-mib",
    "16",
    // No recycled buffers: the saturation tests count the budgets and windows alone (48 MiB
    // of a 64 MiB ceiling clears only with no session open).
    "--recycle-buffer-mib",
    "0",
    "--auditor",
    "false",
    "--grpc-stream-window-kib",
    "8192",
    "--max-producer-sessions",
    "64",
    "--allow-memory-overcommit",
];

fn small_star(etcd: &Etcd, moto: &Moto, id: &str, ceiling: &str) -> NovadBuilder {
    star(etcd, moto, id)
        .args(SMALL_BUDGETS)
        .args(["--memory-ceiling", ceiling])
}

/// A saturated star takes no new leadership: streams created while it is saturated go to the
/// others; when every star is saturated, creating a stream is refused with RESOURCE_EXHAUSTED
/// naming the fleet's capacity, with a retry hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_stars_take_no_new_streams_and_a_full_fleet_refuses_with_a_hint() {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    // 48 MiB of fixed terms under 32 MiB: saturated from the start.
    let full = small_star(&etcd, &moto, "full-0", "32MiB").start();
    let open = star(&etcd, &moto, "open-0").start();
    let entry = client(&full).await;
    let streams: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
    eventually(
        Duration::from_secs(10),
        "the saturated star to say so",
        || full.metric("nova_memory_saturated") == Some(1.0),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for stream in &streams {
        let info = entry.create_stream(stream).await.expect("create");
        assert_eq!(
            info.leader_id, "open-0",
            "{stream} placed on a saturated star"
        );
    }
    drop(open);
    // Its lease lapses, and the fleet sees it gone.
    tokio::time::sleep(Duration::from_secs(TTL_SECS + 2)).await;
    let mut full2 = small_star(&etcd, &moto, "full-1", "32MiB").start();
    // The open star is gone (killed: its streams wait for a takeover); both left are full.
    eventually(
        Duration::from_secs(20),
        "the fleet to see both full stars",
        || full.metric("nova_fleet_stars") == Some(2.0),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused = entry
        .create_stream("one-more")
        .await
        .expect_err("a full fleet refuses new streams");
    assert_eq!(
        refused.code(),
        Some(tonic::Code::ResourceExhausted),
        "{refused}"
    );
    assert!(refused.to_string().contains("fleet capacity"), "{refused}");
    match &refused {
        nova_client::Error::Status { retry_after, .. } => {
            assert!(retry_after.is_some(), "a retry hint")
        }
        other => panic!("{other}"),
    }
    let refusals: f64 = [&full, &full2]
        .iter()
        .filter_map(|s| s.metric("nova_fleet_capacity_refusals_total"))
        .sum();
    assert!(refusals >= 1.0);
    // A shed like any other: counted under its cap, and logged naming the cap, the stream and
    // the peer, by the star that refused it.
    let sheds: f64 = [&full, &full2]
        .iter()
        .filter_map(|s| s.metric("nova_sheds_total{cap=\"fleet_capacity\"}"))
        .sum();
    assert!(sheds >= 1.0, "the refusal is counted as a shed");
    let logged = [&full, &full2].iter().map(|s| s.log()).find(|log| {
        log.lines().any(|line| {
            line.contains("shed new work: fleet capacity reached")
                && line.contains("fleet_capacity")
                && line.contains("one-more")
                && line.contains("127.0.0.1")
        })
    });
    assert!(
        logged.is_some(),
        "the shed is logged with its cap, stream and peer: {:?}",
        [&full, &full2]
            .iter()
            .flat_map(|s| {
                s.log()
                    .lines()
                    .filter(|l| l.contains("shed"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    );
    full2.kill9();
}

/// A star pushed over its saturation threshold by its producers' sessions hands streams off,
/// one at a time, until it clears; the producers follow their streams and lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_star_hands_streams_off_until_it_clears() {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let stars = [
        star(&etcd, &moto, "a").start(),
        star(&etcd, &moto, "b").start(),
        small_star(&etcd, &moto, "c", "64MiB").start(),
    ];
    let entry = client(&stars[0]).await;
    let streams = create_streams(&entry, "h", 9).await;
    let placed = leaders(&entry, &streams).await;
    let on_c = placed.values().filter(|l| *l == "c").count();
    assert!(on_c >= 2, "star c leads {on_c} streams: {placed:?}");
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 1200, &history);
    eventually(Duration::from_secs(20), "star c to saturate", || {
        stars[2].metric("nova_memory_saturated") == Some(1.0)
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while stars[2].metric("nova_memory_saturated") != Some(0.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "star c did not hand streams off and clear:\n{}",
            stars[2].log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let handoffs = stars[2]
        .metric("nova_fleet_handoffs_total{reason=\"saturated\"}")
        .unwrap_or(0.0);
    assert!(handoffs >= 1.0, "handoffs: {handoffs}");
    finish(&entry, &streams, running, 1200, &history).await;
}

/// A rolling restart under load: each star in turn gets SIGTERM (it lands and absorbs what it
/// admitted, hands its streams to the others and leaves), then starts again. No producer fails
/// beyond its retry budget; every acknowledged record reads back once, at its seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing() {
    let (_etcd, _moto, mut stars) = fleet(3);
    let entry = client(&stars[0]).await;
    let streams = create_streams(&entry, "r", 6).await;
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 1500, &history);
    for i in [1, 2, 0] {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let status = stars[i].terminate(Duration::from_secs(60));
        assert!(status.success(), "star-{i} drained and exited cleanly");
        let log = stars[i].log();
        assert!(log.contains("left the fleet"), "{log}");
        stars[i].restart();
    }
    finish(&entry, &streams, running, 1500, &history).await;
    let handed: f64 = stars
        .iter()
        .filter_map(|s| s.metric("nova_fleet_stars"))
        .sum();
    assert_eq!(handed, 9.0, "every star sees the whole fleet again");
}

/// A partition: a star in a network namespace of its own, joined to the host by a veth pair,
/// reaches the object store and etcd only through forwarders on the pair's host address. Its
/// etcd forwarder stops answering while its producers still reach it: it stops acknowledging
/// once its lease can no longer be trusted and exits; a survivor takes its chain over; after
/// the partition heals it rejoins. Nothing it acknowledged is lost or acknowledged twice, and
/// the history of appends and reads is linearizable. Without root (no namespaces) the star runs
/// on loopback behind the same forwarders, and the test says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_cut_off_from_etcd_stops_acknowledging_and_is_taken_over() {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let netns = nova_testkit::netns::Netns::create()
        .map_err(|reason| {
            println!("no network namespace ({reason}); the star runs on loopback instead");
        })
        .ok();
    let cut = CutOff::new(netns, etcd.endpoint().parse().expect("etcd"), &moto);
    let cut_off = cut.star();
    let mut stars = [
        star(&etcd, &moto, "star-0").start(),
        star(&etcd, &moto, "star-1").start(),
        cut_off.start(),
    ];
    let entry = client(&stars[0]).await;
    let streams = create_streams(&entry, "x", 6).await;
    let placed = leaders(&entry, &streams).await;
    assert!(
        placed.values().any(|l| l == "star-2"),
        "the partitioned star leads a stream: {placed:?}"
    );
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 1500, &history);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cut.to_etcd.set(nova_testkit::Fault::Hang);
    let status = wait_exit(&mut stars[2], Duration::from_secs(30));
    assert!(!status.success());
    let log = stars[2].log();
    assert!(log.contains("can no longer be trusted"), "{log}");
    eventually(
        Duration::from_secs(30),
        "a survivor to take the chain over",
        || {
            stars[..2]
                .iter()
                .filter_map(|s| s.metric("nova_fleet_takeovers_total"))
                .sum::<f64>()
                >= 1.0
        },
    )
    .await;
    cut.to_etcd.set(nova_testkit::Fault::Pass);
    stars[2].kill9();
    stars[2].restart();
    finish(&entry, &streams, running, 1500, &history).await;
}

/// The SDK as a fleet's users meet it: a client configured with several endpoints (the first
/// unreachable) reaches the fleet; per-stream handles produce and consume across redirects; the
/// consumer is a `futures::Stream` of records; listing pages through every stream; errors come
/// with the SDK's own codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_meets_the_fleet_through_any_endpoint() {
    use futures::StreamExt;
    use nova_client::{ClientConfig, ErrorCode, ReadOptions, RetryPolicy, StorageClass};

    let (_etcd, _moto, stars) = fleet(3);
    let dead = format!("http://127.0.0.1:{}", nova_testkit::free_port());
    let config = ClientConfig::new([dead, stars[1].url()])
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(30))
        .with_retry(RetryPolicy::default());
    let client = Client::connect_with(config).await.expect("connect");
    let names: Vec<String> = (0..7).map(|i| format!("sdk{i}")).collect();
    for name in &names {
        let info = client.create_stream(name).await.expect("create");
        assert_eq!(info.storage_class, StorageClass::Standard);
    }
    for name in &names {
        let handle = client.stream(name.clone());
        let producer = handle
            .producer(ProducerConfig::default())
            .await
            .expect("producer");
        for i in 0..5 {
            producer
                .append(Record::new(format!("{name}-{i}")))
                .await
                .expect("append");
        }
        producer.close().await.expect("close");
        let bodies: Vec<String> = handle
            .consumer(0)
            .page_size(2, 0)
            .records()
            .map(|r| String::from_utf8(r.expect("record").record.body.to_vec()).expect("utf8"))
            .collect()
            .await;
        let expected: Vec<String> = (0..5).map(|i| format!("{name}-{i}")).collect();
        assert_eq!(bodies, expected, "{name} as a stream of records");
        let page = handle.read(3, ReadOptions::default()).await.expect("read");
        assert_eq!(page.records.first().map(|r| r.seq), Some(3));
    }
    // Listing asks for the next page until there is none.
    let listed: Vec<String> = client
        .list_all_streams("sdk")
        .map(|info| info.expect("list").name)
        .collect()
        .await;
    assert_eq!(listed, names);
    let missing = client
        .stream("nope")
        .describe()
        .await
        .expect_err("no such stream");
    assert_eq!(missing.kind(), ErrorCode::StreamNotFound);
    let exists = client.create_stream("sdk0").await.expect_err("exists");
    assert_eq!(exists.kind(), ErrorCode::StreamExists);
}

/// A stream placed on a star that cannot take it up (at its --max-streams) is not stuck there:
/// the star gives the leader record back and tells the fleet it is full, and the stream is
/// placed on a star that can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_star_gives_streams_back_to_be_placed_elsewhere() {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let open = star(&etcd, &moto, "open").start();
    let small = star(&etcd, &moto, "small")
        .args(["--max-streams", "1"])
        .start();
    let entry = client(&open).await;
    let streams: Vec<String> = (0..4).map(|i| format!("f{i}")).collect();
    let mut on_small = 0;
    for stream in &streams {
        let info = entry.create_stream(stream).await.expect("create");
        on_small += usize::from(info.leader_id == "small");
    }
    assert!(on_small >= 2, "{on_small} streams placed on the small star");
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 50, &history);
    finish(&entry, &streams, running, 50, &history).await;
    let after = leaders(&entry, &streams).await;
    assert_eq!(
        after.values().filter(|l| *l == "small").count(),
        1,
        "the small star leads one stream, the rest moved: {after:?}"
    );
    assert!(small.log().contains("this star takes no more streams"));
}

/// The flights under `chain/{star}/` (not fences, not settle markers).
async fn flights_of(store: &dyn ObjectStore, star: &str) -> usize {
    let mut count = 0;
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(&format!("chain/{star}/"), after.as_deref(), 1000)
            .await
            .expect("list");
        for object in &page.objects {
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

/// A star that leaves for good leaves nothing behind: after its chain is taken over, one
/// survivor adopts it, settles the flights it had absorbed but never settled into objects under
/// the adopter's own prefix, and the flights are collected; every record still reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_stars_unsettled_flights_are_adopted_settled_and_collected() {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    // Own chains settle only after an hour, so what the victim absorbed is still in its flights
    // when it dies (and only an adopter settles it); collection follows at once.
    let audited = [
        "--auditor-settle-after-secs",
        "3600",
        "--auditor-collect-grace-secs",
        "1",
    ];
    let mut stars: Vec<Novad> = (0..3)
        .map(|i| {
            star(&etcd, &moto, &format!("star-{i}"))
                .args(audited)
                .start()
        })
        .collect();
    let entry = client(&stars[0]).await;
    let streams = create_streams(&entry, "adopt", 6).await;
    let victim = victim(&entry, &streams).await;
    let victim_id = format!("star-{victim}");
    let history = Arc::new(History::new());
    let mut acked = Vec::new();
    for stream in &streams {
        acked.push(produce_into(entry.clone(), stream.clone(), 40, history.clone()).await);
    }
    let store: Arc<dyn ObjectStore> = {
        let mut config = S3Config::new(BUCKET);
        config.endpoint = Some(moto.endpoint());
        config.credentials = Some(("test".into(), "testtest".into()));
        Arc::new(S3Store::new(config).await)
    };
    assert!(
        flights_of(store.as_ref(), &victim_id).await > 0,
        "the victim's records are still in its flights"
    );
    stars[victim].kill9();

    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    eventually(
        Duration::from_secs(60),
        "a survivor to adopt the departed star's chain",
        || {
            survivors
                .iter()
                .filter_map(|i| stars[*i].metric("nova_auditor_adopted_chains"))
                .sum::<f64>()
                == 1.0
        },
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while flights_of(store.as_ref(), &victim_id).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the adopter did not settle and collect the departed star's flights:\n{}",
            survivors
                .iter()
                .map(|i| stars[*i].log())
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (stream, acked) in streams.iter().zip(&acked) {
        check_exactly_once(&entry, stream, acked).await;
    }
    check_history(&entry, &streams, &history).await;
    // The adopter looks after it until the star comes back, and no longer then.
    stars[victim].restart();
    eventually(
        Duration::from_secs(30),
        "the adoption to end once the star rejoined",
        || {
            survivors
                .iter()
                .filter_map(|i| stars[*i].metric("nova_auditor_adopted_chains"))
                .sum::<f64>()
                == 0.0
        },
    )
    .await;
    assert!(
        survivors.iter().any(|i| stars[*i]
            .log()
            .contains("released the adopted chain of a star")),
        "the adopter released its key for the rejoined star"
    );
    let rejoined = client(&stars[victim]).await;
    for (stream, acked) in streams.iter().zip(&acked) {
        check_exactly_once(&rejoined, stream, acked).await;
    }
}

/// `nova read --follow` through a star that does not lead the stream (a redirect), across the
/// leader's kill -9 and a survivor's takeover: every record printed once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_follower_is_redirected_and_survives_its_leaders_takeover() {
    use std::io::{BufRead, BufReader};
    let (_etcd, _moto, mut stars) = fleet(2);
    let entry = client(&stars[0]).await;
    // A stream led by star-1, so that the follower on star-0 is redirected.
    let streams = create_streams(&entry, "f", 6).await;
    let placed = leaders(&entry, &streams).await;
    let Some(stream) = placed
        .iter()
        .find(|(_, leader)| *leader == "star-1")
        .map(|(s, _)| s.clone())
    else {
        panic!("no stream landed on star-1: {placed:?}");
    };
    let mut follower = std::process::Command::new(nova_testkit::workspace_binary("nova"))
        .args(["--server", &stars[0].url(), "read", &stream, "--follow"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run nova");
    let (lines, printed) = std::sync::mpsc::channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let append = |client: Client, range: std::ops::Range<u32>| {
        let stream = stream.clone();
        async move {
            let producer = Producer::new(client, stream.clone(), ProducerConfig::default())
                .await
                .expect("producer");
            for i in range {
                producer
                    .append(Record::new(format!("r{i}")))
                    .await
                    .expect("append");
            }
            producer.close().await.expect("close");
        }
    };
    let take = |n: usize| -> Vec<String> {
        (0..n)
            .map(|_| {
                printed
                    .recv_timeout(Duration::from_secs(60))
                    .expect("the follower printed every record")
            })
            .collect()
    };
    append(entry.clone(), 0..5).await;
    assert_eq!(take(5), ["r0", "r1", "r2", "r3", "r4"]);
    stars[1].kill9();
    append(entry.clone(), 5..10).await;
    let want: Vec<String> = (5..10).map(|i| format!("r{i}")).collect();
    assert_eq!(take(5), want, "after the takeover, from where it was");
    assert!(
        printed.recv_timeout(Duration::from_millis(500)).is_err(),
        "nothing twice"
    );
    let _ = follower.kill();
    let _ = follower.wait();
}

/// `nova bench` through one star of a fleet sends each session to the star leading its
/// streams, so a load over many streams runs without a single refusal (it used to send every
/// session to its first stream's star, and the rest of its streams died on `not_leader`).
#[tokio::test(flavor = "multi_thread")]
async fn bench_routes_each_session_to_its_streams_leader() {
    let (_etcd, _moto, stars) = fleet(2);
    let output = std::process::Command::new(nova_testkit::workspace_binary("nova"))
        .args([
            "--server",
            &stars[0].url(),
            "--output",
            "json",
            "bench",
            "--sessions",
            "4",
            "--streams",
            "24",
            "--record-bytes",
            "1KiB",
            "--batch-records",
            "16",
            "--duration",
            "3s",
        ])
        .output()
        .expect("run nova bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    assert_eq!(
        report["leaders"], 2,
        "placement spread 24 streams: {report}"
    );
    assert!(report["sessions"].as_u64().unwrap() >= 4, "{report}");
    assert!(report["records"].as_u64().unwrap() > 0, "{report}");
}
