//! Drop deleted: a deleted stream's index entries go, a batch per job, and the settled objects
//! that were the stream's alone are queued for collection. Its sections in flights go with the
//! flights. This duty asks the object store nothing.

use nova_core::keys::{data_root, parse_data_key};

use crate::{AuditError, Ctx, Duty, Step};

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let Some(&id) = ctx.catalog.dropping_streams(1).await?.first() else {
        ctx.set_due(Duty::DropDeleted, None);
        return Ok(Step::Idle);
    };
    ctx.mark_due(Duty::DropDeleted);
    let root = data_root(&ctx.config.star);
    let dropped = ctx
        .catalog
        .drop_entries(id, ctx.due_at(), |entry| {
            parse_data_key(&root, &entry.object_key).is_some_and(|k| k.stream_id == id)
        })
        .await?;
    ctx.metrics.dropped_entries.inc_by(dropped as u64);
    if dropped == 0 {
        tracing::info!(stream_id = id, "auditor: a deleted stream's index is gone");
        ctx.set_due(Duty::DropDeleted, None);
    }
    Ok(Step::Done)
}
