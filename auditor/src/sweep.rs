//! Sweep: now and then, everything the auditor writes or leaves in the bucket is checked against
//! the catalog, and what nothing needs any more is queued for collection.
//!
//! Collection follows the catalog, and the catalog can miss an object: a settle's PUT that
//! landed after its intent was collected (a slow or retried request), one that landed after the
//! catalog was rebuilt from the bucket, a chain slot or settle marker whose PUT timed out and
//! landed after its run was collected. Such an object can never become needed again (a swap
//! needs its intent, which is gone; a slot at or below a settle marker was settled), so the
//! sweep is what guarantees that nothing stays forever. A pass goes over three prefixes of this
//! star, then the same three of each departed star it adopted (whose objects nobody else would
//! look at), a page per job: its trim markers (`trims/{star}/`), its chain (`chain/{star}/`, up
//! to the settle cursor) and its settled objects (`data/{star}/`). The next pass starts
//! `--auditor-sweep-secs` after the last one began.

use std::collections::HashMap;

use nova_core::catalog::{Garbage, Liveness, SettleCursor};
use nova_core::flight::{FetchError, ObjectFooter, fetch_footer};
use nova_core::keys::{
    chain_prefix, chain_root, data_root, parse_data_key, parse_epoch, parse_settle_marker,
    parse_slot, parse_trim_marker, settle_marker_prefix, slot_key, trims_root,
};
use nova_core::object_store::{ListPage, MAX_LIST_KEYS, StoreError};

use crate::{AuditError, Ctx, Step};

/// What one prefix of a pass holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Trims,
    Chain,
    Data,
}

const PARTS: [Part; 3] = [Part::Trims, Part::Chain, Part::Data];

fn root_of(part: Part, star: &str) -> String {
    match part {
        Part::Trims => trims_root(star),
        Part::Chain => chain_root(star),
        Part::Data => data_root(star),
    }
}

/// The part and star of a pass's `root`.
fn parse_root(root: &str) -> Option<(Part, &str)> {
    let (head, rest) = root.split_once('/')?;
    let star = rest.strip_suffix('/')?;
    let part = match head {
        "trims" => Part::Trims,
        "chain" => Part::Chain,
        "data" => Part::Data,
        _ => return None,
    };
    Some((part, star))
}

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let now = ctx.config.clock.now();
    let adopted = ctx.adoptions.stars();
    let (root, after) = {
        let mut sweep = ctx.sweep.lock();
        if sweep.next_pass.is_some_and(|next| now < next) {
            return Ok(Step::Idle);
        }
        if sweep.root.is_none() {
            // A pass begins.
            sweep.started = Some(now);
            sweep.root = Some(root_of(Part::Trims, &ctx.config.star));
            let own = &ctx.config.star;
            sweep
                .chain_queued
                .retain(|star, _| star == own || adopted.contains(star));
        }
        (sweep.root.clone().unwrap_or_default(), sweep.after.clone())
    };
    let next = match parse_root(&root) {
        Some((part, star)) if star == ctx.config.star => sweep_part(ctx, part, star, after).await?,
        // An adopted star's prefixes are swept only while it is adopted (a star that rejoined
        // sweeps its own): under a guard its release waits for, cut off when the adoption ends.
        Some((part, star)) => match ctx.adoptions.enter(star) {
            Some(guard) => match guard.run(sweep_part(ctx, part, star, after)).await {
                Some(next) => next?,
                None => None,
            },
            None => None,
        },
        None => None,
    };
    match next {
        Some(next) => ctx.sweep.lock().after = Some(next),
        None => next_root(ctx, &root),
    }
    Ok(Step::Done)
}

/// Sweeps one page of `part` of `star`'s prefixes after `after`; returns where the next page
/// starts, or `None` once the part is done.
async fn sweep_part(
    ctx: &Ctx,
    part: Part,
    star: &str,
    after: Option<String>,
) -> Result<Option<String>, AuditError> {
    let root = root_of(part, star);
    match part {
        Part::Trims => sweep_trims_page(ctx, &root, after).await,
        Part::Chain => sweep_chain_page(ctx, star, after).await,
        Part::Data => sweep_page(ctx, &root, after).await,
    }
}

/// Sweeps one page of `root` after `after`; returns where the next page starts.
async fn sweep_page(
    ctx: &Ctx,
    root: &str,
    after: Option<String>,
) -> Result<Option<String>, AuditError> {
    let page = ctx
        .store
        .list(root, after.as_deref(), MAX_LIST_KEYS)
        .await?;
    let mut stray = Vec::new();
    for object in &page.objects {
        let Some(data) = parse_data_key(root, &object.key) else {
            continue;
        };
        // Written-mark first: a swap removes it and adds the reference in one transaction, so
        // an object seen unmarked and then unreferenced was never, and can never be, swapped
        // in. The other order races a swap landing between the two reads.
        if ctx.catalog.being_written(&object.key).await?
            || ctx
                .catalog
                .references(data.stream_id, data.end, &object.key)
                .await?
        {
            continue;
        }
        stray.push((
            ctx.due_at(),
            Garbage::Object {
                key: object.key.clone(),
                bytes: object.size,
            },
        ));
    }
    queue_stray(ctx, &stray, "settled objects nothing references").await?;
    Ok(page.next_start_after)
}

/// Sweeps one page of the star's trim markers: those a stream's trim point has passed (one
/// whose PUT landed late, after the trim that would have queued it; one a rebuilt catalog's
/// lost queue held) and those of streams gone are queued. A marker still ahead of its stream's
/// trim point may belong to a trim in progress, and stays.
async fn sweep_trims_page(
    ctx: &Ctx,
    root: &str,
    after: Option<String>,
) -> Result<Option<String>, AuditError> {
    let page = ctx
        .store
        .list(root, after.as_deref(), MAX_LIST_KEYS)
        .await?;
    // Per stream: its trim point, and whether it is gone (read only for a marker at or ahead
    // of the trim point, which only a stream gone makes stray).
    let mut streams: HashMap<u64, (u64, Option<bool>)> = HashMap::new();
    let mut stray = Vec::new();
    for object in &page.objects {
        let Some((id, marker)) = parse_trim_marker(root, &object.key) else {
            continue;
        };
        let (first, gone) = match streams.get(&id) {
            Some(known) => *known,
            None => (ctx.catalog.first_seq(id).await?, None),
        };
        let gone = match gone {
            _ if marker.after < first => None,
            Some(gone) => Some(gone),
            None => Some(matches!(
                ctx.catalog.stream_liveness(id).await?,
                Liveness::Deleted
            )),
        };
        streams.insert(id, (first, gone));
        if marker.after < first || gone == Some(true) {
            stray.push((
                ctx.due_at(),
                Garbage::Object {
                    key: object.key.clone(),
                    bytes: object.size,
                },
            ));
        }
    }
    queue_stray(ctx, &stray, "trim markers behind their stream's trim point").await?;
    Ok(page.next_start_after)
}

/// Queues what a page of the sweep found, counted and logged as `what`.
async fn queue_stray(ctx: &Ctx, stray: &[(u64, Garbage)], what: &str) -> Result<(), AuditError> {
    if !stray.is_empty() {
        tracing::info!(
            objects = stray.len(),
            "auditor: {what}, queued for collection"
        );
        ctx.metrics.swept_objects.inc_by(stray.len() as u64);
        ctx.catalog.queue_garbage(stray).await?;
    }
    Ok(())
}

/// Sweeps one page of `star`'s chain, up to where the collector has deleted it (see
/// `chain_reach`), so that nothing it queues is still in the queue. What is still there below
/// that point landed after its run was collected (a PUT that timed out), or was queued in a
/// catalog since rebuilt:
///
/// - in an epoch past (one the settle cursor and that point have both left), every slot but
///   the one after the epoch's last settle marker (its fence, which stays so a paused
///   incarnation can never land that slot; past it, nothing was acknowledged) and every marker
///   but that last one. A past epoch without a marker had no flight to settle: the settle
///   writes a marker for every window of flights before its cursor moves on, nothing deletes
///   an epoch's highest marker, and recovery fences an epoch with nothing absorbed at slot 0.
///   Once slot 0 is read to be that fence, every other slot goes (a PUT that landed after the
///   fence); otherwise the epoch is left alone;
/// - in that point's epoch, the slots up to it (and below the cursor) and the markers below the
///   highest that the runs collected superseded.
///
/// Slots are queued due after the chain's last run, so what is left of an epoch is still
/// deleted in order, and no item collides with a queued run.
async fn sweep_chain_page(
    ctx: &Ctx,
    star: &str,
    after: Option<String>,
) -> Result<Option<String>, AuditError> {
    let Some(at) = ctx.catalog.settle_cursor(star).await? else {
        return Ok(None);
    };
    let cursor = at.cursor;
    // Decided once per pass over the chain: what this pass queues is due after the chain's
    // latest due time, and must not change the answer half way.
    let known = ctx.sweep.lock().chain_reach.filter(|_| after.is_some());
    let (reach_epoch, reach_slot) = match known {
        Some(reach) => reach,
        None => match chain_reach(ctx, star, cursor).await? {
            Some(reach) => {
                ctx.sweep.lock().chain_reach = Some(reach);
                reach
            }
            None => return Ok(None),
        },
    };
    let reached = |epoch: u64, slot: u64| {
        epoch < reach_epoch || (epoch == reach_epoch && reach_slot.is_some_and(|r| slot <= r))
    };
    let settled = |epoch: u64, slot: u64| epoch < cursor.epoch || slot < cursor.next_slot;
    let root = chain_root(star);
    let page = ctx
        .store
        .list(&root, after.as_deref(), MAX_LIST_KEYS)
        .await?;
    let mut highest = page_markers(star, &page);
    let mut fenced_at_zero: HashMap<u64, bool> = HashMap::new();
    let due = ctx.due_at().max(cursor.last_due_ms.saturating_add(1));
    let mut stray = Vec::new();
    let mut next = page.next_start_after.clone();
    for object in &page.objects {
        let Some(epoch) = parse_epoch(&root, &object.key) else {
            continue;
        };
        if epoch > reach_epoch || epoch > cursor.epoch {
            next = None;
            break;
        }
        let past = epoch < reach_epoch && epoch < cursor.epoch;
        let marker = match highest.get(&epoch) {
            Some(known) => *known,
            None => {
                let found = highest_marker(ctx, star, epoch).await?;
                highest.insert(epoch, found);
                found
            }
        };
        let left = if let Some(slot) = parse_slot(&chain_prefix(star, epoch), &object.key) {
            if past {
                match marker {
                    Some(through) => slot != through + 1,
                    None if slot == 0 => false,
                    None => match fenced_at_zero.get(&epoch) {
                        Some(fenced) => *fenced,
                        None => {
                            let fenced = fenced_at_zero_slot(ctx, star, epoch).await?;
                            fenced_at_zero.insert(epoch, fenced);
                            fenced
                        }
                    },
                }
            } else if reached(epoch, slot) && settled(epoch, slot) {
                true
            } else {
                // The rest of the epoch's slots are not collected yet: on to its markers,
                // which sort after every slot.
                next = Some(slot_key(star, epoch, u64::MAX));
                break;
            }
        } else if let Some(through) =
            parse_settle_marker(&settle_marker_prefix(star, epoch), &object.key)
        {
            marker.is_some_and(|latest| through < latest) && (past || reached(epoch, through + 1))
        } else {
            false
        };
        if left {
            stray.push((
                due,
                Garbage::Object {
                    key: object.key.clone(),
                    bytes: object.size,
                },
            ));
        }
    }
    if !stray.is_empty() {
        let now = ctx.config.clock.now();
        let mut sweep = ctx.sweep.lock();
        let queued = sweep
            .chain_queued
            .entry(star.to_owned())
            .or_insert((due, now));
        *queued = (queued.0.max(due), now);
    }
    queue_stray(
        ctx,
        &stray,
        "chain slots and settle markers left after collection",
    )
    .await?;
    Ok(next)
}

/// How far the collector has deleted `star`'s chain: the epoch it is in and the last slot of
/// it collected (`None`: none of it yet). Chain runs are queued with due times that never go
/// back and collected in due order, so once the queue holds nothing due as early as the
/// chain's latest due time, everything below the settle cursor went; before that, the
/// catalog's collected mark (the last run collected) says how far. `None` while what this
/// sweep queued of the chain before is still in the queue (it would be queued twice), or when
/// nothing of the chain was collected yet.
async fn chain_reach(
    ctx: &Ctx,
    star: &str,
    cursor: SettleCursor,
) -> Result<Option<(u64, Option<u64>)>, AuditError> {
    let head = ctx.catalog.garbage_page(1).await?;
    let past = |due: u64| head.first().is_none_or(|q| q.due_ms > due);
    let queued = ctx.sweep.lock().chain_queued.get(star).copied();
    let waited_enough =
        |at| ctx.config.clock.since(at) >= ctx.config.collect_grace.saturating_mul(2);
    if queued.is_some_and(|(due, at)| !past(due) && !waited_enough(at)) {
        return Ok(None);
    }
    if past(cursor.last_due_ms) {
        return Ok(Some((cursor.epoch, cursor.next_slot.checked_sub(1))));
    }
    let mark = ctx.catalog.chain_collected(star).await?;
    Ok(mark.map(|(epoch, slot)| (epoch, Some(slot))))
}

/// Whether slot 0 of `epoch` of `star`'s chain is a fence: the one read a past epoch without
/// a settle marker needs before its other slots go. Such an epoch had no flight to settle, so
/// its fence is at slot 0; anything else (a missing or unreadable slot 0, a flight there) means
/// its markers are not what the settle left, and the epoch is left alone.
async fn fenced_at_zero_slot(ctx: &Ctx, star: &str, epoch: u64) -> Result<bool, AuditError> {
    match fetch_footer(ctx.store.as_ref(), &slot_key(star, epoch, 0)).await {
        Ok(footer) => Ok(matches!(footer, ObjectFooter::Fence(_))),
        Err(FetchError::Store(StoreError::NotFound { .. }) | FetchError::Format { .. }) => {
            Ok(false)
        }
        Err(err) => Err(err.into()),
    }
}

/// Each epoch's highest settle marker as far as `page` shows it: for an epoch whose markers it
/// lists in full (it goes on past them, or is the listing's last page).
fn page_markers(star: &str, page: &ListPage) -> HashMap<u64, Option<u64>> {
    let root = chain_root(star);
    let mut markers: HashMap<u64, Option<u64>> = HashMap::new();
    let mut last_epoch = None;
    for object in &page.objects {
        let Some(epoch) = parse_epoch(&root, &object.key) else {
            continue;
        };
        last_epoch = Some(epoch);
        let through = parse_settle_marker(&settle_marker_prefix(star, epoch), &object.key);
        let highest = markers.entry(epoch).or_default();
        *highest = (*highest).max(through);
    }
    if page.next_start_after.is_some()
        && let Some(last) = last_epoch
    {
        // The listing may go on inside this epoch.
        markers.remove(&last);
    }
    markers
}

/// The highest settle marker of `epoch` of `star`'s chain, from the keys alone.
async fn highest_marker(ctx: &Ctx, star: &str, epoch: u64) -> Result<Option<u64>, AuditError> {
    let prefix = settle_marker_prefix(star, epoch);
    let mut highest = None;
    let mut after: Option<String> = None;
    loop {
        let page = ctx
            .store
            .list(&prefix, after.as_deref(), MAX_LIST_KEYS)
            .await?;
        for object in &page.objects {
            highest = highest.max(parse_settle_marker(&prefix, &object.key));
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => return Ok(highest),
        }
    }
}

/// The roots of a pass, in order: this star's three parts, then each adopted star's (in key
/// order).
fn pass_roots(ctx: &Ctx) -> Vec<String> {
    let mut adopted = ctx.adoptions.stars();
    adopted.sort();
    std::iter::once(ctx.config.star.clone())
        .chain(adopted)
        .flat_map(|star| PARTS.map(|part| root_of(part, &star)))
        .collect()
}

/// Moves the pass past `root` to the next root, or ends the pass.
fn next_root(ctx: &Ctx, root: &str) {
    let roots = pass_roots(ctx);
    let next = match roots.iter().position(|r| r == root) {
        Some(at) => roots.get(at + 1).cloned(),
        // Its star is no longer adopted: on to the next adopted star after it.
        None => {
            let star = parse_root(root).map(|(_, star)| star);
            roots
                .iter()
                .skip(PARTS.len())
                .find(|r| parse_root(r).map(|(_, s)| s) > star)
                .cloned()
        }
    };
    let mut sweep = ctx.sweep.lock();
    sweep.after = None;
    sweep.chain_reach = None;
    match next {
        Some(next) => sweep.root = Some(next),
        None => {
            sweep.root = None;
            let started = sweep.started.unwrap_or_else(|| ctx.config.clock.now());
            sweep.next_pass = Some(Ctx::after(started, ctx.config.sweep_every));
            tracing::debug!("sweep: a pass ended");
            ctx.metrics.sweeps.inc();
        }
    }
}
