//! `nova read` and `nova tail`: pages of records to stdout, from a sequence number or a time,
//! optionally following the stream. A follower outlives its server: when the star or gateway
//! goes away (a restart, a redirect to a new leader) it says so on stderr, retries with
//! backoff, and resumes at the next record it has not printed, so none is missed or printed
//! twice.

use std::io::Write;
use std::time::Duration;

use clap::Args;

use nova_client::{Client, Consumer, Error, Page};
use nova_proto::units::parse_duration;

use crate::Format;
use crate::framing::{Framing, write_record};
use crate::output::json_line;
use crate::when::{now_ms, parse_time};

#[derive(Args, Debug)]
pub struct ReadArgs {
    /// The stream to read.
    stream: String,
    /// First sequence number to read (default 0, the stream's first record).
    #[arg(long, conflicts_with_all = ["from_time", "ago"])]
    from: Option<u64>,
    /// Start at the first record stamped at or after this time: RFC 3339
    /// (2026-12-02T10:30:00Z), a date (2026-12-02, midnight UTC), or Unix ms.
    #[arg(long, value_parser = parse_time, conflicts_with = "ago")]
    from_time: Option<u64>,
    /// Start at records stamped at most this long ago (30s, 10m, 2h, 7d).
    #[arg(long, value_parser = parse_duration)]
    ago: Option<Duration>,
    /// Stop before the first record stamped after this time (same forms as --from-time).
    #[arg(long, value_parser = parse_time)]
    until: Option<u64>,
    /// Stop after this many records.
    #[arg(long)]
    limit: Option<u64>,
    /// Keep reading at the tail: print new records as they arrive, until interrupted (or
    /// --limit, or --until). Survives server restarts and leader moves: it waits for its
    /// server as long as it takes, as tail -f does, saying on stderr that it is retrying.
    #[arg(short, long)]
    follow: bool,
    #[command(flatten)]
    print: PrintArgs,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    /// The stream to read.
    stream: String,
    /// Follow the stream: wait at the tail for new records until interrupted. Survives server
    /// restarts and leader moves: it waits for its server as long as it takes, saying on
    /// stderr that it is retrying.
    #[arg(short, long)]
    follow: bool,
    /// How many records before the tail to start at.
    #[arg(short = 'n', long, default_value_t = 10)]
    lines: u64,
    #[command(flatten)]
    print: PrintArgs,
}

impl ReadArgs {
    /// Whether it waits for new records (and so for its server, however long).
    pub fn follows(&self) -> bool {
        self.follow
    }
}

impl TailArgs {
    /// Whether it waits for new records (and so for its server, however long).
    pub fn follows(&self) -> bool {
        self.follow
    }
}

#[derive(Args, Debug, Clone, Copy)]
pub struct PrintArgs {
    /// How records are printed: lines (bodies only), length-prefixed, or json (with sequence
    /// numbers, timestamps and headers). Default: json with --output json, else lines.
    #[arg(long, value_enum)]
    format: Option<Framing>,
}

impl PrintArgs {
    fn framing(self, output: Format) -> Framing {
        self.format.unwrap_or(match output {
            Format::Json => Framing::Json,
            Format::Text => Framing::Lines,
        })
    }
}

/// What one run of reading is after.
struct Plan {
    stream: String,
    from: u64,
    from_time: Option<u64>,
    until: Option<u64>,
    limit: Option<u64>,
    follow: bool,
    framing: Framing,
    output: Format,
}

pub async fn read(client: &Client, args: ReadArgs, output: Format) -> anyhow::Result<()> {
    let from_time = match (args.from_time, args.ago) {
        (Some(at), _) => Some(at),
        (None, Some(ago)) => Some(now_ms().saturating_sub(ago.as_millis() as u64)),
        (None, None) => None,
    };
    let plan = Plan {
        stream: args.stream,
        from: args.from.unwrap_or(0),
        from_time,
        until: args.until,
        limit: args.limit,
        follow: args.follow,
        framing: args.print.framing(output),
        output,
    };
    if let Some(from) = args.from
        && !plan.follow
    {
        let tail = client.describe_stream(&plan.stream).await?.tail_seq;
        if from > tail {
            hint(
                output,
                &format!(
                    "--from {from} is past the tail of {:?} ({tail}): nothing to read yet; \
                     add --follow to wait for records there",
                    plan.stream
                ),
            );
            return Ok(());
        }
    }
    run(client, plan).await
}

pub async fn tail(client: &Client, args: TailArgs, output: Format) -> anyhow::Result<()> {
    let tail = client.describe_stream(&args.stream).await?.tail_seq;
    let from = tail.saturating_sub(args.lines);
    let plan = Plan {
        stream: args.stream,
        from,
        from_time: None,
        until: None,
        limit: (!args.follow).then_some(tail - from),
        follow: args.follow,
        framing: args.print.framing(output),
        output,
    };
    run(client, plan).await
}

/// A hint for the user on stderr: a line for people, a JSON object for scripts.
fn hint(output: Format, text: &str) {
    note(output, "hint", text);
}

/// A note on stderr, under `kind`: `kind: text`, or `{"kind": "text"}` for scripts.
fn note(output: Format, kind: &str, text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = match output {
        Format::Text => writeln!(err, "{kind}: {text}"),
        Format::Json => {
            json_line(&mut err, &serde_json::json!({ kind: text })).map_err(std::io::Error::other)
        }
    };
}

/// How long one follow request waits at the tail before asking again.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);

/// Backoff between attempts to reach a server that went away.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

async fn run(client: &Client, plan: Plan) -> anyhow::Result<()> {
    let mut consumer = Consumer::new(client.clone(), &plan.stream, plan.from);
    if plan.follow {
        consumer = consumer.follow(FOLLOW_WAIT);
    }
    if let Some(at) = plan.from_time {
        consumer = consumer.from_time(at);
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut left = plan.limit.unwrap_or(u64::MAX);
    let mut reconnecting = Reconnecting::default();
    while left > 0 {
        consumer = consumer.page_size(left.min(u32::MAX as u64) as u32, 0);
        let page = match consumer.next_page().await {
            Ok(page) => {
                reconnecting.recovered(&plan, consumer.position());
                page
            }
            Err(error) if plan.follow && error.is_retryable() => {
                reconnecting
                    .failed(&plan, &error, consumer.position())
                    .await;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        for record in &page.records {
            if plan
                .until
                .is_some_and(|until| record.record.timestamp > until)
            {
                out.flush()?;
                return Ok(());
            }
            write_record(&mut out, record, plan.framing)?;
        }
        left -= page.records.len() as u64;
        if plan.follow {
            // Per page, so a pipe sees records as they arrive.
            out.flush()?;
        }
        if at_end(&plan, &consumer, &page) {
            break;
        }
    }
    out.flush()?;
    Ok(())
}

/// Whether a read stops after `page`: without --follow at the tail (unless a read by time is
/// still passing over earlier records); with it, once --until is behind the clock at the tail
/// (every record still to come is stamped later).
fn at_end(plan: &Plan, consumer: &Consumer, page: &Page) -> bool {
    let at_tail = page.next_seq >= page.tail_seq;
    if !plan.follow {
        return at_tail || (page.records.is_empty() && !consumer.seeking_past(page));
    }
    at_tail && plan.until.is_some_and(|until| now_ms() > until)
}

/// The state of a follower that lost its server. A follow waits for its server as long as it
/// takes, as `tail -f` does, and says so: once when lost, then at each attempt (at most about
/// once a second), and once when back.
#[derive(Default)]
struct Reconnecting {
    attempts: u32,
    last_said: Option<std::time::Instant>,
}

impl Reconnecting {
    async fn failed(&mut self, plan: &Plan, error: &Error, position: u64) {
        self.attempts += 1;
        let step = RECONNECT_FIRST
            .saturating_mul(1 << self.attempts.saturating_sub(1).min(8))
            .min(RECONNECT_MAX);
        let wait = error.retry_after().unwrap_or(step);
        let now = std::time::Instant::now();
        if self.attempts == 1 {
            note(
                plan.output,
                "notice",
                &format!(
                    "lost the server ({error}); retrying until it is back (Ctrl-C stops), to \
                     resume {} at seq {position}",
                    plan.stream
                ),
            );
            self.last_said = Some(now);
        } else if self
            .last_said
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            note(
                plan.output,
                "notice",
                &format!(
                    "still retrying {} (attempt {}): {error}; next attempt in {} ms",
                    plan.stream,
                    self.attempts,
                    wait.as_millis()
                ),
            );
            self.last_said = Some(now);
        }
        tokio::time::sleep(wait).await;
    }

    fn recovered(&mut self, plan: &Plan, position: u64) {
        if self.attempts > 0 {
            note(
                plan.output,
                "notice",
                &format!(
                    "reconnected after {} attempts; resuming {} at seq {position}",
                    self.attempts, plan.stream
                ),
            );
            self.attempts = 0;
        }
    }
}
