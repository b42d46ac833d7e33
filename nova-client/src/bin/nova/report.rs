//! How `nova` reports a failure: what went wrong, in the server's words when it answered, and a
//! hint at what to do, on stderr; with `--output json`, one JSON object with the code instead.

use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use nova_client::Error;
use nova_proto::error::code_name;

/// A failure of the CLI's own (bad input, a record over a limit), with a code in gRPC's terms
/// so that scripts see one vocabulary.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub code: &'static str,
    pub message: String,
    pub hint: Option<String>,
}

impl CliError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: "INVALID_ARGUMENT",
            message: message.into(),
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    /// The gRPC code (`UNAVAILABLE`, `NOT_FOUND`, …), or `DISCONNECTED` when no server answered.
    code: &'a str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    retryable: bool,
}

/// What the user sees of `error`: code, message, hint.
struct Explained {
    code: &'static str,
    message: String,
    hint: Option<String>,
    retry_after: Option<Duration>,
    retryable: bool,
}

/// Prints `error` to stderr for people or, with `json`, as one JSON object.
pub fn report(error: &anyhow::Error, server: &str, json: bool) {
    let explained = explain(error, server);
    let mut err = std::io::stderr().lock();
    if json {
        let body = ErrorJson {
            error: ErrorBody {
                code: explained.code,
                message: explained.message,
                hint: explained.hint,
                retry_after_ms: explained.retry_after.map(|d| d.as_millis() as u64),
                retryable: explained.retryable,
            },
        };
        let _ = serde_json::to_writer(&mut err, &body);
        let _ = err.write_all(b"\n");
        return;
    }
    let _ = writeln!(err, "nova: {}", explained.message);
    if let Some(hint) = explained.hint {
        let _ = writeln!(err, "hint: {hint}");
    }
}

fn explain(error: &anyhow::Error, server: &str) -> Explained {
    if let Some(cli) = error.downcast_ref::<CliError>() {
        return Explained {
            code: cli.code,
            message: format!("{error:#}"),
            hint: cli.hint.clone(),
            retry_after: None,
            retryable: false,
        };
    }
    let Some(sdk) = error.chain().find_map(|e| e.downcast_ref::<Error>()) else {
        return Explained {
            code: "UNKNOWN",
            message: format!("{error:#}"),
            hint: None,
            retry_after: None,
            retryable: false,
        };
    };
    let code = sdk.code().map_or("DISCONNECTED", code_name);
    Explained {
        code,
        message: plain_message(error, sdk),
        hint: hint(sdk, server),
        retry_after: sdk.retry_after(),
        retryable: sdk.is_retryable(),
    }
}

/// The error's text for a person: a server's refusal without its gRPC code in front (the code
/// is the JSON's `code`, and the message says the same in words), and a plain HTTP answer
/// (the metrics port) said as such instead of the transport's mapping of its status.
fn plain_message(error: &anyhow::Error, sdk: &Error) -> String {
    let text = format!("{error:#}");
    let Error::Status { code, message, .. } = sdk else {
        return text;
    };
    let coded = format!("{code:?}: {message}");
    let plain = if looks_like_http1(message) {
        "the server answered with plain HTTP, not gRPC".to_owned()
    } else {
        message.clone()
    };
    text.replacen(&coded, &plain, 1)
}

/// What to do about a failure the server (or the network) caused, when there is advice to
/// give.
fn hint(error: &Error, server: &str) -> Option<String> {
    if let Error::DeliveryTimeout {
        outcome_unknown, ..
    } = error
    {
        return Some(if *outcome_unknown {
            "the batch may have landed: read the stream's tail (`nova stream describe`, \
             `nova tail`) before sending the rest of the input again, or part of it may be \
             appended twice"
                .to_owned()
        } else {
            "once the cause is gone, append the rest of the input again (not what was \
             appended), or allow longer with --delivery-timeout"
                .to_owned()
        });
    }
    let text = error.to_string();
    let address = server
        .split_once("://")
        .map_or(server, |(_, rest)| rest)
        .trim_end_matches('/');
    if text.contains("Connection refused") {
        return Some(format!(
            "nothing listens on {address}: is novad (or novagateway) running there? Start it, \
             or point --server (NOVA_SERVER) at where it listens"
        ));
    }
    if text.contains("dns error") || text.contains("failed to lookup") {
        return Some(format!(
            "the host in --server ({server}) does not resolve; check its spelling"
        ));
    }
    if text.contains("timed out") || text.contains("deadline has elapsed") {
        return Some(format!(
            "{address} did not answer in time: check the address, and any firewall between"
        ));
    }
    if let Some(hint) = tls_hint(&text, server) {
        return Some(hint);
    }
    if looks_like_http1(&text) {
        return Some(format!(
            "{address} does not speak gRPC: is it the metrics port? novad serves gRPC on \
             --listen (127.0.0.1:7400 by default) and Prometheus metrics on --metrics-addr \
             (7401)"
        ));
    }
    match error.code() {
        Some(tonic::Code::NotFound) if text.contains("stream") => Some(
            "`nova stream list` shows the streams there are; `nova stream create NAME` makes one"
                .to_owned(),
        ),
        Some(tonic::Code::Unimplemented) if text.contains("novagateway") => Some(
            "a gateway serves reads only: send appends and stream changes to the star".to_owned(),
        ),
        Some(tonic::Code::Unimplemented) => Some(
            "the server is older than this nova and lacks the call; upgrade it, or use a nova of \
             its version"
                .to_owned(),
        ),
        Some(tonic::Code::ResourceExhausted) => Some(match error.retry_after() {
            Some(after) => format!(
                "the server is at a limit; it asks to retry after {} ms",
                after.as_millis()
            ),
            None => "the server is at a limit; retry later".to_owned(),
        }),
        Some(tonic::Code::Unauthenticated) => Some(
            "the server checks tokens: give one with --token or NOVA_TOKEN (its operator makes \
             them with `nova token new`)"
                .to_owned(),
        ),
        Some(tonic::Code::PermissionDenied) => Some(
            "the token works but lacks this scope for this stream; ask for a token with that \
             --grant"
                .to_owned(),
        ),
        Some(tonic::Code::OutOfRange) => error.first_seq().map(|first| {
            format!(
                "retention trimmed it; the stream's first record is now {first} (--from {first})"
            )
        }),
        _ => None,
    }
}

/// What a TLS failure means for the user: which flag fixes it.
fn tls_hint(text: &str, server: &str) -> Option<String> {
    if text.contains("UnknownIssuer") || text.contains("unknown issuer") {
        return Some(
            "the server's certificate is not signed by a CA this client trusts: give the CA \
             with --tls-ca (NOVA_TLS_CA)"
                .into(),
        );
    }
    if text.contains("NotValidForName") || text.contains("not valid for name") {
        return Some(
            "the server's certificate is for another name: connect by that name, or give it \
             with --tls-server-name"
                .into(),
        );
    }
    if text.contains("CertificateRequired") || text.contains("certificate required") {
        return Some(
            "the server requires a client certificate (mutual TLS): give --client-cert and \
             --client-key"
                .into(),
        );
    }
    if server.starts_with("https://")
        && (text.contains("InvalidContentType")
            || text.contains("corrupt message")
            || text.contains("received corrupt"))
    {
        return Some("the server does not speak TLS: use http://".into());
    }
    None
}

/// A gRPC client that reached a server that does not speak gRPC (the metrics endpoint, a web
/// server) fails in its HTTP/2 handshake, or gets an HTTP answer without a gRPC status; these
/// are the ways hyper, h2 and tonic report it.
pub(crate) fn looks_like_http1(text: &str) -> bool {
    [
        "grpc-status header missing",
        "frame with invalid size",
        "invalid HTTP version",
        "http2 error: connection error detected",
        "received HTTP/1",
        "PROTOCOL_ERROR",
        "protocol error",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// The server URL to connect to: `HOST:PORT` means `http://HOST:PORT`; `https://` speaks TLS.
pub fn server_url(server: &str) -> Result<String, CliError> {
    if server.starts_with("http://") || server.starts_with("https://") {
        return Ok(server.to_owned());
    }
    if server.contains("://") {
        return Err(CliError::invalid(format!(
            "--server {server}: nova speaks gRPC over http:// or https://"
        ))
        .with_hint("novad listens on http://127.0.0.1:7400 by default"));
    }
    Ok(format!("http://{server}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        assert_eq!(
            server_url("127.0.0.1:7400").unwrap(),
            "http://127.0.0.1:7400"
        );
        assert_eq!(server_url("http://h:1").unwrap(), "http://h:1");
        assert_eq!(server_url("https://h:1").unwrap(), "https://h:1");
        assert!(server_url("ftp://h").is_err());
    }

    #[test]
    fn connection_failures_get_a_hint() {
        let refused = Error::Connect {
            url: "http://127.0.0.1:1".into(),
            message: "transport error: tcp connect error: Connection refused (os error 111)".into(),
        };
        let refused = hint(&refused, "http://127.0.0.1:1").unwrap();
        assert!(
            refused.contains("nothing listens on 127.0.0.1:1"),
            "{refused}"
        );
        let http1 = Error::Connect {
            url: "http://127.0.0.1:7401".into(),
            message:
                "transport error: http2 error: connection error detected: frame with invalid size"
                    .into(),
        };
        assert!(
            hint(&http1, "http://127.0.0.1:7401")
                .unwrap()
                .contains("metrics port")
        );
    }
}
