//! `nova`: the command-line client for a Nova star.

#![allow(
    clippy::disallowed_methods,
    reason = "a command-line tool at the process edge: it times real runs on the real clock"
)]

mod append;
mod bench;
mod framing;
mod group;
mod output;
mod read;
mod report;
mod retries;
mod status;
mod stream;
mod token;
mod when;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use nova_client::{Client, ClientConfig, ClientTls, RetryPolicy};

#[derive(Parser)]
#[command(
    name = "nova",
    version,
    about = "Talk to a Nova star or gateway: manage streams, append, read, follow, show Kafka \
             consumer groups, check status, benchmark.",
    after_help = "Every flag can also be set from the environment (NOVA_SERVER, NOVA_TOKEN). \
                  Errors go to stderr, with a hint where there is one; with --output json, as \
                  one JSON object carrying the gRPC code.\n\n\
                  Sizes: KiB, MiB, GiB, TiB (or K, M, G, T) are powers of 1024; KB, MB, GB, TB \
                  powers of 1000; a bare number is bytes. Durations take a unit (ms, s, m, h, \
                  d, w), and terms combine: 500ms, 90s, 1h30m, 2w.",
    // One layout throughout: each flag's help on the lines under it.
    next_line_help = true,
    // The flags every command takes, listed after each command's own.
    next_help_heading = "Global options"
)]
struct Cli {
    /// The server's gRPC URL: a star (novad) or, for reads, a gateway. HOST:PORT means
    /// http://HOST:PORT; https:// speaks TLS and verifies the server's certificate (it never
    /// falls back to plain text).
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

    /// CA certificates (PEM) to verify an https:// server against, instead of the system's
    /// roots.
    #[arg(long, global = true, env = "NOVA_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,

    /// A host a redirect over TLS may send this command's calls (and its token) to, besides the
    /// server's own host: a name, or *.domain. Repeat for more. Not needed with --tls-ca (the
    /// fleet's CA vouches for its stars).
    #[arg(
        long,
        env = "NOVA_ALLOW_REDIRECT",
        value_delimiter = ',',
        global = true
    )]
    allow_redirect: Vec<String>,

    /// A client certificate (PEM) to present to servers that require one (mutual TLS); with
    /// --client-key.
    #[arg(long, global = true, env = "NOVA_CLIENT_CERT", requires = "client_key")]
    client_cert: Option<std::path::PathBuf>,

    /// The private key of --client-cert (PEM).
    #[arg(long, global = true, env = "NOVA_CLIENT_KEY", requires = "client_cert")]
    client_key: Option<std::path::PathBuf>,

    /// The name the server's certificate must carry, when not the host in --server.
    #[arg(long, global = true, env = "NOVA_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,

    /// Output for people (text) or for scripts (json: one JSON object per line on stdout, and
    /// errors as JSON objects on stderr).
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

#[derive(Subcommand)]
enum Command {
    /// Create, list, describe, reconfigure or delete streams.
    Stream {
        #[command(subcommand)]
        command: stream::StreamCommand,
    },
    /// List and describe Kafka consumer groups: committed offsets, lag and members.
    Group {
        #[command(subcommand)]
        command: group::GroupCommand,
    },
    /// Append records from stdin (or files) to a stream, exactly once.
    ///
    /// Prints the range of sequence numbers the records were given as START..END (END
    /// exclusive). Batches follow the server's limits. At the first record it cannot send
    /// (unparsable, or over the server's --max-record-bytes) it stops: the records before it
    /// are appended and their range printed, nothing after it is sent, and it exits 1 naming
    /// the input and line.
    Append(append::AppendArgs),
    /// Print records from a sequence number or a time, up to the tail.
    ///
    /// Stops at the tail, --limit or --until; with --follow it keeps printing new records as
    /// they arrive, and outlives restarts of its server.
    Read(read::ReadArgs),
    /// Print the last records of a stream; with -f, keep printing new ones as they arrive.
    Tail(read::TailArgs),
    /// Ask the server what it is and how it is doing.
    ///
    /// Prints its role, id and version, whether it is ready (and why not), its uptime, and for
    /// a star its epoch, memory saturation, streams and limits. A fleet star also says how many
    /// stars it sees and the address redirects to it carry, and counts only the streams it
    /// leads.
    #[command(visible_alias = "ping")]
    Status,
    /// Measure append throughput and ack latency against a star.
    Bench(bench::BenchArgs),
    /// Make tokens for servers that check them (--auth-tokens).
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(refusal) => return refuse_arguments(refusal),
    };
    let (server, json) = (cli.server.clone(), cli.output == Format::Json);
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report::report(&error, &server, json);
            ExitCode::FAILURE
        }
    }
}

/// A command line clap could not take: said like every other error (as JSON with `--output
/// json`), with exit status 1. Help and the version print as clap prints them.
fn refuse_arguments(refusal: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        refusal.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        refusal.exit();
    }
    if !wants_json(std::env::args()) {
        let _ = refusal.print();
        return ExitCode::FAILURE;
    }
    // clap's text is "error: WHAT", then usage and tips: the first line is the message.
    let text = refusal.to_string();
    let mut lines = text.lines().filter(|line| !line.trim().is_empty());
    let message = lines
        .next()
        .unwrap_or("the command line could not be read")
        .trim_start_matches("error: ")
        .to_owned();
    let error = report::CliError::invalid(message).with_hint("see `nova --help`");
    report::report(&error.into(), "", true);
    ExitCode::FAILURE
}

/// Whether the command line asks for JSON output (read by hand: clap could not parse it).
fn wants_json(args: impl Iterator<Item = String>) -> bool {
    let args: Vec<String> = args.collect();
    args.windows(2)
        .any(|pair| pair[0] == "--output" && pair[1] == "json")
        || args.iter().any(|arg| arg == "--output=json")
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Needs no server.
    if let Command::Token { command } = cli.command {
        return token::run(command, cli.output);
    }
    let server = report::server_url(&cli.server)?;
    let tls = ClientTls::from_files(
        cli.tls_ca.as_deref(),
        cli.client_cert.as_deref().zip(cli.client_key.as_deref()),
        cli.tls_server_name.clone(),
    )
    .map_err(|e| report::CliError::invalid(e.to_string()))?;
    // Calls that are safe to repeat (describe, list, read, status) are retried a few times,
    // each retry said on stderr; appends retry within the producer's delivery timeout; a
    // follow retries on its own, as long as it takes, saying so (see read.rs).
    let follows = match &cli.command {
        Command::Read(args) => args.follows(),
        Command::Tail(args) => args.follows(),
        _ => false,
    };
    let retry = if follows {
        RetryPolicy::none()
    } else {
        RetryPolicy::default()
    };
    let notices = std::sync::Arc::new(retries::Notices::new(cli.output == Format::Json));
    let mut config = ClientConfig::new([server.as_str()])
        .with_retry(retry)
        .with_tls(tls)
        .with_redirect_hosts(cli.allow_redirect.clone())
        .on_retry(move |retrying| notices.tell(retrying));
    if let Some(token) = &cli.token {
        config = config.with_token(token)?;
    }
    let client = Client::connect_with(config).await?;
    match cli.command {
        Command::Stream { command } => stream::run(&client, command, cli.output).await,
        Command::Group { command } => group::run(&client, command, cli.output).await,
        Command::Append(args) => append::run(&client, args, cli.output).await,
        Command::Read(args) => read::read(&client, args, cli.output).await,
        Command::Tail(args) => read::tail(&client, args, cli.output).await,
        Command::Status => status::run(&client, &server, cli.output).await,
        Command::Bench(args) => bench::run(&client, args, cli.output).await,
        Command::Token { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every subcommand, argument and flag says what it is for in `--help`.
    #[test]
    fn everything_has_help_text() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                let path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(path.clone());
                }
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "nova", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
        Cli::command().debug_assert();
    }
}
