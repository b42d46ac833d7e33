//! The servers' gRPC codec: prost's, except that a response is encoded into a buffer reserved
//! at its exact encoded length.
//!
//! prost writes a message field by field into tonic's encode buffer, which starts at 8 KiB and
//! doubles as it fills: a 3 MiB page of records went through buffers of 256 KiB, 512 KiB, 1 MiB,
//! 2 MiB and 4 MiB, each mapped fresh (the allocator maps buffers of 128 KiB or more on their
//! own) and written into pages that fault on first touch, and ended holding up to twice its
//! size. Reserving the length first makes it one buffer of the page's size, which the gateway's
//! allocator can serve from a freed one (`nova_core::allocator::reuse`).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder};

/// prost's codec with [`ExactEncoder`]s (named in build.rs as the servers' codec).
#[derive(Debug, Clone)]
pub struct ExactCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ExactCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ExactCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ExactEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ExactEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
}

/// Encodes a message into room reserved for its whole length.
#[derive(Debug, Clone)]
pub struct ExactEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for ExactEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        // The room is there: write the fields without prost measuring the message again.
        item.encode_raw(buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use http_body::Body;
    use tonic::codec::{EncodeBody, SingleMessageCompressionOverride};
    use tonic::codegen::tokio_stream;

    fn page(records: u64, body: usize) -> v1::ReadResponse {
        v1::ReadResponse {
            records: (0..records)
                .map(|seq| v1::SequencedRecord {
                    seq,
                    body: vec![seq as u8; body].into(),
                    timestamp: 1_700_000_000_000 + seq,
                    ..Default::default()
                })
                .collect(),
            next_seq: records,
            tail_seq: records + 1,
        }
    }

    /// Every byte a server's response body carries for `messages`, encoded by `encoder`.
    async fn body_bytes<E>(encoder: E, messages: Vec<v1::ReadResponse>) -> Vec<u8>
    where
        E: Encoder<Item = v1::ReadResponse, Error = Status> + Send + 'static,
    {
        let source = tokio_stream::iter(messages.into_iter().map(Ok::<_, Status>));
        let mut body = std::pin::pin!(EncodeBody::new_server(
            encoder,
            source,
            None,
            SingleMessageCompressionOverride::default(),
            None,
        ));
        let mut bytes = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            if let Ok(data) = frame.expect("no error").into_data() {
                bytes.extend_from_slice(&data);
            }
        }
        bytes
    }

    #[tokio::test]
    async fn responses_go_out_byte_for_byte_as_prosts_codec_sends_them() {
        // A large page (past the allocator's 128 KiB), a small one, and an empty one, on one
        // stream: later messages reuse the stream's buffer.
        let messages = vec![page(64, 4096), page(3, 10), v1::ReadResponse::default()];
        let exact = body_bytes(
            ExactCodec::<v1::ReadResponse, v1::ReadResponse>::default().encoder(),
            messages.clone(),
        )
        .await;
        let prost = body_bytes(
            ProstCodec::<v1::ReadResponse, v1::ReadResponse>::default().encoder(),
            messages.clone(),
        )
        .await;
        assert_eq!(exact, prost);
        // And each is a gRPC message: not compressed, its length big-endian, then prost's bytes.
        let mut rest = &exact[..];
        for message in messages {
            let len = message.encoded_len();
            assert_eq!(rest[0], 0);
            assert_eq!(
                u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize,
                len
            );
            assert_eq!(
                v1::ReadResponse::decode(&rest[5..5 + len]).unwrap(),
                message
            );
            rest = &rest[5 + len..];
        }
        assert!(rest.is_empty());
    }
}
