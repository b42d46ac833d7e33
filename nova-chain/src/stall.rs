//! Stalls: a budget ran out and admitted work is blocked behind it. Each stall is counted and
//! logged once when it starts and once when it ends, with the cause diagnosed at the start,
//! never once per blocked append.

use nova_core::clock::{Clock, Instant};
use std::sync::Arc;

use crate::metrics::Metrics;

/// Why a stall happened; each cause calls for a different operator action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallCause {
    /// The absorb is healthy but behind: it retires flights slower than they land.
    AbsorbLag,
    /// Absorb commits are slow or failing in the metastore.
    MetastoreSlow,
    /// Flight writes are failing or hanging in the object store.
    ObjectStoreUnavailable,
    /// Flight writes are refused with an error retrying alone will not fix (credentials, a
    /// missing bucket, a request the backend does not support).
    ObjectStoreRejecting,
    /// A predecessor's chain is still being settled (reserved for takeover).
    PredecessorSettling,
    /// No fault: producers send faster than flights can be written. Admission blocking is the
    /// intended backpressure here; it is counted so saturation is visible, and logged at info.
    WriteThroughput,
    /// Fewer than a quorum of express zones answer: the express chain cannot be sealed, and
    /// Express appends are refused until it can.
    ExpressZoneUnreachable,
}

impl StallCause {
    pub fn as_str(self) -> &'static str {
        match self {
            StallCause::AbsorbLag => "absorb_lag",
            StallCause::MetastoreSlow => "metastore_slow",
            StallCause::ObjectStoreUnavailable => "object_store_unavailable",
            StallCause::ObjectStoreRejecting => "object_store_rejecting",
            StallCause::PredecessorSettling => "predecessor_settling",
            StallCause::WriteThroughput => "write_throughput",
            StallCause::ExpressZoneUnreachable => "express_zone_unreachable",
        }
    }
}

/// An ongoing stall; dropping it ends the stall and logs its duration.
#[derive(Debug)]
pub struct Stall {
    metrics: Arc<Metrics>,
    budget: &'static str,
    cause: StallCause,
    clock: Clock,
    started: Instant,
    /// Time actually spent blocked, when the stall is an episode of separate waits; `None`
    /// counts the stall's whole life.
    blocked: Option<std::time::Duration>,
}

impl Stall {
    pub fn begin(
        metrics: Arc<Metrics>,
        clock: Clock,
        budget: &'static str,
        cause: StallCause,
        detail: &str,
    ) -> Self {
        metrics
            .stalls
            .with_label_values(&[budget, cause.as_str()])
            .inc();
        if cause == StallCause::WriteThroughput {
            tracing::info!(
                budget,
                cause = cause.as_str(),
                "{budget} full, appends wait: {detail}"
            );
        } else {
            tracing::warn!(
                budget,
                cause = cause.as_str(),
                "{budget} exhausted, appends are blocked: {detail}"
            );
        }
        Self {
            metrics,
            budget,
            cause,
            clock,
            started: clock.now(),
            blocked: None,
        }
    }

    /// A stall made of separate waits (one per flight that waits for the backlog): counted and
    /// logged once, with only the time spent waiting added to its seconds, as each wait ends.
    pub fn begin_episode(
        metrics: Arc<Metrics>,
        clock: Clock,
        budget: &'static str,
        cause: StallCause,
        detail: &str,
    ) -> Self {
        let mut stall = Self::begin(metrics, clock, budget, cause, detail);
        stall.blocked = Some(std::time::Duration::ZERO);
        stall
    }

    /// Adds one wait of an episode.
    pub fn waited(&mut self, wait: std::time::Duration) {
        if let Some(blocked) = &mut self.blocked {
            *blocked += wait;
            self.metrics
                .stall_seconds
                .with_label_values(&[self.budget, self.cause.as_str()])
                .inc_by(wait.as_secs_f64());
        }
    }
}

impl Stall {
    pub fn cause(&self) -> StallCause {
        self.cause
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        let seconds = match self.blocked {
            Some(blocked) => blocked.as_secs_f64(),
            None => {
                let seconds = self.clock.since(self.started).as_secs_f64();
                self.metrics
                    .stall_seconds
                    .with_label_values(&[self.budget, self.cause.as_str()])
                    .inc_by(seconds);
                seconds
            }
        };
        tracing::info!(
            budget = self.budget,
            cause = self.cause.as_str(),
            seconds,
            "{} stall ended after {seconds:.3}s",
            self.budget
        );
    }
}
