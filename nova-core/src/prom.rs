//! Prometheus helpers every crate's metrics are made with: registering, the budget's four
//! series, the shared latency buckets, and the text rendering.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The four series every budget exports.
#[derive(Debug, Clone)]
pub struct BudgetMetrics {
    pub capacity: IntGauge,
    pub in_use: IntGauge,
    pub waiters: IntGauge,
    pub wait: Histogram,
}

pub fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    // Names are fixed at compile time and unique in a fresh registry, so this cannot fail.
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered twice");
    c
}

pub fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(r, IntGauge::new(name, help).expect("valid metric"))
}

pub fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(r, IntCounter::new(name, help).expect("valid metric"))
}

pub fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// Buckets from 100µs to about two minutes: waits and latencies both live in this range.
/// 100 µs to 100 s in steps of 1, 2 and 5: fine enough to read a PUT's p99 (a ×4 ladder put
/// 26 ms and 100 ms in one bucket).
pub fn wait_buckets() -> Vec<f64> {
    let mut buckets = Vec::new();
    let mut decade = 0.0001;
    while decade < 100.0 {
        for step in [1.0, 2.0, 5.0] {
            buckets.push(decade * step);
        }
        decade *= 10.0;
    }
    buckets.push(100.0);
    buckets
}

pub fn histogram(r: &Registry, name: &str, help: &str) -> Histogram {
    register(
        r,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(wait_buckets()))
            .expect("valid metric"),
    )
}

/// `unit` with its first letter in capitals, to begin a help sentence.
fn capitalized(unit: &str) -> String {
    let mut chars = unit.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

pub fn budget(r: &Registry, prefix: &str, unit: &str, what: &str) -> BudgetMetrics {
    BudgetMetrics {
        capacity: gauge(
            r,
            &format!("{prefix}_capacity_{unit}"),
            &format!("Capacity of the {what}."),
        ),
        in_use: gauge(
            r,
            &format!("{prefix}_used_{unit}"),
            &format!("{} of the {what} held right now.", capitalized(unit)),
        ),
        waiters: gauge(
            r,
            &format!("{prefix}_waiters"),
            &format!("Callers waiting for room in the {what}."),
        ),
        wait: histogram(
            r,
            &format!("{prefix}_wait_seconds"),
            &format!("Time callers waited for room in the {what}."),
        ),
    }
}

/// Metric families in Prometheus text format.
pub fn render_families(families: &[prometheus::proto::MetricFamily]) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec cannot fail for well-formed metric families.
    let _ = TextEncoder::new().encode(families, &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
