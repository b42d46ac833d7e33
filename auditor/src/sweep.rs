//! Sweep: now and then, every settled object in the bucket is checked against the catalog, and
//! one that nothing references and nothing is writing is queued for collection.
//!
//! Collection follows the catalog, and the catalog can miss an object: a settle's PUT that
//! landed after its intent was collected (a slow or retried request), or one that landed after
//! the catalog was rebuilt from the bucket. Such an object can never become referenced (its swap
//! needs its intent, which is gone), so the sweep is what guarantees that nothing the auditor
//! wrote stays forever. A pass lists the star's trim markers (`trims/{star}/`), then
//! `data/{star}/` a page per job, then the prefix of each departed star this star adopted
//! (whose objects nobody else would look at); the next pass starts `--auditor-sweep-secs` after
//! the last one began.

use std::collections::HashMap;

use nova_core::catalog::{Garbage, Liveness};
use nova_core::keys::{data_root, parse_data_key, parse_trim_marker, trims_root};
use nova_core::object_store::MAX_LIST_KEYS;

use crate::{AuditError, Ctx, Step};

pub(crate) async fn step(ctx: &Ctx) -> Result<Step, AuditError> {
    let now = ctx.config.clock.unix_ms();
    let (root, after) = {
        let mut sweep = ctx.sweep.lock();
        if sweep.next_pass_ms.is_some_and(|next| now < next) {
            return Ok(Step::Idle);
        }
        if sweep.root.is_none() {
            // A pass begins.
            sweep.started_ms = now;
            sweep.root = Some(trims_root(&ctx.config.star));
        }
        (sweep.root.clone().unwrap_or_default(), sweep.after.clone())
    };
    // An adopted prefix is swept only while adopted (a star that rejoined sweeps its own):
    // under a guard its release waits for, cut off when the adoption ends.
    let next = if root == data_root(&ctx.config.star) {
        sweep_page(ctx, &root, after).await?
    } else if root == trims_root(&ctx.config.star) {
        sweep_trims_page(ctx, &root, after).await?
    } else {
        let guard = data_root_star(&root).and_then(|star| ctx.adoptions.enter(star));
        match guard {
            Some(guard) => match guard.run(sweep_page(ctx, &root, after)).await {
                Some(next) => next?,
                None => None,
            },
            None => None,
        }
    };
    match next {
        Some(next) => ctx.sweep.lock().after = Some(next),
        None => next_root(ctx, &root),
    }
    Ok(Step::Done)
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

/// The star whose prefix `root` (`data/{star}/`) is.
fn data_root_star(root: &str) -> Option<&str> {
    root.strip_prefix("data/")?.strip_suffix('/')
}

/// Moves the pass past `root`: from the trim markers to the star's own prefix, then to the
/// next adopted star's prefix (in key order), or ends the pass.
fn next_root(ctx: &Ctx, root: &str) {
    let trims = trims_root(&ctx.config.star);
    let mut adopted: Vec<String> = ctx.adoptions.stars().iter().map(|s| data_root(s)).collect();
    adopted.sort();
    let next = if root == trims {
        Some(data_root(&ctx.config.star))
    } else if root == data_root(&ctx.config.star) {
        adopted.first().cloned()
    } else {
        adopted.into_iter().find(|r| r.as_str() > root)
    };
    let mut sweep = ctx.sweep.lock();
    sweep.after = None;
    match next {
        Some(next) => sweep.root = Some(next),
        None => {
            sweep.root = None;
            sweep.next_pass_ms = Some(sweep.started_ms + ctx.config.sweep_every.as_millis() as u64);
            ctx.metrics.sweeps.inc();
        }
    }
}
