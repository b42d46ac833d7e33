//! Collecting zone copies: once the catalog's express checkpoint has passed a bundle, the
//! Standard store and the index hold its records, and its copy in each zone is only cost. The
//! same goes for the bundles of an older express epoch (carried ones, and ones past its plug
//! that were never acknowledged).
//!
//! **Fences are never collected.** A fence at a slot is what keeps a zombie (a predecessor that
//! is only paused) from ever reaching a quorum there; delete it and the zombie's conditional
//! create succeeds again, and it would acknowledge a bundle nobody walks. A fence is a few
//! hundred bytes, and there are one or two per express epoch (its plug, and the plug of the
//! next epoch a successor writes), so they are kept for good, as the Standard chain keeps its
//! own fences. Telling a fence from a bundle costs a footer read, needed only in express epochs
//! before the checkpoint's: every slot of the checkpoint's own epoch up to `through` holds a
//! carried bundle.
//!
//! Before it deletes anything behind a checkpoint, the collector writes that checkpoint's copy
//! to the regional bucket (`marker`), so a rebuilt catalog never starts a walk behind a
//! collected slot.
//!
//! Deletes go zone by zone in key order, each zone from where its last pass stopped, so kept
//! fences are read once per rescan (`RESCAN_EVERY`); a zone that is down keeps its copies
//! until a later pass.
//! Each pass looks at most at `MAX_PER_PASS` objects per zone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use nova_core::catalog::ExpressCheckpoint;
use nova_core::flight::{ObjectFooter, fetch_footer};
use nova_core::keys::{express_prefix, express_root, parse_epoch, parse_slot};
use nova_core::object_store::{ObjectStore, StoreError};

use super::{Zone, Zones, marker};

/// Objects one pass looks at in each zone at most.
pub const MAX_PER_PASS: usize = 1000;

/// How often the collector looks at the checkpoint at most: deletes are batched behind it.
const PASS_EVERY: Duration = Duration::from_secs(1);

/// Every this many passes each zone is listed from its start again: a zone write that was
/// still running when its bundle's copy was deleted (or a zombie's late write) can put an
/// object back behind the cursor, and it is found then. The kept fences are read again too.
const RESCAN_EVERY: u64 = 600;

/// Where the object at `key` (under `express_root(star)`) stands against `checkpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// A slot of the checkpoint's epoch at or below `through`: a carried bundle.
    Carried,
    /// A slot of an older express epoch: a bundle (collected) or a fence (kept).
    Older,
    /// Not covered: this and every later key stay.
    Ahead,
}

fn standing(star: &str, key: &str, checkpoint: &ExpressCheckpoint) -> Option<Standing> {
    let epoch = parse_epoch(&express_root(star), key)?;
    if epoch < checkpoint.epoch {
        return Some(Standing::Older);
    }
    if epoch > checkpoint.epoch {
        return Some(Standing::Ahead);
    }
    let slot = parse_slot(&express_prefix(star, epoch), key)?;
    Some(
        if checkpoint.through.is_some_and(|through| slot <= through) {
            Standing::Carried
        } else {
            Standing::Ahead
        },
    )
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    pub deleted: u64,
    /// Fences passed over (kept).
    pub kept: u64,
}

/// Collects one star's zone copies behind its express checkpoint, pass after pass.
pub struct Collector {
    zones: Zones,
    star: String,
    /// The regional store, for the checkpoint's copy.
    store: Arc<dyn ObjectStore>,
    /// Per zone, the last key a pass finished with (deleted or kept).
    after: Vec<Option<String>>,
    /// The checkpoint whose copy was last written.
    marked: Option<ExpressCheckpoint>,
    passes: u64,
}

impl Collector {
    pub fn new(zones: Zones, star: String, store: Arc<dyn ObjectStore>) -> Self {
        let after = vec![None; zones.len()];
        Self {
            zones,
            star,
            store,
            after,
            marked: None,
            passes: 0,
        }
    }

    /// One pass over every zone at once, behind `checkpoint`. Nothing is deleted until the
    /// checkpoint's copy is in the regional bucket; a zone that fails is logged and retried
    /// next pass.
    pub async fn pass(&mut self, checkpoint: &ExpressCheckpoint) -> Pass {
        if self.marked != Some(*checkpoint) {
            if let Err(err) = marker::write(self.store.as_ref(), &self.star, checkpoint).await {
                tracing::warn!(
                    star = self.star,
                    "writing the express checkpoint's copy failed; collecting later: {err}"
                );
                return Pass::default();
            }
            self.marked = Some(*checkpoint);
        }
        self.passes += 1;
        if self.passes.is_multiple_of(RESCAN_EVERY) {
            self.after.iter_mut().for_each(|after| *after = None);
        }
        let star = self.star.as_str();
        let passes = self
            .zones
            .iter()
            .zip(self.after.iter_mut())
            .map(|(zone, after)| async move {
                match collect_zone(zone, star, checkpoint, after).await {
                    Ok(pass) => pass,
                    Err(err) => {
                        tracing::warn!(
                            zone = zone.name,
                            star,
                            "collecting express zone copies failed; retrying later: {err}"
                        );
                        Pass::default()
                    }
                }
            });
        futures::future::join_all(passes)
            .await
            .into_iter()
            .fold(Pass::default(), |sum, p| Pass {
                deleted: sum.deleted + p.deleted,
                kept: sum.kept + p.kept,
            })
    }

    /// Passes until one finds nothing more to do (for a chain nobody writes any more).
    pub async fn drain(&mut self, checkpoint: &ExpressCheckpoint) -> u64 {
        let mut deleted = 0;
        loop {
            let pass = self.pass(checkpoint).await;
            deleted += pass.deleted;
            if pass == Pass::default() {
                return deleted;
            }
        }
    }
}

/// Deletes, in one zone, the bundles `checkpoint` covers and passes over the fences, from
/// `after` on and up to `MAX_PER_PASS` objects; moves `after` past what it finished.
async fn collect_zone(
    zone: &Zone,
    star: &str,
    checkpoint: &ExpressCheckpoint,
    after: &mut Option<String>,
) -> Result<Pass, StoreError> {
    let page = zone
        .store
        .list(&express_root(star), after.as_deref(), MAX_PER_PASS)
        .await?;
    let mut pass = Pass::default();
    for object in &page.objects {
        match standing(star, &object.key, checkpoint) {
            Some(Standing::Ahead) => break,
            Some(Standing::Carried) => {}
            Some(Standing::Older) => match fetch_footer(zone.store.as_ref(), &object.key).await {
                Ok(ObjectFooter::Fence(_)) => {
                    pass.kept += 1;
                    *after = Some(object.key.clone());
                    continue;
                }
                Ok(ObjectFooter::Flight(_)) => {}
                Err(nova_core::flight::FetchError::Store(err)) => return Err(err),
                // Unreadable as either: not something this star wrote as it should; keep it.
                Err(err) => {
                    tracing::warn!(
                        zone = zone.name,
                        key = object.key,
                        "an express zone object that is neither bundle nor fence is kept: {err}"
                    );
                    pass.kept += 1;
                    *after = Some(object.key.clone());
                    continue;
                }
            },
            // Not an express slot (nothing else is written here): leave it.
            None => {
                *after = Some(object.key.clone());
                continue;
            }
        }
        zone.store.delete(&object.key).await?;
        pass.deleted += 1;
        *after = Some(object.key.clone());
    }
    Ok(pass)
}

/// Follows the star's express checkpoint and collects behind it until `stop`.
pub(crate) async fn run_collector(
    mut collector: Collector,
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
            let pass = collector.pass(&checkpoint).await;
            metrics.express.collected.inc_by(pass.deleted);
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
        let at = |epoch, slot| standing("s", &express_slot_key("s", epoch, slot), &checkpoint);
        assert_eq!(at(4001, 900), Some(Standing::Older));
        assert_eq!(at(5000, 3), Some(Standing::Carried));
        assert_eq!(at(5000, 4), Some(Standing::Ahead));
        assert_eq!(at(5001, 0), Some(Standing::Ahead));
        assert_eq!(standing("s", "express/s/junk", &checkpoint), None);
        let none_yet = ExpressCheckpoint {
            epoch: 5000,
            through: None,
        };
        assert_eq!(
            standing("s", &express_slot_key("s", 5000, 0), &none_yet),
            Some(Standing::Ahead)
        );
    }
}
