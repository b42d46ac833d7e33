//! `nova append`: records from stdin or files, through the SDK's exactly-once producer.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use nova_client::{AppendTicket, Client, Producer, ProducerConfig, Record};

use crate::output::json_line;
use crate::{Format, Framing};

/// Yields records from a reader in the chosen framing.
struct Records<R> {
    input: R,
    framing: Framing,
}

impl<R: BufRead> Iterator for Records<R> {
    type Item = anyhow::Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.framing {
            Framing::Lines => {
                let mut line = Vec::new();
                match self.input.read_until(b'\n', &mut line) {
                    Ok(0) => None,
                    Ok(_) => {
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                        Some(Ok(line))
                    }
                    Err(e) => Some(Err(e.into())),
                }
            }
            Framing::LengthPrefixed => {
                let mut len = [0u8; 4];
                match self.input.read_exact(&mut len) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
                    Err(e) => return Some(Err(e.into())),
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                Some(
                    self.input
                        .read_exact(&mut body)
                        .map(|()| body)
                        .context("input ends inside a length-prefixed record"),
                )
            }
        }
    }
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

pub async fn run(
    client: &Client,
    stream: &str,
    files: &[PathBuf],
    framing: Framing,
    batch_bytes: u64,
    linger: Duration,
    format: Format,
) -> anyhow::Result<()> {
    let config = ProducerConfig {
        batch_bytes: batch_bytes as usize,
        linger,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(client.clone(), stream, config).await?;
    let mut first: Option<AppendTicket> = None;
    let mut last: Option<AppendTicket> = None;
    let mut count = 0u64;
    let inputs: Vec<Box<dyn BufRead>> = if files.is_empty() {
        vec![Box::new(BufReader::new(std::io::stdin()))]
    } else {
        files
            .iter()
            .map(|path| {
                std::fs::File::open(path)
                    .map(|f| Box::new(BufReader::new(f)) as Box<dyn BufRead>)
                    .with_context(|| format!("opening {}", path.display()))
            })
            .collect::<anyhow::Result<_>>()?
    };
    for input in inputs {
        for body in (Records { input, framing }) {
            let ticket = producer.append(Record::new(body?)).await?;
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
    producer.close().await?;
    let start = match first {
        Some(ticket) => Some(ticket.wait().await?),
        None => None,
    };
    let end = match last {
        Some(ticket) => Some(ticket.wait().await? + 1),
        None => start.map(|s| s + 1),
    };
    let mut out = std::io::stdout().lock();
    match (format, start, end) {
        (Format::Text, Some(start), Some(end)) => writeln!(out, "{start}..{end}")?,
        (Format::Text, _, _) => eprintln!("nova: no records on the input"),
        (Format::Json, start, end) => json_line(
            &mut out,
            &Appended {
                stream,
                records: count,
                start_seq: start,
                end_seq: end,
            },
        )?,
    }
    Ok(())
}
