//! Hostile clients against a real gateway: a token with no grants that opens a thousand small
//! calls and never finishes their messages, and fetches from the peer API of objects that hold
//! no records. The gateway's memory stays bounded, a good token is served throughout, and every
//! refusal says what it is.

use std::time::Duration;

use nova_client::{Client, ClientConfig};
use nova_server::net::auth::digest_hex;
use nova_testkit::raw_h2::unfinished_calls;
use nova_testkit::{Moto, Novad, NovadBuilder, workspace_binary};

const GOOD: &str = "good-token-0123456789abcdef";
const INTRUDER: &str = "intruder-token-0123456789abcdef";

fn with_aws(builder: NovadBuilder, moto: &Moto) -> NovadBuilder {
    builder
        .args([
            "--s3-bucket",
            "history",
            "--s3-endpoint",
            &moto.endpoint(),
            "--s3-path-style",
        ])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "testtest")
        .env("AWS_EC2_METADATA_DISABLED", "true")
}

fn resident(process: &Novad) -> f64 {
    process.metric("nova_process_resident_bytes").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_bounds_unfinished_messages_and_serves_only_record_objects() {
    let moto = Moto::start();
    moto.create_bucket("history");
    let star = with_aws(NovadBuilder::new(workspace_binary("novad")), &moto).start();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "good read: sha256:{}\nintruder , sha256:{}\n",
            digest_hex(GOOD),
            digest_hex(INTRUDER)
        ),
    )
    .unwrap();
    let gateway = with_aws(
        NovadBuilder::gateway(workspace_binary("novagateway")),
        &moto,
    )
    .args(["--star", &star.url()])
    .args(["--auth-tokens", tokens.to_str().unwrap()])
    .start();
    Client::connect(&star.url())
        .await
        .unwrap()
        .create_stream("good")
        .await
        .unwrap();
    let good = Client::connect_with(ClientConfig::new([gateway.url()]).with_token(GOOD).unwrap())
        .await
        .unwrap();
    good.describe_stream("good").await.unwrap();
    let before = resident(&gateway);

    // A thousand describes whose 64 KiB messages stop one byte short, over two connections.
    let calls = unfinished_calls(
        gateway.port(),
        "/nova.v1.Nova/DescribeStream",
        INTRUDER,
        2,
        500,
        64 << 10,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = resident(&gateway) - before;
    eprintln!(
        "1,000 unfinished describes grew the gateway by {:.1} MiB",
        grown / (1 << 20) as f64
    );
    assert!(
        grown < 24.0 * (1 << 20) as f64,
        "1,000 unfinished 64 KiB messages grew the gateway by {grown} bytes"
    );
    let shed = gateway
        .metric("nova_gateway_sheds_total{cap=\"request_bodies\"}")
        .unwrap();
    assert!(shed >= 900.0, "{shed} refused at their prefix");
    // The good token is served meanwhile.
    good.describe_stream("good").await.unwrap();
    // Every call is answered: refused at its prefix, or ended at its deadline.
    for (response, _send) in calls {
        let answered = tokio::time::timeout(Duration::from_secs(15), response).await;
        assert!(matches!(answered, Ok(Ok(_))), "a call left unanswered");
    }

    // The peer API serves objects that hold records, and nothing else under the prefix.
    let channel = tonic::transport::Endpoint::from_shared(gateway.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let token: tonic::metadata::MetadataValue<_> = format!("Bearer {GOOD}").parse().unwrap();
    let mut peer = nova_proto::v1::gateway_peer_client::GatewayPeerClient::with_interceptor(
        channel,
        move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
            Ok(request)
        },
    );
    for key in [
        "streams/star-1/00000000000000000001",
        "other-app/secrets.txt",
    ] {
        let refused = peer
            .fetch_range(nova_proto::v1::FetchRangeRequest {
                object_key: key.into(),
                offset: 0,
                len: 10,
                keep: true,
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{key}");
        assert!(refused.message().contains("holds records"), "{refused}");
    }
    // A range past the largest offset is refused, not computed.
    let data = nova_core::keys::data_key("star-1", 1, 0, 10, 7);
    let refused = peer
        .fetch_range(nova_proto::v1::FetchRangeRequest {
            object_key: data,
            offset: u64::MAX - 4,
            len: 10,
            keep: true,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("largest offset"), "{refused}");
}
