//! `nova-sim`: runs simulation seeds. `--seed N` replays one; `--seeds N --from S` runs a
//! range (a soak). Exits non-zero on the first failing seed, after printing how to replay it.

use std::time::Instant;

use clap::Parser;

#[derive(Parser)]
#[command(
    about = "Runs Nova's deterministic simulation: the real star under a simulated clock, \
object store and metastore, crashed and restarted, checked after every run"
)]
struct Args {
    /// Replay exactly this seed.
    #[arg(long)]
    seed: Option<u64>,
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed of the range.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Print the star's logs (useful with --seed).
    #[arg(long)]
    verbose: bool,
    /// Run every seed of the range, failing or not, and list the failing ones at the end.
    #[arg(long)]
    keep_going: bool,
}

fn main() {
    let args = Args::parse();
    if args.verbose {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .init();
    }
    let seeds = match args.seed {
        Some(seed) => seed..seed + 1,
        None => args.from..args.from + args.seeds,
    };
    let started = Instant::now();
    let (mut runs, mut records, mut crashes, mut simulated) = (0u64, 0u64, 0usize, 0f64);
    let (mut settled, mut collected, mut merged, mut trimmed) = (0u64, 0u64, 0u64, 0u64);
    let mut failed = Vec::new();
    for seed in seeds {
        match nova_sim::run_seed(seed) {
            Ok(report) => {
                runs += 1;
                records += report.acked_records;
                crashes += report.crashes;
                simulated += report.simulated.as_secs_f64();
                settled += report.settled_flights;
                collected += report.collected_objects;
                merged += report.merged_objects;
                trimmed += report.trimmed_records;
                if args.seed.is_some() {
                    println!("{report:#?}");
                }
            }
            Err(failure) => {
                eprintln!("{failure}");
                if !args.keep_going {
                    std::process::exit(1);
                }
                failed.push(seed);
            }
        }
    }
    if !failed.is_empty() {
        eprintln!("{} seeds failed: {failed:?}", failed.len());
        std::process::exit(1);
    }
    println!(
        "{runs} seeds clean: {records} acknowledged records, {crashes} crashes, \
         {simulated:.0} s simulated, {settled} flights settled, {merged} settled objects merged, \
         {trimmed} records trimmed and {collected} objects collected by the auditor, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
