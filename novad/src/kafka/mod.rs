//! The Kafka listener (`--kafka-listen`): Kafka clients produce to, fetch from and manage
//! topics on the star, through the same admission buffer, caps and read path as gRPC.
//!
//! Each connection is served by `conn`; the requests by `produce`, `fetch`, `offsets` and
//! `topics`. Kafka's formats and the mapping onto streams and records are in the
//! `nova-kafka` crate; what is supported, and what is refused and why, in docs/kafka.md.

mod configs;
mod conn;
mod fetch;
mod group_api;
mod groups;
mod idempotence;
mod offsets;
mod produce;
mod sasl;
mod topics;

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus::IntCounterVec;
use tokio_util::sync::CancellationToken;

use nova_server::net::conn::{ConnLimits, ConnMetrics, Connections, Places};
use nova_server::net::tls::ReloadingTls;

use crate::service::Context;

pub use groups::Coordinator;
pub use idempotence::Producers;

/// The Kafka listener's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct KafkaArgs {
    /// Address a Kafka listener serves on (for example 127.0.0.1:9092); none by default.
    /// Kafka clients produce, fetch and manage topics through it (docs/kafka.md); its
    /// connections count against --max-connections with the gRPC ones.
    #[arg(long, env = "NOVA_KAFKA_LISTEN", help_heading = "Kafka")]
    pub kafka_listen: Option<SocketAddr>,

    /// HOST:PORT Kafka clients are told to reach this star at (in Metadata answers). Default:
    /// --kafka-listen, which must then not be a wildcard address.
    #[arg(long, env = "NOVA_KAFKA_ADVERTISE_ADDR", help_heading = "Kafka")]
    pub kafka_advertise_addr: Option<String>,

    /// Partitions of a topic created because a client asked for its metadata (as Kafka's
    /// auto.create.topics.enable does, with num.partitions); 0 turns that off, so topics are
    /// created only by CreateTopics or `nova create`.
    #[arg(
        long,
        env = "NOVA_KAFKA_AUTO_CREATE_PARTITIONS",
        default_value_t = 1,
        help_heading = "Kafka"
    )]
    pub kafka_auto_create_partitions: u32,
}

impl KafkaArgs {
    /// Where clients reach the listener, as host and port; `Err` says why it cannot be told.
    pub fn advertised(&self) -> Result<Option<(String, i32)>, String> {
        let Some(listen) = self.kafka_listen else {
            return Ok(None);
        };
        let given = match &self.kafka_advertise_addr {
            Some(given) => given.clone(),
            None if listen.ip().is_unspecified() => {
                return Err(format!(
                    "--kafka-listen {listen} is a wildcard address, which Kafka clients cannot \
                     connect to: give --kafka-advertise-addr HOST:PORT"
                ));
            }
            None => listen.to_string(),
        };
        let (host, port) = given
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .filter(|(host, _)| !host.is_empty())
            .ok_or_else(|| format!("--kafka-advertise-addr {given:?} is not HOST:PORT"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Ok(Some((host.to_owned(), i32::from(port))))
    }

    pub fn check(&self) -> Result<(), String> {
        if self.kafka_auto_create_partitions > nova_core::limits::KAFKA_MAX_PARTITIONS {
            return Err(format!(
                "--kafka-auto-create-partitions must be at most {}",
                nova_core::limits::KAFKA_MAX_PARTITIONS
            ));
        }
        self.advertised().map(|_| ())
    }
}

/// The stream holding `partition` of `topic`, when both are ones Kafka allows: a name that
/// is not a topic's (`logs/app`, say) must not reach a stream Kafka clients cannot see.
pub fn partition_stream(
    topic: &str,
    partition: i32,
) -> Result<String, nova_kafka::errors::KafkaRefusal> {
    if nova_kafka::mapping::invalid_topic(topic).is_some() || partition < 0 {
        return Err(nova_kafka::errors::KafkaRefusal::new(
            kafka_protocol::error::ResponseError::UnknownTopicOrPartition,
            format!("no partition {partition} of a topic named {topic:?}"),
        ));
    }
    Ok(nova_kafka::mapping::stream_of(topic, partition))
}

/// Whether `principal` (none: the star checks no tokens) may do `scope` on `stream`; counted
/// and logged as a gRPC call's refusal is.
pub fn allowed(
    kafka: &Kafka,
    principal: Option<&nova_server::net::Principal>,
    scope: nova_server::net::Scope,
    stream: &str,
) -> Result<(), nova_kafka::errors::KafkaRefusal> {
    kafka
        .ctx
        .access
        .check(principal, scope, stream)
        .map_err(|e| nova_kafka::errors::KafkaRefusal::from(&e))
}

/// A star's broker id in Metadata answers: a hash of its star id, so every star of a fleet
/// gives every other the same id without asking (two of a few stars share one with odds of
/// about one in a billion).
pub fn node_id_of(star_id: &str) -> i32 {
    (fnv1a(star_id.as_bytes()) & 0x7fff_ffff) as i32
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A star as Kafka clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

impl Broker {
    /// The broker a fleet member is, when it serves Kafka clients.
    pub fn of(member: &nova_fleet::Member) -> Option<Self> {
        let (host, port) = member.kafka.rsplit_once(':')?;
        Some(Self {
            node_id: node_id_of(&member.id),
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// What every Kafka connection shares.
pub struct Kafka {
    pub ctx: Arc<Context>,
    /// This star's broker id in Metadata answers.
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub auto_create_partitions: u32,
    /// The largest produce request read (the gRPC message limit).
    pub max_produce_bytes: u64,
    pub metrics: KafkaMetrics,
    /// Idempotent producers' recent batches, per partition.
    pub producers: idempotence::Producers,
    /// The consumer groups this star coordinates.
    pub groups: groups::Coordinator,
    /// `--auth-tokens`: when given, clients authenticate with SASL/PLAIN first.
    pub tokens: Option<nova_server::net::Tokens>,
    /// Each token's share of the admission buffer while its requests arrive
    /// (`--max-client-share-percent`), shared with gRPC appends.
    pub receiving: std::sync::Arc<nova_server::net::shares::Shares>,
}

impl Kafka {
    /// This star as a broker.
    pub fn me(&self) -> Broker {
        Broker {
            node_id: self.node_id,
            host: self.host.clone(),
            port: self.port,
        }
    }

    /// Every star serving Kafka clients: this one alone, or in a fleet every registered star
    /// with a Kafka listener.
    pub fn brokers(&self) -> Vec<Broker> {
        let Some(fleet) = &self.ctx.fleet else {
            return vec![self.me()];
        };
        fleet.stars().iter().filter_map(Broker::of).collect()
    }

    /// The star coordinating `group`: in a fleet, of the stars serving Kafka clients and open
    /// to work (not starting, not draining) as their registrations were last read (this
    /// star's too, as published, so every star decides from the same view a refresh apart),
    /// the one whose hash with the group is highest; a departed star's groups spread over the
    /// rest. `None` while no star qualifies.
    pub fn coordinator(&self, group: &str) -> Option<Broker> {
        match &self.ctx.fleet {
            None => Some(self.me()),
            Some(fleet) => coordinator_among(&fleet.stars_as_read(), group).map(|(_, b)| b),
        }
    }

    /// The fleet member coordinating `group` (`None` on a single star, or while none does).
    pub fn coordinating_star(&self, group: &str) -> Option<nova_fleet::Member> {
        let fleet = self.ctx.fleet.as_ref()?;
        coordinator_among(&fleet.stars_as_read(), group).map(|(m, _)| m)
    }

    /// `Err(NOT_COORDINATOR)` when another star coordinates `group` (the client asks
    /// FindCoordinator again), `Err(COORDINATOR_NOT_AVAILABLE)` while none does.
    pub fn coordinates(&self, group: &str) -> Result<(), kafka_protocol::error::ResponseError> {
        let Some(fleet) = &self.ctx.fleet else {
            return Ok(());
        };
        self.coordinates_among(&fleet.stars_as_read(), group)
    }

    fn coordinates_among(
        &self,
        stars: &[nova_fleet::Member],
        group: &str,
    ) -> Result<(), kafka_protocol::error::ResponseError> {
        use kafka_protocol::error::ResponseError;
        match coordinator_among(stars, group).map(|(_, b)| b) {
            Some(broker) if broker.node_id == self.node_id => Ok(()),
            Some(_) => Err(ResponseError::NotCoordinator),
            None => Err(ResponseError::CoordinatorNotAvailable),
        }
    }
}

impl crate::service::groups::KafkaGroups for Kafka {
    fn groups(&self) -> Vec<(String, String, u32)> {
        self.groups
            .list()
            .into_iter()
            .map(|(group, state, _)| {
                let members = self
                    .groups
                    .describe(&group)
                    .map_or(0, |(_, _, _, members)| members.len() as u32);
                (group, state.name().to_owned(), members)
            })
            .collect()
    }

    fn coordinator(&self, group: &str) -> crate::service::groups::Coordinated {
        use crate::service::groups::Coordinated;
        if self.ctx.fleet.is_none() {
            return Coordinated::Here;
        }
        match self.coordinating_star(group) {
            Some(star) if node_id_of(&star.id) == self.node_id => Coordinated::Here,
            Some(star) => Coordinated::Elsewhere {
                id: star.id,
                addr: star.advertise,
            },
            None => Coordinated::Nowhere,
        }
    }

    fn members(&self, group: &str) -> Option<(String, Vec<nova_proto::v1::GroupMember>)> {
        let (state, _, _, members) = self.groups.describe(group)?;
        Some((
            state.name().to_owned(),
            members
                .into_iter()
                .map(|m| nova_proto::v1::GroupMember {
                    member_id: m.member_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                })
                .collect(),
        ))
    }
}

/// Of `stars`, the coordinator of `group` (see `Kafka::coordinator`).
fn coordinator_among(
    stars: &[nova_fleet::Member],
    group: &str,
) -> Option<(nova_fleet::Member, Broker)> {
    let score = |id: &str| {
        let mut key = Vec::with_capacity(id.len() + group.len() + 1);
        key.extend_from_slice(id.as_bytes());
        key.push(0);
        key.extend_from_slice(group.as_bytes());
        fnv1a(&key)
    };
    stars
        .iter()
        .filter(|m| !m.starting && !m.draining)
        .filter_map(|m| Some((score(&m.id), m, Broker::of(m)?)))
        .max_by_key(|(score, _, broker)| (*score, broker.node_id))
        .map(|(_, member, broker)| (member.clone(), broker))
}

/// The listener's own series, beside the star's (sheds and refusals count there too).
#[derive(Clone)]
pub struct KafkaMetrics {
    /// Requests by API.
    pub requests: IntCounterVec,
    /// Error codes answered, by API and Kafka error name.
    pub errors: IntCounterVec,
    /// Connections closed by the listener for what they sent, by reason.
    pub closed: IntCounterVec,
    /// Records each group with members has yet to consume: the partitions' tails less the
    /// group's committed offsets, summed (refreshed every `LAG_EVERY`).
    pub group_lag: prometheus::IntGaugeVec,
    /// Groups with members.
    pub groups: prometheus::IntGauge,
}

impl KafkaMetrics {
    /// Counts one error code answered by `api`.
    pub fn answered(&self, api: &str, error: kafka_protocol::error::ResponseError) {
        self.errors
            .with_label_values(&[api, error.to_string().as_str()])
            .inc();
    }

    pub fn register(registry: &prometheus::Registry) -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let counter = IntCounterVec::new(prometheus::Opts::new(name, help), labels)?;
            registry.register(Box::new(counter.clone()))?;
            Ok::<_, prometheus::Error>(counter)
        };
        Ok(Self {
            requests: counter(
                "nova_kafka_requests_total",
                "Kafka requests served, by API.",
                &["api"],
            )?,
            errors: counter(
                "nova_kafka_errors_total",
                "Kafka error codes answered (one per partition or topic refused), by API and \
                 error.",
                &["api", "error"],
            )?,
            closed: counter(
                "nova_kafka_connections_closed_total",
                "Kafka connections closed for what they sent (an oversize or unreadable \
                 request, an unknown API), by reason.",
                &["reason"],
            )?,
            group_lag: {
                let gauge = prometheus::IntGaugeVec::new(
                    prometheus::Opts::new(
                        "nova_kafka_group_lag_records",
                        "Records a Kafka consumer group with members has yet to consume, over \
                         the partitions it committed offsets for.",
                    ),
                    &["group"],
                )?;
                registry.register(Box::new(gauge.clone()))?;
                gauge
            },
            groups: {
                let gauge = prometheus::IntGauge::new(
                    "nova_kafka_groups",
                    "Kafka consumer groups with members.",
                )?;
                registry.register(Box::new(gauge.clone()))?;
                gauge
            },
        })
    }
}

/// Everything the listener needs from the gRPC side's set-up.
pub struct Listening {
    pub tls: Option<ReloadingTls>,
    pub limits: ConnLimits,
    pub places: Places,
    pub connections: Arc<Connections>,
    pub metrics: ConnMetrics,
}

/// Serves Kafka clients on `listener` until `stopping`: one task per connection, each holding
/// one of the `--max-connections` places.
pub async fn serve(
    kafka: Arc<Kafka>,
    listener: tokio::net::TcpListener,
    listening: Listening,
    stopping: CancellationToken,
) {
    use futures::StreamExt;
    let mut incoming = std::pin::pin!(nova_server::net::conn::incoming_within(
        listener,
        listening.tls,
        listening.limits,
        listening.places,
        listening.connections,
        listening.metrics,
        stopping.clone(),
    ));
    // Group members' sessions and rebalances' deadlines, twice a second.
    let ticking = {
        let kafka = kafka.clone();
        let stopping = stopping.clone();
        async move {
            let mut ticker = tokio::time::interval(std::time::Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        kafka.groups.tick();
                        // Groups another star coordinates now (the fleet changed): their
                        // members hear NOT_COORDINATOR and find the new one.
                        // Not while no star qualifies (a fleet starting up): every group would
                        // be dropped, to come back once one does.
                        if let Some(fleet) = &kafka.ctx.fleet
                            && let stars = fleet.stars_as_read()
                            && stars.iter().any(|m| {
                                !m.starting && !m.draining && Broker::of(m).is_some()
                            })
                        {
                            kafka
                                .groups
                                .forget_where(|group| kafka.coordinates_among(&stars, group).is_err());
                        }
                    }
                    _ = stopping.cancelled() => return,
                }
            }
        }
    };
    // Each group's lag, every LAG_EVERY: one metastore scan per group with members (at most
    // KAFKA_MAX_GROUPS series).
    let lagging = {
        let kafka = kafka.clone();
        let stopping = stopping.clone();
        async move {
            let mut ticker = tokio::time::interval(LAG_EVERY);
            let mut shown: Vec<String> = Vec::new();
            loop {
                tokio::select! {
                    _ = ticker.tick() => shown = refresh_lag(&kafka, shown).await,
                    _ = stopping.cancelled() => return,
                }
            }
        }
    };
    let accepting = async {
        while let Some(conn) = incoming.next().await {
            let Ok(conn) = conn else { continue };
            tokio::spawn(conn::serve(kafka.clone(), conn));
        }
    };
    tokio::join!(ticking, lagging, accepting);
}

/// How often groups' lag is computed.
const LAG_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

/// Sets each group's lag; forgets the series of groups gone since `shown`.
async fn refresh_lag(kafka: &Kafka, shown: Vec<String>) -> Vec<String> {
    let groups = kafka.groups.list();
    kafka.metrics.groups.set(groups.len() as i64);
    let mut now = Vec::with_capacity(groups.len());
    for (group, _, _) in groups {
        let Ok(committed) = kafka
            .ctx
            .star
            .streams()
            .catalog()
            .committed_offsets(&group)
            .await
        else {
            continue;
        };
        let Ok(tails) =
            crate::service::groups::tails(&kafka.ctx, committed.iter().map(|c| c.stream.as_str()))
                .await
        else {
            continue;
        };
        let lag: u64 = committed
            .iter()
            .filter_map(|c| {
                let tail = tails.get(&c.stream)?;
                Some(tail.saturating_sub(u64::try_from(c.offset).unwrap_or(0)))
            })
            .sum();
        kafka
            .metrics
            .group_lag
            .with_label_values(&[group.as_str()])
            .set(lag.min(i64::MAX as u64) as i64);
        now.push(group);
    }
    let current: std::collections::HashSet<&String> = now.iter().collect();
    for gone in shown.iter().filter(|g| !current.contains(g)) {
        let _ = kafka
            .metrics
            .group_lag
            .remove_label_values(&[gone.as_str()]);
    }
    now
}
