//! An object store wrapper that injects faults on command, for tests: requests to matching keys
//! can be held until released, fail with a transient or permanent error, or land and then lose
//! their answer (the ambiguous outcome a timed-out PUT has), and conditional creates can be
//! made non-exclusive to imitate a backend that ignores `If-None-Match`. The wrapper is the
//! same for every backend, so faults compose with the real local store and S3.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, ObjectMeta, ObjectStore, Op,
    PutPayload, StoreError,
};

/// What happens to a request a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Waits until `release` is called (or the caller gives up), then proceeds.
    Hold,
    /// Fails with a retryable error; nothing is written.
    Transient,
    /// Fails with an error retrying will not fix (refused credentials, say); nothing is written.
    Permanent,
    /// Writes, then reports a retryable error as if the answer had been lost.
    LoseAnswer,
}

#[derive(Debug, Clone)]
struct Rule {
    ops: Vec<Op>,
    key_contains: String,
    fault: Fault,
    /// How many more requests it applies to; `None` for every one.
    remaining: Option<u32>,
}

#[derive(Debug)]
struct State {
    rules: Vec<Rule>,
    ignore_conditions: bool,
}

#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    state: Arc<Mutex<State>>,
    /// Bumped by `release`: held requests wait for a change.
    released: Arc<watch::Sender<u64>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            state: Arc::new(Mutex::new(State {
                rules: Vec::new(),
                ignore_conditions: false,
            })),
            released: Arc::new(watch::channel(0).0),
        }
    }

    /// Applies `fault` to requests of `ops` whose key contains `key_contains`, `times` times
    /// (`None`: until cleared). Rules are tried in the order they were added.
    pub fn inject(&self, ops: &[Op], key_contains: &str, fault: Fault, times: Option<u32>) {
        self.state.lock().rules.push(Rule {
            ops: ops.to_vec(),
            key_contains: key_contains.to_owned(),
            fault,
            remaining: times,
        });
    }

    /// Removes every rule and lets held requests go.
    pub fn clear(&self) {
        self.state.lock().rules.clear();
        self.release();
    }

    /// Lets every request held so far proceed.
    pub fn release(&self) {
        self.released.send_modify(|n| *n += 1);
    }

    /// Rules not yet used up: a rule for a number of requests is gone once that many came.
    pub fn rules_left(&self) -> usize {
        self.state.lock().rules.len()
    }

    /// Makes every conditional create succeed, as a backend that ignores `If-None-Match` does.
    pub fn ignore_conditions(&self, ignore: bool) {
        self.state.lock().ignore_conditions = ignore;
    }

    /// The fault for this request, consuming one use of its rule.
    fn fault_for(&self, op: Op, key: &str) -> Option<Fault> {
        let mut state = self.state.lock();
        let index = state
            .rules
            .iter()
            .position(|r| r.ops.contains(&op) && key.contains(&r.key_contains))?;
        let rule = &mut state.rules[index];
        let fault = rule.fault;
        if let Some(remaining) = &mut rule.remaining {
            *remaining -= 1;
            if *remaining == 0 {
                state.rules.remove(index);
            }
        }
        Some(fault)
    }

    /// Applies the fault before the request; `Ok(true)` means the answer is to be lost after.
    async fn before(&self, op: Op, key: &str) -> Result<bool, StoreError> {
        // Subscribed before the rule is taken, so a release racing this request is not missed.
        let mut released = self.released.subscribe();
        match self.fault_for(op, key) {
            None => Ok(false),
            Some(Fault::Hold) => {
                let _ = released.changed().await;
                Ok(false)
            }
            Some(Fault::Transient) => Err(StoreError::Transient {
                op,
                key: key.to_owned(),
                message: "injected transient fault".into(),
            }),
            Some(Fault::Permanent) => Err(StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: "injected permanent fault (403 AccessDenied)".into(),
            }),
            Some(Fault::LoseAnswer) => Ok(true),
        }
    }
}

fn lost(op: Op, key: &str) -> StoreError {
    StoreError::Transient {
        op,
        key: key.to_owned(),
        message: "injected fault: the request landed but its answer was lost".into(),
    }
}

/// Runs `call` under the fault for `op` on `key`.
macro_rules! faulted {
    ($self:ident, $op:expr, $key:expr, $call:expr) => {{
        let lose = $self.before($op, $key).await?;
        let result = $call;
        if lose && result.is_ok() {
            return Err(lost($op, $key));
        }
        result
    }};
}

#[async_trait]
impl ObjectStore for FaultyStore {
    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        faulted!(self, Op::PutIfAbsent, key, {
            if self.state.lock().ignore_conditions {
                self.inner
                    .put(key, payload)
                    .await
                    .map(|()| CreateOutcome::Created)
            } else {
                self.inner.put_if_absent(key, payload).await
            }
        })
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        faulted!(self, Op::Put, key, self.inner.put(key, payload).await)
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        faulted!(self, Op::Get, key, self.inner.get(key, range).await)
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        faulted!(self, Op::Head, key, self.inner.head(key).await)
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        faulted!(
            self,
            Op::List,
            prefix,
            self.inner.list(prefix, start_after, max_keys).await
        )
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        faulted!(self, Op::Delete, key, self.inner.delete(key).await)
    }

    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        faulted!(self, Op::Compose, key, self.inner.compose(key, parts).await)
    }

    fn min_compose_part(&self) -> u64 {
        self.inner.min_compose_part()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object_store::{LocalStore, StoreLimits, probe_conditional_create};
    use bytes::Bytes;

    fn store() -> (tempfile::TempDir, FaultyStore) {
        let dir = tempfile::tempdir().unwrap();
        let local = LocalStore::open(dir.path(), StoreLimits::default()).unwrap();
        (dir, FaultyStore::new(Arc::new(local)))
    }

    #[tokio::test]
    async fn a_lost_answer_still_writes() {
        let (_dir, store) = store();
        store.inject(&[Op::PutIfAbsent], "k", Fault::LoseAnswer, Some(1));
        let first = store
            .put_if_absent("k", Bytes::from_static(b"x").into())
            .await;
        assert!(matches!(first, Err(StoreError::Transient { .. })));
        let second = store
            .put_if_absent("k", Bytes::from_static(b"x").into())
            .await;
        assert_eq!(second.unwrap(), CreateOutcome::AlreadyExists);
    }

    #[tokio::test]
    async fn held_requests_wait_for_release() {
        let (_dir, store) = store();
        store.inject(&[Op::Put], "held", Fault::Hold, None);
        let put = store.put("held", Bytes::from_static(b"x").into());
        tokio::pin!(put);
        assert!(
            crate::clock::Clock::system()
                .timeout(std::time::Duration::from_millis(50), &mut put)
                .await
                .is_err()
        );
        store.clear();
        put.await.unwrap();
    }

    #[tokio::test]
    async fn the_probe_refuses_a_store_without_exclusive_creates() {
        let (_dir, store) = store();
        probe_conditional_create(&store, "probe/a").await.unwrap();
        store.ignore_conditions(true);
        let err = probe_conditional_create(&store, "probe/b")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("conditional creates"), "{err}");
        store.ignore_conditions(false);
        store.inject(&[Op::PutIfAbsent], "probe", Fault::Permanent, None);
        let err = probe_conditional_create(&store, "probe/c")
            .await
            .unwrap_err();
        assert!(!err.is_retryable(), "{err}");
    }
}
