//! Settling a star's express chain after its Standard chain (at a restart, or a takeover):
//! every bundle a quorum of zones holds past the catalog's express checkpoint may have been
//! acknowledged, so its records not yet in the Standard chain are written there, as flights at
//! the fresh epoch's first slots, and absorbed with the checkpoint moved past them.
//!
//! The walk starts just past the checkpoint (or its copy in the bucket, after a rebuild) and
//! goes through every express epoch a star of an earlier chain epoch could have written, each
//! to its first plugged slot, so that a predecessor that is only paused can never reach a
//! quorum again in any of them (see the loop in `recover_express`). A bundle's sections are either
//! wholly in the Standard chain already (a flight carried them before the crash: the stream's
//! tail is past them) or wholly not, because a bundle is always carried into one flight.
//!
//! Memory: one bundle read at a time, and the flight being filled (at most
//! `FLIGHT_MAX_BYTES` beyond its last section).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use nova_core::catalog::{AbsorbBatch, Catalog, ExpressCheckpoint, VersionedChain};
use nova_core::flight::section::Fragment;
use nova_core::flight::{
    FlightMeta, ObjectFooter, SectionInput, TailParse, assemble_flight, parse_tail,
};
use nova_core::keys::slot_key;
use nova_core::limits::FLIGHT_MAX_BYTES;
use nova_core::object_store::{CreateOutcome, ObjectStore};

use super::walk::{Step, Walk, WalkEnd};
use super::{ExpressConfig, GENERATIONS_PER_EPOCH, express_epoch, marker};
use crate::config::Backoff;
use crate::flight_build::FLIGHT_MAX_OPS;
use crate::recovery::{LeaderCheck, RecoveryError, Settle, commit_patiently, patiently};
use crate::streams::StreamRegistry;
use crate::writer::is_ours;

/// What settling the express chain did.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpressRecovered {
    /// Bundles walked (carried, or found already in the Standard chain).
    pub bundles: u64,
    /// Flights written to the Standard chain with the records not yet in it.
    pub flights: u64,
}

/// Settles `star`'s express chain into `chain` (the Standard chain at its fresh epoch, which
/// nothing has written yet) and returns the chain as the carried flights leave it.
#[allow(clippy::too_many_arguments)]
pub async fn recover_express(
    star: &str,
    config: &ExpressConfig,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
    streams: &StreamRegistry,
    chain: VersionedChain,
    successor: &str,
    retry: &Backoff,
    led: &LeaderCheck<'_>,
) -> Result<(VersionedChain, ExpressRecovered), RecoveryError> {
    let checkpoint = patiently("reading the express checkpoint", retry, || {
        catalog.express_checkpoint(star)
    })
    .await
    .map_err(RecoveryError::Catalog)?;
    // A catalog rebuilt from the bucket has no checkpoint; its copy in the bucket says where
    // collection stopped (see `marker`).
    let start = match checkpoint {
        Some(checkpoint) => Some(checkpoint),
        None => patiently("reading the express checkpoint's copy", retry, || {
            marker::read(store.as_ref(), star)
        })
        .await
        .map_err(|e| RecoveryError::ExpressCheckpointCopy(e.to_string()))?,
    };
    // Just past the checkpoint; without one, the previous chain epoch's first express epoch
    // (nothing of it can have been collected: collection follows a checkpoint).
    let mut at = match start {
        Some(c) => Position {
            chain_epoch: c.epoch / GENERATIONS_PER_EPOCH,
            generation: c.epoch % GENERATIONS_PER_EPOCH,
            slot: c.through.map_or(0, |t| t + 1),
        },
        None => Position {
            chain_epoch: chain.state.epoch.saturating_sub(1),
            generation: 0,
            slot: 0,
        },
    };
    // Every express epoch written before is older than the fresh chain epoch: a star writes
    // its express chain in its own chain epoch, which this recovery's Standard walk fenced
    // (a rebuild resumes the Standard chain at the express chain's epoch at least, for that).
    // A copy in the bucket ahead of the catalog's chain means a catalog that does not know
    // this bucket: walking would skip that express chain, and writing would go over it.
    if at.chain_epoch >= chain.state.epoch {
        return Err(RecoveryError::ExpressAhead {
            star: star.to_owned(),
            express_epoch: express_epoch(at.chain_epoch, at.generation),
            chain_epoch: chain.state.epoch,
        });
    }
    let fresh_chain_epoch = chain.state.epoch;
    let fresh = express_epoch(fresh_chain_epoch, 0);
    let mut carrier = Carrier {
        star,
        store,
        catalog,
        streams,
        retry,
        led,
        chain,
        open: Open::default(),
        done: ExpressRecovered::default(),
    };
    // Every chain epoch before the fresh one may have had a star writing express bundles, and
    // one that is only paused (a zombie) may write more. Within a chain epoch the star moves
    // to its next express epoch only after sealing the last one with fences of its own, so each
    // express epoch is walked to its plug, and the walk goes on into the next one until it ends
    // at a plug of this walk's fences alone: no quorum of anyone else's fences can be there, so
    // no star sealed that epoch, and none can have moved past it.
    while at.chain_epoch < fresh_chain_epoch {
        let epoch = express_epoch(at.chain_epoch, at.generation);
        if epoch >= fresh {
            break;
        }
        let walk = Walk {
            zones: &config.zones,
            star,
            epoch,
            successor,
            deadline: config.publish_deadline,
            backoff: retry,
            // A slot no quorum decides is waited for, however long: guessing could lose an
            // acknowledged bundle or invent one.
            undecided_attempts: u32::MAX,
        };
        let mut slot = at.slot;
        let sole = loop {
            match walk.step(slot).await? {
                Step::Bundle(bundle) => carrier.carry(epoch, slot, bundle).await?,
                Step::End(WalkEnd::Plugged { slot, sole }) => {
                    tracing::info!(
                        star,
                        express_epoch = epoch,
                        plugged = slot,
                        sealed_before = !sole,
                        "express epoch settled"
                    );
                    break sole;
                }
                // Not with unlimited attempts; kept honest should that change.
                Step::End(WalkEnd::Undecided { slot }) => {
                    return Err(RecoveryError::Express(super::WalkError::Unreadable {
                        key: nova_core::keys::express_slot_key(star, epoch, slot),
                        reason: "no quorum of zones decides the slot".into(),
                    }));
                }
            }
            slot += 1;
        };
        // A star exhausting its express epochs fences itself instead of writing the next.
        at = if sole || at.generation + 1 >= GENERATIONS_PER_EPOCH {
            Position {
                chain_epoch: at.chain_epoch + 1,
                generation: 0,
                slot: 0,
            }
        } else {
            Position {
                generation: at.generation + 1,
                slot: 0,
                ..at
            }
        };
    }
    carrier.flush().await?;
    // Everything before the fresh express epoch is in the Standard chain now.
    let settled = ExpressCheckpoint {
        epoch: fresh,
        through: None,
    };
    let batch = AbsorbBatch {
        express: Some(settled),
        ..AbsorbBatch::default()
    };
    let chain = commit_patiently(
        "moving the express checkpoint",
        retry,
        catalog,
        star,
        Some(carrier.chain.version),
        carrier.chain.state,
        batch,
    )
    .await?;
    // The bucket's copy follows the catalog's, before the express lane starts.
    patiently("writing the express checkpoint's copy", retry, || {
        marker::write(store.as_ref(), star, &settled)
    })
    .await
    .map_err(|e| RecoveryError::Corrupt {
        key: nova_core::keys::express_checkpoint_prefix(star),
        source: e.into(),
    })?;
    if carrier.done.bundles > 0 {
        tracing::info!(
            star,
            bundles = carrier.done.bundles,
            flights = carrier.done.flights,
            "recovery carried the express chain into the Standard chain"
        );
    }
    Ok((chain, carrier.done))
}

/// Where a walk of the express chain is.
#[derive(Debug, Clone, Copy)]
struct Position {
    chain_epoch: u64,
    generation: u64,
    slot: u64,
}

/// The flight being filled with carried sections.
#[derive(Default)]
struct Open {
    sections: Vec<SectionInput>,
    bytes: u64,
    streams: std::collections::HashSet<u64>,
    /// Each stream's tail as the sections taken so far leave it.
    tails: HashMap<u64, u64>,
    through: Option<(u64, u64)>,
}

struct Carrier<'a> {
    star: &'a str,
    store: &'a Arc<dyn ObjectStore>,
    catalog: &'a Catalog,
    streams: &'a StreamRegistry,
    retry: &'a Backoff,
    led: &'a LeaderCheck<'a>,
    chain: VersionedChain,
    open: Open,
    done: ExpressRecovered,
}

impl Carrier<'_> {
    /// Takes one bundle's sections that the Standard chain does not hold yet.
    async fn carry(&mut self, epoch: u64, slot: u64, bundle: Bytes) -> Result<(), RecoveryError> {
        let key = nova_core::keys::express_slot_key(self.star, epoch, slot);
        let footer = match parse_tail(&bundle, bundle.len() as u64) {
            Ok(TailParse::Footer(ObjectFooter::Flight(footer))) => footer,
            // The walk checked it; anything else here is a bug, not data to guess at.
            _ => {
                return Err(RecoveryError::Foreign {
                    key,
                    what: "it is not an express bundle".into(),
                });
            }
        };
        self.done.bundles += 1;
        for section in &footer.sections {
            let Some(stream) = self.streams.get_by_id(section.stream_id) else {
                continue;
            };
            // A stream another star leads is neither carried nor checked against its tail,
            // which that star moves (the Standard walk left its sections out the same way).
            if !self.led.led_here(&key, &stream).await? {
                continue;
            }
            // Where the Standard chain (and what this recovery carried so far) leaves it.
            let tail = self
                .open
                .tails
                .get(&section.stream_id)
                .copied()
                .unwrap_or(stream.tail());
            if section.end_seq <= tail {
                continue;
            }
            let carried = self.open.tails.contains_key(&section.stream_id);
            if !carried && self.led.overwritten(&key, &stream, section.start_seq, tail) {
                continue;
            }
            if section.start_seq != tail {
                return Err(RecoveryError::Discontinuous {
                    key,
                    stream: stream.name().to_owned(),
                    expected: tail,
                    found: section.start_seq,
                });
            }
            let body =
                bundle.slice(section.offset as usize..(section.offset + section.len) as usize);
            if nova_core::flight::crc::crc32c(&body) != section.crc32c {
                return Err(RecoveryError::Foreign {
                    key,
                    what: format!(
                        "its section for stream {:?} fails its checksum",
                        section.stream
                    ),
                });
            }
            self.open.bytes += section.len;
            self.open.streams.insert(section.stream_id);
            self.open.sections.push(SectionInput {
                stream_id: section.stream_id,
                stream: section.stream.clone(),
                start_seq: section.start_seq,
                fragments: vec![Fragment::whole_checked(
                    body,
                    section.end_seq - section.start_seq,
                    section.crc32c,
                )],
            });
            self.open.tails.insert(section.stream_id, section.end_seq);
        }
        self.open.through = Some((epoch, slot));
        let ops = self.open.sections.len() + self.open.streams.len();
        if self.open.bytes >= FLIGHT_MAX_BYTES || ops >= FLIGHT_MAX_OPS {
            self.flush().await?;
        }
        Ok(())
    }

    /// Writes the open flight at the chain's next slot and absorbs it, with the express
    /// checkpoint moved past the last bundle it carries.
    async fn flush(&mut self) -> Result<(), RecoveryError> {
        let open = std::mem::take(&mut self.open);
        if open.sections.is_empty() {
            return Ok(());
        }
        let epoch = self.chain.state.epoch;
        let slot = self.chain.state.checkpoint.map_or(0, |s| s + 1);
        let key = slot_key(self.star, epoch, slot);
        let meta = FlightMeta {
            star: self.star.to_owned(),
            epoch,
            slot,
            created_at_ms: self.retry.clock.unix_ms(),
        };
        let (payload, footer) = assemble_flight(meta, open.sections);
        let store = self.store;
        let outcome = patiently("writing a carried express flight", self.retry, || {
            store.put_if_absent(&key, payload.clone())
        })
        .await
        .map_err(|e| RecoveryError::Corrupt {
            key: key.clone(),
            source: e.into(),
        })?;
        if let CreateOutcome::AlreadyExists = outcome {
            let ours = patiently("checking a carried express flight", self.retry, || {
                is_ours(store.as_ref(), &key, &payload)
            })
            .await
            .map_err(|e| RecoveryError::Corrupt {
                key: key.clone(),
                source: e.into(),
            })?;
            if !ours {
                return Err(RecoveryError::Foreign {
                    key,
                    what: "another writer's object sits at a slot of the fresh epoch".into(),
                });
            }
        }
        let express = open.through.map(|(epoch, slot)| ExpressCheckpoint {
            epoch,
            through: Some(slot),
        });
        // The carried bundles were acknowledged at the zones; the flight carrying them is
        // settled as it is written, leaving out (as a Standard flight's) the sections of a
        // stream whose leadership has since moved to another star.
        let settle = Settle {
            star: self.star,
            catalog: self.catalog,
            streams: self.streams,
            retry: self.retry,
            led: self.led,
        };
        self.chain = settle.flight(&key, footer, &self.chain, express).await?;
        self.done.flights += 1;
        Ok(())
    }
}
