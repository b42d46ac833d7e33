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
//! An object is deleted once more a grace period later: its writer's PUT may still have been
//! in flight (a settled object's intent came due first; a marker's PUT timed out and landed
//! late), and may land after the first delete. No swap can reference a settled object by then
//! (its intent is claimed), and no marker key is written again once it is queued, so the second
//! delete is safe, and nothing written by the auditor is left behind.

use nova_core::catalog::{Garbage, QueuedGarbage, SettleCursor};
use nova_core::keys::{parse_any_data_key, slot_key};

use crate::{AuditError, Ctx, Duty, Step};

/// Queue items read per job.
const PAGE: usize = 100;

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let page = ctx.catalog.garbage_page(PAGE).await?;
    let now = ctx.config.clock.unix_ms();
    if let Some(first) = page.first()
        && first.due_ms <= now
    {
        ctx.set_due(Duty::Collect, Some(first.due_ms));
        for item in page.iter().take_while(|item| item.due_ms <= now) {
            collect(ctx, item).await?;
        }
        return Ok(Step::Done);
    }
    ctx.set_due(Duty::Collect, None);
    if !page.is_empty() && dated_far_ahead(ctx).await? {
        return redate_future(ctx, None).await;
    }
    Ok(Step::Idle)
}

/// Whether anything queued is due further ahead than any honest clock would have dated it
/// (past `honest_due` and the skew allowance). Looked for at the far end of the queue: items
/// honestly due soon sit in front of it, under steady load always.
async fn dated_far_ahead(ctx: &Ctx) -> Result<bool, AuditError> {
    let by_own = far_ahead_by_own_clock(ctx);
    if ctx.catalog.garbage_due_after(by_own, 1).await?.is_empty() {
        return Ok(false);
    }
    let honest = honest_due(ctx).await? + FAR_AHEAD_MS;
    Ok(!ctx.catalog.garbage_due_after(honest, 1).await?.is_empty())
}

/// Whether `due` is further ahead than any honest clock dates anything queued now (past
/// `honest_due` and `FAR_AHEAD_MS`). By this star's clock first, so that an honest due time
/// costs no probe of the store's clock; that clock decides only when this one says so.
pub(crate) async fn is_far_ahead(ctx: &Ctx, due: u64) -> Result<bool, AuditError> {
    Ok(due > far_ahead_by_own_clock(ctx) && due > honest_due(ctx).await? + FAR_AHEAD_MS)
}

/// `honest_due` and `FAR_AHEAD_MS` by this star's clock alone: never later than by both.
fn far_ahead_by_own_clock(ctx: &Ctx) -> u64 {
    ctx.intent_due_at() + 1000 + FAR_AHEAD_MS
}

/// Items one re-dating job moves: each takes a compare, a delete and a put, and with a settle
/// cursor's compare and put the transaction stays inside etcd's 128 operations.
const REDATE_BATCH: usize = 40;
/// Queued items one re-dating job reads to find the ones it moves.
const REDATE_SCAN: usize = 1000;

/// How far past `honest_due` a due time may be and still be left as it is: a clock a little
/// ahead only delays collection by as much, which is harmless, and a writer whose clock is a
/// little ahead may still be writing the object its intent names. One an hour ahead would keep
/// every object it queued for an hour, unseen by the due age (nothing is overdue).
pub(crate) const SKEW_ALLOWANCE_MS: u64 = 120_000;
/// How far past `honest_due` a due time must be for the queue to be brought back: twice the
/// allowance, so that what is brought back (to just past the allowance) does not call for it
/// again.
const FAR_AHEAD_MS: u64 = 2 * SKEW_ALLOWANCE_MS;

/// The latest due time anything queued now gets from an honest clock (an intent's), by the
/// later of this star's clock and the object store's: a star whose clock is behind must not
/// take honest items for future ones and bring them forward. A second more for clocks that
/// disagree a little.
async fn honest_due(ctx: &Ctx) -> Result<u64, AuditError> {
    let now = ctx.config.clock.unix_ms();
    let store_now = crate::retention::store_now(ctx).await?.unwrap_or(now);
    let wait = ctx.intent_due_at().saturating_sub(now);
    Ok(now.max(store_now).saturating_add(wait).saturating_add(1000))
}

/// Brings items dated past `honest_due` and the allowance back towards that point, keeping
/// their order: the `i`th past it becomes due at `point + 1 + i` if that is earlier. No item
/// is made due earlier than an honest clock would date an intent now, plus the allowance, and
/// what was queued before an item still comes due first, so runs of chain slots are still
/// deleted in slot order.
///
/// With `chain` (a star, the version of its settle cursor as read, and the cursor), the cursor,
/// whose due time every run it queues carries, moves to just past the last item once every
/// item is back, in the same transaction; before then it stays, so that nothing it queues
/// comes due before the runs still waiting to be moved.
pub(crate) async fn redate_future(
    ctx: &Ctx,
    chain: Option<(&str, u64, SettleCursor)>,
) -> Result<Step, AuditError> {
    // Items up to the allowance past an honest due are left as they are: a writer whose clock
    // is a little ahead may still be writing the object an intent names, and its swap checks
    // the intent's key. What is further ahead comes back to just past the allowance.
    let floor = honest_due(ctx).await? + SKEW_ALLOWANCE_MS;
    let page = ctx.catalog.garbage_due_after(floor, REDATE_SCAN).await?;
    let (mut dues, mut moving) = (Vec::new(), Vec::new());
    let mut last_read = page.len() < REDATE_SCAN;
    for queued in &page {
        let due = redated_one(queued.due_ms, floor, dues.len());
        if due != queued.due_ms {
            if moving.len() == REDATE_BATCH {
                last_read = false;
                break;
            }
            moving.push((queued.clone(), due));
        }
        dues.push(due);
    }
    let moving = moving.as_slice();
    let cursor = chain.filter(|_| last_read).map(|(star, version, cursor)| {
        let last_due_ms = dues.last().map_or(floor, |due| (*due).max(floor));
        (
            star,
            version,
            SettleCursor {
                last_due_ms,
                ..cursor
            },
        )
    });
    if moving.is_empty() && cursor.is_none() {
        // Everything read is already as early as it may be; time has to pass first.
        return Ok(Step::Idle);
    }
    if !ctx.catalog.redate_garbage(cursor, moving).await? {
        // Collected, claimed or re-dated meanwhile (or the cursor moved): read again.
        return Ok(Step::Done);
    }
    if let Some((first, due)) = moving.first() {
        ctx.metrics.redated_garbage.inc_by(moving.len() as u64);
        tracing::warn!(
            items = moving.len(),
            was_due_ms = first.due_ms,
            now_due_ms = due,
            "collect: queued deletions a wall clock that was ahead had dated in the future were \
             brought back; check the stars' clocks (NTP)"
        );
    }
    Ok(Step::Done)
}

/// The due time of the `i`th item queued past `floor`, due at `due`, once brought back:
/// `floor + 1 + i` if that is earlier. Never later than before, never at or before `floor`,
/// and, item after item, in the same order (the minimum of two rising sequences rises),
/// strictly where it was strict.
fn redated_one(due: u64, floor: u64, i: usize) -> u64 {
    due.min(floor.saturating_add(1 + i as u64))
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
            ctx.catalog
                .queue_garbage(&[(ctx.due_at(), Garbage::Again { key: key.clone() })])
                .await?;
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
            ctx.catalog
                .forget_chain_run(queued, star, *epoch, *to)
                .await?;
            return Ok(());
        }
    }
    ctx.catalog.forget_garbage(queued).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redated(dues: impl Iterator<Item = u64>, floor: u64) -> Vec<u64> {
        dues.enumerate()
            .map(|(i, due)| redated_one(due, floor, i))
            .collect()
    }

    #[test]
    fn redating_keeps_the_order_and_never_delays() {
        let floor = 1_000;
        // An hour ahead, with a run queued twice at one time and one item barely past.
        let dues = [1_002, 3_601_000, 3_601_000, 3_601_005, 3_700_000];
        let new = redated(dues.iter().copied(), floor);
        assert_eq!(new, [1_001, 1_002, 1_003, 1_004, 1_005]);
        // Items already close keep their time; the ones after them still follow.
        let dues = [1_001, 1_002, 1_010, 9_000_000];
        assert_eq!(
            redated(dues.iter().copied(), floor),
            [1_001, 1_002, 1_003, 1_004]
        );
        for dues in [
            vec![1_001, 1_001, 1_001],
            vec![1_005, 1_006, 5_000, 5_000, 5_001],
            vec![u64::MAX - 1, u64::MAX],
        ] {
            let new = redated(dues.iter().copied(), floor);
            for (i, (old, due)) in dues.iter().zip(&new).enumerate() {
                assert!(due <= old && *due > floor, "{dues:?} -> {new:?}");
                if let Some(next) = new.get(i + 1) {
                    assert!(next >= due, "{dues:?} -> {new:?}");
                    if dues[i + 1] > *old {
                        assert!(next > due, "{dues:?} -> {new:?}: a strict order was lost");
                    }
                }
            }
        }
    }
}
