//! What the auditor costs, counted from the object store's side: requests per GiB appended and
//! write amplification (bytes the auditor writes ÷ bytes appended).
//!
//! 1. A star with the auditor off takes `--mib` MiB of appends over `--streams` streams at once
//!    (1 KiB records, batches of 64), so flights hold many streams.
//! 2. It is restarted with the auditor off, to count the requests a restart alone makes.
//! 3. It is restarted with the auditor on, and runs until every flight is settled and collected.
//!    The requests the server logged in that phase, less a restart's, are the auditor's; the
//!    settled objects and markers in the bucket are what it wrote.
//!
//! With `--windows N` (more than 1) the appends come in N rounds, each settled on its own (the
//! star restarts with the auditor on until the round is settled and collected), so every stream
//! gets N small settled objects, and the rewrite merges them (`--auditor-rewrite-min-objects`,
//! 16 by default). Write amplification then counts the settle's and the rewrite's bytes from
//! novad's own metrics, and the bytes the store copied server-side apart.
//!
//! Prints one JSON line. Needs moto (the README's test command installs it) and novad built in
//! the same profile.
//!
//! auditor-cost [--mib 64] [--streams 16] [--s3-budget 50] [--windows 1]

use std::time::{Duration, Instant};

use nova_client::{Client, Producer, ProducerConfig, Record};
use nova_core::flight::{ObjectFooter, fetch_footer};
use nova_core::object_store::{ObjectStore, S3Config, S3Store};
use nova_testkit::{Moto, Novad, NovadBuilder, workspace_binary};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn number(name: &str, default: u64) -> u64 {
    arg(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

const BUCKET: &str = "cost";
const RECORD: usize = 1024;
const BATCH: usize = 64;

fn star(moto: &Moto, dir: &std::path::Path, auditor: bool, budget: u64) -> Novad {
    NovadBuilder::new(workspace_binary("novad"))
        .data_dir(dir)
        .args([
            "--s3-bucket",
            BUCKET,
            "--s3-endpoint",
            &moto.endpoint(),
            "--s3-path-style",
            "--auditor",
            if auditor { "true" } else { "false" },
            "--auditor-s3-budget",
            &budget.to_string(),
            "--auditor-collect-grace-secs",
            "1",
            "--auditor-idle-ms",
            "200",
            "--auditor-settle-after-secs",
            "0",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .start()
}

async fn load(novad: &Novad, streams: u64, mib: u64) -> u64 {
    let per_stream = mib * (1 << 20) / streams / RECORD as u64;
    let mut tasks = Vec::new();
    for s in 0..streams {
        let url = novad.url();
        tasks.push(tokio::spawn(async move {
            let name = format!("cost-{s}");
            let client = Client::connect(&url).await.expect("connect");
            if let Err(err) = client.create_stream(&name).await {
                // A later round of `--windows`: the stream is there.
                assert_eq!(
                    err.code(),
                    Some(tonic::Code::AlreadyExists),
                    "create: {err}"
                );
            }
            let producer = Producer::new(client, &name, ProducerConfig::default())
                .await
                .expect("producer");
            for i in 0..per_stream {
                let mut body = format!("{name}-{i}-").into_bytes();
                body.resize(RECORD, b'.');
                producer.append(Record::new(body)).await.expect("append");
                if (i + 1) % BATCH as u64 == 0 {
                    producer.flush().await.expect("flush");
                }
            }
            producer.close().await.expect("close");
            per_stream * RECORD as u64
        }));
    }
    let mut bytes = 0;
    for task in tasks {
        bytes += task.await.expect("producer task");
    }
    bytes
}

/// The bucket's objects under `prefix`, with their sizes.
async fn sizes(store: &dyn ObjectStore, prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .list(prefix, after.as_deref(), 1000)
            .await
            .expect("list");
        out.extend(page.objects.into_iter().map(|o| (o.key, o.size)));
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

async fn flights(store: &dyn ObjectStore) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (key, size) in sizes(store, "chain/").await {
        if let Ok(ObjectFooter::Flight(_)) = fetch_footer(store, &key).await {
            out.push((key, size));
        }
    }
    out
}

/// Sums a novad counter over its label sets.
fn counter(novad: &Novad, prefix: &str) -> f64 {
    novad
        .metrics()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs the auditor until nothing is due and every flight is gone; returns what it counted.
async fn audit_until_idle(novad: &Novad, store: &dyn ObjectStore) -> [f64; 5] {
    let mut idle_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let caught_up = novad.metric("nova_auditor_oldest_due_age_seconds") == Some(0.0);
        if !caught_up || !flights(store).await.is_empty() {
            idle_since = None;
            continue;
        }
        // Caught up for a few seconds: the rewrite's pass has looked too.
        if idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    [
        counter(novad, "nova_auditor_written_bytes_total{duty=\"settle\"}"),
        counter(novad, "nova_auditor_written_bytes_total{duty=\"rewrite\"}"),
        counter(novad, "nova_auditor_copied_bytes_total"),
        counter(novad, "nova_auditor_requests_total"),
        counter(novad, "nova_auditor_rewritten_objects_total"),
    ]
}

/// `--windows N`: N rounds of appends, each settled apart, then merged by the rewrite.
async fn windowed(moto: &Moto, store: &S3Store, mib: u64, streams: u64, budget: u64, windows: u64) {
    let dir = std::env::temp_dir().join(format!("nova-auditor-cost-w-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a data directory");
    let (mut content, mut flight_bytes, mut flight_count) = (0u64, 0u64, 0usize);
    let mut totals = [0f64; 5];
    let phase_start = moto.requests().len();
    for _ in 0..windows {
        let mut novad = star(moto, &dir, false, budget);
        content += load(&novad, streams, mib / windows).await;
        let round = flights(store).await;
        flight_count += round.len();
        flight_bytes += round.iter().map(|(_, s)| s).sum::<u64>();
        novad.terminate(Duration::from_secs(30));
        let mut novad = star(moto, &dir, true, budget);
        let counted = audit_until_idle(&novad, store).await;
        for (total, n) in totals.iter_mut().zip(counted) {
            *total += n;
        }
        novad.terminate(Duration::from_secs(30));
    }
    let data = sizes(store, "data/").await;
    let merged = data.iter().filter(|(k, _)| k.ends_with("-r")).count();
    let [settle, rewrite, copied, requests, rewritten] = totals;
    let gib = flight_bytes as f64 / (1u64 << 30) as f64;
    println!(
        "{}",
        serde_json::json!({
            "streams": streams,
            "windows": windows,
            "content_bytes": content,
            "flights": flight_count,
            "appended_bytes": flight_bytes,
            "settled_bytes_written": settle,
            "rewrite_bytes_sent": rewrite,
            "rewrite_bytes_copied_by_the_store": copied,
            "settled_objects_merged": rewritten,
            "objects_left": data.len(),
            "merged_objects_left": merged,
            "write_amplification": (settle + rewrite) / flight_bytes as f64,
            "write_amplification_with_copies": (settle + rewrite + copied) / flight_bytes as f64,
            "auditor_requests_counted_by_novad": requests,
            "auditor_requests_per_gib": requests / gib,
            "server_requests_all_phases": moto.requests().len() - phase_start,
        })
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::main]
async fn main() {
    let mib = number("--mib", 64);
    let streams = number("--streams", 16);
    let budget = number("--s3-budget", 50);
    let windows = number("--windows", 1);
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let mut config = S3Config::new(BUCKET);
    config.endpoint = Some(moto.endpoint());
    config.credentials = Some(("test".into(), "testtest".into()));
    let store = S3Store::new(config).await;
    if windows > 1 {
        windowed(&moto, &store, mib, streams, budget, windows).await;
        return;
    }

    let dir = std::env::temp_dir().join(format!("nova-auditor-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a data directory");
    let mut novad = star(&moto, &dir, false, budget);
    let content = load(&novad, streams, mib).await;
    let appended = flights(&store).await;
    let appended_bytes: u64 = appended.iter().map(|(_, s)| s).sum();

    // What a restart alone asks the server.
    let before_restart = moto.requests().len();
    novad.terminate(Duration::from_secs(30));
    let mut quiet = star(&moto, &dir, false, budget);
    tokio::time::sleep(Duration::from_secs(2)).await;
    quiet.terminate(Duration::from_secs(30));
    let restart_requests = moto.requests().len() - before_restart;

    let phase_start = moto.requests().len();
    let started = Instant::now();
    let novad = star(&moto, &dir, true, budget);
    // Watched through novad's metrics only, so every request the server logs in this phase is
    // novad's: the flights all deleted, and nothing due.
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let caught_up = novad.metric("nova_auditor_oldest_due_age_seconds") == Some(0.0);
        let deleted = novad
            .metric("nova_auditor_deleted_objects_total{kind=\"chain_slot\"}")
            .unwrap_or(0.0);
        if caught_up && deleted >= appended.len() as f64 {
            break;
        }
    }
    let settle_secs = started.elapsed().as_secs_f64();
    let logged: Vec<_> = moto.requests()[phase_start..].to_vec();
    let by_method = |m: &str| logged.iter().filter(|r| r.method == m).count();
    let left = flights(&store).await.len();
    assert_eq!(left, 0, "flights left after the auditor caught up");
    let novad_counted: f64 = novad
        .metrics()
        .lines()
        .filter(|l| l.starts_with("nova_auditor_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let settled = sizes(&store, "data/").await;
    let markers: u64 = sizes(&store, "chain/")
        .await
        .iter()
        .filter(|(k, _)| k.contains("/settled-"))
        .map(|(_, s)| s)
        .sum();
    let written: u64 = settled.iter().map(|(_, s)| s).sum::<u64>() + markers;
    let gib = appended_bytes as f64 / (1u64 << 30) as f64;
    println!(
        "{}",
        serde_json::json!({
            "streams": streams,
            "content_bytes": content,
            "flights": appended.len(),
            "appended_bytes": appended_bytes,
            "settled_objects": settled.len(),
            "auditor_written_bytes": written,
            "write_amplification": written as f64 / appended_bytes as f64,
            "server_requests_in_phase": logged.len(),
            "server_requests_of_a_restart": restart_requests,
            "auditor_requests_per_gib_at_the_server":
                logged.len().saturating_sub(restart_requests) as f64 / gib,
            "server_puts": by_method("PUT"),
            "server_gets": by_method("GET"),
            "server_deletes": by_method("DELETE"),
            "auditor_requests_counted_by_novad": novad_counted,
            "auditor_requests_per_gib": novad_counted / gib,
            "settle_seconds": settle_secs,
        })
    );
    drop(novad);
    let _ = std::fs::remove_dir_all(&dir);
}
