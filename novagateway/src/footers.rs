//! The footer cache: decoded flight footers, weighted by their decoded size, evicted at
//! `--footer-cache-bytes`. One footer serves every stream's reads of its flight, and concurrent
//! misses on one object share a single fetch.

use std::sync::Arc;

use moka::future::Cache;

use nova_core::budget::Budget;
use nova_core::flight::{
    FetchError, FlightFooter, FormatError, ObjectFooter, SUGGESTED_TAIL_READ, SectionEntry,
    fetch_footer,
};
use nova_core::object_store::ObjectStore;

use crate::metrics::GatewayMetrics;

#[derive(Clone)]
pub struct Footers {
    cache: Cache<String, Arc<FlightFooter>>,
    store: Arc<dyn ObjectStore>,
    metrics: GatewayMetrics,
    /// The fetch pool: a footer being fetched and decoded is charged to it.
    pool: Budget,
}

/// What a footer fetch is charged while it runs: the 64 KiB tail read and the footer decoded
/// from it. (A footer longer than the tail read, rare, is read whole in a second request.)
pub const FOOTER_FETCH_CHARGE: u64 = 2 * SUGGESTED_TAIL_READ;

/// What a decoded footer occupies in memory.
fn weight(footer: &FlightFooter) -> u32 {
    let entries: usize = footer
        .sections
        .iter()
        .map(|s| std::mem::size_of::<SectionEntry>() + s.stream.len())
        .sum();
    (std::mem::size_of::<FlightFooter>() + footer.meta.star.len() + entries).min(u32::MAX as usize)
        as u32
}

impl Footers {
    pub fn new(
        capacity: u64,
        store: Arc<dyn ObjectStore>,
        metrics: GatewayMetrics,
        pool: Budget,
    ) -> Self {
        metrics.footer_cache_capacity.set(capacity as i64);
        let cache = Cache::builder()
            .max_capacity(capacity)
            .weigher(|_key: &String, footer: &Arc<FlightFooter>| weight(footer))
            .build();
        Self {
            cache,
            store,
            metrics,
            pool,
        }
    }

    /// The footer of the flight at `key`.
    pub async fn get(&self, key: &str) -> Result<Arc<FlightFooter>, Arc<FetchError>> {
        let store = self.store.clone();
        let pool = self.pool.clone();
        let owned = key.to_owned();
        let entry = self
            .cache
            .entry(owned.clone())
            .or_try_insert_with(async move {
                let _charge = pool.acquire(FOOTER_FETCH_CHARGE).await;
                match fetch_footer(store.as_ref(), &owned).await? {
                    ObjectFooter::Flight(footer) => Ok(Arc::new(footer)),
                    ObjectFooter::Fence(_) => Err(FetchError::Format {
                        key: owned,
                        source: FormatError::Corrupt(
                            "a ref points at a fence, not a flight".into(),
                        ),
                    }),
                }
            })
            .await?;
        if entry.is_fresh() {
            self.metrics.footer_cache_misses.inc();
            // moka applies evictions (and its weight) in batches, later; settle them now, at
            // the cost of a fetch anyway, so the cache is at its capacity when the gauge says.
            self.cache.run_pending_tasks().await;
        } else {
            self.metrics.footer_cache_hits.inc();
        }
        self.metrics
            .footer_cache_bytes
            .set(self.cache.weighted_size() as i64);
        Ok(entry.into_value())
    }
}
