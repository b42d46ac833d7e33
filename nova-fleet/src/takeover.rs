//! Takeover: a star whose lease lapsed leaves its chain registered and its leader records
//! behind. One survivor, elected by creating the takeover key, settles that chain (see
//! `nova_chain::takeover`), then clears the departed star's leader records, so the streams are
//! placed again, and its chain registration. Requests for those streams wait meanwhile,
//! counted as a `predecessor_settling` stall.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use nova_chain::Star;
use nova_core::metastore::{Compare, KeyValue, MetastoreError, Txn, TxnOutcome};
use nova_core::object_store::ObjectStore;

use crate::Fleet;
use crate::error::TakeoverError;
use crate::keys::{CHAINS, chain_key, id_under, star_key, takeover_key};

/// Chains in the catalog looked at for takeover and adoption (stars that ever ran with this
/// catalog).
pub(crate) const MAX_CHAINS_SCANNED: usize = 1000;

/// What a takeover needs from the star running it.
pub struct TakeoverContext {
    pub star: Arc<Star>,
    pub store: Arc<dyn ObjectStore>,
    pub backoff: nova_chain::Backoff,
    pub max_streams: usize,
    /// This star's auditor's adopted chains; `None` without an auditor (it adopts nothing).
    pub adoptions: Option<nova_auditor::Adoptions>,
}

impl Fleet {
    /// Looks for departed stars' chains (registered, with no live star) and takes one over when
    /// elected. Runs every third of a lease ttl until the lease is lost.
    pub fn start_takeovers(self: &Arc<Self>, ctx: TakeoverContext) {
        let fleet = self.clone();
        let supervisor = self.config.supervisor.clone();
        supervisor.watch("fleet takeovers", self.lost.clone(), async move {
            loop {
                tokio::select! {
                    biased;
                    _ = fleet.lost.cancelled() => return,
                    _ = fleet.clock.sleep(fleet.config.lease_ttl / 3) => {}
                }
                // Chains registered now: a chain left by a star with no live registration is
                // taken over; a star's chain showing up again (it rejoined) ends its adoption.
                // One scan serves both. It predates this round's takeovers, so a chain taken
                // over now is adopted next round (or, if this star held its adoption, released
                // and elected again); the server-side compares keep every election right. A
                // failed scan skips the round.
                let chains = match fleet
                    .metastore
                    .scan(CHAINS.as_bytes(), None, MAX_CHAINS_SCANNED)
                    .await
                {
                    Ok(chains) => chains,
                    Err(err) => {
                        tracing::warn!("reading the fleet's registered chains failed: {err}");
                        continue;
                    }
                };
                if let Err(err) = fleet.take_over_departed(&ctx, &chains).await {
                    tracing::warn!("looking for departed stars to take over failed: {err}");
                }
                if let Some(adoptions) = &ctx.adoptions
                    && let Err(err) = fleet.adopt_departed(&ctx.star, adoptions, &chains).await
                {
                    tracing::warn!("looking for departed stars' chains to adopt failed: {err}");
                }
            }
        });
    }

    async fn take_over_departed(
        &self,
        ctx: &TakeoverContext,
        chains: &[KeyValue],
    ) -> Result<(), MetastoreError> {
        let live: HashSet<String> = self.members.read().keys().cloned().collect();
        let now = self.clock.now();
        // Each departed star with the version of its chain registration.
        let mut departed: Vec<(String, u64)> = Vec::new();
        for kv in chains {
            let id = id_under(CHAINS, &kv.key);
            if id != self.config.star_id && !live.contains(&id) {
                departed.push((id, kv.version));
            }
        }
        {
            let mut seen = self.departed.lock();
            seen.retain(|id, _| departed.iter().any(|(d, _)| d == id));
            for (id, _) in &departed {
                seen.entry(id.clone()).or_insert(now);
            }
            let oldest = seen.values().map(|at| now.duration_since(*at)).max();
            self.metrics
                .leaderless_age
                .set(oldest.map_or(0.0, |age| age.as_secs_f64()));
        }
        for (id, chain) in departed {
            if self.lost.is_cancelled() {
                return Ok(());
            }
            let Some(revision) = self.elect(&id, chain).await? else {
                continue;
            };
            // Every step that changes what others see holds only while this star still holds
            // the election (its lease could lapse mid-way, and the departed star rejoin).
            let guard = Compare::Version(takeover_key(&id), revision);
            let outcome = tokio::select! {
                biased;
                outcome = self.take_over(ctx, &id, guard.clone()) => outcome,
                _ = self.lost.cancelled() => Err(TakeoverError::LeaseLost),
            };
            // Left behind, the key would keep the departed star from rejoining for as long as
            // this star lives: retry until it goes (or the lease, and the key with it, does).
            let release = Txn::new().compare(guard).delete(takeover_key(&id));
            let mut attempt = 0u32;
            while let Err(err) = self.metastore.commit(release.clone()).await {
                attempt += 1;
                tracing::warn!(star = %id, attempt, "releasing the takeover failed; retrying: {err}");
                tokio::select! {
                    biased;
                    _ = self.lost.cancelled() => break,
                    _ = self.clock.sleep(Duration::from_millis(500)) => {}
                }
            }
            if let Err(err) = outcome {
                tracing::error!(star = %id, "taking over the chain of a departed star failed; it is tried again: {err}");
            }
        }
        Ok(())
    }

    /// Elects this star to take `departed`'s chain (registered at version `chain`) over:
    /// `Some(version of the takeover key)` when it holds the election. An election won earlier
    /// whose answer was lost is found again: the key names this star. (It is bound to this
    /// incarnation's lease: one left by an earlier incarnation lapsed with that lease before
    /// this one could register.) Without this, every later round would see the key, skip, and
    /// keep it alive for ever.
    async fn elect(&self, departed: &str, chain: u64) -> Result<Option<u64>, MetastoreError> {
        let key = takeover_key(departed);
        if let Some(held) = self.metastore.get(&key).await? {
            return Ok((held.value == self.config.star_id.as_bytes()).then_some(held.version));
        }
        // Elected by creating the takeover key, only while the star is still gone and its chain
        // registration is the one seen: an election that applies late (after its caller gave
        // up on it and took the chain over in a later round, clearing the registration) then
        // fails, instead of leaving a key that would keep the star from ever joining again.
        let elect = Txn::new()
            .compare(Compare::Missing(star_key(departed)))
            .compare(Compare::Missing(key.clone()))
            .compare(Compare::Version(chain_key(departed), chain))
            .put_leased(key, self.config.star_id.clone().into_bytes(), self.lease);
        Ok(match self.metastore.commit(elect).await? {
            TxnOutcome::Committed { revision } => Some(revision),
            TxnOutcome::Conflict => None,
        })
    }

    async fn take_over(
        &self,
        ctx: &TakeoverContext,
        departed: &str,
        guard: Compare,
    ) -> Result<(), TakeoverError> {
        let started = self.clock.now();
        tracing::info!(star = %departed, "taking over the chain of a departed star");
        let catalog = ctx.star.streams().catalog().clone();
        let recovered = nova_chain::takeover::take_over(
            departed,
            &ctx.store,
            &catalog,
            &ctx.backoff,
            ctx.max_streams,
            ctx.star.config().express.as_ref(),
            &format!("{}/takeover", ctx.star.config().star),
            ctx.star.config().leaders.as_deref(),
        )
        .await?;
        // Its streams may be placed again: clear the records naming it.
        let released = self.release_records_of(departed, guard.clone()).await?;
        let cleared = Txn::new().compare(guard).delete(chain_key(departed));
        if self.metastore.commit(cleared).await? == TxnOutcome::Conflict {
            return Err(TakeoverError::LostElection(departed.to_owned()));
        }
        let took = self.clock.since(started);
        self.metrics.takeovers.inc();
        self.metrics.takeover_seconds.observe(took.as_secs_f64());
        self.departed.lock().remove(departed);
        tracing::info!(
            star = %departed,
            settled_flights = recovered.as_ref().map_or(0, |r| r.settled_flights),
            streams_released = released,
            took_ms = took.as_millis() as u64,
            "took over the chain of a departed star; its streams are placed again on demand"
        );
        Ok(())
    }

    /// Deletes every leader record naming `star` (each only if unchanged since read, and
    /// while `guard` holds). Returns how many.
    async fn release_records_of(&self, star: &str, guard: Compare) -> Result<u64, MetastoreError> {
        self.rewrite_records_of(
            star,
            |kv, unchanged| unchanged.compare(guard.clone()).delete(kv.key.clone()),
            || {},
        )
        .await
    }
}
