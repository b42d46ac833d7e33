//! A successor's walk over one epoch of a departed (or crashed) star's express chain: from the
//! first slot not yet carried into the Standard chain, every slot a quorum of zones holds a
//! bundle at is handed over in order, and the walk ends at the first slot it plugs. Bundles are
//! acknowledged in slot order, so nothing past that slot was acknowledged, even where a zombie
//! got a later bundle into a quorum of zones before the plug.
//!
//! One bundle at a time is held in memory (read whole from one zone that holds it, checked
//! against its footer), so the walk's memory is one bundle whatever the chain's length.

use std::time::Duration;

use bytes::Bytes;

use nova_core::flight::{FormatError, ObjectFooter, TailParse, parse_tail};
use nova_core::keys::express_slot_key;
use nova_core::object_store::GetRange;

use super::Zones;
use super::slot::{SlotFate, fence_for, plug_or_find};
use crate::config::Backoff;

/// Where a walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    /// The epoch ends at this slot, now plugged in a quorum of zones; `sole` when the walk's
    /// own fences alone make that quorum (`SlotFate::Plugged`).
    Plugged { slot: u64, sole: bool },
    /// This slot stayed undecided (zones unreachable or split) for as long as the caller
    /// allowed: nothing at or past it has been decided; walk again from here later.
    Undecided { slot: u64 },
}

/// One slot's answer.
#[derive(Debug)]
pub enum Step {
    /// A quorum holds this bundle, read whole and checked: carry it, then ask for the next slot.
    Bundle(Bytes),
    End(WalkEnd),
}

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// A quorum holds a bundle at the slot, but no zone that holds it would give it back.
    #[error("the bundle at {key} is held by a quorum of zones, but none returned it: {reason}")]
    Unreadable { key: String, reason: String },
    #[error("no zone holds an intact copy of the bundle at {key}: {reason}")]
    Corrupt { key: String, reason: String },
}

/// What the walk needs from its caller.
pub struct Walk<'a> {
    pub zones: &'a Zones,
    /// The star whose express chain is walked, and the epoch.
    pub star: &'a str,
    pub epoch: u64,
    /// Who plugs (written in the fences).
    pub successor: &'a str,
    /// Each zone write's deadline.
    pub deadline: Duration,
    pub backoff: &'a Backoff,
    /// How many times an undecided slot is asked again before the walk returns `Undecided`.
    pub undecided_attempts: u32,
}

impl Walk<'_> {
    /// Walks from `from_slot`, calling `carry(slot, bundle)` for each bundle a quorum holds, in
    /// slot order; a bundle is carried before the next slot is looked at.
    pub async fn run<F, Fut, E>(&self, from_slot: u64, mut carry: F) -> Result<WalkEnd, E>
    where
        F: FnMut(u64, Bytes) -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
        E: From<WalkError>,
    {
        let mut slot = from_slot;
        loop {
            match self.step(slot).await? {
                Step::Bundle(bundle) => carry(slot, bundle).await?,
                Step::End(end) => return Ok(end),
            }
            slot += 1;
        }
    }

    /// Decides one slot: the bundle a quorum holds there, or the walk's end.
    pub async fn step(&self, slot: u64) -> Result<Step, WalkError> {
        {
            let key = express_slot_key(self.star, self.epoch, slot);
            let fence = fence_for(
                self.star,
                self.epoch,
                slot,
                self.successor,
                self.backoff.clock.unix_ms(),
            );
            let mut attempt = 0u32;
            let holders = loop {
                attempt += 1;
                let found =
                    plug_or_find(self.zones, &key, &fence, self.deadline, self.backoff).await;
                match found.fate {
                    SlotFate::Plugged { sole } => {
                        return Ok(Step::End(WalkEnd::Plugged { slot, sole }));
                    }
                    SlotFate::Bundle { zones } => break zones,
                    SlotFate::Undecided if attempt >= self.undecided_attempts => {
                        return Ok(Step::End(WalkEnd::Undecided { slot }));
                    }
                    SlotFate::Undecided => {
                        tracing::warn!(
                            star = self.star,
                            epoch = self.epoch,
                            slot,
                            attempt,
                            "an express slot is undecided (zones unreachable or split); asking \
                             again"
                        );
                        self.backoff.clock.sleep(self.backoff.delay(attempt)).await;
                    }
                }
            };
            let bundle = self.read_bundle(&key, slot, &holders).await?;
            Ok(Step::Bundle(bundle))
        }
    }

    /// The bundle at `key`, whole, from the first of `holders` that returns it intact. While a
    /// holder's failure is an outage (a 503, a timeout) it is asked again, as recovery waits
    /// out any outage; only when every holder answered with a copy that is not the bundle is
    /// the slot reported corrupt.
    async fn read_bundle(
        &self,
        key: &str,
        slot: u64,
        holders: &[usize],
    ) -> Result<Bytes, WalkError> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut reasons = Vec::new();
            let (mut corrupt, mut unreachable) = (false, false);
            for (index, zone) in self.zones.iter().enumerate() {
                if !holders.contains(&index) {
                    continue;
                }
                let got = match zone.store.get(key, GetRange::All).await {
                    Ok(got) => got,
                    Err(err) => {
                        unreachable |= err.is_retryable();
                        reasons.push(format!("{}: {err}", zone.name));
                        continue;
                    }
                };
                match self.check(&got.bytes, slot) {
                    Ok(()) => return Ok(got.bytes),
                    // Another zone's copy may be intact.
                    Err(reason) => {
                        corrupt = true;
                        reasons.push(format!("{} holds {reason}", zone.name));
                    }
                }
            }
            let (key, reason) = (key.to_owned(), reasons.join("; "));
            if unreachable {
                tracing::warn!(
                    key,
                    attempt,
                    "reading an express bundle failed; retrying: {reason}"
                );
                self.backoff.clock.sleep(self.backoff.delay(attempt)).await;
                continue;
            }
            return Err(if corrupt {
                WalkError::Corrupt { key, reason }
            } else {
                WalkError::Unreadable { key, reason }
            });
        }
    }

    /// Whether `bytes` is a bundle of this chain's `slot`.
    fn check(&self, bytes: &Bytes, slot: u64) -> Result<(), String> {
        let footer = match parse_tail(bytes, bytes.len() as u64) {
            Ok(TailParse::Footer(footer)) => footer,
            Ok(TailParse::NeedFrom(_)) => return Err("a truncated object".into()),
            Err(FormatError::UnsupportedVersion(v)) => {
                return Err(format!("an object of format version {v}"));
            }
            Err(err) => return Err(format!("an unreadable object: {err}")),
        };
        match footer {
            ObjectFooter::Flight(footer)
                if footer.meta.star == self.star
                    && footer.meta.epoch == self.epoch
                    && footer.meta.slot == slot =>
            {
                Ok(())
            }
            ObjectFooter::Flight(footer) => Err(format!(
                "slot {} of epoch {} of star {:?}",
                footer.meta.slot, footer.meta.epoch, footer.meta.star
            )),
            ObjectFooter::Fence(_) => Err("a fence".into()),
        }
    }
}
