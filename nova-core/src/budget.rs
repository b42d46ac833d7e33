//! A counted budget that admitted work waits on: bytes for the admission buffer, flights for the
//! chain backlog. Waiters are served first come, first served (tokio's semaphore is fair), and
//! every unit taken is given back exactly once, when its permit drops.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::clock::Clock;
use crate::metrics::BudgetMetrics;

#[derive(Debug, Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    semaphore: Arc<Semaphore>,
    capacity: u64,
    metrics: BudgetMetrics,
    clock: Clock,
}

/// Units held from a budget; dropping it returns them.
#[derive(Debug)]
pub struct BudgetPermit {
    permit: OwnedSemaphorePermit,
    budget: Arc<Inner>,
}

impl BudgetPermit {
    pub fn units(&self) -> u64 {
        self.permit.num_permits() as u64
    }

    /// Adds another permit of the same budget to this one; both are then released together.
    pub fn merge(&mut self, other: BudgetPermit) {
        debug_assert!(Arc::ptr_eq(&self.budget, &other.budget));
        let mut other = other;
        // Take the units out of `other` so its drop releases nothing twice.
        let units = other.permit.num_permits();
        if let Some(moved) = other.permit.split(units) {
            self.permit.merge(moved);
        }
    }

    /// Moves up to `units` into a permit of its own, always leaving at least one behind.
    pub fn split_off(&mut self, units: u64) -> Option<BudgetPermit> {
        let held = self.permit.num_permits();
        let take = (units as usize).min(held.saturating_sub(1));
        let moved = self.permit.split(take)?;
        Some(BudgetPermit {
            permit: moved,
            budget: self.budget.clone(),
        })
    }

    /// Gives back everything above `units` now, keeping the rest until the permit drops.
    pub fn shrink_to(&mut self, units: u64) {
        let held = self.permit.num_permits();
        let keep = (units as usize).max(1);
        if keep < held
            && let Some(excess) = self.permit.split(held - keep)
        {
            drop(excess);
            self.budget.metrics.in_use.set(self.budget.in_use() as i64);
        }
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        // The semaphore gets the units back after this returns; report the level it will have.
        let in_use = self
            .budget
            .in_use()
            .saturating_sub(self.permit.num_permits() as u64);
        self.budget.metrics.in_use.set(in_use as i64);
    }
}

impl Inner {
    fn in_use(&self) -> u64 {
        self.capacity - self.semaphore.available_permits() as u64
    }
}

/// Decrements the waiter gauge however the wait ends, including cancellation.
struct WaiterGuard<'a>(&'a BudgetMetrics);

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.0.waiters.dec();
    }
}

impl Budget {
    /// A budget of `capacity` units (at least one); waits are timed on `clock`.
    pub fn new(capacity: u64, metrics: BudgetMetrics, clock: Clock) -> Self {
        let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS as u64);
        metrics.capacity.set(capacity as i64);
        metrics.in_use.set(0);
        Self {
            inner: Arc::new(Inner {
                semaphore: Arc::new(Semaphore::new(capacity as usize)),
                capacity,
                metrics,
                clock,
            }),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    pub fn in_use(&self) -> u64 {
        self.inner.in_use()
    }

    pub fn waiters(&self) -> i64 {
        self.inner.metrics.waiters.get()
    }

    /// The charge actually taken for a request of `units`: never more than the whole budget, so
    /// an oversized request waits for an empty budget instead of deadlocking.
    pub fn clamp(&self, units: u64) -> u32 {
        units.min(self.inner.capacity).min(u32::MAX as u64) as u32
    }

    /// Takes the units now if they are free.
    pub fn try_acquire(&self, units: u64) -> Option<BudgetPermit> {
        let permit = self
            .inner
            .semaphore
            .clone()
            .try_acquire_many_owned(self.clamp(units))
            .ok()?;
        Some(self.granted(permit))
    }

    /// Takes exactly `units` now if they are free: `None` if they are not, or if they are more
    /// than the budget can ever hold (where [`Budget::try_acquire`] would take less).
    pub fn try_acquire_exact(&self, units: u64) -> Option<BudgetPermit> {
        (u64::from(self.clamp(units)) == units)
            .then(|| self.try_acquire(units))
            .flatten()
    }

    /// Waits until the units are free. Cancel-safe: dropping the future gives up the place in
    /// line and takes nothing.
    pub async fn acquire(&self, units: u64) -> BudgetPermit {
        if let Some(permit) = self.try_acquire(units) {
            self.inner.metrics.wait.observe(0.0);
            return permit;
        }
        let started = self.inner.clock.now();
        self.inner.metrics.waiters.inc();
        let _waiting = WaiterGuard(&self.inner.metrics);
        let permit = self
            .inner
            .semaphore
            .clone()
            .acquire_many_owned(self.clamp(units))
            .await
            // The semaphore is never closed while a Budget exists.
            .expect("budget semaphore closed");
        self.inner
            .metrics
            .wait
            .observe(self.inner.clock.since(started).as_secs_f64());
        self.granted(permit)
    }

    fn granted(&self, permit: OwnedSemaphorePermit) -> BudgetPermit {
        self.inner.metrics.in_use.set(self.inner.in_use() as i64);
        BudgetPermit {
            permit,
            budget: self.inner.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(capacity: u64) -> Budget {
        let registry = prometheus::Registry::new();
        let metrics = crate::prom::budget(&registry, "test", "bytes", "test budget");
        Budget::new(capacity, metrics, Clock::system())
    }

    #[test]
    fn an_exact_take_is_never_clamped() {
        let b = budget(100);
        assert!(b.try_acquire_exact(101).is_none(), "more than the budget");
        let held = b.try_acquire_exact(60).unwrap();
        assert_eq!(held.units(), 60);
        assert!(b.try_acquire_exact(41).is_none(), "no room now");
        assert_eq!(b.try_acquire_exact(40).unwrap().units(), 40);
    }

    #[tokio::test(start_paused = true)]
    async fn units_come_back_exactly_once() {
        let b = budget(100);
        let p1 = b.acquire(60).await;
        assert_eq!(b.in_use(), 60);
        assert!(b.try_acquire(41).is_none());
        let p2 = b.try_acquire(40).unwrap();
        assert_eq!(b.in_use(), 100);
        drop(p1);
        assert_eq!(b.in_use(), 40);
        drop(p2);
        assert_eq!(b.in_use(), 0);
        assert_eq!(b.inner.metrics.in_use.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_request_is_clamped_and_still_served() {
        let b = budget(100);
        let held = b.acquire(10).await;
        let big = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire(1_000_000).await.units() })
        };
        Clock::system().sleep(Duration::from_millis(20)).await;
        assert_eq!(b.waiters(), 1, "the big request waits for the whole budget");
        drop(held);
        assert_eq!(big.await.unwrap(), 100);
        assert_eq!(b.waiters(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_arrival_order() {
        let b = budget(10);
        let held = b.acquire(10).await;
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        for i in 0..3u64 {
            let b = b.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let p = b.acquire(10).await;
                tx.send(i).await.unwrap();
                Clock::system().sleep(Duration::from_millis(5)).await;
                drop(p);
            });
            Clock::system().sleep(Duration::from_millis(10)).await;
        }
        drop(held);
        let order = [rx.recv().await, rx.recv().await, rx.recv().await];
        assert_eq!(order, [Some(0), Some(1), Some(2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn shrinking_returns_the_excess_at_once() {
        let b = budget(100);
        let mut p = b.acquire(80).await;
        p.shrink_to(30);
        assert_eq!((p.units(), b.in_use()), (30, 30));
        p.shrink_to(50);
        assert_eq!(p.units(), 30, "shrinking never grows a charge");
        drop(p);
        assert_eq!(b.in_use(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn merged_permits_return_together() {
        let b = budget(100);
        let mut p = b.acquire(30).await;
        p.merge(b.try_acquire(20).unwrap());
        assert_eq!((p.units(), b.in_use()), (50, 50));
        drop(p);
        assert_eq!(b.in_use(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_takes_nothing() {
        let b = budget(10);
        let held = b.acquire(10).await;
        let waited = Clock::system()
            .timeout(Duration::from_millis(10), b.acquire(5))
            .await;
        assert!(waited.is_err());
        assert_eq!(b.waiters(), 0);
        drop(held);
        assert_eq!(b.in_use(), 0);
    }
}
