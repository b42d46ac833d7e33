//! The producer-session cap. A session holds one permit for its whole life; an open past the cap
//! is shed at once with RESOURCE_EXHAUSTED and a retry hint, and no open session is ever cut to
//! make room.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use nova_core::limits::SESSION_SHED_RETRY_AFTER_MS;
use nova_core::metrics::Metrics;
use nova_core::shed::ShedLog;
use nova_proto::RequestError;

#[derive(Debug)]
pub struct SessionCap {
    permits: Arc<Semaphore>,
    limit: u32,
    metrics: Arc<Metrics>,
    sheds: Arc<ShedLog>,
}

/// An open session's place under the cap.
#[derive(Debug)]
pub struct SessionPermit {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for SessionPermit {
    fn drop(&mut self) {
        self.metrics.producer_sessions.dec();
    }
}

impl SessionCap {
    pub fn new(limit: u32, metrics: Arc<Metrics>, sheds: Arc<ShedLog>) -> Self {
        metrics.producer_sessions_capacity.set(limit as i64);
        Self {
            permits: Arc::new(Semaphore::new(limit as usize)),
            limit,
            metrics,
            sheds,
        }
    }

    pub fn open_sessions(&self) -> u64 {
        (self.limit as usize - self.permits.available_permits()) as u64
    }

    /// Takes a slot for a new session from `peer`, or sheds it.
    pub fn open(&self, peer: Option<std::net::SocketAddr>) -> Result<SessionPermit, RequestError> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.metrics.producer_sessions.inc();
                Ok(SessionPermit {
                    _permit: permit,
                    metrics: self.metrics.clone(),
                })
            }
            Err(_) => {
                self.metrics
                    .sheds
                    .with_label_values(&["max_producer_sessions"])
                    .inc();
                if let Some(unlogged) = self.sheds.admit("max_producer_sessions") {
                    tracing::warn!(
                        cap = "max_producer_sessions",
                        limit = self.limit,
                        peer = ?peer,
                        unlogged_since_last = unlogged,
                        "shed a new producer session: --max-producer-sessions={} are open",
                        self.limit
                    );
                }
                Err(RequestError::CapReached {
                    cap: "--max-producer-sessions",
                    limit: self.limit as u64,
                    what: "every producer session slot is taken; open sessions are never cut",
                    retry_after: Duration::from_millis(SESSION_SHED_RETRY_AFTER_MS),
                })
            }
        }
    }
}
