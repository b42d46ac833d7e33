//! The fleet: stars sharing one catalog in etcd. Each star registers under a lease, publishes
//! its load, and keeps a view of the others; each stream has a leader record naming the star
//! that leads it. A request for a stream reaches its leader: any other star answers with a
//! redirect naming it, and a stream without a leader is placed on the least-loaded star that
//! is neither saturated nor draining.
//!
//! Keys, beside the catalog's:
//! ```text
//! fleet/stars/{star id}        leased: advertise address, start time, load (one line each)
//! fleet/leaders/{stream name}  the id of the star leading the stream
//! fleet/chains/{star id}       the star has a chain that may hold acknowledged records
//! fleet/takeover/{star id}     leased by the survivor taking that star's chain over
//! fleet/adopt/{star id}        leased by the star whose auditor looks after a departed chain
//! ```
//!
//! A star whose lease lapses leaves its chain registered and its leader records behind. One
//! survivor, elected by creating the takeover key, settles that chain (see
//! `nova_chain::takeover`), then clears the departed star's leader records, so the streams are
//! placed again, and its chain registration. Requests for those streams wait meanwhile, counted
//! as a `predecessor_settling` stall. A star that leaves cleanly (SIGTERM) lands and absorbs
//! everything first and clears its own records on the way out.
//!
//! A star that left (taken over, or gone cleanly) may never come back, yet its chain can still
//! hold absorbed flights its auditor had not settled, and its settled objects can still need
//! sweeping. One star with an auditor *adopts* it, elected by creating the adopt key: its
//! auditor settles that chain's leftovers into objects of its own and sweeps the departed
//! star's prefix (`nova_auditor::Adoptions`). The adoption ends when the star rejoins, and
//! passes to another star when the adopter's lease lapses.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use parking_lot::{Mutex, RwLock};
use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use nova_chain::Star;
use nova_chain::streams::StreamState;
use nova_core::clock::Clock;
use nova_core::metastore::{Compare, KeyValue, Metastore, MetastoreError, Txn, TxnOutcome};
use nova_core::object_store::ObjectStore;
use nova_proto::RequestError;
use nova_proto::validate::validate_stream_name;

const STARS: &str = "fleet/stars/";
const LEADERS: &str = "fleet/leaders/";
const CHAINS: &str = "fleet/chains/";
const TAKEOVERS: &str = "fleet/takeover/";
const ADOPTIONS: &str = "fleet/adopt/";

/// Departed stars' chains one star adopts at most (each costs its auditor two metastore reads
/// per idle turn once settled); past it the others are left to other stars.
const MAX_ADOPTED: usize = 16;
/// Chains in the catalog looked at for adoption (stars that ever ran with this catalog).
const MAX_CHAINS_SCANNED: usize = 1000;

fn adopt_key(id: &str) -> Vec<u8> {
    format!("{ADOPTIONS}{id}").into_bytes()
}

fn chain_key(id: &str) -> Vec<u8> {
    format!("{CHAINS}{id}").into_bytes()
}

fn takeover_key(id: &str) -> Vec<u8> {
    format!("{TAKEOVERS}{id}").into_bytes()
}

/// Placements remembered for spreading a burst of creates.
const MAX_RECENT_PLACEMENTS: usize = 4096;

/// How long a refused fleet open should wait before trying again.
const CAPACITY_RETRY: Duration = Duration::from_secs(2);

fn star_key(id: &str) -> Vec<u8> {
    format!("{STARS}{id}").into_bytes()
}

fn leader_key(stream: &str) -> Vec<u8> {
    format!("{LEADERS}{stream}").into_bytes()
}

/// What a star publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub advertise: String,
    pub started_ms: u64,
    pub saturated: bool,
    pub draining: bool,
    pub streams_led: u64,
    /// Cannot take another stream up (`--max-streams`).
    pub full: bool,
}

impl Member {
    fn encode(&self) -> Vec<u8> {
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            self.advertise,
            self.started_ms,
            u8::from(self.saturated),
            u8::from(self.draining),
            self.streams_led,
            u8::from(self.full)
        )
        .into_bytes()
    }

    fn decode(id: &str, value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.lines();
        Some(Self {
            id: id.to_owned(),
            advertise: lines.next()?.to_owned(),
            started_ms: lines.next()?.parse().ok()?,
            saturated: lines.next()? == "1",
            draining: lines.next()? == "1",
            streams_led: lines.next()?.parse().ok()?,
            // Added later: a registration without it is not full.
            full: lines.next() == Some("1"),
        })
    }

    /// Whether new leadership may be placed here.
    fn open(&self) -> bool {
        !self.saturated && !self.draining && !self.full
    }
}

/// The star's side of the fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub star_id: String,
    pub advertise: String,
    pub lease_ttl: Duration,
}

/// Registers `collector` and hands it back.
fn registered<C>(registry: &Registry, collector: C) -> anyhow::Result<C>
where
    C: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

/// The fleet's metrics. A single star exports them too (at zero), so dashboards and alerts
/// work unchanged when it joins a fleet.
pub struct FleetMetrics {
    stars: IntGauge,
    streams_led: IntGauge,
    placements: IntCounter,
    redirects: IntCounter,
    capacity_refusals: IntCounter,
    lease_age: Gauge,
    lease_lost: IntCounterVec,
    takeovers: IntCounter,
    handoffs: IntCounterVec,
    takeover_seconds: Histogram,
    leaderless_age: Gauge,
    waits: IntCounter,
}

impl FleetMetrics {
    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let gauge = |name: &str, help: &str| {
            registered(registry, IntGauge::with_opts(Opts::new(name, help))?)
        };
        let seconds =
            |name: &str, help: &str| registered(registry, Gauge::with_opts(Opts::new(name, help))?);
        let counter = |name: &str, help: &str| {
            registered(registry, IntCounter::with_opts(Opts::new(name, help))?)
        };
        let by = |name: &str, help: &str, label: &str| {
            registered(
                registry,
                IntCounterVec::new(Opts::new(name, help), &[label])?,
            )
        };
        let lease_lost = by(
            "nova_fleet_lease_lost_total",
            "Times this star stopped leading because its fleet lease lapsed, by cause",
            "cause",
        )?;
        let handoffs = by(
            "nova_fleet_handoffs_total",
            "Streams this star handed to another star, by why",
            "reason",
        )?;
        let takeover_seconds = registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "nova_fleet_takeover_seconds",
                    "How long this star took to settle a departed star's chain",
                )
                .buckets(vec![0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0]),
            )?,
        )?;
        Ok(Self {
            handoffs,
            takeovers: counter(
                "nova_fleet_takeovers_total",
                "Departed stars' chains this star settled, so their streams could be led again",
            )?,
            takeover_seconds,
            leaderless_age: seconds(
                "nova_fleet_leaderless_age_seconds",
                "How long the oldest departed star's chain seen here has waited to be taken \
                 over: its streams have no leader meanwhile",
            )?,
            waits: counter(
                "nova_fleet_predecessor_waits_total",
                "Requests that waited for a departed leader's chain to be settled",
            )?,
            stars: gauge(
                "nova_fleet_stars",
                "Stars registered in the fleet, as this star sees it",
            )?,
            streams_led: gauge("nova_fleet_streams_led", "Streams this star leads")?,
            placements: counter(
                "nova_fleet_placements_total",
                "Streams without a leader that this star placed on a star",
            )?,
            redirects: counter(
                "nova_fleet_redirects_total",
                "Requests answered with a redirect to the stream's leader",
            )?,
            capacity_refusals: counter(
                "nova_fleet_capacity_refusals_total",
                "Placements refused because every star is saturated or draining",
            )?,
            lease_age: seconds(
                "nova_fleet_lease_age_seconds",
                "Seconds since this star's fleet lease was last renewed",
            )?,
            lease_lost,
        })
    }
}

pub struct Fleet {
    metastore: Arc<dyn Metastore>,
    config: FleetConfig,
    lease: u64,
    clock: Clock,
    started_ms: u64,
    /// The version of this star's registration, for compare-and-set updates.
    registration: AtomicU64,
    /// When the last renewal that succeeded was sent: the lease runs at least a ttl from it.
    renewed: Mutex<Instant>,
    members: RwLock<BTreeMap<String, Member>>,
    led: RwLock<HashSet<String>>,
    /// Serialises publishing this star's registration.
    publishing: tokio::sync::Mutex<()>,
    /// Serialises taking streams up.
    acquiring: tokio::sync::Mutex<()>,
    /// Placements made here in the last lease ttl: (when, star).
    placed: Mutex<Vec<(Instant, String)>>,
    saturated: AtomicBool,
    draining: AtomicBool,
    /// A take-up failed on `--max-streams`: no more leadership here.
    full: AtomicBool,
    lost: CancellationToken,
    lost_reason: Mutex<Option<String>>,
    metrics: FleetMetrics,
    /// Departed stars' chains not yet taken over, with when this star first saw each.
    departed: Mutex<BTreeMap<String, Instant>>,
}

/// What a takeover needs from the star running it.
pub struct TakeoverContext {
    pub star: Arc<Star>,
    pub store: Arc<dyn ObjectStore>,
    pub backoff: nova_chain::Backoff,
    pub max_streams: usize,
    /// This star's auditor's adopted chains; `None` without an auditor (it adopts nothing).
    pub adoptions: Option<nova_auditor::Adoptions>,
}

fn metastore_unavailable(err: MetastoreError) -> RequestError {
    RequestError::Unavailable(format!(
        "the fleet's metastore did not answer ({err}); retry"
    ))
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
    ) -> anyhow::Result<Arc<Self>> {
        let capabilities = metastore.capabilities();
        anyhow::ensure!(
            capabilities.leases && capabilities.shared,
            "a fleet needs a shared metastore with leases (--metastore etcd://…); {} has none",
            metastore.describe()
        );
        let lease = metastore
            .grant_lease(config.lease_ttl)
            .await
            .context("granting the star's fleet lease")?;
        let started_ms = clock.unix_ms();
        let fleet = Arc::new(Self {
            metastore,
            lease,
            clock,
            started_ms,
            registration: AtomicU64::new(0),
            renewed: Mutex::new(clock.now()),
            members: RwLock::default(),
            led: RwLock::default(),
            placed: Mutex::default(),
            acquiring: tokio::sync::Mutex::new(()),
            publishing: tokio::sync::Mutex::new(()),
            saturated: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            full: AtomicBool::new(false),
            lost: CancellationToken::new(),
            lost_reason: Mutex::new(None),
            metrics,
            departed: Mutex::default(),
            config,
        });
        fleet.register().await?;
        fleet.refresh_members().await?;
        tokio::spawn(fleet.clone().keep());
        tokio::spawn(fleet.clone().watch_trust());
        Ok(fleet)
    }

    /// Waits, after joining, until no other star's auditor looks after this star's chain: the
    /// adopter lets go once it sees the registration and its running job ends (or its lease
    /// lapses). Past two ttls the star goes on regardless: two auditors on one chain are safe
    /// (every step is a compare-and-set), only wasteful.
    async fn wait_for_adopter(&self) -> anyhow::Result<()> {
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
            // The renewal task is not running yet: renew here, and record it, or the lease
            // watch would take the wait for a lost lease.
            let sent = self.clock.now();
            match self.metastore.keep_alive(self.lease).await {
                Ok(Some(_)) => *self.renewed.lock() = sent,
                Ok(None) => anyhow::bail!(
                    "this star's fleet lease expired while it waited for its chain's adopter"
                ),
                Err(err) => {
                    tracing::warn!("renewing the lease while waiting for the adopter: {err}")
                }
            }
            self.clock.sleep(Duration::from_millis(250)).await;
        }
        tracing::warn!(
            star = %self.config.star_id,
            "the star that adopted this star's chain has not let go; going on regardless"
        );
        Ok(())
    }

    fn me(&self) -> Member {
        Member {
            id: self.config.star_id.clone(),
            advertise: self.config.advertise.clone(),
            started_ms: self.started_ms,
            saturated: self.saturated.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            streams_led: self.led.read().len() as u64,
            full: self.full.load(Ordering::Relaxed),
        }
    }

    async fn register(&self) -> anyhow::Result<()> {
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
            let sent = self.clock.now();
            match self.metastore.commit(txn).await? {
                TxnOutcome::Committed { revision } => {
                    // A put under a lapsed lease fails: the lease was alive when it was sent.
                    *self.renewed.lock() = sent;
                    self.registration.store(revision, Ordering::Release);
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
                        .await?
                        .is_some()
                    {
                        // Taking a chain over takes as long as settling it; wait it out.
                        self.metastore.keep_alive(self.lease).await?;
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
                        .await?
                        .and_then(|kv| Member::decode(&self.config.star_id, &kv.value));
                    let holder = holder.map_or_else(|| "?".to_owned(), |m| m.advertise);
                    anyhow::ensure!(
                        self.clock.since(started) < patience,
                        "another live star is registered with --star-id {:?} (at {holder}) and \
                         keeps its lease alive: give each star its own --star-id",
                        self.config.star_id
                    );
                    // The new lease must outlive the wait for the old one.
                    self.metastore.keep_alive(self.lease).await?;
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

    /// Renews the lease, republishes the load and refreshes the view, every third of a ttl,
    /// until the lease is lost.
    async fn keep(self: Arc<Self>) {
        // Renewals are frequent and short, so that one hung call leaves time for another
        // before the trust window closes.
        let every = self.config.lease_ttl / 4;
        let patience = self.config.lease_ttl / 6;
        loop {
            tokio::select! {
                _ = self.clock.sleep(every) => {}
                _ = self.lost.cancelled() => return,
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
                Ok(Some(_)) => *self.renewed.lock() = sent,
                Ok(None) => {
                    self.lose("expired", "the fleet lease expired at the metastore".into());
                    return;
                }
                Err(err) => tracing::warn!("renewing the fleet lease failed: {err}"),
            }
            // An unrenewed lease is given up by `watch_trust`, whatever this loop waits on.
            self.metrics.lease_age.set(self.unrenewed().as_secs_f64());
            if let Err(err) = self.publish().await {
                tracing::warn!("publishing this star's load failed: {err}");
            }
            if let Err(err) = self.refresh_members().await {
                tracing::warn!("refreshing the fleet view failed: {err}");
            }
        }
    }

    /// Gives the lease up the moment it can no longer be vouched for, however long a renewal
    /// call hangs: a successor may take the chain over once the lease lapses at the metastore,
    /// and this star must have stopped acknowledging by then.
    async fn watch_trust(self: Arc<Self>) {
        let trust = self.trust();
        let every = self.config.lease_ttl / 20;
        loop {
            tokio::select! {
                _ = self.clock.sleep(every) => {}
                _ = self.lost.cancelled() => return,
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
    fn trust(&self) -> Duration {
        self.config.lease_ttl * 3 / 4
    }

    /// Time since the last renewal known to have reached the metastore.
    fn unrenewed(&self) -> Duration {
        self.clock.since(*self.renewed.lock())
    }

    fn lose(&self, cause: &str, reason: String) {
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

    async fn publish(&self) -> Result<(), MetastoreError> {
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

    async fn refresh_members(&self) -> Result<(), MetastoreError> {
        let mut members = BTreeMap::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = self
                .metastore
                .scan(STARS.as_bytes(), after.as_deref(), 1000)
                .await?;
            let done = page.len() < 1000;
            for kv in &page {
                let id = String::from_utf8_lossy(&kv.key[STARS.len()..]).into_owned();
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

    /// Remembers a placement on `star` for a lease ttl, by when the star has taken the stream
    /// up and published it; until then it counts toward the star's load here, so a burst of
    /// creates spreads instead of piling onto one star.
    fn count_placement(&self, star: &str) {
        let now = self.clock.now();
        let mut placed = self.placed.lock();
        placed.retain(|(at, _)| now.duration_since(*at) < self.config.lease_ttl);
        if placed.len() < MAX_RECENT_PLACEMENTS {
            placed.push((now, star.to_owned()));
        }
    }

    /// The least-loaded star open to new leadership, this one included, from a fresh view.
    async fn pick_fresh(&self) -> Result<Member, RequestError> {
        self.refresh_members()
            .await
            .map_err(metastore_unavailable)?;
        self.pick()
    }

    /// The least-loaded star open to new leadership, this one included.
    fn pick(&self) -> Result<Member, RequestError> {
        self.pick_among(true)
    }

    /// The least-loaded star open to new leadership, this one included or not.
    fn pick_among(&self, me_too: bool) -> Result<Member, RequestError> {
        let mut candidates: Vec<Member> = self
            .members
            .read()
            .values()
            .filter(|m| m.id != self.config.star_id)
            .cloned()
            .collect();
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
                    cap: "fleet capacity",
                    limit: self.members.read().len().max(1) as u64,
                    what: "every star of the fleet is saturated or draining",
                    retry_after: CAPACITY_RETRY,
                }
            })
    }

    /// Whether this star leads `stream` now.
    pub fn leads(&self, stream: &str) -> bool {
        self.led.read().contains(stream)
    }

    /// Refuses a new stream while no star can take its leadership.
    pub fn check_capacity(&self) -> Result<(), RequestError> {
        self.pick().map(|_| ())
    }

    fn redirect(&self, stream: &str, leader: &Member) -> RequestError {
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
            .map_err(metastore_unavailable)?;
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
            .map_err(metastore_unavailable)?;
        match record {
            Some(kv) => self.member(&String::from_utf8_lossy(&kv.value)).await,
            None => Ok(None),
        }
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
        if self.led.read().contains(stream)
            && let Some(state) = star.streams().get(stream)
        {
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
            let record = self
                .metastore
                .get(&key)
                .await
                .map_err(metastore_unavailable)?;
            let target = match record {
                Some(kv) => {
                    let leader = String::from_utf8_lossy(&kv.value).into_owned();
                    if leader == self.config.star_id {
                        return self.acquire(star, stream).await;
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
                        .map_err(|e| RequestError::Unavailable(e.to_string()))?;
                    if !exists {
                        return Err(RequestError::StreamNotFound(stream.to_owned()));
                    }
                    self.pick_fresh().await?
                }
            };
            if self.try_place(stream, &target).await? {
                tracing::info!(stream, star = %target.id, "placed a stream without a leader");
                if target.id == self.config.star_id {
                    return self.acquire(star, stream).await;
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
        if !chain_pending.await.map_err(metastore_unavailable)? {
            let stale = Txn::new()
                .compare(Compare::Version(key.clone(), version))
                .delete(key.clone());
            self.metastore
                .commit(stale)
                .await
                .map_err(metastore_unavailable)?;
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
            let record = self
                .metastore
                .get(&key)
                .await
                .map_err(metastore_unavailable)?;
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

    /// Looks for departed stars' chains (registered, with no live star) and takes one over when
    /// elected. Runs every third of a lease ttl until the lease is lost.
    pub fn start_takeovers(self: &Arc<Self>, ctx: TakeoverContext) {
        let fleet = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = fleet.clock.sleep(fleet.config.lease_ttl / 3) => {}
                    _ = fleet.lost.cancelled() => return,
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
        let mut departed: Vec<String> = Vec::new();
        for kv in chains {
            let id = String::from_utf8_lossy(&kv.key[CHAINS.len()..]).into_owned();
            if id != self.config.star_id && !live.contains(&id) {
                departed.push(id);
            }
        }
        {
            let mut seen = self.departed.lock();
            seen.retain(|id, _| departed.contains(id));
            for id in &departed {
                seen.entry(id.clone()).or_insert(now);
            }
            let oldest = seen.values().map(|at| now.duration_since(*at)).max();
            self.metrics
                .leaderless_age
                .set(oldest.map_or(0.0, |age| age.as_secs_f64()));
        }
        for id in departed {
            if self.lost.is_cancelled() {
                return Ok(());
            }
            // Elected by creating the takeover key, only while the star is still gone.
            let elect = Txn::new()
                .compare(Compare::Missing(star_key(&id)))
                .compare(Compare::Missing(takeover_key(&id)))
                .put_leased(
                    takeover_key(&id),
                    self.config.star_id.clone().into_bytes(),
                    self.lease,
                );
            let TxnOutcome::Committed { revision } = self.metastore.commit(elect).await? else {
                continue;
            };
            // Every step that changes what others see holds only while this star still holds
            // the election (its lease could lapse mid-way, and the departed star rejoin).
            let guard = Compare::Version(takeover_key(&id), revision);
            let outcome = tokio::select! {
                outcome = self.take_over(ctx, &id, guard.clone()) => outcome,
                _ = self.lost.cancelled() => Err(anyhow::anyhow!("this star's lease was lost")),
            };
            // Left behind, the key would keep the departed star from rejoining for as long as
            // this star lives: retry until it goes (or the lease, and the key with it, does).
            let release = Txn::new().compare(guard).delete(takeover_key(&id));
            let mut attempt = 0u32;
            while let Err(err) = self.metastore.commit(release.clone()).await {
                attempt += 1;
                tracing::warn!(star = %id, attempt, "releasing the takeover failed; retrying: {err}");
                tokio::select! {
                    _ = self.clock.sleep(Duration::from_millis(500)) => {}
                    _ = self.lost.cancelled() => break,
                }
            }
            if let Err(err) = outcome {
                tracing::error!(star = %id, "taking over the chain of a departed star failed; it is tried again: {err}");
            }
        }
        Ok(())
    }

    /// Elects this star to adopt departed stars' chains (in the catalog, with no live star and
    /// nothing left to take over), up to `MAX_ADOPTED`, releases the adoptions of stars that
    /// rejoined, and hands the auditor the result.
    async fn adopt_departed(
        &self,
        star: &Star,
        adoptions: &nova_auditor::Adoptions,
        registered: &[KeyValue],
    ) -> anyhow::Result<()> {
        let chains = star
            .streams()
            .catalog()
            .chain_stars(MAX_CHAINS_SCANNED)
            .await?;
        let pending: HashSet<&[u8]> = registered.iter().map(|kv| kv.key.as_slice()).collect();
        let held: BTreeMap<Vec<u8>, KeyValue> = self
            .metastore
            .scan(ADOPTIONS.as_bytes(), None, MAX_CHAINS_SCANNED)
            .await?
            .into_iter()
            .map(|kv| (kv.key.clone(), kv))
            .collect();
        let me = self.config.star_id.as_bytes();
        let live: HashSet<String> = self.members.read().keys().cloned().collect();
        let departed = |id: &str| {
            id != self.config.star_id
                && !live.contains(id)
                && !pending.contains(chain_key(id).as_slice())
        };
        // Adoptions held already come first, so a new election never pushes one out.
        let mut mine = Vec::new();
        let mut released = Vec::new();
        for id in &chains {
            if let Some(kv) = held.get(&adopt_key(id))
                && kv.value == me
            {
                if departed(id) && mine.len() < MAX_ADOPTED {
                    mine.push(id.clone());
                } else {
                    // It rejoined (its registration recorded its chain), has a chain to take
                    // over first, or is past this star's share: let it go.
                    released.push((id.clone(), kv.version));
                }
            }
        }
        for id in chains {
            if self.lost.is_cancelled() || mine.len() >= MAX_ADOPTED {
                break;
            }
            let key = adopt_key(&id);
            if held.contains_key(&key) || !departed(&id) {
                continue;
            }
            let elect = Txn::new()
                .compare(Compare::Missing(star_key(&id)))
                .compare(Compare::Missing(chain_key(&id)))
                .compare(Compare::Missing(key.clone()))
                .put_leased(key, me.to_vec(), self.lease);
            if let TxnOutcome::Committed { .. } = self.metastore.commit(elect).await? {
                tracing::info!(star = %id, "adopted the chain of a departed star");
                mine.push(id);
            }
        }
        // The auditor stops starting jobs on released stars first; the key goes once the jobs
        // already running on them are done, so a rejoining star (which waits for the key) never
        // has its chain settled by two auditors at once.
        // Dropping a star from the set cuts its running job off (jobs are safe to cut anywhere),
        // so the wait is short.
        adoptions.set(mine);
        for (id, version) in released {
            adoptions
                .wait_idle(&id, &self.clock, Duration::from_millis(50))
                .await;
            let release = Txn::new()
                .compare(Compare::Version(adopt_key(&id), version))
                .delete(adopt_key(&id));
            self.metastore.commit(release).await?;
            tracing::info!(star = %id, "released the adopted chain of a star");
        }
        Ok(())
    }

    async fn take_over(
        &self,
        ctx: &TakeoverContext,
        departed: &str,
        guard: Compare,
    ) -> anyhow::Result<()> {
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
        )
        .await?;
        // Its streams may be placed again: clear the records naming it.
        let released = self.release_records_of(departed, guard.clone()).await?;
        let cleared = Txn::new().compare(guard).delete(chain_key(departed));
        anyhow::ensure!(
            self.metastore.commit(cleared).await? != TxnOutcome::Conflict,
            "lost the election for {departed:?} before clearing its chain"
        );
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
    async fn rewrite_records_of(
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
    pub async fn hand_off(&self, star: &Star, stream: &str, reason: &str) -> anyhow::Result<()> {
        let target = self
            .pick_among(false)
            .map_err(|_| anyhow::anyhow!("no other star is open to leadership"))?;
        let key = leader_key(stream);
        let Some(record) = self
            .metastore
            .get(&key)
            .await?
            .filter(|kv| kv.value == self.config.star_id.as_bytes())
        else {
            // Led elsewhere now: stop treating it as ours.
            if let Some(state) = star.streams().get(stream) {
                state.set_released(true);
            }
            self.stop_leading(stream);
            anyhow::bail!("this star no longer leads {stream:?}");
        };
        let state = star
            .streams()
            .get(stream)
            .ok_or_else(|| anyhow::anyhow!("stream {stream:?} is not here"))?;
        star.release(&state, self.config.lease_ttl)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        let moved = Txn::new()
            .compare(Compare::Version(key.clone(), record.version))
            .put(key, target.id.clone().into_bytes());
        let outcome = self.metastore.commit(moved).await;
        if !matches!(outcome, Ok(TxnOutcome::Committed { .. })) {
            // The move may have landed with its answer lost: take appends again only once the
            // record is read back unchanged; anything else means the stream is led elsewhere.
            let still_ours = loop {
                match self.metastore.get(&leader_key(stream)).await {
                    Ok(found) => {
                        break found.is_some_and(|kv| kv.version == record.version);
                    }
                    Err(err) => {
                        tracing::warn!(
                            stream,
                            "re-reading a leader record after a failed move: {err}"
                        );
                        tokio::select! {
                            _ = self.clock.sleep(Duration::from_millis(200)) => {}
                            _ = self.lost.cancelled() => break false,
                        }
                    }
                }
            };
            if still_ours {
                state.set_released(false);
                anyhow::bail!("moving the leader record failed: {outcome:?}");
            }
            self.stop_leading(stream);
            anyhow::bail!("the leader record of {stream:?} moved while this star handed it off");
        }
        self.stop_leading(stream);
        self.metrics.handoffs.with_label_values(&[reason]).inc();
        self.count_placement(&target.id);
        tracing::info!(stream, to = %target.id, reason, "handed the stream off");
        Ok(())
    }

    /// While this star is saturated, hands one stream off every third of a lease ttl, until
    /// it clears or leads nothing.
    pub fn start_balancing(self: &Arc<Self>, star: Arc<Star>) {
        let fleet = self.clone();
        tokio::spawn(async move {
            // Streams are tried in turn, so one that cannot move now does not hold up the rest.
            let mut turn = 0usize;
            loop {
                tokio::select! {
                    _ = fleet.clock.sleep(fleet.config.lease_ttl / 3) => {}
                    _ = fleet.lost.cancelled() => return,
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

    /// Leaves the fleet after a clean shutdown (everything admitted landed and was absorbed):
    /// this star's streams are released to be placed on the others and its chain needs no
    /// takeover. After an unclean one the chain stays registered, for a survivor to settle.
    pub async fn leave(&self, drained: bool) {
        // The lease is kept alive while the records move (a survivor would otherwise take the
        // drained chain over); it is given up right after.
        if drained && !self.lost.is_cancelled() {
            let cleared = async {
                let released = self.hand_off_records_of(&self.config.star_id).await?;
                self.metastore
                    .commit(Txn::new().delete(chain_key(&self.config.star_id)))
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

    async fn acquire(&self, star: &Star, stream: &str) -> Result<Arc<StreamState>, RequestError> {
        // One at a time: two requests taking the same stream up at once must not both reset
        // its position (the second would rewind what the first already admitted).
        let _acquiring = self.acquiring.lock().await;
        if self.led.read().contains(stream)
            && let Some(state) = star.streams().get(stream)
        {
            return Ok(state);
        }
        let state = match star.streams().acquire(stream).await {
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
                return Err(RequestError::Unavailable(format!(
                    "taking up stream {stream:?}: {err}"
                )));
            }
        };
        let mut led = self.led.write();
        if led.insert(stream.to_owned()) {
            tracing::info!(stream, "leading the stream");
        }
        self.metrics.streams_led.set(led.len() as i64);
        Ok(state)
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

    /// This star no longer leads `stream`.
    fn stop_leading(&self, stream: &str) {
        let mut led = self.led.write();
        led.remove(stream);
        self.metrics.streams_led.set(led.len() as i64);
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
            .map_err(metastore_unavailable)?;
        if outcome == TxnOutcome::Conflict {
            return Ok(false);
        }
        self.metrics.placements.inc();
        self.count_placement(&target.id);
        Ok(true)
    }

    /// Forgets a deleted stream's leadership.
    pub async fn forget(&self, stream: &str) -> Result<(), RequestError> {
        // A delete frees a place: take streams again until a take-up finds the cap again.
        self.full.store(false, Ordering::Relaxed);
        self.stop_leading(stream);
        self.delete_own_record(stream)
            .await
            .map_err(metastore_unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_reads_back_as_written() {
        let member = Member {
            id: "a".into(),
            advertise: "http://127.0.0.1:7400".into(),
            started_ms: 17,
            saturated: true,
            draining: false,
            streams_led: 3,
            full: true,
        };
        assert_eq!(Member::decode("a", &member.encode()), Some(member));
        assert_eq!(Member::decode("a", b"garbage"), None);
        // A registration written before `full` existed reads as not full.
        let older = Member::decode("a", b"http://x:1\n17\n0\n0\n3").unwrap();
        assert!(!older.full && older.open());
    }
}
