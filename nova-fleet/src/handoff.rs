//! Handoff: moving a stream's leadership to another star while both are healthy, when this
//! star is saturated (one stream at a time) or leaving (all of them).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nova_chain::Star;
use nova_core::metastore::{Compare, KeyValue, MetastoreError, Txn, TxnOutcome};

use crate::Fleet;
use crate::error::HandoffError;
use crate::keys::{LEADERS, chain_key, leader_key};

impl Fleet {
    /// Moves every leader record naming `star` to the least-loaded other star open to
    /// leadership (each only if unchanged since read), or deletes it when none is, to be
    /// placed on demand. Returns how many. For a star leaving after landing and absorbing
    /// everything it admitted.
    async fn hand_off_records_of(&self, star: &str) -> Result<u64, MetastoreError> {
        // A fresh view, without this star: it is leaving.
        if let Err(err) = self.refresh_members().await {
            tracing::warn!("refreshing the fleet view before handing streams off: {err}");
        }
        self.draining.store(true, Ordering::Relaxed);
        let handoffs = self.metrics.handoffs.with_label_values(&["leaving"]);
        self.rewrite_records_of(
            star,
            |kv, unchanged| match self.pick_among(false) {
                Ok(target) => {
                    self.count_placement(&target.id);
                    unchanged.put(kv.key.clone(), target.id.into_bytes())
                }
                Err(_) => unchanged.delete(kv.key.clone()),
            },
            || handoffs.inc(),
        )
        .await
    }

    /// Commits, for every leader record naming `star`, the transaction `change` makes of it
    /// (given one that holds only while the record is unchanged since read), calling
    /// `committed` after each that lands. Returns how many landed.
    pub(crate) async fn rewrite_records_of(
        &self,
        star: &str,
        mut change: impl FnMut(&KeyValue, Txn) -> Txn,
        mut committed: impl FnMut(),
    ) -> Result<u64, MetastoreError> {
        let mut changed = 0;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self
                .metastore
                .scan(LEADERS.as_bytes(), after.as_deref(), 500)
                .await?;
            let done = page.len() < 500;
            for kv in page.iter().filter(|kv| kv.value == star.as_bytes()) {
                let unchanged = Txn::new().compare(Compare::Version(kv.key.clone(), kv.version));
                if let TxnOutcome::Committed { .. } =
                    self.metastore.commit(change(kv, unchanged)).await?
                {
                    changed += 1;
                    committed();
                }
            }
            after = page.last().map(|kv| kv.key.clone());
            if done {
                return Ok(changed);
            }
        }
    }

    /// Hands one stream this star leads to the least-loaded other star open to leadership:
    /// stops admitting for it, lets what was admitted land and be absorbed, then moves the
    /// leader record with a compare-and-set. Its producers are redirected from then on.
    pub async fn hand_off(
        &self,
        star: &Star,
        stream: &str,
        reason: &str,
    ) -> Result<(), HandoffError> {
        let target = self.pick_among(false).map_err(|_| HandoffError::NoTarget)?;
        let key = leader_key(stream);
        let state = self
            .led_state(star, stream)
            .ok_or_else(|| HandoffError::NotLed(stream.to_owned()))?;
        // The version this star claimed the record at: the handoff moves it from there.
        let Some(Compare::Version(_, epoch)) = state.leadership() else {
            return Err(HandoffError::NotLed(stream.to_owned()));
        };
        let record = self.metastore.get(&key).await?;
        if record.is_none_or(|kv| kv.version != epoch) {
            // Changed since this star claimed it: led elsewhere now; stop treating it as ours.
            state.set_released(true);
            self.stop_leading(stream);
            return Err(HandoffError::NotLed(stream.to_owned()));
        }
        star.release(&state, self.config.lease_ttl)
            .await
            .map_err(HandoffError::Release)?;
        let moved = Txn::new()
            .compare(Compare::Version(key.clone(), epoch))
            .put(key.clone(), target.id.clone().into_bytes());
        match self.metastore.commit(moved).await {
            Ok(TxnOutcome::Committed { .. }) => {}
            Ok(TxnOutcome::Conflict) => {
                self.stop_leading(stream);
                return Err(HandoffError::Moved(stream.to_owned()));
            }
            Err(source) => {
                // The move may still apply: it may be queued at the metastore, or applied with
                // its answer lost, and a read may not show it yet. Only a compare that fails
                // if it applied, and keeps it from ever applying, tells.
                match self.take_back(stream, epoch).await {
                    Some(epoch) => state.keep_leading_under(Some(Compare::Version(key, epoch))),
                    None => self.stop_leading(stream),
                }
                return Err(HandoffError::Move {
                    stream: stream.to_owned(),
                    source,
                });
            }
        }
        self.stop_leading(stream);
        self.metrics.handoffs.with_label_values(&[reason]).inc();
        self.count_placement(&target.id);
        tracing::info!(stream, star = %self.config.star_id, to = %target.id, reason, "handed the stream off");
        Ok(())
    }

    /// After a move of `stream`'s leader record (from `version`) whose answer was lost: rewrites
    /// the record, naming this star, if it is still at `version`. If that lands, the move did
    /// not apply and never can (its compare now fails), so the stream is this star's again, at
    /// the version written (returned);
    /// if the record moved, the move (or something later) applied and the stream is led
    /// elsewhere. Reading the record cannot tell: the move may apply after the read. Until
    /// one of the two is known the stream stays released, refusing appends; a lost lease
    /// ends the wait (the stream is then nobody's here).
    async fn take_back(&self, stream: &str, version: u64) -> Option<u64> {
        let key = leader_key(stream);
        let mut attempt = 0u32;
        loop {
            let keep = Txn::new()
                .compare(Compare::Version(key.clone(), version))
                .put(key.clone(), self.config.star_id.clone().into_bytes());
            match self.metastore.commit(keep).await {
                Ok(TxnOutcome::Committed { revision }) => {
                    tracing::info!(
                        stream,
                        star = %self.config.star_id,
                        "the handoff did not apply; leading the stream again"
                    );
                    return Some(revision);
                }
                Ok(TxnOutcome::Conflict) => {
                    tracing::info!(
                        stream,
                        star = %self.config.star_id,
                        "the handoff applied after its answer was lost"
                    );
                    return None;
                }
                Err(err) => {
                    attempt += 1;
                    if attempt == 1 || attempt.is_multiple_of(10) {
                        tracing::warn!(
                            stream,
                            attempt,
                            "settling a handoff whose answer was lost; the stream refuses \
                             appends until it is settled: {err}"
                        );
                    }
                    tokio::select! {
                        biased;
                        _ = self.lost.cancelled() => return None,
                        _ = self.clock.sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
    }

    /// While this star is saturated, hands one stream off every third of a lease ttl, until
    /// it clears or leads nothing.
    pub fn start_balancing(self: &Arc<Self>, star: Arc<Star>) {
        let fleet = self.clone();
        let supervisor = self.config.supervisor.clone();
        supervisor.watch("fleet balancing", self.lost.clone(), async move {
            // Streams are tried in turn, so one that cannot move now does not hold up the rest.
            let mut turn = 0usize;
            loop {
                tokio::select! {
                    biased;
                    _ = fleet.lost.cancelled() => return,
                    _ = fleet.clock.sleep(fleet.config.lease_ttl / 3) => {}
                }
                if !fleet.saturated.load(Ordering::Relaxed)
                    || fleet.draining.load(Ordering::Relaxed)
                {
                    continue;
                }
                turn = turn.wrapping_add(1);
                let stream = {
                    let led = fleet.led.read();
                    match led.len() {
                        0 => continue,
                        n => led.iter().nth(turn % n).cloned(),
                    }
                };
                let Some(stream) = stream else {
                    continue;
                };
                if let Err(err) = fleet.hand_off(&star, &stream, "saturated").await {
                    tracing::warn!(stream, "handing a stream off while saturated failed: {err}");
                }
            }
        });
    }

    /// Leaves the fleet after a clean shutdown (everything admitted landed and was absorbed):
    /// this star's streams are released to be placed on the others and its chain needs no
    /// takeover. After an unclean one the chain stays registered, for a survivor to settle.
    pub async fn leave(&self, drained: bool) {
        // The lease is kept alive while the records move (a survivor would otherwise take the
        // drained chain over); it is given up right after.
        if drained && !self.lost.is_cancelled() {
            let cleared = async {
                let released = self.hand_off_records_of(&self.config.star_id).await?;
                // Only this incarnation's registration: if this delete applied late (its
                // answer lost, the next incarnation registered meanwhile), an unconditional
                // one would unregister a chain that may hold acknowledged records.
                let key = chain_key(&self.config.star_id);
                let registered = self.chain_registered.load(Ordering::Acquire);
                self.metastore
                    .commit(
                        Txn::new()
                            .compare(Compare::Version(key.clone(), registered))
                            .delete(key),
                    )
                    .await?;
                Ok::<u64, MetastoreError>(released)
            };
            match cleared.await {
                Ok(released) => tracing::info!(
                    streams_released = released,
                    "left the fleet: this star's streams are placed on the others on demand"
                ),
                Err(err) => tracing::warn!(
                    "releasing this star's streams failed; a survivor takes its chain over once \
                     the lease lapses: {err}"
                ),
            }
        }
        self.lost.cancel();
        if let Err(err) = self.metastore.revoke_lease(self.lease).await {
            tracing::warn!("revoking the fleet lease failed (it lapses on its own): {err}");
        }
    }
}
