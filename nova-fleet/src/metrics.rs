//! The fleet's metrics. A single star exports them too, as a fleet of one that leads every
//! stream (the rest at zero), so dashboards and alerts work unchanged when it joins a fleet.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Registers `collector` and hands it back.
fn registered<C>(registry: &Registry, collector: C) -> Result<C, prometheus::Error>
where
    C: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

#[derive(Clone)]
pub struct FleetMetrics {
    pub(crate) stars: IntGauge,
    pub(crate) streams_led: IntGauge,
    pub(crate) placements: IntCounter,
    pub(crate) redirects: IntCounter,
    pub(crate) capacity_refusals: IntCounter,
    pub(crate) lease_age: Gauge,
    pub(crate) lease_lost: IntCounterVec,
    pub(crate) takeovers: IntCounter,
    pub(crate) handoffs: IntCounterVec,
    pub(crate) takeover_seconds: Histogram,
    pub(crate) leaderless_age: Gauge,
    pub(crate) waits: IntCounter,
}

impl FleetMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| {
            registered(registry, IntGauge::with_opts(Opts::new(name, help))?)
        };
        let seconds =
            |name: &str, help: &str| registered(registry, Gauge::with_opts(Opts::new(name, help))?);
        let counter = |name: &str, help: &str| {
            registered(registry, IntCounter::with_opts(Opts::new(name, help))?)
        };
        let by = |name: &str, help: &str, label: &str| {
            registered(
                registry,
                IntCounterVec::new(Opts::new(name, help), &[label])?,
            )
        };
        let lease_lost = by(
            "nova_fleet_lease_lost_total",
            "Times this star stopped leading because its fleet lease lapsed, by cause",
            "cause",
        )?;
        let handoffs = by(
            "nova_fleet_handoffs_total",
            "Streams this star handed to another star, by why",
            "reason",
        )?;
        let takeover_seconds = registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "nova_fleet_takeover_seconds",
                    "How long this star took to settle a departed star's chain",
                )
                .buckets(vec![0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0]),
            )?,
        )?;
        Ok(Self {
            handoffs,
            takeovers: counter(
                "nova_fleet_takeovers_total",
                "Departed stars' chains this star settled, so their streams could be led again",
            )?,
            takeover_seconds,
            leaderless_age: seconds(
                "nova_fleet_leaderless_age_seconds",
                "How long the oldest departed star's chain seen here has waited to be taken \
                 over: its streams have no leader meanwhile",
            )?,
            waits: counter(
                "nova_fleet_predecessor_waits_total",
                "Requests that waited for a departed leader's chain to be settled",
            )?,
            stars: gauge(
                "nova_fleet_stars",
                "Stars registered in the fleet, as this star sees it",
            )?,
            streams_led: gauge("nova_fleet_streams_led", "Streams this star leads")?,
            placements: counter(
                "nova_fleet_placements_total",
                "Streams without a leader that this star placed on a star",
            )?,
            redirects: counter(
                "nova_fleet_redirects_total",
                "Requests answered with a redirect to the stream's leader",
            )?,
            capacity_refusals: counter(
                "nova_fleet_capacity_refusals_total",
                "Placements refused because every star is saturated, draining or full",
            )?,
            lease_age: seconds(
                "nova_fleet_lease_age_seconds",
                "Seconds since this star's fleet lease was last renewed",
            )?,
            lease_lost,
        })
    }

    /// A single star is a fleet of one that leads all of its `streams`.
    pub fn alone(&self, streams: usize) {
        self.stars.set(1);
        self.streams_led.set(streams as i64);
    }

    /// Handoffs counted under `reason` so far (for tests and the simulation's report).
    pub fn handoffs(&self, reason: &str) -> u64 {
        self.handoffs.with_label_values(&[reason]).get()
    }

    /// Departed stars' chains settled here so far.
    pub fn takeovers(&self) -> u64 {
        self.takeovers.get()
    }
}
