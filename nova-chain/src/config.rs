//! The chain's settings, filled from novad's flags.

use std::sync::Arc;
use std::time::Duration;

use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::limits;
use nova_core::metastore::MetastoreError;

#[derive(Debug, Clone)]
pub struct ChainConfig {
    /// This star's name: its chain's key prefix and its catalog entry.
    pub star: String,
    /// `--s3-memory-buffer-mib`, in bytes.
    pub admission_bytes: u64,
    /// `--s3-chain-backlog-flights`.
    pub backlog_flights: u32,
    /// `--tail-window-cache-mib`, in bytes.
    pub tail_cache_bytes: u64,
    /// `--read-memory-mib`, in bytes.
    pub read_bytes: u64,
    /// `--flight-max-bytes`.
    pub flight_max_bytes: u64,
    /// `--flight-linger-ms`.
    pub flight_linger: Duration,
    /// `--flight-max-inflight`.
    pub flight_max_inflight: u32,
    /// `--max-streams`.
    pub max_streams: usize,
    /// Backoff between attempts at a failed flight write or absorb commit.
    pub retry: RetryPolicy,
    /// An absorb commit running longer than this is diagnosed as the metastore being slow.
    pub metastore_slow_after: Duration,
    /// Where the chain reads time: the system clock in novad, a simulated one under test.
    pub clock: Clock,
    /// Where retry jitter and probe names come from: seeded under simulation.
    pub entropy: Entropy,
    /// The Express class's zones and settings; `None` when the star has no zone buckets.
    pub express: Option<crate::express::ExpressConfig>,
    /// `--metrics-top-streams`: streams exported with series of their own (the busiest).
    pub metrics_top_streams: usize,
    /// In a fleet, who leads each stream (see [`Leaders`]); `None` for a star on its own.
    pub leaders: Option<Arc<dyn Leaders>>,
}

/// In a fleet, who leads each stream now. Recovery and takeover ask before they settle a
/// chain's section: one of a stream whose leader record names another star was written by a
/// star that no longer led the stream (a second writer, whose absorb the leadership's compare
/// would have refused), so it is left out of the index rather than laid over that star's
/// records. A record naming no star says nothing, and the section is settled as always.
pub trait Leaders: Send + Sync + std::fmt::Debug {
    /// The star `stream`'s leader record names, if it names one.
    fn leader<'a>(
        &'a self,
        stream: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, MetastoreError>>;
}

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl RetryPolicy {
    /// The delay before attempt `attempt` (1-based): exponential, capped, with full jitter over
    /// its upper half so a fleet of stars does not retry in lockstep.
    pub fn delay(&self, attempt: u32, entropy: &Entropy) -> Duration {
        let exp = self
            .initial
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.max);
        let half = exp / 2;
        half + half.mul_f64(entropy.unit())
    }
}

/// A retry policy with the clock its waits run on and the entropy its jitter draws from.
#[derive(Debug, Clone)]
pub struct Backoff {
    pub policy: RetryPolicy,
    pub clock: Clock,
    pub entropy: Entropy,
}

impl Backoff {
    /// The jittered delay before attempt `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.policy.delay(attempt, &self.entropy)
    }
}

impl ChainConfig {
    pub fn backoff(&self) -> Backoff {
        Backoff {
            policy: self.retry,
            clock: self.clock,
            entropy: self.entropy.clone(),
        }
    }
}

impl Default for ChainConfig {
    fn default() -> Self {
        Self {
            star: "nova".into(),
            admission_bytes: limits::ADMISSION_BUFFER_MIB * limits::MIB,
            backlog_flights: limits::CHAIN_BACKLOG_FLIGHTS,
            tail_cache_bytes: limits::TAIL_WINDOW_CACHE_MIB * limits::MIB,
            read_bytes: limits::READ_MEMORY_MIB * limits::MIB,
            flight_max_bytes: limits::FLIGHT_MAX_BYTES,
            flight_linger: Duration::from_millis(limits::FLIGHT_LINGER_MS),
            flight_max_inflight: limits::FLIGHT_MAX_INFLIGHT,
            max_streams: limits::MAX_STREAMS as usize,
            retry: RetryPolicy {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(10),
            },
            metastore_slow_after: Duration::from_millis(500),
            clock: Clock::system(),
            entropy: Entropy::from_os(),
            express: None,
            metrics_top_streams: limits::METRICS_TOP_STREAMS,
            leaders: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let policy = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let entropy = Entropy::seeded(1);
        let first = policy.delay(1, &entropy);
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        let late = policy.delay(30, &entropy);
        assert!(late >= Duration::from_secs(1) && late <= Duration::from_secs(2));
    }
}
