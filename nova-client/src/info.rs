//! What a server says about itself (`GetServerInfo`): its build, its state, and the limits a
//! client must stay within.

use std::time::Duration;

use nova_proto::v1;

/// A star or a gateway, as it describes itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    pub version: String,
    pub role: ServerRole,
    /// A star's `--star-id`; a gateway's advertised URL.
    pub id: String,
    pub ready: bool,
    /// Why it is not ready; empty when it is.
    pub not_ready_reason: String,
    pub fenced: bool,
    pub epoch: u64,
    /// The star's memory formula over its ceiling.
    pub memory_saturation: f64,
    pub saturated: bool,
    pub streams: u64,
    pub started_at_ms: u64,
    pub limits: ServerLimits,
    /// Where it keeps (a star) or reads (a gateway) records.
    pub store: String,
    /// A gateway's star.
    pub star: String,
    /// A star in a fleet: the fleet as it sees it. `None` on a single star (and a gateway).
    pub fleet: Option<FleetView>,
}

/// A fleet star's view of its fleet. The star's `streams` are then the ones it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetView {
    /// Stars registered, this one included.
    pub stars: u32,
    /// The URL redirects to this star carry.
    pub advertise: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRole {
    Star,
    Gateway,
    /// A role this SDK does not know (a newer server).
    Other,
}

impl ServerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerRole::Star => "star",
            ServerRole::Gateway => "gateway",
            ServerRole::Other => "other",
        }
    }
}

/// What one append and one read may hold. A limit of `None` is one the server did not state
/// (a gateway takes no appends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerLimits {
    pub max_batch_bytes: Option<u64>,
    pub max_batch_records: Option<u32>,
    pub max_record_bytes: Option<u64>,
    pub max_read_bytes: Option<u64>,
    pub max_read_records: Option<u32>,
    pub max_message_bytes: Option<u64>,
}

impl ServerLimits {
    /// The limits a star has with every flag at its default: what a client assumes of a
    /// server too old to say.
    pub fn star_defaults() -> Self {
        Self {
            max_batch_bytes: Some(100 << 20),
            max_batch_records: Some(65_536),
            max_record_bytes: Some(1 << 20),
            max_read_bytes: Some(8 << 20),
            max_read_records: Some(8192),
            max_message_bytes: None,
        }
    }
}

fn stated<T: PartialEq + Default>(value: T) -> Option<T> {
    (value != T::default()).then_some(value)
}

impl From<v1::ServerLimits> for ServerLimits {
    fn from(limits: v1::ServerLimits) -> Self {
        Self {
            max_batch_bytes: stated(limits.max_batch_bytes),
            max_batch_records: stated(limits.max_batch_records),
            max_record_bytes: stated(limits.max_record_bytes),
            max_read_bytes: stated(limits.max_read_bytes),
            max_read_records: stated(limits.max_read_records),
            max_message_bytes: stated(limits.max_message_bytes),
        }
    }
}

impl From<v1::GetServerInfoResponse> for ServerInfo {
    fn from(info: v1::GetServerInfoResponse) -> Self {
        Self {
            version: info.version,
            role: match info.role.as_str() {
                "star" => ServerRole::Star,
                "gateway" => ServerRole::Gateway,
                _ => ServerRole::Other,
            },
            id: info.id,
            ready: info.ready,
            not_ready_reason: info.not_ready_reason,
            fenced: info.fenced,
            epoch: info.epoch,
            memory_saturation: info.memory_saturation,
            saturated: info.saturated,
            streams: info.streams,
            started_at_ms: info.started_at_ms,
            limits: info.limits.map(Into::into).unwrap_or_default(),
            store: info.store,
            star: info.star,
            fleet: (info.fleet_stars > 0).then_some(FleetView {
                stars: info.fleet_stars,
                advertise: info.advertise,
            }),
        }
    }
}

impl ServerInfo {
    /// How long the server has run, as of `now_ms` (unix ms).
    pub fn uptime(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.started_at_ms))
    }
}
