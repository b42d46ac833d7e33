//! Checks, once the star listens, that its advertised address reaches it. A fleet redirects
//! clients to the address each star advertises; one that reaches nothing, or another server,
//! would leave a fleet that looks healthy while every redirect to this star fails or bounces.

use std::time::Duration;

use nova_proto::v1;

/// How long one probe waits to connect and for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the address this star advertises led to.
#[derive(Debug, PartialEq, Eq)]
pub enum Reached {
    /// This very process (its star id and start time).
    Itself,
    /// A Nova server with no room for another call: most likely this star, not checked.
    Busy { why: String },
    /// Another server: a star or gateway with another id, or one that wants a token.
    Other { what: String },
    /// Nothing answered.
    Nothing { error: String },
}

/// Asks `advertise` (a plain-text address: with TLS the probe would not hold the CA a client
/// checks the certificate against) who it is. `star` and `started_at_ms` identify this process.
pub async fn probe(advertise: &str, star: &str, started_at_ms: u64) -> Reached {
    let endpoint = match tonic::transport::Endpoint::from_shared(advertise.to_owned()) {
        Ok(endpoint) => endpoint
            .connect_timeout(PROBE_TIMEOUT)
            .timeout(PROBE_TIMEOUT),
        Err(err) => {
            return Reached::Nothing {
                error: err.to_string(),
            };
        }
    };
    // The connect timeout does not cover resolving the name.
    let channel = match tokio::time::timeout(PROBE_TIMEOUT, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(err)) => {
            return Reached::Nothing {
                error: nova_proto::error::with_causes(&err),
            };
        }
        Err(_) => {
            return Reached::Nothing {
                error: format!("no connection within {} s", PROBE_TIMEOUT.as_secs()),
            };
        }
    };
    let answer = v1::nova_client::NovaClient::new(channel)
        .get_server_info(v1::GetServerInfoRequest::default())
        .await;
    match answer.map(tonic::Response::into_inner) {
        Ok(info) if info.id == star && info.started_at_ms == started_at_ms => Reached::Itself,
        Ok(info) => Reached::Other {
            what: format!("{} {:?}", info.role, info.id),
        },
        Err(status) => match status.code() {
            // A star with room for no more calls or connections: most likely this one.
            tonic::Code::ResourceExhausted => Reached::Busy {
                why: status.message().to_owned(),
            },
            // This star takes no tokens (the probe runs only then): another server wants one.
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => Reached::Other {
                what: format!("a server that wants a token ({})", status.message()),
            },
            // A reset connection, a proxy not routing yet, another kind of server: only a
            // server that says who it is stops the star; the rest is tried again, then warned.
            code => Reached::Nothing {
                error: format!("{code:?}: {}", status.message()),
            },
        },
    }
}
