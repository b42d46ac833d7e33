//! Keeping what a response holds charged until the response has been sent. A handler returns
//! before tonic encodes its message and the transport sends it; the page (and its encoded copy)
//! lives on until then, and a slow consumer stretches that out. So a handler puts its charges
//! (a read slot, a share of the fetch pool) into the response's extensions as a [`Hold`], and
//! [`HoldLayer`] moves them into the response body, which drops them once its last frame is
//! out (or the call is cancelled).
//!
//! Such a response must be taken within `--send-timeout`: the layer starts its connection's
//! send clock with it (`conn::SendMark`), and a connection still holding it at the deadline is
//! closed, which frees the charge and whatever h2 buffered for it. A consumer that withholds
//! its window so loses its own connection, and holds the budget for no longer than that.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::conn::{Connections, SendMark, peer};

/// Charges a response holds until it is sent.
#[derive(Clone)]
pub struct Hold(#[allow(dead_code, reason = "held for its drop")] Arc<dyn Any + Send + Sync>);

impl Hold {
    pub fn new(held: impl Any + Send + Sync) -> Self {
        Self(Arc::new(held))
    }
}

/// A response body that lets go of its [`Hold`] (and stops its send clock) when it ends.
struct HeldBody {
    inner: tonic::body::Body,
    hold: Option<(Hold, SendMark)>,
}

impl HttpBody for HeldBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none() {
            self.hold = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Moves each response's [`Hold`] into its body, and times its sending.
#[derive(Clone)]
pub struct HoldLayer {
    connections: Arc<Connections>,
}

impl HoldLayer {
    pub fn new(connections: Arc<Connections>) -> Self {
        Self { connections }
    }
}

impl<S> tower_layer::Layer<S> for HoldLayer {
    type Service = HoldService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HoldService {
            inner,
            connections: self.connections.clone(),
        }
    }
}

#[derive(Clone)]
pub struct HoldService<S> {
    inner: S,
    connections: Arc<Connections>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for HoldService<S>
where
    S: tower_service::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let peer = peer(request.extensions());
        let connections = self.connections.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let (mut parts, body) = response.await?.into_parts();
            let body = match parts.extensions.remove::<Hold>() {
                Some(hold) => tonic::body::Body::new(HeldBody {
                    inner: body,
                    hold: Some((hold, connections.begin_send(peer))),
                }),
                None => body,
            };
            Ok(http::Response::from_parts(parts, body))
        })
    }
}
