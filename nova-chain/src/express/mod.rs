//! The Express class: records acknowledged once a quorum of single-zone buckets holds them.
//!
//! An Express stream's batches are sequenced by the one packer like any other, but packed into
//! small *bundles* (own linger) instead of flights. A bundle is written to every zone at once
//! with a conditional create at its slot of the *express chain*
//! (`express/{star}/{epoch}/{slot}`), and acknowledged, in slot order, once a quorum of zones
//! holds it (`fanout`). Its sections are then carried into the next Standard flight, whose
//! absorb moves the catalog's express checkpoint past the bundle; zone copies at or below the
//! checkpoint are collected (`collect`). Until the Standard flight lands, the records are read
//! from pinned runs of the tail cache and charged to the express buffer.
//!
//! A bundle that misses its quorum by the publish deadline fails fast, and so does every bundle
//! after it; the star then *seals* the express epoch in place (plugging the first slot a quorum
//! does not hold, `slot`), rolls the affected streams back to their tails and continues in a
//! fresh express epoch. A successor (restart or takeover) walks the express epochs past the
//! checkpoint (`walk`, `recover`) and carries what a quorum holds into the Standard chain.

pub mod collect;
pub mod fanout;
pub(crate) mod lane;
pub mod marker;
pub mod recover;
pub mod slot;
pub mod walk;

pub use fanout::{Outcome, Publication, ZoneAnswer, publish};
pub use slot::{Finding, SlotFate, fence_for, plug_or_find};
pub use walk::{Step, Walk, WalkEnd, WalkError};

use std::sync::Arc;
use std::time::Duration;

use nova_core::limits::MIB;
use nova_core::object_store::ObjectStore;

/// A bundle closes once it holds this many bytes, whatever its linger: small bundles keep the
/// zone PUTs short, and a quorum's latency is that of its slowest member's PUT.
pub const BUNDLE_MAX_BYTES: u64 = MIB;

/// Bundles being published at once. Each one is also charged to the express buffer, which is
/// the real bound on their bytes; this bounds the zone-write tasks.
pub const MAX_BUNDLES_IN_FLIGHT: usize = 64;

/// Express epochs a star may open within one chain epoch: one at start and one each time the
/// express chain is sealed after a missed quorum. A star that exhausts them fences itself, and
/// its restart begins a new chain epoch.
pub const GENERATIONS_PER_EPOCH: u64 = 1000;

/// The express epoch of a chain epoch's `generation`th express chain. Sealing moves a star to
/// its next generation without a new chain epoch; every express epoch of a later chain epoch
/// sorts after it.
pub fn express_epoch(chain_epoch: u64, generation: u64) -> u64 {
    chain_epoch
        .saturating_mul(GENERATIONS_PER_EPOCH)
        .saturating_add(generation)
}

/// The Express class's settings, from novad's flags.
#[derive(Debug, Clone)]
pub struct ExpressConfig {
    pub zones: Zones,
    /// `--s3-express-publish-deadline`: how long a bundle may take to reach its quorum.
    pub publish_deadline: Duration,
    /// `--s3-express-linger-ms`: how long a bundle waits for more batches after its first.
    pub linger: Duration,
    /// `--s3-express-memory-buffer-mib`, in bytes.
    pub buffer_bytes: u64,
}

impl ExpressConfig {
    /// How long a producer refused while the express chain is sealed should wait: about what
    /// one more attempt at the zones costs.
    pub fn retry_hint(&self) -> Duration {
        self.publish_deadline.max(Duration::from_millis(100))
    }
}

/// One zone: a single-zone bucket (S3 Express One Zone in production) behind its own store.
#[derive(Debug, Clone)]
pub struct Zone {
    /// For logs and metric labels.
    pub name: String,
    pub store: Arc<dyn ObjectStore>,
}

/// The configured zones; a write counts once a majority of them holds it.
#[derive(Debug, Clone)]
pub struct Zones {
    zones: Vec<Zone>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZonesError {
    #[error("express needs at least one zone bucket")]
    None,
    #[error("zone {0:?} is named twice")]
    Duplicate(String),
}

impl Zones {
    pub fn new(zones: Vec<Zone>) -> Result<Self, ZonesError> {
        if zones.is_empty() {
            return Err(ZonesError::None);
        }
        for (i, zone) in zones.iter().enumerate() {
            if zones[..i].iter().any(|z| z.name == zone.name) {
                return Err(ZonesError::Duplicate(zone.name.clone()));
            }
        }
        Ok(Self { zones })
    }

    /// How many zones must hold a write for it to count: a majority, so any two quorums share a
    /// zone (what makes a successor's fence and a zombie's write exclusive).
    pub fn quorum(&self) -> usize {
        self.zones.len() / 2 + 1
    }

    pub fn len(&self) -> usize {
        self.zones.len()
    }

    pub fn is_empty(&self) -> bool {
        self.zones.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Zone> {
        self.zones.iter()
    }
}
