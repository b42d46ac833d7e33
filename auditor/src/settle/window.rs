//! Reading a window of a chain for settling: up to a budget of slots, bytes and sections, each
//! flight fetched whole into the fetch cache when it fits, else read by ranges from its footer.

use super::*;

/// One flight of the window.
pub(super) struct Flight {
    pub(super) slot: u64,
    pub(super) key: Arc<str>,
    pub(super) size: u64,
    /// On disk in the fetch cache, or `None`: read with ranged GETs.
    pub(super) disk: Option<Arc<CachedObject>>,
    pub(super) footer: FlightFooter,
}

pub(super) enum WindowEnd {
    /// More slots may follow in this epoch.
    More,
    /// The epoch ends after the window: at a fence (its slot), or with nothing more written.
    EpochEnd { fence: Option<u64> },
}

pub(super) struct Window {
    /// The star whose chain the flights belong to.
    pub(super) star: String,
    pub(super) flights: Vec<Flight>,
    pub(super) end: WindowEnd,
}

pub(super) async fn load_window(
    ctx: &Ctx,
    star: &str,
    cursor: SettleCursor,
    limit: Option<u64>,
) -> Result<Window, AuditError> {
    let prefix = chain_prefix(star, cursor.epoch);
    let after = cursor
        .next_slot
        .checked_sub(1)
        .map(|slot| slot_key(star, cursor.epoch, slot));
    let page = ctx
        .store
        .list(
            &prefix,
            after.as_deref(),
            MAX_LIST_KEYS.min(WINDOW_SLOTS + 1),
        )
        .await?;
    let mut flights: Vec<Flight> = Vec::new();
    let (mut bytes, mut sections, mut footers) = (0u64, 0usize, 0u64);
    let mut expected = cursor.next_slot;
    let mut full = false;
    let mut gap = false;
    for object in &page.objects {
        let Some(slot) = parse_slot(&prefix, &object.key) else {
            continue;
        };
        if slot != expected {
            gap = true;
            break;
        }
        if limit.is_some_and(|limit| slot > limit) {
            full = true;
            break;
        }
        if !flights.is_empty()
            && (flights.len() >= WINDOW_SLOTS
                || bytes + object.size > WINDOW_BYTES
                || sections >= WINDOW_SECTIONS)
        {
            full = true;
            break;
        }
        let key: Arc<str> = Arc::from(object.key.as_str());
        // A flight past the usual size (one large batch makes one) is read a section at a time,
        // so the settle's memory does not follow the batch cap.
        let disk = if object.size <= ctx.config.whole_object_max {
            ctx.cache
                .load(ctx.store.as_ref(), &key, object.size)
                .await?
        } else {
            ctx.metrics.cache_fallbacks.inc();
            None
        };
        let footer = match &disk {
            Some(disk) => footer_from_disk(disk, &key).await?,
            None => fetch_footer(ctx.store.as_ref(), &key).await?,
        };
        let footer = match footer {
            ObjectFooter::Flight(footer) => footer,
            ObjectFooter::Fence(_) if limit.is_none() => {
                return Ok(Window {
                    star: star.to_owned(),
                    flights,
                    end: WindowEnd::EpochEnd { fence: Some(slot) },
                });
            }
            ObjectFooter::Fence(_) => {
                return Err(AuditError::Inconsistent(format!(
                    "{key} is a fence below the checkpoint of the chain's current epoch"
                )));
            }
        };
        let meta = &footer.meta;
        if (meta.star.as_str(), meta.epoch, meta.slot) != (star, cursor.epoch, slot) {
            return Err(AuditError::Inconsistent(format!(
                "{key} says it is slot {} of epoch {} of star {:?}",
                meta.slot, meta.epoch, meta.star
            )));
        }
        let footer_bytes: u64 = footer
            .sections
            .iter()
            .map(|s| FOOTER_ENTRY_BYTES + s.stream.len() as u64)
            .sum();
        if !flights.is_empty() && footers + footer_bytes > WINDOW_FOOTER_BYTES {
            // The next window starts with it (from the fetch cache).
            full = true;
            break;
        }
        footers += footer_bytes;
        bytes += object.size;
        sections += footer.sections.len();
        flights.push(Flight {
            slot,
            key,
            size: object.size,
            disk,
            footer,
        });
        expected += 1;
    }
    let listed_all = page.next_start_after.is_none();
    let end = match limit {
        // The current epoch: every slot up to the checkpoint is in the bucket.
        Some(limit) => {
            if flights.is_empty() || (!full && expected <= limit && (gap || listed_all)) {
                return Err(AuditError::Inconsistent(format!(
                    "slot {expected} of epoch {} is absorbed but not in the bucket",
                    cursor.epoch
                )));
            }
            WindowEnd::More
        }
        // An older epoch ends at its first gap: nothing past it was acknowledged.
        None if !full && (gap || listed_all) => WindowEnd::EpochEnd { fence: None },
        None => WindowEnd::More,
    };
    Ok(Window {
        star: star.to_owned(),
        flights,
        end,
    })
}

/// The footer of a cached flight, reading only the object's end from disk.
async fn footer_from_disk(disk: &Arc<CachedObject>, key: &str) -> Result<ObjectFooter, AuditError> {
    let format = |source| AuditError::Format {
        key: key.to_owned(),
        source,
    };
    let mut from = disk.size.saturating_sub(SUGGESTED_TAIL_READ);
    loop {
        let tail = disk.read(from, disk.size - from).await?;
        match parse_tail(&tail, disk.size).map_err(format)? {
            TailParse::Footer(footer) => return Ok(footer),
            TailParse::NeedFrom(start) if start < from => from = start,
            TailParse::NeedFrom(_) => {
                return Err(format(nova_core::flight::FormatError::Corrupt(
                    "footer not within the object".into(),
                )));
            }
        }
    }
}
