//! The star's closed memory formula and its saturation.
//!
//! Every byte the star retains for appends and reads sits under one of a few budgets, so its
//! memory is at most
//!
//! ```text
//! admission buffer + express buffer + read budget + tail window cache + recycled buffers
//!   + open sessions × stream window + the auditor's working memory
//! ```
//!
//! plus a fixed overhead that does not depend on load. The formula divided by the memory ceiling
//! is the star's saturation. Past `--saturation-threshold` the star reads *saturated* (and
//! refuses new leadership in a fleet); it clears only once saturation falls
//! `--saturation-clear-margin` below the threshold, so it never flaps at the edge.
//!
//! `novad` builds the [`Budgets`] from its flags; tests and benches that check a star's resident
//! memory against the formula build them from the flags they start it with.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::limits::{KIB, MIB};
use crate::prom::{gauge, register};
use prometheus::{Gauge, IntGauge, Opts};

#[derive(Debug, Clone)]
pub struct MemoryMetrics {
    pub ceiling: IntGauge,
    /// One series per term of the formula: admission, express, read, tail_cache, recycle,
    /// transport, auditor.
    pub formula: prometheus::IntGaugeVec,
    pub saturation: Gauge,
    pub saturated: IntGauge,
}

impl MemoryMetrics {
    /// Registers the formula's series in `r`.
    pub fn register(r: &prometheus::Registry) -> Self {
        MemoryMetrics {
            ceiling: gauge(
                r,
                "nova_memory_ceiling_bytes",
                "The memory ceiling the formula is measured against (--memory-ceiling, the cgroup \
                 limit, or 60% of RAM).",
            ),
            formula: register(
                r,
                prometheus::IntGaugeVec::new(
                    Opts::new(
                        "nova_memory_formula_bytes",
                        "Terms of the closed memory formula: admission, express, read, tail_cache, \
                         recycle, transport (open sessions × stream window), auditor.",
                    ),
                    &["term"],
                )
                .expect("valid metric"),
            ),
            saturation: register(
                r,
                Gauge::new(
                    "nova_memory_saturation_ratio",
                    "The memory formula divided by the ceiling.",
                )
                .expect("valid metric"),
            ),
            saturated: gauge(
                r,
                "nova_memory_saturated",
                "1 while the star reads saturated (refuses new leadership), else 0.",
            ),
        }
    }
}

/// The formula's terms as `nova_memory_formula_bytes{term}` names them.
pub const TERMS: [&str; 7] = [
    "admission",
    "express",
    "read",
    "tail_cache",
    "recycle",
    "transport",
    "auditor",
];

/// What a star holds beyond its formula however idle: the binary, the runtime and its threads,
/// the embedded metastore's page cache, allocator slack (docs/backpressure.md).
pub const FIXED_OVERHEAD: u64 = 48 * MIB;

/// Request messages of calls other than `Append` in arrival, at most: a budget for the whole
/// server (`net::small`), beyond the formula like the fixed overhead.
pub const REQUEST_MESSAGES: u64 = crate::limits::REQUEST_MESSAGES_BUDGET;

/// What each session place adds beyond its stream window: the session's state, the one DATA
/// frame the charging layer may hold while the session's charge waits, and the start of a next
/// message in the transport's buffer.
pub const SESSION_OVERHEAD: u64 = 64 * KIB;

/// The overhead beyond the formula with `sessions` session places: [`FIXED_OVERHEAD`],
/// [`REQUEST_MESSAGES`] and [`SESSION_OVERHEAD`] per place.
pub fn overhead_with(sessions: u64) -> u64 {
    FIXED_OVERHEAD + REQUEST_MESSAGES + sessions * SESSION_OVERHEAD
}

/// The budgets the formula adds up, in bytes, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// The admission buffer, or one clamped batch if that holds more (a batch charged more
    /// than the whole buffer is clamped to it, so the buffer can be exceeded by one batch).
    pub admission: u64,
    /// The express buffer (the same clamp); zero without zone buckets.
    pub express: u64,
    /// What reads hold beyond the tail cache (`--read-memory-mib`).
    pub read: u64,
    pub tail_cache: u64,
    /// Append buffers kept for reuse (`--recycle-buffer-mib`).
    pub recycle: u64,
    /// Each session's pinned stream window (`--grpc-stream-window-kib`).
    pub stream_window: u64,
    /// `--max-producer-sessions`.
    pub max_sessions: u64,
    /// What the auditor's jobs hold (zero with the auditor off).
    pub auditor: u64,
}

/// The formula's terms, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formula {
    pub admission: u64,
    pub express: u64,
    pub read: u64,
    pub tail_cache: u64,
    pub recycle: u64,
    /// Open sessions × the pinned stream window.
    pub transport: u64,
    pub auditor: u64,
}

impl Formula {
    pub fn total(&self) -> u64 {
        self.admission
            + self.express
            + self.read
            + self.tail_cache
            + self.recycle
            + self.transport
            + self.auditor
    }
}

impl Budgets {
    /// The overhead beyond the formula at the session cap.
    pub fn overhead(&self) -> u64 {
        overhead_with(self.max_sessions)
    }

    /// The formula with `open_sessions` sessions open.
    pub fn formula(&self, open_sessions: u64) -> Formula {
        Formula {
            admission: self.admission,
            express: self.express,
            read: self.read,
            tail_cache: self.tail_cache,
            recycle: self.recycle,
            transport: open_sessions * self.stream_window,
            auditor: self.auditor,
        }
    }

    /// The formula with every session slot taken: the most the budgets allow.
    pub fn at_session_cap(&self) -> Formula {
        self.formula(self.max_sessions)
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// A process's memory ceiling and where it came from (nova-server's `memory` finds it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeilingSource {
    /// Set with `--memory-ceiling`.
    Explicit,
    /// Set with `--memory-ceiling` above the cgroup's memory limit (`asked`), and capped to
    /// the limit: the kernel kills at the limit, whatever the flag says.
    Capped {
        asked: u64,
    },
    CgroupV2,
    CgroupV1,
    /// 60% of physical memory.
    Physical,
}

impl fmt::Display for CeilingSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CeilingSource::Explicit => "--memory-ceiling",
            CeilingSource::Capped { .. } => "--memory-ceiling, capped to the cgroup memory limit",
            CeilingSource::CgroupV2 => "cgroup v2 memory.max",
            CeilingSource::CgroupV1 => "cgroup v1 memory.limit_in_bytes",
            CeilingSource::Physical => "60% of physical memory",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceiling {
    pub bytes: u64,
    pub source: CeilingSource,
}

/// The formula against the ceiling, exported and kept current, with the saturated state.
#[derive(Debug)]
pub struct MemoryModel {
    ceiling: Ceiling,
    budgets: Budgets,
    threshold: f64,
    clear_below: f64,
    saturated: AtomicBool,
    metrics: MemoryMetrics,
}

impl MemoryModel {
    /// Saturated from `threshold` (a share of the ceiling) on, clear again below
    /// `threshold - clear_margin`.
    pub fn new(
        budgets: Budgets,
        ceiling: Ceiling,
        threshold: f64,
        clear_margin: f64,
        metrics: MemoryMetrics,
    ) -> Self {
        let model = Self {
            ceiling,
            budgets,
            threshold,
            clear_below: threshold - clear_margin,
            saturated: AtomicBool::new(false),
            metrics,
        };
        model.metrics.ceiling.set(ceiling.bytes as i64);
        model.update(0);
        model
    }

    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    pub fn formula(&self, open_sessions: u64) -> Formula {
        self.budgets.formula(open_sessions)
    }

    /// The formula with every session slot taken: the most the budgets allow.
    pub fn at_session_cap(&self) -> Formula {
        self.budgets.at_session_cap()
    }

    /// Refuses budgets that cannot fit under the ceiling at the session cap, with the overhead
    /// beyond the formula, naming each term.
    pub fn check_fits(&self) -> Result<(), String> {
        let worst = self.at_session_cap();
        let overhead = self.budgets.overhead();
        let total = worst.total() + overhead;
        if total <= self.ceiling.bytes {
            return Ok(());
        }
        Err(format!(
            "the budgets do not fit under the memory ceiling of {} ({}): \
             admission buffer {} (--s3-memory-buffer-mib) + express buffer {} + read budget {} \
             (--read-memory-mib) + tail window cache {} (--tail-window-cache-mib) + recycled \
             buffers {} (--recycle-buffer-mib) + {} sessions × {} \
             stream window (--max-producer-sessions × --grpc-stream-window-kib) + auditor {} \
             (--auditor) + fixed overhead {} (48 MiB, 8 MiB of request messages, and 64 KiB \
             per session place) = {} = {} \
             over. Lower a budget, raise --memory-ceiling, or pass --allow-memory-overcommit to \
             start anyway",
            mib(self.ceiling.bytes),
            self.ceiling.source,
            mib(worst.admission),
            mib(worst.express),
            mib(worst.read),
            mib(worst.tail_cache),
            mib(worst.recycle),
            self.budgets.max_sessions,
            mib(self.budgets.stream_window),
            mib(worst.auditor),
            mib(overhead),
            mib(total),
            mib(total - self.ceiling.bytes),
        ))
    }

    pub fn is_saturated(&self) -> bool {
        self.saturated.load(Ordering::Acquire)
    }

    /// Recomputes the formula for the sessions open now, exports it, and moves the saturated
    /// state with hysteresis. Returns the saturation.
    pub fn update(&self, open_sessions: u64) -> f64 {
        let formula = self.formula(open_sessions);
        let terms = [
            ("admission", formula.admission),
            ("express", formula.express),
            ("read", formula.read),
            ("tail_cache", formula.tail_cache),
            ("recycle", formula.recycle),
            ("transport", formula.transport),
            ("auditor", formula.auditor),
        ];
        for (term, bytes) in terms {
            self.metrics
                .formula
                .with_label_values(&[term])
                .set(bytes as i64);
        }
        let saturation = formula.total() as f64 / self.ceiling.bytes.max(1) as f64;
        self.metrics.saturation.set(saturation);
        let was = self.is_saturated();
        let now = if was {
            saturation >= self.clear_below
        } else {
            saturation >= self.threshold
        };
        if now != was {
            self.saturated.store(now, Ordering::Release);
            if now {
                tracing::warn!(
                    saturation,
                    threshold = self.threshold,
                    "star saturated: its memory formula is near the ceiling; it refuses new leadership"
                );
            } else {
                tracing::info!(
                    saturation,
                    clear_below = self.clear_below,
                    "star no longer saturated"
                );
            }
        }
        self.metrics.saturated.set(now as i64);
        saturation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_has_hysteresis() {
        // 80 MiB of budgets in a 100 MiB ceiling, plus 1 MiB per 16 sessions.
        let budgets = Budgets {
            admission: 56 * MIB,
            express: 0,
            read: 4 * MIB,
            tail_cache: 20 * MIB,
            recycle: 0,
            stream_window: 64 * 1024,
            max_sessions: 4096,
            auditor: 0,
        };
        let ceiling = Ceiling {
            bytes: 100 * MIB,
            source: CeilingSource::Explicit,
        };
        let m = MemoryModel::new(
            budgets,
            ceiling,
            0.9,
            0.05,
            MemoryMetrics::register(&prometheus::Registry::new()),
        );
        assert!(!m.is_saturated());
        m.update(16 * 10); // 90 MiB: at the threshold
        assert!(m.is_saturated());
        m.update(16 * 7); // 87 MiB: below the threshold, above the clear level
        assert!(m.is_saturated(), "does not clear inside the margin");
        m.update(16 * 4); // 84 MiB: below 85
        assert!(!m.is_saturated());
        m.update(16 * 8); // 88 MiB: under the threshold again
        assert!(!m.is_saturated(), "does not re-enter below the threshold");
        assert_eq!(m.at_session_cap().transport, 4096 * 64 * 1024);
        assert!(
            m.check_fits()
                .unwrap_err()
                .contains("--allow-memory-overcommit")
        );
    }
}
