//! The consumer-group requests, as Kafka messages, onto the coordinator (`groups`) and the
//! catalog's committed offsets.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    ResponseKind, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use nova_core::catalog::CommittedOffset;
use nova_kafka::mapping::topic_of;

use nova_server::net::{Principal, Scope};

use super::Kafka;
use super::groups::{Join, State};

fn text(value: impl Into<String>) -> StrBytes {
    StrBytes::from_string(value.into())
}

/// The longest group id served.
const MAX_GROUP_ID: usize = 1024;

fn valid_group(group: &str) -> Result<(), ResponseError> {
    if group.is_empty() || group.len() > MAX_GROUP_ID {
        return Err(ResponseError::InvalidGroupId);
    }
    Ok(())
}

/// The name a member's token gives it ("" when the star checks no tokens).
fn owner(principal: Option<&Principal>) -> String {
    principal.map(|p| p.name.clone()).unwrap_or_default()
}

/// Seeing every group (ListGroups, DescribeGroups) takes an operator's token.
fn may_see_groups(principal: Option<&Principal>) -> Result<(), ResponseError> {
    match principal {
        Some(p) if !p.has(Scope::Admin) => Err(ResponseError::GroupAuthorizationFailed),
        _ => Ok(()),
    }
}

/// Taking part in groups takes a token that may read something.
fn may_join(principal: Option<&Principal>) -> Result<(), ResponseError> {
    match principal {
        Some(p) if !p.has(Scope::Read) => Err(ResponseError::GroupAuthorizationFailed),
        _ => Ok(()),
    }
}

pub fn find_coordinator(
    kafka: &Kafka,
    request: FindCoordinatorRequest,
    version: i16,
) -> ResponseKind {
    let mut response = FindCoordinatorResponse::default();
    // Groups only: transactions are not served.
    if request.key_type != 0 {
        response.error_code = ResponseError::CoordinatorNotAvailable.code();
        if version >= 1 {
            response.error_message =
                Some(text("Nova coordinates consumer groups, not transactions"));
        }
        return ResponseKind::FindCoordinator(response);
    }
    match kafka.coordinator(&request.key) {
        Some(coordinator) => {
            response.node_id = BrokerId(coordinator.node_id);
            response.host = text(coordinator.host);
            response.port = coordinator.port;
        }
        None => {
            let error = ResponseError::CoordinatorNotAvailable;
            kafka.metrics.answered("FindCoordinator", error);
            response.node_id = BrokerId(-1);
            response.error_code = error.code();
            if version >= 1 {
                response.error_message = Some(text(
                    "no star of the fleet serving Kafka clients is open to work yet; retry",
                ));
            }
        }
    }
    ResponseKind::FindCoordinator(response)
}

pub async fn join(
    kafka: &Kafka,
    peer: SocketAddr,
    principal: Option<&Principal>,
    client_id: String,
    request: JoinGroupRequest,
    version: i16,
) -> ResponseKind {
    let group = request.group_id.0.to_string();
    let mut response = JoinGroupResponse::default();
    if version >= 7 {
        response.protocol_type = Some(request.protocol_type.clone());
    }
    if let Err(error) = may_join(principal)
        .and_then(|()| valid_group(&group))
        .and_then(|()| kafka.coordinates(&group))
    {
        response.error_code = error.code();
        return ResponseKind::JoinGroup(response);
    }
    // From version 4 a new member first learns its id, and joins with it.
    if request.member_id.is_empty() && version >= 4 {
        response.error_code = ResponseError::MemberIdRequired.code();
        response.member_id = text(kafka.groups.new_member_id(&client_id));
        return ResponseKind::JoinGroup(response);
    }
    let session = Duration::from_millis(request.session_timeout_ms.max(0) as u64);
    let rebalance = if version >= 1 {
        Duration::from_millis(request.rebalance_timeout_ms.max(0) as u64)
    } else {
        session
    };
    let joined = kafka
        .groups
        .join(
            &group,
            Join {
                owner: owner(principal),
                member_id: request.member_id.to_string(),
                client_id,
                client_host: peer.ip().to_string(),
                session_timeout: session,
                rebalance_timeout: rebalance,
                protocol_type: request.protocol_type.to_string(),
                protocols: request
                    .protocols
                    .into_iter()
                    .map(|p| (p.name.to_string(), p.metadata))
                    .collect(),
            },
        )
        .await;
    match joined {
        Ok(joined) => {
            response.generation_id = joined.generation;
            response.protocol_name = Some(text(joined.protocol));
            response.leader = text(joined.leader);
            response.member_id = text(joined.member_id);
            response.members = joined
                .members
                .into_iter()
                .map(|(id, metadata)| {
                    JoinGroupResponseMember::default()
                        .with_member_id(text(id))
                        .with_metadata(metadata)
                })
                .collect();
        }
        Err(error) => {
            kafka.metrics.answered("JoinGroup", error);
            response.error_code = error.code();
            response.member_id = request.member_id;
        }
    }
    ResponseKind::JoinGroup(response)
}

pub async fn sync(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: SyncGroupRequest,
    version: i16,
) -> ResponseKind {
    if let Err(error) = may_join(principal).and_then(|()| kafka.coordinates(&request.group_id.0)) {
        return ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(error.code()));
    }
    let assignments = request
        .assignments
        .into_iter()
        .map(|a| (a.member_id.to_string(), a.assignment))
        .collect();
    let synced = kafka
        .groups
        .sync(
            &owner(principal),
            &request.group_id.0,
            request.generation_id,
            &request.member_id,
            assignments,
        )
        .await;
    let mut response = SyncGroupResponse::default();
    if version >= 5 {
        response.protocol_type = request.protocol_type;
        response.protocol_name = request.protocol_name;
    }
    match synced {
        Ok(assignment) => response.assignment = assignment,
        Err(error) => {
            kafka.metrics.answered("SyncGroup", error);
            response.error_code = error.code();
            response.assignment = Bytes::new();
        }
    }
    ResponseKind::SyncGroup(response)
}

pub fn heartbeat(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: HeartbeatRequest,
) -> ResponseKind {
    let mut response = HeartbeatResponse::default();
    let beat = may_join(principal)
        .and_then(|()| kafka.coordinates(&request.group_id.0))
        .and_then(|()| {
            kafka.groups.heartbeat(
                &owner(principal),
                &request.group_id.0,
                request.generation_id,
                &request.member_id,
            )
        });
    if let Err(error) = beat {
        if error != ResponseError::RebalanceInProgress {
            kafka.metrics.answered("Heartbeat", error);
        }
        response.error_code = error.code();
    }
    ResponseKind::Heartbeat(response)
}

pub fn leave(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: LeaveGroupRequest,
    version: i16,
) -> ResponseKind {
    if let Err(error) = may_join(principal).and_then(|()| kafka.coordinates(&request.group_id.0)) {
        return ResponseKind::LeaveGroup(
            LeaveGroupResponse::default().with_error_code(error.code()),
        );
    }
    let ids: Vec<String> = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect()
    } else {
        vec![request.member_id.to_string()]
    };
    let outcomes = kafka
        .groups
        .leave(&owner(principal), &request.group_id.0, &ids);
    let mut response = LeaveGroupResponse::default();
    if version >= 3 {
        response.members = outcomes
            .into_iter()
            .map(|(id, outcome)| {
                MemberResponse::default()
                    .with_member_id(text(id))
                    .with_error_code(outcome.err().map_or(0, |e| e.code()))
            })
            .collect();
    } else if let Some((_, Err(error))) = outcomes.into_iter().next() {
        response.error_code = error.code();
    }
    ResponseKind::LeaveGroup(response)
}

pub async fn commit(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: OffsetCommitRequest,
) -> ResponseKind {
    let group = request.group_id.0.to_string();
    // A commit from outside any group (generation -1) writes a group's offsets with no member
    // to vouch for it: with tokens, only an operator's may.
    let outside = request.generation_id_or_member_epoch < 0 && request.member_id.is_empty();
    let allowed = valid_group(&group)
        .and_then(|()| kafka.coordinates(&group))
        .and_then(|()| match outside {
            true => may_see_groups(principal),
            false => Ok(()),
        })
        .and_then(|()| {
            kafka.groups.may_commit(
                &owner(principal),
                &group,
                request.generation_id_or_member_epoch,
                &request.member_id,
            )
        });
    let now = kafka.ctx.star.config().clock.unix_ms();
    let mut offsets = Vec::new();
    // Each topic's partitions, and what refused each (none: committed with the rest).
    type Refused = Vec<(i32, Option<ResponseError>)>;
    let mut answers: Vec<(TopicName, Refused)> = Vec::new();
    for topic in request.topics {
        let mut parts = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let stream = super::partition_stream(&topic.name, partition.partition_index)
                .and_then(|s| super::allowed(kafka, principal, Scope::Read, &s).map(|()| s));
            let refused = match (&allowed, stream) {
                (Err(error), _) => Some(*error),
                (Ok(()), Err(refusal)) => Some(refusal.error),
                (Ok(()), Ok(_))
                    if partition
                        .committed_metadata
                        .as_ref()
                        .is_some_and(|m| m.len() > nova_core::catalog::MAX_OFFSET_METADATA) =>
                {
                    Some(ResponseError::OffsetMetadataTooLarge)
                }
                (Ok(()), Ok(stream)) => {
                    offsets.push(CommittedOffset {
                        stream,
                        offset: partition.committed_offset,
                        metadata: partition
                            .committed_metadata
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                        committed_at_ms: now,
                    });
                    None
                }
            };
            parts.push((partition.partition_index, refused));
        }
        answers.push((topic.name, parts));
    }
    let written = match offsets.is_empty() {
        true => Ok(()),
        false => {
            kafka
                .ctx
                .star
                .streams()
                .catalog()
                .commit_offsets(&group, &offsets)
                .await
        }
    };
    if let Err(error) = &written {
        tracing::warn!(group, "committing Kafka offsets failed: {error}");
    }
    let topics = answers
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, refused)| {
                    let error = refused.or_else(|| {
                        written
                            .as_ref()
                            .err()
                            .map(|_| ResponseError::CoordinatorNotAvailable)
                    });
                    if let Some(error) = error {
                        kafka.metrics.answered("OffsetCommit", error);
                    }
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(index)
                        .with_error_code(error.map_or(0, |e| e.code()))
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    ResponseKind::OffsetCommit(OffsetCommitResponse::default().with_topics(topics))
}

/// When each stream `committed` names was created (streams that do not exist are left out):
/// this star's own streams, and in a fleet the others' from the catalog, a topic at a time.
async fn created_at(
    kafka: &Kafka,
    committed: &[CommittedOffset],
) -> Result<std::collections::HashMap<String, u64>, nova_core::catalog::CatalogError> {
    let found =
        crate::service::groups::partitions(&kafka.ctx, committed.iter().map(|c| c.stream.as_str()))
            .await?;
    let here = found
        .here
        .iter()
        .map(|state| (state.name().to_owned(), state.meta.created_at_ms));
    let elsewhere = found
        .elsewhere
        .into_iter()
        .map(|meta| (meta.name, meta.created_at_ms));
    Ok(here.chain(elsewhere).collect())
}

pub async fn fetch_offsets(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: OffsetFetchRequest,
    version: i16,
) -> ResponseKind {
    let group = request.group_id.0.to_string();
    let mut response = OffsetFetchResponse::default();
    // Refused as a whole: each partition asked for says so too (version 1 has no other
    // place), as an empty answer would read as "nothing committed" and the consumer would
    // reset.
    let refused = |mut response: OffsetFetchResponse, error: ResponseError| {
        if version >= 2 {
            response.error_code = error.code();
        }
        response.topics = request
            .topics
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partition_indexes
                    .iter()
                    .map(|&i| {
                        OffsetFetchResponsePartition::default()
                            .with_partition_index(i)
                            .with_committed_offset(-1)
                            .with_error_code(error.code())
                    })
                    .collect();
                OffsetFetchResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect();
        ResponseKind::OffsetFetch(response)
    };
    if let Err(error) = may_join(principal)
        .and_then(|()| valid_group(&group))
        .and_then(|()| kafka.coordinates(&group))
    {
        return refused(response, error);
    }
    let committed = match kafka
        .ctx
        .star
        .streams()
        .catalog()
        .committed_offsets(&group)
        .await
    {
        Ok(committed) => committed,
        Err(error) => {
            tracing::warn!(group, "reading Kafka committed offsets failed: {error}");
            return refused(response, ResponseError::CoordinatorNotAvailable);
        }
    };
    let by_stream: std::collections::HashMap<&str, &CommittedOffset> =
        committed.iter().map(|c| (c.stream.as_str(), c)).collect();
    // Only the topics asked about are looked up (all the group committed for when none are).
    let asked: Option<std::collections::HashSet<&str>> = request
        .topics
        .as_ref()
        .map(|topics| topics.iter().map(|t| &*t.name.0).collect());
    let wanted: Vec<CommittedOffset> = committed
        .iter()
        .filter(|c| {
            asked.as_ref().is_none_or(|asked| {
                topic_of(&c.stream).is_some_and(|(topic, _)| asked.contains(topic))
            })
        })
        .cloned()
        .collect();
    let created = match created_at(kafka, &wanted).await {
        Ok(created) => created,
        Err(error) => {
            tracing::warn!(group, "reading Kafka topics' partitions failed: {error}");
            return refused(response, ResponseError::CoordinatorNotAvailable);
        }
    };
    let partition = |topic: &str, index: i32| {
        let stream = nova_kafka::mapping::stream_of(topic, index);
        if let Err(refusal) = super::allowed(kafka, principal, Scope::Read, &stream) {
            return OffsetFetchResponsePartition::default()
                .with_partition_index(index)
                .with_committed_offset(-1)
                .with_error_code(refusal.code());
        }
        // An offset committed before the stream was made belongs to a deleted topic of the
        // same name: the new one starts afresh.
        let created = created.get(&stream).copied();
        let found = by_stream
            .get(stream.as_str())
            .copied()
            .filter(|c| created.is_some_and(|at| c.committed_at_ms >= at));
        OffsetFetchResponsePartition::default()
            .with_partition_index(index)
            .with_committed_offset(found.map_or(-1, |c| c.offset))
            .with_metadata(Some(text(
                found.map(|c| c.metadata.clone()).unwrap_or_default(),
            )))
    };
    response.topics = match request.topics {
        Some(topics) => topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partition_indexes
                    .iter()
                    .map(|&i| partition(&t.name, i))
                    .collect();
                OffsetFetchResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions)
            })
            .collect(),
        // Every partition the group committed for.
        None => {
            let mut topics: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
            for c in &committed {
                if super::allowed(kafka, principal, Scope::Read, &c.stream).is_err() {
                    continue;
                }
                if let Some((topic, index)) = topic_of(&c.stream) {
                    topics.entry(topic.to_owned()).or_default().push(index);
                }
            }
            topics
                .into_iter()
                .map(|(topic, indexes)| {
                    let partitions = indexes.iter().map(|&i| partition(&topic, i)).collect();
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(text(topic)))
                        .with_partitions(partitions)
                })
                .collect()
        }
    };
    ResponseKind::OffsetFetch(response)
}

pub async fn list(kafka: &Kafka, principal: Option<&Principal>, version: i16) -> ResponseKind {
    if let Err(error) = may_see_groups(principal) {
        return ResponseKind::ListGroups(
            ListGroupsResponse::default().with_error_code(error.code()),
        );
    }
    let mut groups: std::collections::BTreeMap<String, (String, &'static str)> = kafka
        .groups
        .list()
        .into_iter()
        .map(|(name, state, protocol_type)| (name, (protocol_type, state.name())))
        .collect();
    // Groups with no members now but committed offsets are Empty groups.
    if let Ok(with_offsets) = kafka
        .ctx
        .star
        .streams()
        .catalog()
        .offset_groups(None, nova_core::limits::LIST_STREAMS_MAX as usize)
        .await
    {
        for group in with_offsets {
            groups
                .entry(group)
                .or_insert_with(|| ("consumer".into(), State::Empty.name()));
        }
    }
    let listed = groups
        .into_iter()
        .map(|(name, (protocol_type, state))| {
            let mut listed = ListedGroup::default()
                .with_group_id(GroupId(text(name)))
                .with_protocol_type(text(protocol_type));
            if version >= 4 {
                listed.group_state = text(state);
            }
            listed
        })
        .collect();
    ResponseKind::ListGroups(ListGroupsResponse::default().with_groups(listed))
}

pub fn describe(
    kafka: &Kafka,
    principal: Option<&Principal>,
    request: DescribeGroupsRequest,
) -> ResponseKind {
    if let Err(error) = may_see_groups(principal) {
        let groups = request
            .groups
            .into_iter()
            .map(|g| {
                DescribedGroup::default()
                    .with_group_id(g)
                    .with_error_code(error.code())
            })
            .collect();
        return ResponseKind::DescribeGroups(DescribeGroupsResponse::default().with_groups(groups));
    }
    let groups = request
        .groups
        .into_iter()
        .map(|group| {
            let described = DescribedGroup::default().with_group_id(group.clone());
            if let Err(error) = kafka.coordinates(&group.0) {
                return described.with_error_code(error.code());
            }
            match kafka.groups.describe(&group.0) {
                Some((state, protocol_type, protocol, members)) => described
                    .with_group_state(text(state.name()))
                    .with_protocol_type(text(protocol_type))
                    .with_protocol_data(text(protocol))
                    .with_members(
                        members
                            .into_iter()
                            .map(|m| {
                                DescribedGroupMember::default()
                                    .with_member_id(text(m.member_id))
                                    .with_client_id(text(m.client_id))
                                    .with_client_host(text(m.client_host))
                                    .with_member_metadata(m.metadata)
                                    .with_member_assignment(m.assignment)
                            })
                            .collect(),
                    ),
                None => described.with_group_state(text("Dead")),
            }
        })
        .collect();
    ResponseKind::DescribeGroups(DescribeGroupsResponse::default().with_groups(groups))
}
