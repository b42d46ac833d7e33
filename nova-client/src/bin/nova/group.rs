//! `nova group`: the Kafka consumer groups a star knows, their committed offsets and lag.

use std::io::Write;

use clap::Subcommand;
use serde_json::json;

use nova_client::{Client, GroupDescription};

use crate::Format;
use crate::output::json_line;
use crate::when::format_time;

#[derive(Subcommand)]
pub enum GroupCommand {
    /// List the Kafka consumer groups with committed offsets or members: each one's state and
    /// member count, as the star asked coordinates it (blank where another star does).
    List,
    /// Show a Kafka consumer group: its state and members (from the star coordinating it),
    /// and for each partition's stream the committed offset, the tail and the lag.
    Describe {
        /// The group id Kafka clients use.
        group: String,
    },
}

pub async fn run(client: &Client, command: GroupCommand, format: Format) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        GroupCommand::List => {
            let mut after = String::new();
            loop {
                let (groups, next) = client.list_groups(&after, 1000).await?;
                for g in &groups {
                    match format {
                        Format::Text => {
                            let state = if g.state.is_empty() { "-" } else { &g.state };
                            writeln!(out, "{}\tstate={state}\tmembers={}", g.group, g.members)?
                        }
                        Format::Json => json_line(
                            &mut out,
                            &json!({"group": g.group, "state": g.state, "members": g.members}),
                        )?,
                    }
                }
                match next {
                    Some(next) => after = next,
                    None => break,
                }
            }
        }
        GroupCommand::Describe { group } => {
            let described = client.describe_group(&group).await?;
            match format {
                Format::Text => describe(&mut out, &described)?,
                Format::Json => json_line(&mut out, &as_json(&described))?,
            }
        }
    }
    Ok(())
}

fn describe(out: &mut impl Write, g: &GroupDescription) -> anyhow::Result<()> {
    writeln!(out, "group:        {}", g.group)?;
    if g.coordinated_here {
        writeln!(out, "state:        {}", g.state)?;
    } else if g.coordinator_id.is_empty() {
        writeln!(
            out,
            "state:        not known here (this star serves no Kafka clients, or none of the \
             fleet's does yet)"
        )?;
    } else {
        writeln!(
            out,
            "coordinator:  {} ({}): ask it for the group's state and members",
            g.coordinator_id, g.coordinator_addr
        )?;
    }
    writeln!(out, "lag:          {} records", g.lag())?;
    if g.coordinated_here {
        writeln!(out, "members:      {}", g.members.len())?;
        for m in &g.members {
            writeln!(
                out,
                "  {}\tclient={}\thost={}",
                m.member_id, m.client_id, m.client_host
            )?;
        }
    }
    if g.offsets.is_empty() {
        writeln!(out, "offsets:      none committed")?;
        return Ok(());
    }
    writeln!(out, "offsets:")?;
    writeln!(out, "  STREAM\tCOMMITTED\tTAIL\tLAG\tCOMMITTED AT")?;
    for o in &g.offsets {
        writeln!(
            out,
            "  {}\t{}\t{}\t{}\t{}",
            o.stream,
            o.committed,
            o.tail_seq,
            o.lag,
            format_time(o.committed_at_ms)
        )?;
    }
    Ok(())
}

fn as_json(g: &GroupDescription) -> serde_json::Value {
    json!({
        "group": g.group,
        "state": g.state,
        "coordinator_id": g.coordinator_id,
        "coordinator_addr": g.coordinator_addr,
        "coordinated_here": g.coordinated_here,
        "lag": g.lag(),
        "members": g.members.iter().map(|m| json!({
            "member_id": m.member_id,
            "client_id": m.client_id,
            "client_host": m.client_host,
        })).collect::<Vec<_>>(),
        "offsets": g.offsets.iter().map(|o| json!({
            "stream": o.stream,
            "committed": o.committed,
            "committed_at_ms": o.committed_at_ms,
            "tail_seq": o.tail_seq,
            "lag": o.lag,
            "metadata": o.metadata,
        })).collect::<Vec<_>>(),
    })
}
