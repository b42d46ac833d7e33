//! `nova token new`: a fresh random token, and the line that lists it in a server's
//! --auth-tokens file. The line holds the token's SHA-256, never the token: print the token
//! once, hand it to its user, and keep only the line.

use std::io::Write;

use clap::Subcommand;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Format;
use crate::output::json_line;
use crate::report::CliError;

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Make a random token and print it with its --auth-tokens line.
    ///
    /// The token is 32 random bytes from the operating system, in hex. Nothing is sent
    /// anywhere: add the line to the servers' --auth-tokens file (they reload it by
    /// themselves) and give the token to whoever will use it (NOVA_TOKEN).
    New {
        /// The token's name, shown in refusals and logs in its place.
        #[arg(long)]
        name: String,
        /// What it may do: SCOPE:PREFIX, SCOPE one of append, read, admin; an empty prefix
        /// is every stream (read: reads everything). Repeat for several.
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
    },
}

#[derive(Serialize)]
struct NewToken<'a> {
    name: &'a str,
    token: &'a str,
    line: &'a str,
}

fn check_grant(grant: &str) -> Result<(), CliError> {
    let scope = grant.split_once(':').map(|(scope, _)| scope);
    match scope {
        Some("append" | "read" | "admin") if !grant.contains([',', ' ']) => Ok(()),
        _ => Err(CliError::invalid(format!(
            "--grant {grant:?}: give SCOPE:PREFIX, SCOPE one of append, read, admin, the \
             prefix without commas or spaces"
        ))),
    }
}

pub fn run(command: TokenCommand, format: Format) -> anyhow::Result<()> {
    match command {
        TokenCommand::New { name, grants } => {
            if name.is_empty() || name.contains(char::is_whitespace) || name.starts_with('#') {
                return Err(CliError::invalid(format!(
                    "--name {name:?}: a name is one word, not starting with #"
                ))
                .into());
            }
            for grant in &grants {
                check_grant(grant)?;
            }
            let mut secret = [0u8; 32];
            getrandom::fill(&mut secret)
                .map_err(|e| anyhow::anyhow!("the operating system gave no randomness: {e}"))?;
            let token = hex::encode(secret);
            let line = format!(
                "{name} {} sha256:{}",
                grants.join(","),
                hex::encode(Sha256::digest(token.as_bytes()))
            );
            let mut out = std::io::stdout().lock();
            match format {
                Format::Json => json_line(
                    &mut out,
                    &NewToken {
                        name: &name,
                        token: &token,
                        line: &line,
                    },
                )?,
                Format::Text => {
                    writeln!(out, "token: {token}")?;
                    writeln!(out, "line for --auth-tokens:")?;
                    writeln!(out, "{line}")?;
                }
            }
            Ok(())
        }
    }
}
