//! One star's connections to the world: to the metastore, to the object store, and from its
//! clients. Each can be up, cut (calls fail at once, as a refused or reset connection), silent
//! (packets dropped: a call hangs until its caller's timeout), paused (the process is stopped:
//! calls and answers wait until it resumes) or dead (killed: nothing ever comes back).
//!
//! The gated store and metastore put every call of one star incarnation through its link, so
//! the seed can cut a star off from one thing while the rest of the fleet carries on.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::Notify;

use nova_core::clock::Clock;
use nova_core::metastore::{Capabilities, KeyValue, Metastore, MetastoreError, Txn, TxnOutcome};
use nova_core::object_store::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, ObjectMeta, ObjectStore, Op,
    PutPayload, StoreError,
};

use crate::metastore::SimMetastore;
use crate::store::SimStore;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// Calls fail at once; an answer on its way is lost.
    Cut,
    /// Calls hang until the caller's timeout, then fail; answers are lost.
    Silent,
    /// The process is stopped: calls and answers wait until it runs again.
    Paused,
    /// The process is gone.
    Dead,
}

/// Why a call through a link did not go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Refused before anything was sent: nothing happened.
    Refused,
    /// Lost on the way out or back: it may have happened.
    Lost,
}

/// A value tasks wait on. Unlike `tokio::sync::watch`, whose waiters are woken in an order
/// drawn from the runtime's random source, it wakes them in the order they began to wait, so a
/// seed replays exactly.
#[derive(Debug, Default)]
pub struct Observed<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T: Clone> Observed<T> {
    pub fn new(value: T) -> Self {
        Self {
            value: Mutex::new(value),
            changed: Notify::new(),
        }
    }

    pub fn get(&self) -> T {
        self.value.lock().clone()
    }

    /// Changes the value with `change` (which says whether it changed), waking the waiters.
    pub fn update(&self, change: impl FnOnce(&mut T) -> bool) {
        if change(&mut self.value.lock()) {
            self.changed.notify_waiters();
        }
    }

    /// Waits until `accept` takes the value, and returns what it made of it.
    pub async fn wait_for<R>(&self, mut accept: impl FnMut(&T) -> Option<R>) -> R {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(found) = accept(&self.value.lock()) {
                return found;
            }
            changed.await;
        }
    }
}

#[derive(Debug, Clone)]
pub struct Link {
    state: Arc<Observed<LinkState>>,
    clock: Clock,
    /// How long a caller waits on a silent link before giving up.
    timeout: Duration,
}

impl Link {
    pub fn new(clock: Clock, timeout: Duration) -> Self {
        Self {
            state: Arc::new(Observed::new(LinkState::Up)),
            clock,
            timeout,
        }
    }

    pub fn set(&self, state: LinkState) {
        // A dead process stays dead.
        self.state.update(|now| {
            let change = *now != state && *now != LinkState::Dead;
            if change {
                *now = state;
            }
            change
        });
    }

    pub fn state(&self) -> LinkState {
        self.state.get()
    }

    /// Resolves once the link is dead (the process killed).
    pub async fn dead(&self) {
        self.state
            .wait_for(|state| (*state == LinkState::Dead).then_some(()))
            .await;
    }

    /// Waits while the process is paused; then what the link is. A call the dead process
    /// makes never comes back; a call made to it (`inbound`) fails, as a refused or reset
    /// connection does.
    async fn settled(&self, inbound: bool) -> LinkState {
        let state = self
            .state
            .wait_for(|state| (*state != LinkState::Paused).then_some(*state))
            .await;
        if state == LinkState::Dead && !inbound {
            std::future::pending::<()>().await;
        }
        state
    }

    async fn out(&self, inbound: bool) -> Result<(), Blocked> {
        match self.settled(inbound).await {
            LinkState::Up => Ok(()),
            LinkState::Silent => {
                self.clock.sleep(self.timeout).await;
                Err(Blocked::Lost)
            }
            _ => Err(Blocked::Refused),
        }
    }

    async fn back(&self, inbound: bool) -> Result<(), Blocked> {
        match self.settled(inbound).await {
            LinkState::Up => Ok(()),
            LinkState::Silent => {
                self.clock.sleep(self.timeout).await;
                Err(Blocked::Lost)
            }
            _ => Err(Blocked::Lost),
        }
    }

    /// The way out of the process: `Refused` when the call never left.
    pub async fn send(&self) -> Result<(), Blocked> {
        self.out(false).await
    }

    /// The way back into the process: `Lost` when the answer did not arrive.
    pub async fn receive(&self) -> Result<(), Blocked> {
        self.back(false).await
    }

    /// A client's call reaching the process: `Refused` when it never got there.
    pub async fn reach(&self) -> Result<(), Blocked> {
        self.out(true).await
    }

    /// The process's answer reaching its client: `Lost` when it never got back.
    pub async fn answer(&self) -> Result<(), Blocked> {
        self.back(true).await
    }

    /// Runs `call` across the link.
    pub async fn call<T, E>(
        &self,
        call: impl Future<Output = Result<T, E>>,
        blocked: impl Fn(Blocked) -> E,
    ) -> Result<T, E> {
        self.send().await.map_err(&blocked)?;
        let answer = call.await;
        self.receive().await.map_err(&blocked)?;
        answer
    }
}

/// The object store as one star incarnation reaches it.
#[derive(Debug, Clone)]
pub struct GatedStore {
    pub store: SimStore,
    pub link: Link,
}

fn store_blocked(op: Op, key: &str) -> impl Fn(Blocked) -> StoreError {
    let key = key.to_owned();
    move |blocked| StoreError::Transient {
        op,
        key: key.clone(),
        message: match blocked {
            Blocked::Refused => "simulated: the store is unreachable from this star".into(),
            Blocked::Lost => "simulated: the store's answer never came back".into(),
        },
    }
}

#[async_trait]
impl ObjectStore for GatedStore {
    fn describe(&self) -> String {
        "simulated object store, through one star's link".into()
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        let call = self.store.put_if_absent(key, payload);
        self.link
            .call(call, store_blocked(Op::PutIfAbsent, key))
            .await
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        let call = self.store.put(key, payload);
        self.link.call(call, store_blocked(Op::Put, key)).await
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        let call = self.store.get(key, range);
        self.link.call(call, store_blocked(Op::Get, key)).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let call = self.store.head(key);
        self.link.call(call, store_blocked(Op::Head, key)).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        let call = self.store.list(prefix, start_after, max_keys);
        self.link.call(call, store_blocked(Op::List, prefix)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let call = self.store.delete(key);
        self.link.call(call, store_blocked(Op::Delete, key)).await
    }

    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        let call = self.store.compose(key, parts);
        self.link.call(call, store_blocked(Op::Compose, key)).await
    }

    fn min_compose_part(&self) -> u64 {
        self.store.min_compose_part()
    }
}

/// The metastore as one star incarnation reaches it.
#[derive(Debug, Clone)]
pub struct GatedMetastore {
    pub metastore: SimMetastore,
    pub link: Link,
}

fn meta_blocked(blocked: Blocked) -> MetastoreError {
    MetastoreError::Unavailable(match blocked {
        Blocked::Refused => "simulated: etcd is unreachable from this star".into(),
        Blocked::Lost => {
            "simulated: etcd's answer never came back (the call may have applied)".into()
        }
    })
}

#[async_trait]
impl Metastore for GatedMetastore {
    fn describe(&self) -> String {
        "simulated metastore, through one star's link".into()
    }

    fn capabilities(&self) -> Capabilities {
        self.metastore.capabilities()
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        self.link.call(self.metastore.get(key), meta_blocked).await
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        let call = self.metastore.scan(prefix, start_after, limit);
        self.link.call(call, meta_blocked).await
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        self.link
            .call(self.metastore.commit(txn), meta_blocked)
            .await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<u64, MetastoreError> {
        self.link
            .call(self.metastore.grant_lease(ttl), meta_blocked)
            .await
    }

    async fn keep_alive(&self, lease: u64) -> Result<Option<Duration>, MetastoreError> {
        self.link
            .call(self.metastore.keep_alive(lease), meta_blocked)
            .await
    }

    async fn revoke_lease(&self, lease: u64) -> Result<(), MetastoreError> {
        self.link
            .call(self.metastore.revoke_lease(lease), meta_blocked)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_paused_link_holds_answers_and_a_dead_one_never_answers() {
        let clock = Clock::simulated(std::time::UNIX_EPOCH);
        let link = Link::new(clock, Duration::from_secs(5));
        let ok = || async { Ok::<u8, Blocked>(1) };
        assert_eq!(link.call(ok(), |b| b).await, Ok(1));
        link.set(LinkState::Cut);
        assert_eq!(link.call(ok(), |b| b).await, Err(Blocked::Refused));
        link.set(LinkState::Silent);
        let before = clock.now();
        assert_eq!(link.call(ok(), |b| b).await, Err(Blocked::Lost));
        assert_eq!(clock.since(before), Duration::from_secs(5));
        link.set(LinkState::Paused);
        let resumer = link.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            resumer.set(LinkState::Up);
        });
        let before = clock.now();
        assert_eq!(link.call(ok(), |b| b).await, Ok(1));
        assert_eq!(clock.since(before), Duration::from_secs(30));
        link.set(LinkState::Dead);
        link.set(LinkState::Up);
        assert_eq!(link.state(), LinkState::Dead, "the dead stay dead");
        let never = clock.timeout(Duration::from_secs(3600), link.call(ok(), |b| b));
        assert!(never.await.is_err());
    }
}
