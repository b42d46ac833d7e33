//! Cold-read throughput, two ways over the same objects: raw ranged GETs of every stream
//! section (the limit), and reading every stream from the start through a gateway. Prints one
//! JSON line per mode.
//!
//! cold-read raw     --endpoint URL --bucket NAME [--prefix chain/] [--concurrency 8]
//!                   [--through-key KEY]
//! cold-read gateway --gateway URL --streams N [--stream-prefix bench] [--readers 8]
//!                   [--think-ms 0]
//!
//! `--think-ms` has each reader spend that long on every page before asking for the next, as
//! a consumer that processes what it reads does. `--through-key` has the raw reader read only
//! the objects up to that key (the JSON's `last_key` names the last one it read), so that
//! objects written after a load are left out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::StreamExt;
use nova_client::{Client, Consumer};
use nova_core::flight::{ObjectFooter, fetch_footer, fetch_section};
use nova_core::object_store::{ObjectStore, S3Config, S3Store};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn number(name: &str, default: usize) -> usize {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn raw() -> Result<serde_json::Value, String> {
    let mut config = S3Config::new(arg("--bucket").ok_or("--bucket is required")?);
    config.endpoint = Some(arg("--endpoint").ok_or("--endpoint is required")?);
    config.force_path_style = true;
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(config).await);
    let prefix = arg("--prefix").unwrap_or_else(|| "chain/".into());
    let through = arg("--through-key");
    // Every section of every flight: the same byte ranges a gateway reads.
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(&prefix, after.as_deref(), 1000)
            .await
            .map_err(|e| e.to_string())?;
        keys.extend(
            page.objects
                .into_iter()
                .map(|o| o.key)
                .filter(|key| through.as_ref().is_none_or(|last| key <= last)),
        );
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut sections = Vec::new();
    for key in &keys {
        if let Ok(ObjectFooter::Flight(footer)) = fetch_footer(store.as_ref(), key).await {
            sections.extend(footer.sections.into_iter().map(|s| (key.clone(), s)));
        }
    }
    let bytes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let cpu_before = nova_server::memory::cpu_seconds().unwrap_or(0.0);
    futures::stream::iter(sections.iter().map(|(key, s)| {
        let store = store.clone();
        let bytes = bytes.clone();
        async move {
            let data = fetch_section(store.as_ref(), key, s.offset, s.len, s.crc32c)
                .await
                .map_err(|e| e.to_string())?;
            bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            Ok::<_, String>(())
        }
    }))
    .buffer_unordered(number("--concurrency", 8))
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = nova_server::memory::cpu_seconds().unwrap_or(0.0) - cpu_before;
    let total = bytes.load(Ordering::Relaxed);
    Ok(serde_json::json!({
        "mode": "raw",
        // This process's CPU (ranged GETs and their crc32c checks) per MiB fetched.
        "cpu_ms_per_mib": if total > 0 { cpu * 1000.0 / (total as f64 / (1 << 20) as f64) } else { 0.0 },
        "objects": keys.len(),
        "last_key": keys.last(),
        "sections": sections.len(),
        "bytes": total,
        "seconds": seconds,
        "mib_per_sec": total as f64 / seconds / (1 << 20) as f64,
    }))
}

async fn through_gateway() -> Result<serde_json::Value, String> {
    let client = Client::connect(&arg("--gateway").ok_or("--gateway is required")?)
        .await
        .map_err(|e| e.to_string())?;
    let prefix = arg("--stream-prefix").unwrap_or_else(|| "bench".into());
    let streams = number("--streams", 1);
    let think = std::time::Duration::from_millis(number("--think-ms", 0) as u64);
    let bytes = Arc::new(AtomicU64::new(0));
    let records = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let cpu_before = nova_server::memory::cpu_seconds().unwrap_or(0.0);
    futures::stream::iter((0..streams).map(|n| {
        let client = client.clone();
        let stream = format!("{prefix}-{n}");
        let bytes = bytes.clone();
        let records = records.clone();
        async move {
            let mut consumer = Consumer::new(client, stream, 0);
            loop {
                let page = consumer.next_page().await.map_err(|e| e.to_string())?;
                if page.records.is_empty() {
                    return Ok::<_, String>(());
                }
                records.fetch_add(page.records.len() as u64, Ordering::Relaxed);
                if !think.is_zero() {
                    tokio::time::sleep(think).await;
                }
                let content: u64 = page.records.iter().map(|r| r.record.content_bytes()).sum();
                bytes.fetch_add(content, Ordering::Relaxed);
            }
        }
    }))
    .buffer_unordered(number("--readers", 8))
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = nova_server::memory::cpu_seconds().unwrap_or(0.0) - cpu_before;
    let total = bytes.load(Ordering::Relaxed);
    Ok(serde_json::json!({
        "mode": "gateway",
        // This process's CPU (receiving and decoding the pages) per MiB read.
        "cpu_ms_per_mib": if total > 0 { cpu * 1000.0 / (total as f64 / (1 << 20) as f64) } else { 0.0 },
        "records": records.load(Ordering::Relaxed),
        "bytes": total,
        "seconds": seconds,
        "mib_per_sec": total as f64 / seconds / (1 << 20) as f64,
    }))
}

fn main() -> Result<(), String> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let report = runtime.block_on(async {
        match mode.as_str() {
            "raw" => raw().await,
            "gateway" => through_gateway().await,
            other => Err(format!("unknown mode {other:?}: use raw or gateway")),
        }
    })?;
    println!("{report}");
    Ok(())
}
