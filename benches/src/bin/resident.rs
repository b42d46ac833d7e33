//! Resident memory under four allocators, side by side in one run: Nova's tuned glibc (the
//! default), glibc untuned (`NOVA_MALLOC_TUNING=off`), and jemalloc and mimalloc preloaded
//! (Debian's libjemalloc2 and libmimalloc2.0, each at its defaults). Three scenarios: 200 cold
//! readers of 8 MiB pages, an object-store outage under 200 producer sessions, and the same
//! with 4,096 sessions. Prints a table, then one JSON line per run. Run it through
//! `benches/resident.sh`; docs/budgets.md keeps the figures.

use std::time::Duration;

use nova_benches::arg;
use nova_testkit::cold_readers::ColdReaders;
use nova_testkit::outage::{OutageScenario, run};
use nova_testkit::{Fault, NovadBuilder, workspace_binary};

const MIB: f64 = (1 << 20) as f64;

/// (name, environment for novad); a preloaded library that is missing skips its variant.
fn variants() -> Vec<(&'static str, Vec<(String, String)>)> {
    let preload = |path: &str| vec![("LD_PRELOAD".to_owned(), path.to_owned())];
    let mut all = vec![
        ("nova (tuned glibc)", Vec::new()),
        (
            "glibc untuned",
            vec![("NOVA_MALLOC_TUNING".to_owned(), "off".to_owned())],
        ),
    ];
    for (name, path) in [
        ("jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
        ("mimalloc", "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"),
    ] {
        if std::path::Path::new(path).exists() {
            all.push((name, preload(path)));
        } else {
            eprintln!("{name}: {path} is missing (apt-get install libjemalloc2 libmimalloc2.0)");
        }
    }
    all
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let readers = ColdReaders {
        readers: arg("--readers", 200) as usize,
        ..ColdReaders::default()
    };
    let mut lines = Vec::new();
    println!(
        "{:<20} {:<22} {:>9} {:>9} {:>9} {:>9} {:>11} {:>8}",
        "allocator", "scenario", "formula", "idle", "peak", "end", "after 60 s", "seconds"
    );
    for (name, env) in variants() {
        // Cold readers.
        let mut builder = NovadBuilder::new(workspace_binary("novad")).args([
            "--tail-window-cache-mib",
            "8",
            "--auditor",
            "false",
        ]);
        for (key, value) in &env {
            builder = builder.env(key, value);
        }
        let mut star = builder.start();
        let report = runtime.block_on(readers.run(&mut star, 0));
        drop(star);
        println!(
            "{name:<20} {:<22} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>11.0} {:>8.1}",
            "cold readers",
            report.formula_bytes as f64 / MIB,
            report.idle_rss as f64 / MIB,
            report.peak_rss as f64 / MIB,
            report.rss_at_end as f64 / MIB,
            report.rss_settled as f64 / MIB,
            report.read_seconds
        );
        lines.push(serde_json::json!({
            "allocator": name, "scenario": "cold_readers",
            "formula_mib": report.formula_bytes as f64 / MIB,
            "idle_mib": report.idle_rss as f64 / MIB,
            "peak_mib": report.peak_rss as f64 / MIB,
            "end_mib": report.rss_at_end as f64 / MIB,
            "after_60s_mib": report.rss_settled as f64 / MIB,
            "read_seconds": report.read_seconds,
        }));

        // Outages, with 200 and with 4,096 producer sessions.
        for sessions in [200usize, arg("--many-sessions", 4096) as usize] {
            let mut scenario = OutageScenario::new(workspace_binary("novad"));
            scenario.sessions = sessions;
            scenario.streams = (sessions / 20).max(1);
            scenario.outage = Duration::from_secs(arg("--outage-secs", 30));
            scenario.fault = Fault::Hang;
            scenario.drain_timeout = Duration::from_secs(600);
            scenario.env = env.clone();
            let overhead = scenario.overhead_bytes();
            let report = runtime.block_on(run(scenario));
            let label = format!("outage, {sessions} sessions");
            println!(
                "{name:<20} {label:<22} {:>9.0} {:>9.0} {:>9.0} {:>9} {:>11} {:>8}",
                (report.formula_bytes + overhead) as f64 / MIB,
                report.rss_before_outage as f64 / MIB,
                report.peak_rss_overall as f64 / MIB,
                "-",
                "-",
                "-"
            );
            lines.push(serde_json::json!({
                "allocator": name, "scenario": label,
                "formula_plus_overhead_mib": (report.formula_bytes + overhead) as f64 / MIB,
                "before_mib": report.rss_before_outage as f64 / MIB,
                "peak_during_outage_mib": report.peak_rss_during_outage as f64 / MIB,
                "peak_mib": report.peak_rss_overall as f64 / MIB,
                "lost_or_duplicated": report.mismatches.len(),
            }));
        }
    }
    for line in lines {
        println!("{line}");
    }
}
