//! The outage soak: the outage test at scale (by default 1,000 producer sessions and a
//! five-minute object-store outage), reporting novad's peak resident memory against its closed
//! formula plus the stated fixed overhead. Run it through `benches/outage-soak.sh`.

use std::process::ExitCode;
use std::time::Duration;

use nova_benches::arg;
use nova_testkit::outage::{OutageScenario, run};
use nova_testkit::{Fault, workspace_binary};

fn main() -> ExitCode {
    let mut scenario = OutageScenario::new(workspace_binary("novad"));
    scenario.sessions = arg("--sessions", 1000) as usize;
    scenario.streams = (scenario.sessions / 20).max(1);
    scenario.admission_mib = arg("--admission-mib", 32);
    scenario.tail_mib = arg("--tail-mib", 16);
    scenario.outage = Duration::from_secs(arg("--outage-secs", 300));
    scenario.warmup = Duration::from_secs(arg("--warmup-secs", 10));
    scenario.fault = if std::env::args().any(|a| a == "--refuse") {
        Fault::Refuse
    } else {
        Fault::Hang
    };
    scenario.drain_timeout = Duration::from_secs(600);
    println!(
        "outage soak: {} sessions over {} streams, admission {} MiB, tail {} MiB, {:?} outage ({:?}), \
         against moto server through a fault proxy",
        scenario.sessions,
        scenario.streams,
        scenario.admission_mib,
        scenario.tail_mib,
        scenario.outage,
        scenario.fault
    );
    let overhead = scenario.overhead_bytes();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = runtime.block_on(run(scenario));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let limit = report.formula_bytes + overhead;
    println!(
        "formula (admission + tail + sessions × 64 KiB + auditor): {:>8.1} MiB",
        mib(report.formula_bytes)
    );
    println!(
        "stated overhead (48 MiB + per session slot):    {:>8.1} MiB",
        mib(overhead)
    );
    println!(
        "bound:                                          {:>8.1} MiB",
        mib(limit)
    );
    println!(
        "RSS before the outage:                          {:>8.1} MiB",
        mib(report.rss_before_outage)
    );
    println!(
        "peak RSS during the outage:                     {:>8.1} MiB",
        mib(report.peak_rss_during_outage)
    );
    println!(
        "peak RSS over the run (VmHWM):                  {:>8.1} MiB",
        mib(report.peak_rss_overall)
    );
    println!(
        "peak during the outage / bound:                 {:>8.2}",
        report.peak_rss_during_outage as f64 / limit as f64
    );
    let last_age = report.age_samples.last().map_or(0.0, |(_, age)| *age);
    println!("oldest admitted age at the end of the outage:   {last_age:>8.1} s");
    println!(
        "records acknowledged: {} before, {} during, {} in all; batches sent {}, acknowledged {}",
        report.acked_before_outage,
        report.acked_during_outage,
        report.acked_total,
        report.sent_batches,
        report.acked_batches
    );
    println!("sessions cut: {}", report.sessions_cut.len());
    println!(
        "records missing, duplicated or out of order: {}",
        report.mismatches.len()
    );
    for line in &report.stall_log {
        println!("  novad: {line}");
    }
    let ok = report.peak_rss_during_outage <= limit
        && report.sessions_cut.is_empty()
        && report.mismatches.is_empty()
        && report.sent_batches == report.acked_batches;
    println!("{}", if ok { "PASS" } else { "FAIL" });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
