//! Jittered waits: between half and all of a step, drawn with splitmix64 from a per-client seed,
//! so that clients failed by one event (a restarted star) do not retry in lockstep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nova_proto::clock::Clock;

/// Generators started by this process, to tell their seeds apart.
static STARTED: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub(crate) struct Jitter(AtomicU64);

impl Jitter {
    /// A generator seeded from the time, `salt` and a process-wide count.
    pub fn new(clock: &Clock, salt: &str) -> Self {
        let mut seed = clock.unix_ms() ^ STARTED.fetch_add(1, Ordering::Relaxed).rotate_left(32);
        for byte in salt.bytes() {
            seed = (seed ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
        Self(AtomicU64::new(seed))
    }

    /// Between half and all of `base`.
    pub fn apply(&self, base: Duration) -> Duration {
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let fraction = 0.5 + (z >> 11) as f64 / (1u64 << 53) as f64 / 2.0;
        base.mul_f64(fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_jittered_within_half_and_all_of_the_step() {
        let jitter = Jitter::new(&Clock::system(), "s");
        let base = Duration::from_millis(1000);
        let draws: Vec<Duration> = (0..200).map(|_| jitter.apply(base)).collect();
        assert!(draws.iter().all(|d| *d >= base / 2 && *d <= base));
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(distinct.len() > 150, "draws repeat: {}", distinct.len());
        // Two generators started together draw differently.
        let other = Jitter::new(&Clock::system(), "s");
        let mine: Vec<_> = (0..8).map(|_| jitter.apply(base)).collect();
        let theirs: Vec<_> = (0..8).map(|_| other.apply(base)).collect();
        assert_ne!(mine, theirs);
    }
}
