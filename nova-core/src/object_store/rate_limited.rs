//! A layer that holds every request to a rate budget (requests per second) before passing it
//! on, and counts what it issued and how long requests waited. It stacks on any store, so the
//! auditor's share of the object store is bounded whatever the backend.

use std::sync::Arc;

use async_trait::async_trait;
use prometheus::{Counter, IntCounterVec};

use super::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, ObjectMeta, ObjectStore, Op,
    PutPayload, StoreError,
};
use crate::rate::RateBudget;

/// Where a rate-limited store reports.
#[derive(Debug, Clone)]
pub struct RateLimitedMetrics {
    /// Requests issued, by operation (`op`).
    pub issued: IntCounterVec,
    /// Seconds requests spent waiting for the budget.
    pub waited_seconds: Counter,
}

#[derive(Debug, Clone)]
pub struct RateLimited {
    inner: Arc<dyn ObjectStore>,
    budget: RateBudget,
    metrics: RateLimitedMetrics,
}

impl RateLimited {
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        budget: RateBudget,
        metrics: RateLimitedMetrics,
    ) -> Self {
        Self {
            inner,
            budget,
            metrics,
        }
    }

    async fn admit(&self, op: Op) {
        self.admit_n(op, 1).await;
    }

    /// Takes the requests' tokens one at a time, as each becomes free: asking for several at
    /// once would starve behind single requests that take every token as it arrives.
    async fn admit_n(&self, op: Op, requests: u64) {
        let mut waited = std::time::Duration::ZERO;
        for _ in 0..requests {
            waited += self.budget.take(1).await;
        }
        self.metrics.waited_seconds.inc_by(waited.as_secs_f64());
        self.metrics
            .issued
            .with_label_values(&[op.as_str()])
            .inc_by(requests);
    }
}

#[async_trait]
impl ObjectStore for RateLimited {
    fn describe(&self) -> String {
        format!(
            "{} (at most {} requests/s)",
            self.inner.describe(),
            self.budget.per_second()
        )
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        self.admit(Op::PutIfAbsent).await;
        self.inner.put_if_absent(key, payload).await
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        self.admit(Op::Put).await;
        self.inner.put(key, payload).await
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        self.admit(Op::Get).await;
        self.inner.get(key, range).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.admit(Op::Head).await;
        self.inner.head(key).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        self.admit(Op::List).await;
        self.inner.list(prefix, start_after, max_keys).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.admit(Op::Delete).await;
        self.inner.delete(key).await
    }

    /// A multipart upload: one request to start it, one per part, one to complete it.
    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        let requests = parts.len() as u64 + 2;
        self.admit_n(Op::Compose, requests).await;
        self.inner.compose(key, parts).await
    }

    fn min_compose_part(&self) -> u64 {
        self.inner.min_compose_part()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::object_store::LocalStore;

    #[tokio::test(start_paused = true)]
    async fn requests_wait_for_the_budget_and_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::simulated(std::time::SystemTime::UNIX_EPOCH);
        let local: Arc<dyn ObjectStore> =
            Arc::new(LocalStore::open(dir.path(), Default::default()).unwrap());
        let registry = prometheus::Registry::new();
        let metrics = RateLimitedMetrics {
            issued: crate::metrics::register(
                &registry,
                IntCounterVec::new(prometheus::Opts::new("issued", "h"), &["op"]).unwrap(),
            ),
            waited_seconds: Counter::new("waited", "h").unwrap(),
        };
        let store = RateLimited::new(local, RateBudget::new(5, clock), metrics.clone());
        let start = clock.now();
        for i in 0..15 {
            store
                .put(&format!("k{i}"), bytes::Bytes::from_static(b"x").into())
                .await
                .unwrap();
        }
        // Five at once, then five a second.
        let spent = clock.since(start).as_secs_f64();
        assert!((1.9..2.2).contains(&spent), "{spent}");
        assert_eq!(metrics.issued.with_label_values(&["put"]).get(), 15);
        assert!(metrics.waited_seconds.get() > 1.0);
    }
}
