//! An object-store outage under load, end to end: a real novad writing to a real moto server
//! through a fault proxy, many producer sessions appending continuously, the store made
//! unavailable for a while and then restored. It samples novad's resident memory and its
//! oldest-admitted age during the outage, and afterwards checks every stream holds exactly the
//! acknowledged records, once each, in order. The outage test and the soak script both run it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nova_client::{Client, Record};
use tokio::sync::{Semaphore, mpsc};

use crate::moto::Moto;
use crate::novad::{Novad, NovadBuilder};
use crate::proxy::{Fault, FaultProxy};

#[derive(Debug, Clone)]
pub struct OutageScenario {
    pub novad: PathBuf,
    pub sessions: usize,
    /// Streams the sessions share (session i appends to stream i mod streams). Fewer streams
    /// make larger sections, so reading everything back takes fewer GETs.
    pub streams: usize,
    pub admission_mib: u64,
    pub tail_mib: u64,
    /// The read budget (`--read-memory-mib`); the scenario's reads happen after the outage.
    pub read_mib: u64,
    pub records_per_batch: usize,
    pub record_bytes: usize,
    /// Batches a session keeps sent but unacknowledged.
    pub pipeline: usize,
    pub warmup: Duration,
    pub outage: Duration,
    pub fault: Fault,
    /// How long producers keep going after the store is back.
    pub after: Duration,
    pub drain_timeout: Duration,
    /// Extra environment for novad (an allocator to preload, say).
    pub env: Vec<(String, String)>,
}

impl OutageScenario {
    pub fn new(novad: PathBuf) -> Self {
        Self {
            novad,
            sessions: 200,
            streams: 10,
            admission_mib: 32,
            tail_mib: 16,
            read_mib: 8,
            records_per_batch: 8,
            record_bytes: 1024,
            pipeline: 32,
            warmup: Duration::from_secs(5),
            outage: Duration::from_secs(30),
            fault: Fault::Hang,
            after: Duration::from_secs(3),
            drain_timeout: Duration::from_secs(120),
            env: Vec::new(),
        }
    }

    /// The star's memory formula with every session of the scenario open (the star runs with
    /// `--max-batch-bytes 1MiB`, so no clamped batch outweighs its admission buffer).
    pub fn formula_bytes(&self) -> u64 {
        star_budgets(
            self.admission_mib,
            self.tail_mib,
            self.read_mib,
            self.sessions as u64,
        )
        .at_session_cap()
        .total()
    }

    /// The overhead docs/backpressure.md states for a star beyond its formula, at this
    /// scenario's session cap: a 48 MiB base (binary, runtime and threads, the metastore's fixed
    /// 32 MiB page cache, allocator slack) and 64 KiB per session slot (its state, the one DATA
    /// frame the charging layer may hold while the session's charge waits, and the start of a
    /// next message in the transport's buffer).
    pub fn overhead_bytes(&self) -> u64 {
        star_overhead_bytes(self.sessions as u64)
    }
}

/// The budgets of a star started with these buffers, `sessions` as `--max-producer-sessions`,
/// and novad's defaults otherwise (64 KiB stream windows, its auditor, no zones), as novad's
/// own model adds them up (`nova_core::formula`).
pub fn star_budgets(
    admission_mib: u64,
    tail_mib: u64,
    read_mib: u64,
    sessions: u64,
) -> nova_core::formula::Budgets {
    nova_core::formula::Budgets {
        admission: admission_mib << 20,
        express: 0,
        read: read_mib << 20,
        tail_cache: tail_mib << 20,
        recycle: nova_core::limits::recycle_buffer_mib(admission_mib) << 20,
        stream_window: 64 * 1024,
        max_sessions: sessions,
        auditor: auditor_memory(),
    }
}

/// The auditor's term of the formula at novad's default flight and record sizes.
pub fn auditor_memory() -> u64 {
    nova_auditor::working_memory(8 << 20, 1 << 20)
}

/// The star's fixed overhead beyond its formula with `sessions` session slots (see
/// `OutageScenario::overhead_bytes`).
pub fn star_overhead_bytes(sessions: u64) -> u64 {
    nova_core::formula::overhead_with(sessions)
}

#[derive(Debug, Default)]
pub struct OutageReport {
    pub formula_bytes: u64,
    pub rss_before_outage: u64,
    /// The largest VmRSS sampled while the store was unavailable.
    pub peak_rss_during_outage: u64,
    /// VmHWM at the end: the peak over the whole run.
    pub peak_rss_overall: u64,
    /// (seconds into the outage, nova_oldest_admitted_age_seconds).
    pub age_samples: Vec<(f64, f64)>,
    pub admission_used_during_outage: f64,
    pub acked_before_outage: u64,
    pub acked_during_outage: u64,
    pub acked_total: u64,
    pub sent_batches: u64,
    pub acked_batches: u64,
    pub sessions_cut: Vec<String>,
    pub mismatches: Vec<String>,
    pub stall_log: Vec<String>,
    pub novad_log: String,
}

/// What one producer saw acknowledged: stream start seq → the batch number it carried.
type Acked = BTreeMap<u64, u64>;

fn stream_of(session: usize, streams: usize) -> String {
    format!("s{}", session % streams.max(1))
}

fn body(session: usize, batch: u64, index: usize, size: usize) -> Vec<u8> {
    let mut body = format!("{session}:{batch}:{index}:").into_bytes();
    body.resize(size.max(body.len()), b'.');
    body
}

struct Counters {
    acked_records: AtomicU64,
    sent_batches: AtomicU64,
    acked_batches: AtomicU64,
}

async fn produce(
    client: Client,
    session: usize,
    scenario: Arc<OutageScenario>,
    running: Arc<AtomicBool>,
    counters: Arc<Counters>,
) -> Result<Acked, String> {
    let stream = stream_of(session, scenario.streams);
    let (sender, mut receiver) = client
        .append_session()
        .await
        .map_err(|e| format!("session {session} did not open: {e}"))?
        .split();
    let window = Arc::new(Semaphore::new(scenario.pipeline));
    let (sent, mut to_ack) =
        mpsc::channel::<(u64, tokio::sync::OwnedSemaphorePermit)>(scenario.pipeline);
    let sending = {
        let scenario = scenario.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let mut batch = 0u64;
            while running.load(Ordering::Relaxed) {
                let Ok(permit) = window.clone().acquire_owned().await else {
                    break;
                };
                let records = (0..scenario.records_per_batch)
                    .map(|i| Record::new(body(session, batch, i, scenario.record_bytes)))
                    .collect();
                sender
                    .send(&stream, records, None)
                    .await
                    .map_err(|e| format!("session {session} send: {e}"))?;
                counters.sent_batches.fetch_add(1, Ordering::Relaxed);
                if sent.send((batch, permit)).await.is_err() {
                    break;
                }
                batch += 1;
            }
            Ok::<_, String>(())
        })
    };
    let mut acked = Acked::new();
    while let Some((batch, permit)) = to_ack.recv().await {
        let ack = receiver
            .next_ack()
            .await
            .map_err(|e| format!("session {session} lost batch {batch}: {e}"))?;
        acked.insert(ack.start_seq, batch);
        counters
            .acked_records
            .fetch_add(ack.end_seq - ack.start_seq, Ordering::Relaxed);
        counters.acked_batches.fetch_add(1, Ordering::Relaxed);
        drop(permit);
    }
    sending
        .await
        .map_err(|e| format!("session {session} sender: {e}"))??;
    Ok(acked)
}

/// What the sampler saw during the outage.
struct Sampled {
    peak_rss: u64,
    ages: Vec<(f64, f64)>,
    admission_used: f64,
}

/// Samples novad's memory and its oldest-admitted age on a thread of its own until told to stop.
fn sample_outage(
    novad: &Novad,
    pid: u32,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Sampled> {
    let metrics_port = novad.metrics_port();
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut peak = 0u64;
        let mut ages = Vec::new();
        let mut admission_used = 0f64;
        let mut last_scrape = Instant::now() - Duration::from_secs(10);
        while !stop.load(Ordering::Relaxed) {
            if let Some((rss, _)) = nova_server::memory::resident_bytes(pid) {
                peak = peak.max(rss);
            }
            if last_scrape.elapsed() >= Duration::from_secs(1) {
                last_scrape = Instant::now();
                let page = crate::novad::scrape(metrics_port);
                if let Some(age) = crate::novad::series(&page, "nova_oldest_admitted_age_seconds") {
                    ages.push((started.elapsed().as_secs_f64(), age));
                }
                if let Some(used) = crate::novad::series(&page, "nova_admission_buffer_used_bytes")
                {
                    admission_used = admission_used.max(used);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Sampled {
            peak_rss: peak,
            ages,
            admission_used,
        }
    })
}

pub async fn run(scenario: OutageScenario) -> OutageReport {
    let scenario = Arc::new(scenario);
    let moto = Moto::start();
    moto.create_bucket("outage");
    let proxy = FaultProxy::start(([127, 0, 0, 1], moto.port()).into());
    let sessions = scenario.sessions.to_string();
    let admission = scenario.admission_mib.to_string();
    let tail = scenario.tail_mib.to_string();
    let read = scenario.read_mib.to_string();
    let mut builder = NovadBuilder::new(&scenario.novad);
    for (key, value) in &scenario.env {
        builder = builder.env(key, value);
    }
    let novad = builder
        .args([
            "--s3-bucket",
            "outage",
            "--s3-endpoint",
            &proxy.endpoint(),
            "--s3-path-style",
            "--s3-request-timeout-ms",
            "1000",
            "--s3-max-attempts",
            "2",
            "--s3-memory-buffer-mib",
            &admission,
            "--tail-window-cache-mib",
            &tail,
            "--read-memory-mib",
            &read,
            // The scenario's batches are small; a cap to match keeps one clamped batch from
            // being the admission term of the star's formula.
            "--max-batch-bytes",
            "1MiB",
            "--max-producer-sessions",
            &sessions,
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .start();
    let pid = novad.pid().expect("novad runs");
    let mut report = OutageReport {
        formula_bytes: scenario.formula_bytes(),
        ..OutageReport::default()
    };

    // Sessions spread over connections, at most 100 streams each.
    let connections = scenario.sessions.div_ceil(100).max(1);
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Client::connect(&novad.url()).await.expect("connect"));
    }
    for stream in 0..scenario.streams.max(1) {
        clients[0]
            .create_stream(&stream_of(stream, scenario.streams))
            .await
            .expect("create stream");
    }
    let running = Arc::new(AtomicBool::new(true));
    let counters = Arc::new(Counters {
        acked_records: AtomicU64::new(0),
        sent_batches: AtomicU64::new(0),
        acked_batches: AtomicU64::new(0),
    });
    let producers: Vec<_> = (0..scenario.sessions)
        .map(|session| {
            tokio::spawn(produce(
                clients[session % connections].clone(),
                session,
                scenario.clone(),
                running.clone(),
                counters.clone(),
            ))
        })
        .collect();

    tokio::time::sleep(scenario.warmup).await;
    report.rss_before_outage = nova_server::memory::resident_bytes(pid).map_or(0, |(rss, _)| rss);
    report.acked_before_outage = counters.acked_records.load(Ordering::Relaxed);

    proxy.set(scenario.fault);
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = sample_outage(&novad, pid, sampling.clone());
    tokio::time::sleep(scenario.outage).await;
    report.acked_during_outage =
        counters.acked_records.load(Ordering::Relaxed) - report.acked_before_outage;
    sampling.store(true, Ordering::Relaxed);
    let sampled = sampler.join().expect("sampler");
    report.peak_rss_during_outage = sampled.peak_rss;
    report.age_samples = sampled.ages;
    report.admission_used_during_outage = sampled.admission_used;
    proxy.set(Fault::Pass);

    tokio::time::sleep(scenario.after).await;
    running.store(false, Ordering::Relaxed);
    let mut acked = Vec::new();
    for (session, producer) in producers.into_iter().enumerate() {
        match tokio::time::timeout(scenario.drain_timeout, producer).await {
            Ok(Ok(Ok(batches))) => acked.push((session, batches)),
            Ok(Ok(Err(cut))) => report.sessions_cut.push(cut),
            Ok(Err(panic)) => report
                .sessions_cut
                .push(format!("session {session} panicked: {panic}")),
            Err(_) => report.sessions_cut.push(format!(
                "session {session} still blocked after the drain timeout"
            )),
        }
    }
    report.acked_total = counters.acked_records.load(Ordering::Relaxed);
    report.sent_batches = counters.sent_batches.load(Ordering::Relaxed);
    report.acked_batches = counters.acked_batches.load(Ordering::Relaxed);
    report.peak_rss_overall = nova_server::memory::resident_bytes(pid).map_or(0, |(_, hwm)| hwm);

    // Every stream holds exactly the acknowledged batches of its sessions, once each, and
    // nothing else. Batches are all the same size, so each starts at a multiple of it.
    let per_batch = scenario.records_per_batch as u64;
    let mut by_stream: BTreeMap<String, BTreeMap<u64, (usize, u64)>> = BTreeMap::new();
    for (session, batches) in &acked {
        let stream = by_stream
            .entry(stream_of(*session, scenario.streams))
            .or_default();
        for (start, batch) in batches {
            if stream.insert(*start, (*session, *batch)).is_some() {
                report
                    .mismatches
                    .push(format!("seq {start} acknowledged to two batches"));
            }
        }
    }
    for (stream, batches) in &by_stream {
        let mut next = 0u64;
        loop {
            let page = match clients[0].read(stream, next, 0).await {
                Ok(page) => page,
                Err(e) => {
                    report
                        .mismatches
                        .push(format!("{stream}: read at {next} failed: {e}"));
                    break;
                }
            };
            for record in &page.records {
                let seq = record.seq;
                let start = seq - seq % per_batch;
                match batches.get(&start) {
                    Some(&(session, batch)) => {
                        let index = (seq - start) as usize;
                        if record.record.body != body(session, batch, index, scenario.record_bytes)
                        {
                            report
                                .mismatches
                                .push(format!("{stream}: record {seq} has the wrong body"));
                        }
                    }
                    None => report
                        .mismatches
                        .push(format!("{stream}: record {seq} was never acknowledged")),
                }
            }
            next = page.next_seq;
            if page.records.is_empty() || next >= page.tail_seq {
                break;
            }
        }
        let want = batches.len() as u64 * per_batch;
        if next != want {
            report.mismatches.push(format!(
                "{stream}: holds {next} records, {want} were acknowledged"
            ));
        }
    }
    report.novad_log = novad.log();
    report.stall_log = report
        .novad_log
        .lines()
        .filter(|l| l.contains("stall") || l.contains("exhausted") || l.contains("landing again"))
        .map(str::to_owned)
        .collect();
    drop(proxy);
    drop(moto);
    report
}
