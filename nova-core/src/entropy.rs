//! Randomness, passed in rather than drawn from the process: a seeded generator in the
//! simulation (so a seed replays exactly), one seeded from the operating system in a server.

#![allow(
    clippy::disallowed_methods,
    reason = "the one place that seeds from the operating system"
)]

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// A shared random source. Cheap to clone; clones draw from one sequence.
#[derive(Clone)]
pub struct Entropy {
    rng: Arc<Mutex<SmallRng>>,
}

impl Entropy {
    /// Seeded from the operating system: what servers run on.
    pub fn from_os() -> Self {
        Self::wrap(rand::make_rng())
    }

    /// The same sequence for the same seed.
    pub fn seeded(seed: u64) -> Self {
        Self::wrap(SmallRng::seed_from_u64(seed))
    }

    fn wrap(rng: SmallRng) -> Self {
        Self {
            rng: Arc::new(Mutex::new(rng)),
        }
    }

    pub fn next_u64(&self) -> u64 {
        self.rng.lock().random()
    }

    /// Uniform in [0, 1).
    pub fn unit(&self) -> f64 {
        self.rng.lock().random()
    }

    /// Uniform in [0, n); 0 when n is 0.
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.rng.lock().random_range(0..n)
        }
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.unit() < p
    }
}

impl Default for Entropy {
    fn default() -> Self {
        Self::from_os()
    }
}

impl fmt::Debug for Entropy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Entropy")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_sequence() {
        let a = Entropy::seeded(7);
        let b = Entropy::seeded(7);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(
            xs,
            (0..8)
                .map(|_| Entropy::seeded(8).next_u64())
                .collect::<Vec<_>>()
        );
        assert!((0..100).all(|_| a.below(5) < 5));
    }
}
