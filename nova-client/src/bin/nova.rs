//! `nova`: the command-line client for a Nova star.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use nova_client::{Client, Record};

#[derive(Parser)]
#[command(
    name = "nova",
    version,
    about = "Talk to a Nova star: manage streams, append, read."
)]
struct Cli {
    /// The star's gRPC URL.
    #[arg(
        long,
        global = true,
        env = "NOVA_SERVER",
        default_value = "http://127.0.0.1:7400"
    )]
    server: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create, list, describe or delete streams.
    Stream {
        #[command(subcommand)]
        command: StreamCommand,
    },
    /// Append stdin to a stream, one record per line. Prints each acknowledged batch's
    /// sequence range as START..END (END exclusive).
    Append {
        stream: String,
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch_records: usize,
        /// Content bytes per batch.
        #[arg(long, default_value_t = 1 << 20)]
        batch_bytes: usize,
    },
    /// Print record bodies from a stream, one per line, from a sequence number.
    Read {
        stream: String,
        /// First sequence number to read.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Stop after this many records (default: read up to the current tail).
        #[arg(long)]
        limit: Option<u64>,
    },
}

#[derive(Subcommand)]
enum StreamCommand {
    Create {
        name: String,
    },
    /// List streams, one name per line with its tail.
    List {
        #[arg(long, default_value = "")]
        prefix: String,
    },
    Describe {
        name: String,
    },
    Delete {
        name: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nova: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = Client::connect(&cli.server).await?;
    match cli.command {
        Command::Stream { command } => stream(&client, command).await,
        Command::Append {
            stream,
            batch_records,
            batch_bytes,
        } => append(&client, &stream, batch_records.max(1), batch_bytes.max(1)).await,
        Command::Read {
            stream,
            from,
            limit,
        } => read(&client, &stream, from, limit).await,
    }
}

async fn stream(client: &Client, command: StreamCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        StreamCommand::Create { name } => {
            let info = client.create_stream(&name).await?;
            writeln!(out, "created {}", info.name)?;
        }
        StreamCommand::List { prefix } => {
            let mut after = String::new();
            loop {
                let (streams, next) = client.list_streams(&prefix, &after, 1000).await?;
                for info in streams {
                    writeln!(out, "{}\ttail={}", info.name, info.tail_seq)?;
                }
                match next {
                    Some(next) => after = next,
                    None => break,
                }
            }
        }
        StreamCommand::Describe { name } => {
            let info = client.describe_stream(&name).await?;
            writeln!(out, "name: {}", info.name)?;
            writeln!(out, "tail_seq: {}", info.tail_seq)?;
            writeln!(out, "stored_bytes: {}", info.stored_bytes)?;
            writeln!(out, "storage_class: {}", info.storage_class)?;
            writeln!(out, "created_at_ms: {}", info.created_at_ms)?;
        }
        StreamCommand::Delete { name } => {
            client.delete_stream(&name).await?;
            writeln!(out, "deleted {name}")?;
        }
    }
    Ok(())
}

async fn append(
    client: &Client,
    stream: &str,
    batch_records: usize,
    batch_bytes: usize,
) -> anyhow::Result<()> {
    let mut session = client.append_session().await?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().split(b'\n');
    let mut sent = 0usize;
    let mut done = false;
    while !done {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while batch.len() < batch_records && bytes < batch_bytes {
            match lines.next() {
                Some(line) => {
                    let mut line = line.context("reading stdin")?;
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    bytes += line.len();
                    batch.push(Record::new(line));
                }
                None => {
                    done = true;
                    break;
                }
            }
        }
        if batch.is_empty() {
            break;
        }
        session.send(stream, batch, None).await?;
        sent += 1;
    }
    session.finish();
    let mut out = std::io::stdout().lock();
    for _ in 0..sent {
        let ack = session.next_ack().await?;
        writeln!(out, "{}..{}", ack.start_seq, ack.end_seq)?;
    }
    Ok(())
}

async fn read(client: &Client, stream: &str, from: u64, limit: Option<u64>) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut next = from;
    let mut left = limit.unwrap_or(u64::MAX);
    while left > 0 {
        let want = left.min(u32::MAX as u64) as u32;
        let page = client.read(stream, next, want).await?;
        if page.records.is_empty() {
            break;
        }
        for record in &page.records {
            out.write_all(&record.record.body)?;
            out.write_all(b"\n")?;
        }
        left -= page.records.len() as u64;
        next = page.next_seq;
        if next >= page.tail_seq {
            break;
        }
    }
    out.flush()?;
    Ok(())
}
