//! Placement and redirects: a request for a stream reaches its leader. Any other star answers
//! with a redirect naming it, and a stream without a leader is placed on the least-loaded star
//! that is neither saturated nor draining.

use std::sync::Arc;
use std::time::Duration;

use nova_chain::Star;
use nova_chain::streams::StreamState;
use nova_core::metastore::{Compare, MetastoreError, Txn, TxnOutcome};
use nova_proto::RequestError;
use nova_proto::validate::validate_stream_name;

use crate::Fleet;
use crate::keys::{Member, chain_key, leader_key, star_key, takeover_key};

/// Placements remembered for spreading a burst of creates.
const MAX_RECENT_PLACEMENTS: usize = 4096;

/// How long a refused fleet open should wait before trying again.
pub(crate) const CAPACITY_RETRY: Duration = Duration::from_secs(2);

/// A metastore failure on a fleet path, with the code its conversion gives it.
pub(crate) fn metastore_failed(err: MetastoreError) -> RequestError {
    RequestError::from(err).context("in the fleet")
}

impl Fleet {
    /// Remembers a placement on `star` for a lease ttl, by when the star has taken the stream
    /// up and published it; until then it counts toward the star's load here, so a burst of
    /// creates spreads instead of piling onto one star.
    pub(crate) fn count_placement(&self, star: &str) {
        let now = self.clock.now();
        let mut placed = self.placed.lock();
        placed.retain(|(at, _)| now.duration_since(*at) < self.config.lease_ttl);
        if placed.len() < MAX_RECENT_PLACEMENTS {
            placed.push((now, star.to_owned()));
        }
    }

    /// The least-loaded star open to new leadership, this one included, from a fresh view.
    async fn pick_fresh(&self) -> Result<Member, RequestError> {
        self.refresh_members().await.map_err(metastore_failed)?;
        self.pick()
    }

    /// The least-loaded star open to new leadership, this one included.
    fn pick(&self) -> Result<Member, RequestError> {
        self.pick_among(true)
    }

    /// The least-loaded star open to new leadership, this one included or not.
    pub(crate) fn pick_among(&self, me_too: bool) -> Result<Member, RequestError> {
        let mut candidates = self.others();
        let mut me = self.me();
        if let Some(seen) = self.members.read().get(&self.config.star_id) {
            me.streams_led = me.streams_led.max(seen.streams_led);
        }
        if me_too {
            candidates.push(me);
        }
        let now = self.clock.now();
        let recent = self.placed.lock().clone();
        let load = |m: &Member| {
            let pending = recent
                .iter()
                .filter(|(at, id)| *id == m.id && now.duration_since(*at) < self.config.lease_ttl)
                .count() as u64;
            (m.streams_led + pending, m.id.clone())
        };
        candidates
            .into_iter()
            .filter(Member::open)
            .min_by_key(load)
            .ok_or_else(|| {
                self.metrics.capacity_refusals.inc();
                RequestError::CapReached {
                    cap: crate::FLEET_CAPACITY,
                    limit: self.members.read().len().max(1) as u64,
                    what: "every star of the fleet is saturated, draining or full (--max-streams)",
                    retry_after: CAPACITY_RETRY,
                }
            })
    }

    /// Refuses a new stream while no star can take its leadership.
    pub fn check_capacity(&self) -> Result<(), RequestError> {
        self.pick().map(|_| ())
    }

    pub(crate) fn redirect(&self, stream: &str, leader: &Member) -> RequestError {
        self.metrics.redirects.inc();
        RequestError::NotLeader {
            stream: stream.to_owned(),
            leader_id: leader.id.clone(),
            leader_addr: leader.advertise.clone(),
        }
    }

    async fn member(&self, id: &str) -> Result<Option<Member>, RequestError> {
        if let Some(member) = self.members.read().get(id) {
            return Ok(Some(member.clone()));
        }
        let found = self
            .metastore
            .get(&star_key(id))
            .await
            .map_err(metastore_failed)?;
        Ok(found.and_then(|kv| Member::decode(id, &kv.value)))
    }

    /// The leader of `stream`, as (id, address); this star's own when it leads it.
    pub async fn leader_of(&self, stream: &str) -> Result<Option<Member>, RequestError> {
        if self.led.read().contains(stream) {
            return Ok(Some(self.me()));
        }
        let record = self
            .metastore
            .get(&leader_key(stream))
            .await
            .map_err(metastore_failed)?;
        match record {
            Some(kv) => self.member(&String::from_utf8_lossy(&kv.value)).await,
            None => Ok(None),
        }
    }

    /// The leaders of the streams named `{prefix}…`, by stream, as the leader records name
    /// them (the first `limit`); streams without a leader are not in it, and a leader that
    /// is not registered (departed, not yet taken over) shows as `None`.
    pub async fn leaders_under(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<std::collections::BTreeMap<String, Option<Member>>, RequestError> {
        let records = self
            .metastore
            .scan(&leader_key(prefix), None, limit)
            .await
            .map_err(metastore_failed)?;
        let mut stars: std::collections::HashMap<String, Option<Member>> = self
            .stars()
            .into_iter()
            .map(|m| (m.id.clone(), Some(m)))
            .collect();
        let mut leaders = std::collections::BTreeMap::new();
        for kv in records {
            let stream = crate::keys::id_under(crate::keys::LEADERS, &kv.key);
            let leader = if self.leads(&stream) {
                Some(self.me())
            } else {
                let id = String::from_utf8_lossy(&kv.value).into_owned();
                // A star this view has not seen yet (it joined since the last refresh) is
                // read from its registration.
                if !stars.contains_key(&id) {
                    let found = self.member(&id).await?;
                    stars.insert(id.clone(), found);
                }
                stars.get(&id).cloned().flatten()
            };
            leaders.insert(stream, leader);
        }
        Ok(leaders)
    }

    /// The stream, when this star leads it (placing it here or elsewhere if it has no leader);
    /// otherwise a redirect to its leader.
    pub async fn route(&self, star: &Star, stream: &str) -> Result<Arc<StreamState>, RequestError> {
        validate_stream_name(stream)?;
        if self.lost.is_cancelled() {
            return Err(RequestError::Unavailable(format!(
                "star {} left the fleet and leads nothing; retry against another star",
                self.config.star_id
            )));
        }
        // A star that cannot vouch for its lease (just woken from a pause, cut off from the
        // metastore) leads nothing until the keeper has renewed it or given up.
        let unrenewed = self.unrenewed();
        if unrenewed > self.trust() {
            return Err(RequestError::Unavailable(format!(
                "star {} has not renewed its fleet lease for {unrenewed:?}; retry against \
                 another star",
                self.config.star_id
            )));
        }
        if let Some(state) = self.led_state(star, stream) {
            if state.is_released() {
                // Mid-handoff: the record may already name the next leader, so neither serve
                // (a read would show a tail that is no longer the stream's) nor take it up.
                return Err(RequestError::Unavailable(format!(
                    "stream {stream:?} is being handed to another star; retry"
                )));
            }
            return Ok(state);
        }
        let key = leader_key(stream);
        // A placement racing another star's retries once, reading the winner.
        for _ in 0..3 {
            let record = self.metastore.get(&key).await.map_err(metastore_failed)?;
            let target = match record {
                Some(kv) => {
                    let leader = String::from_utf8_lossy(&kv.value).into_owned();
                    if leader == self.config.star_id {
                        match self.acquire(star, stream).await? {
                            Some(state) => return Ok(state),
                            None => continue,
                        }
                    }
                    match self.member(&leader).await? {
                        Some(member) => return Err(self.redirect(stream, &member)),
                        None => {
                            self.wait_for_successor(star, stream, &leader, kv.version)
                                .await?;
                            continue;
                        }
                    }
                }
                None => {
                    let exists = star
                        .streams()
                        .catalog()
                        .stream_exists(stream)
                        .await
                        .map_err(RequestError::from)?;
                    if !exists {
                        return Err(RequestError::StreamNotFound(stream.to_owned()));
                    }
                    self.pick_fresh().await?
                }
            };
            if self.try_place(stream, &target).await? {
                tracing::info!(
                    stream,
                    by = %self.config.star_id,
                    star = %target.id,
                    "placed a stream without a leader"
                );
                if target.id == self.config.star_id {
                    match self.acquire(star, stream).await? {
                        Some(state) => return Ok(state),
                        None => continue,
                    }
                }
                return Err(self.redirect(stream, &target));
            }
        }
        Err(RequestError::Unavailable(format!(
            "stream {stream:?}: its leadership kept moving while this star looked it up; retry"
        )))
    }

    /// Waits while `stream`'s leader record names `departed`, a star no longer in the fleet,
    /// whose chain a survivor must settle before the stream can be led again. The wait is a
    /// stall with the cause `predecessor_settling`. A record left by a star whose chain is
    /// settled already (nothing to take over) is cleared at once.
    async fn wait_for_successor(
        &self,
        star: &Star,
        stream: &str,
        departed: &str,
        version: u64,
    ) -> Result<(), RequestError> {
        let key = leader_key(stream);
        let chain_pending = async {
            let chain = self.metastore.get(&chain_key(departed)).await?;
            let taking = self.metastore.get(&takeover_key(departed)).await?;
            Ok::<bool, MetastoreError>(chain.is_some() || taking.is_some())
        };
        if !chain_pending.await.map_err(metastore_failed)? {
            let stale = Txn::new()
                .compare(Compare::Version(key.clone(), version))
                .delete(key.clone());
            self.metastore
                .commit(stale)
                .await
                .map_err(metastore_failed)?;
            return Ok(());
        }
        self.metrics.waits.inc();
        let _stall = nova_chain::stall::Stall::begin(
            star.metrics().clone(),
            self.clock,
            "leadership",
            nova_chain::stall::StallCause::PredecessorSettling,
            &format!(
                "stream {stream:?} waits for star {departed:?}'s chain to be taken over (its lease \
                 lapsed)"
            ),
        );
        // A lease lapses within a ttl; settling a chain takes as long as reading its unsettled
        // slots. Past this the client is told to retry (with the hint) instead.
        let patience = self.config.lease_ttl * 4;
        let started = self.clock.now();
        while self.clock.since(started) < patience {
            self.clock.sleep(Duration::from_millis(200)).await;
            let record = self.metastore.get(&key).await.map_err(metastore_failed)?;
            if record.is_none_or(|kv| kv.version != version) {
                return Ok(());
            }
        }
        Err(RequestError::CapReached {
            cap: "leadership",
            limit: 1,
            what: "the stream's previous leader left the fleet and its chain is still being \
                   settled (predecessor_settling)",
            retry_after: CAPACITY_RETRY,
        })
    }

    /// Places a new stream's leadership right away (here when this star is open to it).
    pub async fn place_new(&self, stream: &str) -> Result<Member, RequestError> {
        let target = self.pick_fresh().await?;
        if self.try_place(stream, &target).await? {
            return Ok(target);
        }
        // Placed meanwhile (a request for it arrived first): report where.
        Ok(self.leader_of(stream).await?.unwrap_or(target))
    }

    /// Writes `stream`'s leader record naming `target` if it has none; `false` when another
    /// placement got there first.
    async fn try_place(&self, stream: &str, target: &Member) -> Result<bool, RequestError> {
        let key = leader_key(stream);
        let placed = Txn::new()
            .compare(Compare::Missing(key.clone()))
            .put(key, target.id.clone().into_bytes());
        let outcome = self
            .metastore
            .commit(placed)
            .await
            .map_err(metastore_failed)?;
        if outcome == TxnOutcome::Conflict {
            return Ok(false);
        }
        self.metrics.placements.inc();
        self.count_placement(&target.id);
        Ok(true)
    }
}
