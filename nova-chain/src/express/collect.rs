//! Collecting zone copies: once the catalog's express checkpoint has passed a bundle, the
//! Standard store and the index hold its records, and its copy in each zone is only cost. The
//! same goes for everything of an older express epoch (fences, and bundles past a plug that were
//! never acknowledged).
//!
//! Deletes go zone by zone in key order, so what a zone still holds is always a suffix of what
//! was written; a zone that is down keeps its copies until a later pass. Each pass deletes at
//! most `MAX_PER_PASS` objects per zone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use nova_core::catalog::ExpressCheckpoint;
use nova_core::keys::{express_prefix, express_root, parse_epoch, parse_slot};
use nova_core::metrics::Metrics;
use nova_core::object_store::StoreError;

use super::{Zone, Zones};

/// Objects one pass deletes in each zone at most.
pub const MAX_PER_PASS: usize = 1000;

/// How often the collector looks at the checkpoint at most: deletes are batched behind it.
const PASS_EVERY: Duration = Duration::from_secs(1);

/// Whether the object at `key` (under `express_root(star)`) is covered by `checkpoint`.
fn covered(star: &str, key: &str, checkpoint: &ExpressCheckpoint) -> Option<bool> {
    let epoch = parse_epoch(&express_root(star), key)?;
    if epoch != checkpoint.epoch {
        return Some(epoch < checkpoint.epoch);
    }
    let slot = parse_slot(&express_prefix(star, epoch), key)?;
    Some(checkpoint.through.is_some_and(|through| slot <= through))
}

/// Deletes, in one zone, the copies `checkpoint` covers, up to `MAX_PER_PASS`. Returns how
/// many went.
pub async fn collect_zone(
    zone: &Zone,
    star: &str,
    checkpoint: &ExpressCheckpoint,
) -> Result<u64, StoreError> {
    let page = zone
        .store
        .list(&express_root(star), None, MAX_PER_PASS)
        .await?;
    let mut deleted = 0;
    for object in &page.objects {
        match covered(star, &object.key, checkpoint) {
            Some(true) => {}
            Some(false) => break,
            // Not an express slot (nothing else is written here): leave it.
            None => continue,
        }
        zone.store.delete(&object.key).await?;
        deleted += 1;
    }
    Ok(deleted)
}

/// One pass over every zone at once. A zone that fails is logged and retried next pass.
pub async fn collect(zones: &Zones, star: &str, checkpoint: &ExpressCheckpoint) -> u64 {
    let passes = zones.iter().map(|zone| async move {
        match collect_zone(zone, star, checkpoint).await {
            Ok(deleted) => deleted,
            Err(err) => {
                tracing::warn!(
                    zone = zone.name,
                    star,
                    "collecting express zone copies failed; retrying later: {err}"
                );
                0
            }
        }
    });
    futures::future::join_all(passes).await.into_iter().sum()
}

/// Follows the star's express checkpoint and collects behind it until `stop`.
pub(crate) async fn run_collector(
    zones: Zones,
    star: String,
    mut carried: watch::Receiver<Option<ExpressCheckpoint>>,
    metrics: Arc<Metrics>,
    clock: nova_core::clock::Clock,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = carried.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
        let checkpoint = *carried.borrow_and_update();
        if let Some(checkpoint) = checkpoint {
            let deleted = collect(&zones, &star, &checkpoint).await;
            metrics.express.collected.inc_by(deleted);
        }
        tokio::select! {
            _ = clock.sleep(PASS_EVERY) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::keys::express_slot_key;

    #[test]
    fn the_checkpoint_covers_older_epochs_and_its_own_slots_up_to_through() {
        let checkpoint = ExpressCheckpoint {
            epoch: 5000,
            through: Some(3),
        };
        let at = |epoch, slot| covered("s", &express_slot_key("s", epoch, slot), &checkpoint);
        assert_eq!(at(4001, 900), Some(true));
        assert_eq!(at(5000, 3), Some(true));
        assert_eq!(at(5000, 4), Some(false));
        assert_eq!(at(5001, 0), Some(false));
        assert_eq!(covered("s", "express/s/junk", &checkpoint), None);
        let none_yet = ExpressCheckpoint {
            epoch: 5000,
            through: None,
        };
        assert_eq!(
            covered("s", &express_slot_key("s", 5000, 0), &none_yet),
            Some(false)
        );
    }
}
