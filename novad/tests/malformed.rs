//! Frames that are not valid AppendRequests get a clear INVALID_ARGUMENT that names the problem;
//! the server neither panics nor applies anything, and keeps serving.

mod common;

use bytes::{Buf, BufMut};
use prost::Message;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use common::*;
use nova_proto::v1;

/// Sends whatever bytes it is given as a gRPC message, and hands back raw response messages.
#[derive(Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

async fn send_raw(url: &str, frames: Vec<Vec<u8>>) -> (Vec<v1::AppendAck>, Option<tonic::Status>) {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let request = tonic::Request::new(futures::stream::iter(frames));
    let path = http::uri::PathAndQuery::from_static("/nova.v1.Nova/Append");
    let mut acks = Vec::new();
    let mut responses = match grpc.streaming(request, path, RawCodec).await {
        Ok(response) => response.into_inner(),
        Err(status) => return (acks, Some(status)),
    };
    loop {
        match responses.message().await {
            Ok(Some(raw)) => acks.push(v1::AppendAck::decode(&raw[..]).unwrap()),
            Ok(None) => return (acks, None),
            Err(status) => return (acks, Some(status)),
        }
    }
}

fn valid_frame(stream: &str, body: &str) -> Vec<u8> {
    v1::AppendRequest {
        stream: stream.into(),
        records: vec![v1::Record {
            body: bytes::Bytes::from(body.to_owned()),
            headers: vec![],
            timestamp: None,
        }],
        match_seq_num: None,
    }
    .encode_to_vec()
}

#[tokio::test]
async fn a_malformed_request_is_refused_and_the_session_goes_on() {
    let novad = novad().start();
    let client = client(&novad).await;
    client.create_stream("s").await.unwrap();
    // Well framed for gRPC, but not protobuf: a varint that never ends.
    let garbage = vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x12];
    let (acks, status) = send_raw(
        &novad.url(),
        vec![
            valid_frame("s", "before"),
            garbage,
            valid_frame("s", "after"),
        ],
    )
    .await;
    assert!(status.is_none(), "the session ends normally: {status:?}");
    assert_eq!(acks.len(), 3, "every request is answered");
    assert_eq!((acks[0].start_seq, acks[0].end_seq), (0, 1));
    let error = acks[1]
        .error
        .as_ref()
        .expect("the malformed request is refused");
    assert_eq!(error.code, Code::InvalidArgument as i32);
    assert!(
        error.message.contains("malformed append request"),
        "{}",
        error.message
    );
    assert_eq!((acks[2].start_seq, acks[2].end_seq), (1, 2));
    // Nothing of the bad request was applied.
    assert_eq!(read_all(&client, "s").await, ["before", "after"]);
}

#[tokio::test]
async fn a_record_with_invalid_utf8_in_the_stream_name_is_refused() {
    let novad = novad().start();
    // Field 1 (stream) declared as a string but holding invalid UTF-8.
    let frame = vec![0x0a, 0x02, 0xc3, 0x28];
    let (acks, status) = send_raw(&novad.url(), vec![frame]).await;
    assert!(status.is_none(), "{status:?}");
    let error = acks[0].error.as_ref().expect("refused");
    assert_eq!(error.code, Code::InvalidArgument as i32, "{error:?}");
    assert!(error.message.contains("not UTF-8"), "{}", error.message);
}
