//! Drop deleted: a deleted stream's index entries go, a batch per job, and the settled objects
//! that were the stream's alone are queued for collection. Its sections in flights go with the
//! flights. A stream whose manifest does not yet say it was deleted keeps its records (a
//! rebuild from the bucket would restore it) until the star marks the manifest. Once its entries
//! are gone, its retention's trim markers are queued too (one LIST).

/// Deleted streams looked at per job: one whose manifest is not marked yet does not hold up
/// the others behind it.
const CANDIDATES: usize = 16;

use nova_core::keys::parse_any_data_key;

use crate::{AuditError, Ctx, Duty, Step};

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let candidates = ctx.catalog.dropping_streams(CANDIDATES).await?;
    let Some((dropping, _)) = candidates.into_iter().find(|(_, marked)| *marked) else {
        ctx.set_due(Duty::DropDeleted, None);
        return Ok(Step::Idle);
    };
    ctx.mark_due(Duty::DropDeleted);
    let id = dropping.id;
    if ctx.catalog.index_entries(id, 0, 1).await?.is_empty() {
        // The last step: the trim markers go before the record of the drop does.
        let markers = crate::retention::markers_in(ctx, id, 0..u64::MAX).await?;
        ctx.catalog.queue_garbage(&markers).await?;
    }
    // Its settled objects go, under whichever star's prefix they are.
    let dropped = ctx
        .catalog
        .drop_entries(&dropping, ctx.due_at(), |entry| {
            parse_any_data_key(&entry.object_key).is_some_and(|k| k.stream_id == id)
        })
        .await?;
    ctx.metrics.dropped_entries.inc_by(dropped as u64);
    if dropped == 0 {
        tracing::info!(stream_id = id, "auditor: a deleted stream's index is gone");
        ctx.set_due(Duty::DropDeleted, None);
    }
    Ok(Step::Done)
}
