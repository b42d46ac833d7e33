//! `nova append`: records from stdin or files, through the SDK's exactly-once producer, sized to
//! the server's limits.
//!
//! At the first record it cannot send (input it cannot parse, or a record over the server's
//! `--max-record-bytes`) it stops: the records before it are appended and their range printed,
//! nothing after it is sent, and the error names the input and line.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use nova_client::{AppendTicket, Client, Producer, ProducerConfig, ServerLimits, ServerRole};
use nova_proto::units::{human_bytes, parse_bytes, parse_duration};

use crate::Format;
use crate::framing::{Framing, Records};
use crate::output::json_line;
use crate::report::CliError;

#[derive(Args, Debug)]
pub struct AppendArgs {
    /// The stream to append to.
    stream: String,
    /// Files to read records from, in order; stdin when none.
    files: Vec<PathBuf>,
    /// How records are delimited in the input.
    #[arg(long, value_enum, default_value = "lines")]
    format: Framing,
    /// A batch is sent once it holds this many bytes (never more than the server's
    /// --max-batch-bytes).
    #[arg(long, default_value = "256KiB", value_parser = parse_bytes)]
    batch_bytes: u64,
    /// A batch is sent this long after its first record, full or not.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    linger: Duration,
    /// The largest record to send, if smaller than the server's --max-record-bytes (learned
    /// from it; 1 MiB from a server too old to say). A larger value is capped at the server's.
    #[arg(long, value_parser = parse_bytes)]
    max_record_bytes: Option<u64>,
    /// The longest a batch may wait for its acknowledgement, from its first send, retries
    /// included. While it retries, nova says on stderr what was refused and when it tries
    /// again; when the time runs out it exits 1, naming the last refusal and whether the batch
    /// may have been appended anyway.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    delivery_timeout: Duration,
}

#[derive(Serialize)]
struct Appended<'a> {
    stream: &'a str,
    records: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_seq: Option<u64>,
}

/// What the server allows, or a star's defaults from one too old to say.
pub async fn learn_limits(client: &Client) -> anyhow::Result<ServerLimits> {
    match client.server_info().await {
        Ok(info) if info.role == ServerRole::Gateway => Err(CliError::invalid(format!(
            "{} is a gateway, which serves reads only",
            info.id
        ))
        .with_hint(format!(
            "append on its star: --server {}",
            if info.star.is_empty() {
                "the star's URL"
            } else {
                &info.star
            }
        ))
        .into()),
        Ok(info) => Ok(info.limits),
        Err(error) if error.code() == Some(tonic::Code::Unimplemented) => {
            Ok(ServerLimits::star_defaults())
        }
        Err(error) => Err(error.into()),
    }
}

pub async fn run(client: &Client, args: AppendArgs, format: Format) -> anyhow::Result<()> {
    let defaults = ServerLimits::star_defaults();
    let limits = learn_limits(client).await?;
    // The flag can only lower the server's limit: a record over it would be refused by the
    // server with the rest of its batch, past the point where nova can name its line.
    let server_max_record = limits
        .max_record_bytes
        .or(defaults.max_record_bytes)
        .unwrap_or(1 << 20);
    let max_record_bytes = args
        .max_record_bytes
        .map_or(server_max_record, |flag| flag.min(server_max_record));
    let max_batch_bytes = limits.max_batch_bytes.or(defaults.max_batch_bytes);
    let max_batch_records = limits.max_batch_records.or(defaults.max_batch_records);
    let config = ProducerConfig {
        batch_bytes: args
            .batch_bytes
            .min(max_batch_bytes.unwrap_or(u64::MAX))
            .max(1) as usize,
        batch_records: ProducerConfig::default()
            .batch_records
            .min(max_batch_records.unwrap_or(u32::MAX) as usize)
            .max(1),
        linger: args.linger,
        max_record_bytes: max_record_bytes as usize,
        delivery_timeout: args.delivery_timeout,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client.clone(), &args.stream, config).await?;
    let inputs: Vec<(String, Box<dyn BufRead>)> = if args.files.is_empty() {
        vec![(
            "stdin".to_owned(),
            Box::new(BufReader::new(std::io::stdin())),
        )]
    } else {
        args.files
            .iter()
            .map(|path| {
                std::fs::File::open(path)
                    .map(|f| {
                        (
                            path.display().to_string(),
                            Box::new(BufReader::new(f)) as Box<dyn BufRead>,
                        )
                    })
                    .with_context(|| format!("opening {}", path.display()))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let mut first: Option<AppendTicket> = None;
    let mut last: Option<AppendTicket> = None;
    let mut count = 0u64;
    let mut stopped = None;
    'inputs: for (name, input) in inputs {
        let records = Records::new(input, name, args.format, max_record_bytes);
        let records = if max_record_bytes < server_max_record {
            records.limited_by("nova's --max-record-bytes")
        } else {
            records
        };
        for item in records {
            let record = match item {
                Ok((_, record)) => record,
                Err(bad) => {
                    stopped = Some(bad);
                    break 'inputs;
                }
            };
            let ticket = match producer.append(record).await {
                Ok(ticket) => ticket,
                Err(error) => return Err(what_was_appended(first, error).await),
            };
            count += 1;
            // Only the first and the last tickets matter for the range; the producer resolves
            // the rest in order between them.
            if first.is_none() {
                first = Some(ticket);
            } else {
                last = Some(ticket);
            }
        }
    }
    let closed = producer.close().await;
    let start = match first {
        Some(ticket) => match ticket.wait().await {
            Ok(seq) => Some(seq),
            Err(error) => return Err(said_with_range(None, error)),
        },
        None => None,
    };
    if let Err(error) = closed {
        return Err(said_with_range(start, error));
    }
    let end = match last {
        Some(ticket) => Some(
            ticket
                .wait()
                .await
                .map_err(|error| said_with_range(start, error))?
                + 1,
        ),
        None => start.map(|s| s + 1),
    };
    let mut out = std::io::stdout().lock();
    match (format, start, end) {
        (Format::Text, Some(start), Some(end)) => writeln!(out, "{start}..{end}")?,
        (Format::Text, _, _) if stopped.is_none() => eprintln!("nova: no records on the input"),
        (Format::Text, _, _) => {}
        (Format::Json, start, end) => json_line(
            &mut out,
            &Appended {
                stream: &args.stream,
                records: count,
                start_seq: start,
                end_seq: end,
            },
        )?,
    }
    out.flush()?;
    match stopped {
        None => Ok(()),
        Some(bad) => {
            let before = match (start, end) {
                (Some(start), Some(end)) => {
                    format!("the {count} records before it were appended ({start}..{end})")
                }
                _ => "nothing before it was appended".to_owned(),
            };
            let mut error = CliError::invalid(format!(
                "{}: {}; {before}, and nothing after it was sent",
                bad.position, bad.problem
            ));
            if bad.problem.contains("nova's --max-record-bytes") {
                error = error.with_hint(format!(
                    "split the record, or raise nova's --max-record-bytes (the server takes up \
                     to {})",
                    human_bytes(server_max_record)
                ));
            } else if bad.problem.contains("--max-record-bytes") {
                error = error.with_hint(format!(
                    "split the record, or raise the server's --max-record-bytes (now {}); \
                     --max-record-bytes on nova only lowers what nova sends",
                    human_bytes(server_max_record)
                ));
            }
            Err(error.into())
        }
    }
}

/// The producer failed part-way: say how much of the input is in the stream, so that it can be
/// sent again from the right record rather than whole (which would append the rest twice).
async fn what_was_appended(
    first: Option<AppendTicket>,
    error: nova_client::Error,
) -> anyhow::Error {
    let start = match first {
        Some(ticket) => ticket.wait().await.ok(),
        None => None,
    };
    said_with_range(start, error)
}

fn said_with_range(start: Option<u64>, error: nova_client::Error) -> anyhow::Error {
    let failed_at = match &error {
        nova_client::Error::DeliveryTimeout { start_seq, .. } => Some(*start_seq),
        _ => None,
    };
    let context = match (start, failed_at) {
        (Some(start), Some(at)) if at >= start => format!(
            "the first {} records of the input were appended ({start}..{at}); from record {} \
             of the input on they were not{}",
            at - start,
            at - start + 1,
            if error.is_outcome_unknown() {
                ", or may not have been"
            } else {
                ""
            }
        ),
        (None, Some(at)) => {
            format!("none of the input was acknowledged (it was to start at seq {at})")
        }
        _ => return error.into(),
    };
    anyhow::Error::new(error).context(context)
}
