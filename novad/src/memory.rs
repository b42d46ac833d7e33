//! The star's closed memory formula and its saturation.
//!
//! Every byte the star retains for appends and reads sits under one of a few budgets, so its
//! memory is at most
//!
//! ```text
//! admission buffer + express buffer + read budget + tail window cache
//!   + open sessions × stream window + the auditor's working memory
//! ```
//!
//! plus a fixed overhead that does not depend on load. The formula divided by the memory ceiling
//! is the star's saturation. Past `--saturation-threshold` the star reads *saturated* (and will
//! refuse new leadership once a fleet places streams); it clears only once saturation falls
//! `--saturation-clear-margin` below the threshold, so it never flaps at the edge.

use std::sync::atomic::{AtomicBool, Ordering};

use nova_core::limits::{KIB, MIB};
use nova_core::memory::Ceiling;
use nova_core::metrics::MemoryMetrics;

use crate::config::Config;

/// The formula's terms, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formula {
    pub admission: u64,
    /// The express buffer (`--s3-express-memory-buffer-mib`), at least one batch; zero
    /// without zone buckets.
    pub express: u64,
    /// What reads hold beyond the tail cache (`--read-memory-mib`).
    pub read: u64,
    pub tail_cache: u64,
    /// Open sessions × the pinned stream window.
    pub transport: u64,
    /// What the auditor's settle job holds (zero with the auditor off).
    pub auditor: u64,
}

impl Formula {
    pub fn total(&self) -> u64 {
        self.admission + self.express + self.read + self.tail_cache + self.transport + self.auditor
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

#[derive(Debug)]
pub struct MemoryModel {
    ceiling: Ceiling,
    admission: u64,
    express: u64,
    read: u64,
    tail_cache: u64,
    window: u64,
    max_sessions: u64,
    auditor: u64,
    threshold: f64,
    clear_below: f64,
    saturated: AtomicBool,
    metrics: MemoryMetrics,
}

impl MemoryModel {
    pub fn new(config: &Config, ceiling: Ceiling, metrics: MemoryMetrics) -> Self {
        let model = Self {
            ceiling,
            // A batch charged more than the whole buffer is clamped to it, so the buffer can be
            // exceeded by one such batch; its term is the larger of the two.
            admission: (config.s3_memory_buffer_mib * MIB).max(
                nova_chain::admission::largest_batch_hold(
                    config.max_message_bytes() as u64,
                    config.largest_fragment(),
                ),
            ),
            // The same clamp: one Express batch may be charged the whole buffer and hold more.
            express: if config.s3_express_zone.is_empty() {
                0
            } else {
                (config.s3_express_memory_buffer_mib * MIB).max(
                    nova_chain::admission::largest_batch_hold(
                        config.max_message_bytes() as u64,
                        config.largest_fragment(),
                    ),
                )
            },
            read: config.read_memory_mib * MIB,
            tail_cache: config.tail_window_cache_mib * MIB,
            window: config.grpc_stream_window_kib as u64 * KIB,
            max_sessions: config.max_producer_sessions as u64,
            auditor: if config.auditor {
                config.auditor_memory()
            } else {
                0
            },
            threshold: config.saturation_threshold,
            clear_below: config.saturation_threshold - config.saturation_clear_margin,
            saturated: AtomicBool::new(false),
            metrics,
        };
        model.metrics.ceiling.set(ceiling.bytes as i64);
        model.update(0);
        model
    }

    pub fn formula(&self, open_sessions: u64) -> Formula {
        Formula {
            admission: self.admission,
            express: self.express,
            read: self.read,
            tail_cache: self.tail_cache,
            transport: open_sessions * self.window,
            auditor: self.auditor,
        }
    }

    /// The formula with every session slot taken: the most the budgets allow.
    pub fn at_session_cap(&self) -> Formula {
        self.formula(self.max_sessions)
    }

    /// Refuses budgets that cannot fit under the ceiling at the session cap, naming each term.
    pub fn check_fits(&self) -> Result<(), String> {
        let worst = self.at_session_cap();
        if worst.total() <= self.ceiling.bytes {
            return Ok(());
        }
        Err(format!(
            "the budgets do not fit under the memory ceiling of {} ({}): \
             admission buffer {} (--s3-memory-buffer-mib) + express buffer {} + read budget {} \
             (--read-memory-mib) + tail window cache {} (--tail-window-cache-mib) + {} sessions × {} \
             stream window (--max-producer-sessions × --grpc-stream-window-kib) + auditor {} \
             (--auditor) = {} = {} over. Lower a budget, raise --memory-ceiling, or pass \
             --allow-memory-overcommit to start anyway",
            mib(self.ceiling.bytes),
            self.ceiling.source,
            mib(worst.admission),
            mib(worst.express),
            mib(worst.read),
            mib(worst.tail_cache),
            self.max_sessions,
            mib(self.window),
            mib(worst.auditor),
            mib(worst.total()),
            mib(worst.total() - self.ceiling.bytes),
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
    use clap::Parser;
    use nova_core::memory::CeilingSource;
    use nova_core::metrics::Metrics;

    fn model(args: &[&str], ceiling: u64) -> MemoryModel {
        let mut argv = vec!["novad"];
        argv.extend_from_slice(args);
        let config = Config::parse_from(argv);
        MemoryModel::new(
            &config,
            Ceiling {
                bytes: ceiling,
                source: CeilingSource::Explicit,
            },
            Metrics::new().memory,
        )
    }

    #[test]
    fn the_formula_adds_up_its_terms() {
        let m = model(&[], 10 << 30);
        let f = m.formula(10);
        assert_eq!(f.admission, 256 * MIB);
        assert_eq!(f.tail_cache, 128 * MIB);
        assert_eq!(f.transport, 10 * 64 * KIB);
        assert_eq!(f.read, 64 * MIB);
        // The settle: three 8 MiB flights, one 8 MiB settled object and a 2 MiB section past
        // it, 4 MiB of footers. The rewrite: 8 MiB sent through the star twice over and 1 MiB.
        assert_eq!(f.auditor, 55 * MIB + 64 * KIB);
        assert_eq!(f.total(), 503 * MIB + 704 * KIB);
        assert_eq!(
            model(&["--auditor", "false"], 10 << 30).formula(0).auditor,
            0
        );
        assert_eq!(m.at_session_cap().transport, 4096 * 64 * KIB);
        assert!(m.check_fits().is_ok());
    }

    /// One batch charged more than the whole buffer is clamped to it, so with a batch cap large
    /// against the buffer the admission term is the batch, not the buffer.
    #[test]
    fn the_admission_term_covers_one_clamped_batch() {
        let m = model(
            &[
                "--s3-memory-buffer-mib",
                "32",
                "--max-batch-bytes",
                "100MiB",
            ],
            10 << 30,
        );
        let admission = m.formula(0).admission;
        assert!(admission > 200 * MIB, "{admission}");
        let m = model(
            &["--s3-memory-buffer-mib", "32", "--max-batch-bytes", "4MiB"],
            10 << 30,
        );
        assert_eq!(m.formula(0).admission, 32 * MIB);
    }

    #[test]
    fn budgets_over_the_ceiling_are_refused_naming_each_term() {
        let m = model(&[], 512 * MIB);
        let problem = m.check_fits().unwrap_err();
        for term in [
            "--s3-memory-buffer-mib",
            "--read-memory-mib",
            "--tail-window-cache-mib",
            "4096 sessions",
            "--auditor",
            "--allow-memory-overcommit",
        ] {
            assert!(problem.contains(term), "{term} missing from: {problem}");
        }
    }

    #[test]
    fn saturation_has_hysteresis() {
        // admission 56 + read 4 + tail 20 = 80 MiB of a 100 MiB ceiling, plus 1 MiB per 16
        // sessions.
        let m = model(
            &[
                "--s3-memory-buffer-mib",
                "56",
                "--read-memory-mib",
                "4",
                "--max-batch-bytes",
                "1MiB",
                "--tail-window-cache-mib",
                "20",
                "--saturation-threshold",
                "0.9",
                "--saturation-clear-margin",
                "0.05",
                "--auditor",
                "false",
            ],
            100 * MIB,
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
    }
}
