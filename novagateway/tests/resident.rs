//! The gateway inside its memory formula in resident memory, not only in its budgets'
//! accounting: a thousand concurrent cold readers of large pages through one gateway, and
//! through a tier of three that fetch sections from each other.

use nova_client::{Client, Producer, ProducerConfig, Record};
use nova_testkit::cold_readers::read_pages;
use nova_testkit::{
    Moto, Novad, NovadBuilder, free_port, gateway_formula_bytes, series, workspace_binary,
};

const MIB: u64 = 1 << 20;
const STREAMS: usize = 10;
const READERS: usize = 1000;
/// Each stream: 64 records of 32 KiB.
const STREAM_BYTES: u64 = 64 * (32 << 10);

/// Budgets small beside what 1,000 readers of 2 MiB could hold (4 GiB with their encoded
/// copies), with 8 MiB of freed large buffers kept for reuse: a formula of
/// 16 + 4 + 16 + 8 + 1024 × 64 KiB + 48 + 8 = 164 MiB.
const SMALL_BUDGETS: [&str; 8] = [
    "--fetch-inflight",
    "16MiB",
    "--footer-cache-bytes",
    "4MiB",
    "--object-cache-bytes",
    "16MiB",
    "--recycle-buffer-mib",
    "8",
];

/// 10 streams of 2 MiB in 32 KiB records on `star`: history once past its 1 MiB tail cache.
async fn fill(star: &Novad) {
    let client = Client::connect(&star.url()).await.unwrap();
    let body = vec![b'g'; 32 << 10];
    for s in 0..STREAMS {
        let name = format!("r{s}");
        client.create_stream(&name).await.unwrap();
        let config = ProducerConfig {
            batch_bytes: 1 << 20,
            ..ProducerConfig::default()
        };
        let producer = Producer::new(client.clone(), &name, config).await.unwrap();
        for _ in 0..STREAM_BYTES / (32 << 10) {
            producer.append(Record::new(body.clone())).await.unwrap();
        }
        producer.close().await.unwrap();
    }
}

/// Reads every stream from `READERS` tasks spread over `vias`; returns the bytes read.
async fn read_everything(vias: &[Client]) -> u64 {
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let via = vias[r % vias.len()].clone();
            let stream = format!("r{}", r % STREAMS);
            tokio::spawn(async move { read_pages(&via, &stream, u64::MAX, 8 * MIB).await })
        })
        .collect();
    let mut total = 0;
    for reader in readers {
        total += reader.await.unwrap();
    }
    total
}

/// Asserts `gateway`'s peak RSS is within its exported memory formula, that its reads were
/// charged to its 16 MiB fetch pool, and that it served history.
fn within_formula(gateway: &Novad) {
    let page = gateway.metrics();
    let formula = gateway_formula_bytes(&page) as f64;
    let peak = series(&page, "nova_process_peak_resident_bytes").expect("peak RSS");
    let history = series(&page, "nova_gateway_reads_total{source=\"history\"}").unwrap_or(0.0);
    assert!(history > 0.0, "reads were served from history");
    eprintln!(
        "gateway {} peak RSS {:.0} MiB, formula {:.0} MiB",
        gateway.url(),
        peak / MIB as f64,
        formula / MIB as f64
    );
    assert!(
        peak <= formula,
        "peak RSS {:.0} MiB over the gateway's formula {:.0} MiB",
        peak / MIB as f64,
        formula / MIB as f64
    );
    let pool_peak = series(&page, "nova_gateway_fetch_pool_peak_bytes").unwrap();
    let pool = series(&page, "nova_gateway_fetch_pool_capacity_bytes").unwrap();
    assert_eq!(pool, (16 * MIB) as f64);
    assert!(pool_peak > 0.0, "the reads were charged to the fetch pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_cold_readers_stay_within_the_gateways_formula() {
    let star = NovadBuilder::new(workspace_binary("novad"))
        .args(["--tail-window-cache-mib", "1", "--auditor", "false"])
        .start();
    let gateway = NovadBuilder::gateway_beside(workspace_binary("novagateway"), &star)
        .args(SMALL_BUDGETS)
        .start();
    fill(&star).await;
    let via = Client::connect(&gateway.url()).await.unwrap();
    assert_eq!(
        read_everything(&[via]).await,
        READERS as u64 * STREAM_BYTES,
        "every reader read its stream"
    );
    within_formula(&gateway);
}

/// The same through a tier of three gateways sharing their object caches, so that most
/// sections come from a peer (`FetchRange`, charged to the owner's fetch pool): every
/// gateway stays inside its formula in resident memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_cold_readers_through_a_tier_of_three_stay_within_each_formula() {
    let moto = Moto::start();
    moto.create_bucket("tier");
    let s3 = |builder: NovadBuilder| {
        builder
            .args([
                "--s3-bucket",
                "tier",
                "--s3-endpoint",
                &moto.endpoint(),
                "--s3-path-style",
            ])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "testtest")
            .env("AWS_EC2_METADATA_DISABLED", "true")
    };
    let star = s3(NovadBuilder::new(workspace_binary("novad")))
        .args(["--tail-window-cache-mib", "1", "--auditor", "false"])
        .start();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let gateways: Vec<_> = ports
        .iter()
        .zip(&urls)
        .map(|(port, url)| {
            s3(NovadBuilder::gateway(workspace_binary("novagateway")))
                .port(*port)
                .args([
                    "--star",
                    &star.url(),
                    "--peers",
                    &urls.join(","),
                    "--advertise",
                    url,
                ])
                .args(SMALL_BUDGETS)
                .start()
        })
        .collect();
    fill(&star).await;
    let vias: Vec<Client> = futures::future::join_all(
        gateways
            .iter()
            .map(|g| async move { Client::connect(&g.url()).await.unwrap() }),
    )
    .await;
    assert_eq!(
        read_everything(&vias).await,
        READERS as u64 * STREAM_BYTES,
        "every reader read its stream"
    );
    let peer_fetches: f64 = gateways
        .iter()
        .map(|g| {
            g.metric("nova_gateway_fetches_total{route=\"peer\"}")
                .unwrap_or(0.0)
        })
        .sum();
    assert!(peer_fetches > 0.0, "sections came from peers");
    for gateway in &gateways {
        within_formula(gateway);
    }
}
