//! The object cache tier: gateway instances share the work of fetching (and caching) object
//! ranges. Each object key has an owner, chosen by consistent hashing on a ring with 64 virtual
//! nodes per instance, so adding or removing an instance moves only its share.
//!
//! Loads are bounded: a fetch goes to the owner unless the owner's in-flight claims would pass
//! `--object-cache-load-factor` times the mean claims per live instance; then it spills to the
//! next instance on the ring that is under the bound. The claims are this instance's own
//! in-flight fetches per member (each gateway balances what it sends, without coordination).
//! An instance that fails a fetch is taken for dead for a while, and the objects it owns are
//! fetched straight from the object store instead of spilling onto the others.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use moka::future::Cache;
use parking_lot::Mutex;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use nova_proto::route::{Credentials, Settings};

use nova_core::object_store::{GetRange, ObjectStore, StoreError};
use nova_proto::v1;
use nova_proto::v1::gateway_peer_client::GatewayPeerClient;

use crate::admission::{Admission, Doorkeeper};
use crate::metrics::GatewayMetrics;

/// The largest range a peer serves: a section (sections are capped at 1 MiB unless a single
/// record is larger, and records are capped at the star's --max-record-bytes).
pub const MAX_PEER_RANGE: u64 = 128 << 20;

const VIRTUAL_NODES: usize = 64;

/// What the object cache weighs an entry at beyond its bytes and key: moka's entry, its key's
/// header and the `Bytes` handle, rounded up.
const ENTRY_OVERHEAD: usize = 256;

/// FNV-1a: stable across processes and builds, which the ring needs (every instance must place
/// keys the same way).
fn hash(bytes: &[u8]) -> u64 {
    hash_parts(&[bytes])
}

/// [`hash`] of the parts one after the other.
fn hash_parts(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|part| part.iter()) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Mix the result so nearby keys spread over the ring.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The tier's members on a hash ring.
#[derive(Debug, Clone)]
pub struct Ring {
    points: Vec<(u64, usize)>,
    members: usize,
}

impl Ring {
    pub fn new(members: &[String]) -> Self {
        let mut points: Vec<(u64, usize)> = members
            .iter()
            .enumerate()
            .flat_map(|(i, url)| {
                (0..VIRTUAL_NODES).map(move |v| (hash(format!("{url}#{v}").as_bytes()), i))
            })
            .collect();
        points.sort_unstable();
        Self {
            points,
            members: members.len(),
        }
    }

    /// Members in ring order from `key`'s position: the owner first, then the spill order.
    pub fn order(&self, key: &str) -> Vec<usize> {
        let h = hash(key.as_bytes());
        let start = self.points.partition_point(|(p, _)| *p < h);
        let mut order = Vec::with_capacity(self.members);
        for i in 0..self.points.len() {
            let member = self.points[(start + i) % self.points.len()].1;
            if !order.contains(&member) {
                order.push(member);
                if order.len() == self.members {
                    break;
                }
            }
        }
        order
    }
}

/// Where one fetch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the owner, `member`.
    Owner(usize),
    /// Past an owner at its load bound, to `member`.
    Spilled(usize),
    /// Straight to the object store: the owner is down.
    Direct,
}

/// Picks a route from members' claims, given who is alive.
pub fn route(order: &[usize], claims: &[u64], alive: &[bool], factor: f64) -> Route {
    let Some(&owner) = order.first() else {
        return Route::Direct;
    };
    if !alive[owner] {
        return Route::Direct;
    }
    let live = alive.iter().filter(|a| **a).count().max(1) as f64;
    let total: u64 = claims
        .iter()
        .zip(alive)
        .filter(|(_, a)| **a)
        .map(|(c, _)| *c)
        .sum::<u64>()
        + 1;
    let bound = (factor * total as f64 / live).ceil().max(1.0) as u64;
    for &member in order.iter().filter(|m| alive[**m]) {
        if claims[member] < bound {
            return if member == owner {
                Route::Owner(member)
            } else {
                Route::Spilled(member)
            };
        }
    }
    Route::Owner(owner)
}

pub struct Tier {
    members: Vec<String>,
    me: usize,
    ring: Ring,
    clients: Vec<Option<GatewayPeerClient<InterceptedService<Channel, Credentials>>>>,
    claims: Vec<AtomicU64>,
    dead_until: Mutex<Vec<Option<Instant>>>,
    factor: f64,
    cache: Cache<(String, u64, u64), Bytes>,
    /// Remembers first requests, when a range is cached only on its second.
    doorkeeper: Option<Doorkeeper>,
    store: Arc<dyn ObjectStore>,
    metrics: GatewayMetrics,
    peer_timeout: Duration,
    dead_for: Duration,
}

/// A claim on a member, released when the fetch ends.
struct Claim<'a> {
    tier: &'a Tier,
    member: usize,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let now = self.tier.claims[self.member].fetch_sub(1, Ordering::AcqRel) - 1;
        self.tier
            .metrics
            .claims
            .with_label_values(&[&self.tier.members[self.member]])
            .set(now as i64);
    }
}

impl Tier {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        members: Vec<String>,
        me: usize,
        factor: f64,
        cache_bytes: u64,
        admission: Admission,
        store: Arc<dyn ObjectStore>,
        metrics: GatewayMetrics,
        peer_timeout: Duration,
        dead_for: Duration,
        upstream: &Settings,
    ) -> Result<Self, tonic::transport::Error> {
        let mut clients = Vec::with_capacity(members.len());
        for (i, url) in members.iter().enumerate() {
            clients.push(if i == me {
                None
            } else {
                // To peers as to the star: its TLS and its token.
                let channel = upstream
                    .endpoint(url)?
                    .connect_timeout(peer_timeout)
                    .timeout(peer_timeout)
                    .connect_lazy();
                Some(
                    GatewayPeerClient::with_interceptor(channel, upstream.credentials.clone())
                        .max_decoding_message_size(MAX_PEER_RANGE as usize + 4096),
                )
            });
        }
        metrics.object_cache_capacity.set(cache_bytes as i64);
        for member in &members {
            metrics.claims.with_label_values(&[member]).set(0);
            metrics.claims_peak.with_label_values(&[member]).set(0);
            metrics.peer_failures.with_label_values(&[member]);
        }
        Ok(Self {
            ring: Ring::new(&members),
            claims: members.iter().map(|_| AtomicU64::new(0)).collect(),
            dead_until: Mutex::new(vec![None; members.len()]),
            cache: Cache::builder()
                .max_capacity(cache_bytes)
                // An entry's key and bookkeeping count too, so many small ranges are bounded
                // as few large ones are.
                .weigher(|k: &(String, u64, u64), v: &Bytes| {
                    (v.len() + k.0.len() + ENTRY_OVERHEAD).min(u32::MAX as usize) as u32
                })
                .build(),
            doorkeeper: (admission == Admission::Repeat)
                .then(|| Doorkeeper::for_cache(cache_bytes)),
            members,
            me,
            clients,
            factor,
            store,
            metrics,
            peer_timeout,
            dead_for,
        })
    }

    fn alive(&self) -> Vec<bool> {
        let now = Instant::now();
        let mut dead = self.dead_until.lock();
        dead.iter_mut()
            .map(|until| match until {
                Some(at) if *at > now => false,
                Some(_) => {
                    *until = None;
                    true
                }
                None => true,
            })
            .collect()
    }

    fn claim(&self, member: usize) -> Claim<'_> {
        let now = self.claims[member].fetch_add(1, Ordering::AcqRel) + 1;
        let name = &self.members[member];
        self.metrics
            .claims
            .with_label_values(&[name])
            .set(now as i64);
        let peak = self.metrics.claims_peak.with_label_values(&[name]);
        if now as i64 > peak.get() {
            peak.set(now as i64);
        }
        Claim { tier: self, member }
    }

    /// `len` bytes of the object at `key` from `offset`, through the tier; `keep` asks its
    /// owner to cache it even on its first request (see `crate::admission`).
    pub async fn fetch(
        &self,
        key: &str,
        offset: u64,
        len: u64,
        keep: bool,
    ) -> Result<Bytes, StoreError> {
        let order = self.ring.order(key);
        let claims: Vec<u64> = self
            .claims
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .collect();
        let chosen = route(&order, &claims, &self.alive(), self.factor);
        let member = match chosen {
            Route::Owner(m) => {
                self.metrics
                    .fetches
                    .with_label_values(&[if m == self.me { "owner" } else { "peer" }])
                    .inc();
                m
            }
            Route::Spilled(m) => {
                self.metrics.fetches.with_label_values(&["spilled"]).inc();
                m
            }
            Route::Direct => {
                self.metrics.fetches.with_label_values(&["direct"]).inc();
                return self.direct(key, offset, len).await;
            }
        };
        let _claim = self.claim(member);
        match &self.clients[member] {
            None => self.serve_owned(key, offset, len, keep).await,
            Some(client) => {
                let request = v1::FetchRangeRequest {
                    object_key: key.to_owned(),
                    offset,
                    len,
                    keep,
                };
                let answer =
                    tokio::time::timeout(self.peer_timeout, client.clone().fetch_range(request))
                        .await;
                match answer {
                    Ok(Ok(response)) => Ok(response.into_inner().data),
                    Ok(Err(status)) if status.code() == tonic::Code::NotFound => {
                        Err(StoreError::NotFound {
                            key: key.to_owned(),
                        })
                    }
                    // The owner's fetch pool is full: it is alive, just busy.
                    Ok(Err(status)) if status.code() == tonic::Code::ResourceExhausted => {
                        self.metrics.fetches.with_label_values(&["direct"]).inc();
                        self.direct(key, offset, len).await
                    }
                    failed => {
                        let why = match failed {
                            Ok(Err(status)) => status.to_string(),
                            _ => format!("no answer within {:?}", self.peer_timeout),
                        };
                        self.mark_dead(member, &why);
                        self.metrics.fetches.with_label_values(&["direct"]).inc();
                        self.direct(key, offset, len).await
                    }
                }
            }
        }
    }

    fn mark_dead(&self, member: usize, why: &str) {
        let name = &self.members[member];
        self.metrics.peer_failures.with_label_values(&[name]).inc();
        let mut dead = self.dead_until.lock();
        if dead[member].is_none() {
            tracing::warn!(
                peer = %name,
                skip_ms = self.dead_for.as_millis() as u64,
                "gateway peer failed ({why}); fetching its objects from the object store meanwhile"
            );
        }
        dead[member] = Some(Instant::now() + self.dead_for);
    }

    async fn direct(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        // A peer chooses the range: one past the largest offset is no object's.
        let end = offset
            .checked_add(len)
            .ok_or_else(|| StoreError::InvalidRange {
                key: key.to_owned(),
                range: GetRange::Bounded(offset..u64::MAX),
            })?;
        Ok(self
            .store
            .get(key, GetRange::Bounded(offset..end))
            .await?
            .bytes)
    }

    /// A range of an object this instance serves as its owner: from its cache, or fetched from
    /// the object store and cached (concurrent misses share one fetch), unless this is the
    /// range's first request and it is cached only on its second, and the asking reader does
    /// not say to `keep` it (`crate::admission`).
    pub async fn serve_owned(
        &self,
        key: &str,
        offset: u64,
        len: u64,
        keep: bool,
    ) -> Result<Bytes, StoreError> {
        if len == 0 {
            // Nothing to fetch, cache or remember.
            return Ok(Bytes::new());
        }
        let cache_key = (key.to_owned(), offset, len);
        if let Some(doorkeeper) = &self.doorkeeper {
            if let Some(bytes) = self.cache.get(&cache_key).await {
                self.metrics.object_cache_hits.inc();
                return Ok(bytes);
            }
            let fingerprint =
                hash_parts(&[key.as_bytes(), &offset.to_le_bytes(), &len.to_le_bytes()]);
            // A range to keep is cached now, and takes no slot from a first request.
            if !keep && !doorkeeper.asked_before(fingerprint) {
                let bytes = self.direct(key, offset, len).await?;
                self.metrics.object_cache_misses.inc();
                self.metrics.object_cache_first_requests.inc();
                return Ok(bytes);
            }
        }
        let entry = self
            .cache
            .entry(cache_key)
            .or_try_insert_with(self.direct(key, offset, len))
            .await
            // The shared fetch's error, rebuilt for this caller with its kind kept: whether a
            // retry may help is what the requesting gateway's reader is told.
            .map_err(|e: Arc<StoreError>| match e.as_ref() {
                StoreError::NotFound { key } => StoreError::NotFound { key: key.clone() },
                StoreError::Transient { .. } => StoreError::Transient {
                    op: nova_core::object_store::Op::Get,
                    key: key.to_owned(),
                    message: e.to_string(),
                },
                StoreError::Permanent { .. } | StoreError::InvalidRange { .. } => {
                    StoreError::Permanent {
                        op: nova_core::object_store::Op::Get,
                        key: key.to_owned(),
                        message: e.to_string(),
                    }
                }
            })?;
        if entry.is_fresh() {
            self.metrics.object_cache_misses.inc();
        } else {
            self.metrics.object_cache_hits.inc();
        }
        self.metrics
            .object_cache_bytes
            .set(self.cache.weighted_size() as i64);
        Ok(entry.into_value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://gateway-{i}:7500")).collect()
    }

    #[test]
    fn keys_spread_over_members_and_placement_is_stable() {
        let ring = Ring::new(&members(3));
        let mut owned = [0usize; 3];
        for i in 0..3000 {
            owned[ring.order(&format!("chain/star/{i:020}"))[0]] += 1;
        }
        for share in owned {
            assert!((700..1300).contains(&share), "uneven shares {owned:?}");
        }
        // The same ring built again places every key the same way.
        let again = Ring::new(&members(3));
        for i in 0..100 {
            let key = format!("k{i}");
            assert_eq!(ring.order(&key), again.order(&key));
        }
        // Removing a member moves only its keys.
        let smaller = Ring::new(&members(2));
        for i in 0..1000 {
            let key = format!("chain/star/{i:020}");
            let before = ring.order(&key)[0];
            if before < 2 {
                assert_eq!(smaller.order(&key)[0], before, "a key moved needlessly");
            }
        }
    }

    #[test]
    fn a_loaded_owner_spills_within_the_factor() {
        let order = [0, 1, 2];
        let alive = [true; 3];
        assert_eq!(route(&order, &[0, 0, 0], &alive, 1.25), Route::Owner(0));
        // Owner 0 already holds 5 of 5 claims: the bound is ceil(1.25 × 6 / 3) = 3.
        assert_eq!(route(&order, &[5, 0, 0], &alive, 1.25), Route::Spilled(1));
        assert_eq!(route(&order, &[6, 5, 0], &alive, 1.25), Route::Spilled(2));
        // Simulate a hot key: every fetch goes through `route` and stays in flight.
        let mut claims = [0u64; 3];
        for _ in 0..300 {
            match route(&order, &claims, &alive, 1.25) {
                Route::Owner(m) | Route::Spilled(m) => claims[m] += 1,
                Route::Direct => unreachable!(),
            }
            let mean = claims.iter().sum::<u64>() as f64 / 3.0;
            let max = *claims.iter().max().unwrap() as f64;
            assert!(
                max <= (1.25 * mean).ceil() + 1.0,
                "claims {claims:?} past the factor"
            );
        }
    }

    #[test]
    fn a_dead_owners_share_goes_direct() {
        assert_eq!(
            route(&[1, 0, 2], &[0, 0, 0], &[true, false, true], 1.25),
            Route::Direct
        );
        assert_eq!(
            route(&[0, 1, 2], &[9, 0, 0], &[true, false, true], 1.25),
            Route::Spilled(2)
        );
    }
}
