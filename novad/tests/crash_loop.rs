//! A short run of the crash loop (`benches/crash-loop.sh` runs a thousand cycles): novad on a
//! real S3-compatible server, killed with SIGKILL at random moments while exactly-once and
//! unconditional producers append mixed sizes from 10 B to 1 MiB, with batches over 1 MiB (so
//! flights carry several sections of one stream). Every restart must succeed, and every
//! acknowledged record must be there, unchanged, in order, exactly once.

use nova_testkit::crash_loop::{CrashLoop, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_cycles_lose_nothing_and_every_restart_succeeds() {
    let mut config = CrashLoop::new(env!("CARGO_BIN_EXE_novad").into());
    config.cycles = 6;
    config.seed = std::env::var("NOVA_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let report = run(config.clone()).await;
    println!("{report:?}");
    assert!(
        report.violations.is_empty(),
        "seed {}: {}",
        config.seed,
        report.violations.join("\n")
    );
    assert_eq!(report.restarts, config.cycles, "every restart succeeded");
    assert!(report.acked_records > 0);
    assert!(
        report.largest_batch_bytes > 1 << 20,
        "a batch over 1 MiB was acknowledged"
    );
}
