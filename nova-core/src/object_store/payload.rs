//! An object body made of shared slices, so a flight is written without first being copied into
//! one buffer.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

#[derive(Debug, Clone, Default)]
pub struct PutPayload {
    parts: Arc<[Bytes]>,
    len: u64,
}

impl PutPayload {
    pub fn from_parts(parts: Vec<Bytes>) -> Self {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        Self {
            parts: parts.into(),
            len,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Copies the payload into one buffer. For tests and small objects only.
    pub fn to_bytes(&self) -> Bytes {
        if self.parts.len() == 1 {
            return self.parts[0].clone();
        }
        let mut buf = BytesMut::with_capacity(self.len as usize);
        for part in self.parts.iter() {
            buf.extend_from_slice(part);
        }
        buf.freeze()
    }

    /// An HTTP body that streams the parts in order. Cheap: every clone shares the slices.
    pub fn body(&self) -> PayloadBody {
        PayloadBody {
            payload: self.clone(),
            next: 0,
            remaining: self.len,
        }
    }
}

impl From<Bytes> for PutPayload {
    fn from(bytes: Bytes) -> Self {
        Self::from_parts(vec![bytes])
    }
}

impl From<Vec<u8>> for PutPayload {
    fn from(bytes: Vec<u8>) -> Self {
        Self::from(Bytes::from(bytes))
    }
}

impl From<&'static str> for PutPayload {
    fn from(s: &'static str) -> Self {
        Self::from(Bytes::from_static(s.as_bytes()))
    }
}

pub struct PayloadBody {
    payload: PutPayload,
    next: usize,
    /// Bytes in the parts from `next` on. Kept rather than summed: a flight of referenced
    /// records has thousands of parts, and the transport asks after each frame.
    remaining: u64,
}

impl Body for PayloadBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        while let Some(part) = self.payload.parts.get(self.next).cloned() {
            self.next += 1;
            if !part.is_empty() {
                self.remaining -= part.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(part))));
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
