//! The one place Nova's object-store wrappers are put together, so every process layers them
//! the same way: the backend and its concurrency limits innermost (a request waiting for a slot
//! is not yet a request to S3), then whichever of the metrics and the auditor's request-rate
//! budget the process wants, outward from there.

use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;
use crate::metrics::StoreMetrics;
use crate::rate::RateBudget;

use super::{Instrumented, LocalStore, ObjectStore, RateLimited, RateLimitedMetrics, StoreLimits};

/// Where a store's objects live.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A bucket, through aws-sdk-s3.
    #[cfg(feature = "s3")]
    S3(super::S3Config),
    /// A local directory. `writer` says whether this process owns it (clears its temporary
    /// files on open) or reads beside another process that does.
    Local { root: PathBuf, writer: bool },
}

/// An object store with its wrappers, built outward from the backend.
pub struct StoreStack {
    store: Arc<dyn ObjectStore>,
}

impl StoreStack {
    /// Opens `backend` within `limits`: S3 behind a [`ConcurrencyLimited`] with the limits'
    /// concurrency, a local directory with the limits applied by the store itself.
    pub async fn open(backend: Backend, limits: StoreLimits) -> std::io::Result<Self> {
        let store: Arc<dyn ObjectStore> = match backend {
            #[cfg(feature = "s3")]
            Backend::S3(mut config) => {
                let (reads, writes) = (limits.read_concurrency, limits.write_concurrency);
                config.limits = limits;
                Arc::new(super::ConcurrencyLimited::new(
                    Arc::new(super::S3Store::new(config).await),
                    reads,
                    writes,
                ))
            }
            Backend::Local { root, writer: true } => Arc::new(LocalStore::open(root, limits)?),
            Backend::Local {
                root,
                writer: false,
            } => Arc::new(LocalStore::open_shared(root, limits)?),
        };
        Ok(Self { store })
    }

    /// Continues from a store another layer opened (a process hands its libraries the store
    /// it opened; tests hand in a fault-injecting one).
    pub fn over(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Counts and times every request in `metrics`.
    pub fn instrumented(self, metrics: StoreMetrics, clock: Clock) -> Self {
        Self::over(Arc::new(Instrumented::new(self.store, metrics, clock)))
    }

    /// Holds every request to `budget` requests per second.
    pub fn rate_limited(self, budget: RateBudget, metrics: RateLimitedMetrics) -> Self {
        Self::over(Arc::new(RateLimited::new(self.store, budget, metrics)))
    }

    pub fn build(self) -> Arc<dyn ObjectStore> {
        self.store
    }
}
