//! Kafka consumer groups as a star reports them (`nova group`): their committed offsets, lag
//! and members.

use nova_proto::v1;

/// A group in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    pub group: String,
    /// As the answering star coordinates it; empty when another star does or it has no
    /// members.
    pub state: String,
    pub members: u32,
}

/// One group: its coordinator, members, and committed offset and lag in each stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group: String,
    /// As its coordinator knows it ("Dead" with no members); empty when another star
    /// coordinates it.
    pub state: String,
    pub coordinator_id: String,
    pub coordinator_addr: String,
    /// Whether the star asked coordinates it: members are known only there.
    pub coordinated_here: bool,
    pub members: Vec<GroupMember>,
    pub offsets: Vec<GroupOffset>,
}

impl GroupDescription {
    /// Records past the committed offsets, over every stream.
    pub fn lag(&self) -> u64 {
        self.offsets.iter().map(|o| o.lag).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOffset {
    pub stream: String,
    /// The next record the group reads.
    pub committed: i64,
    pub committed_at_ms: u64,
    /// The stream's tail (0 when the stream is gone).
    pub tail_seq: u64,
    pub lag: u64,
    pub metadata: String,
}

impl From<v1::GroupSummary> for GroupSummary {
    fn from(g: v1::GroupSummary) -> Self {
        Self {
            group: g.group,
            state: g.state,
            members: g.members,
        }
    }
}

impl From<v1::DescribeGroupResponse> for GroupDescription {
    fn from(g: v1::DescribeGroupResponse) -> Self {
        Self {
            group: g.group,
            state: g.state,
            coordinator_id: g.coordinator_id,
            coordinator_addr: g.coordinator_addr,
            coordinated_here: g.coordinated_here,
            members: g
                .members
                .into_iter()
                .map(|m| GroupMember {
                    member_id: m.member_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                })
                .collect(),
            offsets: g
                .offsets
                .into_iter()
                .map(|o| GroupOffset {
                    stream: o.stream,
                    committed: o.committed,
                    committed_at_ms: o.committed_at_ms,
                    tail_seq: o.tail_seq,
                    lag: o.lag,
                    metadata: o.metadata,
                })
                .collect(),
        }
    }
}
