//! The limit Nova cannot beat: conditional PUTs straight to the object store, at a fixed
//! concurrency, through the same S3 client novad uses. Prints one JSON line with throughput,
//! PUT latency and this process's CPU time per MiB.
//!
//! With `--endpoint` given several times (one server per zone), every object is written to all
//! of them at once, as the express fanout does, and the report adds each zone's PUT latency and
//! the *quorum* latency: per object, the time until a majority of the zones held it.
//!
//! raw-put --endpoint URL [--endpoint URL ...] --bucket NAME [--create-bucket]
//!         [--object-bytes 8MiB] [--concurrency 8] [--duration 20s]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nova_core::object_store::{ObjectStore, PutPayload, S3Config, S3Store};
use nova_proto::units::{parse_bytes, parse_duration};
use nova_server::memory::{cpu_seconds, resident_bytes};

fn args() -> Vec<String> {
    std::env::args().collect()
}

fn arg(name: &str) -> Option<String> {
    all(name).into_iter().next()
}

/// Every value of a repeated flag.
fn all(name: &str) -> Vec<String> {
    let args = args();
    args.iter()
        .enumerate()
        .filter(|(_, a)| *a == name)
        .filter_map(|(i, _)| args.get(i + 1).cloned())
        .collect()
}

/// Latencies per object: one per endpoint, and the quorum's.
struct Sample {
    each: Vec<Duration>,
    quorum: Duration,
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn main() -> Result<(), String> {
    let endpoints = all("--endpoint");
    if endpoints.is_empty() {
        return Err("--endpoint is required".into());
    }
    let bucket = arg("--bucket").ok_or("--bucket is required")?;
    let object_bytes = parse_bytes(&arg("--object-bytes").unwrap_or_else(|| "8MiB".into()))?;
    let concurrency: usize = arg("--concurrency")
        .map(|c| c.parse().map_err(|_| "--concurrency takes a number"))
        .transpose()?
        .unwrap_or(8);
    let duration = parse_duration(&arg("--duration").unwrap_or_else(|| "20s".into()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let mut stores = Vec::new();
        for endpoint in &endpoints {
            let mut config = S3Config::new(&bucket);
            config.endpoint = Some(endpoint.clone());
            config.force_path_style = true;
            config.limits.write_concurrency = concurrency;
            let store = Arc::new(S3Store::new(config).await);
            if args().iter().any(|a| a == "--create-bucket") {
                let _ = store.client().create_bucket().bucket(&bucket).send().await;
            }
            stores.push(store);
        }
        if duration.is_zero() {
            return Ok(());
        }
        let quorum = stores.len() / 2 + 1;
        let body = Bytes::from(vec![0x5a; object_bytes as usize]);
        let next = Arc::new(AtomicU64::new(0));
        let cpu_before = cpu_seconds().unwrap_or(0.0);
        let started = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let stores = stores.clone();
                let body = body.clone();
                let next = next.clone();
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    while started.elapsed() < duration {
                        let key = format!("raw/{:020}", next.fetch_add(1, Ordering::Relaxed));
                        let begun = Instant::now();
                        let puts = stores.iter().map(|store| {
                            let key = key.clone();
                            let body = body.clone();
                            async move {
                                store
                                    .put_if_absent(&key, PutPayload::from(body))
                                    .await
                                    .map(|_| begun.elapsed())
                                    .map_err(|e| e.to_string())
                            }
                        });
                        let each = futures::future::try_join_all(puts).await?;
                        let mut sorted = each.clone();
                        sorted.sort();
                        samples.push(Sample {
                            quorum: sorted[quorum - 1],
                            each,
                        });
                    }
                    Ok::<_, String>(samples)
                })
            })
            .collect();
        let mut samples = Vec::new();
        for worker in workers {
            samples.extend(worker.await.map_err(|e| e.to_string())??);
        }
        let seconds = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds().unwrap_or(0.0) - cpu_before;
        let mut zones = Vec::new();
        for (index, endpoint) in endpoints.iter().enumerate() {
            let mut latencies: Vec<Duration> = samples.iter().map(|s| s.each[index]).collect();
            latencies.sort();
            zones.push(serde_json::json!({
                "endpoint": endpoint,
                "put_p50_ms": quantile(&latencies, 0.5),
                "put_p99_ms": quantile(&latencies, 0.99),
            }));
        }
        let mut quorums: Vec<Duration> = samples.iter().map(|s| s.quorum).collect();
        quorums.sort();
        let mib = samples.len() as f64 * object_bytes as f64 / (1 << 20) as f64;
        let report = serde_json::json!({
            "object_bytes": object_bytes,
            "concurrency": concurrency,
            "objects": samples.len(),
            "seconds": seconds,
            "mib_per_sec": mib / seconds,
            // With one endpoint the quorum is that endpoint.
            "put_p50_ms": quantile(&quorums, 0.5),
            "put_p99_ms": quantile(&quorums, 0.99),
            "zones": zones,
            "quorum": quorum,
            "cpu_seconds": cpu,
            "cpu_ms_per_mib": cpu * 1000.0 / mib.max(f64::MIN_POSITIVE),
            "peak_rss_mib": resident_bytes(std::process::id())
                .map_or(0.0, |(_, peak)| peak as f64 / (1 << 20) as f64),
        });
        println!("{report}");
        Ok(())
    })
}
