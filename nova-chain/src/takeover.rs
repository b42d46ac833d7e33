//! Taking over a departed star's chain, in a fleet: a surviving star settles what the departed
//! one acknowledged, exactly as the departed star's own recovery would have at its restart. It
//! fences the chain at its first empty slot (so the predecessor, if it is only paused, can never
//! acknowledge past it), absorbs every landed slot before the fence into the index, and moves
//! the chain to a fresh epoch. Only then may the predecessor's streams be led elsewhere.

use std::sync::Arc;

use nova_core::catalog::Catalog;
use nova_core::metrics::Metrics;
use nova_core::object_store::ObjectStore;

use crate::config::Backoff;
use crate::recovery::{Recovered, patiently, recover};
use crate::star::StartError;
use crate::streams::StreamRegistry;

/// Settles `predecessor`'s chain. `None` when the catalog holds no chain for it (it never
/// wrote one, or another survivor already took it over and it left no trace).
pub async fn take_over(
    predecessor: &str,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
    backoff: &Backoff,
    max_streams: usize,
) -> Result<Option<Recovered>, StartError> {
    let chain = patiently("reading the predecessor's chain", backoff, || {
        catalog.chain(predecessor)
    })
    .await
    .map_err(crate::recovery::RecoveryError::Catalog)?;
    if chain.is_none() {
        return Ok(None);
    }
    // The streams at their absorbed tails, read now: the predecessor's absorbs are what the
    // settling continues from. Its own registry is the catalog's, with metrics of its own so
    // this star's gauges stay about this star.
    let streams = patiently("loading the catalog for a takeover", backoff, || {
        StreamRegistry::load(
            catalog.clone(),
            store.clone(),
            predecessor,
            Arc::new(Metrics::new()),
            backoff.clock,
            max_streams,
        )
    })
    .await?;
    Ok(Some(
        recover(predecessor, store, catalog, &streams, backoff).await?,
    ))
}
