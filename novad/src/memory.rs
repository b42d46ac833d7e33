//! The star's memory formula from its flags (the model itself is `nova_core::formula`).

use nova_core::formula::Budgets;
use nova_core::limits::{KIB, MIB};

use crate::config::Config;

/// The budgets `config` sets, as the formula adds them up.
pub fn budgets(config: &Config) -> Budgets {
    // A batch charged more than the whole buffer is clamped to it, so the buffer can be
    // exceeded by one such batch; the term is the larger of the two.
    let clamped = nova_chain::admission::largest_batch_hold(
        config.max_message_bytes() as u64,
        config.largest_fragment(),
    );
    Budgets {
        admission: (config.s3_memory_buffer_mib * MIB).max(clamped),
        // The same clamp: one Express batch may be charged the whole buffer and hold more.
        express: if config.s3_express_zone.is_empty() {
            0
        } else {
            (config.s3_express_memory_buffer_mib * MIB).max(clamped)
        },
        read: config.read_memory_mib * MIB,
        tail_cache: config.tail_window_cache_mib * MIB,
        recycle: config.recycle_buffer_bytes(),
        stream_window: config.grpc_stream_window_kib as u64 * KIB,
        max_sessions: config.max_producer_sessions as u64,
        auditor: if config.auditor {
            config.auditor_memory()
        } else {
            0
        },
    }
}

/// The model for `config` under `ceiling`.
pub fn model(
    config: &Config,
    ceiling: nova_server::memory::Ceiling,
    metrics: nova_core::metrics::MemoryMetrics,
) -> nova_core::formula::MemoryModel {
    nova_core::formula::MemoryModel::new(
        budgets(config),
        ceiling,
        config.saturation_threshold,
        config.saturation_clear_margin,
        metrics,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use nova_chain::metrics::Metrics;
    use nova_core::formula::MemoryModel;
    use nova_server::memory::Ceiling;
    use nova_server::memory::CeilingSource;

    fn model(args: &[&str], ceiling: u64) -> MemoryModel {
        let mut argv = vec!["novad"];
        argv.extend_from_slice(args);
        let config = Config::parse_from(argv);
        super::model(
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
        // A quarter of the admission buffer unless given.
        assert_eq!(f.recycle, 64 * MIB);
        assert_eq!(f.total(), 567 * MIB + 704 * KIB);
        let given = model(
            &["--s3-memory-buffer-mib", "32", "--recycle-buffer-mib", "20"],
            10 << 30,
        );
        assert_eq!(given.formula(0).recycle, 20 * MIB);
        assert_eq!(
            model(&["--s3-memory-buffer-mib", "32"], 10 << 30)
                .formula(0)
                .recycle,
            8 * MIB
        );
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
            "--recycle-buffer-mib",
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
                "--recycle-buffer-mib",
                "0",
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
