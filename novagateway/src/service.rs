//! The gateway's gRPC services: the consumer-facing `nova.v1.Nova` (reads served here, stream
//! metadata forwarded to the star, writes refused), and `nova.v1.GatewayPeer` for the other
//! gateways of the cache tier.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use nova_proto::RequestError;
use nova_proto::server::gateway_peer_server::GatewayPeer;
use nova_proto::server::nova_server::Nova;
use nova_proto::v1;

use crate::read::Reader;
use crate::tier::Tier;

#[derive(Clone)]
pub struct GatewayService {
    pub reader: Arc<Reader>,
    pub star_url: String,
}

impl GatewayService {
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
        self.reader
            .read(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn resolve_refs(
        &self,
        request: Request<v1::ResolveRefsRequest>,
    ) -> Result<Response<v1::ResolveRefsResponse>, Status> {
        let request = request.into_inner();
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
        let request = request.into_inner();
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
        self.reader
            .star
            .seed()
            .list_streams(request.into_inner())
            .await
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
}

#[derive(Clone)]
pub struct PeerService {
    pub tier: Arc<Tier>,
}

/// The largest range a peer serves: a section (sections are capped at 1 MiB unless a single
/// record is larger, and records are capped at the star's --max-record-bytes).
const MAX_PEER_RANGE: u64 = 128 << 20;

#[tonic::async_trait]
impl GatewayPeer for PeerService {
    async fn fetch_range(
        &self,
        request: Request<v1::FetchRangeRequest>,
    ) -> Result<Response<v1::FetchRangeResponse>, Status> {
        let request = request.into_inner();
        if request.len > MAX_PEER_RANGE {
            return Err(RequestError::InvalidRequest(format!(
                "range of {} bytes is over the {MAX_PEER_RANGE}-byte limit",
                request.len
            ))
            .into());
        }
        let data = self
            .tier
            .serve_owned(&request.object_key, request.offset, request.len)
            .await
            .map_err(|e| match e {
                nova_core::object_store::StoreError::NotFound { key } => {
                    Status::from(RequestError::ObjectNotFound(key))
                }
                other => Status::from(RequestError::Unavailable(other.to_string())),
            })?;
        Ok(Response::new(v1::FetchRangeResponse { data }))
    }
}
