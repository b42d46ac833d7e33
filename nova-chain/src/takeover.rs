//! Taking over a departed star's chain, in a fleet: a surviving star settles what the departed
//! one acknowledged, exactly as the departed star's own recovery would have at its restart. It
//! fences the chain at its first empty slot (so the predecessor, if it is only paused, can never
//! acknowledge past it), absorbs every landed slot before the fence into the index, and moves
//! the chain to a fresh epoch. Only then may the predecessor's streams be led elsewhere.

use std::sync::Arc;

use crate::metrics::Metrics;
use nova_core::catalog::Catalog;
use nova_core::object_store::ObjectStore;

use crate::config::{Backoff, Leaders};
use crate::express::ExpressConfig;
use crate::express::collect::Collector;
use crate::express::recover::recover_express;
use crate::recovery::{LeaderCheck, Recovered, RecoveryError, patiently, recover};
use crate::star::{StartError, check_no_express_chain};
use crate::streams::StreamRegistry;

/// Settles `predecessor`'s chain. `None` when the catalog holds no chain for it (it never
/// wrote one, or another survivor already took it over and it left no trace).
#[allow(clippy::too_many_arguments)]
pub async fn take_over(
    predecessor: &str,
    store: &Arc<dyn ObjectStore>,
    catalog: &Catalog,
    backoff: &Backoff,
    max_streams: usize,
    express: Option<&ExpressConfig>,
    successor: &str,
    leaders: Option<&dyn Leaders>,
) -> Result<Option<Recovered>, StartError> {
    let chain = patiently("reading the predecessor's chain", backoff, || {
        catalog.chain(predecessor)
    })
    .await
    .map_err(crate::recovery::RecoveryError::Catalog)?;
    if chain.is_none() {
        return Ok(None);
    }
    // Before the tails are read: no absorb the predecessor already sent can land after this.
    crate::recovery::claim_chain(predecessor, catalog, backoff).await?;
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
    // One answer per stream for both walks.
    let led = LeaderCheck::new(predecessor, leaders, backoff);
    let mut recovered = recover(predecessor, store, catalog, &streams, backoff, &led).await?;
    // The predecessor's express chain, too, may hold acknowledged records.
    match express {
        Some(express) => {
            let (chain, _) = recover_express(
                predecessor,
                express,
                store,
                catalog,
                &streams,
                recovered.chain,
                // Unique to this settling, as a restart's is: a fence of an earlier one is
                // not taken for this walk's own.
                &format!("{successor}/{}", recovered.chain.state.epoch),
                backoff,
                &led,
            )
            .await?;
            recovered.chain = chain;
            let checkpoint = patiently("reading the express checkpoint", backoff, || {
                catalog.express_checkpoint(predecessor)
            })
            .await
            .map_err(RecoveryError::Catalog)?;
            if let Some(checkpoint) = checkpoint {
                // Its copies are collected once here (the predecessor no longer writes them;
                // its fences stay, should it be only paused).
                let mut collector =
                    Collector::new(express.zones.clone(), predecessor.to_owned(), store.clone());
                tokio::spawn(async move { collector.drain(&checkpoint).await });
            }
        }
        None => check_no_express_chain(predecessor, catalog, store, backoff).await?,
    }
    Ok(Some(recovered))
}
