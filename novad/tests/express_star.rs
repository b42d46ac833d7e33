//! Express end to end: a real novad with three zone buckets (one moto server each, so one can be
//! paused without the others) and a regional bucket on a fourth. Express appends are
//! acknowledged at a quorum of zones, keep flowing with one zone down, fail fast at the publish
//! deadline with two down (while Standard streams on the same star carry on, and memory stays
//! within the formula), resume once the zones are back, and survive kill -9 with bundles in
//! flight; every acknowledged record is then read back once, in order.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nova_client::{Client, Record, StorageClass, StreamConfig};
use nova_testkit::{Moto, NovadBuilder, series};
use tonic::Code;

const DEADLINE_MS: u64 = 1000;

struct Zones {
    motos: Vec<Moto>,
}

impl Zones {
    fn start() -> Self {
        let motos: Vec<Moto> = (0..3).map(|_| Moto::start()).collect();
        for moto in &motos {
            moto.create_bucket("zone");
        }
        Self { motos }
    }

    fn args(&self, builder: NovadBuilder) -> NovadBuilder {
        let mut builder =
            builder.args(["--s3-express-publish-deadline", &format!("{DEADLINE_MS}ms")]);
        for (moto, name) in self.motos.iter().zip(["az1", "az2", "az3"]) {
            builder = builder.args([
                "--s3-express-zone".to_owned(),
                format!("name={name},bucket=zone,endpoint={}", moto.endpoint()),
            ]);
        }
        builder
    }
}

async fn create_express(client: &Client, name: &str) {
    client
        .create_stream_configured(
            name,
            StreamConfig {
                storage_class: StorageClass::Express,
                ..StreamConfig::default()
            },
        )
        .await
        .expect("create an Express stream");
}

fn bodies(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn to_records(bodies: &[String]) -> Vec<Record> {
    bodies.iter().map(|b| Record::new(b.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn express_acks_at_a_quorum_fails_fast_without_one_and_resumes() {
    let regional = Moto::start();
    let zones = Zones::start();
    let builder = zones.args(novad_on_s3(&regional, "regional")).args([
        "--s3-memory-buffer-mib",
        "8",
        "--s3-express-memory-buffer-mib",
        "4",
        "--tail-window-cache-mib",
        "8",
        "--read-memory-mib",
        "8",
        "--max-batch-bytes",
        "1MiB",
        "--auditor",
        "false",
    ]);
    let novad = builder.start();
    let client = client(&novad).await;
    create_express(&client, "x").await;
    client.create_stream("std").await.unwrap();
    let info = client.describe_stream("x").await.unwrap();
    assert_eq!(info.storage_class, StorageClass::Express);

    let mut session = client.append_session().await.unwrap();
    let mut acked: Vec<String> = Vec::new();
    for batch in 0..20 {
        let bodies = bodies(&format!("up-{batch}"), 5);
        let ack = session
            .append("x", to_records(&bodies), None)
            .await
            .expect("all zones up: acknowledged");
        assert_eq!(ack.start_seq, acked.len() as u64);
        acked.extend(bodies);
    }
    assert_eq!(
        read_all(&client, "x").await,
        acked,
        "read back right after the acks"
    );
    assert!(novad.metric("nova_express_acks_total").unwrap_or(0.0) >= 20.0);

    // One zone down: a quorum of two still holds every bundle.
    zones.motos[0].pause();
    for batch in 0..10 {
        let bodies = bodies(&format!("one-down-{batch}"), 5);
        session
            .append("x", to_records(&bodies), None)
            .await
            .expect("one zone down: still acknowledged");
        acked.extend(bodies);
    }

    // Two zones down: the append fails fast at the deadline, and is not acknowledged.
    zones.motos[1].pause();
    let started = Instant::now();
    let failed = session
        .append("x", to_records(&bodies("two-down", 5)), None)
        .await
        .expect_err("two zones down: no quorum");
    let took = started.elapsed();
    assert!(
        matches!(
            failed.code(),
            Some(Code::DeadlineExceeded | Code::Unavailable)
        ),
        "{failed}"
    );
    assert!(
        took < Duration::from_millis(DEADLINE_MS * 5),
        "failed fast, at the deadline ({took:?}): {failed}"
    );
    // Later Express appends are refused at once with a retry hint while the express chain
    // cannot be sealed; Standard streams on the same star are unaffected.
    let mut fresh = client.append_session().await.unwrap();
    let refused = fresh
        .append("x", to_records(&bodies("refused", 1)), None)
        .await
        .expect_err("refused while sealing");
    assert_eq!(refused.code(), Some(Code::Unavailable), "{refused}");
    assert!(refused.retry_after().is_some(), "a retry hint: {refused}");
    fresh
        .append("std", to_records(&bodies("standard", 3)), None)
        .await
        .expect("Standard appends carry on while express zones are down");
    let metrics = novad.metrics();
    assert!(series(&metrics, "nova_express_down").unwrap_or(0.0) >= 1.0);
    let failures: f64 = ["unavailable", "outcome_unknown"]
        .iter()
        .filter_map(|a| {
            series(
                &metrics,
                &format!("nova_express_deadline_failures_total{{answer=\"{a}\"}}"),
            )
        })
        .sum();
    assert!(failures >= 1.0, "deadline failures are counted");
    // Memory within the closed formula (plus the star's fixed overhead) through the outage.
    let formula = nova_testkit::formula_bytes(&metrics) as f64;
    let express_term = series(&metrics, "nova_memory_formula_bytes{term=\"express\"}").unwrap();
    assert!(
        express_term > 0.0,
        "the express buffer is a term of the formula"
    );
    let peak = series(&metrics, "nova_process_peak_resident_bytes").unwrap();
    let overhead = nova_testkit::outage::star_overhead_bytes(4) as f64;
    assert!(
        peak <= formula + overhead,
        "peak RSS {peak} over the formula {formula} + overhead {overhead}"
    );

    // The zones come back: the express chain is sealed and appends resume.
    zones.motos[0].resume();
    zones.motos[1].resume();
    let resumed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let mut session = client.append_session().await.unwrap();
            let bodies = bodies("back", 5);
            match session.append("x", to_records(&bodies), None).await {
                Ok(_) => return bodies,
                Err(err) => {
                    assert!(err.is_retryable(), "{err}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await
    .expect("Express appends resume once the zones are back");

    // Every acknowledged record is there once, in order; the failed batch either is or is not
    // (it was answered "outcome unknown" or not acknowledged), and nothing else is.
    let stored = read_all(&client, "x").await;
    assert_eq!(
        &stored[..acked.len()],
        &acked[..],
        "acknowledged records survive"
    );
    let rest = &stored[acked.len()..];
    let unknown_then_resumed = [bodies("two-down", 5), resumed.clone()].concat();
    assert!(
        rest == resumed.as_slice() || rest == unknown_then_resumed.as_slice(),
        "after the acknowledged prefix only the unknown batch and the resumed one: {rest:?}"
    );
    assert!(novad.metric("nova_express_repairs_total").unwrap_or(0.0) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_express_bundles_in_flight_loses_no_acknowledged_record() {
    let regional = Moto::start();
    regional.create_bucket("regional");
    let zones = Zones::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    // A long flight linger keeps acknowledged bundles out of the Standard chain for a while,
    // so the kill finds records only the zones hold.
    let builder = || {
        zones
            .args(with_s3(
                novad().data_dir(path.clone()),
                &regional,
                "regional",
            ))
            .args(["--flight-linger-ms", "300"])
    };
    let mut novad = builder().start();
    create_express(&client(&novad).await, "x").await;
    kill_9_rounds(
        &mut novad,
        "x",
        8,
        Duration::from_millis(600),
        Duration::from_millis(250),
    )
    .await;
    assert!(
        novad.log().contains("recovery carried the express chain"),
        "a restart carried bundles only the zones held: {}",
        novad.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_catalog_resumes_the_express_chain_behind_its_collected_slots() {
    let regional = Moto::start();
    regional.create_bucket("regional");
    let zones = Zones::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    // Carried bundles sit in a Standard flight for its whole linger, so a kill soon after an
    // ack finds records only the zones hold.
    let builder = || {
        zones
            .args(with_s3(
                novad().data_dir(path.clone()),
                &regional,
                "regional",
            ))
            .args(["--flight-linger-ms", "1500"])
    };
    let mut star = builder().start();
    let client = client(&star).await;
    create_express(&client, "x").await;
    let mut session = client.append_session().await.unwrap();
    let mut acked = Vec::new();
    for batch in 0..5 {
        let bodies = bodies(&format!("early-{batch}"), 4);
        session
            .append("x", to_records(&bodies), None)
            .await
            .unwrap();
        acked.extend(bodies);
    }
    // Those bundles land in a Standard flight, are absorbed, and their zone copies go.
    eventually(Duration::from_secs(30), "zone copies collected", || {
        star.metric("nova_express_collected_total").unwrap_or(0.0) >= 5.0
    })
    .await;
    // These are acknowledged at the zones, then the star dies before their flight lands.
    for batch in 0..3 {
        let bodies = bodies(&format!("late-{batch}"), 4);
        session
            .append("x", to_records(&bodies), None)
            .await
            .unwrap();
        acked.extend(bodies);
    }
    star.kill9();
    drop(session);
    // The metastore is lost with the data directory; the catalog is rebuilt from the bucket.
    std::fs::remove_file(path.join("metastore.redb")).unwrap();
    let mut rebuild = builder().arg("--rebuild-catalog").start_detached();
    let status = wait_exit(&mut rebuild, Duration::from_secs(60));
    assert!(status.success(), "{}", rebuild.log());
    let restored = builder().start();
    let client = common::client(&restored).await;
    assert_eq!(
        read_all(&client, "x").await,
        acked,
        "every acknowledged record, the ones only the zones held too\n{}",
        restored.log()
    );
}

/// The express buffer bounds Express batches from their acknowledgement until the regional
/// store holds them: with the regional store hung, Express appends are still acknowledged at a
/// zone quorum until the buffer is full, then wait for room (counted as waiters) instead of
/// growing memory, and carry on once the regional store answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_express_buffer_blocks_appends_until_the_regional_store_holds_them() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use nova_testkit::{Fault, FaultProxy};

    let regional = Moto::start();
    regional.create_bucket("regional");
    let proxy = FaultProxy::start(([127, 0, 0, 1], regional.port()).into());
    let zones = Zones::start();
    let novad = zones
        .args(via_endpoint(novad(), &proxy.endpoint(), "regional"))
        .args([
            "--s3-request-timeout-ms",
            "500",
            "--s3-express-memory-buffer-mib",
            "1",
            "--max-batch-bytes",
            "256KiB",
            "--auditor",
            "false",
        ])
        .start();
    let client = client(&novad).await;
    create_express(&client, "x").await;
    proxy.set(Fault::Hang);

    const BATCHES: u64 = 16;
    let acked = Arc::new(AtomicU64::new(0));
    let appending = {
        let (client, acked) = (client.clone(), acked.clone());
        tokio::spawn(async move {
            let mut session = client.append_session().await.unwrap();
            let mut sent = Vec::new();
            for batch in 0..BATCHES {
                let bodies: Vec<String> = (0..4)
                    .map(|i| format!("{batch}-{i}-{}", "e".repeat(60 << 10)))
                    .collect();
                session
                    .append("x", to_records(&bodies), None)
                    .await
                    .expect("acknowledged once there is room");
                acked.fetch_add(1, Ordering::Relaxed);
                sent.extend(bodies);
            }
            sent
        })
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = acked.load(Ordering::Relaxed);
    assert!(
        (1..BATCHES).contains(&before),
        "acknowledged at quorum until the 1 MiB buffer filled, then blocked: {before} of {BATCHES}"
    );
    let waiters = novad.metric("nova_express_buffer_waiters").unwrap_or(0.0);
    assert!(
        waiters >= 1.0,
        "the blocked append waits for room: {waiters}"
    );
    let used = novad.metric("nova_express_buffer_used_bytes").unwrap();
    let capacity = novad.metric("nova_express_buffer_capacity_bytes").unwrap();
    assert_eq!(capacity, (1 << 20) as f64);
    // A batch charged more than the room left is admitted alone (clamped to the buffer).
    assert!(used <= capacity, "the buffer holds {used} of {capacity}");

    proxy.set(Fault::Pass);
    let sent = tokio::time::timeout(Duration::from_secs(120), appending)
        .await
        .expect("appends carry on once the regional store answers")
        .unwrap();
    assert_eq!(read_all(&client, "x").await, sent);
}
