//! An in-memory metastore with etcd's semantics (one revision per transaction, versions per
//! key, compare-and-set) whose commits the seed makes slow, failed, or landed with their answer
//! lost. Like the store, it outlives the stars that crash on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;

use nova_core::clock::Clock;
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
}

impl MetastoreFaults {
    pub fn none() -> Self {
        Self {
            fail: 0.0,
            lost_answer: 0.0,
            read_fail: 0.0,
            latency_ms: (0, 1),
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
}

#[derive(Debug, Default)]
struct Data {
    revision: u64,
    /// Key to (value, version).
    kv: BTreeMap<Vec<u8>, (Vec<u8>, u64)>,
}

impl SimMetastore {
    pub fn new(faults: MetastoreFaults, entropy: Entropy) -> Self {
        Self {
            inner: Arc::new(Inner {
                data: Mutex::default(),
                faults: Mutex::new(faults),
                entropy,
                clock: Mutex::new(Clock::system()),
            }),
        }
    }

    pub fn attach(&self, clock: Clock) {
        *self.inner.clock.lock() = clock;
    }

    /// Loses everything, as a data directory lost with its disk.
    pub fn wipe(&self) {
        *self.inner.data.lock() = Data::default();
    }

    pub fn set_faults(&self, faults: MetastoreFaults) {
        *self.inner.faults.lock() = faults;
    }

    async fn delay(&self, commit: bool) {
        let (low, high) = self.inner.faults.lock().latency_ms;
        let ms = if commit {
            low + self.inner.entropy.below(high.saturating_sub(low) + 1)
        } else {
            low
        };
        let clock = *self.inner.clock.lock();
        clock.sleep(Duration::from_millis(ms)).await;
    }
}

impl SimMetastore {
    fn read_fault(&self) -> Result<(), MetastoreError> {
        let p = self.inner.faults.lock().read_fail;
        if self.inner.entropy.chance(p) {
            return Err(unavailable("read failed"));
        }
        Ok(())
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
            leases: false,
            shared: false,
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
        }
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        self.delay(false).await;
        self.read_fault()?;
        Ok(self
            .inner
            .data
            .lock()
            .kv
            .get(key)
            .map(|(value, version)| KeyValue {
                key: key.to_vec(),
                value: value.clone(),
                version: *version,
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
        let data = self.inner.data.lock();
        Ok(data
            .kv
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| start_after.is_none_or(|after| key.as_slice() > after))
            .take(limit)
            .map(|(key, (value, version))| KeyValue {
                key: key.clone(),
                value: value.clone(),
                version: *version,
            })
            .collect())
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        txn.check(ETCD_DEFAULT_MAX_TXN_OPS, false)?;
        self.delay(true).await;
        let faults = self.inner.faults.lock().clone();
        if self.inner.entropy.chance(faults.fail) {
            return Err(unavailable("commit failed before it applied"));
        }
        let outcome = {
            let mut data = self.inner.data.lock();
            let holds = txn.compares.iter().all(|compare| match compare {
                Compare::Missing(key) => !data.kv.contains_key(key),
                Compare::Version(key, want) => data.kv.get(key).is_some_and(|(_, v)| v == want),
            });
            if holds {
                data.revision += 1;
                let revision = data.revision;
                for mutation in txn.mutations {
                    match mutation {
                        Mutation::Put(key, value) => {
                            data.kv.insert(key, (value, revision));
                        }
                        Mutation::Delete(key) => {
                            data.kv.remove(&key);
                        }
                        Mutation::PutLeased(..) => unreachable!("refused above"),
                    }
                }
                TxnOutcome::Committed { revision }
            } else {
                TxnOutcome::Conflict
            }
        };
        self.delay(true).await;
        if self.inner.entropy.chance(faults.lost_answer) {
            return Err(unavailable("commit applied but its answer was lost"));
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn compare_and_set_and_scans_behave_like_etcd() {
        let m = SimMetastore::new(MetastoreFaults::none(), Entropy::seeded(1));
        m.attach(Clock::simulated(std::time::UNIX_EPOCH));
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
        let m = SimMetastore::new(MetastoreFaults::none(), Entropy::seeded(2));
        m.attach(Clock::simulated(std::time::UNIX_EPOCH));
        nova_core::metastore::conformance::run_all(&m, "conformance/").await;
    }
}
