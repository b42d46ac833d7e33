//! The gateway's gRPC services: the consumer-facing `nova.v1.Nova` (reads served here, stream
//! metadata forwarded to the star, writes refused), and `nova.v1.GatewayPeer` for the other
//! gateways of the cache tier.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use nova_proto::RequestError;
use nova_proto::server::gateway_peer_server::GatewayPeer;
use nova_proto::server::nova_server::Nova;
use nova_proto::v1;
use nova_server::net::Scope;

use crate::read::Reader;
use crate::tier::{MAX_PEER_RANGE, Tier};

#[derive(Clone)]
pub struct GatewayService {
    pub reader: Arc<Reader>,
    pub star_url: String,
    /// Throttles the read-failure log to a line a second per code.
    pub errors_logged: Arc<nova_server::shed::ShedLog>,
    pub health: Arc<crate::health::Health>,
    /// What each call's token may do (`--auth-tokens`).
    pub access: nova_server::net::Access,
    /// What `GetServerInfo` says that does not change while the gateway runs.
    pub identity: GatewayIdentity,
}

#[derive(Debug, Clone)]
pub struct GatewayIdentity {
    pub version: &'static str,
    /// The URL this instance advertises to its peers.
    pub id: String,
    pub started_at_ms: u64,
    pub store: String,
    pub max_read_bytes: u64,
    pub max_read_records: u32,
}

impl GatewayService {
    /// Counts a failed read by its code and logs it: the ones the gateway's own dependencies
    /// caused (the store, the star, a corrupt object) as warnings, at most one a second per
    /// code with the number left out; the ones the consumer asked for (a stream that is not
    /// there, a seq past retention) at debug.
    fn count_read_error(&self, request: &v1::ReadRequest, status: &Status) {
        let code = nova_core::metrics::code_name(status.code());
        self.reader
            .metrics
            .read_errors
            .with_label_values(&[code])
            .inc();
        let ours = matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::Internal
                | tonic::Code::DataLoss
                | tonic::Code::Unknown
        );
        if !ours {
            tracing::debug!(
                stream = request.stream,
                code,
                "read refused: {}",
                status.message()
            );
            return;
        }
        if let Some(unlogged) = self.errors_logged.admit(code) {
            tracing::warn!(
                stream = request.stream,
                start_seq = request.start_seq,
                code,
                unlogged_since_last = unlogged,
                "read failed: {}",
                status.message()
            );
        }
    }

    fn groups_are_the_stars(&self) -> Status {
        RequestError::Unimplemented(format!(
            "Kafka consumer groups are kept by the stars; ask the star at {}",
            self.star_url
        ))
        .into()
    }

    fn writes_go_to_the_star(&self) -> Status {
        RequestError::Unimplemented(format!(
            "novagateway serves reads; append and manage streams on the star at {}",
            self.star_url
        ))
        .into()
    }
}

type AckStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::AppendAck, Status>> + Send>>;

#[tonic::async_trait]
impl Nova for GatewayService {
    type AppendStream = AckStream;

    async fn append(
        &self,
        _request: Request<Streaming<nova_proto::wire::WireAppend>>,
    ) -> Result<Response<Self::AppendStream>, Status> {
        Err(self.writes_go_to_the_star())
    }

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let peer = request.remote_addr();
        let request = request.into_inner();
        self.access
            .check(principal.as_deref(), Scope::Read, &request.stream)?;
        match self.reader.read(request.clone(), peer).await {
            Ok((response, hold)) => {
                let mut response = Response::new(response);
                response.extensions_mut().insert(hold);
                Ok(response)
            }
            Err(status) => {
                self.count_read_error(&request, &status);
                Err(status)
            }
        }
    }

    async fn resolve_refs(
        &self,
        request: Request<v1::ResolveRefsRequest>,
    ) -> Result<Response<v1::ResolveRefsResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let request = request.into_inner();
        self.access
            .check(principal.as_deref(), Scope::Read, &request.stream)?;
        self.reader
            .star
            .call(&request.stream.clone(), |mut star| {
                let request = request.clone();
                async move { star.resolve_refs(request).await }
            })
            .await
    }

    async fn create_stream(
        &self,
        _request: Request<v1::CreateStreamRequest>,
    ) -> Result<Response<v1::CreateStreamResponse>, Status> {
        Err(self.writes_go_to_the_star())
    }

    async fn describe_stream(
        &self,
        request: Request<v1::DescribeStreamRequest>,
    ) -> Result<Response<v1::DescribeStreamResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let request = request.into_inner();
        // As on the star: any scope on the stream allows describing it.
        self.access.check_any(
            principal.as_deref(),
            &[Scope::Read, Scope::Append, Scope::Admin],
            &request.stream,
        )?;
        self.reader
            .star
            .call(&request.stream.clone(), |mut star| {
                let request = request.clone();
                async move { star.describe_stream(request).await }
            })
            .await
    }

    async fn list_streams(
        &self,
        request: Request<v1::ListStreamsRequest>,
    ) -> Result<Response<v1::ListStreamsResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let request = request.into_inner();
        self.access
            .check(principal.as_deref(), Scope::Read, &request.prefix)?;
        self.reader.star.seed().list_streams(request).await
    }

    async fn list_groups(
        &self,
        _request: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        Err(self.groups_are_the_stars())
    }

    async fn describe_group(
        &self,
        _request: Request<v1::DescribeGroupRequest>,
    ) -> Result<Response<v1::DescribeGroupResponse>, Status> {
        Err(self.groups_are_the_stars())
    }

    async fn delete_stream(
        &self,
        _request: Request<v1::DeleteStreamRequest>,
    ) -> Result<Response<v1::DeleteStreamResponse>, Status> {
        Err(self.writes_go_to_the_star())
    }

    async fn reconfigure_stream(
        &self,
        _request: Request<v1::ReconfigureStreamRequest>,
    ) -> Result<Response<v1::ReconfigureStreamResponse>, Status> {
        Err(self.writes_go_to_the_star())
    }

    async fn get_server_info(
        &self,
        request: Request<v1::GetServerInfoRequest>,
    ) -> Result<Response<v1::GetServerInfoResponse>, Status> {
        let principal = nova_server::net::principal(&request);
        let detail = |text: &str| nova_server::net::deployment_detail(principal.as_deref(), text);
        let identity = &self.identity;
        Ok(Response::new(v1::GetServerInfoResponse {
            version: identity.version.to_owned(),
            role: "gateway".to_owned(),
            id: identity.id.clone(),
            ready: self.health.is_ready(),
            not_ready_reason: self.health.problem(),
            started_at_ms: identity.started_at_ms,
            limits: Some(v1::ServerLimits {
                max_read_bytes: identity.max_read_bytes,
                max_read_records: identity.max_read_records,
                ..v1::ServerLimits::default()
            }),
            store: detail(&identity.store),
            star: detail(&self.star_url),
            ..v1::GetServerInfoResponse::default()
        }))
    }
}

#[derive(Clone)]
pub struct PeerService {
    pub tier: Arc<Tier>,
    pub access: nova_server::net::Access,
    /// The fetch pool, which a range served to a peer is charged to like a read's sections.
    pub pool: nova_core::budget::Budget,
}

/// How long a range served to a peer may wait for room in the fetch pool.
const PEER_CHARGE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

#[tonic::async_trait]
impl GatewayPeer for PeerService {
    async fn fetch_range(
        &self,
        request: Request<v1::FetchRangeRequest>,
    ) -> Result<Response<v1::FetchRangeResponse>, Status> {
        // An object holds any stream's records: only a token that reads every stream (a peer
        // gateway's) may fetch one.
        let principal = nova_server::net::principal(&request);
        self.access.check(principal.as_deref(), Scope::Read, "")?;
        let request = request.into_inner();
        // Only objects that hold records: a peer has no business with manifests or markers,
        // and without tokens anyone may call this.
        if !nova_core::keys::is_record_object(&request.object_key) {
            return Err(RequestError::InvalidRequest(format!(
                "{:?} is not an object that holds records (a data object or a chain slot)",
                request.object_key
            ))
            .into());
        }
        if request.offset.checked_add(request.len).is_none() {
            return Err(RequestError::InvalidRequest(format!(
                "range of {} bytes at offset {} ends past the largest offset",
                request.len, request.offset
            ))
            .into());
        }
        if request.len > MAX_PEER_RANGE {
            return Err(RequestError::InvalidRequest(format!(
                "range of {} bytes is over the {MAX_PEER_RANGE}-byte limit",
                request.len
            ))
            .into());
        }
        // The range fetched (or cached) and its encoded copy in the response, held until the
        // response is sent. The wait for room is short: the asking gateway holds its own pool
        // while it waits for this, so waiting long could deadlock two gateways whose pools are
        // full of reads of each other's objects. Refused, it fetches the range from the object
        // store itself.
        let Ok(charge) =
            tokio::time::timeout(PEER_CHARGE_WAIT, self.pool.acquire(2 * request.len)).await
        else {
            return Err(RequestError::CapReached {
                cap: "--fetch-inflight",
                limit: self.pool.capacity(),
                what: "this gateway's fetch pool is full; fetch the range from the object store",
                retry_after: std::time::Duration::from_millis(100),
            }
            .into());
        };
        let data = self
            .tier
            .serve_owned(
                &request.object_key,
                request.offset,
                request.len,
                request.keep,
            )
            .await
            .map_err(|e| match e {
                nova_core::object_store::StoreError::NotFound { key } => {
                    Status::from(RequestError::ObjectNotFound(key))
                }
                other => Status::from(RequestError::from(other)),
            })?;
        let mut response = Response::new(v1::FetchRangeResponse { data });
        response
            .extensions_mut()
            .insert(nova_server::net::hold::Hold::new(charge));
        Ok(response)
    }
}
