//! Errors a client can see, and how each maps to a gRPC code. The mapping is the contract
//! clients retry by, so each arm says why its code is the right one.

use std::time::Duration;

use tonic::{Code, Status};

use crate::v1;

/// Metadata key carrying a retry hint in milliseconds on RESOURCE_EXHAUSTED and UNAVAILABLE.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// The retry hint of an UNAVAILABLE refusal that knows no better one (a star shutting down or
/// fenced, a metastore or object store that did not answer): about what a restart, a takeover
/// or a blip takes to pass, and long enough that a fleet of producers does not hammer a star
/// that is going away.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Metadata key carrying the stream's first available sequence number on OUT_OF_RANGE.
pub const FIRST_SEQ: &str = "first-seq";
/// Metadata on an UNAVAILABLE status from a star that does not lead the stream: where the
/// leader listens.
pub const LEADER: &str = "leader";

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("append batch is empty: send at least one record")]
    EmptyBatch,
    #[error("append batch has {records} records, over --max-batch-records={cap}")]
    TooManyRecords { records: u64, cap: u32 },
    #[error(
        "append batch has {headers} headers, over the {cap} a batch may hold (--max-batch-records)"
    )]
    TooManyHeaders { headers: u64, cap: u32 },
    #[error("append batch holds {bytes} bytes, over --max-batch-bytes={cap}")]
    BatchTooLarge { bytes: u64, cap: u64 },
    #[error("record {index} of the batch holds {bytes} bytes, over --max-record-bytes={cap}")]
    RecordTooLarge { index: u64, bytes: u64, cap: u64 },
    #[error("stream name {name:?} {reason}")]
    InvalidStreamName { name: String, reason: &'static str },
    /// A request field or frame that cannot be understood.
    #[error("{0}")]
    InvalidRequest(String),
    /// A message larger than the transport accepts; the session ends.
    #[error("{0}")]
    MessageTooLarge(String),
    #[error("stream {0:?} does not exist")]
    StreamNotFound(String),
    /// The records asked for were trimmed by the stream's retention.
    #[error(
        "record {seq} of stream {stream:?} is past its retention and was trimmed; the stream's \
         first available record is {first_seq}"
    )]
    Trimmed {
        stream: String,
        seq: u64,
        first_seq: u64,
    },
    #[error("object {0} not found")]
    ObjectNotFound(String),
    #[error("stream {0:?} already exists")]
    StreamExists(String),
    #[error(
        "match_seq_num {expected} does not match stream {stream:?}'s next sequence number {next_seq}"
    )]
    SeqMismatch {
        stream: String,
        expected: u64,
        next_seq: u64,
    },
    #[error("{cap} reached ({limit}): {what}; retry after {retry_after:?}")]
    CapReached {
        cap: &'static str,
        limit: u64,
        what: &'static str,
        retry_after: Duration,
    },
    /// A fixed limit on how much of something may exist (not a passing load): retrying does
    /// not help until something is removed or the limit is raised.
    #[error("{cap} reached ({limit}): {what}")]
    LimitReached {
        cap: &'static str,
        limit: u64,
        what: &'static str,
    },
    #[error("{0}")]
    Unavailable(String),
    /// Nothing was acknowledged, and the server knows when a retry may succeed: an Express
    /// bundle missed its zone quorum and the express chain is being sealed.
    #[error("{reason}; retry after {retry_after:?}")]
    UnavailableFor {
        reason: String,
        retry_after: Duration,
    },
    /// Another star leads the stream: a redirect.
    #[error(
        "stream {stream:?} is led by star {leader_id:?} at {leader_addr}; send its requests there"
    )]
    NotLeader {
        stream: String,
        leader_id: String,
        leader_addr: String,
    },
    /// The router would not follow a redirect: the leader it names is not trusted as the seed
    /// is (TLS). UNAVAILABLE as a redirect is, but with no hint to retry: the same redirect
    /// is refused again until the client's trust settings change.
    #[error("not following a redirect to {url}: {why}")]
    RedirectRefused { url: String, why: String },
    /// The append may or may not be durable: its flight may still land, or landed but could
    /// not be acknowledged. Retrying it blindly may write it twice.
    #[error(
        "outcome unknown: {0}; check the stream's tail (or retry with match_seq_num) before sending it again"
    )]
    OutcomeUnknown(String),
    /// This server does not serve the call (a gateway asked to append).
    #[error("{0}")]
    Unimplemented(String),
    /// No token, or one the server does not know. The message never repeats the token.
    #[error("{0}")]
    Unauthenticated(String),
    /// A known token without the scope the call needs; the message names the scope.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    DataLoss(String),
    #[error("{0}")]
    Internal(String),
}

impl RequestError {
    /// The same failure with `what` (the operation, the stream) in front of a free-form
    /// message: the code, and so what the client does next, stays as the conversion chose it.
    /// Failures whose message the table writes itself are returned unchanged.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        match self {
            RequestError::Unavailable(m) => RequestError::Unavailable(format!("{what}: {m}")),
            RequestError::DataLoss(m) => RequestError::DataLoss(format!("{what}: {m}")),
            RequestError::Internal(m) => RequestError::Internal(format!("{what}: {m}")),
            other => other,
        }
    }

    pub fn code(&self) -> Code {
        match self {
            // The request itself is wrong; sending it again unchanged fails again.
            RequestError::EmptyBatch
            | RequestError::TooManyRecords { .. }
            | RequestError::TooManyHeaders { .. }
            | RequestError::BatchTooLarge { .. }
            | RequestError::RecordTooLarge { .. }
            | RequestError::InvalidStreamName { .. }
            | RequestError::InvalidRequest(_) => Code::InvalidArgument,
            // gRPC's code for a message over the receiver's size limit.
            RequestError::MessageTooLarge(_) => Code::ResourceExhausted,
            RequestError::StreamNotFound(_) | RequestError::ObjectNotFound(_) => Code::NotFound,
            RequestError::StreamExists(_) => Code::AlreadyExists,
            // gRPC's code for reading past the valid range; the first valid seq is in the
            // message and in the `first-seq` metadata.
            RequestError::Trimmed { .. } => Code::OutOfRange,
            // The stream moved on; the producer must decide what its next seq is.
            RequestError::SeqMismatch { .. } => Code::FailedPrecondition,
            // Nothing was admitted; retrying after the hint is always safe.
            RequestError::CapReached { .. } | RequestError::LimitReached { .. } => {
                Code::ResourceExhausted
            }
            // Nothing was acknowledged; the client may retry (with match_seq_num to stay exact).
            RequestError::Unavailable(_)
            | RequestError::UnavailableFor { .. }
            | RequestError::RedirectRefused { .. } => Code::Unavailable,
            // A redirect: nothing was done here; the leader named in the metadata will.
            RequestError::NotLeader { .. } => Code::Unavailable,
            // gRPC's own code for "this may have happened": DEADLINE_EXCEEDED is documented as
            // possibly returned after a state change succeeded, and no client retries it blindly
            // by default. The SDK resolves it against the stream's tail.
            RequestError::OutcomeUnknown(_) => Code::DeadlineExceeded,
            RequestError::Unimplemented(_) => Code::Unimplemented,
            RequestError::Unauthenticated(_) => Code::Unauthenticated,
            RequestError::PermissionDenied(_) => Code::PermissionDenied,
            RequestError::DataLoss(_) => Code::DataLoss,
            RequestError::Internal(_) => Code::Internal,
        }
    }

    /// When a retry may succeed, on every refusal a retry can fix: the caps' hints, the
    /// express chain's, and a default for every other UNAVAILABLE. A redirect needs none (the
    /// leader is named), and neither does a refusal a retry cannot fix.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RequestError::CapReached { retry_after, .. }
            | RequestError::UnavailableFor { retry_after, .. } => Some(*retry_after),
            RequestError::Unavailable(_) => Some(UNAVAILABLE_RETRY_AFTER),
            _ => None,
        }
    }

    /// The per-request error carried in an `AppendAck`.
    pub fn to_append_error(&self) -> v1::AppendError {
        v1::AppendError {
            code: self.code() as i32,
            message: self.to_string(),
            next_seq: match self {
                RequestError::SeqMismatch { next_seq, .. } => Some(*next_seq),
                _ => None,
            },
            leader: match self {
                RequestError::NotLeader { leader_addr, .. } => Some(leader_addr.clone()),
                _ => None,
            },
            retry_after_ms: self.retry_after().map(|d| d.as_millis() as u64),
        }
    }
}

impl From<RequestError> for Status {
    fn from(err: RequestError) -> Status {
        let mut status = Status::new(err.code(), err.to_string());
        if let Some(retry_after) = err.retry_after()
            && let Ok(value) = retry_after.as_millis().to_string().parse()
        {
            status.metadata_mut().insert(RETRY_AFTER_MS, value);
        }
        if let RequestError::Trimmed { first_seq, .. } = &err
            && let Ok(value) = first_seq.to_string().parse()
        {
            status.metadata_mut().insert(FIRST_SEQ, value);
        }
        if let RequestError::NotLeader { leader_addr, .. } = &err
            && let Ok(value) = leader_addr.parse()
        {
            status.metadata_mut().insert(LEADER, value);
        }
        status
    }
}

/// An error and every cause under it on one line, joined with ": ". Transport and SDK errors
/// say little themselves ("transport error", "an error occurred while loading credentials");
/// what went wrong is in their causes. A cause whose words the line already holds is skipped.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = inner.source();
    }
    text
}

/// Reads the first available sequence number off an OUT_OF_RANGE status, if the server sent it.
pub fn first_seq(status: &Status) -> Option<u64> {
    status
        .metadata()
        .get(FIRST_SEQ)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Reads the leader's address off a redirect (an UNAVAILABLE status naming it), if it is one.
pub fn leader(status: &Status) -> Option<String> {
    Some(status.metadata().get(LEADER)?.to_str().ok()?.to_owned())
}

/// Reads the retry hint off a status, if the server sent one.
pub fn retry_after(status: &Status) -> Option<Duration> {
    let value = status.metadata().get(RETRY_AFTER_MS)?.to_str().ok()?;
    value.parse::<u64>().ok().map(Duration::from_millis)
}

/// The code's name as gRPC spells it in its documentation (`NOT_FOUND`): for metric labels,
/// logs and the CLI's JSON errors.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_carries_its_cap_and_hint() {
        let err = RequestError::CapReached {
            cap: "--max-producer-sessions",
            limit: 4096,
            what: "producer sessions",
            retry_after: Duration::from_millis(1500),
        };
        let status = Status::from(err);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("--max-producer-sessions"));
        assert_eq!(retry_after(&status), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn a_redirect_names_the_leader() {
        let err = RequestError::NotLeader {
            stream: "s".into(),
            leader_id: "b".into(),
            leader_addr: "http://10.0.0.2:7400".into(),
        };
        assert_eq!(
            err.to_append_error().leader.as_deref(),
            Some("http://10.0.0.2:7400")
        );
        let status = Status::from(err);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().contains("led by star \"b\""));
        assert_eq!(leader(&status).as_deref(), Some("http://10.0.0.2:7400"));
    }

    #[test]
    fn a_read_below_the_trim_point_names_the_first_seq() {
        let status = Status::from(RequestError::Trimmed {
            stream: "s".into(),
            seq: 3,
            first_seq: 40,
        });
        assert_eq!(status.code(), Code::OutOfRange);
        assert!(status.message().contains("first available record is 40"));
        assert_eq!(first_seq(&status), Some(40));
    }

    #[test]
    fn a_mismatch_reports_the_next_seq() {
        let err = RequestError::SeqMismatch {
            stream: "s".into(),
            expected: 3,
            next_seq: 10,
        };
        let wire = err.to_append_error();
        assert_eq!(wire.code, Code::FailedPrecondition as i32);
        assert_eq!(wire.next_seq, Some(10));
    }

    #[test]
    fn every_retryable_refusal_says_when_to_come_back() {
        let unavailable = Status::from(RequestError::Unavailable(
            "the star is shutting down; retry against its successor".into(),
        ));
        assert_eq!(unavailable.code(), Code::Unavailable);
        assert_eq!(retry_after(&unavailable), Some(UNAVAILABLE_RETRY_AFTER));
        let express = RequestError::UnavailableFor {
            reason: "zones".into(),
            retry_after: Duration::from_millis(2000),
        };
        assert_eq!(express.to_append_error().retry_after_ms, Some(2000));
        // Refusals a retry cannot fix, and redirects, carry none.
        for err in [
            RequestError::EmptyBatch,
            RequestError::StreamNotFound("s".into()),
            RequestError::NotLeader {
                stream: "s".into(),
                leader_id: "b".into(),
                leader_addr: "http://b".into(),
            },
            // Refused again until the client's trust settings change: no hint to come back.
            RequestError::RedirectRefused {
                url: "https://b".into(),
                why: "not trusted".into(),
            },
        ] {
            assert_eq!(err.retry_after(), None, "{err}");
        }
        let refused = Status::from(RequestError::RedirectRefused {
            url: "https://b".into(),
            why: "not trusted".into(),
        });
        assert_eq!(refused.code(), Code::Unavailable);
        assert_eq!(
            refused.message(),
            "not following a redirect to https://b: not trusted"
        );
    }
}
