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
    /// Run fleet seeds (two to five stars on one store and etcd, killed, paused, cut off,
    /// saturated, restarted) instead of single-star ones.
    #[arg(long)]
    fleet: bool,
}

/// Log lines carry the simulated time (tokio's paused clock) since the first line, so a seed's
/// events can be read in order against its plan.
struct SimulatedTime;

impl tracing_subscriber::fmt::time::FormatTime for SimulatedTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        static ORIGIN: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
        let origin = *ORIGIN.get_or_init(tokio::time::Instant::now);
        let at = tokio::time::Instant::now().saturating_duration_since(origin);
        write!(w, "{:>9.3}s", at.as_secs_f64())
    }
}

fn main() {
    let args = Args::parse();
    if args.verbose {
        tracing_subscriber::fmt()
            .with_timer(SimulatedTime)
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
    let failed = if args.fleet {
        run_fleet(&args, seeds, started)
    } else {
        run_stars(&args, seeds, started)
    };
    if !failed.is_empty() {
        eprintln!("{} seeds failed: {failed:?}", failed.len());
        std::process::exit(1);
    }
}

/// Reports a failing seed; exits at once unless `--keep-going`.
fn failed(args: &Args, failure: &nova_sim::Failure, failed: &mut Vec<u64>) {
    eprintln!("{failure}");
    if !args.keep_going {
        std::process::exit(1);
    }
    failed.push(failure.seed);
}

fn run_stars(args: &Args, seeds: std::ops::Range<u64>, started: Instant) -> Vec<u64> {
    let (mut runs, mut records, mut crashes, mut simulated) = (0u64, 0u64, 0usize, 0f64);
    let mut audited = nova_sim::Audited::default();
    let mut failures = Vec::new();
    for seed in seeds {
        match nova_sim::run_seed(seed) {
            Ok(report) => {
                runs += 1;
                records += report.acked_records;
                crashes += report.crashes;
                simulated += report.simulated.as_secs_f64();
                audited.add(&report.audited);
                if args.seed.is_some() {
                    println!("{report:#?}");
                }
            }
            Err(failure) => failed(args, &failure, &mut failures),
        }
    }
    // The totals of the seeds that ran clean, failures or not (those are listed after).
    {
        let a = audited;
        println!(
            "{runs} seeds clean: {records} acknowledged records, {crashes} crashes, \
             {simulated:.0} s simulated, {} flights settled, {} settled objects merged, \
             {} records trimmed and {} objects collected by the auditor (clock faults: {} trims \
             refused, {} queued deletions re-dated; {} merges rejected on a lenient store), \
             in {:.1} s",
            a.settled_flights,
            a.merged_objects,
            a.trimmed_records,
            a.collected_objects,
            a.refused_trims,
            a.redated_garbage,
            a.rejected_merges,
            started.elapsed().as_secs_f64()
        );
    }
    failures
}

fn run_fleet(args: &Args, seeds: std::ops::Range<u64>, started: Instant) -> Vec<u64> {
    let mut total = nova_sim::fleet::Counters::default();
    let (mut runs, mut records, mut handoffs, mut takeovers, mut simulated) =
        (0u64, 0u64, 0u64, 0u64, 0f64);
    let mut failures = Vec::new();
    for seed in seeds {
        match nova_sim::run_fleet_seed(seed) {
            Ok(report) => {
                runs += 1;
                records += report.acked_records;
                handoffs += report.handoffs;
                takeovers += report.takeovers;
                simulated += report.simulated.as_secs_f64();
                total.add(&report.counters);
                if args.seed.is_some() {
                    println!("{report:#?}");
                }
            }
            Err(failure) => failed(args, &failure, &mut failures),
        }
    }
    {
        println!(
            "{runs} fleet seeds clean: {records} acknowledged records, {} star starts, {} kills, \
             {} pauses, {} cut-offs, {} drains, {} lease losses, {} saturations, {} rolling \
             restarts, {handoffs} handoffs, {takeovers} takeovers, {:.1} simulated hours, in \
             {:.1} s",
            total.starts,
            total.kills,
            total.pauses,
            total.cuts,
            total.leaves,
            total.lease_exits,
            total.saturations,
            total.rolling_restarts,
            simulated / 3600.0,
            started.elapsed().as_secs_f64()
        );
    }
    failures
}
