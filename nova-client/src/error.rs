use std::time::Duration;

use tonic::Code;

/// What went wrong, with enough to decide whether to retry.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to {url}: {message}")]
    Connect { url: String, message: String },
    /// The server refused or failed the call.
    #[error("{code:?}: {message}")]
    Status {
        code: Code,
        message: String,
        /// The server's hint for when to try again (RESOURCE_EXHAUSTED, UNAVAILABLE).
        retry_after: Option<Duration>,
        /// For a match_seq_num mismatch: the stream's next sequence number.
        next_seq: Option<u64>,
        /// For a read below a stream's trim point (OUT_OF_RANGE): the first record it still
        /// holds, where a consumer that may skip ahead resumes.
        first_seq: Option<u64>,
        /// For a redirect (UNAVAILABLE from a star that does not lead the stream): where the
        /// leader listens. The [`crate::Client`] follows it on its own.
        leader: Option<String>,
    },
    #[error("the append session ended: {0}")]
    SessionClosed(String),
    /// A producer gave up after its retry budget; `last` is why the last attempt failed.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted { attempts: u32, last: Box<Error> },
    /// A producer's batch was not acknowledged within its delivery timeout, retries included.
    /// The producer stops: the batches after it fail with the same error, unsent.
    #[error(
        "the {records} records from seq {start_seq} were not acknowledged within the {:?} \
         delivery timeout ({}); the last failure: {last}",
        timeout,
        if *outcome_unknown {
            "outcome unknown: an attempt may still land, so they may or may not be appended"
        } else {
            "they were not appended: every attempt was refused"
        }
    )]
    DeliveryTimeout {
        /// Where the batch starts, and how many records it holds.
        start_seq: u64,
        records: u64,
        timeout: Duration,
        /// Whether an attempt of the batch went unanswered or was answered "outcome unknown",
        /// so that it may be durable after all.
        outcome_unknown: bool,
        /// Why the last attempt failed.
        last: Box<Error>,
    },
}

/// What kind of failure an [`Error`] is, in the SDK's own terms rather than gRPC's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is wrong (a cap exceeded, a bad name); sending it again fails again.
    InvalidArgument,
    StreamNotFound,
    StreamExists,
    /// A read below the stream's first record (retention trimmed it): see `Error::first_seq`.
    Trimmed,
    /// `match_seq_num` did not match: see `Error::next_seq`.
    SeqMismatch,
    /// A cap or the fleet's capacity: retry after `Error::retry_after`.
    Exhausted,
    /// Nothing was done; retrying may succeed (a star down, shutting down, or redirecting).
    Unavailable,
    /// The append may or may not be durable: resend only with `match_seq_num`.
    OutcomeUnknown,
    /// The server is missing data it should have, or failed.
    Internal,
    /// No connection could be made, or a session ended.
    Disconnected,
    /// A producer's retry budget or delivery timeout ran out.
    GaveUp,
    /// No token, or one the server does not know: give one (`with_token`).
    Unauthenticated,
    /// The token lacks the scope the call needs on that stream; the message names it.
    PermissionDenied,
    /// Anything else the server answered.
    Other,
}

impl Error {
    /// The SDK's code for this failure.
    pub fn kind(&self) -> ErrorCode {
        match self {
            Error::Connect { .. } | Error::SessionClosed(_) => ErrorCode::Disconnected,
            Error::RetriesExhausted { .. } | Error::DeliveryTimeout { .. } => ErrorCode::GaveUp,
            Error::Status { code, .. } => match code {
                Code::InvalidArgument => ErrorCode::InvalidArgument,
                Code::NotFound => ErrorCode::StreamNotFound,
                Code::AlreadyExists => ErrorCode::StreamExists,
                Code::OutOfRange => ErrorCode::Trimmed,
                Code::FailedPrecondition => ErrorCode::SeqMismatch,
                Code::ResourceExhausted => ErrorCode::Exhausted,
                Code::Unavailable | Code::Aborted => ErrorCode::Unavailable,
                Code::DeadlineExceeded | Code::Unknown | Code::Cancelled => {
                    ErrorCode::OutcomeUnknown
                }
                Code::Internal | Code::DataLoss => ErrorCode::Internal,
                Code::Unauthenticated => ErrorCode::Unauthenticated,
                Code::PermissionDenied => ErrorCode::PermissionDenied,
                _ => ErrorCode::Other,
            },
        }
    }

    /// The server's hint for when to try again, if it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Status { retry_after, .. } => *retry_after,
            Error::RetriesExhausted { last, .. } | Error::DeliveryTimeout { last, .. } => {
                last.retry_after()
            }
            _ => None,
        }
    }

    /// For a `match_seq_num` mismatch: where the stream is.
    pub fn next_seq(&self) -> Option<u64> {
        match self {
            Error::Status { next_seq, .. } => *next_seq,
            Error::RetriesExhausted { last, .. } | Error::DeliveryTimeout { last, .. } => {
                last.next_seq()
            }
            _ => None,
        }
    }

    /// The stream's first available record, when this read asked for records its retention
    /// trimmed.
    pub fn first_seq(&self) -> Option<u64> {
        match self {
            Error::Status { first_seq, .. } => *first_seq,
            Error::RetriesExhausted { last, .. } | Error::DeliveryTimeout { last, .. } => {
                last.first_seq()
            }
            _ => None,
        }
    }

    /// Where the stream's leader listens, when this was a redirect.
    pub fn leader(&self) -> Option<&str> {
        match self {
            Error::Status { leader, .. } => leader.as_deref(),
            Error::RetriesExhausted { last, .. } | Error::DeliveryTimeout { last, .. } => {
                last.leader()
            }
            _ => None,
        }
    }

    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Status { code, .. } => Some(*code),
            Error::RetriesExhausted { last, .. } | Error::DeliveryTimeout { last, .. } => {
                last.code()
            }
            _ => None,
        }
    }

    /// Whether sending the same request again may succeed. A retryable failure applied
    /// nothing. An append whose outcome is unknown ([`Error::is_outcome_unknown`]) is
    /// retryable too, but only safely with `match_seq_num` (the [`crate::Producer`] always
    /// sends one), or after checking the stream's tail.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::SessionClosed(_) => true,
            Error::RetriesExhausted { .. } | Error::DeliveryTimeout { .. } => false,
            Error::Status { code, .. } => matches!(
                code,
                Code::Unavailable
                    | Code::ResourceExhausted
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::Unknown
                    | Code::Cancelled
            ),
        }
    }

    /// Whether an append that failed this way may nonetheless be durable: the star said
    /// "outcome unknown" (DEADLINE_EXCEEDED: its flight may still land, or landed and could
    /// not be acknowledged), a deadline ran out, or the connection broke before the answer
    /// (UNKNOWN, CANCELLED, a session that ended with answers owed). Blindly sending it again
    /// may write it twice: resend it with `match_seq_num`, or compare the stream's tail first.
    pub fn is_outcome_unknown(&self) -> bool {
        match self {
            Error::SessionClosed(_) => true,
            Error::RetriesExhausted { last, .. } => last.is_outcome_unknown(),
            Error::DeliveryTimeout {
                outcome_unknown, ..
            } => *outcome_unknown,
            // The star answers every failure with a specific code, so UNKNOWN and CANCELLED
            // can only come from the transport (a connection reset mid-call).
            Error::Status { code, .. } => matches!(
                code,
                Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
            ),
            Error::Connect { .. } => false,
        }
    }
}

pub(crate) use nova_proto::error::with_causes;

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Error::Status {
            code: transport_code(&status),
            retry_after: nova_proto::error::retry_after(&status),
            message: status.message().to_owned(),
            next_seq: None,
            first_seq: nova_proto::error::first_seq(&status),
            leader: nova_proto::error::leader(&status),
        }
    }
}

/// A status the client's own HTTP/2 layer made when the connection broke under a call (a
/// server restarting, say) comes as INTERNAL; it is UNKNOWN here: the call may or may not have
/// been served, and trying again (reads) or resolving it (appends) is the right answer. A
/// server never sends such a status: its INTERNAL answers carry no transport error.
fn transport_code(status: &tonic::Status) -> Code {
    let broken_connection = status.code() == Code::Internal
        && std::error::Error::source(status).is_some()
        && status.message().starts_with("h2 protocol error");
    if broken_connection {
        Code::Unknown
    } else {
        status.code()
    }
}

impl From<nova_proto::v1::AppendError> for Error {
    fn from(e: nova_proto::v1::AppendError) -> Self {
        Error::Status {
            code: Code::from_i32(e.code),
            message: e.message,
            retry_after: e.retry_after_ms.map(std::time::Duration::from_millis),
            next_seq: e.next_seq,
            first_seq: None,
            leader: e.leader,
        }
    }
}
