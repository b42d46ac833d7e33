//! Consumer groups, coordinated by the star (Kafka's classic protocol): members join, the
//! group rebalances, the leader's assignment is handed out through SyncGroup, heartbeats keep
//! members in, and a member that leaves or stops heartbeating starts the next rebalance. The
//! assignment itself is the clients' (their range and round-robin assignors run in the
//! leader); the star only carries it.
//!
//! The state is in memory, bounded: at most `KAFKA_MAX_GROUPS` groups, `KAFKA_MAX_GROUP_MEMBERS`
//! members each, and `KAFKA_GROUP_MEMORY_BYTES` of members' protocol metadata and assignments
//! in all; a join past any of them is refused with a Kafka error (counted and logged as a
//! shed). Committed offsets are not here but in the catalog (`Catalog::commit_offsets`), so a
//! group survives a restart of its coordinator: its members rejoin and go on from them.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use nova_core::clock::{Clock, Instant};
use nova_core::limits::{
    KAFKA_GROUP_MEMORY_BYTES, KAFKA_MAX_GROUP_MEMBERS, KAFKA_MAX_GROUPS,
    KAFKA_MAX_MEMBER_METADATA_BYTES,
};

/// How long a group that had no members waits for more to join before its first rebalance
/// completes (Kafka's `group.initial.rebalance.delay.ms`, shorter).
const INITIAL_REBALANCE_DELAY: Duration = Duration::from_millis(500);

/// The longest member id, client id and protocol type, together, a member may have.
const MAX_NAME_BYTES: usize = 1024;

/// Session timeouts a member may ask for (Kafka's defaults for the broker's bounds).
const MIN_SESSION: Duration = Duration::from_secs(6);
const MAX_SESSION: Duration = Duration::from_secs(1800);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// What a join asks for.
pub struct Join {
    /// The token's name the member joins with ("" when the star checks no tokens): a member
    /// id answers only to it.
    pub owner: String,
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

/// A join's answer.
#[derive(Debug, Clone, Default)]
pub struct Joined {
    pub generation: i32,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// For the leader: every member and its metadata for the chosen protocol.
    pub members: Vec<(String, Bytes)>,
}

/// A member as DescribeGroups shows it.
pub struct Described {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

struct Member {
    owner: String,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_heard: Instant,
    /// A join of the current rebalance waits for its answer.
    joining: Option<oneshot::Sender<Result<Joined, ResponseError>>>,
    syncing: Option<oneshot::Sender<Result<Bytes, ResponseError>>>,
}

impl Member {
    fn bytes(&self) -> u64 {
        let protocols: usize = self.protocols.iter().map(|(n, m)| n.len() + m.len()).sum();
        (protocols
            + self.assignment.len()
            + self.client_id.len()
            + self.client_host.len()
            + MAX_NAME_BYTES
            + 256) as u64
    }
}

struct Group {
    state: State,
    generation: i32,
    protocol_type: String,
    protocol: String,
    leader: String,
    members: BTreeMap<String, Member>,
    /// When a rebalance completes even if not every member has rejoined.
    deadline: Option<Instant>,
}

impl Group {
    /// A request from member `member_id`, sent with `owner`'s token, in `generation`: the
    /// member is heard from (its session goes on) and must be of the current generation.
    fn heard_from(
        &mut self,
        owner: &str,
        member_id: &str,
        generation: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        let member = self
            .members
            .get_mut(member_id)
            .filter(|m| m.owner == owner)
            .ok_or(ResponseError::UnknownMemberId)?;
        member.last_heard = now;
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    fn new() -> Self {
        Self {
            state: State::Empty,
            generation: 0,
            protocol_type: String::new(),
            protocol: String::new(),
            leader: String::new(),
            members: BTreeMap::new(),
            deadline: None,
        }
    }
}

pub struct Coordinator {
    clock: Clock,
    groups: Mutex<Groups>,
}

#[derive(Default)]
struct Groups {
    by_name: HashMap<String, Group>,
    bytes: u64,
    next_member: u64,
}

impl Coordinator {
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            groups: Mutex::default(),
        }
    }

    /// Joins (or rejoins) `group`; waits until the rebalance completes.
    pub async fn join(&self, group: &str, join: Join) -> Result<Joined, ResponseError> {
        let waiting = {
            let mut groups = self.groups.lock();
            let now = self.clock.now();
            let session = join.session_timeout;
            if !(MIN_SESSION..=MAX_SESSION).contains(&session) {
                return Err(ResponseError::InvalidSessionTimeout);
            }
            if join.protocol_type.is_empty() || join.protocols.is_empty() {
                return Err(ResponseError::InconsistentGroupProtocol);
            }
            let metadata: usize = join.protocols.iter().map(|(n, m)| n.len() + m.len()).sum();
            let names = join.member_id.len() + join.client_id.len() + join.protocol_type.len();
            if metadata as u64 > KAFKA_MAX_MEMBER_METADATA_BYTES || names > MAX_NAME_BYTES {
                return Err(ResponseError::InvalidRequest);
            }
            if !groups.by_name.contains_key(group) && groups.by_name.len() >= KAFKA_MAX_GROUPS {
                return Err(ResponseError::CoordinatorNotAvailable);
            }
            let member_id = if join.member_id.is_empty() {
                groups.next_member += 1;
                format!(
                    "{}-{}-{}",
                    join.client_id,
                    self.clock.unix_ms(),
                    groups.next_member
                )
            } else {
                join.member_id.clone()
            };
            let Groups { by_name, bytes, .. } = &mut *groups;
            let state = by_name.entry(group.to_owned()).or_insert_with(Group::new);
            // A member id the group does not hold (handed out with MEMBER_ID_REQUIRED, or of a
            // member whose session expired) joins as a new member.
            if !state.members.is_empty() && state.protocol_type != join.protocol_type {
                return Err(ResponseError::InconsistentGroupProtocol);
            }
            if !state.members.contains_key(&member_id)
                && state.members.len() >= KAFKA_MAX_GROUP_MEMBERS
            {
                return Err(ResponseError::GroupMaxSizeReached);
            }
            let (tx, rx) = oneshot::channel();
            if state
                .members
                .get(&member_id)
                .is_some_and(|m| m.owner != join.owner)
            {
                return Err(ResponseError::UnknownMemberId);
            }
            let member = Member {
                owner: join.owner,
                client_id: join.client_id,
                client_host: join.client_host,
                session_timeout: session,
                rebalance_timeout: join.rebalance_timeout,
                protocols: join.protocols,
                assignment: Bytes::new(),
                last_heard: now,
                joining: Some(tx),
                syncing: None,
            };
            let added = member.bytes();
            let replaced = state.members.get(&member_id).map_or(0, Member::bytes);
            if *bytes + added - replaced.min(*bytes + added) > KAFKA_GROUP_MEMORY_BYTES {
                return Err(ResponseError::CoordinatorNotAvailable);
            }
            *bytes = *bytes + added - replaced;
            state.protocol_type = join.protocol_type;
            state.members.insert(member_id, member);
            match state.state {
                State::PreparingRebalance => {}
                State::Empty => start_rebalance(state, now, Some(INITIAL_REBALANCE_DELAY)),
                State::CompletingRebalance | State::Stable => start_rebalance(state, now, None),
            }
            complete_if_ready(state, now, bytes);
            rx
        };
        match waiting.await {
            Ok(answer) => answer,
            Err(_) => Err(ResponseError::RebalanceInProgress),
        }
    }

    /// A new member id for a client told `MEMBER_ID_REQUIRED`.
    pub fn new_member_id(&self, client_id: &str) -> String {
        let mut groups = self.groups.lock();
        groups.next_member += 1;
        format!(
            "{client_id}-{}-{}",
            self.clock.unix_ms(),
            groups.next_member
        )
    }

    /// The leader hands out the assignment; the others wait for it.
    pub async fn sync(
        &self,
        owner: &str,
        group: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<Bytes, ResponseError> {
        let waiting = {
            let mut groups = self.groups.lock();
            let Groups { by_name, bytes, .. } = &mut *groups;
            let state = by_name
                .get_mut(group)
                .ok_or(ResponseError::UnknownMemberId)?;
            state.heard_from(owner, member_id, generation, self.clock.now())?;
            match state.state {
                State::Stable => {
                    return Ok(state
                        .members
                        .get(member_id)
                        .map(|m| m.assignment.clone())
                        .unwrap_or_default());
                }
                State::PreparingRebalance | State::Empty => {
                    return Err(ResponseError::RebalanceInProgress);
                }
                State::CompletingRebalance => {}
            }
            if member_id == state.leader {
                let given: HashMap<String, Bytes> = assignments.into_iter().collect();
                let over = given
                    .values()
                    .any(|a| a.len() as u64 > KAFKA_MAX_MEMBER_METADATA_BYTES);
                let replaced: u64 = state
                    .members
                    .values()
                    .map(|m| m.assignment.len() as u64)
                    .sum();
                let added: u64 = state
                    .members
                    .keys()
                    .filter_map(|id| given.get(id))
                    .map(|a| a.len() as u64)
                    .sum();
                if over || *bytes - replaced.min(*bytes) + added > KAFKA_GROUP_MEMORY_BYTES {
                    // The assignment cannot be held: the group starts over.
                    start_rebalance(state, self.clock.now(), None);
                    return Err(if over {
                        ResponseError::InvalidRequest
                    } else {
                        ResponseError::CoordinatorNotAvailable
                    });
                }
                for (id, member) in state.members.iter_mut() {
                    let assignment = given.get(id).cloned().unwrap_or_default();
                    *bytes = *bytes - (member.assignment.len() as u64).min(*bytes)
                        + assignment.len() as u64;
                    member.assignment = assignment.clone();
                    if let Some(waiter) = member.syncing.take() {
                        let _ = waiter.send(Ok(assignment));
                    }
                }
                state.state = State::Stable;
                return Ok(state
                    .members
                    .get(member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default());
            }
            let (tx, rx) = oneshot::channel();
            if let Some(member) = state.members.get_mut(member_id) {
                member.syncing = Some(tx);
            }
            rx
        };
        match waiting.await {
            Ok(answer) => answer,
            Err(_) => Err(ResponseError::RebalanceInProgress),
        }
    }

    pub fn heartbeat(
        &self,
        owner: &str,
        group: &str,
        generation: i32,
        member_id: &str,
    ) -> Result<(), ResponseError> {
        let mut groups = self.groups.lock();
        let state = groups
            .by_name
            .get_mut(group)
            .ok_or(ResponseError::UnknownMemberId)?;
        state.heard_from(owner, member_id, generation, self.clock.now())?;
        match state.state {
            State::PreparingRebalance => Err(ResponseError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// Removes members; the others rebalance.
    pub fn leave(
        &self,
        owner: &str,
        group: &str,
        member_ids: &[String],
    ) -> Vec<(String, Result<(), ResponseError>)> {
        let mut groups = self.groups.lock();
        let now = self.clock.now();
        let Groups { by_name, bytes, .. } = &mut *groups;
        let Some(state) = by_name.get_mut(group) else {
            return member_ids
                .iter()
                .map(|id| (id.clone(), Err(ResponseError::UnknownMemberId)))
                .collect();
        };
        let mut out = Vec::with_capacity(member_ids.len());
        let mut left = false;
        for id in member_ids {
            // Only the token a member joined with may take it out.
            let removed = match state.members.get(id) {
                Some(member) if member.owner == owner => state.members.remove(id),
                _ => None,
            };
            match removed {
                Some(member) => {
                    *bytes -= member.bytes().min(*bytes);
                    if let Some(waiter) = member.joining {
                        let _ = waiter.send(Err(ResponseError::UnknownMemberId));
                    }
                    left = true;
                    out.push((id.clone(), Ok(())));
                }
                None => out.push((id.clone(), Err(ResponseError::UnknownMemberId))),
            }
        }
        if left {
            tracing::info!(
                group,
                members = state.members.len(),
                "Kafka consumer group member left"
            );
            rebalance_without(state, now, bytes);
        }
        out
    }

    /// Checks members' sessions and rebalances' deadlines; run about twice a second.
    pub fn tick(&self) {
        let mut groups = self.groups.lock();
        let now = self.clock.now();
        let Groups { by_name, bytes, .. } = &mut *groups;
        for (name, state) in by_name.iter_mut() {
            let expired: Vec<String> = state
                .members
                .iter()
                .filter(|(_, m)| m.joining.is_none() && now >= m.last_heard + m.session_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            if !expired.is_empty() {
                for id in &expired {
                    if let Some(member) = state.members.remove(id) {
                        *bytes -= member.bytes().min(*bytes);
                    }
                }
                tracing::info!(group = %name, expired = ?expired, "Kafka consumer group members' sessions expired");
                rebalance_without(state, now, bytes);
            }
            if state.state == State::CompletingRebalance && state.deadline.is_some_and(|d| now >= d)
            {
                tracing::info!(group = %name, "Kafka consumer group's leader sent no assignment in time; rebalancing");
                start_rebalance(state, now, None);
            }
            complete_if_ready(state, now, bytes);
        }
        by_name.retain(|_, g| g.state != State::Empty || !g.members.is_empty());
    }

    /// Drops the groups `gone` names (another star coordinates them now); their members'
    /// joins in progress are answered REBALANCE_IN_PROGRESS and join again.
    pub fn forget_where(&self, gone: impl Fn(&str) -> bool) {
        let mut groups = self.groups.lock();
        let Groups { by_name, bytes, .. } = &mut *groups;
        by_name.retain(|name, group| {
            if !gone(name) {
                return true;
            }
            let held: u64 = group.members.values().map(Member::bytes).sum();
            *bytes -= held.min(*bytes);
            tracing::info!(group = %name, "another star coordinates this Kafka consumer group now");
            false
        });
    }

    /// A group's state, its protocol and its members, if the coordinator knows it.
    pub fn describe(&self, group: &str) -> Option<(State, String, String, Vec<Described>)> {
        let groups = self.groups.lock();
        let state = groups.by_name.get(group)?;
        let members = state
            .members
            .iter()
            .map(|(id, m)| Described {
                member_id: id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: m
                    .protocols
                    .iter()
                    .find(|(n, _)| *n == state.protocol)
                    .map(|(_, meta)| meta.clone())
                    .unwrap_or_default(),
                assignment: m.assignment.clone(),
            })
            .collect();
        Some((
            state.state,
            state.protocol_type.clone(),
            state.protocol.clone(),
            members,
        ))
    }

    /// Every group with members, and its state and protocol type.
    pub fn list(&self) -> Vec<(String, State, String)> {
        let groups = self.groups.lock();
        let mut out: Vec<_> = groups
            .by_name
            .iter()
            .map(|(name, g)| (name.clone(), g.state, g.protocol_type.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether `member_id` belongs to `group`'s `generation` (an offset commit's check). A
    /// commit with generation -1 (a consumer outside any group) passes when the group has
    /// no members.
    pub fn may_commit(
        &self,
        owner: &str,
        group: &str,
        generation: i32,
        member_id: &str,
    ) -> Result<(), ResponseError> {
        let groups = self.groups.lock();
        let state = groups.by_name.get(group);
        if generation < 0 && member_id.is_empty() {
            return match state {
                Some(state) if !state.members.is_empty() => Err(ResponseError::UnknownMemberId),
                _ => Ok(()),
            };
        }
        let state = state.ok_or(ResponseError::UnknownMemberId)?;
        if state
            .members
            .get(member_id)
            .is_none_or(|m| m.owner != owner)
        {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation != state.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if state.state == State::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        Ok(())
    }
}

fn start_rebalance(state: &mut Group, now: Instant, delay: Option<Duration>) {
    let longest = state
        .members
        .values()
        .map(|m| m.rebalance_timeout)
        .max()
        .unwrap_or_default();
    state.state = State::PreparingRebalance;
    state.deadline = Some(now + delay.unwrap_or(longest));
    for member in state.members.values_mut() {
        // Members waiting on an assignment learn that another rebalance began.
        if let Some(waiter) = member.syncing.take() {
            let _ = waiter.send(Err(ResponseError::RebalanceInProgress));
        }
    }
}

/// After members left: the rest rebalance, or the group is empty.
fn rebalance_without(state: &mut Group, now: Instant, bytes: &mut u64) {
    if state.members.is_empty() {
        state.state = State::Empty;
        state.generation += 1;
        state.leader.clear();
        state.deadline = None;
    } else if state.state != State::PreparingRebalance {
        start_rebalance(state, now, None);
    }
    complete_if_ready(state, now, bytes);
}

/// Completes a rebalance once every member has rejoined (and a new group's first delay has
/// passed), or its deadline has; members that did not rejoin by then are dropped.
fn complete_if_ready(state: &mut Group, now: Instant, bytes: &mut u64) {
    if state.state != State::PreparingRebalance {
        return;
    }
    let past_deadline = state.deadline.is_some_and(|d| now >= d);
    let all_in = state.members.values().all(|m| m.joining.is_some());
    // A group starting from no members waits out its first delay, for the others to come.
    let first = state.leader.is_empty();
    if !(past_deadline || (all_in && !first)) {
        return;
    }
    // Members whose join's connection is gone (nobody waits for the answer) are not in the
    // next generation either.
    state.members.retain(|_, m| {
        let keep = m.joining.as_ref().is_some_and(|waiter| !waiter.is_closed());
        if !keep {
            *bytes -= m.bytes().min(*bytes);
        }
        keep
    });
    if state.members.is_empty() {
        state.state = State::Empty;
        state.leader.clear();
        state.deadline = None;
        return;
    }
    // The first protocol of the first member that every member supports.
    let mut first = state.members.values();
    let candidates: Vec<String> = first
        .next()
        .map(|m| m.protocols.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    let Some(protocol) = candidates.into_iter().find(|name| {
        state
            .members
            .values()
            .all(|m| m.protocols.iter().any(|(n, _)| n == name))
    }) else {
        for member in state.members.values_mut() {
            *bytes -= member.bytes().min(*bytes);
            if let Some(waiter) = member.joining.take() {
                let _ = waiter.send(Err(ResponseError::InconsistentGroupProtocol));
            }
        }
        state.members.clear();
        state.state = State::Empty;
        state.leader.clear();
        return;
    };
    state.generation += 1;
    state.protocol = protocol;
    if !state.members.contains_key(&state.leader) {
        state.leader = state.members.keys().next().cloned().unwrap_or_default();
    }
    state.state = State::CompletingRebalance;
    // The leader's assignment must come within the rebalance timeout, or the group starts
    // over (see `tick`).
    let longest = state
        .members
        .values()
        .map(|m| m.rebalance_timeout)
        .max()
        .unwrap_or_default();
    state.deadline = Some(now + longest);
    let everyone: Vec<(String, Bytes)> = state
        .members
        .iter()
        .map(|(id, m)| {
            let metadata = m
                .protocols
                .iter()
                .find(|(n, _)| *n == state.protocol)
                .map(|(_, meta)| meta.clone())
                .unwrap_or_default();
            (id.clone(), metadata)
        })
        .collect();
    for (id, member) in state.members.iter_mut() {
        member.last_heard = now;
        *bytes -= (member.assignment.len() as u64).min(*bytes);
        member.assignment = Bytes::new();
        if let Some(waiter) = member.joining.take() {
            let _ = waiter.send(Ok(Joined {
                generation: state.generation,
                protocol: state.protocol.clone(),
                leader: state.leader.clone(),
                member_id: id.clone(),
                members: if *id == state.leader {
                    everyone.clone()
                } else {
                    Vec::new()
                },
            }));
        }
    }
    tracing::info!(
        generation = state.generation,
        members = state.members.len(),
        leader = %state.leader,
        "Kafka consumer group rebalanced"
    );
}
