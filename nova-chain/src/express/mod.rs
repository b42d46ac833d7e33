//! The Express class: records acknowledged once a quorum of single-zone buckets holds them.
//!
//! Built so far: the zones, the quorum write (`fanout`), a successor's decision of a slot's
//! fate (`slot`) and its walk over an epoch (`walk`): the primitives the write path's bundles
//! and the recovery of an express chain will stand on.
//! Nothing routes appends here yet; a star refuses Express streams.

pub mod fanout;
pub mod slot;
pub mod walk;

pub use fanout::{Outcome, Publication, ZoneAnswer, publish};
pub use slot::{SlotFate, fence_for, plug_or_find};
pub use walk::{Walk, WalkEnd, WalkError};

use std::sync::Arc;

use nova_core::object_store::ObjectStore;

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
