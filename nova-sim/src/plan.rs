//! Everything a seed decides up front: the star's settings, the faults, the workload and how
//! many times the star dies. Drawing it all from one generator at the start keeps a seed's
//! shape stable when the run itself changes.

use std::sync::Arc;
use std::time::Duration;

use nova_chain::express::{ExpressConfig, Zone, Zones};
use nova_chain::{ChainConfig, RetryPolicy};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;

use crate::metastore::MetastoreFaults;
use crate::store::StoreFaults;

pub const STAR: &str = "sim";
const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

#[derive(Debug, Clone)]
pub struct Plan {
    pub streams: usize,
    /// Batches each producer keeps unanswered at once.
    pub window: usize,
    /// Batches each producer sends per incarnation, at most.
    pub batches_per_life: usize,
    /// Probability that a batch holds large records (so one stream fills several sections).
    pub large: f64,
    pub max_records: usize,
    /// Probability that a producer with a known tail sends `match_seq_num`.
    pub match_seq: f64,
    /// Probability that a life deletes a stream mid-run (and the next one uses a new one).
    pub delete: f64,
    pub lives: Vec<Life>,
    pub store: StoreFaults,
    pub metastore: MetastoreFaults,
    /// The star's settings; each incarnation gets its own clock and entropy.
    pub chain: ChainConfig,
    /// The auditor's settings, when this seed runs one beside the star.
    pub auditor: Option<AuditorPlan>,
    /// Zone buckets and Express streams, when this seed has them.
    pub express: Option<ExpressPlan>,
    /// Bad wall clocks, age retention, a lenient store and late deletes and commits: what the
    /// auditor must survive.
    pub hazards: Hazards,
}

/// What issue 34 added to every seed: the star's wall clock stepped forward and back (its
/// monotonic clock never moves with it), age retention beside byte retention, a store that
/// ignores copy ranges, late DELETEs and late metastore commits, and lives that end with a
/// quiet spell in which settling must catch up. Drawn from its own entropy, so the rest of each
/// seed's plan is what it was.
#[derive(Debug, Clone)]
pub struct Hazards {
    /// Per life: the wall clock's error at the start (`None`: the last life's error carries
    /// on), and a step to another error this long into the run.
    pub clock: Vec<ClockFaults>,
    /// An age retention for the even-numbered streams.
    pub retention_age: Option<Duration>,
    /// The store copies a whole source object whatever range a compose asks for.
    pub lenient_copy: bool,
    /// Probability that a DELETE answers with a timeout and lands later.
    pub late_delete: f64,
    /// Probability that a metastore commit answers with a timeout and applies later.
    pub late_commit: f64,
    /// Per life: whether it ends with faults lifted until the auditor's settling catches up.
    pub catch_up: Vec<bool>,
}

/// One life's wall clock: its error in ms at the start (`None`: the last life's carries on),
/// and a step to another error this long into the run.
pub type ClockFaults = (Option<i64>, Option<(Duration, i64)>);

impl Hazards {
    pub fn draw(entropy: &Entropy, lives: usize) -> Self {
        // Errors a wall clock really has: a few seconds either way, a minute, an hour ahead.
        let error = || {
            pick(
                entropy,
                &[-30_000i64, -4_000, 0, 3_000, 15_000, 60_000, 3_600_000],
            )
        };
        let bad_clocks = entropy.chance(0.5);
        let clock = (0..lives)
            .map(|_| {
                if !bad_clocks {
                    return (None, None);
                }
                let boot = entropy.chance(0.5).then(error);
                let step = entropy.chance(0.5).then(|| (ms(entropy, 0, 3000), error()));
                (boot, step)
            })
            .collect();
        let retention_age = entropy.chance(0.5).then(|| {
            pick(
                entropy,
                &[
                    Duration::from_millis(500),
                    Duration::from_secs(2),
                    Duration::from_secs(6),
                ],
            )
        });
        let lenient_copy = entropy.chance(0.15);
        let late = entropy.chance(0.5);
        let late_delete = if late { entropy.unit() * 0.1 } else { 0.0 };
        let late_commit = if late { entropy.unit() * 0.05 } else { 0.0 };
        let catch_up = (0..lives).map(|_| entropy.chance(0.3)).collect();
        Hazards {
            clock,
            retention_age,
            lenient_copy,
            late_delete,
            late_commit,
            catch_up,
        }
    }
}

/// Express in a seed: three zone stores with faults of their own, the odd-numbered streams
/// Express, and in some lives two zones out at once (no quorum) for a while. Drawn from its
/// own entropy, so adding it left the rest of every seed's plan as it was.
#[derive(Debug, Clone)]
pub struct ExpressPlan {
    pub zone_faults: StoreFaults,
    pub publish_deadline: Duration,
    pub linger: Duration,
    pub buffer_bytes: u64,
    /// Per life: when two zones go out, for how long, and which zone stays up.
    pub outages: Vec<Option<(Duration, Duration, usize)>>,
}

impl ExpressPlan {
    /// Half the seeds have zones.
    pub fn draw(entropy: &Entropy, lives: &[Life]) -> Option<Self> {
        if !entropy.chance(0.5) {
            return None;
        }
        let faulty = !entropy.chance(0.2);
        let p = |max: f64| if faulty { entropy.unit() * max } else { 0.0 };
        let zone_faults = StoreFaults {
            transient: p(0.2),
            lost_answer: p(0.1),
            late: p(0.05),
            stuck: p(0.1),
            short_page: p(0.5),
            latency_ms: (entropy.below(3), 2 + entropy.below(20)),
            ..StoreFaults::none()
        };
        let outages = lives
            .iter()
            .map(|life| {
                (faulty && entropy.chance(0.3)).then(|| {
                    (
                        ms(entropy, 0, life.run_for.as_millis() as u64),
                        ms(entropy, 50, 3000),
                        entropy.below(3) as usize,
                    )
                })
            })
            .collect();
        Some(ExpressPlan {
            zone_faults,
            publish_deadline: ms(entropy, 100, 2000),
            linger: ms(entropy, 1, 10),
            buffer_bytes: pick(entropy, &[256 * KIB, 2 * MIB, 8 * MIB]),
            outages,
        })
    }
}

/// How the auditor runs in a seed. Drawn from its own entropy, so adding it left the rest of
/// every seed's plan as it was.
#[derive(Debug, Clone)]
pub struct AuditorPlan {
    pub s3_budget: u32,
    pub rewrite_mib: u32,
    pub workers: u32,
    pub collect_grace: Duration,
    pub settle_after: Duration,
    pub rewrite_min_objects: usize,
    /// A byte retention for the even-numbered streams, in half the seeds.
    pub retention_bytes: Option<u64>,
    pub idle: Duration,
    pub sweep_every: Duration,
}

impl AuditorPlan {
    /// Three seeds in four run an auditor.
    pub fn draw(entropy: &Entropy) -> Option<Self> {
        entropy.chance(0.75).then(|| AuditorPlan {
            s3_budget: pick(entropy, &[20, 200, 5000]),
            rewrite_mib: pick(entropy, &[1, 64]),
            workers: 1 + entropy.below(2) as u32,
            collect_grace: ms(entropy, 200, 3000),
            settle_after: pick(
                entropy,
                &[
                    Duration::ZERO,
                    Duration::from_millis(500),
                    Duration::from_secs(3),
                ],
            ),
            idle: ms(entropy, 20, 200),
            rewrite_min_objects: pick(entropy, &[2, 4, 16]),
            retention_bytes: entropy
                .chance(0.5)
                .then(|| pick(entropy, &[2048, 16_384, 131_072])),
            sweep_every: ms(entropy, 500, 5000),
        })
    }
}

/// One incarnation of the star, from its start to its end.
#[derive(Debug, Clone)]
pub struct Life {
    /// How long producers and consumers run.
    pub run_for: Duration,
    /// How it ends.
    pub end: End,
    /// A store outage starting this long into the run, lasting this long.
    pub outage: Option<(Duration, Duration)>,
}

#[derive(Debug, Clone, Copy)]
pub enum End {
    /// Everything dropped at whatever await it was in.
    Crash,
    /// `Star::shutdown` with this deadline, then dropped.
    Shutdown(Duration),
}

pub(crate) fn ms(entropy: &Entropy, low: u64, high: u64) -> Duration {
    Duration::from_millis(low + entropy.below(high - low + 1))
}

pub(crate) fn pick<T: Copy>(entropy: &Entropy, choices: &[T]) -> T {
    choices[entropy.below(choices.len() as u64) as usize]
}

impl Plan {
    pub fn draw(
        entropy: &Entropy,
        auditor: &Entropy,
        express: &Entropy,
        hazard_entropy: &Entropy,
    ) -> Self {
        // A fifth of the seeds run without faults, so the plain paths are covered too.
        let faulty = !entropy.chance(0.2);
        let p = |max: f64| if faulty { entropy.unit() * max } else { 0.0 };
        let store = StoreFaults {
            transient: p(0.2),
            lost_answer: p(0.1),
            late: p(0.05),
            stuck: p(0.2),
            short_page: p(0.5),
            latency_ms: (entropy.below(5), 5 + entropy.below(40)),
            ..StoreFaults::none()
        };
        let metastore = MetastoreFaults {
            fail: p(0.1),
            lost_answer: p(0.1),
            read_fail: p(0.05),
            latency_ms: (entropy.below(3), 3 + entropy.below(30)),
            ..MetastoreFaults::none()
        };
        let lives: Vec<Life> = (0..2 + entropy.below(4))
            .map(|_| {
                let run_for = ms(entropy, 50, 3000);
                let end = if entropy.chance(0.7) {
                    End::Crash
                } else {
                    End::Shutdown(ms(entropy, 10, 2000))
                };
                let outage = (faulty && entropy.chance(0.3)).then(|| {
                    (
                        ms(entropy, 0, run_for.as_millis() as u64),
                        ms(entropy, 50, 3000),
                    )
                });
                Life {
                    run_for,
                    end,
                    outage,
                }
            })
            .collect();
        let hazards = Hazards::draw(hazard_entropy, lives.len());
        let mut plan = Plan {
            streams: 1 + entropy.below(3) as usize,
            window: 1 + entropy.below(4) as usize,
            batches_per_life: 5 + entropy.below(40) as usize,
            large: pick(entropy, &[0.0, 0.05, 0.2]),
            max_records: pick(entropy, &[1, 4, 16]),
            match_seq: pick(entropy, &[0.0, 0.3]),
            delete: pick(entropy, &[0.0, 0.2]),
            lives,
            store,
            metastore,
            // In the order the seed has always drawn them.
            chain: ChainConfig {
                star: STAR.into(),
                admission_bytes: pick(entropy, &[3 * MIB, 8 * MIB, 32 * MIB]),
                backlog_flights: pick(entropy, &[1, 2, 8]),
                tail_cache_bytes: pick(entropy, &[256 * KIB, 4 * MIB]),
                read_bytes: pick(entropy, &[512 * KIB, 4 * MIB]),
                flight_max_bytes: pick(entropy, &[64 * KIB, 512 * KIB, 4 * MIB]),
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
                // Set per incarnation from `express` (`chain_config`): the zones are the
                // world's stores.
                express: None,
                metrics_top_streams: 10,
                leaders: None,
            },
            auditor: AuditorPlan::draw(auditor),
            express: None,
            hazards,
        };
        plan.express = ExpressPlan::draw(express, &plan.lives);
        plan.store.lenient_copy = plan.hazards.lenient_copy;
        plan.store.late_delete = plan.hazards.late_delete;
        plan.metastore.late = plan.hazards.late_commit;
        plan.metastore.late_ms = 2000;
        plan
    }

    pub fn chain_config(
        &self,
        entropy: Entropy,
        clock: Clock,
        zones: &[crate::store::SimStore],
    ) -> ChainConfig {
        let express = self.express.as_ref().map(|plan| ExpressConfig {
            zones: Zones::new(
                zones
                    .iter()
                    .enumerate()
                    .map(|(i, store)| Zone {
                        name: format!("z{i}"),
                        store: Arc::new(store.clone()),
                    })
                    .collect(),
            )
            .expect("three zones"),
            publish_deadline: plan.publish_deadline,
            linger: plan.linger,
            buffer_bytes: plan.buffer_bytes,
        });
        ChainConfig {
            clock,
            entropy,
            express,
            ..self.chain.clone()
        }
    }

    /// Body lengths for one batch.
    pub fn batch(&self, entropy: &Entropy) -> Vec<usize> {
        let large = entropy.chance(self.large);
        // Two or three large records make a batch of more than one section.
        let records = if large { 3 } else { self.max_records as u64 };
        (0..1 + entropy.below(records))
            .map(|_| {
                if large {
                    (200 * KIB + entropy.below(500 * KIB)) as usize
                } else {
                    8 + entropy.below(2 * KIB) as usize
                }
            })
            .collect()
    }
}
