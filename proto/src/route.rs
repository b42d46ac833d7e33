//! Reaching a stream's leader in a fleet. A star that does not lead a stream answers with a
//! redirect (UNAVAILABLE carrying the leader's address in `leader` metadata). A [`Router`]
//! follows redirects, remembers each stream's leader, and forgets it when the leader stops
//! answering, so the next call asks the star it started from, which knows the new leader. The
//! SDK and the read tier both route through one.
//!
//! A redirect carries the caller's token to wherever it points, and it comes from a star (or
//! from whoever can write the fleet's records). So a router reached over TLS follows one only
//! to a server it trusts as it trusts the seed: any `https://` server when it verifies against
//! a CA of its own (`--tls-ca`: the fleet's CA), and otherwise only the seeds' hosts and the
//! names it was given (`--allow-redirect`, exact or `*.domain`). No domain is inferred from a
//! seed: without a list of public suffixes, `x.herokuapp.com`'s parent would be anyone's. Plain text is never followed from TLS. A router on plain
//! text follows any plain-text redirect: its network is trusted by choice, and its token
//! already crosses it in the clear.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::v1::nova_client::NovaClient;

/// Redirects followed for one call before giving up (leadership moving while it is followed).
pub const MAX_REDIRECTS: usize = 3;

/// Streams whose leader is remembered; past it the memory starts over.
const MAX_REMEMBERED_LEADERS: usize = 10_000;

/// Stars connected to at once; past it the connections start over.
const MAX_STARS: usize = 256;

/// A generated client whose calls carry the caller's credentials.
pub type Stub = NovaClient<InterceptedService<Channel, Credentials>>;

/// A bearer token sent with every call as `authorization: Bearer <token>`. It is marked
/// sensitive, so HTTP/2 never adds it to a header compression table, and it is never printed:
/// `Debug` says only whether there is one.
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
}

/// A token that cannot travel in a header.
#[derive(Debug, thiserror::Error)]
#[error("a token must be printable ASCII without spaces (the token itself is not shown)")]
pub struct InvalidToken;

impl Credentials {
    /// No token: calls go without an `authorization` header.
    pub fn none() -> Self {
        Self::default()
    }

    /// `token` sent as a bearer token. Refused unless it is printable ASCII with no spaces (the
    /// form of every token scheme worth using, and what a header can carry unchanged).
    pub fn bearer(token: &str) -> Result<Self, InvalidToken> {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidToken);
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| InvalidToken)?;
        value.set_sensitive(true);
        Ok(Self {
            authorization: Some(value),
        })
    }

    pub fn is_some(&self) -> bool {
        self.authorization.is_some()
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = if self.is_some() { "<redacted>" } else { "none" };
        f.debug_struct("Credentials")
            .field("token", &token)
            .finish()
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

#[derive(Debug, Clone)]
pub struct Router {
    seed: Stub,
    routes: Arc<Routes>,
    settings: Settings,
    /// Reached over TLS: a redirect to a plain-text URL is refused, never followed (the call
    /// would carry its token in the clear), and one to another host must be trusted.
    tls_only: bool,
    /// The hosts of the seeds it was given.
    seed_hosts: Vec<String>,
}

/// How connections to leaders are made.
#[derive(Debug, Clone)]
pub struct Settings {
    pub connect_timeout: Duration,
    /// Deadline of one call; `None` for none beyond the server's.
    pub request_timeout: Option<Duration>,
    /// The largest message sent or accepted.
    pub max_message_bytes: usize,
    /// Sent with every call.
    pub credentials: Credentials,
    /// How `https://` URLs are verified (and the client's certificate, for mutual TLS).
    pub tls: ClientTls,
    /// Hosts a redirect may name beyond the seeds' and their domains: exact names, or
    /// `*.domain` for every name in a domain.
    pub redirect_hosts: Vec<String>,
    /// The largest HTTP/2 DATA frame the server may send this client; `None` keeps hyper's
    /// 16 KiB and its receive windows. Applications' clients take [`READER_FRAME_BYTES`], and
    /// with it the reader's windows ([`READER_STREAM_WINDOW`], [`READER_CONNECTION_WINDOW`]).
    /// Servers' own channels (a gateway's to its stars and peers) keep the defaults: every such
    /// connection would hold a buffer of the frame's size for as long as it lives, and could
    /// be sent more before reading, outside their memory formulas.
    pub max_received_frame: Option<u32>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            credentials: Credentials::none(),
            tls: ClientTls::default(),
            redirect_hosts: Vec::new(),
            max_received_frame: None,
        }
    }
}

/// The largest message a client decodes unless told otherwise: above any page a star serves
/// with its default caps, far below what would hurt a client to hold.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How a client speaks TLS to `https://` URLs: it always verifies the server's certificate,
/// against the CAs given or else the system's roots, for the URL's host or the name given.
/// An `http://` URL is plain text; nothing ever falls back from one to the other.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// CA certificates to trust (PEM); `None`: the system's.
    pub ca_pem: Option<Vec<u8>>,
    /// The certificate and key the client presents (PEM), for servers that ask (mutual TLS).
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry, when not the URL's host.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field(
                "ca",
                &self.ca_pem.as_ref().map_or("system roots", |_| "given"),
            )
            .field("identity", &self.identity_pem.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl ClientTls {
    /// Reads the CA and, for mutual TLS, the certificate and key from PEM files.
    pub fn from_files(
        ca: Option<&std::path::Path>,
        identity: Option<(&std::path::Path, &std::path::Path)>,
        server_name: Option<String>,
    ) -> std::io::Result<Self> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                std::io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))
            })
        };
        Ok(Self {
            ca_pem: ca.map(read).transpose()?,
            identity_pem: match identity {
                Some((cert, key)) => Some((read(cert)?, read(key)?)),
                None => None,
            },
            server_name,
        })
    }

    fn config(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_pem {
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity_pem {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

/// The largest HTTP/2 DATA frame an application's client accepts from its server (hyper's
/// default is 16 KiB). Pages of records come back in a sixteenth as many frames, and reading
/// them costs a reader about a third less CPU per MiB (docs/performance.md, "Reads through the
/// gateway"). The cost is the client's own: h2 reserves a whole frame when its header arrives and
/// keeps the buffer for reuse, so each connection holds up to this much (docs/sdk.md). What a
/// server accepts stays at 16 KiB (docs/budgets.md).
pub const READER_FRAME_BYTES: u32 = 256 * 1024;

/// The HTTP/2 receive window of each call on an application's client: a whole page at the
/// servers' default --max-read-bytes (8 MiB), so a page arrives without stopping for window
/// updates (hyper's default is 2 MiB). Measured on cold reads through the gateway, the reader
/// spent about a sixth less CPU per MiB (docs/performance.md). It bounds what the client
/// buffers of a response it has not yet taken, so this is the client's own memory (docs/sdk.md).
pub const READER_STREAM_WINDOW: u32 = 8 << 20;

/// The receive window of an application client's whole connection: two pages in flight at
/// once (hyper's default is 5 MiB, less than one 8 MiB page).
pub const READER_CONNECTION_WINDOW: u32 = 16 << 20;

impl Settings {
    /// An endpoint for `url` made with these settings: TLS for `https://`.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, tonic::transport::Error> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(frame) = self.max_received_frame {
            endpoint = endpoint.max_frame_size(frame);
            // A reader's client receives pages: room for a whole page of the servers' default
            // size per call, and two per connection, before it must hand back window.
            endpoint = endpoint
                .initial_stream_window_size(READER_STREAM_WINDOW)
                .initial_connection_window_size(READER_CONNECTION_WINDOW);
        }
        if url.starts_with("https://") {
            endpoint = endpoint.tls_config(self.tls.config())?;
        }
        Ok(match self.request_timeout {
            Some(timeout) => endpoint.timeout(timeout),
            None => endpoint,
        })
    }

    /// A client on `channel` with these settings' message bound and credentials.
    pub fn client(&self, channel: Channel) -> Stub {
        NovaClient::with_interceptor(channel, self.credentials.clone())
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes)
    }
}

#[derive(Debug, Default)]
struct Routes {
    /// Stream name to its leader's URL.
    leaders: Mutex<HashMap<String, String>>,
    /// Leader URL to a lazily connected client.
    stars: Mutex<HashMap<String, Stub>>,
}

/// The host of a URL, lower-cased.
fn host_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(uri.host()?.trim_matches(['[', ']']).to_ascii_lowercase())
}

fn in_domain(host: &str, domain: &str) -> bool {
    host.len() > domain.len() + 1
        && host
            .to_ascii_lowercase()
            .ends_with(&domain.to_ascii_lowercase())
        && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Router {
    /// Routes through `seed` (any star, or a gateway's configured star) until told otherwise.
    pub fn new(seed: Stub) -> Self {
        Self::with_settings(seed, Settings::default())
    }

    /// Connections to leaders are made with `settings`.
    pub fn with_settings(seed: Stub, settings: Settings) -> Self {
        Self {
            seed,
            routes: Arc::default(),
            settings,
            tls_only: false,
            seed_hosts: Vec::new(),
        }
    }

    /// The seed reached (`connected`) and every seed configured: over TLS, only trusted
    /// `https://` redirects are followed.
    pub fn seeds<'a>(mut self, connected: &'a str, all: impl IntoIterator<Item = &'a str>) -> Self {
        self.tls_only = connected.starts_with("https://");
        self.seed_hosts = all
            .into_iter()
            .chain([connected])
            .filter_map(host_of)
            .collect();
        self
    }

    /// Whether a redirect to `url` may be followed; if not, why.
    pub fn may_follow(&self, url: &str) -> Result<(), String> {
        if !self.tls_only {
            return Ok(());
        }
        if !url.starts_with("https://") {
            return Err(
                "this client speaks TLS and will not send a call in plain text; the \
                        leader's --advertise-addr should be its https:// URL"
                    .to_owned(),
            );
        }
        if self.settings.tls.ca_pem.is_some() {
            // Verified against the CA this client was given: the fleet's own.
            return Ok(());
        }
        let Some(host) = host_of(url) else {
            return Err("the redirect names no host".to_owned());
        };
        let trusted = self.seed_hosts.contains(&host)
            || self.settings.redirect_hosts.iter().any(|allowed| {
                // As a host is written in a URL or by hand: any case, IPv6 in brackets or not.
                let allowed = allowed.trim().trim_matches(['[', ']']).to_ascii_lowercase();
                match allowed.strip_prefix("*.") {
                    Some(domain) => in_domain(&host, domain),
                    None => allowed == host,
                }
            });
        if trusted {
            Ok(())
        } else {
            Err(format!(
                "{host} is not a seed's host, and this client checks certificates against the \
                 system's roots, which vouch for any public name; trust the fleet's CA \
                 (--tls-ca), give every star as a seed, or allow the name (--allow-redirect \
                 {host})"
            ))
        }
    }

    pub fn seed(&self) -> Stub {
        self.seed.clone()
    }

    /// The client for `stream`'s leader when known, else the seed.
    pub fn stub(&self, stream: &str) -> Stub {
        let Some(url) = lock(&self.routes.leaders).get(stream).cloned() else {
            return self.seed.clone();
        };
        let mut stars = lock(&self.routes.stars);
        if let Some(client) = stars.get(&url) {
            return client.clone();
        }
        let Ok(endpoint) = self.settings.endpoint(&url) else {
            return self.seed.clone();
        };
        let client = self.settings.client(endpoint.connect_lazy());
        if stars.len() >= MAX_STARS {
            stars.clear();
        }
        stars.insert(url, client.clone());
        client
    }

    /// Learns from a failed call about `stream`: a redirect names the leader to use from now
    /// on; a leader that failed in a way worth retrying (unreachable, stopped leading) is
    /// forgotten.
    pub fn learn(&self, stream: &str, leader: Option<&str>, retryable: bool) {
        let mut leaders = lock(&self.routes.leaders);
        match leader {
            // Never a leader this client does not trust as it trusts its seed.
            Some(url) if self.may_follow(url).is_err() => {}
            Some(url) => {
                if leaders.len() >= MAX_REMEMBERED_LEADERS {
                    leaders.clear();
                }
                leaders.insert(stream.to_owned(), url.to_owned());
            }
            None if retryable => {
                leaders.remove(stream);
            }
            None => {}
        }
    }

    /// The leader this router would send `stream`'s calls to, if it learned one.
    pub fn leader(&self, stream: &str) -> Option<String> {
        lock(&self.routes.leaders).get(stream).cloned()
    }

    /// Runs a call about `stream` on its leader, following up to `MAX_REDIRECTS` redirects.
    pub async fn call<T, F, Fut>(&self, stream: &str, call: F) -> Result<T, Status>
    where
        F: Fn(Stub) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut hops = 0;
        loop {
            match call(self.stub(stream)).await {
                Ok(value) => return Ok(value),
                Err(status) => {
                    let leader = crate::error::leader(&status);
                    if let Some(url) = leader.as_deref()
                        && let Err(why) = self.may_follow(url)
                    {
                        // The next call starts again from the seed, not from a leader that
                        // sent this redirect.
                        self.learn(stream, None, true);
                        return Err(Status::from(crate::RequestError::RedirectRefused {
                            url: url.to_owned(),
                            why,
                        }));
                    }
                    let retryable = matches!(
                        status.code(),
                        Code::Unavailable | Code::Unknown | Code::Cancelled
                    );
                    self.learn(stream, leader.as_deref(), retryable);
                    if leader.is_some() && hops < MAX_REDIRECTS {
                        hops += 1;
                        continue;
                    }
                    return Err(status);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(seed: &str, settings: Settings) -> Router {
        let channel = Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        Router::with_settings(settings.client(channel), settings).seeds(seed, [seed])
    }

    #[tokio::test]
    async fn redirects_are_followed_only_to_servers_trusted_like_the_seed() {
        let tls = router("https://star-1.nova.internal:7400", Settings::default());
        assert!(tls.may_follow("https://STAR-1.nova.internal:7401").is_ok());
        // No domain is inferred: a seed on a shared suffix would trust everyone on it.
        assert!(tls.may_follow("https://star-2.nova.internal:7400").is_err());
        let refused = tls.may_follow("https://collector.example.com").unwrap_err();
        assert!(
            refused.contains("--allow-redirect collector.example.com"),
            "{refused}"
        );
        assert!(tls.may_follow("http://star-1.nova.internal:7400").is_err());

        // Given names and domains are followed too; a domain is whole labels.
        let allowed = router(
            "https://10.0.0.1:7400",
            Settings {
                redirect_hosts: vec!["10.0.0.2".into(), "*.stars.example".into()],
                ..Settings::default()
            },
        );
        assert!(allowed.may_follow("https://10.0.0.2:7400").is_ok());
        assert!(allowed.may_follow("https://a.stars.example").is_ok());
        assert!(allowed.may_follow("https://a.evilstars.example").is_err());
        let ipv6 = router(
            "https://[fd00::1]:7400",
            Settings {
                redirect_hosts: vec![" [FD00::2] ".into()],
                ..Settings::default()
            },
        );
        assert!(ipv6.may_follow("https://[fd00::1]:7401").is_ok());
        assert!(ipv6.may_follow("https://[fd00::2]:7400").is_ok());
        assert!(allowed.may_follow("https://10.0.0.3:7400").is_err());

        // Verified against the fleet's own CA: any https server it vouches for.
        let pinned = router(
            "https://10.0.0.1:7400",
            Settings {
                tls: ClientTls {
                    ca_pem: Some(b"a CA".to_vec()),
                    ..ClientTls::default()
                },
                ..Settings::default()
            },
        );
        assert!(pinned.may_follow("https://10.0.0.9:7400").is_ok());
        assert!(pinned.may_follow("http://10.0.0.9:7400").is_err());

        // Plain text trusts its network.
        let plain = router("http://127.0.0.1:7400", Settings::default());
        assert!(plain.may_follow("http://10.1.2.3:7400").is_ok());

        // What is refused is not remembered either.
        tls.learn("s", Some("https://collector.example.com"), true);
        assert_eq!(tls.leader("s"), None);
    }
}
