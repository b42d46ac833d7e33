//! `GetServerInfo` on a star: what `nova status` prints, and the limits the CLI sizes its
//! batches by. Everything comes from state the star keeps anyway (the readiness and saturation
//! gauges, the stream registry), so an answer costs no I/O.

use nova_proto::v1;

use super::Context;

/// What a star says about itself that does not change while it runs.
#[derive(Debug, Clone)]
pub struct Identity {
    pub version: &'static str,
    pub started_at_ms: u64,
    /// The object store, as it describes itself.
    pub store: String,
    /// The largest gRPC message the star decodes.
    pub max_message_bytes: u64,
}

pub fn server_info(ctx: &Context) -> v1::GetServerInfoResponse {
    let star = &ctx.star;
    let metrics = &ctx.metrics;
    let fenced = star.fenced();
    let ready = metrics.ready.get() == 1;
    let not_ready_reason = match (&fenced, ready) {
        (Some(reason), _) => format!("fenced: {reason}"),
        (None, false) => match star.store_failing_for() {
            Some(failing) => format!(
                "the object store has failed flight writes for {} s",
                failing.as_secs()
            ),
            None => "shutting down".to_owned(),
        },
        (None, true) => String::new(),
    };
    v1::GetServerInfoResponse {
        version: ctx.identity.version.to_owned(),
        role: "star".to_owned(),
        id: star.config().star.clone(),
        ready,
        not_ready_reason,
        fenced: fenced.is_some(),
        epoch: star.epoch(),
        memory_saturation: metrics.memory.saturation.get(),
        saturated: metrics.memory.saturated.get() == 1,
        streams: match &ctx.fleet {
            Some(fleet) => fleet.streams_led() as u64,
            None => star.streams().len() as u64,
        },
        // At least itself: 0 would read as "no fleet".
        fleet_stars: ctx
            .fleet
            .as_ref()
            .map_or(0, |f| f.stars_seen().max(1) as u32),
        advertise: ctx
            .fleet
            .as_ref()
            .map_or_else(String::new, |f| f.advertise().to_owned()),
        started_at_ms: ctx.identity.started_at_ms,
        limits: Some(v1::ServerLimits {
            max_batch_bytes: ctx.caps.max_batch_bytes,
            max_batch_records: ctx.caps.max_batch_records,
            max_record_bytes: ctx.caps.max_record_bytes,
            max_read_bytes: ctx.max_read_bytes,
            max_read_records: ctx.max_read_records,
            max_message_bytes: ctx.identity.max_message_bytes,
        }),
        store: ctx.identity.store.clone(),
        star: String::new(),
    }
}
