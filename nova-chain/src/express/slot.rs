//! Deciding an express slot's fate, for a successor (a recovery or a takeover) taking over an
//! express chain: either a quorum of zones holds a bundle there (it may have been acknowledged,
//! so it must be carried on), or a quorum holds fences (it never was, and now never can be).
//!
//! The successor *plugs* the slot: it publishes a fence there with the quorum write. A bundle
//! is acknowledged only once a quorum holds it, and any two quorums share a zone, so once a
//! quorum holds fences no bundle can reach one: a zombie leader still writing finds the slot
//! taken in a majority and stops acknowledging. Where the fence does not reach a quorum, the
//! zones that refused it are read: a quorum of the bundle means it stays; a quorum of fences
//! (another successor's count too: the slot is dead either way) means plugged; anything short
//! of both (zones unreachable, or split) is undecided, and the successor waits and asks again
//! rather than guess.

use std::sync::Arc;
use std::time::Duration;

use nova_core::flight::{FenceInfo, ObjectFooter, encode_fence, fetch_footer};
use nova_core::object_store::PutPayload;

use super::Zones;
use super::fanout::{ZoneAnswer, publish_until};
use crate::config::Backoff;

/// What a quorum of zones holds at a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotFate {
    /// A bundle, held by these zones (a quorum of them): carry it on.
    Bundle { zones: Vec<usize> },
    /// Fences: no bundle was, or ever can be, acknowledged here. `sole` when the caller's own
    /// fences alone make the quorum, so no other writer's fences can hold one: nobody else
    /// ended the express epoch at this slot (a star that sealed it there has moved on to its
    /// next express epoch; see `recover`).
    Plugged { sole: bool },
    /// Neither yet (zones unreachable, or answers split): ask again later.
    Undecided,
}

/// A slot's fate, and how many zones hold another writer's fence there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub fate: SlotFate,
    /// Zones holding a fence written by someone else (another `fenced_by`): a star sealing
    /// its own express epoch that meets one has a successor, and must stop.
    pub foreign_fences: usize,
}

/// Plugs `key` with `fence` in every zone it can, and says what a quorum holds there.
pub async fn plug_or_find(
    zones: &Zones,
    key: &str,
    fence: &FenceInfo,
    deadline: Duration,
    backoff: &Backoff,
) -> Finding {
    let payload = PutPayload::from(encode_fence(fence));
    let published = publish_until(zones, key, payload, deadline, backoff, true, Arc::new(())).await;
    // Held: this very fence, or an earlier attempt's (same size and footer).
    let mut own = published
        .answers
        .iter()
        .filter(|a| **a == ZoneAnswer::Held)
        .count();
    let mut foreign = 0;
    let mut bundles = Vec::new();
    for (index, (zone, answer)) in zones.iter().zip(&published.answers).enumerate() {
        if *answer != ZoneAnswer::Refused {
            continue;
        }
        match fetch_footer(zone.store.as_ref(), key).await {
            Ok(ObjectFooter::Flight(_)) => bundles.push(index),
            // An earlier attempt of this caller's, written at another time.
            Ok(ObjectFooter::Fence(found)) if found.fenced_by == fence.fenced_by => own += 1,
            Ok(ObjectFooter::Fence(_)) => foreign += 1,
            Err(err) => {
                tracing::warn!(
                    zone = zone.name,
                    key,
                    "reading an express slot's holder: {err}"
                );
            }
        }
    }
    let quorum = zones.quorum();
    let fate = if bundles.len() >= quorum {
        SlotFate::Bundle { zones: bundles }
    } else if own >= quorum {
        SlotFate::Plugged { sole: true }
    } else if own + foreign >= quorum {
        SlotFate::Plugged { sole: false }
    } else {
        SlotFate::Undecided
    };
    Finding {
        fate,
        foreign_fences: foreign,
    }
}

/// The fence a successor writes at an express slot it plugs.
pub fn fence_for(star: &str, epoch: u64, slot: u64, fenced_by: &str, now_ms: u64) -> FenceInfo {
    FenceInfo {
        star: star.to_owned(),
        epoch,
        slot,
        fenced_by: fenced_by.to_owned(),
        fenced_at_ms: now_ms,
    }
}
