//! `nova stream`: create, list, describe, delete.

use std::io::Write;

use clap::Subcommand;
use serde::Serialize;

use nova_client::Client;

use crate::Format;
use crate::output::{StreamJson, json_line};

#[derive(Subcommand)]
pub enum StreamCommand {
    Create {
        name: String,
    },
    /// List streams, one per line with its tail.
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

#[derive(Serialize)]
struct Done<'a> {
    stream: &'a str,
    done: &'a str,
}

pub async fn run(client: &Client, command: StreamCommand, format: Format) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        StreamCommand::Create { name } => {
            let info = client.create_stream(&name).await?;
            match format {
                Format::Text => writeln!(out, "created {}", info.name)?,
                Format::Json => json_line(&mut out, &StreamJson::from(&info))?,
            }
        }
        StreamCommand::List { prefix } => {
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
                Format::Text => {
                    writeln!(out, "name: {}", info.name)?;
                    writeln!(out, "tail_seq: {}", info.tail_seq)?;
                    writeln!(out, "stored_bytes: {}", info.stored_bytes)?;
                    writeln!(out, "storage_class: {}", info.storage_class)?;
                    writeln!(out, "created_at_ms: {}", info.created_at_ms)?;
                }
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
