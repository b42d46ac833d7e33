//! Saying on stderr that `nova` is retrying, so that a command waiting on a refusing or absent
//! server reads as waiting rather than hung: what was refused, why, and when the next attempt
//! goes out (and, for an append, when it gives up). At most one notice a second, however fast
//! the retries come; with `--output json`, one JSON object per line.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use nova_client::Retrying;
use nova_proto::error::code_name;

use crate::when::format_duration;

/// The least time between two notices.
const QUIET: Duration = Duration::from_secs(1);

/// Prints retry notices, rate-limited.
pub struct Notices {
    json: bool,
    last: Mutex<Option<Instant>>,
}

#[derive(Serialize)]
struct RetryingJson<'a> {
    retrying: RetryingBody<'a>,
}

#[derive(Serialize)]
struct RetryingBody<'a> {
    what: &'a str,
    attempt: u32,
    /// The gRPC code of the refusal, or `DISCONNECTED` when no server answered.
    code: &'a str,
    message: String,
    retry_in_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    gives_up_in_ms: Option<u64>,
}

impl Notices {
    pub fn new(json: bool) -> Self {
        Self {
            json,
            last: Mutex::new(None),
        }
    }

    /// Reports `retrying` unless a notice went out less than a second ago.
    pub fn tell(&self, retrying: &Retrying) {
        let now = Instant::now();
        {
            let Ok(mut last) = self.last.lock() else {
                return;
            };
            if last.is_some_and(|at| now.duration_since(at) < QUIET) {
                return;
            }
            *last = Some(now);
        }
        let mut err = std::io::stderr().lock();
        if self.json {
            let body = RetryingJson {
                retrying: RetryingBody {
                    what: &retrying.what,
                    attempt: retrying.attempt,
                    code: retrying.cause.code().map_or("DISCONNECTED", code_name),
                    message: retrying.cause.to_string(),
                    retry_in_ms: retrying.wait.as_millis() as u64,
                    gives_up_in_ms: retrying.gives_up_in.map(|d| d.as_millis() as u64),
                },
            };
            let _ = serde_json::to_writer(&mut err, &body);
            let _ = err.write_all(b"\n");
        } else {
            let _ = writeln!(err, "nova: {}", describe(retrying));
        }
    }
}

/// One line for people.
fn describe(retrying: &Retrying) -> String {
    let until = match retrying.gives_up_in {
        Some(left) => format!("; gives up in {}", format_duration(left)),
        None => String::new(),
    };
    format!(
        "retrying {} (retry {}): {}; next attempt in {}{until}",
        retrying.what,
        retrying.attempt,
        retrying.cause,
        format_duration(retrying.wait),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_says_what_why_and_when() {
        let retrying = Retrying {
            what: "append to \"x\"".into(),
            attempt: 3,
            cause: nova_client::Error::Status {
                code: tonic::Code::Unavailable,
                message: "express appends are refused for now".into(),
                retry_after: Some(Duration::from_millis(500)),
                next_seq: None,
                first_seq: None,
                leader: None,
            },
            wait: Duration::from_millis(1500),
            gives_up_in: Some(Duration::from_secs(40)),
        };
        let line = describe(&retrying);
        assert!(
            line.contains("retrying append to \"x\" (retry 3)"),
            "{line}"
        );
        assert!(
            line.contains("express appends are refused for now"),
            "{line}"
        );
        assert!(line.contains("next attempt in"), "{line}");
        assert!(line.contains("gives up in"), "{line}");
    }
}
