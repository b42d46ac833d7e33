//! What the simulation checks of the bucket beyond what clients were told: every chain slot a
//! star's recovery or the auditor should have settled or collected, nothing left behind once
//! the auditor ran to the end, and a catalog rebuilt from the bucket alone.

use super::*;

/// Nothing is acknowledged past a slot that did not land: in each epoch of the chain, every
/// flight after the first missing slot holds only records nobody was told are durable (the
/// next start ends the chain at the gap, so those flights are never read).
pub(super) fn check_chain(world: &World) {
    let objects = world.store.snapshot();
    let mut oracle = world.oracle.lock();
    // An Express stream's records are acknowledged at the zones before a flight carries them;
    // recovery carries them again from the zones.
    let express = |stream: &str| {
        stream
            .strip_prefix('s')
            .and_then(|i| i.parse().ok())
            .is_some_and(|i| class_of(world, i) == StorageClass::Express)
    };
    check_chain_of(STAR, &objects, &mut oracle, &express);
}

/// `check_chain` for the chain of `star` in `objects`, skipping the streams `skip` names.
pub(crate) fn check_chain_of(
    star: &str,
    objects: &BTreeMap<String, Bytes>,
    oracle: &mut Oracle,
    skip: &dyn Fn(&str) -> bool,
) {
    let root = chain_root(star);
    let mut epochs: BTreeMap<u64, BTreeMap<u64, Bytes>> = BTreeMap::new();
    // The auditor's settle markers: slots up to them were settled and may be gone.
    let mut settled: BTreeMap<u64, u64> = BTreeMap::new();
    for (key, object) in objects.range(root.clone()..) {
        let Some(rest) = key.strip_prefix(&root) else {
            break;
        };
        let Some((epoch, slot)) = rest.split_once('/') else {
            continue;
        };
        let Ok(epoch) = epoch.parse::<u64>() else {
            continue;
        };
        if let Some(through) = slot
            .strip_prefix("settled-")
            .and_then(|s| s.parse::<u64>().ok())
        {
            let highest = settled.entry(epoch).or_insert(through);
            *highest = (*highest).max(through);
        } else if let Ok(slot) = slot.parse() {
            epochs
                .entry(epoch)
                .or_default()
                .insert(slot, object.clone());
        }
    }
    for (epoch, slots) in epochs {
        // Up to a settle marker the auditor may have deleted flights (and a late write of one
        // may even have landed again after the delete), so the chain is checked from just past
        // the marker.
        let from = settled.get(&epoch).map_or(0, |through| through + 1);
        let Some(gap) = (from..).find(|slot| !slots.contains_key(slot)) else {
            continue;
        };
        for (slot, object) in slots.range(gap..) {
            let flight = match parse_object(object) {
                Ok(ObjectFooter::Flight(flight)) => flight,
                Ok(ObjectFooter::Fence(_)) => continue,
                Err(err) => {
                    oracle.violation(format!(
                        "{star}: epoch {epoch} slot {slot} does not parse: {err}"
                    ));
                    continue;
                }
            };
            for section in &flight.sections {
                if skip(&section.stream) {
                    continue;
                }
                let range = section.offset as usize..(section.offset + section.len) as usize;
                let acked = RecordIter::new(object.slice(range))
                    .filter_map(Result::ok)
                    .filter(|record| oracle.is_acked(&record.body))
                    .count();
                if acked > 0 {
                    oracle.violation(format!(
                        "{star}: epoch {epoch} slot {slot} holds {acked} acknowledged records of stream {} (seqs {}..{}), past slot {gap} that never landed",
                        section.stream, section.start_seq, section.end_seq
                    ));
                }
            }
        }
    }
}

/// After the auditor finished: every settled object is referenced by an index entry, no flight
/// is left in an epoch before the star's current one, and every entry's object exists.
pub(super) async fn check_nothing_left(world: &World, epoch: u64) {
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
    let Ok(streams) = catalog.load_streams().await else {
        world.violation("the final catalog could not be read".into());
        return;
    };
    let objects = world.store.snapshot();
    let mut referenced = HashSet::new();
    for (meta, _) in &streams {
        let Ok(entries) = catalog.index_entries(meta.id, 0, 100_000).await else {
            world.violation(format!("the index of {} could not be read", meta.name));
            return;
        };
        for entry in entries {
            if !objects.contains_key(&entry.object_key) {
                world.violation(format!(
                    "{}'s entry {}..{} points at missing {}",
                    meta.name, entry.start_seq, entry.end_seq, entry.object_key
                ));
            }
            referenced.insert(entry.object_key);
        }
    }
    let root = data_root(STAR);
    for key in objects.keys().filter(|k| k.starts_with(&root)) {
        if !referenced.contains(key) {
            // What the catalog still says of it, for the report: a live stream's entry is in
            // `referenced`, so an entry here is a deleted stream's.
            let writing = catalog.being_written(key).await.ok();
            let entry = match parse_any_data_key(key) {
                Some(data) => catalog
                    .index_entry(data.stream_id, data.end)
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            world.violation(format!(
                "settled object {key} is left unreferenced (being written: {writing:?}; the \
                 index entry at its end: {entry:?})"
            ));
        }
    }
    check_chain_left(world, &objects, epoch);
    let mut trim_points = HashMap::new();
    for (meta, _) in &streams {
        match catalog.first_seq(meta.id).await {
            Ok(first) => trim_points.insert(meta.id, first),
            Err(_) => return world.violation("the final trim points could not be read".into()),
        };
    }
    // A trim queues the markers before it; what stays says where the stream is trimmed to.
    let trims = trims_root(STAR);
    for key in objects.keys().filter(|k| k.starts_with(&trims)) {
        let Some((id, marker)) = parse_trim_marker(&trims, key) else {
            world.violation(format!("{key} is no trim marker"));
            continue;
        };
        match trim_points.get(&id) {
            Some(first) if marker.after >= *first => {}
            Some(first) => world.violation(format!(
                "trim marker {key} is left behind the stream's trim point {first}"
            )),
            None => world.violation(format!("trim marker {key} of a deleted stream is left")),
        }
    }
}

/// What the settle leaves of the chain once it has caught up: of an epoch before `epoch` (the
/// star's current one), at most its fence and its last settle marker; of the current one, its
/// latest settle marker alone and no slot at or below it.
pub(super) fn check_chain_left(world: &World, objects: &BTreeMap<String, Bytes>, epoch: u64) {
    let root = chain_root(STAR);
    // Per epoch: its slots (with their bytes) and its settle markers.
    type Left<'a> = (Vec<(u64, &'a Bytes)>, Vec<u64>);
    let mut epochs: BTreeMap<u64, Left> = BTreeMap::new();
    // A slot or marker whose PUT landed after its run was collected is the sweep's to find.
    let chain = objects.iter().filter(|(k, _)| k.starts_with(&root));
    for (key, bytes) in chain {
        let Some(e) = parse_epoch(&root, key) else {
            continue;
        };
        let prefix = chain_prefix(STAR, e);
        let (slots, markers) = epochs.entry(e).or_default();
        if let Some(slot) = parse_slot(&prefix, key) {
            slots.push((slot, bytes));
        } else if let Some(through) = parse_settle_marker(&settle_marker_prefix(STAR, e), key) {
            markers.push(through);
        }
    }
    for (e, (slots, markers)) in epochs {
        if e < epoch {
            // Its fence and its last marker stay; its slots go.
            if markers.len() > 1 {
                world.violation(format!(
                    "settled epoch {e} keeps superseded markers {markers:?}"
                ));
            }
            let fences = slots
                .iter()
                .filter(|(_, b)| matches!(parse_object(b), Ok(ObjectFooter::Fence(_))))
                .count();
            if slots.len() > fences.min(1) {
                let slots: Vec<u64> = slots.iter().map(|(s, _)| *s).collect();
                world.violation(format!("settled epoch {e} keeps slots {slots:?}"));
            }
        } else if let Some(&through) = markers.iter().max() {
            if markers.len() > 1 {
                world.violation(format!("epoch {e} keeps superseded markers: {markers:?}"));
            }
            let left: Vec<u64> = slots
                .iter()
                .map(|(s, _)| *s)
                .filter(|s| *s <= through)
                .collect();
            if !left.is_empty() {
                world.violation(format!(
                    "epoch {e} keeps slots {left:?} settled through {through}"
                ));
            }
        }
    }
}

/// The metastore is lost with its disk; `rebuild_catalog` restores it from the bucket alone,
/// retried through faults as an operator would, before the star starts on it.
pub(super) async fn rebuild(world: &World, index: usize, clock: Clock) -> Result<(), ()> {
    tracing::info!("the metastore is lost; rebuilding the catalog from the bucket");
    world.metastore.wipe();
    // An operator's rebuild runs against a new, quiet metastore: no commit of it lands late
    // (a late one would make its retry find a catalog it did not finish; see docs/testing.md).
    let faults = world.metastore.faults();
    world.metastore.set_faults(MetastoreFaults {
        late: 0.0,
        ..faults.clone()
    });
    let store: Arc<dyn ObjectStore> = Arc::new(world.store.clone());
    let catalog = Catalog::new(Arc::new(world.metastore.clone()));
    // Half the rebuilds first find a stream's front object missing from the bucket: the
    // rebuild must refuse, not take the records for trimmed; the object is then put back (the
    // operator restores it) and the rebuild run again.
    let mut hidden = Entropy::seeded(world.seed ^ 0x00f2_070b_1ec7 ^ index as u64)
        .chance(0.5)
        .then(|| hide_a_front_object(world))
        .flatten();
    let mut last = String::new();
    for _ in 0..100 {
        match rebuild_catalog(STAR, &store, &catalog, clock).await {
            Ok(report) => {
                tracing::info!(?report, "catalog rebuilt");
                if let Some((key, object)) = hidden.take() {
                    // Too late: the catalog no longer points at these records.
                    world.store.put_back(&key, object);
                }
                world.metastore.set_faults(faults);
                return Ok(());
            }
            Err(RebuildError::FrontMissing {
                stream,
                trimmed,
                found,
            }) if hidden.is_some() => {
                tracing::info!(
                    stream,
                    trimmed,
                    found,
                    "the rebuild refused a stream missing its front; putting it back"
                );
                if let Some((key, object)) = hidden.take() {
                    world.store.put_back(&key, object);
                }
                // A refused rebuild leaves a catalog being restored: start over on an empty one.
                world.metastore.wipe();
            }
            Err(err) => {
                last = err.to_string();
                tracing::debug!("rebuilding the catalog: {err}");
                clock.sleep(Duration::from_millis(500)).await;
            }
        }
    }
    world.violation(format!(
        "incarnation {index}: the catalog could not be rebuilt from the bucket: {last}"
    ));
    Err(())
}

/// Takes the object holding the lowest records of one stream out of the store (a settled or
/// merged one: records still in chain flights are read from there), returning it. Only a
/// stream with records in a later object loses its front: one whose every object is gone
/// leaves nothing in the bucket to tell that it had records.
pub(super) fn hide_a_front_object(world: &World) -> Option<(String, Bytes)> {
    let mut objects: BTreeMap<u64, Vec<(u64, u64, String)>> = BTreeMap::new();
    for key in world.store.snapshot().into_keys() {
        if let Some(data) = parse_any_data_key(&key) {
            objects
                .entry(data.stream_id)
                .or_default()
                .push((data.start, data.end, key));
        }
    }
    let fronts: Vec<String> = objects
        .into_values()
        .filter_map(|mut list| {
            list.sort();
            let (_, end, key) = list.first()?.clone();
            // Something past its end that it does not also hold.
            list.iter().any(|(_, e, _)| *e > end).then_some(key)
        })
        .collect();
    if fronts.is_empty() {
        return None;
    }
    let pick = Entropy::seeded(world.seed ^ 0x41de).below(fronts.len() as u64) as usize;
    let key = fronts[pick].clone();
    tracing::info!(
        key,
        "a stream's front object goes missing before the rebuild"
    );
    world.store.take(&key).map(|object| (key, object))
}
