//! The settled-object pass of a rebuild: each stream's settled objects, in key order, chained
//! from its first record (or where a trim may have moved it) as far as any chain reaches; what
//! the chain passes over is queued for collection.

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
/// last ended, from the stream's first record (or, with trim markers, from where a trim may
/// have moved it; see `chain_of`) as far as any chain reaches; those are indexed. Objects
/// wholly below the trim point are queued for collection.
/// Objects inside the chosen chain's records that it does not use (replaced by a rewrite, or
/// left by an interrupted settle) are queued for collection. Objects past where the chain ends
/// are kept: their records may be needed once the flights have filled the gap.
async fn choose(
    store: &dyn ObjectStore,
    clock: Clock,
    candidates: Candidates,
    out: &mut Found,
) -> Result<(), RebuildError> {
    let (trim, trim_reached) = out
        .streams
        .get(&candidates.stream_id)
        .map_or((0, 0), |stream| (stream.trim, stream.trim_reached));
    let (trimmed, objects): (Vec<_>, Vec<_>) = candidates
        .objects
        .into_iter()
        .partition(|(data, _)| data.end <= trim);
    for (_, meta) in &trimmed {
        out.garbage.push((clock.unix_ms(), object_garbage(meta)));
    }
    // A merged object whose footer does not parse (one the store composed wrongly, whose
    // swap never landed and whose delete failed) is left out, and the chain chosen again
    // without it, but only when the objects left still reach as far (see `cover_without`):
    // otherwise the rebuild stops, as for any unreadable object, rather than restore the
    // stream short.
    let mut unreadable = vec![false; objects.len()];
    let (chain, furthest) = 'choose: loop {
        let Some((chain, furthest)) = chain_of(&objects, &unreadable, trim, trim_reached) else {
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
            match cover_without(
                &objects,
                &unreadable,
                (trim, trim_reached),
                &chain,
                furthest,
            ) {
                Cover::Lost => {
                    return Err(RebuildError::Flight {
                        key: meta.key.clone(),
                        source: FetchError::Format {
                            key: meta.key.clone(),
                            source,
                        },
                    });
                }
                Cover::Whole => tracing::warn!(
                    object = %meta.key,
                    "rebuild: a merged object is unreadable ({source}); its records are taken \
                     from the objects it was merged from"
                ),
                Cover::From(start) => tracing::warn!(
                    object = %meta.key,
                    start,
                    "rebuild: a merged object is unreadable ({source}) and the objects it was \
                     merged from hold its records only from {start} on; the stream starts \
                     there if its trim markers allow, and the rebuild refuses it otherwise"
                ),
            }
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
/// ended, reaching as far as any chain does, and where it ends; `None` without a usable object.
///
/// A chain may start at the stream's lowest record, at any object holding the trim point `trim`
/// (an abandoned merge may span it alongside the objects the catalog used), or at any object
/// starting at or below `trim_reached`, the furthest a trim marker says retention was about to
/// trim: records below it may be gone, so a chain from past them is as good as one from the
/// first record. That matters when a trim committed but no later marker says so: a settle
/// after it writes an object from the new trim point, overlapping the one an interrupted
/// settle wrote before it, and only a chain from the trim point reaches the newest records.
/// Of the chains reaching a point, the one starting lowest is taken, so nothing is left out
/// that a chain could keep.
fn chain_of(
    objects: &[(DataKey, nova_core::object_store::ObjectMeta)],
    unreadable: &[bool],
    trim: u64,
    trim_reached: u64,
) -> Option<(Vec<usize>, u64)> {
    let mut usable: Vec<(usize, &DataKey)> = objects
        .iter()
        .enumerate()
        .filter(|(i, (data, _))| !unreadable[*i] && data.start < data.end)
        .map(|(i, (data, _))| (i, data))
        .collect();
    // By first record: every object ending at a point comes before those starting there.
    usable.sort_by_key(|(_, data)| (data.start, data.end));
    let first = usable.first()?.1.start.max(trim);
    let roots = first.max(trim_reached);
    // Each point a chain reaches: where the lowest-starting chain to it starts, and the object
    // ending it there.
    let mut reach: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for &(i, data) in &usable {
        let from = match reach.get(&data.start) {
            Some(&(from, _)) => from,
            None if data.start <= roots => data.start,
            None => continue,
        };
        let better = reach.get(&data.end).is_none_or(|&(known, _)| from < known);
        if better {
            reach.insert(data.end, (from, i));
        }
    }
    let furthest = reach.keys().next_back().copied().unwrap_or(first);
    let mut chain = Vec::new();
    let mut pos = furthest;
    while let Some(&(_, i)) = reach.get(&pos) {
        chain.push(i);
        pos = objects[i].0.start;
    }
    chain.reverse();
    Some((chain, furthest))
}

/// What the objects left cover once the `unreadable` ones are left out of `chain`.
#[derive(Debug, PartialEq, Eq)]
enum Cover {
    /// No chain reaches as far as `chain` did any more: the rebuild stops rather than restore
    /// the stream short.
    Lost,
    /// A chain from where `chain` started, or from before, reaches as far.
    Whole,
    /// A chain reaches as far only from this later record. That is a stream's restored front
    /// when its trim markers say retention was about to trim past it (those records were past
    /// retention); otherwise the continuity check refuses the stream as missing its front.
    From(u64),
}

/// `reached`: where `chain` ended. A chain without the unreadable objects must reach it, not
/// only the end of the object left out: past that, the objects the old chain ended with may
/// alone hold the stream's newest records.
fn cover_without(
    objects: &[(DataKey, nova_core::object_store::ObjectMeta)],
    unreadable: &[bool],
    (trim, trim_reached): (u64, u64),
    chain: &[usize],
    reached: u64,
) -> Cover {
    let start = |chain: &[usize]| chain.first().map_or(u64::MAX, |&i| objects[i].0.start);
    match chain_of(objects, unreadable, trim, trim_reached) {
        Some((without, reach)) if reach >= reached => {
            if start(&without) <= start(chain) {
                Cover::Whole
            } else {
                Cover::From(start(&without))
            }
        }
        _ => Cover::Lost,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use nova_core::object_store::ObjectMeta;

    fn objects(ranges: &[(u64, u64)]) -> Vec<(DataKey, ObjectMeta)> {
        ranges
            .iter()
            .map(|&(start, end)| {
                let data = DataKey {
                    stream_id: 1,
                    start,
                    end,
                    rewritten: false,
                };
                let meta = ObjectMeta {
                    key: format!("{start}-{end}"),
                    size: 1,
                    modified_ms: None,
                };
                (data, meta)
            })
            .collect()
    }

    fn chain(ranges: &[(u64, u64)], trim: u64, trim_reached: u64) -> (Vec<(u64, u64)>, u64) {
        let objects = objects(ranges);
        let unreadable = vec![false; objects.len()];
        let (chain, furthest) = chain_of(&objects, &unreadable, trim, trim_reached).unwrap();
        let chain = chain.iter().map(|&i| ranges[i]).collect();
        (chain, furthest)
    }

    #[test]
    fn the_chain_reaching_furthest_is_taken_and_the_lowest_of_those() {
        // A rewrite's merge beside the objects it merged: either reaches 30; the merge is one.
        assert_eq!(
            chain(&[(0, 10), (0, 30), (10, 20), (20, 30)], 0, 0),
            (vec![(0, 30)], 30)
        );
        // An interrupted settle's object, reaching less far than the one that replaced it.
        assert_eq!(
            chain(&[(0, 10), (0, 12), (10, 15)], 0, 0),
            (vec![(0, 10), (10, 15)], 15)
        );
        // Past a gap, nothing is chained.
        assert_eq!(chain(&[(0, 10), (12, 20)], 0, 0), (vec![(0, 10)], 10));
    }

    #[test]
    fn a_chain_may_start_where_a_trim_may_have_moved_the_stream() {
        // A settle cut off before its swap left 0..28; retention then trimmed to 21 (its marker
        // says 21 was reached, not that it committed) and the next settle wrote 21..29. Only
        // the chain from 21 holds record 28.
        assert_eq!(chain(&[(0, 28), (21, 29)], 0, 21), (vec![(21, 29)], 29));
        // Without a marker reaching 21, 21..29 continues nothing.
        assert_eq!(chain(&[(0, 28), (21, 29)], 0, 0), (vec![(0, 28)], 28));
        // Where a chain from the first record reaches as far, it is the one taken: nothing
        // the trim may not have removed is left out.
        assert_eq!(
            chain(&[(0, 28), (21, 29), (28, 29)], 0, 21),
            (vec![(0, 28), (28, 29)], 29)
        );
        // An object spanning the committed trim point still starts a chain.
        assert_eq!(
            chain(&[(0, 10), (10, 20)], 5, 5),
            (vec![(0, 10), (10, 20)], 20)
        );
    }

    /// The chain of `ranges` with `trims`, and what covers it once object `merge` is unreadable.
    fn without(ranges: &[(u64, u64)], merge: usize, trims: (u64, u64)) -> (Vec<usize>, Cover) {
        let objects = objects(ranges);
        let readable = vec![false; objects.len()];
        let (with_merge, reached) = chain_of(&objects, &readable, trims.0, trims.1).unwrap();
        let mut unreadable = readable;
        unreadable[merge] = true;
        let cover = cover_without(&objects, &unreadable, trims, &with_merge, reached);
        (with_merge, cover)
    }

    #[test]
    fn an_unreadable_merge_is_left_out_only_where_the_rest_reach_as_far() {
        // 10..30 is a merge whose footer does not parse.
        let all = [(0, 10), (10, 20), (10, 30), (20, 30), (30, 40)];
        assert_eq!(without(&all, 2, (0, 25)), (vec![0, 2, 4], Cover::Whole));
        // Without 10..20, only a chain from 20 (a trim was about to move the stream to 25)
        // reaches 40: records 0..20 are left out, as the marker allows.
        let some = [(0, 10), (10, 30), (20, 30), (30, 40)];
        assert_eq!(without(&some, 1, (0, 25)), (vec![0, 1, 3], Cover::From(20)));
        // Without a marker reaching 20, no chain reaches past 10: the rebuild stops.
        assert_eq!(without(&some, 1, (0, 0)).1, Cover::Lost);
        // Without 20..30, the rest reach past the merge (to 35) but not as far as the chain
        // did (40): 30..40 alone held records 35..40, so the rebuild stops.
        let these = [(0, 10), (10, 30), (10, 20), (20, 35), (30, 40)];
        assert_eq!(without(&these, 1, (0, 0)), (vec![0, 1, 4], Cover::Lost));
        // An empty range never starts a chain.
        assert_eq!(chain(&[(5, 5), (5, 9)], 0, 5), (vec![(5, 9)], 9));
    }
}
