//! An object-store outage cannot OOM a star: with small budgets, hundreds of producer sessions
//! appending continuously and the S3-compatible server unreachable for 30 seconds, novad's
//! resident memory stays under its closed formula plus a fixed overhead, the oldest-admitted age
//! grows until the shipped alert would fire, no session is cut, and once the store is back every
//! blocked append completes and every acknowledged record is there exactly once, in order.

use std::time::Duration;

use nova_testkit::outage::{OutageScenario, run};
use nova_testkit::{Fault, workspace_root};

/// The threshold of the shipped alert on the oldest admitted age, read from ops/alerts.yml.
fn alert_threshold() -> f64 {
    let rules =
        std::fs::read_to_string(workspace_root().join("ops/alerts.yml")).expect("ops/alerts.yml");
    let expr = rules
        .lines()
        .find(|l| l.contains("expr:") && l.contains("nova_oldest_admitted_age_seconds >"))
        .expect("an alert on nova_oldest_admitted_age_seconds");
    expr.rsplit('>')
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("a numeric threshold")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_store_outage_cannot_oom_the_star() {
    let mut scenario = OutageScenario::new(env!("CARGO_BIN_EXE_novad").into());
    scenario.sessions = 200;
    scenario.admission_mib = 32;
    scenario.tail_mib = 16;
    scenario.outage = Duration::from_secs(30);
    scenario.fault = Fault::Hang;
    let report = run(scenario.clone()).await;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "formula {:.1} MiB, RSS before {:.1} MiB, peak during the outage {:.1} MiB, peak overall {:.1} MiB; \
         acked {} records before, {} during, {} in all; ages {:?}",
        mib(report.formula_bytes),
        mib(report.rss_before_outage),
        mib(report.peak_rss_during_outage),
        mib(report.peak_rss_overall),
        report.acked_before_outage,
        report.acked_during_outage,
        report.acked_total,
        report.age_samples,
    );
    for line in &report.stall_log {
        println!("{line}");
    }

    assert!(
        report.sessions_cut.is_empty(),
        "sessions were cut: {:?}",
        report.sessions_cut
    );
    assert!(
        report.mismatches.is_empty(),
        "records lost or duplicated: {:?}",
        &report.mismatches[..report.mismatches.len().min(10)]
    );
    assert_eq!(
        report.sent_batches, report.acked_batches,
        "every blocked append completed"
    );
    assert!(
        report.acked_before_outage > 0,
        "appends flowed before the outage"
    );
    assert!(
        report.acked_total > report.acked_before_outage + report.acked_during_outage,
        "and after it"
    );

    let overhead = scenario.overhead_bytes();
    let limit = report.formula_bytes + overhead;
    assert!(
        report.peak_rss_during_outage <= limit,
        "peak RSS {:.1} MiB during the outage is over the formula {:.1} MiB + overhead {:.1} MiB",
        mib(report.peak_rss_during_outage),
        mib(report.formula_bytes),
        mib(overhead)
    );
    let admission = (scenario.admission_mib << 20) as f64;
    assert!(
        report.admission_used_during_outage <= admission,
        "admission stayed in its budget"
    );
    assert!(
        report.admission_used_during_outage > admission / 2.0,
        "admission filled during the outage"
    );

    let ages: Vec<f64> = report.age_samples.iter().map(|(_, age)| *age).collect();
    assert!(
        ages.len() >= 10,
        "the age was sampled through the outage: {ages:?}"
    );
    assert!(
        ages.windows(2).filter(|w| w[1] > w[0]).count() >= ages.len() / 2,
        "the oldest admitted age grows: {ages:?}"
    );
    let threshold = alert_threshold();
    assert!(
        ages.last().copied().unwrap_or(0.0) > threshold,
        "the alert (age > {threshold}s) would fire by the end of the outage: {ages:?}"
    );
    assert!(
        report
            .stall_log
            .iter()
            .any(|l| l.contains("object_store_unavailable")),
        "the stall is logged with its cause"
    );
}
