//! An in-memory object store whose every answer is decided by the seed: latency, 503s, outages,
//! writes that land but lose their answer, and short list pages. It keeps its objects when a
//! star crashes, as a bucket would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use nova_core::clock::{Clock, Instant};
use nova_core::entropy::Entropy;
use nova_core::object_store::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, MAX_LIST_KEYS, ObjectMeta,
    ObjectStore, Op, PutPayload, StoreError,
};

/// How often each fault happens, drawn once per seed.
/// The simulated store takes composed parts from 64 KiB (S3 takes 5 MiB), so the auditor's
/// merges copy the simulation's small objects server-side as they would large ones.
const SIM_MIN_COMPOSE_PART: u64 = 64 * 1024;

#[derive(Debug, Clone)]
pub struct StoreFaults {
    /// Probability that a request fails with a retryable error before it does anything.
    pub transient: f64,
    /// Probability that a write lands and its answer is lost (a timeout after the PUT landed).
    pub lost_answer: f64,
    /// Probability that a write answers with a timeout at once and lands later, up to two
    /// seconds on (or never, if the process dies first).
    pub late: f64,
    /// Probability that a key is stuck when first written: every write of it fails for a
    /// while (a hot partition), while writes of other keys land.
    pub stuck: f64,
    /// Probability that a list page is shorter than asked for (still correct, as S3 allows).
    pub short_page: f64,
    /// Latency of each half of a request (before it applies, after it applies), in ms.
    pub latency_ms: (u64, u64),
    /// Probability that a DELETE answers with a timeout at once and lands later, up to two
    /// seconds on (after a new write of the key, it deletes that).
    pub late_delete: f64,
    /// The store ignores a compose's copy ranges and copies each source whole, as an
    /// S3-compatible server that does not honour `x-amz-copy-source-range` would.
    pub lenient_copy: bool,
}

impl StoreFaults {
    pub fn none() -> Self {
        Self {
            transient: 0.0,
            lost_answer: 0.0,
            late: 0.0,
            stuck: 0.0,
            short_page: 0.0,
            latency_ms: (1, 2),
            late_delete: 0.0,
            lenient_copy: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    objects: Mutex<BTreeMap<String, Bytes>>,
    /// When each object was last written, by the store's clock (the simulation's true time:
    /// a star's skewed clock never reaches it), as S3's Last-Modified.
    modified: Mutex<std::collections::HashMap<String, u64>>,
    faults: Mutex<StoreFaults>,
    entropy: Entropy,
    /// The clock of the incarnation running now; replaced at each restart.
    clock: Mutex<Clock>,
    /// Every request fails as unavailable until then.
    down_until: Mutex<Option<Instant>>,
    /// Keys whose writes fail until then.
    stuck_until: Mutex<std::collections::HashMap<String, Instant>>,
    /// Writes that will land late and have not yet: (key, object or `None` for a DELETE,
    /// exclusive). They outlive the process that made them, as a request the client gave up on
    /// does.
    late_writes: Mutex<Vec<(String, Option<Bytes>, bool)>>,
    /// Chain slot writes in progress now, and the most at once since the last `attach`.
    chain_writes: Mutex<(usize, usize)>,
}

/// Counts a chain write for as long as it runs, however it ends (a crash drops it).
struct ChainWrite<'a>(&'a Inner);

impl<'a> ChainWrite<'a> {
    fn begin(inner: &'a Inner, key: &str) -> Option<Self> {
        key.starts_with("chain/").then(|| {
            let mut writes = inner.chain_writes.lock();
            writes.0 += 1;
            writes.1 = writes.1.max(writes.0);
            ChainWrite(inner)
        })
    }
}

impl Drop for ChainWrite<'_> {
    fn drop(&mut self) {
        self.0.chain_writes.lock().0 -= 1;
    }
}

impl SimStore {
    pub fn new(faults: StoreFaults, entropy: Entropy) -> Self {
        Self {
            inner: Arc::new(Inner {
                objects: Mutex::default(),
                modified: Mutex::default(),
                faults: Mutex::new(faults),
                entropy,
                clock: Mutex::new(Clock::system()),
                down_until: Mutex::default(),
                stuck_until: Mutex::default(),
                chain_writes: Mutex::default(),
                late_writes: Mutex::default(),
            }),
        }
    }

    /// Points the store at a new incarnation's clock (and ends any outage of the last one).
    pub fn attach(&self, clock: Clock) {
        *self.inner.clock.lock() = clock;
        *self.inner.down_until.lock() = None;
        // Instants of the last incarnation mean nothing on the new clock.
        self.inner.stuck_until.lock().clear();
        *self.inner.chain_writes.lock() = (0, 0);
    }

    /// Lands the late write of `key` at a moment the seed picks, up to two seconds on.
    fn land_later(&self, key: String) {
        let store = self.clone();
        let after = Duration::from_millis(1 + self.inner.entropy.below(2000));
        let clock = self.clock();
        tokio::spawn(async move {
            clock.sleep(after).await;
            let mut late = store.inner.late_writes.lock();
            let Some(at) = late.iter().position(|(k, _, _)| *k == key) else {
                return;
            };
            let (key, object, exclusive) = late.swap_remove(at);
            let mut objects = store.inner.objects.lock();
            match object {
                None => {
                    objects.remove(&key);
                }
                Some(object) if !exclusive || !objects.contains_key(&key) => {
                    tracing::debug!(key, "a late write lands");
                    store.stamp(&key);
                    objects.insert(key, object);
                }
                Some(_) => {}
            }
        });
    }

    /// In a new incarnation: the writes the last one left landing late land during this one.
    pub fn resume_late_writes(&self) {
        let keys: Vec<String> = self
            .inner
            .late_writes
            .lock()
            .iter()
            .map(|(k, _, _)| k.clone())
            .collect();
        for key in keys {
            self.land_later(key);
        }
    }

    /// The most chain slot writes that ran at once since the last `attach`.
    pub fn most_chain_writes(&self) -> usize {
        self.inner.chain_writes.lock().1
    }

    /// With the seed's probability, answers a write with a timeout now and lands it later (a
    /// PUT the client gave up on that the store still completes).
    fn lands_late(
        &self,
        op: Op,
        key: &str,
        payload: &PutPayload,
        exclusive: bool,
    ) -> Option<StoreError> {
        if !self.inner.entropy.chance(self.inner.faults.lock().late) {
            return None;
        }
        self.inner
            .late_writes
            .lock()
            .push((key.to_owned(), Some(payload.to_bytes()), exclusive));
        self.land_later(key.to_owned());
        Some(StoreError::Transient {
            op,
            key: key.to_owned(),
            message: "simulated timeout; the write lands later".into(),
        })
    }

    pub fn set_faults(&self, faults: StoreFaults) {
        *self.inner.faults.lock() = faults;
    }

    /// Ends an outage now.
    pub fn end_outage(&self) {
        *self.inner.down_until.lock() = None;
    }

    /// Fails every request for `duration` from now.
    pub fn outage(&self, duration: Duration) {
        let clock = *self.inner.clock.lock();
        *self.inner.down_until.lock() = Some(clock.now() + duration);
    }

    /// A copy of what the store holds, for checks.
    pub fn snapshot(&self) -> BTreeMap<String, Bytes> {
        self.inner.objects.lock().clone()
    }

    /// Takes `key` out of the store, as an operator's mistake or a lifecycle rule would, and
    /// returns it to be put back.
    pub fn take(&self, key: &str) -> Option<Bytes> {
        self.inner.objects.lock().remove(key)
    }

    /// Puts back what `take` took.
    pub fn put_back(&self, key: &str, object: Bytes) {
        self.inner.objects.lock().insert(key.to_owned(), object);
    }

    /// Records that `key` was written now.
    fn stamp(&self, key: &str) {
        let now = self.clock().unix_ms();
        self.inner.modified.lock().insert(key.to_owned(), now);
    }

    fn modified_ms(&self, key: &str) -> Option<u64> {
        self.inner.modified.lock().get(key).copied()
    }

    fn clock(&self) -> Clock {
        *self.inner.clock.lock()
    }

    async fn latency(&self) {
        let (low, high) = self.inner.faults.lock().latency_ms;
        let ms = low + self.inner.entropy.below(high.saturating_sub(low) + 1);
        self.clock().sleep(Duration::from_millis(ms)).await;
    }

    /// The first half of a request: its latency, then an outage or an injected 503.
    async fn arrive(&self, op: Op, key: &str) -> Result<(), StoreError> {
        self.latency().await;
        let down = self
            .inner
            .down_until
            .lock()
            .is_some_and(|until| self.clock().now() < until);
        let (transient, stuck) = {
            let faults = self.inner.faults.lock();
            (faults.transient, faults.stuck)
        };
        let now = self.clock().now();
        let stuck = matches!(op, Op::Put | Op::PutIfAbsent)
            && *self
                .inner
                .stuck_until
                .lock()
                .entry(key.to_owned())
                .or_insert_with(|| {
                    if self.inner.entropy.chance(stuck) {
                        now + Duration::from_millis(100 + self.inner.entropy.below(3000))
                    } else {
                        now
                    }
                })
                > now;
        if down || stuck || self.inner.entropy.chance(transient) {
            return Err(StoreError::Transient {
                op,
                key: key.to_owned(),
                message: if down {
                    "simulated outage".into()
                } else {
                    "simulated 503 Slow Down".into()
                },
            });
        }
        Ok(())
    }

    /// The second half of a write that has landed: latency, then maybe a lost answer.
    async fn answer(&self, op: Op, key: &str) -> Result<(), StoreError> {
        self.latency().await;
        let lost = self.inner.faults.lock().lost_answer;
        if self.inner.entropy.chance(lost) {
            return Err(StoreError::Transient {
                op,
                key: key.to_owned(),
                message: "simulated timeout after the write landed".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl ObjectStore for SimStore {
    fn describe(&self) -> String {
        "simulated object store".into()
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        let _counted = ChainWrite::begin(&self.inner, key);
        self.arrive(Op::PutIfAbsent, key).await?;
        if let Some(timeout) = self.lands_late(Op::PutIfAbsent, key, &payload, true) {
            return Err(timeout);
        }
        let outcome = {
            let mut objects = self.inner.objects.lock();
            if objects.contains_key(key) {
                CreateOutcome::AlreadyExists
            } else {
                objects.insert(key.to_owned(), payload.to_bytes());
                self.stamp(key);
                CreateOutcome::Created
            }
        };
        self.answer(Op::PutIfAbsent, key).await?;
        Ok(outcome)
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        self.arrive(Op::Put, key).await?;
        if let Some(timeout) = self.lands_late(Op::Put, key, &payload, false) {
            return Err(timeout);
        }
        self.inner
            .objects
            .lock()
            .insert(key.to_owned(), payload.to_bytes());
        self.stamp(key);
        self.answer(Op::Put, key).await
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        self.arrive(Op::Get, key).await?;
        let object = self.inner.objects.lock().get(key).cloned();
        self.latency().await;
        let object = object.ok_or_else(|| StoreError::NotFound {
            key: key.to_owned(),
        })?;
        let size = object.len() as u64;
        let bytes = match &range {
            GetRange::All => object,
            GetRange::Bounded(r) if r.start < size && r.start < r.end => {
                object.slice(r.start as usize..r.end.min(size) as usize)
            }
            GetRange::Bounded(_) => {
                return Err(StoreError::InvalidRange {
                    key: key.to_owned(),
                    range,
                });
            }
            GetRange::Suffix(n) => object.slice(size.saturating_sub(*n) as usize..),
        };
        Ok(GetResult {
            bytes,
            object_size: size,
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.arrive(Op::Head, key).await?;
        let size = self.inner.objects.lock().get(key).map(|o| o.len() as u64);
        size.map(|size| ObjectMeta {
            key: key.to_owned(),
            size,
            modified_ms: self.modified_ms(key),
        })
        .ok_or_else(|| StoreError::NotFound {
            key: key.to_owned(),
        })
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        self.arrive(Op::List, prefix).await?;
        let mut max = max_keys.clamp(1, MAX_LIST_KEYS);
        if self
            .inner
            .entropy
            .chance(self.inner.faults.lock().short_page)
        {
            max = 1 + self.inner.entropy.below(max as u64) as usize;
        }
        let objects = self.inner.objects.lock();
        let mut page = ListPage::default();
        let after = start_after.unwrap_or("");
        for (key, object) in
            objects.range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
        {
            if !key.starts_with(prefix) {
                if key.as_str() > prefix {
                    break;
                }
                continue;
            }
            if page.objects.len() == max {
                page.next_start_after = page.objects.last().map(|o| o.key.clone());
                break;
            }
            page.objects.push(ObjectMeta {
                key: key.clone(),
                size: object.len() as u64,
                modified_ms: self.modified_ms(key),
            });
        }
        Ok(page)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.arrive(Op::Delete, key).await?;
        if self
            .inner
            .entropy
            .chance(self.inner.faults.lock().late_delete)
        {
            // Not deleted yet: it goes up to two seconds on, whatever was written since.
            self.inner
                .late_writes
                .lock()
                .push((key.to_owned(), None, false));
            self.land_later(key.to_owned());
            return Err(StoreError::Transient {
                op: Op::Delete,
                key: key.to_owned(),
                message: "simulated timeout; the delete lands later".into(),
            });
        }
        self.inner.objects.lock().remove(key);
        self.answer(Op::Delete, key).await
    }

    fn min_compose_part(&self) -> u64 {
        SIM_MIN_COMPOSE_PART
    }

    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        nova_core::object_store::check_compose_with(key, &parts, SIM_MIN_COMPOSE_PART)?;
        self.arrive(Op::Compose, key).await?;
        let mut object = bytes::BytesMut::new();
        {
            let objects = self.inner.objects.lock();
            for part in &parts {
                match part {
                    ComposePart::Data(payload) => object.extend_from_slice(&payload.to_bytes()),
                    ComposePart::Copy { source, range } => {
                        let source_bytes =
                            objects.get(source).ok_or_else(|| StoreError::NotFound {
                                key: source.clone(),
                            })?;
                        let size = source_bytes.len() as u64;
                        if range.start >= range.end || range.end > size {
                            return Err(StoreError::InvalidRange {
                                key: source.clone(),
                                range: GetRange::Bounded(range.clone()),
                            });
                        }
                        if self.inner.faults.lock().lenient_copy {
                            object.extend_from_slice(source_bytes);
                        } else {
                            object.extend_from_slice(
                                &source_bytes[range.start as usize..range.end as usize],
                            );
                        }
                    }
                }
            }
        }
        self.inner
            .objects
            .lock()
            .insert(key.to_owned(), object.freeze());
        self.stamp(key);
        self.answer(Op::Compose, key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without faults, the simulated store keeps the contract the real backends keep.
    #[tokio::test(start_paused = true)]
    async fn passes_the_object_store_conformance_suite() {
        let store = SimStore::new(StoreFaults::none(), Entropy::seeded(1));
        store.attach(Clock::simulated(std::time::UNIX_EPOCH));
        nova_core::object_store::conformance::run_all(Arc::new(store), "conformance/").await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_still_lands_the_write() {
        let faults = StoreFaults {
            lost_answer: 1.0,
            ..StoreFaults::none()
        };
        let store = SimStore::new(faults, Entropy::seeded(1));
        store.attach(Clock::simulated(std::time::UNIX_EPOCH));
        let put = store
            .put_if_absent("k", Bytes::from_static(b"x").into())
            .await;
        assert!(matches!(put, Err(StoreError::Transient { .. })));
        assert_eq!(store.snapshot().get("k").unwrap().as_ref(), b"x");
        let again = store
            .put_if_absent("k", Bytes::from_static(b"y").into())
            .await;
        assert!(
            matches!(again, Err(StoreError::Transient { .. })),
            "{again:?}"
        );
        assert_eq!(store.snapshot().get("k").unwrap().as_ref(), b"x");
    }
}
