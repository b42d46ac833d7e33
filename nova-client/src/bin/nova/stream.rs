//! `nova stream`: create, list, describe, reconfigure, delete.

use std::io::Write;

use clap::{Subcommand, ValueEnum};
use serde::Serialize;

use std::time::Duration;

use nova_client::{Client, Retention, StorageClass, StreamConfig};
use nova_proto::units::{parse_bytes, parse_duration};

use crate::Format;
use crate::output::{StreamJson, describe, json_line};
use crate::report::CliError;

/// A retention limit on the command line: a value, or `none` for no limit.
#[derive(Debug, Clone, Copy)]
pub enum Limit<T> {
    Set(T),
    None,
}

fn limit<T: Default + PartialEq>(
    text: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<Limit<T>, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit::None);
    }
    let value = parse(text)?;
    if value == T::default() {
        return Err(format!(
            "a limit of {text} would trim every record as it lands; `none` removes the limit"
        ));
    }
    Ok(Limit::Set(value))
}

fn age_limit(text: &str) -> Result<Limit<Duration>, String> {
    limit(text, parse_duration)
}

fn bytes_limit(text: &str) -> Result<Limit<u64>, String> {
    limit(text, parse_bytes)
}

/// A limit a new stream starts with: leaving the flag out is no limit, so 0 is refused.
fn first_limit<T: Default + PartialEq>(
    text: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, String> {
    let value = parse(text)?;
    if value == T::default() {
        return Err(format!(
            "a limit of {text} would trim every record as it lands; leave the flag out for no \
             limit"
        ));
    }
    Ok(value)
}

fn first_age(text: &str) -> Result<Duration, String> {
    first_limit(text, parse_duration)
}

fn first_bytes(text: &str) -> Result<u64, String> {
    first_limit(text, parse_bytes)
}

#[derive(Subcommand)]
pub enum StreamCommand {
    /// Create a stream, optionally with a retention (records past it are trimmed, whole objects
    /// at a time, from the stream's front).
    Create {
        /// The stream's name: 1 to 512 bytes of UTF-8 without control characters.
        name: String,
        /// Trim records older than this (e.g. 7d, 12h).
        #[arg(long, value_parser = first_age)]
        retention_age: Option<Duration>,
        /// Trim the oldest records while the stream holds more than this (e.g. 10GiB).
        #[arg(long, value_parser = first_bytes)]
        retention_bytes: Option<u64>,
        /// Where records are acknowledged: standard (the regional bucket) or express (a
        /// quorum of zone buckets; only on stars configured with them).
        #[arg(long, value_enum, default_value = "standard")]
        storage_class: Class,
    },
    /// Change a stream's retention or storage class; what is left out stays as it is.
    ///
    /// A retention limit of `none` removes it. A new storage class applies to the appends
    /// admitted after the change: while the appends in flight land, the stream's producers are
    /// asked to retry (the SDK's producer does so by itself); records already stored stay where
    /// they are.
    Reconfigure {
        /// The stream's name.
        name: String,
        /// Where appends are acknowledged from now on: standard, or express (only on stars
        /// with zone buckets).
        #[arg(long, value_enum)]
        storage_class: Option<Class>,
        /// Trim records older than this (e.g. 7d), or `none`.
        #[arg(long, value_parser = age_limit)]
        retention_age: Option<Limit<Duration>>,
        /// Trim the oldest records while the stream holds more than this (e.g. 10GiB), or
        /// `none`.
        #[arg(long, value_parser = bytes_limit)]
        retention_bytes: Option<Limit<u64>>,
    },
    /// List streams, one per line with its tail.
    List {
        /// Only streams whose names start with this (as `--prefix`).
        #[arg(value_name = "PREFIX", conflicts_with = "prefix")]
        under: Option<String>,
        /// Only streams whose names start with this.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Show a stream: its records, stored bytes, class, creation date and retention.
    Describe {
        /// The stream's name.
        name: String,
    },
    /// Delete a stream: its name goes at once, its records when the auditor collects them.
    Delete {
        /// The stream's name.
        name: String,
    },
}

#[derive(Serialize)]
struct Done<'a> {
    stream: &'a str,
    done: &'a str,
}

/// A storage class as the CLI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Class {
    Standard,
    Express,
}

impl From<Class> for StorageClass {
    fn from(class: Class) -> Self {
        match class {
            Class::Standard => StorageClass::Standard,
            Class::Express => StorageClass::Express,
        }
    }
}

pub async fn run(client: &Client, command: StreamCommand, format: Format) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        StreamCommand::Create {
            name,
            retention_age,
            retention_bytes,
            storage_class,
        } => {
            let config = StreamConfig {
                storage_class: storage_class.into(),
                retention: Retention {
                    age: retention_age,
                    bytes: retention_bytes,
                },
            };
            let info = client.create_stream_configured(&name, config).await?;
            match format {
                Format::Text => writeln!(out, "created {}", info.name)?,
                Format::Json => json_line(&mut out, &StreamJson::from(&info))?,
            }
        }
        StreamCommand::List { under, prefix } => {
            let prefix = under.unwrap_or(prefix);
            let mut after = String::new();
            loop {
                let (streams, next) = client.list_streams(&prefix, &after, 1000).await?;
                for info in &streams {
                    match format {
                        Format::Text => writeln!(out, "{}\ttail={}", info.name, info.tail_seq)?,
                        Format::Json => json_line(&mut out, &StreamJson::from(info))?,
                    }
                }
                match next {
                    Some(next) => after = next,
                    None => break,
                }
            }
        }
        StreamCommand::Describe { name } => {
            let info = client.describe_stream(&name).await?;
            match format {
                Format::Text => describe(&mut out, &info)?,
                Format::Json => json_line(&mut out, &StreamJson::from(&info))?,
            }
        }
        StreamCommand::Reconfigure {
            name,
            storage_class,
            retention_age,
            retention_bytes,
        } => {
            if storage_class.is_none() && retention_age.is_none() && retention_bytes.is_none() {
                return Err(CliError::invalid(format!(
                    "nothing to change in stream {name:?}: give --storage-class, \
                     --retention-age or --retention-bytes"
                ))
                .into());
            }
            let current = client.describe_stream(&name).await?;
            let mut retention = current.retention;
            match retention_age {
                Some(Limit::Set(age)) => retention.age = Some(age),
                Some(Limit::None) => retention.age = None,
                None => {}
            }
            match retention_bytes {
                Some(Limit::Set(bytes)) => retention.bytes = Some(bytes),
                Some(Limit::None) => retention.bytes = None,
                None => {}
            }
            let info = match storage_class {
                Some(class) => {
                    let config = StreamConfig {
                        storage_class: class.into(),
                        retention,
                    };
                    client.reconfigure_stream_configured(&name, config).await?
                }
                None => client.reconfigure_stream(&name, retention).await?,
            };
            match format {
                Format::Text => describe(&mut out, &info)?,
                Format::Json => json_line(&mut out, &StreamJson::from(&info))?,
            }
        }
        StreamCommand::Delete { name } => {
            client.delete_stream(&name).await?;
            match format {
                Format::Text => writeln!(out, "deleted {name}")?,
                Format::Json => json_line(
                    &mut out,
                    &Done {
                        stream: &name,
                        done: "deleted",
                    },
                )?,
            }
        }
    }
    Ok(())
}
