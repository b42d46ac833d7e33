//! Rate budgets: so many units per second, with a burst of one second's worth, measured on the
//! process's `Clock` (so the simulation's paused clock governs them too). At the limit a taker
//! waits; nothing is refused and nothing queues beyond the tasks already waiting.

use std::num::NonZeroU32;
use std::ops::Add;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::Reference;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::clock::{Clock, Instant};

/// Nanoseconds since the budget's creation, as governor measures time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tick(u64);

impl Add<Nanos> for Tick {
    type Output = Tick;
    fn add(self, other: Nanos) -> Tick {
        Tick(self.0.saturating_add(other.as_u64()))
    }
}

impl Reference for Tick {
    fn duration_since(&self, earlier: Self) -> Nanos {
        Nanos::from(self.0.saturating_sub(earlier.0))
    }
    fn saturating_sub(&self, duration: Nanos) -> Self {
        Tick(self.0.saturating_sub(duration.as_u64()))
    }
}

/// Governor's view of our clock.
#[derive(Debug, Clone)]
pub struct TickClock {
    clock: Clock,
    origin: Instant,
}

impl governor::clock::Clock for TickClock {
    type Instant = Tick;
    fn now(&self) -> Tick {
        Tick(self.clock.since(self.origin).as_nanos() as u64)
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TickClock, NoOpMiddleware<Tick>>;

/// A budget of `per_second` units each second.
#[derive(Debug, Clone)]
pub struct RateBudget {
    limiter: Arc<Limiter>,
    clock: TickClock,
    burst: u32,
}

impl RateBudget {
    /// `per_second` is clamped to at least one.
    pub fn new(per_second: u32, clock: Clock) -> Self {
        let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
        let clock = TickClock {
            origin: clock.now(),
            clock,
        };
        Self {
            limiter: Arc::new(RateLimiter::direct_with_clock(
                Quota::per_second(rate),
                clock.clone(),
            )),
            clock,
            burst: rate.get(),
        }
    }

    pub fn per_second(&self) -> u32 {
        self.burst
    }

    /// Takes `units`, waiting as long as the rate requires; returns how long it waited. More
    /// units than a second's worth are taken a second's worth at a time.
    pub async fn take(&self, mut units: u64) -> Duration {
        let started = self.clock.clock.now();
        while units > 0 {
            let step = units.min(self.burst as u64) as u32;
            let Some(n) = NonZeroU32::new(step) else {
                break;
            };
            loop {
                match self.limiter.check_n(n) {
                    Ok(Ok(())) => break,
                    Ok(Err(not_until)) => {
                        let wait =
                            not_until.wait_time_from(governor::clock::Clock::now(&self.clock));
                        self.clock
                            .clock
                            .sleep(wait.max(Duration::from_millis(1)))
                            .await;
                    }
                    // Cannot happen: a step never exceeds the burst.
                    Err(_) => break,
                }
            }
            units -= step as u64;
        }
        self.clock.clock.since(started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_out_the_rate_and_allows_a_seconds_burst() {
        let clock = Clock::simulated(std::time::SystemTime::UNIX_EPOCH);
        let budget = RateBudget::new(10, clock);
        let start = clock.now();
        // The first second's worth goes at once.
        assert_eq!(budget.take(10).await, Duration::ZERO);
        // Then 30 more take about three seconds.
        budget.take(30).await;
        let spent = clock.since(start);
        assert!(
            spent >= Duration::from_millis(2900) && spent <= Duration::from_millis(3200),
            "{spent:?}"
        );
    }
}
