//! What a Nova server puts between the network and its gRPC services: TLS (`tls`), scoped
//! tokens (`auth`), and limits on connections (`conn`), configured by the same flags in novad
//! and novagateway (`ListenerArgs`).

pub mod auth;
pub mod conn;
pub mod hold;
pub mod recycle;
pub mod shares;
pub mod small;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use nova_proto::units::{ByteSize, DurationArg};
use tokio_util::sync::CancellationToken;

pub use auth::{Principal, Scope, Tokens};
pub use conn::{ConnLimits, ConnMetrics, Connections};
pub use tls::{ReloadingTls, TlsFiles};

/// The flags of a gRPC listener, the same in every server binary.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerArgs {
    /// The listener's TLS certificate chain (PEM). With --tls-key, the listener speaks only TLS;
    /// without, plain text (for loopback; a non-loopback address without TLS is warned about at
    /// start). Reloaded on SIGHUP and when the file changes.
    #[arg(
        long,
        env = "NOVA_TLS_CERT",
        requires = "tls_key",
        help_heading = "Security"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(
        long,
        env = "NOVA_TLS_KEY",
        requires = "tls_cert",
        help_heading = "Security"
    )]
    pub tls_key: Option<PathBuf>,

    /// Mutual TLS: only clients with a certificate signed by a CA in this file (PEM) may
    /// connect; the others fail the handshake.
    #[arg(
        long,
        env = "NOVA_TLS_CLIENT_CA",
        requires = "tls_cert",
        help_heading = "Security"
    )]
    pub tls_client_ca: Option<PathBuf>,

    /// Bearer tokens this server accepts, with what each may do (see docs/security.md). Without
    /// it every call is served. A call without a listed token is refused with
    /// UNAUTHENTICATED, one outside its token's grants with PERMISSION_DENIED. Reloaded on
    /// SIGHUP and when the file changes.
    #[arg(long, env = "NOVA_AUTH_TOKENS", help_heading = "Security")]
    pub auth_tokens: Option<PathBuf>,

    /// Connections open at once on the gRPC listener. A new connection past it is closed at
    /// once and counted; open connections are never cut.
    #[arg(long, env = "NOVA_MAX_CONNECTIONS", default_value_t = nova_core::limits::MAX_CONNECTIONS, help_heading = "Budgets")]
    pub max_connections: u32,

    /// HTTP/2 streams (calls) open at once on one connection; a client opening more has the
    /// extra refused by HTTP/2 (REFUSED_STREAM) and retries them.
    #[arg(long, env = "NOVA_MAX_CONCURRENT_STREAMS", default_value_t = nova_core::limits::MAX_CONCURRENT_STREAMS, help_heading = "Budgets")]
    pub max_concurrent_streams: u32,

    /// Bytes of request headers (gRPC metadata, the token included) one call may send; a
    /// larger header list is refused by HTTP/2 before any of it reaches a handler.
    #[arg(long, env = "NOVA_MAX_HEADER_LIST_BYTES", default_value_t = ByteSize(nova_core::limits::MAX_HEADER_LIST_BYTES), help_heading = "Budgets")]
    pub max_header_list_bytes: ByteSize,

    /// How long a new connection may take to finish its TLS handshake and send its first
    /// request; then it is closed and counted.
    #[arg(
        long,
        env = "NOVA_FIRST_REQUEST_TIMEOUT",
        default_value = "10s",
        help_heading = "Budgets"
    )]
    pub first_request_timeout: DurationArg,

    /// A connection with no call in progress for this long is closed (clients reconnect when
    /// they next call). Calls waiting at a stream's tail count as in progress.
    #[arg(
        long,
        env = "NOVA_IDLE_TIMEOUT",
        default_value = "10m",
        help_heading = "Budgets"
    )]
    pub idle_timeout: DurationArg,

    /// How long a consumer may take to receive a response that holds part of a budget (a
    /// page of records, and its share of the read buffer). A connection still holding such a
    /// response at the deadline is closed and counted (send_timeout), so a consumer that
    /// withholds its HTTP/2 window fails on its own instead of holding the budget for everyone.
    #[arg(
        long,
        env = "NOVA_SEND_TIMEOUT",
        default_value = "30s",
        help_heading = "Budgets"
    )]
    pub send_timeout: DurationArg,

    /// How much of each budget one token may hold in work that waits on its client: messages
    /// still arriving (of the admission buffer and of the small-request budget) and pages not
    /// yet taken (of the read budget), as a percentage. Past it, that token's new appends and
    /// small requests are refused with RESOURCE_EXHAUSTED and its reads wait, while other
    /// tokens are served. Applies only with --auth-tokens (a token is the client).
    #[arg(long, env = "NOVA_MAX_CLIENT_SHARE_PERCENT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100), help_heading = "Budgets")]
    pub max_client_share_percent: u8,

    /// How often the server pings each connection over HTTP/2; a peer that does not answer
    /// within --keepalive-timeout is taken for dead and its connection closed.
    #[arg(
        long,
        env = "NOVA_KEEPALIVE_INTERVAL",
        default_value = "30s",
        help_heading = "Budgets"
    )]
    pub keepalive_interval: DurationArg,

    /// How long a keepalive ping may go unanswered; also how long a peer may take none of the
    /// bytes the server has to write before its connection is closed (write_timeout).
    #[arg(
        long,
        env = "NOVA_KEEPALIVE_TIMEOUT",
        default_value = "20s",
        help_heading = "Budgets"
    )]
    pub keepalive_timeout: DurationArg,
}

/// What a listener was configured with, loaded and ready.
#[derive(Debug, Clone)]
pub struct Security {
    pub tls: Option<ReloadingTls>,
    pub tokens: Option<Tokens>,
}

/// The series a listener's security exports.
#[derive(Debug, Clone)]
pub struct SecurityMetrics {
    pub connections: ConnMetrics,
    /// Certificate and token reloads by outcome (`ok`, `failed`).
    pub tls_reloads: prometheus::IntCounterVec,
    pub token_reloads: prometheus::IntCounterVec,
    /// Calls refused before their handler: `unauthenticated`.
    pub auth_refusals: prometheus::IntCounterVec,
}

impl SecurityMetrics {
    pub fn register(r: &prometheus::Registry, prefix: &str) -> Self {
        use nova_core::metrics::counter_vec;
        let metrics = Self {
            connections: ConnMetrics::register(r, prefix),
            tls_reloads: counter_vec(
                r,
                &format!("{prefix}_tls_reloads_total"),
                "TLS certificate reloads (on SIGHUP or a changed file), by outcome.",
                &["outcome"],
            ),
            token_reloads: counter_vec(
                r,
                &format!("{prefix}_auth_token_reloads_total"),
                "--auth-tokens reloads (on SIGHUP or a changed file), by outcome.",
                &["outcome"],
            ),
            auth_refusals: counter_vec(
                r,
                &format!("{prefix}_auth_refusals_total"),
                "Calls refused for their token: unauthenticated (none, or unknown), permission_denied (outside its grants).",
                &["reason"],
            ),
        };
        for outcome in ["ok", "failed"] {
            metrics.tls_reloads.with_label_values(&[outcome]);
            metrics.token_reloads.with_label_values(&[outcome]);
        }
        for reason in ["unauthenticated", "permission_denied"] {
            metrics.auth_refusals.with_label_values(&[reason]);
        }
        metrics
    }
}

impl ListenerArgs {
    pub fn limits(&self) -> ConnLimits {
        ConnLimits {
            max_connections: self.max_connections as usize,
            first_request: self.first_request_timeout.0,
            idle: self.idle_timeout.0,
            write_stall: self.keepalive_timeout.0,
            send: self.send_timeout.0,
        }
    }

    /// Loads the certificate and the tokens; an error stops the server from starting.
    pub fn load(&self, metrics: &SecurityMetrics) -> Result<Security, SecurityError> {
        for (flag, value) in [
            ("--first-request-timeout", self.first_request_timeout.0),
            ("--idle-timeout", self.idle_timeout.0),
            ("--send-timeout", self.send_timeout.0),
            ("--keepalive-interval", self.keepalive_interval.0),
            ("--keepalive-timeout", self.keepalive_timeout.0),
        ] {
            if value.is_zero() {
                return Err(SecurityError::Limit(format!(
                    "{flag} is 0: every connection would be closed at once; give a duration"
                )));
            }
        }
        if self.max_connections == 0
            || self.max_concurrent_streams == 0
            || self.max_header_list_bytes.bytes() == 0
        {
            return Err(SecurityError::Limit(
                "--max-connections, --max-concurrent-streams and --max-header-list-bytes must \
                 be more than 0"
                    .into(),
            ));
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ReloadingTls::new(
                TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                },
                metrics.tls_reloads.clone(),
            )?),
            _ => None,
        };
        let tokens = match &self.auth_tokens {
            Some(path) => Some(Tokens::load(path, metrics.token_reloads.clone())?),
            None => None,
        };
        Ok(Security { tls, tokens })
    }

    /// Says loudly what a listener on `listen` exposes: plain text or no tokens beyond
    /// loopback is for trusted networks only.
    pub fn warn_if_exposed(&self, listen: SocketAddr, what: &str, anyone_may: &str) {
        if listen.ip().is_loopback() {
            return;
        }
        if self.tls_cert.is_none() {
            tracing::warn!(
                %listen,
                "{what} listens beyond loopback WITHOUT TLS: records, tokens and stream names \
                 cross the network in plain text; give --tls-cert and --tls-key unless the \
                 network is trusted"
            );
        }
        if self.auth_tokens.is_none() {
            tracing::warn!(
                %listen,
                "{what} listens beyond loopback WITHOUT --auth-tokens: anyone who reaches it \
                 may {anyone_may}"
            );
        }
    }

    /// Applies the per-connection HTTP/2 limits to a tonic server.
    pub fn configure<L>(&self, server: tonic::transport::Server<L>) -> tonic::transport::Server<L> {
        server
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_max_header_list_size(
                self.max_header_list_bytes.bytes().min(u32::MAX as u64) as u32
            )
            .http2_keepalive_interval(Some(self.keepalive_interval.0))
            .http2_keepalive_timeout(Some(self.keepalive_timeout.0))
    }
}

impl Security {
    /// Watches the certificate and token files until `stopping`, reloading them on SIGHUP and
    /// when they change. With neither configured, SIGHUP is still taken (and logged), so an
    /// operator's reload signal never stops a server by the signal's default action.
    pub fn spawn_reloads(&self, stopping: &CancellationToken) {
        if let Some(tls) = &self.tls {
            tokio::spawn(tls.clone().watch(stopping.clone()));
        }
        if let Some(tokens) = &self.tokens {
            tokio::spawn(tokens.clone().watch(stopping.clone()));
        }
        if self.tls.is_none() && self.tokens.is_none() {
            // Taken here rather than in the task, so the signal is handled from the moment
            // this returns.
            use tokio::signal::unix::{SignalKind, signal};
            if let Ok(hangups) = signal(SignalKind::hangup()) {
                tokio::spawn(ignore_hangups(hangups, stopping.clone()));
            }
        }
    }
}

/// Takes SIGHUP away from its default action (ending the process) for the rest of the
/// process's life: called first thing, so a reload signal sent while a server starts (a
/// certificate renewal hook, say) cannot stop it. Such an early signal reloads nothing (the
/// files are read at start-up anyway); the watchers handle those that come later.
pub fn take_hangups() {
    use tokio::signal::unix::{SignalKind, signal};
    // Tokio keeps the handler installed once registered, whether or not the stream is kept.
    let _ = signal(SignalKind::hangup());
}

async fn ignore_hangups(mut hangups: tokio::signal::unix::Signal, stopping: CancellationToken) {
    loop {
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = hangups.recv() => tracing::info!(
                "SIGHUP: nothing to reload (no --tls-cert or --auth-tokens); still serving"
            ),
        }
    }
}

/// Why a listener's security could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("--auth-tokens: {0}")]
    Tokens(#[from] auth::TokenFileError),
    #[error("{0}")]
    Limit(String),
}

/// What every call reports: its method, code and time (`RpcMetrics`), and that its connection
/// is busy while it runs (`Connections`, for the first-request and idle deadlines).
#[derive(Debug, Clone)]
pub struct CallObserver {
    pub rpc: nova_core::metrics::RpcMetrics,
    pub connections: Arc<Connections>,
    /// When the server checks tokens, only an authenticated call keeps its connection: a
    /// client without a token cannot hold a place by calling (refused) or by watching health.
    pub tokens: Option<Tokens>,
}

impl nova_proto::rpc::RpcObserver for CallObserver {
    type Guard = conn::CallMark;

    fn begin<B>(&self, request: &http::Request<B>) -> conn::CallMark {
        if let Some(tokens) = &self.tokens {
            let header = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if open_path(request.uri().path()) || tokens.authenticate(header).is_err() {
                return conn::CallMark::none();
            }
        }
        self.connections.begin(request.extensions())
    }

    fn observe(&self, method: &'static str, code: nova_proto::Code, seconds: f64) {
        self.rpc.observe(method, code, seconds);
    }
}

/// Paths every client may call without a token: the health service (load balancers and
/// supervisors probe it) and reflection (the API's shape, which is public).
fn open_path(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
}

/// Authenticates every call but the open ones when the server checks tokens: the call's
/// `Principal` goes into its extensions for the handlers to authorise, or the call is refused
/// with UNAUTHENTICATED before it reaches them.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    tokens: Option<Tokens>,
    refusals: prometheus::IntCounterVec,
}

impl AuthLayer {
    pub fn new(tokens: Option<Tokens>, metrics: &SecurityMetrics) -> Self {
        Self {
            tokens,
            refusals: metrics.auth_refusals.clone(),
        }
    }
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    layer: AuthLayer,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for AuthService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(tokens) = &self.layer.tokens
            && !open_path(request.uri().path())
        {
            let header = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            match tokens.authenticate(header) {
                Ok(principal) => {
                    request.extensions_mut().insert(Arc::new(principal));
                }
                Err(refusal) => {
                    self.layer
                        .refusals
                        .with_label_values(&["unauthenticated"])
                        .inc();
                    let status = tonic::Status::from(refusal);
                    return Box::pin(async move { Ok(status.into_http()) });
                }
            }
        }
        let response = self.inner.call(request);
        Box::pin(response)
    }
}

/// The principal the auth layer found for a call, when the server checks tokens.
pub fn principal<T>(request: &tonic::Request<T>) -> Option<Arc<Principal>> {
    request.extensions().get::<Arc<Principal>>().cloned()
}

/// What `GetServerInfo` says of where the data lives (bucket, prefix, endpoint) to a caller:
/// all of it without tokens or to an admin token, nothing to other tokens, which need no map of
/// the deployment to append or read.
pub fn deployment_detail(principal: Option<&Principal>, detail: &str) -> String {
    match principal {
        Some(principal) if !principal.has(Scope::Admin) => String::new(),
        _ => detail.to_owned(),
    }
}

/// Authorises calls for the handlers: each refusal is counted, and logged (a line a second at
/// most) with the token's name, the scope and the stream, never the token.
#[derive(Debug, Clone)]
pub struct Access {
    refusals: prometheus::IntCounterVec,
    log: Arc<crate::shed::ShedLog>,
}

impl Access {
    pub fn new(metrics: &SecurityMetrics) -> Self {
        Self {
            refusals: metrics.auth_refusals.clone(),
            log: Arc::new(crate::shed::ShedLog::new(nova_core::clock::Clock::system())),
        }
    }

    /// Allows `scope` on `stream` for `principal` (anything when the server checks no tokens).
    pub fn check(
        &self,
        principal: Option<&Principal>,
        scope: Scope,
        stream: &str,
    ) -> Result<(), nova_proto::RequestError> {
        self.check_any(principal, &[scope], stream)
    }

    /// Allows what any of `scopes` on `stream` allows (a describe: any scope on the stream).
    pub fn check_any(
        &self,
        principal: Option<&Principal>,
        scopes: &[Scope],
        stream: &str,
    ) -> Result<(), nova_proto::RequestError> {
        let Some(principal) = principal else {
            return Ok(());
        };
        principal.allows_any(scopes, stream).inspect_err(|refusal| {
            self.refusals
                .with_label_values(&["permission_denied"])
                .inc();
            if let Some(unlogged) = self.log.admit("permission_denied") {
                let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
                tracing::info!(
                    scope = scopes.join("|"),
                    stream,
                    unlogged_since_last = unlogged,
                    "call refused: {refusal}"
                );
            }
        })
    }
}
