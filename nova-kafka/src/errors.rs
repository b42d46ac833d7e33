//! Nova's refusals as Kafka error codes: a refusal a retry can fix maps to an error Kafka's
//! clients retry (backing off by `throttle_time_ms` where a response has one); one it cannot
//! maps to an error they report.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use nova_proto::RequestError;

use crate::batch::BatchError;
#[cfg(feature = "codecs")]
use crate::decompress::DecompressError;

/// A refusal of one partition's records or reads, as the response carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRefusal {
    pub error: ResponseError,
    pub message: String,
    /// How long the client should wait before it retries, when Nova knows.
    pub retry_after: Option<Duration>,
}

impl KafkaRefusal {
    pub fn new(error: ResponseError, message: impl Into<String>) -> Self {
        Self {
            error,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn code(&self) -> i16 {
        self.error.code()
    }

    /// `throttle_time_ms` for a response carrying this refusal.
    pub fn throttle_ms(&self) -> i32 {
        self.retry_after
            .map_or(0, |d| d.as_millis().min(i32::MAX as u128) as i32)
    }
}

impl From<&RequestError> for KafkaRefusal {
    fn from(error: &RequestError) -> Self {
        use ResponseError as K;
        let kafka = match error {
            RequestError::EmptyBatch | RequestError::InvalidRequest(_) => K::InvalidRequest,
            RequestError::TooManyRecords { .. }
            | RequestError::TooManyHeaders { .. }
            | RequestError::BatchTooLarge { .. } => K::RecordListTooLarge,
            RequestError::RecordTooLarge { .. } | RequestError::MessageTooLarge(_) => {
                K::MessageTooLarge
            }
            RequestError::InvalidStreamName { .. } => K::InvalidTopicException,
            RequestError::StreamNotFound(_) => K::UnknownTopicOrPartition,
            RequestError::Trimmed { .. } => K::OffsetOutOfRange,
            RequestError::StreamExists(_) => K::TopicAlreadyExists,
            // Kafka clients never send Nova's expected sequence numbers; a mismatch can only
            // be Nova's own idempotence check, which answers before this.
            RequestError::SeqMismatch { .. } => K::InvalidRequest,
            // Sheds and passing unavailability: retried, after the hint, and never written.
            RequestError::CapReached { .. } => K::NotEnoughReplicas,
            RequestError::Unavailable(_)
            | RequestError::UnavailableFor { .. }
            | RequestError::RedirectRefused { .. } => K::KafkaStorageError,
            RequestError::LimitReached { .. } => K::PolicyViolation,
            // The client refreshes its metadata, which names the leader.
            RequestError::NotLeader { .. } => K::NotLeaderOrFollower,
            // Retriable, and for an idempotent producer not known to be unwritten, as with
            // Kafka's own timeouts: its sequence numbers settle a retry.
            RequestError::OutcomeUnknown(_) => K::RequestTimedOut,
            RequestError::Unimplemented(_) => K::UnsupportedVersion,
            RequestError::Unauthenticated(_) => K::SaslAuthenticationFailed,
            RequestError::PermissionDenied(_) => K::TopicAuthorizationFailed,
            RequestError::ObjectNotFound(_)
            | RequestError::DataLoss(_)
            | RequestError::Internal(_) => K::UnknownServerError,
        };
        Self {
            error: kafka,
            message: error.to_string(),
            retry_after: error.retry_after(),
        }
    }
}

impl From<&BatchError> for KafkaRefusal {
    fn from(error: &BatchError) -> Self {
        let kafka = match error {
            BatchError::Magic(_) => ResponseError::UnsupportedForMessageFormat,
            _ => ResponseError::CorruptMessage,
        };
        Self::new(kafka, error.to_string())
    }
}

#[cfg(feature = "codecs")]
impl From<&DecompressError> for KafkaRefusal {
    fn from(error: &DecompressError) -> Self {
        match error {
            DecompressError::TooLarge { .. } => {
                Self::new(ResponseError::RecordListTooLarge, error.to_string())
            }
            DecompressError::NoRoom => Self {
                error: ResponseError::NotEnoughReplicas,
                message: error.to_string(),
                retry_after: Some(Duration::from_millis(100)),
            },
            DecompressError::Corrupt { .. } => {
                Self::new(ResponseError::CorruptMessage, error.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_retry_fixes_is_retriable_to_kafka_clients() {
        let retriable = [
            RequestError::CapReached {
                cap: "max_subscriptions",
                limit: 1,
                what: "reads",
                retry_after: Duration::from_millis(250),
            },
            RequestError::Unavailable("store down".into()),
            RequestError::NotLeader {
                stream: "t/0".into(),
                leader_id: "b".into(),
                leader_addr: "http://b".into(),
            },
            RequestError::StreamNotFound("t/0".into()),
            RequestError::OutcomeUnknown("landing".into()),
        ];
        for error in &retriable {
            let refusal = KafkaRefusal::from(error);
            assert!(refusal.error.is_retriable(), "{error:?} -> {refusal:?}");
        }
        let shed = KafkaRefusal::from(&retriable[0]);
        assert_eq!(shed.throttle_ms(), 250);
        let fatal = [
            RequestError::RecordTooLarge {
                index: 0,
                bytes: 2,
                cap: 1,
            },
            RequestError::PermissionDenied("no".into()),
        ];
        for error in &fatal {
            assert!(!KafkaRefusal::from(error).error.is_retriable(), "{error:?}");
        }
    }
}
