//! The crash loop: a real novad on a real S3-compatible server, killed with SIGKILL at random
//! moments while producers append, and restarted, cycle after cycle. After every restart it
//! checks what the star serves against what was acknowledged:
//!
//! - every restart succeeds (the star comes back and listens);
//! - every acknowledged record is readable at its seq, unchanged;
//! - no record appears twice, and a stream's tail never moves backwards;
//! - on streams written by exactly-once producers (conditional appends through the SDK's
//!   `Producer`), the stream holds every record appended, once each, in order.
//!
//! The streams see mixed record sizes (10 B to 1 MiB) and batches over 1 MiB, so flights hold
//! several sections of one stream. The crash-loop test runs a few cycles in CI; the crash-loop
//! script runs any number.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nova_client::{AppendTicket, Client, Producer, ProducerConfig, Record};

use crate::moto::Moto;
use crate::novad::{Novad, NovadBuilder};

#[derive(Debug, Clone)]
pub struct CrashLoop {
    pub novad: PathBuf,
    pub cycles: u64,
    pub seed: u64,
    /// Streams written with unconditional appends, by several raw sessions each.
    pub free_streams: usize,
    /// Streams written by one exactly-once `Producer` each (conditional appends).
    pub exact_streams: usize,
    /// How long producers run before the kill: uniformly within this range.
    pub run_for: (Duration, Duration),
    /// One batch in this many is large (a 1.6 MB batch or a ~1 MiB record). Long runs raise it
    /// so that a thousand cycles fit in the S3 server's memory.
    pub large_one_in: u64,
}

impl CrashLoop {
    pub fn new(novad: PathBuf) -> Self {
        Self {
            novad,
            cycles: 10,
            seed: 1,
            free_streams: 2,
            exact_streams: 2,
            run_for: (Duration::from_millis(200), Duration::from_millis(1500)),
            large_one_in: 30,
        }
    }
}

#[derive(Debug, Default)]
pub struct CrashReport {
    pub cycles: u64,
    pub restarts: u64,
    pub acked_records: u64,
    pub acked_bytes: u64,
    pub largest_batch_bytes: u64,
    /// Records found that were sent but never acknowledged (their ack died with the star).
    pub unacked_but_durable: u64,
    pub slowest_restart: Duration,
    /// Every violation found, with the cycle it was found in. Empty on success.
    pub violations: Vec<String>,
}

/// A small deterministic generator (xorshift64*), so a seed replays the same sizes and timings.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn duration(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        lo + Duration::from_millis(self.below((hi - lo).as_millis() as u64 + 1))
    }
}

/// A record body: `id|` then padding to `size` bytes. Ids are unique across the whole run.
fn body(id: &str, size: usize) -> String {
    let mut body = format!("{id}|");
    if size > body.len() {
        body.push_str(&"x".repeat(size - body.len()));
    }
    body
}

fn id_of(body: &[u8]) -> String {
    let end = body.iter().position(|&b| b == b'|').unwrap_or(body.len());
    String::from_utf8_lossy(&body[..end]).into_owned()
}

/// A batch over 1 MiB (1.6 MB): it spans two sections of its flight.
const LARGE_BATCH: [usize; 4] = [400_000; 4];

/// A batch's record sizes: mostly small, sometimes up to 1 MiB, sometimes a batch over 1 MiB.
/// Large batches are rare enough that a thousand cycles fit in the S3 server's memory.
fn batch_sizes(rng: &mut Rng, large_one_in: u64) -> Vec<usize> {
    if rng.below(large_one_in) == 0 {
        return if rng.below(2) == 0 {
            LARGE_BATCH.to_vec()
        } else {
            vec![(1 << 20) - 64] // one record of nearly 1 MiB
        };
    }
    match rng.below(20) {
        0 => (0..8).map(|_| 1000 + rng.below(30_000) as usize).collect(),
        _ => (0..1 + rng.below(30))
            .map(|_| 10 + rng.below(400) as usize)
            .collect(),
    }
}

#[derive(Default)]
struct FreeStream {
    acked: BTreeMap<u64, String>,
    seen: HashSet<String>,
    verified_to: u64,
}

struct ExactStream {
    producer: Producer,
    /// Every body appended, in order, with its ticket until resolved.
    sent: Vec<String>,
    tickets: Vec<(usize, AppendTicket)>,
    verified_to: u64,
}

pub async fn run(config: CrashLoop) -> CrashReport {
    let mut report = CrashReport::default();
    let mut rng = Rng(config.seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let moto = Moto::start();
    moto.create_bucket("crash");
    let data = tempfile::tempdir().expect("tempdir");
    let mut novad: Novad = NovadBuilder::new(&config.novad)
        .data_dir(data.path())
        .args([
            "--s3-bucket",
            "crash",
            "--s3-endpoint",
            &moto.endpoint(),
            "--s3-path-style",
            "--s3-request-timeout-ms",
            "5000",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .start();
    let client = Client::connect(&novad.url()).await.expect("connect");
    let free_names: Vec<String> = (0..config.free_streams)
        .map(|i| format!("free-{i}"))
        .collect();
    let exact_names: Vec<String> = (0..config.exact_streams)
        .map(|i| format!("exact-{i}"))
        .collect();
    for name in free_names.iter().chain(&exact_names) {
        client.create_stream(name).await.expect("create stream");
    }
    let mut free: HashMap<String, FreeStream> = free_names
        .iter()
        .map(|n| (n.clone(), FreeStream::default()))
        .collect();
    let producer_config = ProducerConfig {
        max_retries: 10_000,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        ..ProducerConfig::default()
    };
    let mut exact: HashMap<String, ExactStream> = HashMap::new();
    for name in &exact_names {
        let producer = Producer::new(client.clone(), name.clone(), producer_config.clone())
            .await
            .expect("producer");
        exact.insert(
            name.clone(),
            ExactStream {
                producer,
                sent: Vec::new(),
                tickets: Vec::new(),
                verified_to: 0,
            },
        );
    }

    for cycle in 0..config.cycles {
        report.cycles = cycle + 1;
        // Producers run for a while, then the star dies mid-stream.
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for (w, name) in free_names.iter().enumerate() {
            for session in 0..2 {
                let client = client.clone();
                let name = name.clone();
                let stop = stop.clone();
                let mut rng = Rng(rng.next() | 1);
                let prefix = format!("c{cycle}-f{w}-s{session}");
                let large = config.large_one_in;
                // Every run sends batches over 1 MiB however few batches a loaded machine gets
                // through: each writer of the first three cycles opens with one (a few MiB in
                // all, whatever the number of cycles).
                let open_large = cycle < 3;
                writers.push(tokio::spawn(async move {
                    free_writer(client, name, prefix, stop, &mut rng, large, open_large).await
                }));
            }
        }
        let run_for = rng.duration(config.run_for);
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < run_for {
            for (name, stream) in exact.iter_mut() {
                for size in batch_sizes(&mut rng, config.large_one_in) {
                    let body = body(&format!("c{cycle}-{name}-{n}"), size);
                    n += 1;
                    // Waits while the producer's unacked budget is full (the star may be down).
                    match tokio::time::timeout(
                        Duration::from_millis(200),
                        stream.producer.append(Record::new(body.clone())),
                    )
                    .await
                    {
                        Ok(Ok(ticket)) => {
                            stream.tickets.push((stream.sent.len(), ticket));
                            stream.sent.push(body);
                        }
                        Ok(Err(e)) => report
                            .violations
                            .push(format!("cycle {cycle}: producer of {name} failed: {e}")),
                        Err(_) => break,
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(10 + rng.below(50))).await;
        }
        novad.kill9();
        stop.store(true, Ordering::Release);
        for writer in writers {
            match writer.await {
                Ok((name, acked, bytes, largest)) => {
                    let stream = free.get_mut(&name).expect("stream");
                    report.acked_records += acked.len() as u64;
                    report.acked_bytes += bytes;
                    report.largest_batch_bytes = report.largest_batch_bytes.max(largest);
                    for (seq, body) in acked {
                        if let Some(previous) = stream.acked.insert(seq, body) {
                            report.violations.push(format!(
                                "cycle {cycle}: seq {seq} of {name} acknowledged twice (first to {})",
                                id_of(previous.as_bytes())
                            ));
                        }
                    }
                }
                Err(e) => report
                    .violations
                    .push(format!("cycle {cycle}: writer panicked: {e}")),
            }
        }

        // The restart must succeed.
        let restart = Instant::now();
        novad.restart_detached();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = novad.try_exit_status() {
                report.violations.push(format!(
                    "cycle {cycle}: novad failed to restart ({status}):\n{}",
                    tail(&novad.log(), 40)
                ));
                return report;
            }
            if novad.is_listening() {
                break;
            }
            if Instant::now() > deadline {
                report.violations.push(format!(
                    "cycle {cycle}: novad did not come back within 120s:\n{}",
                    tail(&novad.log(), 40)
                ));
                return report;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        report.restarts += 1;
        report.slowest_restart = report.slowest_restart.max(restart.elapsed());

        // Exactly-once producers settle everything they hold against the restarted star.
        for (name, stream) in exact.iter_mut() {
            if let Err(e) =
                tokio::time::timeout(Duration::from_secs(120), stream.producer.flush()).await
            {
                report
                    .violations
                    .push(format!("cycle {cycle}: {name} did not flush: {e}"));
                return report;
            }
            for (index, ticket) in stream.tickets.drain(..) {
                match ticket.wait().await {
                    Ok(seq) if seq == index as u64 => {
                        report.acked_records += 1;
                        report.acked_bytes += stream.sent[index].len() as u64;
                    }
                    Ok(seq) => report.violations.push(format!(
                        "cycle {cycle}: {name}: record {index} appended as seq {seq}"
                    )),
                    Err(e) => report
                        .violations
                        .push(format!("cycle {cycle}: {name}: record {index} failed: {e}")),
                }
            }
        }

        let found = verify(&client, cycle, &mut free, &mut exact, &mut report).await;
        report.unacked_but_durable += found;
        if !report.violations.is_empty() {
            return report;
        }
    }
    report
}

/// An unconditional writer: one session, batches until the star dies.
async fn free_writer(
    client: Client,
    stream: String,
    prefix: String,
    stop: Arc<AtomicBool>,
    rng: &mut Rng,
    large_one_in: u64,
    open_large: bool,
) -> (String, Vec<(u64, String)>, u64, u64) {
    let mut acked = Vec::new();
    let mut bytes = 0u64;
    let mut largest = 0u64;
    let Ok(mut session) = client.append_session().await else {
        return (stream, acked, bytes, largest);
    };
    let mut n = 0u64;
    let mut opening = open_large;
    while !stop.load(Ordering::Acquire) {
        let sizes = if std::mem::take(&mut opening) {
            LARGE_BATCH.to_vec()
        } else {
            batch_sizes(rng, large_one_in)
        };
        let bodies: Vec<String> = sizes
            .into_iter()
            .map(|size| {
                n += 1;
                body(&format!("{prefix}-{n}"), size)
            })
            .collect();
        let batch_bytes: u64 = bodies.iter().map(|b| b.len() as u64).sum();
        let records = bodies.iter().map(|b| Record::new(b.clone())).collect();
        match session.append(&stream, records, None).await {
            Ok(ack) => {
                bytes += batch_bytes;
                largest = largest.max(batch_bytes);
                for (i, body) in bodies.into_iter().enumerate() {
                    acked.push((ack.start_seq + i as u64, body));
                }
            }
            // The star died (or refused): this session is over. What it sent unacknowledged
            // may or may not be durable; the check allows either, but never twice.
            Err(_) => break,
        }
        tokio::time::sleep(Duration::from_millis(10 + rng.below(50))).await;
    }
    (stream, acked, bytes, largest)
}

/// Reads every stream from where the last check ended to its tail and checks it. Returns how
/// many durable records had no ack.
async fn verify(
    client: &Client,
    cycle: u64,
    free: &mut HashMap<String, FreeStream>,
    exact: &mut HashMap<String, ExactStream>,
    report: &mut CrashReport,
) -> u64 {
    let mut unacked = 0;
    for (name, stream) in free.iter_mut() {
        let Some(records) = read_checked(client, cycle, name, stream.verified_to, report).await
        else {
            continue;
        };
        let tail = stream.verified_to + records.len() as u64;
        if let Some((&last, _)) = stream.acked.iter().next_back()
            && last >= tail
        {
            report.violations.push(format!(
                "cycle {cycle}: {name} ends at {tail} but seq {last} was acknowledged"
            ));
        }
        for (i, body) in records.iter().enumerate() {
            let seq = stream.verified_to + i as u64;
            let id = id_of(body);
            match stream.acked.get(&seq) {
                Some(expected) if expected.as_bytes() != &body[..] => {
                    report.violations.push(format!(
                        "cycle {cycle}: {name} seq {seq} holds {id}, acknowledged as {}",
                        id_of(expected.as_bytes())
                    ));
                }
                Some(_) => {}
                None => unacked += 1,
            }
            if !stream.seen.insert(id.clone()) {
                report.violations.push(format!(
                    "cycle {cycle}: {name} holds {id} twice (again at {seq})"
                ));
            }
        }
        stream.verified_to = tail;
    }
    for (name, stream) in exact.iter_mut() {
        let Some(records) = read_checked(client, cycle, name, stream.verified_to, report).await
        else {
            continue;
        };
        for (i, body) in records.iter().enumerate() {
            let seq = stream.verified_to as usize + i;
            match stream.sent.get(seq) {
                Some(expected) if expected.as_bytes() == &body[..] => {}
                Some(expected) => report.violations.push(format!(
                    "cycle {cycle}: {name} seq {seq} holds {}, the producer appended {} there",
                    id_of(body),
                    id_of(expected.as_bytes())
                )),
                None => report.violations.push(format!(
                    "cycle {cycle}: {name} seq {seq} holds {}, past everything appended",
                    id_of(body)
                )),
            }
        }
        stream.verified_to += records.len() as u64;
        if stream.verified_to != stream.sent.len() as u64 {
            report.violations.push(format!(
                "cycle {cycle}: {name} holds {} records, its producer appended {}",
                stream.verified_to,
                stream.sent.len()
            ));
        }
    }
    unacked
}

/// The stream's records from `from` to its tail, or `None` with the failure reported.
async fn read_checked(
    client: &Client,
    cycle: u64,
    stream: &str,
    from: u64,
    report: &mut CrashReport,
) -> Option<Vec<bytes::Bytes>> {
    match read_from(client, stream, from).await {
        Ok(records) => Some(records),
        Err(e) => {
            report
                .violations
                .push(format!("cycle {cycle}: reading {stream}: {e}"));
            None
        }
    }
}

async fn read_from(
    client: &Client,
    stream: &str,
    from: u64,
) -> Result<Vec<bytes::Bytes>, nova_client::Error> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let page = client.read(stream, next, 0).await?;
        if page.tail_seq < from {
            return Err(nova_client::Error::SessionClosed(format!(
                "the tail moved backwards: {} after {from} was read",
                page.tail_seq
            )));
        }
        if page.records.is_empty() && next < page.tail_seq {
            return Err(nova_client::Error::SessionClosed(format!(
                "an empty page at {next} below the tail {}",
                page.tail_seq
            )));
        }
        for record in page.records {
            if record.seq != next {
                return Err(nova_client::Error::SessionClosed(format!(
                    "record {} where {next} was due",
                    record.seq
                )));
            }
            out.push(record.record.body);
            next += 1;
        }
        if next >= page.tail_seq {
            return Ok(out);
        }
    }
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
