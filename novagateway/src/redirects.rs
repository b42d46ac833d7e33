//! A gateway never hands a star's redirect to its own clients. Its calls to the star follow
//! redirects themselves (`nova_proto::route`); one that still fails may carry the leader's
//! address, and a client told it would send its next call, and its token, straight to that
//! star, which a gateway's clients have no business reaching (and which a rogue star, or
//! anyone who can write the fleet's records, could name at will).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Drops the `leader` metadata from every response.
#[derive(Clone, Copy, Default)]
pub struct NoRedirectsLayer;

impl<S> tower_layer::Layer<S> for NoRedirectsLayer {
    type Service = NoRedirects<S>;

    fn layer(&self, inner: S) -> Self::Service {
        NoRedirects { inner }
    }
}

#[derive(Clone)]
pub struct NoRedirects<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower_service::Service<http::Request<B>> for NoRedirects<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // An error's status travels in the headers of a unary call's response.
            response.headers_mut().remove(nova_proto::error::LEADER);
            Ok(response)
        })
    }
}
