//! What a seed's events do to the fleet: kill, pause, cut off, saturate, drain, join, roll,
//! stall etcd, create and delete streams.

use std::sync::Arc;
use std::time::Duration;

use nova_core::clock::Clock;

use super::plan::{Event, MAX_STARS};
use super::{World, client, link, node};

pub(super) async fn apply(world: &Arc<World>, event: Event) {
    let clock = world.clock;
    match event {
        Event::Kill { star, down } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.kills += 1);
            node.kill();
            clock.sleep(down).await;
            world.restart_if_current(&node);
        }
        Event::Pause { star, lasting } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.pauses += 1);
            node.pause();
            clock.sleep(lasting).await;
            node.resume();
        }
        Event::CutMetastore {
            star,
            lasting,
            silent,
        } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.cuts += 1);
            let state = if silent {
                link::LinkState::Silent
            } else {
                link::LinkState::Cut
            };
            cut(&node.meta, state, lasting, clock).await;
        }
        Event::CutStore { star, lasting } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.cuts += 1);
            cut(&node.store, link::LinkState::Cut, lasting, clock).await;
        }
        Event::CutClients { star, lasting } => {
            let Some(node) = world.node(star) else { return };
            world.count(|c| c.cuts += 1);
            cut(&node.clients, link::LinkState::Cut, lasting, clock).await;
        }
        Event::Saturate { star, lasting } => {
            let Some(up) = world.node(star).and_then(|n| n.up()) else {
                return;
            };
            world.count(|c| c.saturations += 1);
            up.fleet.set_saturated(true);
            clock.sleep(lasting).await;
            up.fleet.set_saturated(false);
        }
        Event::Leave {
            star,
            down,
            returns,
        } => {
            let Some(node) = world.node(star) else { return };
            // The last star of the fleet always comes back: a fleet of none leads nothing.
            let others = (0..MAX_STARS)
                .filter(|&i| i != star && world.slots.lock()[i].wanted)
                .count();
            if !returns && others > 0 {
                world.slots.lock()[star].wanted = false;
            }
            node::leave(world, &node).await;
            clock.sleep(down).await;
            world.restart_if_current(&node);
        }
        Event::Join { star } => {
            if world.slots.lock()[star].wanted {
                return;
            }
            world.slots.lock()[star].wanted = true;
            node::start(world, star);
        }
        Event::RollingRestart => {
            world.count(|c| c.rolling_restarts += 1);
            for index in 0..MAX_STARS {
                let Some(node) = world.node(index) else {
                    continue;
                };
                node::leave(world, &node).await;
                world.restart_if_current(&node);
                // The next star once this one is up again, or once whatever else happened to
                // it (another event may have killed the new incarnation) has happened.
                let started = clock.now();
                while let Some(next) = world.node(index) {
                    if next.up().is_some() || clock.since(started) > node::RESTART_LIMIT {
                        break;
                    }
                    clock.sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Event::StallMetastore { lasting } => {
            world.metastore.stall(lasting);
        }
        Event::CreateStream => {
            let index = {
                let mut streams = world.streams.lock();
                let index = streams.1;
                streams.1 += 1;
                index
            };
            if client::create(world, index, Duration::from_secs(30)).await {
                world.count(|c| c.creates += 1);
                world.streams.lock().0.push(index);
                world.serve_stream(index);
            }
        }
        Event::DeleteStream => {
            let victim = {
                let mut streams = world.streams.lock();
                if streams.0.len() <= 1 {
                    return;
                }
                let at = world.entropy.below(streams.0.len() as u64) as usize;
                let victim = streams.0.remove(at);
                streams.2.insert(victim);
                victim
            };
            // From here its records may vanish, whether or not the delete lands.
            world.oracle.lock().delete_stream(victim);
            if client::delete(world, victim, Duration::from_secs(60)).await {
                world.count(|c| c.deletes += 1);
            }
        }
    }
}

/// Cuts `link` for `lasting`, then restores it if nothing else changed it meanwhile.
pub(super) async fn cut(
    link: &link::Link,
    state: link::LinkState,
    lasting: Duration,
    clock: Clock,
) {
    if link.state() != link::LinkState::Up {
        return;
    }
    link.set(state);
    clock.sleep(lasting).await;
    if link.state() == state {
        link.set(link::LinkState::Up);
    }
}
