//! `nova bench`: N producer sessions appending fixed-size records, unthrottled or at a target
//! rate, for a duration or a number of bytes. Reports throughput, ack latency percentiles,
//! errors by code, and (from the star's metrics endpoint) PUTs per GiB, the star's CPU time per
//! MiB and its peak resident memory.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};

use nova_client::{Client, Error, Record, StreamConfig};
use nova_proto::units::{parse_bytes, parse_duration};

use crate::Format;
use crate::output::json_line;
use crate::stream::Class;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Producer sessions.
    #[arg(long, default_value_t = 16)]
    sessions: usize,
    /// Streams the sessions spread over (default: one per session). With more streams than
    /// sessions, each session appends to its share of them in turn, a batch to each (shares
    /// differ by one stream when they do not divide evenly). A session goes to its first
    /// stream's star: in a fleet, give sessions several streams only when one star leads them
    /// all.
    #[arg(long)]
    streams: Option<usize>,
    /// Stream names start with this. Each run makes fresh streams, <prefix>-<run>-<n>, and
    /// deletes them at the end (see --keep-streams, --reuse-streams).
    #[arg(long, default_value = "bench")]
    stream_prefix: String,
    /// Append to <prefix>-<n> instead, creating those that are missing and keeping them all
    /// afterwards (to read them back, or to measure on streams that already hold data).
    #[arg(long)]
    reuse_streams: bool,
    /// Keep the fresh streams of this run instead of deleting them; their names are printed.
    #[arg(long)]
    keep_streams: bool,
    /// The class of the streams it creates: standard, or express (the star needs zone
    /// buckets). Streams that already exist keep theirs.
    #[arg(long, value_enum, default_value = "standard")]
    storage_class: Class,
    /// Bytes per record body.
    #[arg(long, default_value = "1KiB", value_parser = parse_bytes)]
    record_bytes: u64,
    /// Records per append batch.
    #[arg(long, default_value_t = 64)]
    batch_records: usize,
    /// Target records per second over all sessions; 0 means as fast as the star acks.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Batches each session keeps sent but unacknowledged.
    #[arg(long, default_value_t = 32)]
    pipeline: usize,
    /// How long to run (default 30s unless --bytes is given).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Stop after this many bytes are acknowledged.
    #[arg(long, value_parser = parse_bytes)]
    bytes: Option<u64>,
    /// The star's metrics endpoint (http://host:port/metrics), for PUTs per GiB, CPU per MiB
    /// and peak RSS.
    #[arg(long)]
    metrics_url: Option<String>,
    /// The longest a session waits for an acknowledgement after sending a batch; then the
    /// session stops and the wait is counted as a DeadlineExceeded error. (The bench does not
    /// retry: a refused batch stops its session and is counted under its code.)
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    delivery_timeout: Duration,
    /// No live progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Stream creations or deletions in flight at once.
const STREAM_CALLS_AT_ONCE: usize = 32;

/// Deletes the run's streams, saying which could not be deleted (one already gone is fine).
async fn delete_streams<'a>(client: &Client, names: impl IntoIterator<Item = &'a String>) {
    futures::stream::iter(names)
        .for_each_concurrent(STREAM_CALLS_AT_ONCE, |name| async move {
            match client.delete_stream(name).await {
                Ok(_) => {}
                Err(error) if error.code() == Some(tonic::Code::NotFound) => {}
                Err(error) => eprintln!("nova: could not delete bench stream {name}: {error}"),
            }
        })
        .await;
}

/// Passes `result` on, deleting the run's streams first when it failed (unless they are kept).
async fn or_clean_up<T>(
    result: anyhow::Result<T>,
    client: &Client,
    names: &[String],
    keep: bool,
) -> anyhow::Result<T> {
    if result.is_err() && !keep {
        delete_streams(client, names).await;
    }
    result
}

/// The streams session `n` of `sessions` appends to: with no more streams than sessions, the
/// one stream `n` wraps onto; with more, every stream whose index is `n` modulo `sessions`.
fn share_of(names: &[String], n: usize, sessions: usize) -> Vec<String> {
    if names.len() <= sessions {
        return names
            .get(n % names.len().max(1))
            .cloned()
            .into_iter()
            .collect();
    }
    names
        .iter()
        .skip(n)
        .step_by(sessions.max(1))
        .cloned()
        .collect()
}

/// Latency histograms in microseconds, 1 µs to 100 s, 3 significant figures.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

struct Shared {
    records: AtomicU64,
    bytes: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    /// Latencies since the progress bar last looked.
    recent: Mutex<Histogram<u64>>,
    stop: AtomicBool,
}

impl Shared {
    fn error(&self, error: &Error) {
        let code = match error.code() {
            Some(code) => format!("{code:?}"),
            None => "transport".to_owned(),
        };
        *self
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
    }
}

async fn session(
    client: Client,
    streams: Vec<String>,
    args: Arc<BenchArgs>,
    shared: Arc<Shared>,
) -> Histogram<u64> {
    let mut latencies = histogram();
    let body = Bytes::from(vec![b'n'; args.record_bytes as usize]);
    let batch_bytes = args.record_bytes * args.batch_records as u64;
    let Some(first) = streams.first().cloned() else {
        return latencies;
    };
    // In a fleet the session goes to its first stream's leader (describing it finds the
    // leader); a session spread over several streams assumes one star leads them all.
    if let Err(error) = client.describe_stream(&first).await {
        shared.error(&error);
        return latencies;
    }
    let (sender, mut receiver) = match client.append_session_for(&first).await {
        Ok(session) => session.split(),
        Err(error) => {
            shared.error(&error);
            return latencies;
        }
    };
    let window = Arc::new(Semaphore::new(args.pipeline.max(1)));
    let delivery_timeout = args.delivery_timeout;
    let (sent, mut to_ack) =
        mpsc::channel::<(Instant, tokio::sync::OwnedSemaphorePermit)>(args.pipeline.max(1));
    // Each session sends an equal share of the target rate.
    let interval = (args.rate > 0.0).then(|| {
        Duration::from_secs_f64(args.batch_records as f64 * args.sessions as f64 / args.rate)
    });
    let sending = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut ticker = interval.map(|every| {
                let mut ticker = tokio::time::interval(every);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticker
            });
            for stream in streams.iter().cycle() {
                if shared.stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(ticker) = ticker.as_mut() {
                    ticker.tick().await;
                }
                let Ok(permit) = window.clone().acquire_owned().await else {
                    break;
                };
                let records = (0..args.batch_records)
                    .map(|_| Record::new(body.clone()))
                    .collect();
                let started = Instant::now();
                if let Err(error) = sender.send(stream, records, None).await {
                    shared.error(&error);
                    break;
                }
                if sent.send((started, permit)).await.is_err() {
                    break;
                }
            }
        })
    };
    while let Some((started, permit)) = to_ack.recv().await {
        let ack = tokio::time::timeout_at((started + delivery_timeout).into(), receiver.next_ack())
            .await
            .unwrap_or_else(|_| {
                Err(Error::Status {
                    code: tonic::Code::DeadlineExceeded,
                    message: format!(
                        "no acknowledgement within --delivery-timeout {delivery_timeout:?}"
                    ),
                    retry_after: None,
                    next_seq: None,
                    first_seq: None,
                    leader: None,
                })
            });
        match ack {
            Ok(ack) => {
                let micros = started.elapsed().as_micros().max(1) as u64;
                let _ = latencies.record(micros.min(100_000_000));
                let _ = shared
                    .recent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(micros.min(100_000_000));
                shared
                    .records
                    .fetch_add(ack.end_seq - ack.start_seq, Ordering::Relaxed);
                shared.bytes.fetch_add(batch_bytes, Ordering::Relaxed);
            }
            Err(error) => {
                shared.error(&error);
                break;
            }
        }
        drop(permit);
    }
    sending.abort();
    latencies
}

/// A few series from the star's metrics page.
#[derive(Debug, Clone, Copy, Default)]
struct StarSample {
    puts: f64,
    cpu_seconds: f64,
    peak_rss: f64,
}

async fn sample_star(url: &str) -> anyhow::Result<StarSample> {
    let page = fetch(url).await?;
    let value = |series: &str| -> f64 {
        page.lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == series).then(|| value.parse().ok()).flatten()
            })
            .unwrap_or(0.0)
    };
    Ok(StarSample {
        puts: value("nova_object_store_requests_total{op=\"put_if_absent\",outcome=\"ok\"}"),
        cpu_seconds: value("nova_process_cpu_seconds_total"),
        peak_rss: value("nova_process_peak_resident_bytes"),
    })
}

/// A plain HTTP/1.1 GET, enough for a metrics page.
async fn fetch(url: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--metrics-url must start with http://"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, "metrics"));
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(response))
}

#[derive(Serialize)]
struct Report {
    sessions: usize,
    streams: usize,
    record_bytes: u64,
    batch_records: usize,
    target_records_per_sec: f64,
    seconds: f64,
    records: u64,
    bytes: u64,
    mib_per_sec: f64,
    records_per_sec: f64,
    ack_latency_ms: Latency,
    /// With --rate: the share of it achieved, and whether the run fell short of it (under 95%).
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_achieved: Option<f64>,
    rate_shortfall: bool,
    /// The streams appended to, when they are kept.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    streams_kept: Vec<String>,
    errors: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    star: Option<StarReport>,
}

#[derive(Serialize)]
struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

#[derive(Serialize)]
struct StarReport {
    puts: f64,
    puts_per_gib: f64,
    cpu_seconds: f64,
    cpu_ms_per_mib: f64,
    peak_rss_mib: f64,
}

fn radix36(mut n: u64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(std::char::from_digit((n % 36) as u32, 36).unwrap_or('0'));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.iter().rev().collect()
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

pub async fn run(client: &Client, args: BenchArgs, format: Format) -> anyhow::Result<()> {
    let streams = args.streams.unwrap_or(args.sessions).max(1);
    let duration = match (args.duration, args.bytes) {
        (Some(duration), _) => Some(duration),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(30)),
    };
    let config = StreamConfig {
        storage_class: args.storage_class.into(),
        ..StreamConfig::default()
    };
    let names: Vec<String> = if args.reuse_streams {
        (0..streams)
            .map(|n| format!("{}-{n}", args.stream_prefix))
            .collect()
    } else {
        // A run id from the clock, in base 36: short, and fresh for every run.
        let run = radix36(crate::when::now_ms());
        (0..streams)
            .map(|n| format!("{}-{run}-{n}", args.stream_prefix))
            .collect()
    };
    let keep = args.reuse_streams || args.keep_streams;
    // Many streams are created (and deleted) a few dozen at a time, not one round trip each;
    // after the first failure no more are asked for.
    let stopped = AtomicBool::new(false);
    let created: Vec<(&String, Option<Result<(), Error>>)> = futures::stream::iter(&names)
        .map(|name| {
            let stopped = &stopped;
            async move {
                if stopped.load(Ordering::Relaxed) {
                    return (name, None);
                }
                let outcome = match client.create_stream_configured(name, config).await {
                    Ok(_) => Ok(()),
                    Err(error)
                        if args.reuse_streams
                            && error.code() == Some(tonic::Code::AlreadyExists) =>
                    {
                        Ok(())
                    }
                    Err(error) => {
                        stopped.store(true, Ordering::Relaxed);
                        Err(error)
                    }
                };
                (name, Some(outcome))
            }
        })
        .buffer_unordered(STREAM_CALLS_AT_ONCE)
        .collect()
        .await;
    if stopped.load(Ordering::Relaxed) {
        // The run cannot start: leave nothing of it behind. A creation that failed without an
        // answer (the connection broke, a deadline passed) may still have been applied, so it
        // is deleted too; one refused as already existing is another run's.
        let mut first = None;
        let mut made = Vec::new();
        for (name, outcome) in created {
            match outcome {
                Some(Ok(())) => made.push(name),
                Some(Err(error)) => {
                    if error.code() != Some(tonic::Code::AlreadyExists) {
                        made.push(name);
                    }
                    first.get_or_insert((name, error));
                }
                None => {}
            }
        }
        if keep {
            let kept: Vec<&str> = made.iter().map(|name| name.as_str()).collect();
            eprintln!("nova: bench streams kept: {}", kept.join(" "));
        } else {
            delete_streams(client, made).await;
        }
        if let Some((name, error)) = first {
            return Err(anyhow::Error::new(error).context(format!("creating bench stream {name}")));
        }
    }
    let before = match &args.metrics_url {
        Some(url) => Some(or_clean_up(sample_star(url).await, client, &names, keep).await?),
        None => None,
    };
    let shared = Arc::new(Shared {
        records: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        errors: Mutex::new(BTreeMap::new()),
        recent: Mutex::new(histogram()),
        stop: AtomicBool::new(false),
    });
    let args = Arc::new(args);
    let started = Instant::now();
    let sessions: Vec<_> = (0..args.sessions)
        .map(|n| {
            tokio::spawn(session(
                client.clone(),
                share_of(&names, n, args.sessions),
                args.clone(),
                shared.clone(),
            ))
        })
        .collect();

    let progress = (format == Format::Text && !args.quiet).then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar
    });
    let mut last = (Instant::now(), 0u64);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let bytes = shared.bytes.load(Ordering::Relaxed);
        let done = duration.is_some_and(|d| started.elapsed() >= d)
            || args.bytes.is_some_and(|b| bytes >= b)
            || sessions.iter().all(|s| s.is_finished());
        if let Some(bar) = &progress {
            let elapsed = last.0.elapsed().as_secs_f64();
            let rate = (bytes - last.1) as f64 / elapsed / (1 << 20) as f64;
            let p99 = {
                let mut recent = shared.recent.lock().unwrap_or_else(|e| e.into_inner());
                let p99 = recent.value_at_quantile(0.99);
                recent.reset();
                p99
            };
            let errors: u64 = shared
                .errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .sum();
            bar.set_message(format!(
                "{rate:>8.1} MiB/s  {:>10} records  ack p99 {:>7.1} ms  errors {errors}",
                shared.records.load(Ordering::Relaxed),
                ms(p99)
            ));
            bar.tick();
        }
        last = (Instant::now(), bytes);
        if done {
            break;
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    // Sessions stop sending and collect the acks still owed; those count too (the star wrote
    // them, and its PUTs are in the figures), and so does the time they take.
    let mut latencies = histogram();
    for session in sessions {
        if let Ok(histogram) = session.await {
            let _ = latencies.add(&histogram);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let records = shared.records.load(Ordering::Relaxed);
    let bytes = shared.bytes.load(Ordering::Relaxed);
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let star = match (&args.metrics_url, before) {
        (Some(url), Some(before)) => {
            let after = or_clean_up(sample_star(url).await, client, &names, keep).await?;
            let gib = bytes as f64 / (1u64 << 30) as f64;
            let mib = bytes as f64 / (1u64 << 20) as f64;
            let puts = after.puts - before.puts;
            let cpu = after.cpu_seconds - before.cpu_seconds;
            Some(StarReport {
                puts,
                puts_per_gib: if gib > 0.0 { puts / gib } else { 0.0 },
                cpu_seconds: cpu,
                cpu_ms_per_mib: if mib > 0.0 { cpu * 1000.0 / mib } else { 0.0 },
                peak_rss_mib: after.peak_rss / (1u64 << 20) as f64,
            })
        }
        _ => None,
    };
    if !keep {
        delete_streams(client, &names).await;
    }
    let records_per_sec = records as f64 / seconds;
    let rate_achieved = (args.rate > 0.0).then(|| records_per_sec / args.rate);
    let report = Report {
        sessions: args.sessions,
        streams,
        record_bytes: args.record_bytes,
        batch_records: args.batch_records,
        target_records_per_sec: args.rate,
        seconds,
        records,
        bytes,
        mib_per_sec: bytes as f64 / seconds / (1u64 << 20) as f64,
        records_per_sec,
        rate_achieved,
        rate_shortfall: rate_achieved.is_some_and(|share| share < 0.95),
        streams_kept: if keep { names } else { Vec::new() },
        ack_latency_ms: Latency {
            p50: ms(latencies.value_at_quantile(0.5)),
            p90: ms(latencies.value_at_quantile(0.9)),
            p99: ms(latencies.value_at_quantile(0.99)),
            p999: ms(latencies.value_at_quantile(0.999)),
            max: ms(latencies.max()),
        },
        errors: shared
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        star,
    };
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => json_line(&mut out, &report)?,
        Format::Text => print_report(&mut out, &report)?,
    }
    Ok(())
}

fn print_report(out: &mut impl Write, r: &Report) -> anyhow::Result<()> {
    writeln!(
        out,
        "{} sessions over {} streams, {} B records in batches of {}, {}",
        r.sessions,
        r.streams,
        r.record_bytes,
        r.batch_records,
        if r.target_records_per_sec > 0.0 {
            format!("target {} records/s", r.target_records_per_sec)
        } else {
            "unthrottled".to_owned()
        }
    )?;
    writeln!(
        out,
        "throughput   {:.1} MiB/s, {:.0} records/s ({} records in {:.1} s)",
        r.mib_per_sec, r.records_per_sec, r.records, r.seconds
    )?;
    let l = &r.ack_latency_ms;
    writeln!(
        out,
        "ack latency  p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  p99.9 {:.1} ms  max {:.1} ms",
        l.p50, l.p90, l.p99, l.p999, l.max
    )?;
    if r.errors.is_empty() {
        writeln!(out, "errors       none")?;
    } else {
        let list: Vec<String> = r
            .errors
            .iter()
            .map(|(code, n)| format!("{code}: {n}"))
            .collect();
        writeln!(out, "errors       {}", list.join(", "))?;
    }
    if r.rate_shortfall {
        writeln!(
            out,
            "SHORT OF --rate: {:.0} records/s of the {} asked ({:.0}%): the star acked slower \
             than asked, or the sessions' pipelines (--pipeline) ran full; see the ack latency",
            r.records_per_sec,
            r.target_records_per_sec,
            r.rate_achieved.unwrap_or(0.0) * 100.0
        )?;
    }
    if !r.streams_kept.is_empty() {
        writeln!(out, "streams kept {}", r.streams_kept.join(" "))?;
    }
    if let Some(star) = &r.star {
        writeln!(
            out,
            "star         {:.0} PUTs ({:.1} per GiB), {:.2} CPU s ({:.2} ms per MiB), peak RSS {:.1} MiB",
            star.puts, star.puts_per_gib, star.cpu_seconds, star.cpu_ms_per_mib, star.peak_rss_mib
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::share_of;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    #[test]
    fn more_streams_than_sessions_gives_every_stream_to_exactly_one_session() {
        let names = names(10);
        let shares: Vec<Vec<String>> = (0..3).map(|n| share_of(&names, n, 3)).collect();
        assert_eq!(shares[0], ["s0", "s3", "s6", "s9"]);
        assert_eq!(shares[2], ["s2", "s5", "s8"]);
        let mut all: Vec<String> = shares.concat();
        all.sort_by_key(|s| s[1..].parse::<usize>().unwrap());
        assert_eq!(all, names);
    }

    #[test]
    fn fewer_streams_than_sessions_wraps_sessions_onto_them() {
        let names = names(2);
        let shares: Vec<Vec<String>> = (0..5).map(|n| share_of(&names, n, 5)).collect();
        assert_eq!(shares, [["s0"], ["s1"], ["s0"], ["s1"], ["s0"]]);
    }
}
