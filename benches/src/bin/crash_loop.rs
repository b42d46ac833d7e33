//! The crash loop at length: `benches/crash-loop.sh --cycles 1000 --seed 3`. See
//! `nova_testkit::crash_loop` for what each cycle does and checks.

use std::process::ExitCode;
use std::time::Instant;

use nova_benches::arg;
use nova_testkit::crash_loop::{CrashLoop, run};
use nova_testkit::workspace_binary;

fn main() -> ExitCode {
    let mut config = CrashLoop::new(workspace_binary("novad"));
    config.cycles = arg("--cycles", 1000);
    config.seed = arg("--seed", 1);
    config.free_streams = arg("--free-streams", 2) as usize;
    config.exact_streams = arg("--exact-streams", 2) as usize;
    config.large_one_in = arg("--large-one-in", 300);
    println!(
        "crash loop: {} kill -9 cycles, seed {}, {} unconditional and {} exactly-once streams, on moto server",
        config.cycles, config.seed, config.free_streams, config.exact_streams
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let report = runtime.block_on(run(config.clone()));
    println!(
        "{} cycles, {} restarts (slowest {:?}), {} records ({:.1} MiB) acknowledged, \
         largest batch {:.2} MiB, {} durable records whose ack died with the star, in {:?}",
        report.cycles,
        report.restarts,
        report.slowest_restart,
        report.acked_records,
        report.acked_bytes as f64 / (1 << 20) as f64,
        report.largest_batch_bytes as f64 / (1 << 20) as f64,
        report.unacked_but_durable,
        started.elapsed()
    );
    if report.violations.is_empty() {
        println!("no acknowledged record lost, changed, reordered or duplicated");
        ExitCode::SUCCESS
    } else {
        println!("FAILED (replay with --seed {}):", config.seed);
        for violation in &report.violations {
            println!("  {violation}");
        }
        ExitCode::FAILURE
    }
}
