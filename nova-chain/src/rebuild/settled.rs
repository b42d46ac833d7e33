//! The settled-object pass of a rebuild: each stream's settled objects, in key order, chained
//! from its first record (or its trim point) taking at each point the object reaching furthest;
//! what the chain passes over is queued for collection.

use super::*;

/// One stream's settled objects, as listed (by first record, then last).
struct Candidates {
    stream_id: u64,
    objects: Vec<(DataKey, nova_core::object_store::ObjectMeta)>,
}

pub(super) async fn restore_settled(
    star: &str,
    store: &dyn ObjectStore,
    catalog: &Catalog,
    clock: Clock,
    out: &mut Found,
) -> Result<(), RebuildError> {
    let root = data_root(star);
    let mut current: Option<Candidates> = None;
    let mut after: Option<String> = None;
    loop {
        let page = list_page(clock, store, &root, after.as_deref()).await?;
        for object in &page.objects {
            let Some(data) = parse_data_key(&root, &object.key) else {
                continue;
            };
            out.max_id = out.max_id.max(data.stream_id);
            if out.deleted.contains(&data.stream_id) {
                out.garbage.push((clock.unix_ms(), object_garbage(object)));
                continue;
            }
            if current
                .as_ref()
                .is_some_and(|c| c.stream_id != data.stream_id)
                && let Some(done) = current.take()
            {
                choose(store, clock, done, out).await?;
            }
            current
                .get_or_insert_with(|| Candidates {
                    stream_id: data.stream_id,
                    objects: Vec::new(),
                })
                .objects
                .push((data, object.clone()));
        }
        if out.pending.len() >= ENTRY_BATCH {
            catalog.restore_entries(&out.pending).await?;
            out.pending.clear();
        }
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if let Some(done) = current.take() {
        choose(store, clock, done, out).await?;
    }
    Ok(())
}

/// Chooses, among one stream's settled objects, a chain of objects each starting where the
/// last ended, from the stream's first record (or, with a trim marker, from any object that
/// starts at or before the trim point and ends past it) as far as any chain reaches; those are
/// indexed. Objects wholly below the trim point are queued for collection.
/// Objects inside the chosen chain's records that it does not use (replaced by a rewrite, or
/// left by an interrupted settle) are queued for collection. Objects past where the chain ends
/// are kept: their records may be needed once the flights have filled the gap.
async fn choose(
    store: &dyn ObjectStore,
    clock: Clock,
    candidates: Candidates,
    out: &mut Found,
) -> Result<(), RebuildError> {
    let trim = out
        .streams
        .get(&candidates.stream_id)
        .map_or(0, |stream| stream.trim);
    let (trimmed, objects): (Vec<_>, Vec<_>) = candidates
        .objects
        .into_iter()
        .partition(|(data, _)| data.end <= trim);
    for (_, meta) in &trimmed {
        out.garbage.push((clock.unix_ms(), object_garbage(meta)));
    }
    // A merged object whose footer does not parse (one the store composed wrongly, whose
    // swap never landed and whose delete failed) is left out, and the chain chosen again
    // without it, but only when the objects it was merged from still cover its records:
    // otherwise the rebuild stops, as for any unreadable object, rather than restore the
    // stream short.
    let mut unreadable = vec![false; objects.len()];
    let (chain, furthest) = 'choose: loop {
        let Some((chain, furthest)) = chain_of(&objects, &unreadable, trim) else {
            return Ok(());
        };
        for &i in &chain {
            let (data, meta) = &objects[i];
            if !data.rewritten {
                continue;
            }
            let source = match retrying(clock, || fetch_footer(store, &meta.key)).await {
                Ok(_) => continue,
                Err(FetchError::Format { source, .. }) => source,
                Err(source) => {
                    return Err(RebuildError::Flight {
                        key: meta.key.clone(),
                        source,
                    });
                }
            };
            unreadable[i] = true;
            let covered =
                chain_of(&objects, &unreadable, trim).is_some_and(|(_, reach)| reach >= data.end);
            if !covered {
                return Err(RebuildError::Flight {
                    key: meta.key.clone(),
                    source: FetchError::Format {
                        key: meta.key.clone(),
                        source,
                    },
                });
            }
            tracing::warn!(
                object = %meta.key,
                "rebuild: a merged object is unreadable ({source}); its records are taken from \
                 the objects it was merged from"
            );
            continue 'choose;
        }
        break (chain, furthest);
    };
    let reached = furthest;
    let mut used = vec![false; objects.len()];
    for &i in &chain {
        used[i] = true;
    }
    for (i, (data, meta)) in objects.iter().enumerate() {
        if used[i] {
            continue;
        }
        if data.end <= reached {
            out.garbage.push((clock.unix_ms(), object_garbage(meta)));
        } else if data.start >= reached {
            tracing::warn!(
                stream_id = candidates.stream_id,
                object = %meta.key,
                "rebuild: settled object past a gap; its records must come from the chain"
            );
        }
    }
    for i in chain {
        let (data, meta) = &objects[i];
        take(store, clock, *data, meta.key.clone(), out).await?;
    }
    Ok(())
}

/// The chain of `objects` (leaving out the `unreadable` ones) each starting where the last
/// ended, from the lowest record or the trim point as far as any reaches, and where it ends;
/// `None` without a usable object.
fn chain_of(
    objects: &[(DataKey, nova_core::object_store::ObjectMeta)],
    unreadable: &[bool],
    trim: u64,
) -> Option<(Vec<usize>, u64)> {
    let usable = || {
        objects
            .iter()
            .enumerate()
            .filter(|(i, _)| !unreadable[*i])
            .map(|(i, (data, _))| (i, data))
    };
    // A chain may start at the stream's first record or, once retention trimmed it, at any
    // object holding the trim point (an abandoned merge may span it alongside the objects the
    // catalog used).
    let first = usable().map(|(_, d)| d.start).min()?.max(trim);
    // Where a chain can reach, and the object that reaches it first (listing order); a chain
    // starts where the value is `None`.
    let mut reach: HashMap<u64, Option<usize>> = usable()
        .map(|(_, d)| d.start)
        .filter(|start| *start <= first)
        .chain([first])
        .map(|start| (start, None))
        .collect();
    for (i, data) in usable() {
        if reach.contains_key(&data.start) {
            reach.entry(data.end).or_insert(Some(i));
        }
    }
    let furthest = reach.keys().copied().max().unwrap_or(first);
    let mut chain = Vec::new();
    let mut pos = furthest;
    while let Some(Some(i)) = reach.get(&pos) {
        chain.push(*i);
        pos = objects[*i].0.start;
    }
    chain.reverse();
    Some((chain, furthest))
}

fn object_garbage(object: &nova_core::object_store::ObjectMeta) -> Garbage {
    Garbage::Object {
        key: object.key.clone(),
        bytes: object.size,
    }
}

/// Takes one settled object into the index, from its footer.
async fn take(
    store: &dyn ObjectStore,
    clock: Clock,
    data: DataKey,
    key: String,
    out: &mut Found,
) -> Result<(), RebuildError> {
    let footer = match retrying(clock, || fetch_footer(store, &key)).await {
        Ok(ObjectFooter::Flight(footer)) => footer,
        Ok(ObjectFooter::Fence(_)) => {
            return Err(RebuildError::Foreign {
                key,
                what: "a fence where a settled object belongs".into(),
            });
        }
        Err(source) => return Err(RebuildError::Flight { key, source }),
    };
    // Sections of one stream, end to end, covering exactly what the key says.
    let sections = &footer.sections;
    let contiguous = sections.windows(2).all(|w| w[0].end_seq == w[1].start_seq);
    let (Some(first), Some(last)) = (sections.first(), sections.last()) else {
        return Err(RebuildError::Foreign {
            key,
            what: "a settled object without sections".into(),
        });
    };
    if !contiguous
        || sections
            .iter()
            .any(|s| s.stream_id != data.stream_id || s.stream != first.stream)
        || (first.start_seq, last.end_seq) != (data.start, data.end)
    {
        return Err(RebuildError::Foreign {
            key,
            what: format!(
                "its sections do not hold records {}..{} of stream id {} end to end",
                data.start, data.end, data.stream_id
            ),
        });
    }
    let section = first;
    let Some(stream) = stream_of(
        &mut out.streams,
        &mut out.names,
        &mut out.report,
        section,
        footer.meta.created_at_ms,
        &key,
    )?
    else {
        return Ok(());
    };
    out.report.settled_objects += 1;
    // An object spanning the trim point: its sections wholly below it were trimmed.
    let trim = stream.trim;
    for section in sections.iter().filter(|s| s.end_seq > trim) {
        stream.add(section.start_seq, section.end_seq, section.len);
        out.report.records += section.end_seq - section.start_seq;
        out.pending.push(IndexEntry::for_section(
            &key,
            section,
            footer.meta.created_at_ms,
        ));
    }
    Ok(())
}
