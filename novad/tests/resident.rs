//! Resident memory, not only the budgets' accounting, within the star's memory formula: 200
//! concurrent cold readers of 8 MiB pages against the default 64 MiB read budget. The OOM
//! killer counts RSS; an allocator that keeps what the readers freed (glibc untuned kept over a
//! gigabyte here) would be killed long before any budget is reached.

use nova_testkit::cold_readers::ColdReaders;
use nova_testkit::outage::star_overhead_bytes;
use nova_testkit::{NovadBuilder, workspace_binary};

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_cold_readers_stay_within_the_formula_in_resident_memory() {
    let mut star = NovadBuilder::new(workspace_binary("novad"))
        // A small tail cache, so that the readers' pages come from the object store, and a
        // small admission buffer, so that the formula is mostly the 64 MiB read budget and
        // the bound below is tight (80 MiB of formula, 192 MiB with overhead and slack).
        .args(["--tail-window-cache-mib", "8", "--auditor", "false"])
        .args(["--s3-memory-buffer-mib", "8", "--max-batch-bytes", "2MiB"])
        .start();
    let scenario = ColdReaders::default();
    let near_idle = 48 * MIB;
    let report = scenario.run(&mut star, near_idle).await;
    eprintln!("{report:#?}");
    assert!(
        report.bytes_read >= (scenario.readers * scenario.pages) as u64 * scenario.page_bytes,
        "every reader read its pages: {report:?}"
    );
    // The formula, the fixed overhead docs/backpressure.md states (no producer sessions are
    // open), and the 64 MiB of slack the issue allows.
    let bound = report.formula_bytes + star_overhead_bytes(0) + 64 * MIB;
    assert!(
        report.peak_rss <= bound,
        "peak RSS {} MiB over the formula {} MiB + overhead + 64 MiB ({} MiB): {report:?}",
        report.peak_rss / MIB,
        report.formula_bytes / MIB,
        bound / MIB
    );
    assert!(
        report.rss_settled <= report.idle_rss + near_idle,
        "RSS {} MiB did not come back near idle ({} MiB) within {:?}: {report:?}",
        report.rss_settled / MIB,
        report.idle_rss / MIB,
        scenario.settle
    );
}
