//! The SDK's bearer token: every call carries it, to the star connected to and to the leader a
//! redirect names, and nothing carries it when none is configured.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

use nova_client::{Client, ClientConfig, RetryPolicy};
use nova_proto::server::nova_server::{Nova, NovaServer};
use nova_proto::v1;

/// A star that records the `authorization` header of each describe, and either redirects it
/// to `leader` or answers it.
#[derive(Clone)]
struct Recorder {
    leader: Option<String>,
    seen: Arc<Mutex<Vec<Option<String>>>>,
}

impl Recorder {
    fn record<T>(&self, request: &Request<T>) {
        let header = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or("<not ascii>").to_owned());
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(header);
    }

    fn seen(&self) -> Vec<Option<String>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

type AckStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::AppendAck, Status>> + Send>>;

#[tonic::async_trait]
impl Nova for Recorder {
    type AppendStream = AckStream;

    async fn append(
        &self,
        _: Request<Streaming<nova_proto::wire::WireAppend>>,
    ) -> Result<Response<AckStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn read(
        &self,
        _: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn resolve_refs(
        &self,
        _: Request<v1::ResolveRefsRequest>,
    ) -> Result<Response<v1::ResolveRefsResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn create_stream(
        &self,
        _: Request<v1::CreateStreamRequest>,
    ) -> Result<Response<v1::CreateStreamResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn describe_stream(
        &self,
        request: Request<v1::DescribeStreamRequest>,
    ) -> Result<Response<v1::DescribeStreamResponse>, Status> {
        self.record(&request);
        if let Some(leader) = &self.leader {
            let mut status = Status::unavailable("not the leader");
            status.metadata_mut().insert(
                nova_proto::error::LEADER,
                leader.parse().map_err(|_| Status::internal("bad url"))?,
            );
            return Err(status);
        }
        Ok(Response::new(v1::DescribeStreamResponse {
            info: Some(v1::StreamInfo {
                name: request.into_inner().stream,
                ..Default::default()
            }),
        }))
    }
    async fn list_streams(
        &self,
        _: Request<v1::ListStreamsRequest>,
    ) -> Result<Response<v1::ListStreamsResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn delete_stream(
        &self,
        _: Request<v1::DeleteStreamRequest>,
    ) -> Result<Response<v1::DeleteStreamResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn reconfigure_stream(
        &self,
        _: Request<v1::ReconfigureStreamRequest>,
    ) -> Result<Response<v1::ReconfigureStreamResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn list_groups(
        &self,
        _: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn describe_group(
        &self,
        _: Request<v1::DescribeGroupRequest>,
    ) -> Result<Response<v1::DescribeGroupResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn get_server_info(
        &self,
        _: Request<v1::GetServerInfoRequest>,
    ) -> Result<Response<v1::GetServerInfoResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

async fn serve(star: Recorder) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NovaServer::new(star))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    addr
}

/// A seed star that redirects to a leader star, both recording what they were sent.
async fn seed_and_leader() -> (Recorder, Recorder, String) {
    let leader = Recorder {
        leader: None,
        seen: Arc::default(),
    };
    let leader_url = format!("http://{}", serve(leader.clone()).await);
    let seed = Recorder {
        leader: Some(leader_url),
        seen: Arc::default(),
    };
    let seed_url = format!("http://{}", serve(seed.clone()).await);
    (seed, leader, seed_url)
}

#[tokio::test]
async fn the_token_reaches_the_star_and_the_leader_it_redirects_to() {
    let (seed, leader, url) = seed_and_leader().await;
    let config = ClientConfig::new([url])
        .with_retry(RetryPolicy::none())
        .with_token("s3cr3t-t0ken")
        .expect("a valid token");
    assert!(
        !format!("{config:?}").contains("s3cr3t"),
        "the config prints its token: {config:?}"
    );
    let client = Client::connect_with(config).await.expect("connect");
    let info = client.describe_stream("orders").await.expect("describe");
    assert_eq!(info.name, "orders");
    let bearer = Some("Bearer s3cr3t-t0ken".to_owned());
    assert_eq!(seed.seen(), vec![bearer.clone()]);
    assert_eq!(leader.seen(), vec![bearer]);
}

#[tokio::test]
async fn without_a_token_no_authorization_header_is_sent() {
    let (seed, leader, url) = seed_and_leader().await;
    let client = Client::connect_with(ClientConfig::new([url]).with_retry(RetryPolicy::none()))
        .await
        .expect("connect");
    client.describe_stream("orders").await.expect("describe");
    assert_eq!(seed.seen(), vec![None]);
    assert_eq!(leader.seen(), vec![None]);
}

#[test]
fn tokens_that_cannot_travel_in_a_header_are_refused_without_being_shown() {
    for bad in ["", "has space", "tab\there", "naïve", "line\nbreak"] {
        let err = ClientConfig::default()
            .with_token(bad)
            .expect_err("refused");
        let message = err.to_string();
        assert!(message.contains("printable ASCII"), "{message}");
        if !bad.is_empty() {
            assert!(
                !message.contains(bad),
                "the error shows the token: {message}"
            );
        }
    }
}
