//! The fleet simulation as a test: five hundred fleet seeds (split in four so both cores
//! work), the seeds that found the fleet's defects, and proof that a fleet seed replays
//! exactly. A failure prints the command that replays the seed with every star's logs.

use nova_sim::run_fleet_seed;

/// Fleet seeds `NOVA_FLEET_SIM_FROM..+NOVA_FLEET_SIM_SEEDS` (default 0..500), this test's
/// quarter of them.
fn run_quarter(quarter: u64) {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (from, seeds) = (
        var("NOVA_FLEET_SIM_FROM", 0),
        var("NOVA_FLEET_SIM_SEEDS", 500),
    );
    let per = seeds.div_ceil(4);
    let start = from + quarter * per;
    let end = (start + per).min(from + seeds);
    let (mut acked, mut takeovers, mut handoffs) = (0, 0, 0);
    for seed in start..end {
        match run_fleet_seed(seed) {
            Ok(report) => {
                acked += report.acked_records;
                takeovers += report.takeovers;
                handoffs += report.handoffs;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    if end > start + 20 {
        assert!(
            acked > 0 && takeovers > 0 && handoffs > 0,
            "fleet seeds {start}..{end}: {acked} records acknowledged, {takeovers} takeovers, \
             {handoffs} handoffs: the workload or the faults are not running"
        );
    }
}

#[test]
fn fleet_seeds_first_quarter() {
    run_quarter(0);
}

#[test]
fn fleet_seeds_second_quarter() {
    run_quarter(1);
}

#[test]
fn fleet_seeds_third_quarter() {
    run_quarter(2);
}

#[test]
fn fleet_seeds_fourth_quarter() {
    run_quarter(3);
}

/// Seeds that found the fleet's defects when their fixes were reverted
/// (`nova-sim/regressions/`): see `FOUND_BY` in each patch.
#[test]
fn fleet_seeds_that_found_defects_stay_clean() {
    let seeds = SPLIT_BRAIN_SEEDS
        .iter()
        .chain(STUCK_TAKEOVER_SEEDS)
        .chain(LATE_ABSORB_SEEDS);
    for seed in seeds {
        if let Err(failure) = run_fleet_seed(*seed) {
            panic!("{failure}");
        }
    }
}

/// Found two stars acknowledging the same sequence numbers after a handoff whose
/// compare-and-set answer was lost (`handoff-defect.patch`): 9 of fleet seeds 0..1000 fail
/// with it (re-drawn at 7066d97, when the seeds first kept had stopped reaching the defect).
const SPLIT_BRAIN_SEEDS: &[u64] = &[134, 143, 169];

/// Found a departed star's chain never settled, its streams without a leader and its restart
/// waiting for ever after a takeover election whose answer was lost
/// (`takeover-election-defect.patch`): 36 of fleet seeds 0..1000 fail with it (re-drawn at
/// 7066d97).
const STUCK_TAKEOVER_SEEDS: &[u64] = &[50, 81, 127];

/// Found a star that could not restart: the last absorb of its killed incarnation, queued at a
/// stalled metastore, landed between the new incarnation's loading of the tails and its reading
/// of the chain (`late-absorb-defect.patch`): 2 of fleet seeds 5000..9999 fail with it (re-drawn
/// at 7066d97; they now fail as a restart refused with "chain moved: another process owns it").
const LATE_ABSORB_SEEDS: &[u64] = &[7291, 8612];

#[test]
fn a_fleet_seed_replays_exactly() {
    for seed in [3, 11] {
        let first = run_fleet_seed(seed).unwrap_or_else(|f| panic!("{f}"));
        let second = run_fleet_seed(seed).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(
            first.digest, second.digest,
            "fleet seed {seed} took another path"
        );
        assert_eq!(first.acked_records, second.acked_records);
        assert_eq!(first.simulated, second.simulated);
        assert!(first.acked_records > 0);
    }
}
