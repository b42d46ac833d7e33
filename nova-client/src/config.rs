//! How a [`crate::Client`] connects and retries.

use std::sync::Arc;
use std::time::Duration;

use nova_proto::route::{ClientTls, Credentials, InvalidToken};

use crate::error::Error;
use crate::jitter::Jitter;

/// Where and how to connect. Any star of a fleet (or a lone star) will do as an endpoint: the
/// client follows redirects to each stream's leader on its own.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Star URLs (`http://host:port`), tried in order until one answers.
    pub endpoints: Vec<String>,
    /// How long establishing a connection may take.
    pub connect_timeout: Duration,
    /// Deadline of one call (a read's wait at the tail counts against it too); `None` for no
    /// deadline beyond the server's own.
    pub request_timeout: Option<Duration>,
    /// The largest message the client sends or accepts. Keep it at or above twice the star's
    /// `--max-batch-bytes` and `--max-read-bytes`.
    pub max_message_bytes: usize,
    /// How reads, describes and lists are retried when they fail in a way worth retrying.
    pub retry: RetryPolicy,
    /// The bearer token every call carries (see [`ClientConfig::with_token`]); printing the
    /// config shows only whether there is one.
    pub credentials: Credentials,
    /// How `https://` endpoints are verified, and the certificate presented to servers that
    /// ask for one (see [`ClientConfig::with_tls`]).
    pub tls: ClientTls,
    /// Told before every retry the client and its producers make (see
    /// [`ClientConfig::on_retry`]).
    pub on_retry: RetryObserver,
    /// Hosts a redirect over TLS may name beyond the endpoints' own (see
    /// [`ClientConfig::with_redirect_hosts`]).
    pub redirect_hosts: Vec<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:7400".into()],
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
            max_message_bytes: nova_proto::route::DEFAULT_MAX_MESSAGE_BYTES,
            retry: RetryPolicy::default(),
            credentials: Credentials::none(),
            tls: ClientTls::default(),
            on_retry: RetryObserver::default(),
            redirect_hosts: Vec::new(),
        }
    }
}

impl ClientConfig {
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Speaks TLS to `https://` endpoints as `tls` says: verifying servers against its CAs (the
    /// system's roots when it gives none) and presenting its certificate where asked. An
    /// `http://` endpoint is plain text; nothing falls back from TLS to plain text.
    pub fn with_tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// Lets redirects over TLS go to `hosts` (exact names, or `*.domain`) besides the
    /// endpoints' hosts. A redirect carries the client's token; over TLS
    /// with the system's roots, one to any other host is refused (with the CA of the fleet given
    /// by [`ClientConfig::with_tls`], any server it vouches for is followed).
    pub fn with_redirect_hosts(
        mut self,
        hosts: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.redirect_hosts = hosts.into_iter().map(Into::into).collect();
        self
    }

    /// Calls `observer` before each retry of a call or of a producer's batch, with what was
    /// refused, why, and when the next attempt goes out: a way to show that a client is
    /// waiting rather than hung. It runs on the retrying task, so it should be quick.
    pub fn on_retry(mut self, observer: impl Fn(&Retrying) + Send + Sync + 'static) -> Self {
        self.on_retry = RetryObserver(Some(Arc::new(observer)));
        self
    }

    /// Sends `token` with every call, to every star and gateway the client reaches, as
    /// `authorization: Bearer <token>`. Refused when it is not printable ASCII without spaces.
    pub fn with_token(mut self, token: &str) -> Result<Self, InvalidToken> {
        self.credentials = Credentials::bearer(token)?;
        Ok(self)
    }

    /// Sends the token in the `NOVA_TOKEN` environment variable, as the CLI does, when it is
    /// set and not empty; otherwise the config is unchanged. Keeps a token out of code and
    /// out of the process list.
    pub fn with_token_from_env(self) -> Result<Self, InvalidToken> {
        match std::env::var(TOKEN_ENV) {
            Ok(token) if !token.is_empty() => self.with_token(&token),
            _ => Ok(self),
        }
    }
}

/// A retry about to happen.
#[derive(Debug, Clone)]
pub struct Retrying {
    /// What is being retried ("append to \"orders\"", "a call about \"orders\"").
    pub what: String,
    /// The retry's number: 1 for the first.
    pub attempt: u32,
    /// Why the last attempt failed (the server's refusal, or the connection's end).
    pub cause: Error,
    /// How long until the next attempt.
    pub wait: Duration,
    /// How long until the client gives up, when it will: a producer's delivery timeout left.
    pub gives_up_in: Option<Duration>,
}

/// What [`ClientConfig::on_retry`] calls.
type OnRetry = dyn Fn(&Retrying) + Send + Sync;

/// Who hears of retries; nobody by default.
#[derive(Clone, Default)]
pub struct RetryObserver(Option<Arc<OnRetry>>);

impl RetryObserver {
    pub(crate) fn tell(&self, retrying: impl FnOnce() -> Retrying) {
        if let Some(observer) = &self.0 {
            observer(&retrying());
        }
    }
}

impl std::fmt::Debug for RetryObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "RetryObserver(set)"
        } else {
            "RetryObserver(none)"
        })
    }
}

/// The environment variable the SDK and the CLI take a token from.
pub const TOKEN_ENV: &str = "NOVA_TOKEN";

/// Retries with exponential backoff, each wait drawn between half and all of its step so that
/// many clients failed by one event spread out instead of returning in lockstep. A server's
/// `retry-after-ms` hint replaces the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1: no retries).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The un-jittered step before attempt `attempt` (2 is the first retry).
    pub fn step(&self, attempt: u32) -> Duration {
        self.initial_backoff
            .saturating_mul(1 << attempt.saturating_sub(2).min(16))
            .min(self.max_backoff)
    }

    /// How long to wait before attempt `attempt` after `cause`. The step, jittered (between
    /// half and all of it); the server's hint, when it sent one, is a floor: never sooner than
    /// it, and spread over up to half as long again above it, so that the clients one event
    /// refused do not come back together. A hint does not stop the steps from growing, so
    /// repeated refusals still back off exponentially.
    pub(crate) fn wait(&self, attempt: u32, cause: &Error, jitter: &Jitter) -> Duration {
        let step = jitter.apply(self.step(attempt));
        match cause.retry_after() {
            Some(hint) if hint >= step => hint + (jitter.apply(hint) - hint / 2),
            _ => step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_proto::clock::Clock;

    fn refused(hint: Option<Duration>) -> Error {
        Error::Status {
            code: tonic::Code::Unavailable,
            message: "refused".into(),
            retry_after: hint,
            next_seq: None,
            first_seq: None,
            leader: None,
        }
    }

    #[test]
    fn a_hint_is_a_floor_and_the_steps_still_grow() {
        let policy = RetryPolicy {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
        };
        let jitter = Jitter::new(&Clock::system(), "test");
        let hint = Some(Duration::from_secs(1));
        for _ in 0..100 {
            let first = policy.wait(2, &refused(hint), &jitter);
            assert!(first >= Duration::from_secs(1), "{first:?}");
            assert!(first <= Duration::from_millis(1500), "{first:?}");
            // By the ninth attempt the step (50 ms × 2^7, capped at 5 s) is past the hint.
            let late = policy.wait(9, &refused(hint), &jitter);
            assert!(late >= Duration::from_millis(2500), "{late:?}");
            let unhinted = policy.wait(2, &refused(None), &jitter);
            assert!(unhinted >= Duration::from_millis(25) && unhinted <= Duration::from_millis(50));
        }
    }
}
