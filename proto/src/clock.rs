//! Time, passed in rather than read from the process.
//!
//! Library code asks a [`Clock`] for the time and for timers; clippy's `disallowed-methods`
//! (see `clippy.toml`) refuses direct calls to `Instant::now`, `SystemTime::now` and tokio's
//! free timer functions everywhere else. That one seam is what lets the simulation run the real
//! star under a clock it controls: monotonic time comes from tokio's clock, which a runtime
//! started paused advances only when every task is idle, and the simulated clock derives wall
//! time from it too, so a seed replays to the same millisecond.

#![allow(
    clippy::disallowed_methods,
    reason = "the one place that reads the process's clocks"
)]

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use tokio::time::Instant;
use tokio::time::{Interval, Sleep, Timeout};

/// A handle to the time source: cheap to clone, shared by every part of a process.
#[derive(Clone, Copy)]
pub struct Clock {
    source: Source,
}

#[derive(Clone, Copy)]
enum Source {
    /// The process's clocks.
    System,
    /// Wall time that starts at `wall_origin` when tokio's clock reads `origin`, and moves only
    /// with tokio's clock.
    Simulated {
        wall_origin: SystemTime,
        origin: Instant,
        /// Milliseconds this clock's wall time is off by (a simulated bad clock), when it can be.
        skew: Option<&'static ClockSkew>,
    },
}

/// How far a simulated wall clock is off, in milliseconds (ahead when positive); changed at
/// any time to step the clock forward or back. Monotonic time never moves with it, as on a
/// real machine whose wall clock is stepped.
#[derive(Debug, Default)]
pub struct ClockSkew(AtomicI64);

impl ClockSkew {
    pub fn set_ms(&self, ms: i64) {
        self.0.store(ms, Ordering::Relaxed);
    }

    pub fn ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Clock {
    /// The process's own clocks: what novad and novagateway run on.
    pub fn system() -> Self {
        Self {
            source: Source::System,
        }
    }

    /// A clock whose wall time reads `wall_origin` now and advances only with tokio's clock.
    /// Meant for a runtime started with its clock paused, where time is virtual and runs
    /// deterministically.
    pub fn simulated(wall_origin: SystemTime) -> Self {
        Self {
            source: Source::Simulated {
                wall_origin,
                origin: Instant::now(),
                skew: None,
            },
        }
    }

    /// This simulated clock with a wall time off by what `skew` says, which the simulation
    /// changes to step it; monotonic time and timers are unchanged. A system clock is returned
    /// as it is: only a simulation steps clocks on purpose.
    pub fn skewed(self, skew: &'static ClockSkew) -> Self {
        match self.source {
            Source::System => self,
            Source::Simulated {
                wall_origin,
                origin,
                ..
            } => Self {
                source: Source::Simulated {
                    wall_origin,
                    origin,
                    skew: Some(skew),
                },
            },
        }
    }

    /// Monotonic time.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// Time since `earlier`, zero if `earlier` is in the future.
    pub fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }

    /// Wall-clock time.
    pub fn wall(&self) -> SystemTime {
        match self.source {
            Source::System => SystemTime::now(),
            Source::Simulated {
                wall_origin,
                origin,
                skew,
            } => {
                let wall = wall_origin + Instant::now().saturating_duration_since(origin);
                match skew.map_or(0, ClockSkew::ms) {
                    ms if ms >= 0 => wall + Duration::from_millis(ms as u64),
                    ms => wall - Duration::from_millis(ms.unsigned_abs()),
                }
            }
        }
    }

    /// Wall-clock milliseconds since the Unix epoch, the unit of record timestamps.
    pub fn unix_ms(&self) -> u64 {
        self.wall()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    pub fn sleep(&self, duration: Duration) -> Sleep {
        tokio::time::sleep(duration)
    }

    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        tokio::time::sleep_until(deadline)
    }

    /// Runs `future` for at most `duration`.
    pub fn timeout<F: Future>(&self, duration: Duration, future: F) -> Timeout<F> {
        tokio::time::timeout(duration, future)
    }

    /// Runs `future` until `deadline`.
    pub fn timeout_at<F: Future>(&self, deadline: Instant, future: F) -> Timeout<F> {
        tokio::time::timeout_at(deadline, future)
    }

    /// Ticks every `period`, the first at once; a late tick is not made up for with a burst.
    pub fn interval(&self, period: Duration) -> Interval {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            Source::System => f.write_str("Clock::System"),
            Source::Simulated { .. } => f.write_str("Clock::Simulated"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn simulated_wall_time_moves_only_with_the_paused_clock() {
        let origin = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = Clock::simulated(origin);
        assert_eq!(clock.unix_ms(), 1_000_000_000);
        let before = clock.now();
        clock.sleep(Duration::from_millis(1500)).await;
        assert_eq!(clock.since(before), Duration::from_millis(1500));
        assert_eq!(clock.unix_ms(), 1_000_001_500);
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_fires_on_virtual_time() {
        let clock = Clock::simulated(UNIX_EPOCH);
        let never = std::future::pending::<()>();
        assert!(
            clock
                .timeout(Duration::from_secs(3600), never)
                .await
                .is_err()
        );
        assert_eq!(clock.unix_ms(), 3_600_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_steps_its_wall_time_only() {
        static SKEW: ClockSkew = ClockSkew(AtomicI64::new(0));
        let origin = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = Clock::simulated(origin).skewed(&SKEW);
        let before = clock.now();
        SKEW.set_ms(60_000);
        assert_eq!(clock.unix_ms(), 1_000_060_000);
        SKEW.set_ms(-2_000);
        assert_eq!(clock.unix_ms(), 999_998_000);
        assert_eq!(clock.since(before), Duration::ZERO);
    }
}
