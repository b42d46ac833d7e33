//! The gateway inside its memory formula in resident memory, not only in its budgets'
//! accounting: a thousand concurrent cold readers of large pages through one gateway.

use nova_client::{Client, Producer, ProducerConfig, Record};
use nova_testkit::cold_readers::read_pages;
use nova_testkit::{NovadBuilder, series, workspace_binary};

const MIB: u64 = 1 << 20;
const STREAMS: usize = 10;
const READERS: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_cold_readers_stay_within_the_gateways_formula() {
    let star = NovadBuilder::new(workspace_binary("novad"))
        .args(["--tail-window-cache-mib", "1", "--auditor", "false"])
        .start();
    let gateway = NovadBuilder::gateway_beside(workspace_binary("novagateway"), &star)
        .args([
            // Budgets small beside what 1,000 readers of 2 MiB could hold (4 GiB with their
            // encoded copies): a formula of 16 + 4 + 16 + 1024 × 64 KiB + 48 = 148 MiB.
            "--fetch-inflight",
            "16MiB",
            "--footer-cache-bytes",
            "4MiB",
            "--object-cache-bytes",
            "16MiB",
        ])
        .start();

    // 10 streams of 2 MiB in 32 KiB records: history the gateway reads from the store.
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
        for _ in 0..64 {
            producer.append(Record::new(body.clone())).await.unwrap();
        }
        producer.close().await.unwrap();
    }
    // Past the star's 1 MiB tail cache: cold.
    let via = Client::connect(&gateway.url()).await.unwrap();
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            let via = via.clone();
            let stream = format!("r{}", r % STREAMS);
            tokio::spawn(async move { read_pages(&via, &stream, u64::MAX, 8 * MIB).await })
        })
        .collect();
    let mut total = 0;
    for reader in readers {
        total += reader.await.unwrap();
    }
    assert_eq!(
        total,
        READERS as u64 * 64 * (32 << 10),
        "every reader read its stream"
    );

    let page = gateway.metrics();
    let formula: f64 = [
        "fetch_pool",
        "footer_cache",
        "object_cache",
        "reads",
        "fixed",
    ]
    .iter()
    .map(|t| {
        series(
            &page,
            &format!("nova_gateway_memory_formula_bytes{{term=\"{t}\"}}"),
        )
        .unwrap_or_else(|| panic!("the gateway exports its formula's {t} term"))
    })
    .sum();
    let peak = series(&page, "nova_process_peak_resident_bytes").expect("peak RSS");
    let history = series(&page, "nova_gateway_reads_total{source=\"history\"}").unwrap_or(0.0);
    assert!(
        history >= READERS as f64,
        "the reads were served from history: {history}"
    );
    eprintln!(
        "gateway peak RSS {:.0} MiB, formula {:.0} MiB",
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
    assert!(
        pool_peak <= (64 * MIB) as f64,
        "the fetch pool held {pool_peak}"
    );
}
