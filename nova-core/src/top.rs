//! Who gets refused most, in bounded memory. Stream names and peer addresses are unbounded label
//! values: a counter per stream or per peer would grow with every name a client invents. A
//! [`TopTally`] keeps a fixed number of slots and counts with the space-saving algorithm: a key
//! that is not tallied takes the slot of the smallest count and starts from that count plus one.
//! Every key whose true count exceeds `total / slots` is guaranteed a slot, and a reported count
//! overstates the truth by at most the count the slot was taken over at (its `error`).
//!
//! [`TopRefusals`] tallies sheds and rejections by stream and by peer and exports the most
//! refused of each as gauges, rendered at each scrape from the tallies, so the series count is
//! bounded by the slots whatever the clients do.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts, Registry};

/// Keys tallied per dimension. Larger than what is exported, so the exported ranks are stable.
pub const TALLY_SLOTS: usize = 64;

/// Ranks exported per dimension.
pub const EXPORTED_RANKS: usize = 10;

/// Keys longer than this are cut: the slots stay small even when names are long.
const MAX_KEY_BYTES: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tallied {
    pub key: String,
    /// Hits counted for the key; may overstate its true count by up to `error`.
    pub count: u64,
    /// The count the key inherited when it took its slot over.
    pub error: u64,
}

#[derive(Debug)]
pub struct TopTally {
    slots: Mutex<Vec<Tallied>>,
    capacity: usize,
}

impl TopTally {
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: Mutex::new(Vec::with_capacity(capacity)),
            capacity: capacity.max(1),
        }
    }

    /// Counts one hit for `key`.
    pub fn hit(&self, key: &str) {
        let key = truncate(key);
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.iter_mut().find(|s| s.key == key) {
            slot.count += 1;
            return;
        }
        if slots.len() < self.capacity {
            slots.push(Tallied {
                key: key.to_owned(),
                count: 1,
                error: 0,
            });
            return;
        }
        // Full: the key takes over the smallest slot (there is one: capacity >= 1).
        if let Some(smallest) = slots.iter_mut().min_by_key(|s| s.count) {
            let floor = smallest.count;
            *smallest = Tallied {
                key: key.to_owned(),
                count: floor + 1,
                error: floor,
            };
        }
    }

    /// The `n` largest tallies, largest first (ties by key, for a stable order).
    pub fn top(&self, n: usize) -> Vec<Tallied> {
        let mut slots = self.slots.lock().clone();
        slots.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        slots.truncate(n);
        slots
    }
}

fn truncate(key: &str) -> &str {
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let mut end = MAX_KEY_BYTES;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

/// The peer as a tally key: its IP address alone, since every connection has a port of its own.
pub fn peer_key(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "unknown".to_owned(), |p| p.ip().to_string())
}

/// Sheds and rejections by stream and by peer, exported as the most refused of each.
#[derive(Debug, Clone)]
pub struct TopRefusals {
    streams: Arc<TopTally>,
    peers: Arc<TopTally>,
    /// What is exported, refilled from the tallies at each scrape (under `exporting`, so two
    /// scrapes at once do not interleave a reset with a refill).
    streams_gauge: IntGaugeVec,
    peers_gauge: IntGaugeVec,
    exporting: Arc<Mutex<()>>,
}

impl TopRefusals {
    /// Registers `{prefix}_top_refused_streams` and `{prefix}_top_refused_peers` in `registry`.
    pub fn register(registry: &Registry, prefix: &str) -> Self {
        let vec = |what: &str, label: &str| {
            IntGaugeVec::new(
                Opts::new(
                    format!("{prefix}_top_refused_{what}"),
                    format!(
                        "Sheds and rejections since start for the {EXPORTED_RANKS} most refused \
                         {what} (approximate: tallied in {TALLY_SLOTS} slots, never undercounted)."
                    ),
                ),
                &[label],
            )
            .expect("valid metric")
        };
        let top = Self {
            streams: Arc::new(TopTally::new(TALLY_SLOTS)),
            peers: Arc::new(TopTally::new(TALLY_SLOTS)),
            streams_gauge: vec("streams", "stream"),
            peers_gauge: vec("peers", "peer"),
            exporting: Arc::default(),
        };
        crate::prom::register(registry, top.clone());
        top
    }

    /// Counts one refusal of work for `stream` from `peer` (each when known).
    pub fn hit(&self, stream: Option<&str>, peer: Option<SocketAddr>) {
        if let Some(stream) = stream {
            self.streams.hit(stream);
        }
        if peer.is_some() {
            self.peers.hit(&peer_key(peer));
        }
    }

    pub fn top_streams(&self, n: usize) -> Vec<Tallied> {
        self.streams.top(n)
    }

    pub fn top_peers(&self, n: usize) -> Vec<Tallied> {
        self.peers.top(n)
    }
}

impl Collector for TopRefusals {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.streams_gauge.desc();
        descs.extend(self.peers_gauge.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _exporting = self.exporting.lock();
        let mut families = Vec::new();
        for (gauge, tally) in [
            (&self.streams_gauge, &self.streams),
            (&self.peers_gauge, &self.peers),
        ] {
            gauge.reset();
            for tallied in tally.top(EXPORTED_RANKS) {
                gauge
                    .with_label_values(&[tallied.key.as_str()])
                    .set(tallied.count.min(i64::MAX as u64) as i64);
            }
            families.extend(gauge.collect());
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_hitters_keep_their_slots_whatever_else_comes() {
        let tally = TopTally::new(4);
        for round in 0..1000u32 {
            tally.hit("noisy");
            if round % 2 == 0 {
                tally.hit("busy");
            }
            // A new key every time: a client inventing names.
            tally.hit(&format!("one-off-{round}"));
        }
        let top = tally.top(2);
        assert_eq!(top[0].key, "noisy");
        assert_eq!(top[1].key, "busy");
        assert!(top[0].count >= 1000, "never undercounted: {top:?}");
        assert!(top[0].count - top[0].error <= 1000, "{top:?}");
        assert_eq!(tally.slots.lock().len(), 4, "bounded by its slots");
    }

    #[test]
    fn long_keys_are_cut_at_a_char_boundary() {
        let tally = TopTally::new(2);
        let long = "é".repeat(200);
        tally.hit(&long);
        let top = tally.top(1);
        assert!(top[0].key.len() <= MAX_KEY_BYTES);
        assert!(long.starts_with(&top[0].key));
    }

    #[test]
    fn the_export_is_bounded_and_names_the_most_refused() {
        let registry = Registry::new();
        let top = TopRefusals::register(&registry, "nova");
        let peer: SocketAddr = "10.0.0.7:5555".parse().unwrap();
        for i in 0..100 {
            top.hit(Some(&format!("s{i}")), Some(peer));
            top.hit(Some("hot"), None);
            top.hit(None, Some(peer));
        }
        let families = registry.gather();
        let streams = families
            .iter()
            .find(|f| f.name() == "nova_top_refused_streams")
            .unwrap();
        assert_eq!(streams.get_metric().len(), EXPORTED_RANKS);
        let rendered = crate::prom::render_families(&families);
        assert!(
            rendered.contains("nova_top_refused_streams{stream=\"hot\"} 100"),
            "{rendered}"
        );
        assert!(
            rendered.contains("nova_top_refused_peers{peer=\"10.0.0.7\"} 200"),
            "{rendered}"
        );
    }
}
