//! The express checkpoint's copies in the regional bucket (`express-checkpoint/{star}/...`).
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
use nova_core::keys::express_checkpoint_prefix;
use nova_core::object_store::{ObjectStore, PutPayload, StoreError};

/// The key of one checkpoint's copy: `{prefix}{epoch:020}-{position:020}`, where `position` is
/// one past `through` (0 for none), so keys sort as checkpoints do.
fn key_of(star: &str, checkpoint: &ExpressCheckpoint) -> String {
    let position = checkpoint.through.map_or(0, |t| t.saturating_add(1));
    format!(
        "{}{:020}-{position:020}",
        express_checkpoint_prefix(star),
        checkpoint.epoch
    )
}

fn parse(star: &str, key: &str) -> Option<ExpressCheckpoint> {
    let rest = key.strip_prefix(&express_checkpoint_prefix(star))?;
    let (epoch, position) = rest.split_once('-')?;
    if epoch.len() != 20 || position.len() != 20 {
        return None;
    }
    let (epoch, position): (u64, u64) = (epoch.parse().ok()?, position.parse().ok()?);
    Some(ExpressCheckpoint {
        epoch,
        through: position.checked_sub(1),
    })
}

/// Every copy of `star`'s checkpoint in the bucket, oldest first (a handful: older ones are
/// deleted once a newer one is written).
async fn list(
    store: &dyn ObjectStore,
    star: &str,
) -> Result<Vec<(String, ExpressCheckpoint)>, StoreError> {
    let prefix = express_checkpoint_prefix(star);
    let mut found = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list(&prefix, after.as_deref(), 1000).await?;
        for object in &page.objects {
            if let Some(checkpoint) = parse(star, &object.key) {
                found.push((object.key.clone(), checkpoint));
            }
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return Ok(found),
        }
    }
}

/// Writes `checkpoint`'s copy, then deletes the older ones. Each copy has a key of its own and
/// readers take the highest, so the copy never moves backwards, even when a paused star's
/// write of an older checkpoint lands late.
pub async fn write(
    store: &dyn ObjectStore,
    star: &str,
    checkpoint: &ExpressCheckpoint,
) -> Result<(), StoreError> {
    let key = key_of(star, checkpoint);
    store
        .put(&key, PutPayload::from(checkpoint.encode()))
        .await?;
    for (older, _) in list(store, star).await? {
        if older < key {
            store.delete(&older).await?;
        }
    }
    Ok(())
}

/// `star`'s highest copy, `None` when it never had an express chain.
pub async fn read(
    store: &dyn ObjectStore,
    star: &str,
) -> Result<Option<ExpressCheckpoint>, MarkerError> {
    Ok(list(store, star)
        .await?
        .pop()
        .map(|(_, checkpoint)| checkpoint))
}

#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MarkerError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, MarkerError::Store(e) if e.is_retryable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::object_store::{LocalStore, StoreLimits};

    #[tokio::test]
    async fn the_highest_copy_wins_whatever_lands_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path(), StoreLimits::default()).unwrap();
        assert_eq!(read(&store, "s").await.unwrap(), None);
        let at = |epoch, through| ExpressCheckpoint { epoch, through };
        write(&store, "s", &at(6000, None)).await.unwrap();
        write(&store, "s", &at(6000, Some(15))).await.unwrap();
        assert_eq!(read(&store, "s").await.unwrap(), Some(at(6000, Some(15))));
        // A paused star's older copy lands late: the newer one still stands.
        write(&store, "s", &at(5000, Some(10))).await.unwrap();
        assert_eq!(read(&store, "s").await.unwrap(), Some(at(6000, Some(15))));
        // Slot 0 sorts after no slot, and another star's copies are its own.
        write(&store, "s", &at(6001, None)).await.unwrap();
        write(&store, "s", &at(6001, Some(0))).await.unwrap();
        write(&store, "t", &at(9000, Some(1))).await.unwrap();
        assert_eq!(read(&store, "s").await.unwrap(), Some(at(6001, Some(0))));
        assert_eq!(
            list(&store, "s").await.unwrap().len(),
            1,
            "older copies are deleted"
        );
    }
}
