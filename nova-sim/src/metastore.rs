//! An in-memory metastore with etcd's semantics (one revision per transaction, versions per
//! key, compare-and-set, leases that expire on the simulated clock) and etcd's hard parts, as
//! the seed decides: commits that are slow, that fail before they apply, that apply and lose
//! their answer, or that fail to their caller and apply later (so a read in between does not
//! show them); keep-alives lost or late; a member that stalls every call for a while. Like the
//! store, it outlives the stars that crash on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use nova_core::clock::{Clock, Instant};
use nova_core::entropy::Entropy;
use nova_core::metastore::{
    Capabilities, Compare, ETCD_DEFAULT_MAX_TXN_OPS, KeyValue, MAX_SCAN, Metastore, MetastoreError,
    Mutation, Txn, TxnOutcome,
};

#[derive(Debug, Clone)]
pub struct MetastoreFaults {
    /// Probability that a commit fails before it applies.
    pub fail: f64,
    /// Probability that a commit applies and its answer is lost.
    pub lost_answer: f64,
    /// Probability that a read (get or scan) fails.
    pub read_fail: f64,
    /// Commit latency range in ms; reads take the low end.
    pub latency_ms: (u64, u64),
    /// Probability that a commit answers with a timeout at once and applies later, up to
    /// `late_ms` on: a transaction still queued at etcd when its client gave up.
    pub late: f64,
    pub late_ms: u64,
    /// Probability that a keep-alive renews the lease and its answer is lost.
    pub keep_alive_lost: f64,
    /// Probability that a keep-alive never reaches the lease (it fails, nothing renewed).
    pub keep_alive_dropped: f64,
    /// Extra delay on each keep-alive's answer, up to this many ms (a slow member).
    pub keep_alive_slow_ms: u64,
}

impl MetastoreFaults {
    pub fn none() -> Self {
        Self {
            fail: 0.0,
            lost_answer: 0.0,
            read_fail: 0.0,
            latency_ms: (0, 1),
            late: 0.0,
            late_ms: 0,
            keep_alive_lost: 0.0,
            keep_alive_dropped: 0.0,
            keep_alive_slow_ms: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimMetastore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    data: Mutex<Data>,
    faults: Mutex<MetastoreFaults>,
    entropy: Entropy,
    clock: Mutex<Clock>,
    /// Shared by several stars (a fleet's etcd), or one star's own (its embedded store).
    shared: bool,
    /// Every call waits until then: a member that stalls.
    stalled_until: Mutex<Option<Instant>>,
}

#[derive(Debug, Default)]
struct Data {
    revision: u64,
    kv: BTreeMap<Vec<u8>, Entry>,
    leases: BTreeMap<u64, Lease>,
    next_lease: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    version: u64,
    lease: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    ttl: Duration,
    expires: Instant,
}

impl Data {
    /// Ends every lease past its deadline, deleting its keys (one revision, as etcd does).
    fn expire(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.end_lease(id);
        }
    }

    fn end_lease(&mut self, id: u64) -> bool {
        if self.leases.remove(&id).is_none() {
            return false;
        }
        let before = self.kv.len();
        self.kv.retain(|_, entry| entry.lease != Some(id));
        if self.kv.len() != before {
            self.revision += 1;
        }
        true
    }

    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::Missing(key) => !self.kv.contains_key(key),
            Compare::Version(key, want) => self.kv.get(key).is_some_and(|e| e.version == *want),
        }
    }

    /// Applies `txn` as etcd would: a put under a lease that is gone fails the whole
    /// transaction.
    fn apply(&mut self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        for mutation in &txn.mutations {
            if let Mutation::PutLeased(_, _, lease) = mutation
                && !self.leases.contains_key(lease)
            {
                return Err(MetastoreError::Internal(format!(
                    "simulated: requested lease {lease} not found"
                )));
            }
        }
        if !txn.compares.iter().all(|c| self.holds(c)) {
            return Ok(TxnOutcome::Conflict);
        }
        self.revision += 1;
        let revision = self.revision;
        for mutation in txn.mutations {
            match mutation {
                Mutation::Put(key, value) => {
                    self.kv.insert(
                        key,
                        Entry {
                            value,
                            version: revision,
                            lease: None,
                        },
                    );
                }
                Mutation::PutLeased(key, value, lease) => {
                    self.kv.insert(
                        key,
                        Entry {
                            value,
                            version: revision,
                            lease: Some(lease),
                        },
                    );
                }
                Mutation::Delete(key) => {
                    self.kv.remove(&key);
                }
            }
        }
        Ok(TxnOutcome::Committed { revision })
    }
}

impl SimMetastore {
    /// One star's metastore (the single-star simulation): it has leases, and says it is not
    /// shared, so the star runs without a fleet.
    pub fn new(faults: MetastoreFaults, entropy: Entropy) -> Self {
        Self::build(faults, entropy, false)
    }

    /// A fleet's shared metastore, as etcd is.
    pub fn shared(faults: MetastoreFaults, entropy: Entropy) -> Self {
        Self::build(faults, entropy, true)
    }

    fn build(faults: MetastoreFaults, entropy: Entropy, shared: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                data: Mutex::default(),
                faults: Mutex::new(faults),
                entropy,
                clock: Mutex::new(Clock::system()),
                shared,
                stalled_until: Mutex::default(),
            }),
        }
    }

    /// Points the metastore at a new runtime's clock. Leases are deadlines on the old one:
    /// they end, with their keys, as they would over a restart of the whole world.
    pub fn attach(&self, clock: Clock) {
        *self.inner.clock.lock() = clock;
        *self.inner.stalled_until.lock() = None;
        let mut data = self.inner.data.lock();
        let leases: Vec<u64> = data.leases.keys().copied().collect();
        for id in leases {
            data.end_lease(id);
        }
    }

    /// Loses everything, as a data directory lost with its disk.
    pub fn wipe(&self) {
        *self.inner.data.lock() = Data::default();
    }

    pub fn faults(&self) -> MetastoreFaults {
        self.inner.faults.lock().clone()
    }

    pub fn set_faults(&self, faults: MetastoreFaults) {
        *self.inner.faults.lock() = faults;
    }

    /// Every call, from every client, waits from now until `duration` has passed: a member
    /// that stalls (paused, or its disk stuck), then answers what queued up.
    pub fn stall(&self, duration: Duration) {
        let until = self.clock().now() + duration;
        let mut stalled = self.inner.stalled_until.lock();
        *stalled = Some(stalled.map_or(until, |was| was.max(until)));
    }

    /// A copy of every key, value and version, for checks.
    pub fn snapshot(&self) -> BTreeMap<Vec<u8>, (Vec<u8>, u64)> {
        let mut data = self.inner.data.lock();
        data.expire(self.clock().now());
        data.kv
            .iter()
            .map(|(k, e)| (k.clone(), (e.value.clone(), e.version)))
            .collect()
    }

    fn clock(&self) -> Clock {
        *self.inner.clock.lock()
    }

    /// True with probability `p`, drawing only when `p` is not zero, so that faults the
    /// single-star seeds never had leave their draws as they were.
    fn maybe(&self, p: f64) -> bool {
        p > 0.0 && self.inner.entropy.chance(p)
    }

    async fn delay(&self, commit: bool) {
        let stalled = *self.inner.stalled_until.lock();
        if let Some(until) = stalled {
            self.clock().sleep_until(until).await;
        }
        let (low, high) = self.inner.faults.lock().latency_ms;
        let ms = if commit {
            low + self.inner.entropy.below(high.saturating_sub(low) + 1)
        } else {
            low
        };
        self.clock().sleep(Duration::from_millis(ms)).await;
    }

    fn read_fault(&self) -> Result<(), MetastoreError> {
        let p = self.inner.faults.lock().read_fail;
        if self.inner.entropy.chance(p) {
            return Err(unavailable("read failed"));
        }
        Ok(())
    }

    /// The data, with leases past their deadline ended.
    fn data(&self) -> parking_lot::MutexGuard<'_, Data> {
        let mut data = self.inner.data.lock();
        data.expire(self.clock().now());
        data
    }

    /// Applies `txn` at a moment the seed picks, up to `late_ms` from now.
    fn apply_later(&self, txn: Txn, late_ms: u64) {
        let store = self.clone();
        let after = Duration::from_millis(1 + self.inner.entropy.below(late_ms.max(1)));
        let clock = self.clock();
        tokio::spawn(async move {
            clock.sleep(after).await;
            let outcome = store.data().apply(txn);
            tracing::debug!(?outcome, "a commit its caller gave up on applied late");
        });
    }
}

fn unavailable(what: &str) -> MetastoreError {
    MetastoreError::Unavailable(format!("simulated: {what}"))
}

#[async_trait]
impl Metastore for SimMetastore {
    fn describe(&self) -> String {
        "simulated metastore".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            leases: true,
            shared: self.inner.shared,
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
        }
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        self.delay(false).await;
        self.read_fault()?;
        Ok(self.data().kv.get(key).map(|entry| KeyValue {
            key: key.to_vec(),
            value: entry.value.clone(),
            version: entry.version,
        }))
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        self.delay(false).await;
        self.read_fault()?;
        let limit = limit.clamp(1, MAX_SCAN);
        let data = self.data();
        Ok(data
            .kv
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| start_after.is_none_or(|after| key.as_slice() > after))
            .take(limit)
            .map(|(key, entry)| KeyValue {
                key: key.clone(),
                value: entry.value.clone(),
                version: entry.version,
            })
            .collect())
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        txn.check(ETCD_DEFAULT_MAX_TXN_OPS, true)?;
        self.delay(true).await;
        let faults = self.inner.faults.lock().clone();
        if self.inner.entropy.chance(faults.fail) {
            return Err(unavailable("commit failed before it applied"));
        }
        if self.maybe(faults.late) {
            self.apply_later(txn, faults.late_ms);
            return Err(unavailable("commit timed out; it may still apply"));
        }
        let outcome = self.data().apply(txn)?;
        self.delay(true).await;
        if self.inner.entropy.chance(faults.lost_answer) {
            return Err(unavailable("commit applied but its answer was lost"));
        }
        Ok(outcome)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<u64, MetastoreError> {
        self.delay(true).await;
        let fail = self.inner.faults.lock().fail;
        if self.maybe(fail) {
            return Err(unavailable("lease grant failed"));
        }
        let now = self.clock().now();
        let mut data = self.data();
        data.next_lease += 1;
        let id = data.next_lease;
        data.leases.insert(
            id,
            Lease {
                ttl,
                expires: now + ttl,
            },
        );
        Ok(id)
    }

    async fn keep_alive(&self, lease: u64) -> Result<Option<Duration>, MetastoreError> {
        self.delay(false).await;
        let faults = self.inner.faults.lock().clone();
        if self.maybe(faults.keep_alive_dropped) {
            return Err(unavailable("keep-alive lost on its way"));
        }
        let now = self.clock().now();
        let renewed = {
            let mut data = self.data();
            data.leases.get_mut(&lease).map(|held| {
                held.expires = now + held.ttl;
                held.ttl
            })
        };
        if faults.keep_alive_slow_ms > 0 {
            let ms = self.inner.entropy.below(faults.keep_alive_slow_ms + 1);
            self.clock().sleep(Duration::from_millis(ms)).await;
        }
        if self.maybe(faults.keep_alive_lost) {
            return Err(unavailable(
                "keep-alive renewed the lease; its answer was lost",
            ));
        }
        Ok(renewed)
    }

    async fn revoke_lease(&self, lease: u64) -> Result<(), MetastoreError> {
        self.delay(true).await;
        self.data().end_lease(lease);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(faults: MetastoreFaults) -> SimMetastore {
        let m = SimMetastore::shared(faults, Entropy::seeded(1));
        m.attach(Clock::simulated(std::time::UNIX_EPOCH));
        m
    }

    #[tokio::test(start_paused = true)]
    async fn compare_and_set_and_scans_behave_like_etcd() {
        let m = store(MetastoreFaults::none());
        let put = |k: &str, v: &str| Txn::new().put(k.as_bytes().to_vec(), v.as_bytes().to_vec());
        let first = m.commit(put("a/1", "x").compare(Compare::Missing(b"a/1".to_vec())));
        assert_eq!(first.await.unwrap(), TxnOutcome::Committed { revision: 1 });
        let again = m.commit(put("a/1", "y").compare(Compare::Missing(b"a/1".to_vec())));
        assert_eq!(again.await.unwrap(), TxnOutcome::Conflict);
        let cas = m.commit(put("a/1", "y").compare(Compare::Version(b"a/1".to_vec(), 1)));
        assert_eq!(cas.await.unwrap(), TxnOutcome::Committed { revision: 2 });
        m.commit(put("a/2", "z").put(b"b".to_vec(), b"w".to_vec()))
            .await
            .unwrap();
        let scan = m.scan(b"a/", Some(b"a/1"), 10).await.unwrap();
        assert_eq!(scan.len(), 1);
        assert_eq!((scan[0].key.as_slice(), scan[0].version), (&b"a/2"[..], 3));
        assert_eq!(m.get(b"a/1").await.unwrap().unwrap().value, b"y");
    }

    #[tokio::test(start_paused = true)]
    async fn passes_the_metastore_conformance_suite() {
        nova_core::metastore::conformance::run_all(&store(MetastoreFaults::none()), "conformance/")
            .await;
    }

    /// A commit answered with a timeout can apply after the caller read the key again and saw
    /// nothing: the read that cannot tell, which only a later compare resolves.
    #[tokio::test(start_paused = true)]
    async fn a_late_commit_applies_after_the_callers_next_read() {
        let m = store(MetastoreFaults {
            late: 1.0,
            late_ms: 1000,
            ..MetastoreFaults::none()
        });
        let key = b"k".to_vec();
        let txn = Txn::new()
            .compare(Compare::Missing(key.clone()))
            .put(key.clone(), b"late".to_vec());
        assert!(matches!(
            m.commit(txn).await,
            Err(MetastoreError::Unavailable(_))
        ));
        assert_eq!(m.get(&key).await.unwrap(), None, "not applied yet");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(m.get(&key).await.unwrap().unwrap().value, b"late");
    }

    #[tokio::test(start_paused = true)]
    async fn leases_expire_on_the_simulated_clock_and_a_dead_lease_fails_its_put() {
        let m = store(MetastoreFaults::none());
        let lease = m.grant_lease(Duration::from_secs(3)).await.unwrap();
        m.commit(Txn::new().put_leased(b"l".to_vec(), b"1".to_vec(), lease))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            m.keep_alive(lease).await.unwrap(),
            Some(Duration::from_secs(3))
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(m.get(b"l").await.unwrap().is_some(), "renewed, still alive");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(m.get(b"l").await.unwrap(), None, "lapsed with its key");
        assert_eq!(m.keep_alive(lease).await.unwrap(), None);
        assert!(
            m.commit(Txn::new().put_leased(b"l".to_vec(), b"2".to_vec(), lease))
                .await
                .is_err(),
            "a put under a lapsed lease fails, as etcd's does"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_member_answers_once_the_stall_ends() {
        let m = store(MetastoreFaults::none());
        let clock = Clock::simulated(std::time::UNIX_EPOCH);
        let started = clock.now();
        m.stall(Duration::from_secs(4));
        m.get(b"x").await.unwrap();
        assert!(clock.since(started) >= Duration::from_secs(4));
    }
}
