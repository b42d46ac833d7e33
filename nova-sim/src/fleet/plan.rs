//! What a fleet seed decides up front: how many stars, their lease, the faults of the shared
//! store and metastore, the workload, and a timeline of what happens to the stars.

use std::time::Duration;

use nova_chain::{ChainConfig, RetryPolicy};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;

use crate::metastore::MetastoreFaults;
use crate::plan::{ms, pick};
use crate::store::StoreFaults;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Star ids a seed may use: the first `stars` start, the rest may join later.
pub const MAX_STARS: usize = 5;

pub fn star_id(index: usize) -> String {
    format!("star-{index}")
}

#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// Stars running at the start.
    pub stars: usize,
    pub lease_ttl: Duration,
    /// Streams created at the start.
    pub streams: usize,
    /// Batches each producer keeps unanswered at once.
    pub window: usize,
    pub max_records: usize,
    /// Probability that a producer with a settled tail sends `match_seq_num`.
    pub match_seq: f64,
    /// How long producers, consumers and faults run before the fault-free end.
    pub run_for: Duration,
    pub events: Vec<(Duration, Event)>,
    pub store: StoreFaults,
    pub metastore: MetastoreFaults,
    /// Each star's chain settings, but for its id, clock and entropy.
    pub chain: ChainConfig,
    /// Steps of one star's wall clock to an error in ms (its monotonic clock never moves with
    /// it): at that moment of the run, that star, that error. Every star's clock is right at
    /// the start and set right again when the faults end.
    pub clock_steps: Vec<(Duration, usize, i64)>,
}

impl FleetPlan {
    /// Draws the clock steps from `entropy` of their own, so the rest of a seed's plan is what
    /// it was before stars had clocks of their own: half the seeds step clocks, up to four
    /// times, to errors a wall clock really has (a few seconds either way, a minute, an hour
    /// ahead).
    pub fn draw_clock_steps(&mut self, entropy: &Entropy) {
        if !entropy.chance(0.5) {
            return;
        }
        let run_for = self.run_for.as_millis() as u64;
        self.clock_steps = (0..1 + entropy.below(4))
            .map(|_| {
                let at = ms(entropy, 0, run_for);
                let star = entropy.below(MAX_STARS as u64) as usize;
                let error = pick(
                    entropy,
                    &[-30_000i64, -4_000, 0, 3_000, 15_000, 60_000, 3_600_000],
                );
                (at, star, error)
            })
            .collect();
    }
}

/// Something that happens to the fleet at a moment of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// kill -9; the star is started again after `down`.
    Kill { star: usize, down: Duration },
    /// SIGSTOP, then SIGCONT after `lasting` (past the lease: a zombie).
    Pause { star: usize, lasting: Duration },
    /// The star cannot reach the metastore (`silent`: packets dropped, else refused).
    CutMetastore {
        star: usize,
        lasting: Duration,
        silent: bool,
    },
    /// The star cannot reach the object store.
    CutStore { star: usize, lasting: Duration },
    /// No client reaches the star.
    CutClients { star: usize, lasting: Duration },
    /// The star's memory reads saturated: it takes no new leadership and hands streams off.
    Saturate { star: usize, lasting: Duration },
    /// SIGTERM: the star drains and leaves; it comes back after `down` when `returns`.
    Leave {
        star: usize,
        down: Duration,
        returns: bool,
    },
    /// A star that never ran starts.
    Join { star: usize },
    /// Every star in turn: SIGTERM, start again, wait until it is up.
    RollingRestart,
    /// The metastore stalls every call for a while (a paused member).
    StallMetastore { lasting: Duration },
    /// A new stream is created through some star.
    CreateStream,
    /// A stream is deleted through some star.
    DeleteStream,
}

impl FleetPlan {
    pub fn draw(entropy: &Entropy) -> Self {
        let stars = 2 + entropy.below(4) as usize;
        let lease_ttl = pick(
            entropy,
            &[
                Duration::from_secs(2),
                Duration::from_secs(3),
                Duration::from_secs(5),
            ],
        );
        let faulty = !entropy.chance(0.15);
        let p = |max: f64| if faulty { entropy.unit() * max } else { 0.0 };
        let store = StoreFaults {
            transient: p(0.1),
            lost_answer: p(0.05),
            late: p(0.03),
            stuck: p(0.05),
            short_page: p(0.5),
            latency_ms: (entropy.below(5), 5 + entropy.below(30)),
            ..StoreFaults::none()
        };
        let metastore = MetastoreFaults {
            fail: p(0.05),
            lost_answer: p(0.05),
            read_fail: p(0.03),
            latency_ms: (entropy.below(3), 3 + entropy.below(20)),
            late: p(0.05),
            late_ms: 50 + entropy.below(3000),
            keep_alive_lost: p(0.05),
            keep_alive_dropped: p(0.05),
            keep_alive_slow_ms: if faulty { entropy.below(400) } else { 0 },
        };
        let run_for = ms(entropy, 5_000, 40_000);
        let ttl_ms = lease_ttl.as_millis() as u64;
        let mut joined = stars;
        let events = (0..entropy.below(12))
            .map(|_| {
                let at = ms(entropy, 200, run_for.as_millis() as u64);
                let star = entropy.below(joined as u64) as usize;
                let event = match entropy.below(16) {
                    0 | 1 => Event::Kill {
                        star,
                        down: ms(entropy, 0, 3 * ttl_ms),
                    },
                    2 | 3 => Event::Pause {
                        star,
                        lasting: ms(entropy, ttl_ms / 2, 3 * ttl_ms),
                    },
                    4 => Event::CutMetastore {
                        star,
                        lasting: ms(entropy, ttl_ms / 4, 3 * ttl_ms),
                        silent: entropy.chance(0.5),
                    },
                    5 => Event::CutStore {
                        star,
                        lasting: ms(entropy, 100, 3 * ttl_ms),
                    },
                    6 => Event::CutClients {
                        star,
                        lasting: ms(entropy, 100, 3 * ttl_ms),
                    },
                    7..=9 => Event::Saturate {
                        star,
                        lasting: ms(entropy, ttl_ms, 8 * ttl_ms),
                    },
                    10 => Event::Leave {
                        star,
                        down: ms(entropy, 0, 3 * ttl_ms),
                        returns: entropy.chance(0.7),
                    },
                    11 if joined < MAX_STARS => {
                        joined += 1;
                        Event::Join { star: joined - 1 }
                    }
                    11 | 12 => Event::RollingRestart,
                    13 => Event::StallMetastore {
                        lasting: ms(entropy, 100, 2 * ttl_ms),
                    },
                    14 => Event::CreateStream,
                    _ => Event::DeleteStream,
                };
                (at, event)
            })
            .collect();
        FleetPlan {
            stars,
            lease_ttl,
            streams: 2 + entropy.below(5) as usize,
            window: 1 + entropy.below(3) as usize,
            max_records: pick(entropy, &[1, 4, 16]),
            match_seq: pick(entropy, &[0.0, 0.5]),
            run_for,
            events,
            store,
            metastore,
            chain: ChainConfig {
                star: String::new(),
                admission_bytes: pick(entropy, &[3 * MIB, 8 * MIB]),
                backlog_flights: pick(entropy, &[1, 2, 8]),
                tail_cache_bytes: pick(entropy, &[256 * KIB, 4 * MIB]),
                read_bytes: pick(entropy, &[512 * KIB, 4 * MIB]),
                flight_max_bytes: pick(entropy, &[64 * KIB, 512 * KIB]),
                flight_linger: ms(entropy, 1, 20),
                flight_max_inflight: 1 + entropy.below(4) as u32,
                max_streams: 100,
                retry: RetryPolicy {
                    initial: ms(entropy, 5, 100),
                    max: ms(entropy, 200, 2000),
                },
                metastore_slow_after: Duration::from_millis(500),
                clock: Clock::system(),
                entropy: Entropy::seeded(0),
                express: None,
                metrics_top_streams: 0,
                leaders: None,
            },
            clock_steps: Vec::new(),
        }
    }

    /// The chain settings of star `id`, on this clock and entropy.
    pub fn chain_config(&self, id: &str, clock: Clock, entropy: Entropy) -> ChainConfig {
        ChainConfig {
            star: id.to_owned(),
            clock,
            entropy,
            ..self.chain.clone()
        }
    }

    /// Body lengths for one batch.
    pub fn batch(&self, entropy: &Entropy) -> Vec<usize> {
        (0..1 + entropy.below(self.max_records as u64))
            .map(|_| 8 + entropy.below(2 * KIB) as usize)
            .collect()
    }
}
