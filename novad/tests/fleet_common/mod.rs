//! What the fleet's end-to-end tests share: a fleet of real stars on etcd and moto, producers
//! and consumers that record one history, and the checks made of it at the end.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use nova_client::{Client, Producer, ProducerConfig, Record};
use nova_testkit::history::History;
use nova_testkit::netns::Netns;
use nova_testkit::{Etcd, FaultProxy, Moto, Novad, NovadBuilder};

use crate::common::{novad, via_endpoint, with_s3};

pub const BUCKET: &str = "fleet";
pub const TTL_SECS: u64 = 3;

pub fn star(etcd: &Etcd, moto: &Moto, id: &str) -> NovadBuilder {
    star_on(&etcd.url(), moto, id)
}

/// Star `id` of the fleet whose etcd answers at `metastore` (an `etcd://` URL).
pub fn star_on(metastore: &str, moto: &Moto, id: &str) -> NovadBuilder {
    fleet_member(with_s3(novad(), moto, BUCKET), metastore, id)
}

/// `star` as fleet member `id`, its etcd at `metastore`, with the fleet tests' lease.
fn fleet_member(star: NovadBuilder, metastore: &str, id: &str) -> NovadBuilder {
    star.args([
        "--metastore",
        metastore,
        "--star-id",
        id,
        "--lease-ttl-secs",
        &TTL_SECS.to_string(),
    ])
}

/// The way to a star that a test cuts off: fault proxies to etcd and to the store, listening
/// where the star reaches them (from its network namespace when the machine allows one, over
/// loopback otherwise).
pub struct CutOff {
    pub netns: Option<Netns>,
    pub to_etcd: FaultProxy,
    pub to_moto: FaultProxy,
}

impl CutOff {
    pub fn new(netns: Option<Netns>, etcd: std::net::SocketAddr, moto: &Moto) -> Self {
        let host = netns
            .as_ref()
            .map_or(std::net::IpAddr::from([127, 0, 0, 1]), Netns::host_ip);
        let to_etcd = FaultProxy::start_on(host, etcd);
        let to_moto = FaultProxy::start_on(
            host,
            moto.endpoint()
                .trim_start_matches("http://")
                .parse()
                .expect("moto"),
        );
        Self {
            netns,
            to_etcd,
            to_moto,
        }
    }

    /// Star "star-2", reaching the store and etcd only through the proxies.
    pub fn star(&self) -> NovadBuilder {
        let star = fleet_member(
            via_endpoint(novad(), &self.to_moto.endpoint(), BUCKET)
                .args(["--s3-request-timeout-ms", "2000"]),
            &format!(
                "etcd://{}",
                self.to_etcd.endpoint().trim_start_matches("http://")
            ),
            "star-2",
        );
        match &self.netns {
            Some(ns) => star.netns(ns.name(), ns.ns_ip()),
            None => star,
        }
    }
}

pub fn fleet(n: usize) -> (Etcd, Moto, Vec<Novad>) {
    let etcd = Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let stars = (0..n)
        .map(|i| star(&etcd, &moto, &format!("star-{i}")).start())
        .collect();
    (etcd, moto, stars)
}

/// Which star leads each stream, by `DescribeStream`.
pub async fn leaders(client: &Client, streams: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stream in streams {
        let info = client.describe_stream(stream).await.expect("describe");
        out.insert(stream.clone(), info.leader_id.clone());
    }
    out
}

/// Creates `n` streams named `prefix0`, `prefix1`, … through `client`.
pub async fn create_streams(client: &Client, prefix: &str, n: usize) -> Vec<String> {
    let streams: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    for stream in &streams {
        client.create_stream(stream).await.expect("create");
    }
    streams
}

/// A star other than the entry point (star-0) that leads at least one of `streams`.
pub async fn victim(entry: &Client, streams: &[String]) -> usize {
    let placed = leaders(entry, streams).await;
    (1..3)
        .find(|i| placed.values().any(|l| *l == format!("star-{i}")))
        .expect("a star other than the entry leads a stream")
}

/// Waits for the load to finish, then checks that every producer got all `n` records
/// acknowledged, each reads back once at its seq, and the history is linearizable.
pub async fn finish(
    entry: &Client,
    streams: &[String],
    running: tokio::task::JoinHandle<Vec<Vec<(u64, String)>>>,
    n: usize,
    history: &History,
) {
    let acked = running.await.expect("load");
    for (stream, acked) in streams.iter().zip(&acked) {
        assert_eq!(acked.len(), n);
        check_exactly_once(entry, stream, acked).await;
    }
    check_history(entry, streams, history).await;
}

/// Appends `n` records to `stream` through `client`, a few at a time, recording each
/// acknowledgement in `history` as it arrives, and returns each acknowledged record's body with
/// its sequence number.
pub async fn produce_into(
    client: Client,
    stream: String,
    n: usize,
    history: Arc<History>,
) -> Vec<(u64, String)> {
    let config = ProducerConfig {
        max_retries: 20,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client, stream.clone(), config)
        .await
        .expect("producer");
    // Tickets are awaited in order as they come, so each ack is recorded when it arrives.
    let (tickets, mut pending) =
        tokio::sync::mpsc::channel::<(String, nova_client::AppendTicket)>(n.max(1));
    let waiter = {
        let stream = stream.clone();
        tokio::spawn(async move {
            let mut acked = Vec::with_capacity(n);
            while let Some((body, ticket)) = pending.recv().await {
                let seq = ticket
                    .wait()
                    .await
                    .expect("acknowledged within the retry budget");
                history.acked(&stream, &body, seq);
                acked.push((seq, body));
            }
            acked
        })
    };
    for i in 0..n {
        let body = format!("{stream}-{i}");
        let ticket = producer
            .append(Record::new(body.clone()))
            .await
            .expect("append");
        tickets.send((body, ticket)).await.expect("waiter");
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(tickets);
    let acked = waiter.await.expect("waiter task");
    producer.close().await.expect("close");
    acked
}

/// Reads `stream` from 0 as a consumer following its tail would, recording every page in
/// `history`, until it has read `until` records. Reads that fail in a way worth retrying (the
/// leader gone, the stream being taken over or handed off) are retried.
pub async fn consume(client: Client, stream: String, until: u64, history: Arc<History>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut next = 0;
    while next < until {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stream}: the consumer read only {next} of {until}"
        );
        let began = std::time::Instant::now();
        match client.read(&stream, next, 0).await {
            Ok(page) => {
                let records: Vec<(u64, String)> = page
                    .records
                    .iter()
                    .map(|r| {
                        let body = String::from_utf8(r.record.body.to_vec()).expect("utf8");
                        (r.seq, body)
                    })
                    .collect();
                history.read(&stream, began, records, page.tail_seq);
                if page.records.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                next = page.next_seq.max(next);
            }
            Err(err) if err.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("{stream}: a consumer's read failed: {err}"),
        }
    }
}

/// Producers and consumers on every stream, recording one history; returns each stream's
/// acknowledged records once every producer and consumer is done.
pub fn load(
    entry: &Client,
    streams: &[String],
    n: usize,
    history: &Arc<History>,
) -> tokio::task::JoinHandle<Vec<Vec<(u64, String)>>> {
    let producers: Vec<_> = streams
        .iter()
        .map(|stream| {
            tokio::spawn(produce_into(
                entry.clone(),
                stream.clone(),
                n,
                history.clone(),
            ))
        })
        .collect();
    let consumers: Vec<_> = streams
        .iter()
        .map(|stream| {
            tokio::spawn(consume(
                entry.clone(),
                stream.clone(),
                n as u64,
                history.clone(),
            ))
        })
        .collect();
    tokio::spawn(async move {
        let mut acked = Vec::new();
        for producer in producers {
            acked.push(producer.await.expect("producer task"));
        }
        for consumer in consumers {
            consumer.await.expect("consumer task");
        }
        acked
    })
}

/// Checks the recorded history against what the streams hold in the end: no lost write, no
/// duplicate, no read that disagrees with the log or goes backwards.
pub async fn check_history(entry: &Client, streams: &[String], history: &History) {
    let mut finals = HashMap::new();
    for stream in streams {
        finals.insert(stream.clone(), read_all_patiently(entry, stream).await);
    }
    assert!(history.len() > streams.len(), "a history was recorded");
    let problems = history.check(&finals);
    assert!(
        problems.is_empty(),
        "the history is not linearizable:\n{}",
        problems.join("\n")
    );
}

/// Every record of a stream, as a consumer would read it while leadership moves: a read that
/// fails in a way worth retrying (its leader gone, the stream being taken over) is retried.
pub async fn read_all_patiently(client: &Client, stream: &str) -> Vec<String> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match client.read(stream, out.len() as u64, 0).await {
            Ok(page) => {
                for r in &page.records {
                    assert_eq!(r.seq, out.len() as u64, "dense sequence numbers from 0");
                    out.push(String::from_utf8(r.record.body.to_vec()).expect("utf8 body"));
                }
                if page.records.is_empty() || page.next_seq >= page.tail_seq {
                    return out;
                }
            }
            Err(err) if err.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("reading {stream}: {err}"),
        }
    }
}

/// Every acknowledged record reads back at its sequence number and no record appears twice.
pub async fn check_exactly_once(client: &Client, stream: &str, acked: &[(u64, String)]) {
    let read = read_all_patiently(client, stream).await;
    let distinct: BTreeSet<&String> = read.iter().collect();
    assert_eq!(distinct.len(), read.len(), "{stream} holds a record twice");
    for (seq, body) in acked {
        assert_eq!(
            read.get(*seq as usize),
            Some(body),
            "{stream}: acknowledged {body} at {seq}"
        );
    }
}
