//! The star's metrics. One `Metrics` per star, registered in its own registry so tests can run
//! several stars side by side. Names carry the `nova_` prefix and a unit suffix.

use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry,
};

use nova_core::metrics::{
    BudgetMetrics, MemoryMetrics, RpcMetrics, StoreMetrics, budget, counter, counter_vec, gauge,
    histogram, register, render_families, wait_buckets,
};
use nova_core::top::TopRefusals;

/// Every stall cause, as exported (`StallCause::as_str` in `stall`): the first three are
/// the backlog's, the next two the flight writers', and the admission buffer can stall for any.
pub const STALL_CAUSES: [&str; 6] = [
    "absorb_lag",
    "metastore_slow",
    "predecessor_settling",
    "object_store_unavailable",
    "object_store_rejecting",
    "write_throughput",
];

#[derive(Debug, Clone)]
pub struct TailCacheMetrics {
    pub capacity: IntGauge,
    pub in_use: IntGauge,
    pub flights: IntGauge,
    pub evicted_flights: IntCounter,
    pub skipped_flights: IntCounter,
    pub hits: IntCounter,
    pub misses: IntCounter,
}

/// The Express class: its buffer, its acknowledgements and its zones.
#[derive(Debug, Clone)]
pub struct ExpressMetrics {
    /// `--s3-express-memory-buffer-mib`: bytes of Express batches from admission until the
    /// Standard store holds them.
    pub buffer: BudgetMetrics,
    pub oldest_admitted_age: Gauge,
    /// Bundles acknowledged at a quorum of zones.
    pub bundles_acked: IntCounter,
    /// Batches acknowledged at a quorum of zones.
    pub acks: IntCounter,
    /// Bundles that missed their quorum within the publish deadline, by what their producers
    /// were told (`unavailable`, `outcome_unknown`).
    pub deadline_failures: IntCounterVec,
    /// How long each zone took to hold a bundle, by zone.
    pub zone_latency: HistogramVec,
    /// How long bundles took to reach their quorum.
    pub quorum_latency: Histogram,
    /// Bundles being published now.
    pub bundles_in_flight: IntGauge,
    /// 1 while Express appends are refused because a bundle missed its quorum and the express
    /// chain is being sealed (zones unreachable).
    pub down: IntGauge,
    /// Times the express chain was sealed and reopened after a missed quorum.
    pub repairs: IntCounter,
    /// Zone copies deleted once the Standard store and the index hold their records.
    pub collected: IntCounter,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub admission: BudgetMetrics,
    pub express: ExpressMetrics,
    pub backlog: BudgetMetrics,
    /// The read budget: what reads hold (fetched sections, pages, encoded responses).
    pub read_memory: BudgetMetrics,
    pub tail_cache: TailCacheMetrics,
    pub store: StoreMetrics,
    pub producer_sessions: IntGauge,
    pub producer_sessions_capacity: IntGauge,
    pub subscriptions: IntGauge,
    pub subscriptions_capacity: IntGauge,
    /// New work refused at a cap: `cap` names the flag.
    pub sheds: IntCounterVec,
    /// Appends refused for their content: `reason` names the cap or the check.
    pub rejections: IntCounterVec,
    /// Stalls by the budget that stalled and the diagnosed cause.
    pub stalls: IntCounterVec,
    pub stall_seconds: prometheus::CounterVec,
    pub oldest_admitted_age: Gauge,
    /// 1 once the star has lost its chain (it acknowledges nothing more and exits).
    pub fenced: IntGauge,
    /// Streams whose leadership moved while this star held records of them that an absorb
    /// then refused to commit (two writers, detected): those records never reach the index.
    pub deposed_streams: IntCounter,
    /// 1 while the star accepts appends: recovered, not fenced, its object store reachable.
    pub ready: IntGauge,
    /// 1 while flight writes fail with an error retrying will not fix (refused credentials, a
    /// missing bucket, an unsupported request): an operator must act.
    pub store_rejecting: IntGauge,
    pub streams: IntGauge,
    pub streams_capacity: IntGauge,
    pub oldest_unabsorbed_age: Gauge,
    pub flights_in_flight: IntGauge,
    pub flights_in_flight_capacity: IntGauge,
    pub flights_written: IntCounter,
    pub flight_bytes: IntCounter,
    pub flight_write_retries: IntCounter,
    pub flights_absorbed: IntCounter,
    pub absorb_latency: Histogram,
    pub appended_records: IntCounter,
    pub appended_bytes: IntCounter,
    pub read_records: IntCounter,
    pub read_bytes: IntCounter,
    pub memory: MemoryMetrics,
    pub rpc: RpcMetrics,
    /// The star's chain epoch (changes at every restart and takeover of its chain).
    pub epoch: IntGauge,
    /// Server-side time from an append's arrival (its message whole and charged) to its ack,
    /// by storage class.
    pub append_ack: HistogramVec,
    /// Bytes the catalog holds for every stream, as the absorbs leave it.
    pub stored_bytes: IntGauge,
    /// The streams and peers refused most (sheds and rejections), in bounded series.
    pub refused: TopRefusals,
    /// Bytes the metastore takes (the redb file, or etcd's database), refreshed every few
    /// seconds.
    pub metastore_size: IntGauge,
    /// How long flight writes have been failing without a success (0 while they succeed).
    pub store_failing_age: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let metrics = Self::register_all();
        metrics.initialise_series();
        metrics
    }

    fn register_all() -> Self {
        let r = Registry::new();
        let admission = budget(&r, "nova_admission_buffer", "bytes", "admission buffer");
        let backlog = budget(&r, "nova_chain_backlog", "flights", "chain backlog budget");
        let read_memory = budget(&r, "nova_read_memory", "bytes", "read budget");
        let tail_cache = TailCacheMetrics {
            capacity: gauge(
                &r,
                "nova_tail_cache_capacity_bytes",
                "Capacity of the tail window cache.",
            ),
            in_use: gauge(
                &r,
                "nova_tail_cache_used_bytes",
                "Bytes held by the tail window cache.",
            ),
            flights: gauge(
                &r,
                "nova_tail_cache_flights",
                "Flights held by the tail window cache.",
            ),
            evicted_flights: counter(
                &r,
                "nova_tail_cache_evicted_flights_total",
                "Flights evicted from the tail window cache to make room.",
            ),
            skipped_flights: counter(
                &r,
                "nova_tail_cache_skipped_flights_total",
                "Flights larger than the whole tail window cache, never cached.",
            ),
            hits: counter(
                &r,
                "nova_tail_cache_hits_total",
                "Read lookups served from the tail window cache.",
            ),
            misses: counter(
                &r,
                "nova_tail_cache_misses_total",
                "Read lookups that fell back to the object store.",
            ),
        };
        let store = StoreMetrics::register(&r);
        let express = ExpressMetrics {
            buffer: budget(&r, "nova_express_buffer", "bytes", "express buffer"),
            oldest_admitted_age: register(
                &r,
                Gauge::new(
                    "nova_express_oldest_admitted_age_seconds",
                    "Age of the oldest Express batch not yet held by the Standard store.",
                )
                .expect("valid metric"),
            ),
            bundles_acked: counter(
                &r,
                "nova_express_bundles_acked_total",
                "Express bundles acknowledged at a quorum of zones.",
            ),
            acks: counter(
                &r,
                "nova_express_acks_total",
                "Express append batches acknowledged at a quorum of zones.",
            ),
            deadline_failures: counter_vec(
                &r,
                "nova_express_deadline_failures_total",
                "Express bundles that missed their quorum within --s3-express-publish-deadline, by the answer their producers got.",
                &["answer"],
            ),
            zone_latency: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "nova_express_zone_put_seconds",
                        "Time each zone took to hold an Express bundle, by zone.",
                    )
                    .buckets(wait_buckets()),
                    &["zone"],
                )
                .expect("valid metric"),
            ),
            quorum_latency: histogram(
                &r,
                "nova_express_quorum_seconds",
                "Time Express bundles took to reach a quorum of zones.",
            ),
            bundles_in_flight: gauge(
                &r,
                "nova_express_bundles_in_flight",
                "Express bundles being written to the zones now.",
            ),
            down: gauge(
                &r,
                "nova_express_down",
                "1 while Express appends are refused: a bundle missed its quorum and the express chain is being sealed.",
            ),
            repairs: counter(
                &r,
                "nova_express_repairs_total",
                "Times the express chain was sealed and reopened after a bundle missed its quorum.",
            ),
            collected: counter(
                &r,
                "nova_express_collected_total",
                "Zone copies of Express bundles deleted once the Standard store holds their records.",
            ),
        };
        Self {
            admission,
            express,
            backlog,
            read_memory,
            tail_cache,
            store,
            producer_sessions: gauge(&r, "nova_producer_sessions", "Open producer sessions."),
            producer_sessions_capacity: gauge(
                &r,
                "nova_producer_sessions_capacity",
                "Producer sessions allowed at once (--max-producer-sessions).",
            ),
            subscriptions: gauge(
                &r,
                "nova_subscriptions",
                "Reads in progress, including reads waiting at a stream's tail for new records.",
            ),
            subscriptions_capacity: gauge(
                &r,
                "nova_subscriptions_capacity",
                "Reads in progress allowed at once (--max-subscriptions), waiting ones included.",
            ),
            sheds: counter_vec(
                &r,
                "nova_sheds_total",
                "New work refused with RESOURCE_EXHAUSTED, by the cap that refused it.",
                &["cap"],
            ),
            rejections: counter_vec(
                &r,
                "nova_append_rejections_total",
                "Append requests refused for their content, by reason.",
                &["reason"],
            ),
            stalls: counter_vec(
                &r,
                "nova_stalls_total",
                "Times a budget ran out and blocked admission, by budget and diagnosed cause.",
                &["budget", "cause"],
            ),
            stall_seconds: register(
                &r,
                prometheus::CounterVec::new(
                    Opts::new(
                        "nova_stall_seconds_total",
                        "Time spent stalled, by budget and diagnosed cause.",
                    ),
                    &["budget", "cause"],
                )
                .expect("valid metric"),
            ),
            oldest_admitted_age: register(
                &r,
                Gauge::new(
                    "nova_oldest_admitted_age_seconds",
                    "Age of the oldest admitted batch not yet acknowledged or failed.",
                )
                .expect("valid metric"),
            ),
            fenced: gauge(
                &r,
                "nova_star_fenced",
                "1 once the star has lost its chain to another writer or abandoned a flight; it acknowledges nothing more.",
            ),
            deposed_streams: counter(
                &r,
                "nova_fleet_deposed_streams_total",
                "Streams whose leadership moved to another star while this star held records of them: the absorb refused them, so they never reach the index, and appends still waiting were answered as not acknowledged.",
            ),
            ready: gauge(
                &r,
                "nova_star_ready",
                "1 while the star accepts appends: recovered, not fenced, and its object store accepting writes.",
            ),
            store_rejecting: gauge(
                &r,
                "nova_object_store_rejecting",
                "1 while flight writes fail with a permanent error (credentials, bucket, unsupported request); retried, but an operator must act.",
            ),
            streams: gauge(&r, "nova_streams", "Streams in the catalog."),
            streams_capacity: gauge(
                &r,
                "nova_streams_capacity",
                "Streams allowed (--max-streams).",
            ),
            oldest_unabsorbed_age: register(
                &r,
                Gauge::new(
                    "nova_oldest_unabsorbed_flight_age_seconds",
                    "Age of the oldest acknowledged flight not yet absorbed into the index.",
                )
                .expect("valid metric"),
            ),
            flights_in_flight: gauge(
                &r,
                "nova_flights_in_flight",
                "Flights being written to the object store.",
            ),
            flights_in_flight_capacity: gauge(
                &r,
                "nova_flights_in_flight_capacity",
                "Flights that may be written at once (--flight-max-inflight).",
            ),
            flights_written: counter(
                &r,
                "nova_flights_written_total",
                "Flights durable in the object store.",
            ),
            flight_bytes: counter(
                &r,
                "nova_flight_bytes_total",
                "Bytes of flights durable in the object store.",
            ),
            flight_write_retries: counter(
                &r,
                "nova_flight_write_retries_total",
                "Failed flight write attempts that were retried.",
            ),
            flights_absorbed: counter(
                &r,
                "nova_flights_absorbed_total",
                "Flights recorded in the index.",
            ),
            absorb_latency: histogram(
                &r,
                "nova_absorb_commit_seconds",
                "Time one absorb transaction took in the metastore.",
            ),
            appended_records: counter(
                &r,
                "nova_appended_records_total",
                "Records acknowledged, over every stream (per stream: nova_stream_appended_records_total, for the busiest).",
            ),
            appended_bytes: counter(
                &r,
                "nova_appended_bytes_total",
                "Content bytes acknowledged, over every stream (per stream: nova_stream_appended_bytes_total, for the busiest).",
            ),
            read_records: counter(&r, "nova_read_records_total", "Records served by Read."),
            read_bytes: counter(&r, "nova_read_bytes_total", "Content bytes served by Read."),
            memory: MemoryMetrics::register(&r),
            rpc: RpcMetrics::register(&r, "nova"),
            epoch: gauge(&r, "nova_star_epoch", "The star's chain epoch: it changes at every restart or takeover of the chain."),
            append_ack: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "nova_append_ack_seconds",
                        "Server-side time from an append's arrival to its acknowledgement, by storage class.",
                    )
                    .buckets(wait_buckets()),
                    &["class"],
                )
                .expect("valid metric"),
            ),
            stored_bytes: gauge(&r, "nova_stored_bytes", "Bytes of records the catalog holds, over every stream."),
            refused: TopRefusals::register(&r, "nova"),
            store_failing_age: register(
                &r,
                Gauge::new(
                    "nova_object_store_failing_age_seconds",
                    "How long flight writes have been failing without a success in between; 0 while they succeed.",
                )
                .expect("valid metric"),
            ),
            metastore_size: gauge(&r, "nova_metastore_size_bytes", "Bytes the metastore takes: the embedded redb file, or the etcd member's database (what counts against its quota)."),
            registry: r,
        }
    }

    /// Creates the known label combinations at zero, so every series exists from the first
    /// scrape (a counter that appears only after its first event cannot be alerted on or graphed).
    fn initialise_series(&self) {
        for class in ["standard", "express"] {
            self.append_ack.with_label_values(&[class]);
        }
        self.sheds.with_label_values(&["max_producer_sessions"]);
        self.sheds.with_label_values(&["max_subscriptions"]);
        self.sheds.with_label_values(&["max_streams"]);
        self.sheds.with_label_values(&["admin_calls"]);
        self.sheds.with_label_values(&["fleet_capacity"]);
        self.sheds.with_label_values(&["subscription_share"]);
        self.sheds.with_label_values(&["lookup_share"]);
        self.sheds
            .with_label_values(&[nova_core::limits::REQUEST_BODIES_SHED]);
        for reason in [
            "empty_batch",
            "max_batch_records",
            "max_batch_headers",
            "max_batch_bytes",
            "max_record_bytes",
            "invalid_stream_name",
            "stream_not_found",
            "match_seq_num",
            "malformed",
            "express_unavailable",
            "permission_denied",
        ] {
            self.rejections.with_label_values(&[reason]);
        }
        for answer in ["unavailable", "outcome_unknown"] {
            self.express.deadline_failures.with_label_values(&[answer]);
        }
        self.stalls
            .with_label_values(&["express_chain", "express_zone_unreachable"]);
        self.stall_seconds
            .with_label_values(&["express_chain", "express_zone_unreachable"]);
        for (budget, causes) in [
            ("admission_buffer", &STALL_CAUSES[..]),
            ("chain_backlog", &STALL_CAUSES[..3]),
            ("flights_in_flight", &STALL_CAUSES[3..5]),
        ] {
            for cause in causes {
                self.stalls.with_label_values(&[budget, cause]);
                self.stall_seconds.with_label_values(&[budget, cause]);
            }
        }
        for op in ["put", "put_if_absent", "get", "head", "list", "delete"] {
            self.store.latency.with_label_values(&[op]);
            self.store.bytes.with_label_values(&[op]);
            for outcome in [
                "ok",
                "not_found",
                "invalid_range",
                "transient_error",
                "error",
            ] {
                self.store.requests.with_label_values(&[op, outcome]);
            }
        }
        for term in nova_core::formula::TERMS {
            self.memory.formula.with_label_values(&[term]);
        }
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        render_families(&self.registry.gather())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
