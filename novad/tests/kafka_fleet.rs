//! Kafka clients meet a fleet of three stars on a real etcd and moto: every star's Metadata
//! names each partition's leading star, consumer groups have one coordinator the whole fleet
//! agrees on, and clients follow a partition when its leader stops (a handoff) or dies (a
//! takeover), losing and repeating nothing.

mod common;
mod fleet_common;
mod kafka_common;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nova_testkit::{Etcd, Moto, Novad, free_port, python};

use common::{client, read_all};
use fleet_common::{BUCKET, leaders, star};
use kafka_common::{assert_delivered_once_in_order, kcat};

/// A fleet of `n` stars, each serving Kafka on a port of its own; with each star its Kafka
/// address.
fn kafka_fleet(n: usize) -> (Etcd, Moto, Vec<Novad>, Vec<String>) {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let mut stars = Vec::new();
    let mut addresses = Vec::new();
    for i in 0..n {
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        stars.push(
            star(&etcd, &moto, &format!("star-{i}"))
                .args(["--kafka-listen", address.as_str()])
                .start(),
        );
        nova_testkit::wait_for_port(port, Duration::from_secs(10), "the Kafka listener");
        addresses.push(address);
    }
    // Every star sees the whole fleet before the test asks: until then a star's Metadata and
    // FindCoordinator answers come from a view missing the stars that joined after it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stars
        .iter()
        .any(|s| s.metric("nova_fleet_stars") != Some(n as f64))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the stars never all saw each other"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (etcd, moto, stars, addresses)
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/python/{name}"))
}

/// Runs a Python test script to its end; it must succeed. Its standard output.
fn run_python(name: &str, args: &[&str]) -> String {
    let output = Command::new(python())
        .arg(script(name))
        .args(args)
        .output()
        .expect("run python (scripts/test installs confluent-kafka and kafka-python)");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{name} {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// What the star at `bootstrap` says of `topic`: each partition's leader's Kafka address, and
/// the Kafka address of `group`'s coordinator.
fn metadata(bootstrap: &str, topic: &str, group: &str) -> (BTreeMap<i32, String>, String) {
    let out = run_python("kafka_metadata.py", &[bootstrap, topic, group]);
    let mut partitions = BTreeMap::new();
    let mut coordinator = String::new();
    for line in out.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["coordinator", _, at] => coordinator = (*at).to_owned(),
            [partition, leader] => {
                partitions.insert(partition.parse().unwrap(), (*leader).to_owned());
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (partitions, coordinator)
}

/// The index of star `id` ("star-2" → 2).
fn index_of(id: &str) -> usize {
    id.trim_start_matches("star-").parse().expect("a star id")
}

#[test]
fn metadata_from_every_star_names_each_partitions_leader_and_one_coordinator() {
    let (_etcd, _moto, stars, kafka) = kafka_fleet(3);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let streams: Vec<String> = (0..6).map(|p| format!("spread/{p}")).collect();
    let placed = rt.block_on(async {
        let entry = client(&stars[0]).await;
        for stream in &streams {
            entry.create_stream(stream).await.expect("create");
        }
        leaders(&entry, &streams).await
    });
    let expected: BTreeMap<i32, String> = streams
        .iter()
        .enumerate()
        .map(|(p, stream)| (p as i32, kafka[index_of(&placed[stream])].clone()))
        .collect();
    let used: std::collections::BTreeSet<&String> = expected.values().collect();
    assert!(
        used.len() >= 2,
        "six partitions all on one star: {placed:?}"
    );
    let mut coordinators = Vec::new();
    for bootstrap in &kafka {
        let (partitions, coordinator) = metadata(bootstrap, "spread", "readers");
        assert_eq!(partitions, expected, "Metadata through {bootstrap}");
        coordinators.push(coordinator);
    }
    assert!(
        kafka.contains(&coordinators[0]) && coordinators.iter().all(|c| *c == coordinators[0]),
        "every star names the same coordinator of a group: {coordinators:?}"
    );
    // kcat, bootstrapped at one star, writes each partition at its leader and reads it back.
    for p in 0..6 {
        let partition = p.to_string();
        kcat(
            &kafka[0],
            &["-P", "-t", "spread", "-p", &partition],
            format!("line {p}\n").as_bytes(),
        );
    }
    for p in 0..6 {
        let partition = p.to_string();
        let out = kcat(
            &kafka[0],
            &[
                "-C",
                "-t",
                "spread",
                "-p",
                &partition,
                "-o",
                "beginning",
                "-e",
                "-q",
            ],
            b"",
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("line {p}\n"));
    }
    let stored = rt.block_on(async {
        let entry = client(&stars[1]).await;
        let mut stored = Vec::new();
        for stream in &streams {
            stored.push(read_all(&entry, stream).await);
        }
        stored
    });
    for (p, records) in stored.iter().enumerate() {
        assert_eq!(records, &[format!("line {p}")], "stream spread/{p}");
    }
}

/// A confluent-kafka idempotent producer, bootstrapped at all three stars, writes 40,000
/// records to one partition while the partition's leader is stopped (it hands its streams
/// back to the fleet, and another star takes the partition up) and then its next leader is
/// killed -9 (a survivor takes its chain over). Every record the client was told is delivered
/// is stored once, at the offset it was told, in order.
#[test]
fn an_idempotent_producer_follows_a_handoff_and_a_takeover_and_writes_each_record_once() {
    const RECORDS: usize = 40_000;
    let (_etcd, _moto, mut stars, kafka) = kafka_fleet(3);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The partition's leader as star `alive` finds it: asked again while it is being moved
    // (a describe is redirected to a leader that may have just stopped).
    let leader_of = |stars: &[Novad], alive: usize| -> usize {
        rt.block_on(async {
            let entry = client(&stars[alive]).await;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                match entry.describe_stream("moving/0").await {
                    Ok(info) if !info.leader_id.is_empty() => return index_of(&info.leader_id),
                    answer => assert!(
                        std::time::Instant::now() < deadline,
                        "no leader of moving/0 found: {answer:?}"
                    ),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    rt.block_on(async {
        client(&stars[0])
            .await
            .create_stream("moving/0")
            .await
            .expect("create")
    });
    let bootstrap = kafka.join(",");
    let delivered_file = stars[0].data_dir().join("delivered.txt");
    let mut producer = Command::new(python())
        .arg(script("kafka_idempotent.py"))
        .args([bootstrap.as_str(), "moving"])
        .arg(&delivered_file)
        .arg(RECORDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the idempotent producer (scripts/test installs confluent-kafka)");
    let stdout = std::io::BufReader::new(producer.stdout.take().unwrap());
    let mut handed_off = None;
    let mut taken_over = None;
    let mut summary = String::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(count) = line.strip_prefix("delivered ") {
            let count: usize = count.parse().unwrap();
            if count >= 8_000 && handed_off.is_none() {
                let leader = leader_of(&stars, 0);
                stars[leader].terminate(Duration::from_secs(60));
                eprintln!("{count} delivered: star-{leader}, the partition's leader, stopped");
                handed_off = Some(leader);
            } else if count >= 14_000 && taken_over.is_none() {
                let stopped = handed_off.unwrap();
                let alive = (0..3).find(|i| *i != stopped).unwrap();
                let leader = leader_of(&stars, alive);
                assert_ne!(leader, stopped, "the stopped star leads nothing");
                // The stopped star comes back first, so two stars are left to take over.
                stars[stopped].restart();
                stars[leader].kill9();
                eprintln!("{count} delivered: star-{leader}, the partition's leader, killed");
                taken_over = Some(leader);
            }
        } else if line.starts_with("done") {
            summary = line;
        }
    }
    let status = producer.wait().unwrap();
    assert!(status.success(), "the producer failed: {summary}");
    let (Some(stopped), Some(killed)) = (handed_off, taken_over) else {
        panic!("the handoff and the takeover did not both happen: {summary}");
    };
    let survivor = (0..3).find(|i| *i != killed).unwrap();
    let after = leader_of(&stars, survivor);
    assert_ne!(after, killed, "the killed star's partition was taken over");
    println!("led by star-{stopped}, then star-{killed}, then star-{after}");
    let stored = rt.block_on(async { read_all(&client(&stars[survivor]).await, "moving/0").await });
    let stored = assert_delivered_once_in_order(&delivered_file, &stored, RECORDS, &summary);
    println!("{summary}; {stored} stored");
}

/// Three kafka-python consumers of one group share a six-partition topic spread over the
/// fleet (one leaves, the others take its partitions over); then the star coordinating the
/// group is killed -9, and new members, through the other stars, go on from the offsets the
/// group committed (kept in etcd), skipping nothing and repeating nothing.
#[test]
fn a_consumer_group_survives_the_loss_of_its_coordinator_star() {
    let (_etcd, _moto, mut stars, kafka) = kafka_fleet(3);
    let first = run_python("kafka_group.py", &[&kafka.join(","), "first"]);
    assert!(
        first.contains("after leave") && first.contains("phase passed"),
        "{first}"
    );
    let (_, coordinator) = metadata(&kafka[0], "shared", "g");
    let lost = kafka
        .iter()
        .position(|k| *k == coordinator)
        .expect("the coordinator is a star of the fleet");
    stars[lost].kill9();
    let rest: Vec<String> = (0..3)
        .filter(|i| *i != lost)
        .map(|i| kafka[i].clone())
        .collect();
    let second = run_python("kafka_group.py", &[&rest.join(","), "second"]);
    let (_, moved) = metadata(&rest[0], "shared", "g");
    assert_ne!(moved, coordinator, "another star coordinates the group now");
    // Any star tells the group's committed offsets (kept in etcd): all 900 records consumed.
    let survivor = (0..3).find(|i| *i != lost).unwrap();
    let output = Command::new(nova_testkit::workspace_binary("nova"))
        .args(["--server", &stars[survivor].url(), "--output", "json"])
        .args(["group", "describe", "g"])
        .output()
        .expect("run nova");
    assert!(output.status.success(), "{output:?}");
    let described: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let offsets = described["offsets"].as_array().expect("offsets");
    let committed: i64 = offsets
        .iter()
        .map(|o| o["committed"].as_i64().unwrap())
        .sum();
    assert_eq!((offsets.len(), committed), (6, 900), "{described}");
    assert_eq!(described["lag"], 0, "{described}");
    println!("{first}{second}");
}
