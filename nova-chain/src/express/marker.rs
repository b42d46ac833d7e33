//! The express checkpoint's copy in the regional bucket (`express-checkpoint/{star}`).
//!
//! The catalog's checkpoint says where a successor's walk of the express chain starts, and the
//! zone copies behind it are collected. A catalog rebuilt from the bucket cannot recompute it
//! (a bundle's slot is not in the Standard flight that carried it), and walking from an epoch's
//! first slot would find the collected slots empty, plug the first one and end the walk before
//! the bundles still unabsorbed. So a copy is kept in the regional bucket, always at or behind
//! the catalog's and at or ahead of everything collected:
//!
//! - recovery writes it once the catalog holds the checkpoint it moved to, before the express
//!   lane starts;
//! - the collector writes each checkpoint it is about to collect behind, before its deletes.
//!
//! A rebuild restores the catalog's checkpoint from it: everything behind it is in the Standard
//! chain, and nothing ahead of it has been collected. Its presence also tells a star started
//! without zone buckets that it once had an express chain.

use nova_core::catalog::ExpressCheckpoint;
use nova_core::keys::express_checkpoint_key;
use nova_core::object_store::{GetRange, ObjectStore, PutPayload, StoreError};

/// Writes `checkpoint` as `star`'s copy (an overwrite: only this star's recovery and collector
/// write it, one at a time).
pub async fn write(
    store: &dyn ObjectStore,
    star: &str,
    checkpoint: &ExpressCheckpoint,
) -> Result<(), StoreError> {
    store
        .put(
            &express_checkpoint_key(star),
            PutPayload::from(checkpoint.encode()),
        )
        .await
}

/// `star`'s copy, `None` when it never had an express chain.
pub async fn read(
    store: &dyn ObjectStore,
    star: &str,
) -> Result<Option<ExpressCheckpoint>, MarkerError> {
    let key = express_checkpoint_key(star);
    match store.get(&key, GetRange::All).await {
        Ok(got) => ExpressCheckpoint::decode(&got.bytes)
            .map(Some)
            .map_err(|e| MarkerError::Corrupt {
                key,
                reason: e.to_string(),
            }),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(err) => Err(MarkerError::Store(err)),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{key} is not an express checkpoint: {reason}")]
    Corrupt { key: String, reason: String },
}

impl MarkerError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, MarkerError::Store(e) if e.is_retryable())
    }
}
