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
    /// Something listens there that this probe cannot identify: with TLS, the probe does not
    /// hold the CA a client would check the certificate against; with tokens, it has none.
    Unverified,
    /// Another server: a star or gateway with this id.
    Other { id: String },
    /// Nothing answered.
    Nothing { error: String },
}

/// Asks `advertise` who it is. `star` and `started_at_ms` identify this process.
pub async fn probe(advertise: &str, star: &str, started_at_ms: u64) -> Reached {
    let uri: http::Uri = match advertise.parse() {
        Ok(uri) => uri,
        Err(err) => {
            return Reached::Nothing {
                error: err.to_string(),
            };
        }
    };
    if uri.scheme_str() == Some("https") {
        return tcp_reaches(&uri).await;
    }
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
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(err) => return Reached::Nothing { error: chain(&err) },
    };
    let answer = v1::nova_client::NovaClient::new(channel)
        .get_server_info(v1::GetServerInfoRequest::default())
        .await;
    match answer.map(tonic::Response::into_inner) {
        Ok(info) if info.id == star && info.started_at_ms == started_at_ms => Reached::Itself,
        Ok(info) => Reached::Other {
            id: format!("{} {:?}", info.role, info.id),
        },
        Err(status) if status.code() == tonic::Code::Unauthenticated => Reached::Unverified,
        Err(status) => Reached::Nothing {
            error: status.message().to_owned(),
        },
    }
}

/// With TLS, whether anything accepts a connection at the address.
async fn tcp_reaches(uri: &http::Uri) -> Reached {
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    let port = uri.port_u16().unwrap_or(443);
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Reached::Unverified,
        Ok(Err(err)) => Reached::Nothing {
            error: err.to_string(),
        },
        Err(_) => Reached::Nothing {
            error: format!("no connection within {} s", PROBE_TIMEOUT.as_secs()),
        },
    }
}

/// An error with its causes, on one line: a transport error's own text is "transport error".
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}
