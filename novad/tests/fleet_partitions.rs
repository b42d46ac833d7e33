//! The fleet under the faults real networks and etcd clusters produce, with real processes: a
//! three-member etcd cluster that loses one member and has another stall, and a star whose
//! packets to the object store, then to etcd too, are dropped silently (iptables in a network
//! namespace). Producers and consumers record one history throughout; at the end every
//! acknowledged record reads back once at its sequence number, no sequence number was
//! acknowledged for two records, and no read went backwards.

mod common;
mod fleet_common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use nova_client::{Client, ClientConfig};
use nova_testkit::history::History;
use nova_testkit::netns::Netns;
use nova_testkit::{EtcdCluster, Fault, FaultProxy, Moto, Novad};

use common::eventually;
use fleet_common::{BUCKET, CutOff, create_streams, finish, leaders, load, star_on};

/// Starts every star of `stars` that has exited, as a supervisor would, until `stop`; returns
/// how many restarts it made. A star exits when it can no longer vouch for its lease.
fn supervise(
    stars: Arc<Mutex<Vec<Novad>>>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async move {
        let mut restarts = 0;
        while !stop.is_cancelled() {
            for star in stars.lock().iter_mut() {
                if let Some(status) = star.try_exit_status() {
                    let log = star.log();
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    println!("a star exited ({status}); starting it again. Its log ended:");
                    for line in tail.iter().rev() {
                        println!("  {line}");
                    }
                    star.kill9();
                    star.restart_detached();
                    restarts += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        restarts
    })
}

/// A client that knows every star, so it reaches the fleet while any one is restarting.
async fn fleet_client(stars: &[Novad]) -> Client {
    let config = ClientConfig {
        endpoints: stars.iter().map(Novad::url).collect(),
        ..ClientConfig::default()
    };
    Client::connect_with(config).await.expect("a star answers")
}

/// Three stars on a three-member etcd cluster, under load: one member is killed, then another
/// is paused for a while (the cluster has no quorum meanwhile), then resumed. Stars whose
/// renewals could not reach a quorum in time exit and are started again. Nothing acknowledged
/// is lost or given twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_etcd_losing_a_member_and_stalling_another_loses_nothing() {
    let mut etcd = EtcdCluster::start(3);
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let stars: Vec<Novad> = (0..3)
        .map(|i| star_on(&etcd.url(), &moto, &format!("star-{i}")).start())
        .collect();
    let entry = fleet_client(&stars).await;
    let streams = create_streams(&entry, "e", 6).await;
    let stars = Arc::new(Mutex::new(stars));
    let stop = tokio_util::sync::CancellationToken::new();
    let supervisor = supervise(stars.clone(), stop.clone());
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 600, &history);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    etcd.kill(0);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    etcd.pause(1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    etcd.resume(1);
    finish(&entry, &streams, running, 600, &history).await;
    stop.cancel();
    let restarts = supervisor.await.expect("supervisor");
    println!("stars restarted after losing their lease: {restarts}");
}

/// A star in a network namespace reaches etcd and the object store through forwarders on the
/// host. Under load, iptables first drops every packet it sends to the object store (it keeps
/// its lease; its appends wait, none is lost), then to etcd as well: it cannot renew its lease,
/// stops acknowledging and exits, and a survivor takes its chain over. Once the packets flow
/// again it is started again. Without root (no namespace, no iptables) the forwarders hang
/// their connections instead, and the test says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_star_whose_packets_are_dropped_loses_nothing_and_acknowledges_nothing_twice() {
    let etcd = nova_testkit::Etcd::start();
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let netns = Netns::create()
        .and_then(|ns| {
            // iptables must work inside it, too.
            ns.drop_to(1).and_then(|()| ns.pass_to(1)).map(|()| ns)
        })
        .map_err(|reason| {
            println!("no network namespace with iptables ({reason}); the forwarders hang instead");
        })
        .ok();
    let cut = CutOff::new(netns, etcd.endpoint().parse().expect("etcd"), &moto);
    let cut_off = cut.star();
    let dropped = |proxy: &FaultProxy, drop: bool| match &cut.netns {
        Some(ns) if drop => ns.drop_to(proxy.port()).expect("iptables"),
        Some(ns) => ns.pass_to(proxy.port()).expect("iptables"),
        None => proxy.set(if drop { Fault::Hang } else { Fault::Pass }),
    };
    let star = |id: &str| star_on(&etcd.url(), &moto, id).start();
    let mut stars = [star("star-0"), star("star-1"), cut_off.start()];
    let entry = fleet_client(&stars[..2]).await;
    let streams = create_streams(&entry, "d", 9).await;
    let placed = leaders(&entry, &streams).await;
    assert!(
        placed.values().any(|l| l == "star-2"),
        "the star in the namespace leads a stream: {placed:?}"
    );
    let history = Arc::new(History::new());
    let running = load(&entry, &streams, 1500, &history);
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // Cut off from the store only: it keeps its lease; its appends wait.
    dropped(&cut.to_moto, true);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        stars[2].try_exit_status().is_none(),
        "a star cut off from the store only keeps its lease:\n{}",
        stars[2].log()
    );
    dropped(&cut.to_moto, false);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Then from etcd too: it cannot renew, stops acknowledging, exits; a survivor takes over.
    dropped(&cut.to_moto, true);
    dropped(&cut.to_etcd, true);
    let status = common::wait_exit(&mut stars[2], Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        stars[2].log().contains("can no longer be trusted"),
        "{}",
        stars[2].log()
    );
    eventually(
        Duration::from_secs(60),
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
    dropped(&cut.to_moto, false);
    dropped(&cut.to_etcd, false);
    stars[2].kill9();
    stars[2].restart();
    finish(&entry, &streams, running, 1500, &history).await;
}
