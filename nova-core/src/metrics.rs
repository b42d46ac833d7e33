//! Prometheus metrics every crate shares: the object store's series, the gRPC calls' series,
//! the build info, and (re-exported from `prom`) the helpers they are made with. The star's own
//! metrics are nova-chain's `metrics`; the gateway's and the auditor's live beside them.

use prometheus::{Gauge, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

pub use crate::formula::MemoryMetrics;
pub use crate::prom::{
    BudgetMetrics, budget, counter, counter_vec, gauge, histogram, register, render_families,
    wait_buckets,
};

#[derive(Debug, Clone)]
pub struct StoreMetrics {
    pub requests: IntCounterVec,
    pub latency: HistogramVec,
    pub bytes: IntCounterVec,
}

impl StoreMetrics {
    /// Registers the object-store series in `r`.
    pub fn register(r: &Registry) -> Self {
        StoreMetrics {
            requests: counter_vec(
                r,
                "nova_object_store_requests_total",
                "Object store requests by operation and outcome.",
                &["op", "outcome"],
            ),
            latency: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "nova_object_store_request_duration_seconds",
                        "Object store request latency by operation.",
                    )
                    .buckets(wait_buckets()),
                    &["op"],
                )
                .expect("valid metric"),
            ),
            bytes: counter_vec(
                r,
                "nova_object_store_bytes_total",
                "Bytes written to or read from the object store by operation.",
                &["op"],
            ),
        }
    }
}

/// Requests by gRPC method and the code they ended with, and how long they took (for a
/// streaming call, the whole call).
#[derive(Debug, Clone)]
pub struct RpcMetrics {
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
}

impl RpcMetrics {
    pub fn register(r: &Registry, prefix: &str) -> Self {
        Self {
            requests: counter_vec(
                r,
                &format!("{prefix}_rpc_requests_total"),
                "gRPC calls by method and the code they ended with.",
                &["method", "code"],
            ),
            duration: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        format!("{prefix}_rpc_duration_seconds"),
                        "Time gRPC calls took, by method, from the request to the end of the \
                         response (for a streaming call, the whole call).",
                    )
                    .buckets(wait_buckets()),
                    &["method"],
                )
                .expect("valid metric"),
            ),
        }
    }
}

impl nova_proto::rpc::RpcObserver for RpcMetrics {
    type Guard = ();

    fn begin<B>(&self, _request: &http::Request<B>) {}

    fn observe(&self, method: &'static str, code: nova_proto::Code, seconds: f64) {
        self.requests
            .with_label_values(&[method, code_name(code)])
            .inc();
        self.duration.with_label_values(&[method]).observe(seconds);
    }
}

/// The code's name as gRPC spells it, for a metric label.
pub use nova_proto::error::code_name;

/// `nova_build_info{version}` (always 1) and `nova_process_start_time_seconds`, for a binary.
pub fn register_build_info(r: &Registry, prefix: &str, version: &str, started_unix_secs: f64) {
    let info = IntGaugeVec::new(
        Opts::new(
            format!("{prefix}_build_info"),
            "Always 1; the labels say which build is running.",
        ),
        &["version"],
    )
    .expect("valid metric");
    info.with_label_values(&[version]).set(1);
    register(r, info);
    let started = Gauge::new(
        format!("{prefix}_process_start_time_seconds"),
        "When the process started, in seconds since the Unix epoch.",
    )
    .expect("valid metric");
    started.set(started_unix_secs);
    register(r, started);
}
