//! The start-up check that a store can hold a chain: it must answer at all, accept writes, and
//! make conditional creates exclusive. A backend that ignores `If-None-Match` would let two
//! writers both own a slot, so a star refuses to start on one rather than discover it later.

use bytes::Bytes;

use super::{CreateOutcome, ObjectStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Worth trying again: the store did not answer.
    #[error("the start-up probe of the object store failed, for now: {0}")]
    Unreachable(StoreError),
    /// The store answered, and the answer rules it out until an operator acts.
    #[error("the object store refused the start-up probe: {0}")]
    Refused(StoreError),
    #[error(
        "the object store does not make conditional creates exclusive: a second create of {key} \
         with If-None-Match: * succeeded. Nova fences its chain with them, so it cannot run on \
         this backend (use S3, or a compatible server that implements conditional writes)"
    )]
    NoConditionalCreate { key: String },
}

impl ProbeError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProbeError::Unreachable(_))
    }
}

fn classify(err: StoreError) -> ProbeError {
    if err.is_retryable() {
        ProbeError::Unreachable(err)
    } else {
        ProbeError::Refused(err)
    }
}

/// Creates `key` twice with a conditional create (the second must find it taken), then
/// deletes it. `key` should be unique to this attempt.
pub async fn probe_conditional_create(
    store: &dyn ObjectStore,
    key: &str,
) -> Result<(), ProbeError> {
    let body = Bytes::from_static(b"nova start-up probe: safe to delete\n");
    match store.put_if_absent(key, body.clone().into()).await {
        // A leftover of an earlier attempt whose answer was lost counts as created.
        Ok(CreateOutcome::Created | CreateOutcome::AlreadyExists) => {}
        Err(err) => return Err(classify(err)),
    }
    let second = store.put_if_absent(key, body.into()).await;
    // The probe object is ours alone; removing it is tidiness, not correctness.
    let _ = store.delete(key).await;
    match second {
        Ok(CreateOutcome::AlreadyExists) => Ok(()),
        Ok(CreateOutcome::Created) => Err(ProbeError::NoConditionalCreate {
            key: key.to_owned(),
        }),
        Err(err) => Err(classify(err)),
    }
}
