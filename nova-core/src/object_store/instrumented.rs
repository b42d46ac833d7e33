//! A wrapper that counts every request, its outcome, latency and bytes.

use std::sync::Arc;

use async_trait::async_trait;

use super::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, ObjectMeta, ObjectStore, Op,
    PutPayload, StoreError,
};
use crate::clock::{Clock, Instant};
use crate::metrics::StoreMetrics;

#[derive(Debug, Clone)]
pub struct Instrumented {
    inner: Arc<dyn ObjectStore>,
    metrics: StoreMetrics,
    clock: Clock,
}

impl Instrumented {
    pub fn new(inner: Arc<dyn ObjectStore>, metrics: StoreMetrics, clock: Clock) -> Self {
        Self {
            inner,
            metrics,
            clock,
        }
    }

    fn record<T>(&self, op: Op, started: Instant, result: &Result<T, StoreError>, bytes: u64) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(StoreError::NotFound { .. }) => "not_found",
            Err(StoreError::InvalidRange { .. }) => "invalid_range",
            Err(StoreError::Transient { .. }) => "transient_error",
            Err(StoreError::Permanent { .. }) => "error",
        };
        self.metrics
            .requests
            .with_label_values(&[op.as_str(), outcome])
            .inc();
        self.metrics
            .latency
            .with_label_values(&[op.as_str()])
            .observe(self.clock.since(started).as_secs_f64());
        if result.is_ok() && bytes > 0 {
            self.metrics
                .bytes
                .with_label_values(&[op.as_str()])
                .inc_by(bytes);
        }
    }
}

#[async_trait]
impl ObjectStore for Instrumented {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        let started = self.clock.now();
        let len = payload.len();
        let result = self.inner.put_if_absent(key, payload).await;
        let written = matches!(result, Ok(CreateOutcome::Created));
        self.record(
            Op::PutIfAbsent,
            started,
            &result,
            if written { len } else { 0 },
        );
        result
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        let started = self.clock.now();
        let len = payload.len();
        let result = self.inner.put(key, payload).await;
        self.record(Op::Put, started, &result, len);
        result
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        let started = self.clock.now();
        let result = self.inner.get(key, range).await;
        let len = result.as_ref().map(|r| r.bytes.len() as u64).unwrap_or(0);
        self.record(Op::Get, started, &result, len);
        result
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let started = self.clock.now();
        let result = self.inner.head(key).await;
        self.record(Op::Head, started, &result, 0);
        result
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        let started = self.clock.now();
        let result = self.inner.list(prefix, start_after, max_keys).await;
        self.record(Op::List, started, &result, 0);
        result
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let started = self.clock.now();
        let result = self.inner.delete(key).await;
        self.record(Op::Delete, started, &result, 0);
        result
    }

    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        let started = self.clock.now();
        // Bytes this process sent; copied parts never pass through it.
        let sent = parts
            .iter()
            .filter(|p| matches!(p, ComposePart::Data(_)))
            .map(ComposePart::len)
            .sum();
        let result = self.inner.compose(key, parts).await;
        self.record(Op::Compose, started, &result, sent);
        result
    }

    fn min_compose_part(&self) -> u64 {
        self.inner.min_compose_part()
    }
}
