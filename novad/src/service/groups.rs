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

/// Groups span streams: seeing them takes an operator's token (as Kafka's ListGroups does).
fn may_see_groups(principal: Option<&Principal>) -> Result<(), RequestError> {
    match principal {
        Some(p) if !p.has(Scope::Admin) => Err(RequestError::PermissionDenied(format!(
            "token {:?} may not see consumer groups: that takes the admin scope",
            p.name
        ))),
        _ => Ok(()),
    }
}

fn kafka(ctx: &Context) -> Option<std::sync::Arc<crate::kafka::Kafka>> {
    ctx.kafka.get().and_then(std::sync::Weak::upgrade)
}

pub async fn list(
    ctx: &Context,
    principal: Option<&Principal>,
    request: v1::ListGroupsRequest,
) -> Result<v1::ListGroupsResponse, RequestError> {
    may_see_groups(principal)?;
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
    let mut groups: BTreeMap<String, v1::GroupSummary> = committed
        .into_iter()
        .map(|group| {
            let summary = v1::GroupSummary {
                group: group.clone(),
                ..Default::default()
            };
            (group, summary)
        })
        .collect();
    if let Some(kafka) = kafka(ctx) {
        for (group, state, _) in kafka.groups.list() {
            if after.is_some_and(|after| group.as_str() <= after) {
                continue;
            }
            let members = kafka
                .groups
                .describe(&group)
                .map_or(0, |(_, _, _, members)| members.len() as u32);
            groups.insert(
                group.clone(),
                v1::GroupSummary {
                    group,
                    state: state.name().to_owned(),
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
    may_see_groups(principal)?;
    let group = request.group;
    let committed = ctx
        .star
        .streams()
        .catalog()
        .committed_offsets(&group)
        .await?;
    let tails = crate::kafka::tails(ctx, committed.iter().map(|c| c.stream.as_str())).await?;
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
    match kafka.coordinating_star(&described.group) {
        Some(star) => {
            described.coordinated_here = kafka.coordinates(&described.group).is_ok();
            described.coordinator_id = star.id;
            described.coordinator_addr = star.advertise;
        }
        None if ctx.fleet.is_none() => {
            described.coordinated_here = true;
            described.coordinator_id = ctx.star.config().star.clone();
        }
        None => {}
    }
    if described.coordinated_here {
        match kafka.groups.describe(&described.group) {
            Some((state, _, _, members)) => {
                described.state = state.name().to_owned();
                described.members = members
                    .into_iter()
                    .map(|m| v1::GroupMember {
                        member_id: m.member_id,
                        client_id: m.client_id,
                        client_host: m.client_host,
                    })
                    .collect();
            }
            None => described.state = "Dead".to_owned(),
        }
    }
    Ok(described)
}
