//! How a failure below the gRPC edge reaches a client: one conversion into `RequestError` from
//! each error the storage layers raise, each arm saying why it gets its code. The code decides
//! what a client does next (retry, give up, report data loss), so a failure gets the same code
//! whichever path it took.

use nova_proto::RequestError;

use crate::catalog::CatalogError;
use crate::flight::FetchError;
use crate::metastore::MetastoreError;
use crate::object_store::StoreError;

impl From<StoreError> for RequestError {
    fn from(err: StoreError) -> Self {
        match err {
            // An outage, throttling, a timeout: the same request may well succeed later.
            StoreError::Transient { .. } => RequestError::Unavailable(err.to_string()),
            // The server looked for an object it expected (a client never names one, except a
            // peer's FetchRange, which says so itself), or the store refused for good: the
            // server's problem, and no retry of the client's changes it.
            StoreError::NotFound { .. }
            | StoreError::InvalidRange { .. }
            | StoreError::Permanent { .. } => RequestError::Internal(err.to_string()),
        }
    }
}

impl From<MetastoreError> for RequestError {
    fn from(err: MetastoreError) -> Self {
        match err {
            // etcd not answering (down, electing a leader, out of disk): it may pass.
            MetastoreError::Unavailable(_) => RequestError::Unavailable(err.to_string()),
            // etcd refusing a call (its permissions, a request it calls invalid) or the
            // embedded database failing. Not known to pass, but every path answered UNAVAILABLE
            // for it before the backends told their causes apart; kept so until they do.
            MetastoreError::Internal(_) => RequestError::Unavailable(err.to_string()),
            // What this metastore cannot do, or a transaction over its limit: the same request
            // fails the same way every time.
            MetastoreError::Unsupported(_) | MetastoreError::TooLarge { .. } => {
                RequestError::Internal(err.to_string())
            }
        }
    }
}

impl From<CatalogError> for RequestError {
    fn from(err: CatalogError) -> Self {
        match err {
            // The client named a stream that exists, or one that does not.
            CatalogError::AlreadyExists(name) => RequestError::StreamExists(name),
            CatalogError::NotFound(name) => RequestError::StreamNotFound(name),
            CatalogError::Metastore(err) => err.into(),
            // Another writer owns what this server expected to own (a chain, a leadership), or
            // a record it cannot decode: the server's state, not the client's request, is at
            // fault. (A corrupt record called UNAVAILABLE would be retried for ever; the one
            // conflict a retry can clear, a stream changed while being deleted, was INTERNAL
            // before too.)
            CatalogError::Conflict(_) | CatalogError::Deposed(_) | CatalogError::Corrupt(_) => {
                RequestError::Internal(err.to_string())
            }
        }
    }
}

/// How a failed fetch reaches a reader, the same on the star and on a gateway: damaged bytes are
/// data loss, an outage is worth retrying, and anything else is the server's problem.
impl From<FetchError> for RequestError {
    fn from(err: FetchError) -> Self {
        Self::from(&err)
    }
}

impl From<&FetchError> for RequestError {
    fn from(err: &FetchError) -> Self {
        match err {
            FetchError::Format { .. } => RequestError::DataLoss(err.to_string()),
            FetchError::Store(store) if store.is_retryable() => {
                RequestError::Unavailable(err.to_string())
            }
            FetchError::Store(_) => RequestError::Internal(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object_store::Op;
    use nova_proto::Code;

    #[test]
    fn each_failure_gets_the_code_that_says_what_to_do_next() {
        let store = |err: StoreError| RequestError::from(err).code();
        let (op, key) = (Op::Get, "k".to_owned());
        let message = String::new();
        assert_eq!(
            store(StoreError::Transient {
                op,
                key: key.clone(),
                message: message.clone()
            }),
            Code::Unavailable
        );
        assert_eq!(
            store(StoreError::Permanent {
                op,
                key: key.clone(),
                message
            }),
            Code::Internal
        );
        assert_eq!(store(StoreError::NotFound { key }), Code::Internal);

        let meta = |err: MetastoreError| RequestError::from(err).code();
        assert_eq!(
            meta(MetastoreError::Unavailable("x".into())),
            Code::Unavailable
        );
        assert_eq!(
            meta(MetastoreError::Internal("x".into())),
            Code::Unavailable
        );
        assert_eq!(
            meta(MetastoreError::TooLarge {
                ops: 200,
                limit: 128
            }),
            Code::Internal
        );

        let catalog = |err: CatalogError| RequestError::from(err).code();
        assert_eq!(catalog(CatalogError::NotFound("s".into())), Code::NotFound);
        assert_eq!(
            catalog(CatalogError::AlreadyExists("s".into())),
            Code::AlreadyExists
        );
        assert_eq!(catalog(CatalogError::Corrupt("bad".into())), Code::Internal);
        assert_eq!(
            catalog(CatalogError::Metastore(MetastoreError::Unavailable(
                "x".into()
            ))),
            Code::Unavailable
        );
    }
}

/// The refusals a star makes of its own that more than one path gives, worded once.
pub mod refusal {
    use nova_proto::RequestError;

    use crate::limits::STALE_REF_RETRIES;

    /// The star is stopping: what it has not acknowledged, it will not.
    pub fn shutting_down() -> RequestError {
        RequestError::Unavailable("the star is shutting down; retry against its successor".into())
    }

    /// The star lost its chain (`reason` says how) and acknowledges nothing more; its
    /// successor takes the streams up.
    pub fn fenced(reason: String) -> RequestError {
        RequestError::Unavailable(reason)
    }

    /// A read resolved its records again [`STALE_REF_RETRIES`] times and found `key` gone
    /// each time: the auditor moved them faster than the read could fetch them (or something
    /// else deleted `key`). The stream is there and the read may be tried again, so it is
    /// answered as unavailable, never as a stream or object not found.
    pub fn stale_refs_exhausted(stream: &str, key: &str) -> RequestError {
        RequestError::Unavailable(format!(
            "reading stream {stream:?}: {key} was gone each of {} times the read resolved its \
             records again (the auditor is moving them); try again",
            STALE_REF_RETRIES + 1
        ))
    }
}
