//! Collect: deletes what the garbage queue holds once it is due, earliest first.
//!
//! Items come due a grace period (`--auditor-collect-grace-secs`) after the catalog stopped
//! referencing them, so a reader that resolved a ref just before can still fetch it. An object
//! item is claimed before anything is deleted, which refuses a swap whose intent it is; a
//! settled object is also checked against the one index entry that could reference it, so an
//! object a later attempt re-referenced is kept. Runs of chain slots are deleted in slot order
//! and the queue is worked strictly in order, stopping at the first failure, so what is left of
//! an epoch is always a suffix of it (a rebuild relies on that).
//!
//! A settled object deleted as never referenced is deleted once more a grace period later: its
//! writer's PUT may still have been in flight (its intent came due first), and may land after
//! the first delete. No swap can reference it by then (its intent is claimed), so the second
//! delete is safe, and nothing written by the auditor is left behind.

use nova_core::catalog::{Garbage, QueuedGarbage};
use nova_core::keys::{parse_any_data_key, slot_key};

use crate::{AuditError, Ctx, Duty, Step};

/// Queue items read per job.
const PAGE: usize = 100;

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let page = ctx.catalog.garbage_page(PAGE).await?;
    let now = ctx.config.clock.unix_ms();
    match page.first() {
        Some(first) if first.due_ms <= now => ctx.set_due(Duty::Collect, Some(first.due_ms)),
        Some(first) if first.due_ms > latest_honest_due(ctx) => {
            redate_future(ctx).await?;
            return Ok(Step::Done);
        }
        _ => {
            ctx.set_due(Duty::Collect, None);
            return Ok(Step::Idle);
        }
    }
    for item in page.iter().take_while(|item| item.due_ms <= now) {
        collect(ctx, item).await?;
    }
    Ok(Step::Done)
}

/// Items one re-dating job moves: each takes a compare, a delete and a put, and the
/// transaction stays inside etcd's 128 operations.
const REDATE_BATCH: usize = 40;

/// The latest due time an honest clock gives anything queued now (an intent's), and a second
/// for clocks that disagree a little: a due time past it was given by a clock that was ahead.
pub(crate) fn latest_honest_due(ctx: &Ctx) -> u64 {
    ctx.intent_due_at() + 1000
}

/// Brings the earliest items dated past `latest_honest_due` (by a wall clock that was ahead,
/// which would keep them for as long as it was) back to just past it, in their order: what was
/// queued before them still comes due first, so runs of chain slots are still deleted in slot
/// order. Returns how many it moved.
pub(crate) async fn redate_future(ctx: &Ctx) -> Result<usize, AuditError> {
    let floor = latest_honest_due(ctx);
    let page = ctx.catalog.garbage_due_after(floor, REDATE_BATCH).await?;
    let moving: Vec<_> = page
        .into_iter()
        .enumerate()
        .map(|(i, queued)| (queued, floor + 1 + i as u64))
        .collect();
    if moving.is_empty() || !ctx.catalog.redate_garbage(None, &moving).await? {
        return Ok(0);
    }
    ctx.metrics.redated_garbage.inc_by(moving.len() as u64);
    tracing::warn!(
        items = moving.len(),
        was_due_ms = moving.first().map(|(q, _)| q.due_ms),
        now_due_ms = floor + 1,
        "collect: queued deletions a wall clock that was ahead had dated in the future were \
         brought back; check the stars' clocks (NTP)"
    );
    Ok(moving.len())
}

async fn collect(ctx: &Ctx, queued: &QueuedGarbage) -> Result<(), AuditError> {
    match &queued.item {
        Garbage::Object { key, bytes } => {
            if !ctx.catalog.claim_garbage(queued).await? {
                // Its swap landed (the object is referenced now), or another collector has it.
                return Ok(());
            }
            // Any star's settled object (the sweep covers adopted prefixes, and every star
            // collects from the one queue): one referenced again is never deleted.
            let settled = parse_any_data_key(key);
            if let Some(data) = settled
                && ctx
                    .catalog
                    .references(data.stream_id, data.end, key)
                    .await?
            {
                ctx.catalog.forget_garbage(queued).await?;
                return Ok(());
            }
            ctx.store.delete(key).await?;
            let kind = if settled.is_some() {
                "settled"
            } else {
                "orphan"
            };
            ctx.metrics.deleted_objects.with_label_values(&[kind]).inc();
            ctx.metrics.reclaimed_bytes.inc_by(*bytes);
            if settled.is_some() {
                ctx.catalog
                    .queue_garbage(&[(ctx.due_at(), Garbage::Again { key: key.clone() })])
                    .await?;
            }
        }
        Garbage::Again { key } => {
            ctx.store.delete(key).await?;
        }
        Garbage::ChainSlots {
            star,
            epoch,
            from,
            to,
            bytes,
        } => {
            for slot in *from..=*to {
                ctx.store.delete(&slot_key(star, *epoch, slot)).await?;
            }
            ctx.metrics
                .deleted_objects
                .with_label_values(&["chain_slot"])
                .inc_by(to - from + 1);
            ctx.metrics.reclaimed_bytes.inc_by(*bytes);
        }
    }
    ctx.catalog.forget_garbage(queued).await?;
    Ok(())
}
