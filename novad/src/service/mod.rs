//! The `nova.v1.Nova` gRPC service: a thin layer that turns wire messages into calls on the star
//! and errors into statuses.

mod append;
pub use append::reject_append;
pub mod caps;
pub mod charge;
pub mod groups;
pub mod info;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use nova_chain::metrics::Metrics;
use nova_chain::streams::StreamState;
use nova_chain::{READ_PER_RECORD, Star};
use nova_core::catalog::{Retention, StorageClass};
use nova_core::limits::{
    COLD_READ_REFS, LIST_STREAMS_DEFAULT, LIST_STREAMS_MAX, MAX_READ_WAIT_MS, MAX_RESOLVED_REFS,
    MAX_SECTION_BYTES,
};
use nova_proto::RequestError;
use nova_proto::server::nova_server::Nova;
use nova_proto::v1;
use nova_proto::validate::{AppendCaps, read_caps};
use nova_proto::wire::WireAppend;
use nova_server::net::Scope;
use nova_server::shed::ShedLog;

use caps::Cap;

/// What every handler shares.
pub struct Context {
    pub star: Arc<Star>,
    /// The fleet this star belongs to; `None` for a single star on the embedded metastore,
    /// which leads every stream.
    pub fleet: Option<Arc<nova_fleet::Fleet>>,
    pub caps: AppendCaps,
    pub max_read_bytes: u64,
    pub max_read_records: u32,
    pub sessions: Cap,
    /// Reads in progress, including those waiting at a stream's tail (`wait_ms`).
    pub subscriptions: Cap,
    /// What each token holds of the read budget in pages being built or not yet sent.
    pub read_shares: Arc<nova_server::net::shares::Shares>,
    /// How many subscription places each token holds.
    pub subscription_shares: Arc<nova_server::net::shares::Shares>,
    /// How many metastore lookups each token has in flight.
    pub lookup_shares: Arc<nova_server::net::shares::Shares>,
    pub metrics: Arc<Metrics>,
    pub sheds: Arc<ShedLog>,
    /// Fires when novad starts shutting down: sessions stop reading and finish.
    pub shutdown: CancellationToken,
    /// What `GetServerInfo` says that does not change while the star runs.
    pub identity: info::Identity,
    /// What each call's token may do (`--auth-tokens`).
    pub access: nova_server::net::Access,
    /// The Kafka listener, once it serves (`--kafka-listen`): `nova group` asks its groups.
    pub kafka: std::sync::OnceLock<std::sync::Weak<dyn groups::KafkaGroups>>,
}

impl Context {
    /// Where a read of `stream` starts: `start_seq`, or with a start time, where the star's
    /// index puts the first record at or after it (never before `start_seq`).
    async fn start_seq(
        &self,
        stream: &StreamState,
        start_seq: u64,
        start_timestamp: Option<u64>,
    ) -> Result<u64, RequestError> {
        match start_timestamp {
            Some(timestamp) => self.star.seek_time(stream, start_seq, timestamp).await,
            None => Ok(start_seq),
        }
    }

    /// The stream, when this star leads it; otherwise a redirect to its leader.
    pub async fn route(
        &self,
        name: &str,
        peer: Option<SocketAddr>,
        principal: Option<&nova_server::net::Principal>,
    ) -> Result<Arc<StreamState>, RequestError> {
        match &self.fleet {
            Some(fleet) => {
                // A stream led elsewhere (or nowhere) is looked up in the metastore: one token
                // has at most its share of the lookups in flight, so its describes of streams
                // that do not exist cannot take every metastore read from everyone else.
                let _lookup = match nova_server::net::shares::holder(principal) {
                    Some(holder) if !fleet.leads(name) => Some(
                        self.lookup_shares
                            .try_take(&holder, 1)
                            .ok_or_else(|| self.shed_lookup(name, peer))?,
                    ),
                    _ => None,
                };
                let routed = fleet.route(&self.star, name).await;
                self.count_fleet_shed(&routed, name, peer);
                routed
            }
            None => self.star.streams().get_or_not_found(name),
        }
    }

    fn shed_lookup(&self, stream: &str, peer: Option<SocketAddr>) -> RequestError {
        caps::shed_share(
            &self.metrics,
            &self.sheds,
            caps::LOOKUP_SHARE,
            self.lookup_shares.cap(),
            "this token's share of the metastore lookups in flight (of streams this star does \
             not lead) is taken; other tokens' calls go on",
            stream,
            peer,
        )
    }

    /// A fleet in which no star is open to a stream's leadership refused it (placing a new
    /// stream, or one left without a leader): a shed like any other, counted and logged.
    pub(crate) fn count_fleet_shed<T>(
        &self,
        result: &Result<T, RequestError>,
        stream: &str,
        peer: Option<SocketAddr>,
    ) {
        if let Err(refusal @ RequestError::CapReached { cap, .. }) = result
            && *cap == nova_fleet::FLEET_CAPACITY
        {
            caps::record_shed(
                &self.metrics,
                &self.sheds,
                "fleet_capacity",
                refusal,
                Some(stream),
                peer,
            );
        }
    }
}

#[derive(Clone)]
pub struct NovaService {
    ctx: Arc<Context>,
}

impl NovaService {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }

    /// A read refused because its token holds its share of the subscription places.
    fn shed_subscription_share(&self, peer: Option<SocketAddr>, stream: &str) -> Status {
        let ctx = &self.ctx;
        caps::shed_share(
            &ctx.metrics,
            &ctx.sheds,
            caps::SUBSCRIPTION_SHARE,
            ctx.subscription_shares.cap(),
            "this token's share of the subscription places (--max-subscriptions) is taken by \
             its reads in progress; reads of other tokens go on",
            stream,
            peer,
        )
        .into()
    }
}

/// What the API says about a stream; `first_seq` as the caller read it.
fn info(stream: &StreamState, first_seq: u64) -> v1::StreamInfo {
    info_led(stream, first_seq, None)
}

fn info_led(
    stream: &StreamState,
    first_seq: u64,
    leader: Option<&nova_fleet::Member>,
) -> v1::StreamInfo {
    let retention = stream.retention();
    v1::StreamInfo {
        name: stream.name().to_owned(),
        tail_seq: stream.tail(),
        stored_bytes: stream.stored_bytes(),
        storage_class: match stream.class() {
            StorageClass::Standard => v1::StorageClass::Standard as i32,
            StorageClass::Express => v1::StorageClass::Express as i32,
        },
        created_at_ms: stream.meta.created_at_ms,
        first_seq,
        retention: (!retention.is_unlimited()).then_some(v1::Retention {
            age_ms: retention.age_ms,
            bytes: retention.bytes,
        }),
        leader_id: leader.map(|m| m.id.clone()).unwrap_or_default(),
        leader_addr: leader.map(|m| m.advertise.clone()).unwrap_or_default(),
    }
}

/// How long a change of storage class waits for the stream's appends in flight to land.
const RECLASS_TIMEOUT: Duration = Duration::from_secs(30);

/// A storage class from the API; `None` when unspecified.
fn class_from(wire: i32) -> Result<Option<StorageClass>, RequestError> {
    match v1::StorageClass::try_from(wire) {
        Ok(v1::StorageClass::Unspecified) => Ok(None),
        Ok(v1::StorageClass::Standard) => Ok(Some(StorageClass::Standard)),
        Ok(v1::StorageClass::Express) => Ok(Some(StorageClass::Express)),
        Err(_) => Err(RequestError::InvalidRequest(format!(
            "unknown storage class {wire}"
        ))),
    }
}

/// A retention from the API: absent limits are none; a limit of 0 would trim everything as
/// soon as it is written, so it is refused.
fn retention_from(wire: Option<v1::Retention>) -> Result<Retention, RequestError> {
    let wire = wire.unwrap_or_default();
    if wire.age_ms == Some(0) || wire.bytes == Some(0) {
        return Err(RequestError::InvalidRequest(
            "a retention limit of 0 would trim every record as it lands; for no limit, leave \
             the limit unset (the CLI's `none`)"
                .into(),
        ));
    }
    Ok(Retention {
        age_ms: wire.age_ms,
        bytes: wire.bytes,
    })
}

#[tonic::async_trait]
impl Nova for NovaService {
    type AppendStream = append::AckStream;

    async fn append(
        &self,
        request: Request<Streaming<WireAppend>>,
    ) -> Result<Response<Self::AppendStream>, Status> {
        let peer = request.remote_addr();
        let principal = nova_server::net::principal(&request);
        let charges = request.extensions().get::<Arc<charge::Charges>>().cloned();
        append::open_session(
            self.ctx.clone(),
            peer,
            principal,
            charges,
            request.into_inner(),
        )
        .map(Response::new)
    }

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        let peer = request.remote_addr();
        let principal = nova_server::net::principal(&request);
        let request = request.into_inner();
        let ctx = &self.ctx;
        ctx.access
            .check(principal.as_deref(), Scope::Read, &request.stream)?;
        let stream = ctx
            .route(&request.stream, peer, principal.as_deref())
            .await?;
        // Every read in progress is a subscription: the cap bounds how many pages (each within
        // the read caps, with at most 8 sections in flight) the star builds at once. A follow
        // read holds its slot while it waits at the tail, and nothing else: the next page is
        // produced only when the consumer asks for it.
        // With tokens, one token holds at most its share of the places (its follows waiting at
        // tails, its reads waiting on its own pages), so it cannot shed everybody else's.
        let holder = nova_server::net::shares::holder(principal.as_deref());
        let _place_share = match &holder {
            Some(holder) => Some(
                ctx.subscription_shares
                    .try_take(holder, 1)
                    .ok_or_else(|| self.shed_subscription_share(peer, &request.stream))?,
            ),
            None => None,
        };
        let _subscription = ctx.subscriptions.admit(peer, Some(&request.stream))?;
        let start_seq = ctx
            .start_seq(&stream, request.start_seq, request.start_timestamp)
            .await?;
        if request.wait_ms > 0 && start_seq >= stream.tail() {
            let wait = Duration::from_millis((request.wait_ms as u64).min(MAX_READ_WAIT_MS));
            // A star stopping answers a waiting read at once (an empty page): a follower
            // would otherwise hold the shutdown for as long as it waits, and it asks again,
            // of the star's successor or of the star restarted.
            tokio::select! {
                _ = stream.wait_past(start_seq, wait, ctx.star.config().clock) => {}
                _ = ctx.shutdown.cancelled() => {}
            }
            if stream.is_deleted() {
                return Err(RequestError::StreamNotFound(request.stream).into());
            }
        }
        let (max_records, max_bytes) =
            read_caps(&request, ctx.max_read_records, ctx.max_read_bytes);
        // What the page holds counts against the token's share of the read budget too, from
        // before it is built until it is sent: a token whose pages are not taken (a window
        // withheld) waits on its own share, and holds no more than it of the budget. What the
        // page may hold is taken ahead, while the read holds nothing else (no cached run, no
        // charge); the page is built within it (ending short if need be) and gives back the
        // rest once built. The most is the page's caps, and never less than a page's first
        // growth may take (a cold section and its copy), so a small page cannot pass the
        // share with a charge larger than it took.
        let mut share = match &holder {
            Some(holder) => {
                let most = (max_bytes + max_records as u64 * READ_PER_RECORD)
                    .max(2 * MAX_SECTION_BYTES + READ_PER_RECORD)
                    .min(ctx.read_shares.cap());
                Some(ctx.read_shares.take_waiting(holder, most).await)
            }
            None => None,
        };
        let limit = share.as_ref().map(|share| share.bytes());
        let mut page = ctx
            .star
            .read_within(&stream, start_seq, max_records, max_bytes, limit)
            .await?;
        if let (Some(share), Some(holder)) = (&mut share, &holder) {
            let held = page.charge.bytes();
            if held <= share.bytes() {
                share.shrink_to(held);
            } else {
                // Past what was taken ahead (a first record larger than a section): counted
                // whole, so the token's next read sees it.
                share.absorb(ctx.read_shares.take(holder, held - share.bytes()));
            }
        }
        if let Some(timestamp) = request.start_timestamp {
            // The seek lands at or before the first record stamped at `timestamp`: pass over
            // what precedes it. A page of only earlier records comes back empty, its next_seq
            // moved on.
            let first = page
                .records
                .iter()
                .position(|r| r.record.timestamp >= timestamp)
                .unwrap_or(page.records.len());
            page.records.drain(..first);
        }
        ctx.metrics.read_records.inc_by(page.records.len() as u64);
        ctx.metrics
            .read_bytes
            .inc_by(page.records.iter().map(|r| r.record.content_bytes()).sum());
        let mut response = Response::new(v1::ReadResponse {
            records: page.records.into_iter().map(Into::into).collect(),
            next_seq: page.next_seq,
            tail_seq: page.tail_seq,
        });
        // The page's read charge (and its share) stays held until the response is sent.
        response
            .extensions_mut()
            .insert(nova_server::net::hold::Hold::new((page.charge, share)));
        Ok(response)
    }

    async fn resolve_refs(
        &self,
        request: Request<v1::ResolveRefsRequest>,
    ) -> Result<Response<v1::ResolveRefsResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let peer = request.remote_addr();
        let request = request.into_inner();
        self.ctx
            .access
            .check(principal.as_deref(), Scope::Read, &request.stream)?;
        let stream = self
            .ctx
            .route(&request.stream, peer, principal.as_deref())
            .await?;
        let max_refs = match request.max_refs {
            0 => COLD_READ_REFS,
            n => (n as usize).min(MAX_RESOLVED_REFS),
        };
        let start_seq = self
            .ctx
            .start_seq(&stream, request.start_seq, request.start_timestamp)
            .await?;
        let found = self
            .ctx
            .star
            .resolve_refs(&stream, start_seq, max_refs)
            .await?;
        Ok(Response::new(v1::ResolveRefsResponse {
            refs: found
                .refs
                .into_iter()
                .map(|r| v1::ObjectRef {
                    object_key: r.object_key,
                    stream_id: r.stream_id,
                    start_seq: r.start_seq,
                    end_seq: r.end_seq,
                })
                .collect(),
            next_seq: found.next_seq,
            tail_seq: found.tail_seq,
            hot_from_seq: found.hot_from,
        }))
    }

    async fn create_stream(
        &self,
        request: Request<v1::CreateStreamRequest>,
    ) -> Result<Response<v1::CreateStreamResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let peer = request.remote_addr();
        let request = request.into_inner();
        self.ctx
            .access
            .check(principal.as_deref(), Scope::Admin, &request.stream)?;
        let class = class_from(request.storage_class)?.unwrap_or(StorageClass::Standard);
        if class == StorageClass::Express && self.ctx.star.config().express.is_none() {
            return Err(RequestError::InvalidRequest(format!(
                "stream {:?}: storage class EXPRESS needs express zone buckets \
                 (--s3-express-zone), and this star has none configured; create it as STANDARD",
                request.stream
            ))
            .into());
        }
        let retention = retention_from(request.retention)?;
        let (stream, leader) = match &self.ctx.fleet {
            Some(fleet) => {
                let created = fleet
                    .create_stream(&self.ctx.star, &request.stream, class, retention)
                    .await;
                self.ctx.count_fleet_shed(&created, &request.stream, peer);
                let (stream, leader) = created?;
                (stream, Some(leader))
            }
            None => (
                self.ctx
                    .star
                    .streams()
                    .create_with(&request.stream, class, retention)
                    .await?,
                None,
            ),
        };
        tracing::info!(
            stream = stream.name(),
            id = stream.id(),
            ?retention,
            "stream created"
        );
        Ok(Response::new(v1::CreateStreamResponse {
            info: Some(info_led(&stream, 0, leader.as_ref())),
        }))
    }

    async fn describe_stream(
        &self,
        request: Request<v1::DescribeStreamRequest>,
    ) -> Result<Response<v1::DescribeStreamResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let peer = request.remote_addr();
        let name = request.into_inner().stream;
        // A producer describes the stream it appends to (to learn its tail): any scope on the
        // stream allows it; a describe shows no records.
        self.ctx.access.check_any(
            principal.as_deref(),
            &[Scope::Read, Scope::Append, Scope::Admin],
            &name,
        )?;
        let stream = self.ctx.route(&name, peer, principal.as_deref()).await?;
        let first_seq = self.ctx.star.first_seq(&stream).await?;
        let leader = match &self.ctx.fleet {
            Some(fleet) => fleet.leader_of(&name).await?,
            None => None,
        };
        Ok(Response::new(v1::DescribeStreamResponse {
            info: Some(info_led(&stream, first_seq, leader.as_ref())),
        }))
    }

    async fn list_streams(
        &self,
        request: Request<v1::ListStreamsRequest>,
    ) -> Result<Response<v1::ListStreamsResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let request = request.into_inner();
        // A listing shows names under its prefix: the token must read all of them.
        self.ctx
            .access
            .check(principal.as_deref(), Scope::Read, &request.prefix)?;
        let limit = match request.limit {
            0 => LIST_STREAMS_DEFAULT,
            n => n.min(LIST_STREAMS_MAX),
        } as usize;
        // One extra tells whether another page follows.
        let mut streams = match &self.ctx.fleet {
            // In a fleet the shared catalog knows every stream, wherever it was created; one
            // this star leads shows its live tail, the others their absorbed one.
            Some(fleet) => {
                let streams = self.ctx.star.streams();
                let metas = streams
                    .catalog()
                    .streams_with_prefix(&request.prefix, &request.start_after, limit + 1)
                    .await
                    .map_err(RequestError::from)?;
                // The tails of the streams another star leads, read in one go.
                let led: Vec<Option<Arc<StreamState>>> = metas
                    .iter()
                    .map(|meta| {
                        streams
                            .get_by_id(meta.id)
                            .filter(|state| fleet.leads(state.name()))
                    })
                    .collect();
                let others: Vec<u64> = metas
                    .iter()
                    .zip(&led)
                    .filter(|(_, led)| led.is_none())
                    .map(|(meta, _)| meta.id)
                    .collect();
                let mut tails = streams
                    .catalog()
                    .stream_tails(&others)
                    .await
                    .map_err(RequestError::from)?
                    .into_iter();
                let mut out = Vec::with_capacity(metas.len());
                for (meta, led) in metas.into_iter().zip(led) {
                    out.push(match led {
                        Some(state) => state,
                        None => Arc::new(StreamState::new(meta, tails.next().unwrap_or_default())),
                    });
                }
                out
            }
            None => self
                .ctx
                .star
                .streams()
                .list(&request.prefix, &request.start_after, limit + 1),
        };
        let more = streams.len() > limit;
        streams.truncate(limit);
        let next_start_after = match (more, streams.last()) {
            (true, Some(last)) => last.name().to_owned(),
            _ => String::new(),
        };
        Ok(Response::new(v1::ListStreamsResponse {
            // The trim point as last read: a describe reads it afresh.
            streams: streams
                .iter()
                .map(|s| info(s, s.first_seq_cached()))
                .collect(),
            next_start_after,
        }))
    }

    async fn delete_stream(
        &self,
        request: Request<v1::DeleteStreamRequest>,
    ) -> Result<Response<v1::DeleteStreamResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let name = request.into_inner().stream;
        self.ctx
            .access
            .check(principal.as_deref(), Scope::Admin, &name)?;
        match &self.ctx.fleet {
            // Deleted by its leader, which holds its in-flight appends.
            Some(fleet) => fleet.delete_stream(&self.ctx.star, &name).await?,
            None => self.ctx.star.streams().delete(&name).await?,
        }
        tracing::info!(stream = %name, "stream deleted");
        Ok(Response::new(v1::DeleteStreamResponse {}))
    }

    async fn reconfigure_stream(
        &self,
        request: Request<v1::ReconfigureStreamRequest>,
    ) -> Result<Response<v1::ReconfigureStreamResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let peer = request.remote_addr();
        let request = request.into_inner();
        self.ctx
            .access
            .check(principal.as_deref(), Scope::Admin, &request.stream)?;
        let retention = retention_from(request.retention)?;
        let class = class_from(request.storage_class)?;
        if self.ctx.fleet.is_some() {
            self.ctx
                .route(&request.stream, peer, principal.as_deref())
                .await?;
        }
        let streams = self.ctx.star.streams();
        if let Some(class) = class {
            let stream = streams.get_or_not_found(&request.stream)?;
            let was = stream.class();
            self.ctx
                .star
                .set_storage_class(&stream, class, RECLASS_TIMEOUT)
                .await?;
            if was != class {
                tracing::info!(stream = %request.stream, from = ?was, to = ?class, "storage class changed");
            }
        }
        // Written only when it changes: a class change that succeeded is not then reported as
        // failed by a retention write it did not need.
        if streams.get_or_not_found(&request.stream)?.retention() != retention {
            streams.set_retention(&request.stream, retention).await?;
            tracing::info!(stream = %request.stream, ?retention, "stream reconfigured");
        }
        let stream = streams.get_or_not_found(&request.stream)?;
        let first_seq = self.ctx.star.first_seq(&stream).await?;
        Ok(Response::new(v1::ReconfigureStreamResponse {
            info: Some(info(&stream, first_seq)),
        }))
    }

    async fn list_groups(
        &self,
        request: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let listed = groups::list(&self.ctx, principal.as_deref(), request.into_inner()).await?;
        Ok(Response::new(listed))
    }

    async fn describe_group(
        &self,
        request: Request<v1::DescribeGroupRequest>,
    ) -> Result<Response<v1::DescribeGroupResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let described =
            groups::describe(&self.ctx, principal.as_deref(), request.into_inner()).await?;
        Ok(Response::new(described))
    }

    async fn get_server_info(
        &self,
        request: Request<v1::GetServerInfoRequest>,
    ) -> Result<Response<v1::GetServerInfoResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let mut info = info::server_info(&self.ctx);
        info.store = nova_server::net::deployment_detail(principal.as_deref(), &info.store);
        Ok(Response::new(info))
    }
}
