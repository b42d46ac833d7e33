//! The gateway's memory formula: what its budgets let it hold, exported term by term beside
//! its ceiling, as the star's is.
//!
//! ```text
//! fetch pool + footer cache + object cache + recycled buffers + --max-reads × per-read state
//!   + read-ahead bytes + --max-read-aheads × per-read state + fixed overhead
//! ```
//!
//! The fetch pool bounds every byte a read, a footer fetch or a range served to a peer holds
//! from its fetch until its response is sent; the caches are bounded by their capacities (the
//! object cache's table of first requests by 1/1024 of it, `crate::admission`); each
//! read in progress adds its own state outside the pool (`PER_READ_BYTES`); freed large buffers
//! kept for reuse are at most `--recycle-buffer-mib` (`nova_core::allocator::reuse`); pages
//! read ahead are bounded by `--read-ahead-bytes` as the pool bounds reads, and each read-ahead
//! holds a read's state besides. The fixed overhead
//! is the star's 48 MiB base (binary, runtime, connection pools, allocator slack).

use nova_core::formula::{FIXED_OVERHEAD, REQUEST_MESSAGES};
use nova_server::memory::detect_ceiling;

use crate::admission::Doorkeeper;
use crate::config::Config;
use crate::metrics::GatewayMetrics;
use crate::read::PER_READ_BYTES;

/// The formula's terms, in bytes.
pub fn terms(config: &Config) -> [(&'static str, u64); 8] {
    [
        ("fetch_pool", config.fetch_inflight),
        ("footer_cache", config.footer_cache_bytes),
        (
            "object_cache",
            config.object_cache_bytes + Doorkeeper::bytes_for(config.object_cache_bytes),
        ),
        ("recycle", config.recycle_buffer_bytes()),
        ("reads", config.max_reads as u64 * PER_READ_BYTES),
        (
            "read_ahead",
            config.read_ahead().map_or(0, |(bytes, _)| bytes),
        ),
        (
            "read_aheads",
            config
                .read_ahead()
                .map_or(0, |(_, slots)| slots as u64 * PER_READ_BYTES),
        ),
        ("fixed", FIXED_OVERHEAD + REQUEST_MESSAGES),
    ]
}

/// Exports the formula, the ceiling and the saturation, and warns when the formula does not fit.
pub fn export(config: &Config, metrics: &GatewayMetrics) {
    let ceiling = detect_ceiling(None);
    let mut total = 0;
    for (term, bytes) in terms(config) {
        metrics.formula.with_label_values(&[term]).set(bytes as i64);
        total += bytes;
    }
    metrics.ceiling.set(ceiling.bytes as i64);
    let saturation = total as f64 / ceiling.bytes.max(1) as f64;
    metrics.saturation.set(saturation);
    if total > ceiling.bytes {
        tracing::warn!(
            formula = %nova_proto::units::human_bytes(total),
            ceiling = %nova_proto::units::human_bytes(ceiling.bytes),
            ceiling_source = %ceiling.source,
            "the gateway's budgets (--fetch-inflight, --footer-cache-bytes, --object-cache-bytes, \
             --recycle-buffer-mib, --max-reads, --read-ahead-bytes, --max-read-aheads) do not fit under its memory ceiling"
        );
    }
}
