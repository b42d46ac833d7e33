//! `ListGroups` and `DescribeGroup` (`nova group`): the Kafka consumer groups with committed
//! offsets (kept in the catalog, so any star of a fleet lists them) or with members (known to
//! the star coordinating the group), and one group's offsets, lag and members.

use std::collections::BTreeMap;

use nova_proto::RequestError;
use nova_proto::v1;
use nova_server::net::{Principal, Scope};

use super::Context;

const LIST_GROUPS_DEFAULT: u32 = 100;
const LIST_GROUPS_MAX: u32 = 1000;

/// Groups span streams, any of them: seeing them takes the admin scope over every stream.
fn may_see_groups(ctx: &Context, principal: Option<&Principal>) -> Result<(), RequestError> {
    ctx.access.check(principal, Scope::Admin, "")
}

/// The order groups are listed in: the catalog keeps committed offsets by the group name's
/// length first, then the name.
fn listing_order(group: &str) -> (usize, &str) {
    (group.len(), group)
}

/// What the Kafka listener (`--kafka-listen`) tells of the groups it coordinates.
pub trait KafkaGroups: Send + Sync {
    /// The groups with members here: name, state, member count.
    fn groups(&self) -> Vec<(String, String, u32)>;
    /// Which star coordinates `group`.
    fn coordinator(&self, group: &str) -> Coordinated;
    /// `group`'s state and members here, if it has any.
    fn members(&self, group: &str) -> Option<(String, Vec<v1::GroupMember>)>;
}

/// Where a group is coordinated.
pub enum Coordinated {
    Here,
    Elsewhere {
        id: String,
        addr: String,
    },
    /// No star of the fleet serving Kafka clients is open to work.
    Nowhere,
}

fn kafka(ctx: &Context) -> Option<std::sync::Arc<dyn KafkaGroups>> {
    ctx.kafka.get().and_then(std::sync::Weak::upgrade)
}

pub async fn list(
    ctx: &Context,
    principal: Option<&Principal>,
    request: v1::ListGroupsRequest,
) -> Result<v1::ListGroupsResponse, RequestError> {
    may_see_groups(ctx, principal)?;
    let limit = match request.limit {
        0 => LIST_GROUPS_DEFAULT,
        n => n.min(LIST_GROUPS_MAX),
    } as usize;
    let after = (!request.start_after.is_empty()).then_some(request.start_after.as_str());
    // One more than a page tells whether another follows.
    let committed = ctx
        .star
        .streams()
        .catalog()
        .offset_groups(after, limit + 1)
        .await?;
    let mut groups: BTreeMap<(usize, String), v1::GroupSummary> = committed
        .into_iter()
        .map(|group| {
            let summary = v1::GroupSummary {
                group: group.clone(),
                ..Default::default()
            };
            ((group.len(), group), summary)
        })
        .collect();
    if let Some(kafka) = kafka(ctx) {
        for (group, state, members) in kafka.groups() {
            if after.is_some_and(|after| listing_order(&group) <= listing_order(after)) {
                continue;
            }
            groups.insert(
                (group.len(), group.clone()),
                v1::GroupSummary {
                    group,
                    state,
                    members,
                },
            );
        }
    }
    let more = groups.len() > limit;
    let groups: Vec<v1::GroupSummary> = groups.into_values().take(limit).collect();
    let next_start_after = match (more, groups.last()) {
        (true, Some(last)) => last.group.clone(),
        _ => String::new(),
    };
    Ok(v1::ListGroupsResponse {
        groups,
        next_start_after,
    })
}

pub async fn describe(
    ctx: &Context,
    principal: Option<&Principal>,
    request: v1::DescribeGroupRequest,
) -> Result<v1::DescribeGroupResponse, RequestError> {
    may_see_groups(ctx, principal)?;
    let group = request.group;
    let committed = ctx
        .star
        .streams()
        .catalog()
        .committed_offsets(&group)
        .await?;
    let tails = tails(ctx, committed.iter().map(|c| c.stream.as_str())).await?;
    let offsets = committed
        .into_iter()
        .map(|c| {
            let tail_seq = tails.get(&c.stream).copied().unwrap_or(0);
            v1::GroupOffset {
                lag: tail_seq.saturating_sub(u64::try_from(c.offset).unwrap_or(0)),
                tail_seq,
                committed: c.offset,
                committed_at_ms: c.committed_at_ms,
                metadata: c.metadata,
                stream: c.stream,
            }
        })
        .collect();
    let mut described = v1::DescribeGroupResponse {
        group,
        offsets,
        ..Default::default()
    };
    let Some(kafka) = kafka(ctx) else {
        // No Kafka listener here: the offsets are all there is to tell.
        return Ok(described);
    };
    match kafka.coordinator(&described.group) {
        Coordinated::Here => {
            described.coordinated_here = true;
            described.coordinator_id = ctx.star.config().star.clone();
            (described.state, described.members) = kafka
                .members(&described.group)
                .unwrap_or_else(|| ("Dead".to_owned(), Vec::new()));
        }
        Coordinated::Elsewhere { id, addr } => {
            described.coordinator_id = id;
            described.coordinator_addr = addr;
        }
        Coordinated::Nowhere => {}
    }
    Ok(described)
}

/// The Kafka partitions' streams `names` names: those this star has, and in a fleet the
/// others' as the catalog has them, read a topic at a time. Streams that do not exist are in
/// neither.
pub struct Partitions {
    pub here: Vec<std::sync::Arc<nova_chain::streams::StreamState>>,
    pub elsewhere: Vec<nova_core::catalog::StreamMeta>,
}

pub async fn partitions<'a>(
    ctx: &Context,
    names: impl Iterator<Item = &'a str>,
) -> Result<Partitions, nova_core::catalog::CatalogError> {
    let streams = ctx.star.streams();
    let mut here = Vec::new();
    let mut topics = std::collections::BTreeSet::new();
    let mut wanted = std::collections::HashSet::new();
    for name in names {
        match streams.get(name) {
            Some(state) => here.push(state),
            None => {
                if let Some((topic, _)) = nova_kafka::mapping::topic_of(name) {
                    topics.insert(topic.to_owned());
                    wanted.insert(name.to_owned());
                }
            }
        }
    }
    let mut elsewhere = Vec::new();
    if ctx.fleet.is_some() {
        for topic in topics {
            let metas = streams
                .catalog()
                .streams_with_prefix(
                    &format!("{topic}/"),
                    "",
                    nova_core::limits::KAFKA_MAX_PARTITIONS as usize + 1,
                )
                .await?;
            elsewhere.extend(metas.into_iter().filter(|m| wanted.contains(&m.name)));
        }
    }
    Ok(Partitions { here, elsewhere })
}

/// The tails of `names`: this star's streams' as they are, the others' as absorbed.
pub async fn tails<'a>(
    ctx: &Context,
    names: impl Iterator<Item = &'a str>,
) -> Result<std::collections::HashMap<String, u64>, nova_core::catalog::CatalogError> {
    let Partitions { here, elsewhere } = partitions(ctx, names).await?;
    let mut tails: std::collections::HashMap<String, u64> = here
        .iter()
        .map(|state| (state.name().to_owned(), state.tail()))
        .collect();
    let ids: Vec<u64> = elsewhere.iter().map(|m| m.id).collect();
    let absorbed = ctx.star.streams().catalog().stream_tails(&ids).await?;
    for (meta, tail) in elsewhere.into_iter().zip(absorbed) {
        tails.insert(meta.name, tail.tail_seq);
    }
    Ok(tails)
}
