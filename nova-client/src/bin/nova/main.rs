//! `nova`: the command-line client for a Nova star.

#![allow(
    clippy::disallowed_methods,
    reason = "a command-line tool at the process edge: it times real runs on the real clock"
)]

mod append;
mod bench;
mod output;
mod read;
mod stream;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use nova_client::{Client, ClientConfig, RetryPolicy};
use nova_proto::units::{parse_bytes, parse_duration};

#[derive(Parser)]
#[command(
    name = "nova",
    version,
    about = "Talk to a Nova star: manage streams, append, read, benchmark."
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

    /// A bearer token sent with every call (for stars and gateways that check tokens). Prefer
    /// the environment variable: a flag's value shows in the process list.
    #[arg(long, global = true, env = "NOVA_TOKEN", hide_env_values = true)]
    token: Option<String>,

    /// Output for people (text) or for scripts (json: one JSON object per line).
    #[arg(long, global = true, value_enum, default_value = "text")]
    output: Format,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Framing {
    /// One record per line (a trailing \r is dropped).
    Lines,
    /// Each record is a 4-byte big-endian length followed by that many bytes.
    LengthPrefixed,
}

#[derive(Subcommand)]
enum Command {
    /// Create, list, describe or delete streams.
    Stream {
        #[command(subcommand)]
        command: stream::StreamCommand,
    },
    /// Append records from stdin (or files) to a stream, exactly once. Prints the range of
    /// sequence numbers they were given as START..END (END exclusive).
    Append {
        stream: String,
        /// Files to read records from, in order; stdin when none.
        files: Vec<PathBuf>,
        /// How records are delimited in the input.
        #[arg(long, value_enum, default_value = "lines")]
        format: Framing,
        /// A batch is sent once it holds this many bytes.
        #[arg(long, default_value = "256KiB", value_parser = parse_bytes)]
        batch_bytes: u64,
        /// A batch is sent this long after its first record, full or not.
        #[arg(long, default_value = "5ms", value_parser = parse_duration)]
        linger: Duration,
    },
    /// Print records from a sequence number up to the tail (or --limit), one body per line.
    Read {
        stream: String,
        /// First sequence number to read.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Stop after this many records.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Print the last records of a stream; with -f, keep printing new ones as they arrive.
    Tail {
        stream: String,
        /// Follow the stream: wait at the tail for new records until interrupted.
        #[arg(short, long)]
        follow: bool,
        /// How many records before the tail to start at.
        #[arg(short = 'n', long, default_value_t = 10)]
        lines: u64,
    },
    /// Measure append throughput and ack latency against a star.
    Bench(bench::BenchArgs),
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
    let mut config = ClientConfig::new([cli.server.as_str()])
        .with_retry(RetryPolicy::none())
        .with_max_message_bytes(usize::MAX);
    if let Some(token) = &cli.token {
        config = config.with_token(token)?;
    }
    let client = Client::connect_with(config).await?;
    match cli.command {
        Command::Stream { command } => stream::run(&client, command, cli.output).await,
        Command::Append {
            stream,
            files,
            format,
            batch_bytes,
            linger,
        } => {
            append::run(
                &client,
                &stream,
                &files,
                format,
                batch_bytes,
                linger,
                cli.output,
            )
            .await
        }
        Command::Read {
            stream,
            from,
            limit,
        } => read::read(&client, &stream, from, limit, cli.output).await,
        Command::Tail {
            stream,
            follow,
            lines,
        } => read::tail(&client, &stream, lines, follow, cli.output).await,
        Command::Bench(args) => bench::run(&client, args, cli.output).await,
    }
}
