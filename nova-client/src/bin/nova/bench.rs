//! `nova bench`: N producer sessions appending fixed-size records, unthrottled or at a target
//! rate, for a duration or a number of bytes. Reports throughput, ack latency percentiles,
//! errors by code, and (from the star's metrics endpoint) PUTs per GiB, the star's CPU time per
//! MiB and its peak resident memory.

use std::collections::{BTreeMap, HashMap};
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
use tokio::sync::{Semaphore, mpsc, watch};

use nova_client::{AckReceiver, AppendSender, Client, Error, Record, StreamConfig};
use nova_proto::units::{parse_bytes, parse_duration};

use crate::Format;
use crate::output::json_line;
use crate::stream::Class;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Producer sessions.
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    sessions: usize,
    /// Streams the sessions spread over (default: one per session). With more streams than
    /// sessions, each session appends to its share of them in turn, a batch to each (shares
    /// differ by one stream when they do not divide evenly). In a fleet each session goes to
    /// one star and carries only streams that star leads: the sessions are split over the
    /// leaders in proportion to their streams, at least one each.
    #[arg(long, value_parser = at_least_one)]
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
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    batch_records: usize,
    /// Target records per second over all sessions; 0 means as fast as the star acks.
    #[arg(long, default_value_t = 0.0, value_parser = parse_rate)]
    rate: f64,
    /// Batches each session keeps sent but unacknowledged.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
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

/// A count that must be at least one.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// Records per second: a finite number, zero or more (0: as fast as the star acks).
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        Ok(_) => Err(format!(
            "{text} is not a rate: give records per second as a finite number, or 0 for as fast \
             as the star acknowledges"
        )),
        Err(_) => Err(format!("{text:?} is not a number")),
    }
}

/// The time between one session's batches at `rate` records per second over all sessions, or
/// an error when a timer cannot pace it (a period that rounds to nothing, or that no clock can
/// hold).
fn pacing(rate: f64, batch_records: usize, sessions: usize) -> anyhow::Result<Option<Duration>> {
    if rate <= 0.0 {
        return Ok(None);
    }
    let every = batch_records as f64 * sessions as f64 / rate;
    match Duration::try_from_secs_f64(every) {
        Ok(period) if !period.is_zero() => Ok(Some(period)),
        _ => anyhow::bail!(
            "--rate {rate} asks each of {sessions} sessions for a batch of {batch_records} \
             every {every:e} s, which a timer cannot pace; use --rate 0 for as fast as the star \
             acknowledges"
        ),
    }
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

/// The run's streams grouped by the star leading each (in the order leaders first appear).
/// Describing a stream finds its leader, following redirects, so the client then routes its
/// calls there.
async fn by_leader(
    client: &Client,
    names: &[String],
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let leaders: Vec<(String, Result<String, Error>)> = futures::stream::iter(names)
        .map(|name| async move {
            let leader = client
                .describe_stream(name)
                .await
                .map(|info| info.leader_addr);
            (name.clone(), leader)
        })
        .buffered(STREAM_CALLS_AT_ONCE)
        .collect()
        .await;
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (name, leader) in leaders {
        let leader = leader.map_err(|error| {
            anyhow::Error::new(error).context(format!("finding the leader of bench stream {name}"))
        })?;
        match groups.iter_mut().find(|(star, _)| *star == leader) {
            Some((_, group)) => group.push(name),
            None => groups.push((leader, vec![name])),
        }
    }
    Ok(groups)
}

/// Splits `sessions` over the leaders' groups of streams in proportion to their sizes, at least
/// one session each (so there may be more sessions than asked when there are more leaders),
/// and gives each session its share of its group's streams.
fn plan(groups: &[(String, Vec<String>)], sessions: usize) -> Vec<Vec<(String, String)>> {
    let total: usize = groups
        .iter()
        .map(|(_, group)| group.len())
        .sum::<usize>()
        .max(1);
    let mut shares = Vec::new();
    let (mut given, mut streams_before) = (0, 0);
    for (leader, group) in groups {
        // Rounding the running total keeps the sum at `sessions` when every group gets one.
        streams_before += group.len();
        let upto = ((sessions * streams_before + total / 2) / total).max(given + 1);
        let n = upto - given;
        given = upto;
        shares.extend((0..n).map(|k| {
            share_of(group, k, n)
                .into_iter()
                .map(|stream| (stream, leader.clone()))
                .collect()
        }));
    }
    shares
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
    /// Streams whose leader moved mid-run (each move counted once).
    redirects: AtomicU64,
    /// Set when the run is over: sessions send no more and collect the acks still owed.
    stopped: watch::Sender<bool>,
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

/// Where each stream of a session is led, as last learned: stream → the leader's address
/// (empty on a single star). Shared by the session's two halves.
#[derive(Clone)]
struct Leaders(Arc<Mutex<HashMap<String, String>>>);

impl Leaders {
    fn new(streams: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(Arc::new(Mutex::new(streams.into_iter().collect())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where `stream` is led, as last learned.
    fn of(&self, stream: &str) -> Option<String> {
        self.lock().get(stream).cloned()
    }

    /// Records that `leader` leads `stream` now; true when that is news.
    fn learn(&self, stream: &str, leader: String) -> bool {
        let before = self.lock().insert(stream.to_owned(), leader.clone());
        before != Some(leader)
    }
}

/// What the sending half of a session tells the half collecting acknowledgements.
enum Sent {
    /// An append session was opened on a leader; its acknowledgements come on this receiver.
    Opened(String, AckReceiver),
    /// A batch for `stream` went to `leader`.
    Batch {
        started: Instant,
        permit: tokio::sync::OwnedSemaphorePermit,
        leader: String,
        stream: String,
    },
}

/// One producer session: appends to its streams in turn until the run stops, each batch to its
/// stream's leader over an append session opened there (one per leader; at the start all of a
/// session's streams share one). When leadership moves mid-run, the old leader refuses the
/// stream's batches with the new leader's address; the session learns it (counted as a
/// redirect) and sends the stream's later batches there. Refused batches are not counted.
async fn session(
    client: Client,
    streams: Vec<(String, String)>,
    args: Arc<BenchArgs>,
    interval: Option<Duration>,
    shared: Arc<Shared>,
) -> Histogram<u64> {
    let mut latencies = histogram();
    if streams.is_empty() {
        return latencies;
    }
    let names: Vec<String> = streams.iter().map(|(stream, _)| stream.clone()).collect();
    let leaders = Leaders::new(streams);
    let window = Arc::new(Semaphore::new(args.pipeline));
    // Batches are bounded by the window; the rest of the room is for sessions opened.
    let (sent, mut to_ack) = mpsc::channel::<Sent>(args.pipeline + 8);
    let sending = tokio::spawn(send_batches(
        client.clone(),
        names,
        leaders.clone(),
        args.clone(),
        interval,
        shared.clone(),
        window,
        sent,
    ));
    let delivery_timeout = args.delivery_timeout;
    let batch_bytes = args.record_bytes * args.batch_records as u64;
    let mut receivers: HashMap<String, AckReceiver> = HashMap::new();
    let mut failed = None;
    while let Some(item) = to_ack.recv().await {
        let (started, permit, leader, stream) = match item {
            Sent::Opened(leader, receiver) => {
                receivers.insert(leader, receiver);
                continue;
            }
            Sent::Batch {
                started,
                permit,
                leader,
                stream,
            } => (started, permit, leader, stream),
        };
        let Some(receiver) = receivers.get_mut(&leader) else {
            continue;
        };
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
            // Refused by the star this session was opened on as the stream's leader, naming
            // that same star: the session reached another one. It would be refused forever, so
            // it fails, counted, instead.
            Err(error) if error.leader() == Some(leader.as_str()) => {
                failed = Some(error);
                break;
            }
            // This batch was refused because another star leads its stream now; the session
            // goes on, and learns where (once per move: later refusals of the same move find
            // it learnt).
            Err(error) if error.leader().is_some() => {
                let learnt = leaders.of(&stream).is_some_and(|now| now != leader);
                if !learnt && let Err(error) = follow(&client, &stream, &leaders, &shared).await {
                    failed = Some(error);
                    break;
                }
            }
            Err(error) => {
                failed = Some(error);
                break;
            }
        }
        drop(permit);
    }
    sending.abort();
    match (failed, sending.await) {
        (Some(error), _) | (None, Ok(Err(error))) => shared.error(&error),
        (None, Err(join)) if join.is_panic() => shared.error(&Error::SessionClosed(
            "the session's sending task panicked".into(),
        )),
        _ => {}
    }
    latencies
}

/// Learns where `stream` is led now (describing it follows the redirect, and the client routes
/// its calls there from then on); a move is counted once, however many batches were refused.
async fn follow(
    client: &Client,
    stream: &str,
    leaders: &Leaders,
    shared: &Shared,
) -> Result<(), Error> {
    let now = client.describe_stream(stream).await?.leader_addr;
    if leaders.learn(stream, now) {
        shared.redirects.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// The sending half of a session: a batch to each stream in turn, paced when asked, each on an
/// append session at its stream's leader (opened the first time it is needed).
#[allow(clippy::too_many_arguments)]
async fn send_batches(
    client: Client,
    streams: Vec<String>,
    leaders: Leaders,
    args: Arc<BenchArgs>,
    interval: Option<Duration>,
    shared: Arc<Shared>,
    window: Arc<Semaphore>,
    sent: mpsc::Sender<Sent>,
) -> Result<(), Error> {
    let body = Bytes::from(vec![b'n'; args.record_bytes as usize]);
    let mut stopped = shared.stopped.subscribe();
    // The first batch goes at once; then one each period.
    let mut ticker = interval.map(|every| {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker
    });
    let mut senders: HashMap<String, AppendSender> = HashMap::new();
    let mut first = true;
    for stream in streams.iter().cycle() {
        if *stopped.borrow() {
            break;
        }
        if let Some(ticker) = ticker.as_mut().filter(|_| !first) {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stopped.wait_for(|stop| *stop) => break,
            }
        }
        first = false;
        let permit = tokio::select! {
            permit = window.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let leader = leaders.of(stream).unwrap_or_default();
        if !senders.contains_key(&leader) {
            // Describing the stream first makes the client route it to its leader now (it may
            // have forgotten routes learnt long ago), so the session opens there.
            client.describe_stream(stream).await?;
            let (sender, receiver) = client.append_session_for(stream).await?.split();
            senders.insert(leader.clone(), sender);
            if sent
                .send(Sent::Opened(leader.clone(), receiver))
                .await
                .is_err()
            {
                break;
            }
        }
        let Some(sender) = senders.get(&leader) else {
            break;
        };
        let records = (0..args.batch_records)
            .map(|_| Record::new(body.clone()))
            .collect();
        let started = Instant::now();
        sender.send(stream, records, None).await?;
        let batch = Sent::Batch {
            started,
            permit,
            leader,
            stream: stream.clone(),
        };
        if sent.send(batch).await.is_err() {
            break;
        }
    }
    Ok(())
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
    /// Stars leading the streams when the run started (each session appends to one).
    leaders: usize,
    /// Times a session followed its streams to a new leader mid-run.
    redirects: u64,
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
    // A rate no timer can pace is refused before any stream is made.
    pacing(args.rate, args.batch_records, args.sessions)?;
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
    let groups = or_clean_up(by_leader(client, &names).await, client, &names, keep).await?;
    let before = match &args.metrics_url {
        Some(url) => Some(or_clean_up(sample_star(url).await, client, &names, keep).await?),
        None => None,
    };
    let shared = Arc::new(Shared {
        records: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        errors: Mutex::new(BTreeMap::new()),
        recent: Mutex::new(histogram()),
        redirects: AtomicU64::new(0),
        stopped: watch::Sender::new(false),
    });
    let args = Arc::new(args);
    let shares = plan(&groups, args.sessions);
    let interval = or_clean_up(
        pacing(args.rate, args.batch_records, shares.len()),
        client,
        &names,
        keep,
    )
    .await?;
    let started = Instant::now();
    let sessions: Vec<_> = shares
        .into_iter()
        .map(|share| {
            tokio::spawn(session(
                client.clone(),
                share,
                args.clone(),
                interval,
                shared.clone(),
            ))
        })
        .collect();
    let session_count = sessions.len();

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
    shared.stopped.send_replace(true);
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
        sessions: session_count,
        streams,
        leaders: groups.len(),
        redirects: shared.redirects.load(Ordering::Relaxed),
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
        "{} sessions over {} streams{}, {} B records in batches of {}, {}",
        r.sessions,
        r.streams,
        if r.leaders > 1 {
            format!(" led by {} stars", r.leaders)
        } else {
            String::new()
        },
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
    if r.redirects > 0 {
        writeln!(
            out,
            "redirects    {} (sessions that followed their streams to a new leader; the batches \
             in flight on the old one are not counted)",
            r.redirects
        )?;
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
    use super::{pacing, plan, share_of};

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

    #[test]
    fn sessions_split_over_leaders_in_proportion_and_never_cross_them() {
        let streams = |shares: &[Vec<(String, String)>]| -> Vec<Vec<String>> {
            shares
                .iter()
                .map(|share| share.iter().map(|(s, _)| s.clone()).collect())
                .collect()
        };
        let a = names(6);
        let b: Vec<String> = (6..8).map(|i| format!("s{i}")).collect();
        let groups = [("star-a".to_owned(), a.clone()), ("star-b".to_owned(), b)];
        let shares = plan(&groups, 4);
        assert_eq!(shares.len(), 4);
        // Six streams to two get three sessions to one, each session on one leader.
        assert!(
            shares[..3]
                .iter()
                .flatten()
                .all(|(s, l)| a.contains(s) && l == "star-a")
        );
        assert_eq!(streams(&shares[..3]).concat().len(), 6);
        assert_eq!(streams(&shares[3..]), [["s6", "s7"]]);
        assert!(shares[3].iter().all(|(_, l)| l == "star-b"));
        // More leaders than sessions: one session each all the same.
        assert_eq!(plan(&groups, 1).len(), 2);
        // One star: the same shares as without leaders.
        let names = names(10);
        let single = plan(&[(String::new(), names.clone())], 3);
        let plain: Vec<Vec<String>> = (0..3).map(|n| share_of(&names, n, 3)).collect();
        assert_eq!(streams(&single), plain);
    }

    #[test]
    fn rates_a_timer_cannot_pace_are_refused_not_panicked_on() {
        assert_eq!(pacing(0.0, 64, 16).unwrap(), None);
        assert_eq!(
            pacing(1024.0, 64, 16).unwrap(),
            Some(std::time::Duration::from_secs(1))
        );
        let refused = pacing(1e300, 64, 16).unwrap_err().to_string();
        assert!(refused.contains("--rate 0"), "{refused}");
        assert!(pacing(1e-300, 64, 16).is_err(), "a period no clock holds");
        assert!(super::parse_rate("inf").is_err());
        assert!(super::parse_rate("NaN").is_err());
        assert!(super::parse_rate("-1").is_err());
        assert!(super::at_least_one("0").is_err());
    }
}
