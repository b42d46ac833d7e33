//! `nova status` (also `nova ping`): is the server there, what is it, and how is it doing.

use std::io::Write;
use std::time::Instant;

use serde::Serialize;

use nova_client::{Client, ServerInfo, ServerRole};
use nova_proto::units::human_bytes;

use crate::Format;
use crate::output::json_line;
use crate::report::{CliError, looks_like_http1};
use crate::when::{format_duration, format_time, now_ms};

#[derive(Serialize)]
struct StatusJson<'a> {
    server: &'a str,
    round_trip_ms: f64,
    version: &'a str,
    role: &'a str,
    id: &'a str,
    ready: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    not_ready_reason: &'a str,
    fenced: bool,
    epoch: u64,
    memory_saturation: f64,
    saturated: bool,
    streams: u64,
    started_at_ms: u64,
    started_at: String,
    store: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    star: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet: Option<FleetJson<'a>>,
    limits: LimitsJson,
}

/// A fleet star's view of its fleet; `streams` above are then the streams it leads.
#[derive(Serialize)]
struct FleetJson<'a> {
    stars: u32,
    advertise: &'a str,
}

#[derive(Serialize)]
struct LimitsJson {
    max_batch_bytes: Option<u64>,
    max_batch_records: Option<u32>,
    max_record_bytes: Option<u64>,
    max_read_bytes: Option<u64>,
    max_read_records: Option<u32>,
}

pub async fn run(client: &Client, server: &str, format: Format) -> anyhow::Result<()> {
    let asked = Instant::now();
    let info = match client.server_info().await {
        Ok(info) => info,
        // A plain HTTP server (the metrics port) answers 404, which gRPC reads as
        // UNIMPLEMENTED: that is no old server, and the usual hint says what it is.
        Err(error)
            if error.code() == Some(tonic::Code::Unimplemented)
                && !looks_like_http1(&error.to_string()) =>
        {
            return Err(CliError {
                code: "UNIMPLEMENTED",
                message: format!("{server} answers, but is too old to report its status"),
                hint: Some("upgrade it to a novad or novagateway of this version".into()),
            }
            .into());
        }
        Err(error) => return Err(error.into()),
    };
    let round_trip = asked.elapsed();
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => json_line(&mut out, &json(server, &info, round_trip))?,
        Format::Text => text(&mut out, server, &info, round_trip)?,
    }
    Ok(())
}

fn json<'a>(
    server: &'a str,
    info: &'a ServerInfo,
    round_trip: std::time::Duration,
) -> StatusJson<'a> {
    StatusJson {
        server,
        round_trip_ms: round_trip.as_secs_f64() * 1000.0,
        version: &info.version,
        role: info.role.as_str(),
        id: &info.id,
        ready: info.ready,
        not_ready_reason: &info.not_ready_reason,
        fenced: info.fenced,
        epoch: info.epoch,
        memory_saturation: info.memory_saturation,
        saturated: info.saturated,
        streams: info.streams,
        started_at_ms: info.started_at_ms,
        started_at: format_time(info.started_at_ms),
        store: &info.store,
        star: &info.star,
        fleet: info.fleet.as_ref().map(|fleet| FleetJson {
            stars: fleet.stars,
            advertise: &fleet.advertise,
        }),
        limits: LimitsJson {
            max_batch_bytes: info.limits.max_batch_bytes,
            max_batch_records: info.limits.max_batch_records,
            max_record_bytes: info.limits.max_record_bytes,
            max_read_bytes: info.limits.max_read_bytes,
            max_read_records: info.limits.max_read_records,
        },
    }
}

fn text(
    out: &mut impl Write,
    server: &str,
    info: &ServerInfo,
    round_trip: std::time::Duration,
) -> anyhow::Result<()> {
    let ready = if info.ready {
        "yes".to_owned()
    } else {
        format!("NO: {}", info.not_ready_reason)
    };
    writeln!(
        out,
        "{server}: {} {} (version {}), answered in {:.1} ms",
        info.role.as_str(),
        info.id,
        info.version,
        round_trip.as_secs_f64() * 1000.0
    )?;
    writeln!(out, "ready:      {ready}")?;
    writeln!(
        out,
        "up since:   {} ({})",
        format_time(info.started_at_ms),
        format_duration(info.uptime(now_ms()))
    )?;
    match info.role {
        ServerRole::Star => {
            if info.fenced {
                writeln!(
                    out,
                    "fenced:     yes: another star took this one's chain; it acknowledges nothing more"
                )?;
            }
            writeln!(out, "epoch:      {}", info.epoch)?;
            writeln!(
                out,
                "memory:     {:.0}% of the ceiling{}",
                info.memory_saturation * 100.0,
                if info.saturated {
                    " (saturated: takes no new leadership)"
                } else {
                    ""
                }
            )?;
            match &info.fleet {
                Some(fleet) => {
                    writeln!(
                        out,
                        "fleet:      {} star{}, this one reached at {}",
                        fleet.stars,
                        if fleet.stars == 1 { "" } else { "s" },
                        fleet.advertise
                    )?;
                    writeln!(out, "streams:    {} led here", info.streams)?;
                }
                None => writeln!(out, "streams:    {}", info.streams)?,
            }
        }
        ServerRole::Gateway | ServerRole::Other => {
            if !info.star.is_empty() {
                writeln!(out, "star:       {}", info.star)?;
            }
        }
    }
    writeln!(out, "store:      {}", info.store)?;
    // Only the limits the server has (a gateway takes no appends, so it has no append limits).
    let limits = &info.limits;
    let either = |what: &str, bytes: Option<u64>, records: Option<u32>| match (bytes, records) {
        (Some(b), Some(n)) => Some(format!("{what} {} or {n} records", human_bytes(b))),
        (Some(b), None) => Some(format!("{what} {}", human_bytes(b))),
        (None, Some(n)) => Some(format!("{what} {n} records")),
        (None, None) => None,
    };
    let known: Vec<String> = [
        limits
            .max_record_bytes
            .map(|r| format!("record {}", human_bytes(r))),
        either("batch", limits.max_batch_bytes, limits.max_batch_records),
        either("read", limits.max_read_bytes, limits.max_read_records),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !known.is_empty() {
        writeln!(out, "limits:     {}", known.join(", "))?;
    }
    Ok(())
}
