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
        // prost fails only when the buffer cannot take the message, and room for all of it was
        // just reserved.
        item.encode(buf).map_err(|e| {
            Status::from(crate::RequestError::Internal(format!(
                "encoding a response: {e}"
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;
    use http_body::Body;
    use tonic::codec::{EncodeBody, SingleMessageCompressionOverride};
    use tonic::codegen::tokio_stream;

    #[tokio::test]
    async fn a_response_goes_out_as_prost_encodes_it() {
        let page = v1::ReadResponse {
            records: (0..64)
                .map(|seq| v1::SequencedRecord {
                    seq,
                    body: vec![seq as u8; 4096].into(),
                    ..Default::default()
                })
                .collect(),
            next_seq: 64,
            tail_seq: 64,
        };
        let source = tokio_stream::iter([Ok::<_, Status>(page.clone())]);
        let mut body = std::pin::pin!(EncodeBody::new_server(
            ExactCodec::<v1::ReadResponse, v1::ReadResponse>::default().encoder(),
            source,
            None,
            SingleMessageCompressionOverride::default(),
            None,
        ));
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx))
            .await
            .expect("a frame")
            .expect("no error");
        let data = frame.into_data().expect("a data frame");
        // The gRPC prefix: not compressed, then the length, big-endian.
        let len = page.encoded_len();
        assert_eq!(data[0], 0);
        assert_eq!(
            u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize,
            len
        );
        assert_eq!(data.len(), 5 + len);
        assert_eq!(v1::ReadResponse::decode(&data[5..]).unwrap(), page);
    }
}
