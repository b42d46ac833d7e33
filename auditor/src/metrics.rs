//! The auditor's series, registered in the process's registry beside the star's.

use prometheus::{
    Counter, CounterVec, Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use nova_core::object_store::RateLimitedMetrics;
use nova_core::prom::{counter, counter_vec, gauge, register};

/// The duties, as the `duty` label spells them.
pub const DUTIES: [&str; 6] = [
    "settle",
    "collect",
    "drop_deleted",
    "rewrite",
    "retention",
    "sweep",
];

#[derive(Debug, Clone)]
pub struct AuditorMetrics {
    /// The age of the oldest due duty, across duties: what operators alert on.
    pub oldest_due_age: Gauge,
    pub due_age: GaugeVec,
    pub store: RateLimitedMetrics,
    /// Seconds spent waiting at each budget (`s3_requests`, `rewrite_bytes`, `workers`).
    pub budget_wait_seconds: CounterVec,
    pub jobs: IntCounterVec,
    pub workers: IntGauge,
    pub workers_busy: IntGauge,
    /// Bytes assembled through the star and written, by duty.
    pub written_bytes: IntCounterVec,
    pub written_objects: IntCounterVec,
    /// Bytes the rewrite had the object store copy server-side (never through the star).
    pub copied_bytes: IntCounter,
    /// Settled objects the rewrite merged into larger ones.
    pub rewritten_objects: IntCounter,
    /// Bytes and records retention trimmed, by reason (`age`, `bytes`).
    pub trimmed_bytes: IntCounterVec,
    pub trimmed_records: IntCounter,
    /// Trims retention refused, by reason (`clock`: the star's clock called an object old
    /// that the object store's clock does not).
    pub refused_trims: IntCounterVec,
    /// Merged objects the store composed wrong (their size not the one asked for), never
    /// swapped in.
    pub rejected_merges: IntCounter,
    /// Queued garbage whose due time a clock that was ahead had put in the future, brought
    /// back.
    pub redated_garbage: IntCounter,
    pub settled_flights: IntCounter,
    pub deleted_objects: IntCounterVec,
    pub reclaimed_bytes: IntCounter,
    pub dropped_entries: IntCounter,
    /// Settled objects the sweep found unreferenced and queued, and sweep passes completed.
    pub swept_objects: IntCounter,
    pub sweeps: IntCounter,
    /// Chains of departed stars this auditor settles and sweeps besides its own, and the jobs
    /// on them that failed.
    pub adopted_chains: IntGauge,
    pub adopted_failures: IntCounter,
    pub cache_hits: IntCounter,
    pub cache_misses: IntCounter,
    /// Objects read with ranged GETs because the fetch cache could not admit them whole.
    pub cache_fallbacks: IntCounter,
    pub cache_resident: IntGauge,
    pub cache_capacity: IntGauge,
}

impl AuditorMetrics {
    pub fn register(r: &Registry) -> Self {
        let m = AuditorMetrics {
            oldest_due_age: register(
                r,
                Gauge::new(
                    "nova_auditor_oldest_due_age_seconds",
                    "Age of the oldest duty the auditor has due and not yet done (0 when none).",
                )
                .expect("valid metric"),
            ),
            due_age: register(
                r,
                GaugeVec::new(
                    Opts::new(
                        "nova_auditor_due_age_seconds",
                        "Age of the oldest due work of each duty (0 when none).",
                    ),
                    &["duty"],
                )
                .expect("valid metric"),
            ),
            store: RateLimitedMetrics {
                issued: counter_vec(
                    r,
                    "nova_auditor_requests_total",
                    "Object-store requests the auditor issued, by operation.",
                    &["op"],
                ),
                waited_seconds: register(
                    r,
                    Counter::new(
                        "nova_auditor_request_budget_wait_seconds_total",
                        "Seconds auditor requests waited for --auditor-s3-budget.",
                    )
                    .expect("valid metric"),
                ),
            },
            budget_wait_seconds: register(
                r,
                CounterVec::new(
                    Opts::new(
                        "nova_auditor_budget_wait_seconds_total",
                        "Seconds auditor work waited at each budget.",
                    ),
                    &["budget"],
                )
                .expect("valid metric"),
            ),
            jobs: counter_vec(
                r,
                "nova_auditor_jobs_total",
                "Auditor jobs run, by duty and outcome.",
                &["duty", "outcome"],
            ),
            workers: gauge(
                r,
                "nova_auditor_workers",
                "Jobs the auditor may run at once (--auditor-workers).",
            ),
            workers_busy: gauge(r, "nova_auditor_workers_busy", "Auditor jobs running now."),
            written_bytes: counter_vec(
                r,
                "nova_auditor_written_bytes_total",
                "Bytes the auditor assembled and wrote, by duty.",
                &["duty"],
            ),
            written_objects: counter_vec(
                r,
                "nova_auditor_written_objects_total",
                "Objects the auditor wrote, by duty.",
                &["duty"],
            ),
            copied_bytes: counter(
                r,
                "nova_auditor_copied_bytes_total",
                "Bytes the rewrite had the object store copy server-side (UploadPartCopy), free of the rewrite budget.",
            ),
            rewritten_objects: counter(
                r,
                "nova_auditor_rewritten_objects_total",
                "Settled objects the rewrite merged into larger ones.",
            ),
            trimmed_bytes: counter_vec(
                r,
                "nova_auditor_trimmed_bytes_total",
                "Bytes of records retention trimmed from streams' fronts, by reason (age, bytes).",
                &["reason"],
            ),
            trimmed_records: counter(
                r,
                "nova_auditor_trimmed_records_total",
                "Records retention trimmed from streams' fronts.",
            ),
            refused_trims: counter_vec(
                r,
                "nova_auditor_refused_trims_total",
                "Trims retention refused, by reason (clock: the star's wall clock called an object old that the object store's clock does not).",
                &["reason"],
            ),
            rejected_merges: counter(
                r,
                "nova_auditor_rejected_merges_total",
                "Merged objects the object store composed with a size other than the one asked for (copy ranges not honoured); never swapped in.",
            ),
            redated_garbage: counter(
                r,
                "nova_auditor_redated_garbage_total",
                "Queued deletions a wall clock that was ahead had dated in the future, brought back to now.",
            ),
            settled_flights: counter(
                r,
                "nova_auditor_settled_flights_total",
                "Chain slots whose streams' records were moved to settled objects.",
            ),
            deleted_objects: counter_vec(
                r,
                "nova_auditor_deleted_objects_total",
                "Objects the auditor deleted, by kind (chain_slot, settled, orphan).",
                &["kind"],
            ),
            reclaimed_bytes: counter(
                r,
                "nova_auditor_reclaimed_bytes_total",
                "Bytes of the objects the auditor deleted.",
            ),
            dropped_entries: counter(
                r,
                "nova_auditor_dropped_entries_total",
                "Index entries of deleted streams the auditor removed.",
            ),
            swept_objects: counter(
                r,
                "nova_auditor_swept_objects_total",
                "Settled objects the sweep found nothing referencing and queued for collection.",
            ),
            sweeps: counter(
                r,
                "nova_auditor_sweeps_total",
                "Passes of the sweep over every settled object.",
            ),
            adopted_chains: gauge(
                r,
                "nova_auditor_adopted_chains",
                "Chains of stars that left the fleet which this star's auditor settles and sweeps.",
            ),
            adopted_failures: counter(
                r,
                "nova_auditor_adopted_failures_total",
                "Settle jobs on an adopted chain that failed (logged when the cause changes).",
            ),
            cache_hits: counter(
                r,
                "nova_auditor_fetch_cache_hits_total",
                "Whole-object reads served by the fetch cache.",
            ),
            cache_misses: counter(
                r,
                "nova_auditor_fetch_cache_misses_total",
                "Whole-object reads the fetch cache did not hold.",
            ),
            cache_fallbacks: counter(
                r,
                "nova_auditor_fetch_cache_fallbacks_total",
                "Objects read with ranged GETs because the fetch cache could not admit them.",
            ),
            cache_resident: gauge(
                r,
                "nova_auditor_fetch_cache_resident_bytes",
                "Bytes the fetch cache holds on disk.",
            ),
            cache_capacity: gauge(
                r,
                "nova_auditor_fetch_cache_capacity_bytes",
                "The fetch cache's budget (--auditor-fetch-cache-mib).",
            ),
        };
        for duty in DUTIES {
            m.due_age.with_label_values(&[duty]);
            m.written_bytes.with_label_values(&[duty]);
            m.written_objects.with_label_values(&[duty]);
            for outcome in ["done", "idle", "failed"] {
                m.jobs.with_label_values(&[duty, outcome]);
            }
        }
        for op in [
            "put",
            "put_if_absent",
            "get",
            "head",
            "list",
            "delete",
            "compose",
        ] {
            m.store.issued.with_label_values(&[op]);
        }
        for reason in ["age", "bytes"] {
            m.trimmed_bytes.with_label_values(&[reason]);
        }
        m.refused_trims.with_label_values(&["clock"]);
        for budget in ["s3_requests", "rewrite_bytes", "workers"] {
            m.budget_wait_seconds.with_label_values(&[budget]);
        }
        for kind in ["chain_slot", "settled", "orphan"] {
            m.deleted_objects.with_label_values(&[kind]);
        }
        m
    }
}
