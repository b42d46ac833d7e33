//! The limit Nova cannot beat: conditional PUTs of flight-sized objects straight to the object
//! store, at a fixed concurrency, through the same S3 client novad uses. Prints one JSON line
//! with throughput, PUT latency and this process's CPU time per MiB.
//!
//! raw-put --endpoint URL --bucket NAME [--create-bucket] [--object-bytes 8MiB]
//!         [--concurrency 8] [--duration 20s]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use nova_core::memory::cpu_seconds;
use nova_core::object_store::{ObjectStore, PutPayload, S3Config, S3Store};
use nova_proto::units::{parse_bytes, parse_duration};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), String> {
    let endpoint = arg("--endpoint").ok_or("--endpoint is required")?;
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
        let mut config = S3Config::new(&bucket);
        config.endpoint = Some(endpoint);
        config.force_path_style = true;
        config.limits.write_concurrency = concurrency;
        let store = Arc::new(S3Store::new(config).await);
        if std::env::args().any(|a| a == "--create-bucket") {
            let _ = store.client().create_bucket().bucket(&bucket).send().await;
        }
        if duration.is_zero() {
            return Ok(());
        }
        let body = Bytes::from(vec![0x5a; object_bytes as usize]);
        let next = Arc::new(AtomicU64::new(0));
        let cpu_before = cpu_seconds().unwrap_or(0.0);
        let started = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let store = store.clone();
                let body = body.clone();
                let next = next.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while started.elapsed() < duration {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let begun = Instant::now();
                        store
                            .put_if_absent(&format!("raw/{n:020}"), PutPayload::from(body.clone()))
                            .await
                            .map_err(|e| e.to_string())?;
                        latencies.push(begun.elapsed());
                    }
                    Ok::<_, String>(latencies)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        for worker in workers {
            latencies.extend(worker.await.map_err(|e| e.to_string())??);
        }
        let seconds = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds().unwrap_or(0.0) - cpu_before;
        latencies.sort();
        let quantile = |q: f64| -> f64 {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        let mib = latencies.len() as f64 * object_bytes as f64 / (1 << 20) as f64;
        let report = serde_json::json!({
            "object_bytes": object_bytes,
            "concurrency": concurrency,
            "objects": latencies.len(),
            "seconds": seconds,
            "mib_per_sec": mib / seconds,
            "put_p50_ms": quantile(0.5),
            "put_p99_ms": quantile(0.99),
            "cpu_seconds": cpu,
            "cpu_ms_per_mib": cpu * 1000.0 / mib.max(f64::MIN_POSITIVE),
        });
        println!("{report}");
        Ok(())
    })
}
