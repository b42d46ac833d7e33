//! Membership and the lease: a star registers under a lease, renews it, publishes its load,
//! keeps a view of the others, and stops leading the moment it can no longer vouch for the
//! lease.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use nova_core::clock::Clock;
use nova_core::metastore::{Compare, Metastore, MetastoreError, Txn, TxnOutcome};

use crate::error::JoinError;
use crate::keys::{Member, STARS, adopt_key, chain_key, id_under, star_key, takeover_key};
use crate::metrics::FleetMetrics;
use nova_core::supervisor::Supervisor;

/// The star's side of the fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub star_id: String,
    pub advertise: String,
    /// HOST:PORT of its Kafka listener (`--kafka-advertise-addr`), published with its
    /// registration so every star's Metadata answers name it; empty for none.
    pub kafka_advertise: String,
    pub lease_ttl: Duration,
    /// Watches the fleet's loops (renewal, view, trust, takeovers, balancing): one that stops
    /// while the lease is still held fails it, naming the loop.
    pub supervisor: Supervisor,
}

/// One star's membership of the fleet, and everything it knows and decides about leadership.
pub struct Fleet {
    pub(crate) metastore: Arc<dyn Metastore>,
    pub(crate) config: FleetConfig,
    pub(crate) lease: u64,
    pub(crate) clock: Clock,
    pub(crate) started_ms: u64,
    /// The version of this star's registration, for compare-and-set updates.
    pub(crate) registration: AtomicU64,
    /// The version its chain registration (`fleet/chains/{id}`) was written at: a clean
    /// leave removes exactly that one, never a later incarnation's.
    pub(crate) chain_registered: AtomicU64,
    /// When the last renewal that succeeded was sent: the lease runs at least a ttl from it.
    pub(crate) renewed: Mutex<Instant>,
    pub(crate) members: RwLock<BTreeMap<String, Member>>,
    /// Streams led here, in order: the balancer takes them in turn, the same way each run.
    pub(crate) led: RwLock<BTreeSet<String>>,
    /// Serialises publishing this star's registration.
    pub(crate) publishing: tokio::sync::Mutex<()>,
    /// Serialises taking streams up.
    pub(crate) acquiring: tokio::sync::Mutex<()>,
    /// Placements made here in the last lease ttl: (when, star).
    pub(crate) placed: Mutex<Vec<(Instant, String)>>,
    pub(crate) saturated: AtomicBool,
    pub(crate) draining: AtomicBool,
    /// A take-up failed on `--max-streams`: no more leadership here.
    pub(crate) full: AtomicBool,
    /// Registered, not yet serving (recovering its chain): no leadership is placed here.
    pub(crate) starting: AtomicBool,
    pub(crate) lost: CancellationToken,
    pub(crate) lost_reason: Mutex<Option<String>>,
    pub(crate) metrics: FleetMetrics,
    /// Departed stars' chains not yet taken over, with when this star first saw each.
    pub(crate) departed: Mutex<BTreeMap<String, Instant>>,
}

impl Fleet {
    /// Registers this star under a fresh lease. A registration already there under this id is
    /// waited on for up to two lease ttls (a previous incarnation killed without revoking its
    /// lease); one still kept alive after that is a second live star with this id, refused.
    pub async fn join(
        metastore: Arc<dyn Metastore>,
        config: FleetConfig,
        metrics: FleetMetrics,
        clock: Clock,
    ) -> Result<Arc<Self>, JoinError> {
        let capabilities = metastore.capabilities();
        if !(capabilities.leases && capabilities.shared) {
            return Err(JoinError::NoLeases {
                metastore: metastore.describe(),
            });
        }
        // The lease runs a ttl from when the grant was sent, at least: trust counts from here.
        let granted = clock.now();
        let lease = metastore
            .grant_lease(config.lease_ttl)
            .await
            .map_err(|source| JoinError::Metastore {
                what: "granting the star's fleet lease",
                source,
            })?;
        let started_ms = clock.unix_ms();
        let fleet = Arc::new(Self {
            metastore,
            lease,
            clock,
            started_ms,
            registration: AtomicU64::new(0),
            chain_registered: AtomicU64::new(0),
            renewed: Mutex::new(granted),
            members: RwLock::default(),
            led: RwLock::default(),
            placed: Mutex::default(),
            acquiring: tokio::sync::Mutex::new(()),
            publishing: tokio::sync::Mutex::new(()),
            saturated: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            full: AtomicBool::new(false),
            starting: AtomicBool::new(true),
            lost: CancellationToken::new(),
            lost_reason: Mutex::new(None),
            metrics,
            departed: Mutex::default(),
            config,
        });
        fleet.register().await?;
        fleet
            .refresh_members()
            .await
            .map_err(|source| JoinError::Metastore {
                what: "reading the fleet's members",
                source,
            })?;
        if let Err(refused) = fleet.wait_for_own_address().await {
            // Registered but starting, so nothing was placed here; a survivor settles this
            // star's chain (a previous run's, if any) as it would after a crash.
            fleet.leave(false).await;
            return Err(refused);
        }
        // The registration's answer may come long after it applied (a star paused meanwhile):
        // past the trust window the lease may have lapsed, and a survivor may be taking this
        // star's chain over already. Its recovery would meet that survivor's; join again.
        if fleet.unrenewed() > fleet.trust() {
            fleet.lose("unrenewed", "the fleet lease lapsed while joining".into());
            return Err(JoinError::LeaseExpired {
                while_doing: "joined the fleet",
            });
        }
        let supervisor = &fleet.config.supervisor;
        supervisor.watch("fleet renewal", fleet.lost.clone(), fleet.clone().renew());
        supervisor.watch("fleet view", fleet.lost.clone(), fleet.clone().refresh());
        supervisor.watch(
            "fleet trust",
            fleet.lost.clone(),
            fleet.clone().watch_trust(),
        );
        Ok(fleet)
    }

    /// The stars registered in the fleet, this one included, as last read.
    pub fn stars_seen(&self) -> usize {
        self.members.read().len()
    }

    /// The stars registered in the fleet as last read, this one as it is now.
    pub fn stars(&self) -> Vec<Member> {
        let mut stars = self.others();
        stars.push(self.me());
        stars
    }

    /// The other stars' registrations, as last read.
    pub(crate) fn others(&self) -> Vec<Member> {
        self.members
            .read()
            .values()
            .filter(|m| m.id != self.config.star_id)
            .cloned()
            .collect()
    }

    /// The stars' registrations as last read, this one's as published (not as it is now):
    /// what every star decides from alike, a refresh apart.
    pub fn stars_as_read(&self) -> Vec<Member> {
        self.members.read().values().cloned().collect()
    }

    /// The URL redirects to this star carry.
    pub fn advertise(&self) -> &str {
        &self.config.advertise
    }

    /// This star's id in the fleet.
    pub fn id(&self) -> &str {
        &self.config.star_id
    }

    /// Waits, after joining, until no other star's auditor looks after this star's chain: the
    /// adopter lets go once it sees the registration and its running job ends (or its lease
    /// lapses). Past two ttls the star goes on regardless: two auditors on one chain are safe
    /// (every step is a compare-and-set), only wasteful.
    async fn wait_for_adopter(&self) -> Result<(), JoinError> {
        let key = adopt_key(&self.config.star_id);
        let patience = self.config.lease_ttl * 2;
        let started = self.clock.now();
        let mut logged = false;
        while self.clock.since(started) < patience {
            let adopter = match self.metastore.get(&key).await {
                Ok(None) => return Ok(()),
                Ok(Some(kv)) => String::from_utf8_lossy(&kv.value).into_owned(),
                Err(err) => format!("unknown: {err}"),
            };
            if !logged {
                tracing::info!(
                    star = %self.config.star_id,
                    %adopter,
                    "waiting for the star that adopted this star's chain to let go"
                );
                logged = true;
            }
            self.renew_while_waiting("waited for its chain's adopter")
                .await?;
            self.clock.sleep(Duration::from_millis(250)).await;
        }
        tracing::warn!(
            star = %self.config.star_id,
            "the star that adopted this star's chain has not let go; going on regardless"
        );
        Ok(())
    }

    pub(crate) fn me(&self) -> Member {
        Member {
            id: self.config.star_id.clone(),
            advertise: self.config.advertise.clone(),
            started_ms: self.started_ms,
            saturated: self.saturated.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            streams_led: self.led.read().len() as u64,
            full: self.full.load(Ordering::Relaxed),
            starting: self.starting.load(Ordering::Relaxed),
            kafka: self.config.kafka_advertise.clone(),
        }
    }

    /// The star has recovered its chain and serves: from now on leadership may be placed here.
    /// Until then it is registered (so no second process recovers its chain) but shows as
    /// starting, or, leading nothing, it would look like the least-loaded star of the fleet
    /// and attract streams it cannot serve.
    pub async fn ready(&self) {
        self.starting.store(false, Ordering::Relaxed);
        if let Err(err) = self.publish().await {
            tracing::warn!("publishing that this star serves failed: {err}");
        }
    }

    /// Refuses to join while another star is registered with this star's address: every
    /// redirect to either would reach one of them, and the fleet would look healthy while
    /// requests bounced. Checked on the members read right after registering (no call of its
    /// own when the address is free). A star still stopping on the address, or one killed
    /// (and renamed since) whose lease has not lapsed, is waited on for two ttls and 35 s, with
    /// this star shown as starting so nothing is placed on it. Two stars registering at once
    /// can both miss each other here; the start-up probe of the address catches that.
    async fn wait_for_own_address(&self) -> Result<(), JoinError> {
        // Long enough for a star stopping cleanly on the address (its default shutdown deadline
        // is 30 s) or for a killed one's lease to lapse.
        let patience = self.config.lease_ttl * 2 + Duration::from_secs(35);
        let started = self.clock.now();
        let mut logged = false;
        loop {
            let other = self
                .members
                .read()
                .values()
                .find(|m| m.id != self.config.star_id && m.advertise == self.config.advertise)
                .map(|m| m.id.clone());
            let Some(other) = other else {
                return Ok(());
            };
            if self.clock.since(started) >= patience {
                return Err(JoinError::AdvertiseTaken {
                    other,
                    advertise: self.config.advertise.clone(),
                });
            }
            if !logged {
                tracing::warn!(
                    star = %self.config.star_id,
                    %other,
                    advertise = %self.config.advertise,
                    "another star is registered with this star's address; waiting for its \
                     lease to lapse (a star killed and renamed?) before going on"
                );
                logged = true;
            }
            self.renew_while_waiting("waited for its address to be free")
                .await?;
            self.clock.sleep(Duration::from_millis(500)).await;
            self.refresh_members()
                .await
                .map_err(|source| JoinError::Metastore {
                    what: "reading the fleet's members",
                    source,
                })?;
        }
    }

    async fn register(&self) -> Result<(), JoinError> {
        let metastore = |source| JoinError::Metastore {
            what: "registering in the fleet",
            source,
        };
        let key = star_key(&self.config.star_id);
        let patience = self.config.lease_ttl * 2 + Duration::from_secs(5);
        let started = self.clock.now();
        let mut logged = false;
        loop {
            // Not while a survivor is taking this star's previous chain over: it would be
            // recovering the same chain.
            let txn = Txn::new()
                .compare(Compare::Missing(key.clone()))
                .compare(Compare::Missing(takeover_key(&self.config.star_id)))
                .put_leased(key.clone(), self.me().encode(), self.lease)
                .put(
                    chain_key(&self.config.star_id),
                    self.config.star_id.clone().into_bytes(),
                );
            match self.metastore.commit(txn).await.map_err(metastore)? {
                TxnOutcome::Committed { revision } => {
                    // A put under a lease says only that the lease was alive; it does not
                    // renew it. Trust still counts from the last grant or keep-alive.
                    self.registration.store(revision, Ordering::Release);
                    self.chain_registered.store(revision, Ordering::Release);
                    tracing::info!(
                        star = %self.config.star_id,
                        advertise = %self.config.advertise,
                        lease_ttl_secs = self.config.lease_ttl.as_secs(),
                        "joined the fleet"
                    );
                    self.wait_for_adopter().await?;
                    return Ok(());
                }
                TxnOutcome::Conflict => {
                    if self
                        .metastore
                        .get(&takeover_key(&self.config.star_id))
                        .await
                        .map_err(metastore)?
                        .is_some()
                    {
                        // Taking a chain over takes as long as settling it; wait it out.
                        self.keep_alive_now().await;
                        if !logged {
                            tracing::warn!(
                                star = %self.config.star_id,
                                "a survivor is taking over this star's previous chain; waiting \
                                 for it to finish before joining"
                            );
                            logged = true;
                        }
                        self.clock.sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    let holder = self
                        .metastore
                        .get(&key)
                        .await
                        .map_err(metastore)?
                        .and_then(|kv| Member::decode(&self.config.star_id, &kv.value));
                    let holder = holder.map_or_else(|| "?".to_owned(), |m| m.advertise);
                    if self.clock.since(started) >= patience {
                        return Err(JoinError::DuplicateId {
                            star_id: self.config.star_id.clone(),
                            holder,
                        });
                    }
                    // The new lease must outlive the wait for the old one.
                    self.keep_alive_now().await;
                    if !logged {
                        tracing::warn!(
                            star = %self.config.star_id,
                            holder = %holder,
                            "a star with this --star-id is registered; waiting for its lease to \
                             lapse (a previous run killed without leaving?) before joining"
                        );
                        logged = true;
                    }
                    self.clock.sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Renews the lease every quarter of a ttl until it is lost. Nothing else runs in this
    /// loop: publishing the load and refreshing the view wait for the metastore's call slots
    /// behind the absorber and every redirect, and a busy star (the one with the most calls
    /// queued) must not miss its renewals because of them. Lease calls bypass those slots.
    async fn renew(self: Arc<Self>) {
        // Renewals are frequent and short, so that one hung call leaves time for another
        // before the trust window closes.
        let every = self.config.lease_ttl / 4;
        let patience = self.config.lease_ttl / 6;
        loop {
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => return,
                _ = self.clock.sleep(every) => {}
            }
            let sent = self.clock.now();
            match self
                .clock
                .timeout(patience, self.metastore.keep_alive(self.lease))
                .await
                .unwrap_or_else(|_| {
                    Err(MetastoreError::Unavailable(
                        "lease renewal timed out".into(),
                    ))
                }) {
                Ok(Some(_)) => self.renewed_at(sent),
                Ok(None) => {
                    self.lose("expired", "the fleet lease expired at the metastore".into());
                    return;
                }
                Err(err) => tracing::warn!("renewing the fleet lease failed: {err}"),
            }
            // An unrenewed lease is given up by `watch_trust`, whatever this loop waits on.
            self.metrics.lease_age.set(self.unrenewed().as_secs_f64());
        }
    }

    /// Republishes this star's load and refreshes its view of the others, every third of a
    /// ttl, until the lease is lost.
    async fn refresh(self: Arc<Self>) {
        let every = self.config.lease_ttl / 3;
        loop {
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => return,
                _ = self.clock.sleep(every) => {}
            }
            if let Err(err) = self.publish().await {
                tracing::warn!("publishing this star's load failed: {err}");
            }
            if let Err(err) = self.refresh_members().await {
                tracing::warn!("refreshing the fleet view failed: {err}");
            }
        }
    }

    /// Renews the lease once, while joining (before the renewal task runs). A failure is only
    /// logged: the lease then runs from the last renewal, and the registration's put fails if
    /// it lapsed.
    async fn keep_alive_now(&self) {
        let sent = self.clock.now();
        match self.metastore.keep_alive(self.lease).await {
            Ok(Some(_)) => self.renewed_at(sent),
            Ok(None) => tracing::warn!("the fleet lease lapsed while this star waited to join"),
            Err(err) => tracing::warn!("renewing the lease while waiting to join: {err}"),
        }
    }

    /// Renews the lease during a wait of the join, before the renewal task runs, and records
    /// it (or the trust watch would take the wait for a lost lease). A lease already gone ends
    /// the join; a failed call is tried again at the wait's next turn.
    async fn renew_while_waiting(&self, while_doing: &'static str) -> Result<(), JoinError> {
        let sent = self.clock.now();
        match self.metastore.keep_alive(self.lease).await {
            Ok(Some(_)) => self.renewed_at(sent),
            Ok(None) => return Err(JoinError::LeaseExpired { while_doing }),
            Err(err) => tracing::warn!("renewing the lease while it {while_doing}: {err}"),
        }
        Ok(())
    }

    /// A renewal sent at `sent` succeeded: the lease runs at least a ttl from then.
    fn renewed_at(&self, sent: Instant) {
        let mut renewed = self.renewed.lock();
        *renewed = (*renewed).max(sent);
    }

    /// Gives the lease up the moment it can no longer be vouched for, however long a renewal
    /// call hangs: a successor may take the chain over once the lease lapses at the metastore,
    /// and this star must have stopped acknowledging by then.
    async fn watch_trust(self: Arc<Self>) {
        let trust = self.trust();
        let every = self.config.lease_ttl / 20;
        loop {
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => return,
                _ = self.clock.sleep(every) => {}
            }
            let age = self.unrenewed();
            if age > trust {
                self.lose(
                    "unrenewed",
                    format!(
                        "the fleet lease was not renewed for {age:?}, past {trust:?}: it can no \
                         longer be trusted"
                    ),
                );
                return;
            }
        }
    }

    /// How long this star may go without renewing its lease and still lead: a successor may
    /// take its chain over once the lease lapses, so it stops acknowledging well before.
    pub(crate) fn trust(&self) -> Duration {
        self.config.lease_ttl * 3 / 4
    }

    /// Time since the last renewal known to have reached the metastore.
    pub(crate) fn unrenewed(&self) -> Duration {
        self.clock.since(*self.renewed.lock())
    }

    pub(crate) fn lose(&self, cause: &str, reason: String) {
        self.metrics.lease_lost.with_label_values(&[cause]).inc();
        self.lost_reason.lock().get_or_insert(reason);
        self.lost.cancel();
    }

    /// Resolves once this star can no longer lead: its lease lapsed.
    pub async fn lost(&self) -> String {
        self.lost.cancelled().await;
        self.lost_reason
            .lock()
            .clone()
            .unwrap_or_else(|| "the fleet lease was lost".into())
    }

    /// Whether this star has stopped leading for good (its lease is lost, or it left).
    pub fn is_lost(&self) -> bool {
        // Also between two checks of the trust window: a star that wakes from a pause must
        // not act on a lease it can no longer trust.
        self.lost.is_cancelled() || self.unrenewed() > self.trust()
    }

    pub(crate) async fn publish(&self) -> Result<(), MetastoreError> {
        // One at a time: two publishes comparing the same version would see one another as a
        // lost registration.
        let _publishing = self.publishing.lock().await;
        let key = star_key(&self.config.star_id);
        let version = self.registration.load(Ordering::Acquire);
        let txn = Txn::new()
            .compare(Compare::Version(key.clone(), version))
            .put_leased(key.clone(), self.me().encode(), self.lease);
        match self.metastore.commit(txn).await? {
            TxnOutcome::Committed { revision } => {
                self.registration.store(revision, Ordering::Release);
            }
            TxnOutcome::Conflict => match self.metastore.get(&key).await? {
                // An earlier publish landed with its answer lost: carry on from its version.
                Some(kv)
                    if Member::decode(&self.config.star_id, &kv.value).is_some_and(|m| {
                        m.started_ms == self.started_ms && m.advertise == self.config.advertise
                    }) =>
                {
                    self.registration.store(kv.version, Ordering::Release);
                }
                _ => self.lose(
                    "expired",
                    "this star's registration is gone from the fleet".into(),
                ),
            },
        }
        Ok(())
    }

    pub(crate) async fn refresh_members(&self) -> Result<(), MetastoreError> {
        let mut members = BTreeMap::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self
                .metastore
                .scan(STARS.as_bytes(), after.as_deref(), 1000)
                .await?;
            let done = page.len() < 1000;
            for kv in &page {
                let id = id_under(STARS, &kv.key);
                if let Some(member) = Member::decode(&id, &kv.value) {
                    members.insert(id, member);
                }
            }
            after = page.last().map(|kv| kv.key.clone());
            if done {
                break;
            }
        }
        self.metrics.stars.set(members.len() as i64);
        *self.members.write() = members;
        Ok(())
    }

    pub fn set_saturated(&self, saturated: bool) {
        self.saturated.store(saturated, Ordering::Relaxed);
    }

    /// From now on this star takes no new leadership; the fleet hears it at once.
    pub async fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
        if self.lost.is_cancelled() {
            return;
        }
        if let Err(err) = self.publish().await {
            tracing::warn!("publishing that this star drains failed: {err}");
        }
    }

    /// The fleet's metrics, as this star counts them.
    pub fn metrics(&self) -> &FleetMetrics {
        &self.metrics
    }
}
