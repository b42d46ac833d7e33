//! Writing one flight at its slot. The write is a conditional create, retried with capped,
//! jittered backoff until it lands; a flight is never dropped and never reported durable early.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use nova_core::object_store::{CreateOutcome, GetRange, ObjectStore, PutPayload, StoreError};

use crate::shared::Shared;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// Somebody else's object sits at our slot: another writer owns the chain.
    #[error("slot {key} holds another writer's object")]
    Fenced { key: String },
    /// Shutdown's deadline passed before the flight landed.
    #[error("abandoned at shutdown before {key} was durable")]
    Abandoned { key: String },
}

/// Bytes of a flight's end that identify it: its footer and trailer, as the last parts of the
/// payload (`assemble_flight` lays them out that way).
fn identifying_suffix(payload: &PutPayload) -> Vec<u8> {
    let parts = payload.parts();
    parts[parts.len().saturating_sub(2)..].concat()
}

/// Whether the object that won our slot is the flight we tried to write. That happens when an
/// earlier attempt landed but its response was lost, and counts as success. Rather than read
/// the whole object back (a second copy of a flight, outside every budget), it compares the
/// size and the footer: the footer names this star, epoch, slot and creation time, and holds
/// every section's crc32c.
fn is_our_flight(payload: &PutPayload, existing_size: u64, existing_suffix: &[u8]) -> bool {
    payload.len() == existing_size && identifying_suffix(payload) == existing_suffix
}

/// Whether the object found at `key` by a conditional create is `payload`: an earlier attempt
/// landed and its answer was lost.
pub(crate) async fn is_ours(
    store: &dyn ObjectStore,
    key: &str,
    payload: &PutPayload,
) -> Result<bool, StoreError> {
    let suffix = identifying_suffix(payload).len() as u64;
    let existing = store.get(key, GetRange::Suffix(suffix)).await?;
    Ok(is_our_flight(
        payload,
        existing.object_size,
        &existing.bytes,
    ))
}

pub(crate) async fn write_flight(
    shared: Arc<Shared>,
    key: String,
    payload: PutPayload,
) -> Result<(), WriteError> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let clock = shared.config.clock;
        let started = clock.now();
        let outcome = tokio::select! {
            biased;
            outcome = shared.store.put_if_absent(&key, payload.clone()) => outcome,
            _ = shared.abandon.cancelled() => return Err(WriteError::Abandoned { key }),
        };
        let error: StoreError = match outcome {
            Ok(CreateOutcome::Created) => {
                recovered(&shared, attempt);
                return Ok(());
            }
            Ok(CreateOutcome::AlreadyExists) => {
                match is_ours(shared.store.as_ref(), &key, &payload).await {
                    Ok(true) => {
                        recovered(&shared, attempt);
                        return Ok(());
                    }
                    Ok(false) => return Err(WriteError::Fenced { key }),
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        shared.metrics.flight_write_retries.inc();
        let permanent = !error.is_retryable();
        // A permanent error (refused credentials, a missing bucket, a request the backend does
        // not support) will not clear on its own, but an operator can fix it without a
        // restart: keep trying, at the slowest pace, and say loudly what must be fixed.
        let delay = if permanent {
            shared.config.retry.max
        } else {
            shared.config.retry.delay(attempt, &shared.config.entropy)
        };
        {
            let mut failing = shared.health.writes_failing_since.lock();
            if failing.is_none() {
                *failing = Some(started);
            }
        }
        let newly_rejecting =
            permanent && !shared.health.writes_rejecting.swap(true, Ordering::AcqRel);
        if permanent {
            shared.metrics.store_rejecting.set(1);
        }
        if newly_rejecting {
            tracing::error!(
                key,
                attempt,
                retry_in_ms = delay.as_millis() as u64,
                "the object store refuses flight writes with an error retrying will not fix; \
                 appends are blocked until an operator fixes it (credentials, bucket, endpoint), \
                 and novad keeps trying every {}s: {error}",
                delay.as_secs()
            );
        } else if attempt == 1 || attempt.is_multiple_of(10) {
            // First failure and then every tenth: enough to follow an outage without a line per
            // attempt.
            tracing::warn!(
                key,
                attempt,
                retry_in_ms = delay.as_millis() as u64,
                permanent,
                "flight write failed, retrying until it lands: {error}"
            );
        }
        tokio::select! {
            biased;
            _ = clock.sleep(delay) => {}
            _ = shared.abandon.cancelled() => return Err(WriteError::Abandoned { key }),
        }
    }
}

/// Clears the failing state after a successful write; the first writer to succeed after an
/// outage logs it (the others find the state already clear).
fn recovered(shared: &Shared, attempt: u32) {
    let since = shared.health.writes_failing_since.lock().take();
    if shared.health.writes_rejecting.swap(false, Ordering::AcqRel) {
        shared.metrics.store_rejecting.set(0);
    }
    if let Some(since) = since {
        tracing::info!(
            attempts = attempt,
            failing_for_ms = shared.config.clock.since(since).as_millis() as u64,
            "flight writes are landing again"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn our_flight_is_recognised_by_size_and_footer() {
        let payload = PutPayload::from_parts(vec![
            Bytes::from_static(b"header"),
            Bytes::from_static(b"body"),
            Bytes::from_static(b"footer"),
            Bytes::from_static(b"trailer"),
        ]);
        assert!(is_our_flight(&payload, 23, b"footertrailer"));
        assert!(!is_our_flight(&payload, 23, b"footerXrailer"));
        assert!(!is_our_flight(&payload, 24, b"footertrailer"));
    }
}
