//! Settling a star's express chain after its Standard chain (at a restart, or a takeover):
//! every bundle a quorum of zones holds past the catalog's express checkpoint may have been
//! acknowledged, so its records not yet in the Standard chain are written there, as flights at
//! the fresh epoch's first slots, and absorbed with the checkpoint moved past them.
//!
//! The express epochs to walk are found by listing a quorum of zones (a bundle a quorum holds
//! is in at least one of any quorum). Each is walked from just past the checkpoint (from its
//! first slot if it is newer) until its first plugged slot. A bundle's sections are either
//! wholly in the Standard chain already (a flight carried them before the crash: the stream's
//! tail is past them) or wholly not, because a bundle is always carried into one flight.
//!
//! Memory: one bundle read at a time, and the flight being filled (at most
//! `FLIGHT_MAX_BYTES` beyond its last section).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use nova_core::catalog::{AbsorbBatch, Catalog, ExpressCheckpoint, VersionedChain};
use nova_core::flight::section::Fragment;
use nova_core::flight::{
    FlightMeta, ObjectFooter, SectionInput, TailParse, assemble_flight, parse_tail,
};
use nova_core::keys::{express_root, parse_epoch, slot_key};
use nova_core::limits::FLIGHT_MAX_BYTES;
use nova_core::object_store::{CreateOutcome, ObjectStore, StoreError};

use super::walk::{Step, Walk, WalkEnd};
use super::{ExpressConfig, Zones, express_epoch};
use crate::config::Backoff;
use crate::packer::FLIGHT_MAX_OPS;
use crate::recovery::{RecoveryError, commit_patiently, patiently, settle_flight};
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
) -> Result<(VersionedChain, ExpressRecovered), RecoveryError> {
    let checkpoint = patiently("reading the express checkpoint", retry, || {
        catalog.express_checkpoint(star)
    })
    .await
    .map_err(RecoveryError::Catalog)?;
    let from_epoch = checkpoint.map_or(0, |c| c.epoch);
    let epochs = patiently("listing the express zones", retry, || {
        express_epochs(&config.zones, star, from_epoch)
    })
    .await
    .map_err(|e| RecoveryError::Store(nova_core::object_store::ProbeError::Refused(e)))?;
    let fresh = express_epoch(chain.state.epoch, 0);
    let mut carrier = Carrier {
        star,
        store,
        catalog,
        streams,
        retry,
        chain,
        open: Open::default(),
        done: ExpressRecovered::default(),
    };
    for epoch in epochs.into_iter().filter(|e| *e < fresh) {
        let from_slot = match checkpoint {
            Some(c) if c.epoch == epoch => c.through.map_or(0, |t| t + 1),
            _ => 0,
        };
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
        let mut slot = from_slot;
        loop {
            match walk.step(slot).await? {
                Step::Bundle(bundle) => carrier.carry(epoch, slot, bundle).await?,
                Step::End(WalkEnd::Plugged { slot }) => {
                    tracing::info!(
                        star,
                        express_epoch = epoch,
                        plugged = slot,
                        "express epoch settled"
                    );
                    break;
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
        }
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

/// The express epochs at or after `from` that any zone of a quorum holds objects of.
async fn express_epochs(zones: &Zones, star: &str, from: u64) -> Result<BTreeSet<u64>, StoreError> {
    let root = express_root(star);
    let mut found = BTreeSet::new();
    let mut answered = 0;
    let mut last_error = None;
    for zone in zones.iter() {
        // Just before the first key of `from`, then past each epoch seen.
        let mut after = format!("{root}{from:010}");
        let listed = loop {
            match zone.store.list(&root, Some(&after), 1).await {
                Ok(page) => match page.objects.first() {
                    Some(object) => match parse_epoch(&root, &object.key) {
                        Some(epoch) => {
                            found.insert(epoch);
                            after = format!("{root}{epoch:010}/~");
                        }
                        // Not an express slot: step over it.
                        None => after = object.key.clone(),
                    },
                    None => break Ok(()),
                },
                Err(err) => break Err(err),
            }
        };
        match listed {
            Ok(()) => answered += 1,
            Err(err) => {
                tracing::warn!(zone = zone.name, "listing an express zone: {err}");
                last_error = Some(err);
            }
        }
    }
    if answered >= zones.quorum() {
        return Ok(found);
    }
    Err(last_error.unwrap_or_else(|| StoreError::Transient {
        op: nova_core::object_store::Op::List,
        key: root,
        message: "no zone answered".into(),
    }))
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
            if crc32c::crc32c(&body) != section.crc32c {
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
                fragments: vec![Fragment {
                    bytes: body,
                    records: section.end_seq - section.start_seq,
                }],
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
        self.chain = settle_flight(
            self.star,
            &key,
            footer,
            &self.chain,
            self.catalog,
            self.streams,
            self.retry,
            express,
        )
        .await?;
        self.done.flights += 1;
        Ok(())
    }
}
