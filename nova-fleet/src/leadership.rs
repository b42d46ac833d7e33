//! Leadership: which streams this star leads, taking one up, giving one back, and the stream
//! admin calls (create, delete) as a fleet runs them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use nova_chain::Star;
use nova_chain::streams::StreamState;
use nova_core::catalog::{Retention, StorageClass};
use nova_core::metastore::{Compare, MetastoreError, Txn, TxnOutcome};
use nova_proto::RequestError;

use crate::Fleet;
use crate::keys::{Member, leader_key};
use crate::placement::metastore_failed;

impl Fleet {
    /// Whether this star leads `stream` now.
    pub fn leads(&self, stream: &str) -> bool {
        self.led.read().contains(stream)
    }

    /// How many streams this star leads now.
    pub fn streams_led(&self) -> usize {
        self.led.read().len()
    }

    /// Takes `stream` up, its leader record naming this star. Under the lock, the record is
    /// read again and claimed: rewritten, naming this star, by a compare-and-set on the version
    /// read. This star leads the stream at the version that claim wrote (its leadership epoch,
    /// which every absorb of its records compares), so no change of the record based on an
    /// older version (a handoff or deletion whose answer was lost, by this star's previous
    /// incarnation or anyone) can apply once it leads. `Ok(None)` when the record no longer
    /// names this star: the caller looks again.
    pub(crate) async fn acquire(
        &self,
        star: &Star,
        stream: &str,
    ) -> Result<Option<Arc<StreamState>>, RequestError> {
        // One at a time: two requests taking the same stream up at once must not both reset
        // its position (the second would rewind what the first already admitted).
        let _acquiring = self.acquiring.lock().await;
        if let Some(state) = self.led_state(star, stream) {
            return Ok(Some(state));
        }
        let Some(epoch) = self.claim(stream).await? else {
            return Ok(None);
        };
        let guard = Compare::Version(leader_key(stream), epoch);
        let state = match star
            .streams()
            .acquire(stream, guard, self.streams_led())
            .await
        {
            Ok(Some(state)) => state,
            Ok(None) => return Err(RequestError::StreamNotFound(stream.to_owned())),
            // This star cannot take another stream (--max-streams): it says so to the fleet
            // and gives the record back, so the stream is placed on a star that can.
            Err(nova_core::catalog::CatalogError::Conflict(why)) => {
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!("this star takes no more streams: {why}");
                }
                if let Err(err) = self.publish().await {
                    tracing::warn!("publishing that this star is full failed: {err}");
                }
                self.give_up_record(stream).await;
                return Err(RequestError::Unavailable(format!(
                    "star {} cannot take stream {stream:?} up ({why}); retry: it is placed again",
                    self.config.star_id
                )));
            }
            Err(err) => {
                return Err(
                    RequestError::from(err).context(format_args!("taking up stream {stream:?}"))
                );
            }
        };
        let mut led = self.led.write();
        if led.insert(stream.to_owned()) {
            tracing::info!(
                stream,
                star = %self.config.star_id,
                tail = state.tail(),
                epoch,
                "leading the stream"
            );
        }
        self.metrics.streams_led.set(led.len() as i64);
        Ok(Some(state))
    }

    /// The stream's state when this star leads it now and may serve it: not being handed off,
    /// and not deposed (an absorb found its leadership moved, which ends it here).
    pub(crate) fn led_state(&self, star: &Star, stream: &str) -> Option<Arc<StreamState>> {
        if !self.led.read().contains(stream) {
            return None;
        }
        let state = star.streams().get(stream)?;
        // Deposed, or a stream of this name that was never taken up here (created again after
        // a delete while the delete still forgot the old one): it is claimed afresh first, so
        // no batch of it is sequenced without a leadership guard.
        if state.is_deposed() || state.leadership().is_none() {
            self.stop_leading(stream);
            return None;
        }
        Some(state)
    }

    /// Rewrites `stream`'s leader record, naming this star, if it names this star now; the
    /// version written, or `None` when it names another star or none. A claim whose answer is
    /// lost is made again from a fresh read: only an answer tells that no earlier claim (or
    /// anything else based on the version read) can still apply.
    async fn claim(&self, stream: &str) -> Result<Option<u64>, RequestError> {
        let key = leader_key(stream);
        let mut last = None;
        for _ in 0..5 {
            let Some(record) = self
                .metastore
                .get(&key)
                .await
                .map_err(metastore_failed)?
                .filter(|kv| kv.value == self.config.star_id.as_bytes())
            else {
                return Ok(None);
            };
            let claim = Txn::new()
                .compare(Compare::Version(key.clone(), record.version))
                .put(key.clone(), self.config.star_id.clone().into_bytes());
            match self.metastore.commit(claim).await {
                Ok(TxnOutcome::Committed { revision }) => return Ok(Some(revision)),
                // Changed since read: read it again.
                Ok(TxnOutcome::Conflict) => {}
                Err(err) => last = Some(err),
            }
        }
        Err(RequestError::Unavailable(format!(
            "taking up stream {stream:?}: its leader record could not be claimed{}; retry",
            last.map(|e| format!(" ({e})")).unwrap_or_default()
        )))
    }

    /// Gives `stream`'s leader record up for it to be placed again (best effort: a failure
    /// leaves the record, and the next request tries again).
    async fn give_up_record(&self, stream: &str) {
        if let Err(err) = self.delete_own_record(stream).await {
            tracing::warn!(stream, "giving a leader record up failed: {err}");
        }
    }

    /// Deletes `stream`'s leader record if it still names this star (compared by version).
    async fn delete_own_record(&self, stream: &str) -> Result<(), MetastoreError> {
        let key = leader_key(stream);
        let record = self.metastore.get(&key).await?;
        if let Some(kv) = record.filter(|kv| kv.value == self.config.star_id.as_bytes()) {
            let delete = Txn::new()
                .compare(Compare::Version(key.clone(), kv.version))
                .delete(key);
            self.metastore.commit(delete).await?;
        }
        Ok(())
    }

    /// This star no longer leads `stream`. A place is free again, so a star that was full
    /// (`--max-streams`) takes leadership again until a take-up finds the cap again.
    pub(crate) fn stop_leading(&self, stream: &str) {
        let mut led = self.led.write();
        if led.remove(stream) {
            self.full.store(false, Ordering::Relaxed);
        }
        self.metrics.streams_led.set(led.len() as i64);
    }

    /// Forgets the leadership of `deleted`, a stream this star led and has just deleted, led
    /// under `guard`. The name may already belong to a new stream (created again through
    /// another star while the delete ran, and taken up here meanwhile): that one's leadership,
    /// and its leader record, are left alone.
    async fn forget(
        &self,
        star: &Star,
        deleted: &StreamState,
        guard: Option<Compare>,
    ) -> Result<(), RequestError> {
        let name = deleted.name();
        {
            let _acquiring = self.acquiring.lock().await;
            // Renewed only if the new stream was taken up here under a leadership of its own;
            // one merely created here again is not led until it is claimed.
            let renewed = star.streams().get(name).is_some_and(|now| {
                now.id() != deleted.id() && now.leadership().is_some_and(|led| Some(led) != guard)
            });
            if !renewed {
                self.stop_leading(name);
            }
        }
        // The record only at the version the deleted stream was led under.
        if let Some(Compare::Version(key, version)) = guard {
            let delete = Txn::new()
                .compare(Compare::Version(key.clone(), version))
                .delete(key);
            self.metastore
                .commit(delete)
                .await
                .map_err(metastore_failed)?;
        }
        Ok(())
    }

    /// Creates a stream in the shared catalog and places its leadership at once: refused
    /// before anything is written while no star can lead it. Returns the stream as this
    /// star's registry holds it, and its leader.
    pub async fn create_stream(
        &self,
        star: &Star,
        name: &str,
        class: StorageClass,
        retention: Retention,
    ) -> Result<(Arc<StreamState>, Member), RequestError> {
        self.check_capacity()?;
        let stream = star.streams().create_with(name, class, retention).await?;
        let leader = self.place_new(name).await?;
        Ok((stream, leader))
    }

    /// Deletes a stream this star leads (any other star answers with a redirect: the leader
    /// holds its appends in flight), and forgets its leadership.
    pub async fn delete_stream(&self, star: &Star, name: &str) -> Result<(), RequestError> {
        let deleted = self.route(star, name).await?;
        let guard = deleted.leadership();
        star.streams().delete(name).await?;
        self.forget(star, &deleted, guard).await
    }
}
