//! Caps on concurrent work that shed rather than block: producer sessions and subscriptions
//! (reads in progress, including those waiting at a stream's tail). Each holder keeps one permit
//! for its whole life; work past the cap is refused at once with RESOURCE_EXHAUSTED, the flag's
//! name and a retry hint, and nothing already admitted is ever cut to make room. Every shed is
//! counted and logged (a burst as one line a second).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use nova_chain::metrics::Metrics;
use nova_proto::RequestError;
use nova_server::shed::ShedLog;

/// Which cap: the flag that sets it, its metric label, and what it counts.
#[derive(Debug, Clone, Copy)]
pub struct CapKind {
    pub flag: &'static str,
    pub label: &'static str,
    pub what: &'static str,
    pub retry_after: Duration,
}

pub const PRODUCER_SESSIONS: CapKind = CapKind {
    flag: "--max-producer-sessions",
    label: "max_producer_sessions",
    what: "every producer session slot is taken; open sessions are never cut",
    retry_after: Duration::from_millis(nova_core::limits::SESSION_SHED_RETRY_AFTER_MS),
};

pub const SUBSCRIPTIONS: CapKind = CapKind {
    flag: "--max-subscriptions",
    label: "max_subscriptions",
    what: "every subscription slot is taken; reads in progress are never cut",
    retry_after: Duration::from_millis(nova_core::limits::SESSION_SHED_RETRY_AFTER_MS),
};

/// The label of a call refused because its token has its share of metastore lookups in flight.
pub const LOOKUP_SHARE: &str = "lookup_share";

/// The label of a read refused because its token holds its share of the subscription places.
pub const SUBSCRIPTION_SHARE: &str = "subscription_share";

#[derive(Debug)]
pub struct Cap {
    kind: CapKind,
    permits: Arc<Semaphore>,
    limit: u32,
    open: IntGauge,
    metrics: Arc<Metrics>,
    sheds: Arc<ShedLog>,
}

/// A holder's place under a cap; dropping it frees the place.
#[derive(Debug)]
pub struct CapPermit {
    _permit: OwnedSemaphorePermit,
    open: IntGauge,
}

impl Drop for CapPermit {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl Cap {
    /// `open` and `capacity` are the gauges this cap reports through.
    pub fn new(
        kind: CapKind,
        limit: u32,
        open: IntGauge,
        capacity: &IntGauge,
        metrics: Arc<Metrics>,
        sheds: Arc<ShedLog>,
    ) -> Self {
        capacity.set(limit as i64);
        Self {
            kind,
            permits: Arc::new(Semaphore::new(limit as usize)),
            limit,
            open,
            metrics,
            sheds,
        }
    }

    pub fn in_use(&self) -> u64 {
        (self.limit as usize - self.permits.available_permits()) as u64
    }

    /// Takes a place for new work from `peer` (on `stream`, when the work names one yet), or
    /// sheds it: counted by cap, tallied by stream and peer, logged naming all three.
    pub fn admit(
        &self,
        peer: Option<SocketAddr>,
        stream: Option<&str>,
    ) -> Result<CapPermit, RequestError> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            self.open.inc();
            return Ok(CapPermit {
                _permit: permit,
                open: self.open.clone(),
            });
        }
        let kind = self.kind;
        let refusal = RequestError::CapReached {
            cap: kind.flag,
            limit: self.limit as u64,
            what: kind.what,
            retry_after: kind.retry_after,
        };
        record_shed(
            &self.metrics,
            &self.sheds,
            kind.label,
            &refusal,
            stream,
            peer,
        );
        Err(refusal)
    }
}

/// Refuses new work from a token that holds its share of something (`label`'s places or
/// lookups, `limit` of them), counted and logged like any shed.
pub fn shed_share(
    metrics: &Metrics,
    sheds: &ShedLog,
    label: &'static str,
    limit: u64,
    what: &'static str,
    stream: &str,
    peer: Option<SocketAddr>,
) -> RequestError {
    let refusal = RequestError::CapReached {
        cap: "--max-client-share-percent",
        limit,
        what,
        retry_after: Duration::from_secs(1),
    };
    record_shed(metrics, sheds, label, &refusal, Some(stream), peer);
    refusal
}

/// Counts one shed under its cap (`nova_sheds_total{cap=label}`), tallies it against the
/// stream and the peer, and logs it naming all three (a burst as one line a second). Every
/// shed of new work goes through here, whichever cap refused it.
pub fn record_shed(
    metrics: &Metrics,
    sheds: &ShedLog,
    label: &'static str,
    refusal: &RequestError,
    stream: Option<&str>,
    peer: Option<SocketAddr>,
) {
    metrics.sheds.with_label_values(&[label]).inc();
    metrics.refused.hit(stream, peer);
    sheds.shed(label, refusal, stream, peer);
}
