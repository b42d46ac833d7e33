//! The end of a seed: every fault ends, then the checks that the fleet converges (liveness)
//! and that every acknowledged record is there.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::metastore::MetastoreFaults;
use crate::store::StoreFaults;

use super::client::{self, Outcome, Router};
use super::plan::{MAX_STARS, star_id};
use super::{LIVENESS_SLACK, LIVENESS_TTLS, World, link, node};

/// Ends every fault, then checks that the fleet converges and that every acknowledged record
/// is there.
pub(super) async fn end_faults(world: &Arc<World>) {
    let clock = world.clock;
    // The clients stop; whatever they were waiting for may or may not land.
    world.clients.lock().abort_all();
    loop {
        let next = world.clients.lock().try_join_next();
        match next {
            Some(_) => continue,
            None if world.clients.lock().is_empty() => break,
            None => clock.sleep(Duration::from_millis(10)).await,
        }
    }
    world.oracle.lock().process_ended();
    world.store.set_faults(StoreFaults::none());
    world.metastore.set_faults(MetastoreFaults::none());
    for index in 0..MAX_STARS {
        world.step_clock(index, 0);
    }
    for slot in world.slots.lock().iter() {
        if let Some(node) = &slot.node {
            node.resume();
            for link in [&node.meta, &node.store, &node.clients] {
                if matches!(link.state(), link::LinkState::Cut | link::LinkState::Silent) {
                    link.set(link::LinkState::Up);
                }
            }
            if let Some(up) = node.up() {
                up.fleet.set_saturated(false);
            }
        }
    }
    // Stars that are down and wanted start again now (a kill's restart may be pending).
    for index in 0..MAX_STARS {
        let wanted = world.slots.lock()[index].wanted;
        if wanted && world.node(index).is_none() {
            node::start(world, index);
        }
    }
    let bound = world.plan.lease_ttl * LIVENESS_TTLS + LIVENESS_SLACK;
    let ended = clock.now();
    let streams = world.streams.lock().0.clone();
    // Liveness: every stream takes an append again.
    let router = Router::new(world.clone());
    for &index in &streams {
        loop {
            if probe(world, &router, index).await {
                break;
            }
            if clock.since(ended) > bound {
                world.violation(format!(
                    "stream s{index} took no append for {bound:?} after the last fault, with \
                     {} stars running: a stream left without a leader",
                    world.running().len()
                ));
                return;
            }
            clock.sleep(Duration::from_millis(200)).await;
        }
    }
    // Every departed star's chain settled: no chain registered for a star that is not running.
    loop {
        let pending = departed_chains(world);
        if pending.is_empty() {
            break;
        }
        if clock.since(ended) > bound {
            world.violation(format!(
                "departed stars' chains still unsettled {bound:?} after the last fault: {pending:?}"
            ));
            return;
        }
        clock.sleep(Duration::from_millis(200)).await;
    }
    read_back(world, &streams).await;
}

/// Chains registered (`fleet/chains/…`) or being taken over for stars not running now.
fn departed_chains(world: &World) -> Vec<String> {
    let running: HashSet<String> = world
        .running()
        .iter()
        .filter(|n| n.up().is_some())
        .map(|n| n.id.clone())
        .collect();
    world
        .metastore
        .snapshot()
        .keys()
        .filter_map(|key| {
            let key = String::from_utf8_lossy(key);
            let id = key
                .strip_prefix("fleet/chains/")
                .or_else(|| key.strip_prefix("fleet/takeover/"))?;
            (!running.contains(id)).then(|| key.into_owned())
        })
        .collect()
}

/// One append of a record of its own to stream `index`: true once acknowledged.
async fn probe(world: &Arc<World>, router: &Router, index: usize) -> bool {
    let (batch, ids) = world.oracle.lock().new_batch(index, &[16]);
    let records = vec![nova_core::record::Record {
        timestamp: world.clock.unix_ms(),
        headers: vec![],
        body: crate::oracle::body(ids[0], 16),
    }];
    let name = format!("s{index}");
    let outcome = router
        .on_leader(&name, |node, up, state| {
            let records = records.clone();
            async move {
                let charge = nova_chain::admission::encoded_charge(1, 0, 16);
                let admitted = up.star.admission().admit(charge).await;
                let chunks = nova_core::flight::section::encode_chunks(
                    &records,
                    nova_core::limits::MAX_SECTION_BYTES as usize,
                );
                match up.star.submit(state, chunks, 16, None, admitted).await {
                    Ok(receiver) => match receiver.await {
                        Ok(Ok(range)) => Outcome::Done((range.start, range.end, node.id.clone())),
                        Ok(Err(nova_proto::RequestError::OutcomeUnknown(why))) => {
                            Outcome::Unknown(why)
                        }
                        Ok(Err(error)) => Outcome::Refused(error.to_string()),
                        Err(_) => Outcome::Unknown("dropped".into()),
                    },
                    Err(error) => Outcome::Refused(error.to_string()),
                }
            }
        })
        .await;
    let mut oracle = world.oracle.lock();
    match outcome {
        Outcome::Done((start, end, star)) => {
            oracle.acked_by(
                batch,
                start,
                end,
                &format!("a liveness probe's ack from {star}"),
            );
            true
        }
        Outcome::Refused(why) => {
            oracle.refused(batch, &why);
            false
        }
        Outcome::Unknown(_) => {
            oracle.maybe(batch);
            false
        }
    }
}

/// The final check: every stream read from 0 to its tail, entering the fleet at a random star.
async fn read_back(world: &Arc<World>, streams: &[usize]) {
    let router = Router::new(world.clone());
    let mut read_ids = HashSet::new();
    let mut first_seqs = std::collections::HashMap::new();
    for &index in streams {
        let name = format!("s{index}");
        first_seqs.insert(index, 0);
        let mut next = 0;
        let mut attempts = 0;
        loop {
            match client::read(&router, &name, next, 1000).await {
                Outcome::Done(Ok((records, page_next, tail))) => {
                    let mut oracle = world.oracle.lock();
                    for (seq, body) in &records {
                        if *seq != next {
                            oracle.violation(format!(
                                "final read of s{index}: seq {seq} where {next} belonged"
                            ));
                            return;
                        }
                        read_ids.extend(oracle.read(index, *seq, body));
                        next += 1;
                    }
                    oracle.tail(index, tail, true, "the final read");
                    if page_next >= tail {
                        break;
                    }
                    if records.is_empty() {
                        oracle.violation(format!(
                            "final read of s{index} at {next} returned nothing"
                        ));
                        return;
                    }
                }
                Outcome::Done(Err(error)) => {
                    world.violation(format!("final read of s{index} at {next}: {error}"));
                    return;
                }
                Outcome::Refused(why) | Outcome::Unknown(why) => {
                    attempts += 1;
                    if attempts > 100 {
                        world.violation(format!("final read of s{index} at {next}: {why}"));
                        return;
                    }
                    world.clock.sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    world.oracle.lock().settle(&read_ids, &first_seqs);
    check_chains(world);
}

/// Nothing acknowledged past a slot that never landed, in any star's chain.
fn check_chains(world: &World) {
    let objects = world.store.snapshot();
    let mut oracle = world.oracle.lock();
    for index in 0..MAX_STARS {
        crate::run::check_chain_of(&star_id(index), &objects, &mut oracle, &|_| false);
    }
}
