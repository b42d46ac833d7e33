//! The gateway's metrics, in its own registry, with the same conventions as novad's.

use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use nova_core::metrics::{
    BudgetMetrics, RpcMetrics, StoreMetrics, budget, counter, counter_vec, gauge, register,
};

#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    pub registry: Registry,
    pub fetch_pool: BudgetMetrics,
    /// The most bytes the fetch pool has held at once.
    pub fetch_pool_peak: IntGauge,
    pub footer_cache_capacity: IntGauge,
    pub footer_cache_bytes: IntGauge,
    pub footer_cache_hits: IntCounter,
    pub footer_cache_misses: IntCounter,
    pub object_cache_capacity: IntGauge,
    pub object_cache_bytes: IntGauge,
    pub object_cache_hits: IntCounter,
    pub object_cache_misses: IntCounter,
    pub object_cache_first_requests: IntCounter,
    /// Section fetches by how they were routed: owner (this instance owns the object), peer
    /// (another instance owns it), spilled (the owner was over its load bound), direct (the
    /// owner is down, or a peer fetch failed).
    pub fetches: IntCounterVec,
    /// This instance's fetches in flight to each tier member.
    pub claims: IntGaugeVec,
    pub claims_peak: IntGaugeVec,
    pub peer_failures: IntCounterVec,
    /// Reads by where their records came from: history (the object store), star (forwarded).
    pub reads: IntCounterVec,
    /// Reads that found an object gone (the auditor moved and collected it) and resolved again.
    pub stale_refs: IntCounter,
    /// Reads that failed, by the code the consumer got (`UNAVAILABLE`: the store or the star
    /// did not answer; `NOT_FOUND`, `OUT_OF_RANGE`: the consumer asked for what is not there).
    pub read_errors: IntCounterVec,
    pub store: StoreMetrics,
    pub rpc: RpcMetrics,
    /// 1 while the object store answers the gateway's probes.
    pub store_reachable: IntGauge,
    /// 1 while the star (--star) answers the gateway's probes.
    pub star_reachable: IntGauge,
    /// 1 while both answer: the gateway can serve history and the tail.
    pub ready: IntGauge,
    /// New reads refused at a cap, by cap.
    pub sheds: IntCounterVec,
    /// Reads in progress, and how many may be (`--max-reads`).
    pub reads_in_progress: IntGauge,
    pub reads_capacity: IntGauge,
    /// The gateway's memory formula by term, its ceiling, and their ratio.
    pub formula: IntGaugeVec,
    pub ceiling: IntGauge,
    pub saturation: prometheus::Gauge,
    /// Resident memory, CPU and the allocator's figures, under the star's names.
    pub process: nova_server::memory::ProcessMetrics,
    /// Freed large buffers kept for reuse (`--recycle-buffer-mib`), and large allocations by
    /// whether one served them; refreshed at each scrape.
    pub recycle_held: IntGauge,
    pub recycle_buffers: IntCounterVec,
    /// Bytes of pages read ahead (`--read-ahead-bytes`).
    pub read_ahead: BudgetMetrics,
    /// Read-ahead slots in use (at most `--max-read-aheads`).
    pub read_ahead_slots: IntGauge,
    /// What became of each read-ahead: used, outdated, expired, no_room, hot, failed,
    /// unneeded; cap counts those not started for want of a slot.
    pub read_aheads: IntCounterVec,
    /// Read-aheads begun, by when: while the page before was still being fetched, or after.
    pub read_aheads_begun: IntCounterVec,
    /// Serializes copying the allocator's totals into `recycle_buffers` (two scrapes at once
    /// would each add the same difference).
    recycle_sync: std::sync::Arc<std::sync::Mutex<()>>,
}

impl GatewayMetrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let metrics = Self {
            fetch_pool: budget(&r, "nova_gateway_fetch_pool", "bytes", "fetch pool"),
            fetch_pool_peak: gauge(
                &r,
                "nova_gateway_fetch_pool_peak_bytes",
                "The most bytes the fetch pool has held at once.",
            ),
            footer_cache_capacity: gauge(&r, "nova_gateway_footer_cache_capacity_bytes", "Capacity of the footer cache (--footer-cache-bytes)."),
            footer_cache_bytes: gauge(&r, "nova_gateway_footer_cache_used_bytes", "Weighted size of the footers cached."),
            footer_cache_hits: counter(&r, "nova_gateway_footer_cache_hits_total", "Footer lookups served from the cache."),
            footer_cache_misses: counter(&r, "nova_gateway_footer_cache_misses_total", "Footer lookups that read the object store."),
            object_cache_capacity: gauge(&r, "nova_gateway_object_cache_capacity_bytes", "Capacity of the object cache (--object-cache-bytes)."),
            object_cache_bytes: gauge(&r, "nova_gateway_object_cache_used_bytes", "Weight of the object ranges cached: their bytes, plus each one's key and 256 bytes of bookkeeping."),
            object_cache_hits: counter(&r, "nova_gateway_object_cache_hits_total", "Owned ranges served from the cache."),
            object_cache_misses: counter(&r, "nova_gateway_object_cache_misses_total", "Owned ranges fetched from the object store."),
            object_cache_first_requests: counter(&r, "nova_gateway_object_cache_first_requests_total", "Owned ranges fetched from the object store for their first request and not cached (--object-cache-admission repeat); also counted as misses."),
            fetches: counter_vec(&r, "nova_gateway_fetches_total", "Section fetches by route: owner, peer, spilled, direct.", &["route"]),
            claims: register(&r, IntGaugeVec::new(Opts::new("nova_gateway_claims", "This instance's fetches in flight to each tier member."), &["member"]).expect("valid metric")),
            claims_peak: register(&r, IntGaugeVec::new(Opts::new("nova_gateway_claims_peak", "The most fetches this instance has had in flight to each tier member at once."), &["member"]).expect("valid metric")),
            peer_failures: counter_vec(&r, "nova_gateway_peer_failures_total", "Fetches from a peer that failed (the peer is skipped for a while).", &["member"]),
            reads: counter_vec(&r, "nova_gateway_reads_total", "Reads served, by where the records came from.", &["source"]),
            stale_refs: counter(&r, "nova_gateway_stale_refs_total", "Reads that found an object the auditor had collected and resolved their refs again."),
            read_errors: counter_vec(&r, "nova_gateway_read_errors_total", "Reads that failed, by the gRPC code the consumer got.", &["code"]),
            store: StoreMetrics::register(&r),
            rpc: RpcMetrics::register(&r, "nova_gateway"),
            store_reachable: gauge(&r, "nova_gateway_store_reachable", "1 while the object store answers the gateway's probes (every 5 s)."),
            star_reachable: gauge(&r, "nova_gateway_star_reachable", "1 while the star (--star) answers the gateway's probes (every 5 s)."),
            ready: gauge(&r, "nova_gateway_ready", "1 while the gateway's object store and star both answer."),
            sheds: counter_vec(&r, "nova_gateway_sheds_total", "New reads refused with RESOURCE_EXHAUSTED, by the cap that refused them.", &["cap"]),
            reads_in_progress: gauge(&r, "nova_gateway_reads", "Reads in progress, from arrival until their response is sent."),
            reads_capacity: gauge(&r, "nova_gateway_reads_capacity", "Reads in progress allowed at once (--max-reads)."),
            formula: register(&r, IntGaugeVec::new(Opts::new("nova_gateway_memory_formula_bytes", "Terms of the gateway's memory formula: fetch_pool, footer_cache, object_cache, recycle (--recycle-buffer-mib), reads (--max-reads × per-read state), read_ahead (--read-ahead-bytes), read_aheads (--max-read-aheads × per-read state), fixed."), &["term"]).expect("valid metric")),
            ceiling: gauge(&r, "nova_gateway_memory_ceiling_bytes", "The memory the gateway may use: its cgroup's limit, else 60% of physical memory."),
            saturation: register(&r, prometheus::Gauge::new("nova_gateway_memory_saturation_ratio", "The memory formula divided by the ceiling.").expect("valid metric")),
            process: nova_server::memory::ProcessMetrics::register(&r),
            recycle_held: gauge(&r, "nova_recycle_buffer_bytes", "Bytes of freed large buffers kept for reuse (at most --recycle-buffer-mib)."),
            recycle_buffers: counter_vec(&r, "nova_recycle_buffers_total", "Allocations of 128 KiB or more by where their buffer came from: reused (a kept one, already resident) or fresh (newly mapped).", &["source"]),
            recycle_sync: Default::default(),
            read_ahead: budget(&r, "nova_gateway_read_ahead", "bytes", "read-ahead budget"),
            read_ahead_slots: gauge(&r, "nova_gateway_read_ahead_slots", "Read-ahead slots: pages being read ahead or waiting for their request (a read claimed or expired while still under way keeps its --max-read-aheads place until it ends)."),
            read_aheads: counter_vec(&r, "nova_gateway_read_aheads_total", "Read-aheads by outcome: used (its request took it), outdated (its request came, but the stream had been deleted, trimmed or its tail gone back since), expired (no request came within 2 s), no_room (--read-ahead-bytes had no room for the page), hot (the page would come from the star), failed (the read failed, or the star did not answer the claim), unneeded (begun while the page before was read, which then ended at the star's in-memory stretch, failed, or found the next page read ahead already); cap: not started, every --max-read-aheads place taken.", &["outcome"]),
            read_aheads_begun: counter_vec(&r, "nova_gateway_read_aheads_begun_total", "Read-aheads begun, by when: while_read (once the page before had all its sections on their way; when the section it ends in is small against a page, the next page's sections are fetched from then on, so the consumer's GETs stay a full window from page to page), after (once the page before was read: it stopped growing short of its plan).", &["when"]),
            registry: r,
        };
        for route in ["owner", "peer", "spilled", "direct"] {
            metrics.fetches.with_label_values(&[route]);
        }
        metrics.sheds.with_label_values(&["max_reads"]);
        metrics
            .sheds
            .with_label_values(&[nova_server::net::small::SHED_LABEL]);
        for outcome in [
            "used", "outdated", "expired", "no_room", "hot", "failed", "cap", "unneeded",
        ] {
            metrics.read_aheads.with_label_values(&[outcome]);
        }
        for when in ["while_read", "after"] {
            metrics.read_aheads_begun.with_label_values(&[when]);
        }
        for source in ["history", "star"] {
            metrics.reads.with_label_values(&[source]);
        }
        for code in [
            "UNAVAILABLE",
            "NOT_FOUND",
            "OUT_OF_RANGE",
            "INTERNAL",
            "DATA_LOSS",
        ] {
            metrics.read_errors.with_label_values(&[code]);
        }
        metrics
    }

    pub fn render(&self) -> String {
        self.process.refresh();
        {
            let _one_at_a_time = self.recycle_sync.lock().unwrap_or_else(|e| e.into_inner());
            let recycled = nova_core::allocator::reuse::stats();
            self.recycle_held.set(recycled.held as i64);
            for (source, total) in [("reused", recycled.reused), ("fresh", recycled.fresh)] {
                let counter = self.recycle_buffers.with_label_values(&[source]);
                counter.inc_by(total.saturating_sub(counter.get()));
            }
        }
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}
