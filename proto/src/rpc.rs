//! Counting every gRPC call by method and the code it ended with, and timing it: a tower layer
//! in front of a server's services, reporting to an [`RpcObserver`].
//!
//! The code is read where gRPC puts it: in the response headers of a trailers-only answer (an
//! error before any message), else in the trailers that end the body. A call whose body is
//! dropped before its end (the client went away) ends `Cancelled`. The time runs from the
//! request to the end of the response body, so a streaming call is timed whole.
//!
//! Method labels come from a fixed list of the methods this crate's services and tonic's
//! health and reflection services define; any other path counts as `unknown`, so a client
//! cannot grow the label set.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use tonic::Code;

use crate::clock::{Clock, Instant};

/// Where the layer reports calls.
pub trait RpcObserver: Clone + Send + Sync + Unpin + 'static {
    /// Held from the call's start until its response ends (a mark that its connection is
    /// busy, say); made from the request.
    type Guard: Send + Unpin + 'static;

    fn begin<B>(&self, request: &http::Request<B>) -> Self::Guard;

    fn observe(&self, method: &'static str, code: Code, seconds: f64);
}

/// The methods that get a label of their own.
const METHODS: &[(&str, &str)] = &[
    ("/nova.v1.Nova/Append", "Append"),
    ("/nova.v1.Nova/Read", "Read"),
    ("/nova.v1.Nova/ResolveRefs", "ResolveRefs"),
    ("/nova.v1.Nova/CreateStream", "CreateStream"),
    ("/nova.v1.Nova/DescribeStream", "DescribeStream"),
    ("/nova.v1.Nova/ListStreams", "ListStreams"),
    ("/nova.v1.Nova/DeleteStream", "DeleteStream"),
    ("/nova.v1.Nova/ReconfigureStream", "ReconfigureStream"),
    ("/nova.v1.Nova/GetServerInfo", "GetServerInfo"),
    ("/nova.v1.GatewayPeer/FetchRange", "FetchRange"),
    ("/grpc.health.v1.Health/Check", "HealthCheck"),
    ("/grpc.health.v1.Health/Watch", "HealthWatch"),
    (
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "ServerReflectionInfo",
    ),
    (
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "ServerReflectionInfo",
    ),
];

/// Every method label the layer can report, `unknown` included (for creating series at zero).
pub fn method_labels() -> impl Iterator<Item = &'static str> {
    let mut labels: Vec<&'static str> = METHODS.iter().map(|(_, label)| *label).collect();
    labels.dedup();
    labels.into_iter().chain(["unknown"])
}

fn method_label(path: &str) -> &'static str {
    METHODS
        .iter()
        .find(|(known, _)| *known == path)
        .map_or("unknown", |(_, label)| label)
}

/// The code named by a `grpc-status` header or trailer.
fn code_in(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(Code::from_i32(value.parse().ok()?))
}

#[derive(Clone)]
pub struct RpcLayer<O> {
    observer: O,
    clock: Clock,
}

impl<O: RpcObserver> RpcLayer<O> {
    pub fn new(observer: O, clock: Clock) -> Self {
        Self { observer, clock }
    }
}

impl<S, O: RpcObserver> tower_layer::Layer<S> for RpcLayer<O> {
    type Service = RpcService<S, O>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            observer: self.observer.clone(),
            clock: self.clock,
        }
    }
}

#[derive(Clone)]
pub struct RpcService<S, O> {
    inner: S,
    observer: O,
    clock: Clock,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, O, B> tower_service::Service<http::Request<B>> for RpcService<S, O>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    O: RpcObserver,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = Call {
            method: method_label(request.uri().path()),
            started: self.clock.now(),
            clock: self.clock,
            observer: self.observer.clone(),
            code: None,
            reported: false,
            _guard: self.observer.begin(&request),
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut call = call;
            match response.await {
                Ok(response) => {
                    // A trailers-only answer: the code is already here, and nothing follows.
                    call.code = code_in(response.headers());
                    let (parts, body) = response.into_parts();
                    let body = ObservedBody { inner: body, call };
                    Ok(http::Response::from_parts(
                        parts,
                        tonic::body::Body::new(body),
                    ))
                }
                Err(err) => {
                    call.code = Some(Code::Internal);
                    Err(err)
                }
            }
        })
    }
}

/// One call being observed; reports once, when its response ends or is dropped.
struct Call<O: RpcObserver> {
    method: &'static str,
    started: Instant,
    clock: Clock,
    observer: O,
    code: Option<Code>,
    reported: bool,
    _guard: O::Guard,
}

impl<O: RpcObserver> Call<O> {
    fn report(&mut self, code: Code) {
        if !self.reported {
            self.reported = true;
            let seconds = self.clock.since(self.started).as_secs_f64();
            self.observer.observe(self.method, code, seconds);
        }
    }
}

impl<O: RpcObserver> Drop for Call<O> {
    fn drop(&mut self) {
        // Ended without trailers: either the answer's code came in the headers, or the client
        // went away mid-call.
        let code = self.code.unwrap_or(Code::Cancelled);
        self.report(code);
    }
}

struct ObservedBody<O: RpcObserver> {
    inner: tonic::body::Body,
    call: Call<O>,
}

impl<O: RpcObserver> Body for ObservedBody<O> {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = code_in(trailers).unwrap_or(Code::Unknown);
                    this.call.code = Some(code);
                    this.call.report(code);
                }
            }
            Some(Err(status)) => {
                this.call.code = Some(status.code());
                this.call.report(status.code());
            }
            None => {
                let code = this.call.code.unwrap_or(Code::Unknown);
                this.call.report(code);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_methods_get_a_label() {
        assert_eq!(method_label("/nova.v1.Nova/Append"), "Append");
        assert_eq!(
            method_label("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            "ServerReflectionInfo"
        );
        assert_eq!(method_label("/nova.v1.Nova/Invented"), "unknown");
        assert_eq!(method_label("/../../etc/passwd"), "unknown");
        let labels: Vec<_> = method_labels().collect();
        assert!(labels.contains(&"unknown") && labels.contains(&"ReconfigureStream"));
        assert_eq!(
            labels
                .iter()
                .filter(|l| **l == "ServerReflectionInfo")
                .count(),
            1
        );
    }

    #[test]
    fn the_code_is_read_from_grpc_status() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(code_in(&headers), None);
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
        assert_eq!(code_in(&headers), Some(Code::Unavailable));
    }
}
