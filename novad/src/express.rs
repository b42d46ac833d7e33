//! The Express class's flags: the zone buckets, and opening a store for each.
//!
//! Each zone gets its own S3 client and its own concurrency limit, separate from the regional
//! store's, so a slow zone never holds Standard flights back (or the other way round). A zone's
//! requests are made once (no retries inside the SDK: the fanout retries within the publish
//! deadline itself) and time out at the deadline.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use nova_chain::express::{ExpressConfig, Zone, Zones};
use nova_core::object_store::{Backend, ObjectStore, S3Config, StoreLimits, StoreStack};

use crate::config::Config;
use crate::zone_spec::ZonePlace;

/// Zone-bucket writes in flight at once, per zone. Bundles in flight are bounded by the express
/// lane (64), so this is never the bottleneck of a healthy zone; reads (a successor's walk,
/// collection's listing) get as many.
const ZONE_CONCURRENCY: usize = 64;

/// Opens every zone's store and checks each makes conditional creates exclusive (a zone that
/// does not would let a zombie and its successor both win a slot). `None` without zones.
pub async fn open_zones(config: &Config) -> anyhow::Result<Option<ExpressConfig>> {
    if config.s3_express_zone.is_empty() {
        return Ok(None);
    }
    let deadline = config.s3_express_publish_deadline.0;
    let limits = StoreLimits {
        read_concurrency: ZONE_CONCURRENCY,
        write_concurrency: ZONE_CONCURRENCY,
        // A zone write past the deadline no longer counts toward its bundle's quorum.
        request_timeout: deadline,
        clock: nova_core::clock::Clock::system(),
    };
    let mut zones = Vec::new();
    let mut answered = 0;
    for spec in &config.s3_express_zone {
        let backend = match &spec.place {
            ZonePlace::Bucket { bucket, endpoint } => {
                let mut s3 = S3Config::new(bucket.clone());
                s3.prefix = config.store.s3_prefix.clone();
                s3.endpoint = endpoint
                    .clone()
                    .or_else(|| config.store.s3_endpoint.clone());
                s3.region = config.store.s3_region.clone();
                s3.force_path_style = config.store.s3_path_style;
                // The fanout retries within the deadline itself, with its own backoff.
                s3.max_attempts = 1;
                Backend::S3(s3)
            }
            ZonePlace::Dir(dir) => Backend::Local {
                root: dir.clone(),
                writer: true,
            },
        };
        let store: Arc<dyn ObjectStore> = StoreStack::open(backend, limits.clone())
            .await
            .with_context(|| match &spec.place {
                ZonePlace::Dir(dir) => {
                    format!("opening express zone {} at {}", spec.name, dir.display())
                }
                ZonePlace::Bucket { bucket, .. } => {
                    format!("opening express zone {} in bucket {bucket}", spec.name)
                }
            })?
            .build();
        let probe = format!(
            "probe/express/{}/{}-{:016x}",
            config.star_id,
            nova_core::clock::Clock::system().unix_ms(),
            rand_suffix()
        );
        // A zone that is down now must not keep the star (and its Standard streams) from
        // starting: Express needs only a quorum, and the fanout keeps trying every zone. A zone
        // that answers wrongly (no exclusive conditional creates, refused credentials, a
        // missing bucket) is a configuration error and stops the start.
        match tokio::time::timeout(
            deadline.max(Duration::from_secs(1)) * 2,
            nova_core::object_store::probe_conditional_create(store.as_ref(), &probe),
        )
        .await
        {
            Ok(Ok(())) => answered += 1,
            Ok(Err(err)) if err.is_retryable() => {
                tracing::warn!(
                    zone = spec.name,
                    "express zone unreachable at start-up: {err}"
                );
            }
            Ok(Err(err)) => {
                return Err(err).with_context(|| {
                    format!(
                        "express zone {} ({spec}) cannot serve as a zone bucket",
                        spec.name
                    )
                });
            }
            Err(_) => {
                tracing::warn!(zone = spec.name, "express zone did not answer at start-up");
            }
        }
        zones.push(Zone {
            name: spec.name.clone(),
            store,
        });
    }
    let zones = Zones::new(zones).context("--s3-express-zone")?;
    if answered < zones.quorum() {
        tracing::warn!(
            answered,
            quorum = zones.quorum(),
            "fewer than a quorum of express zones answered at start-up: settling the express \
             chain waits for them, and Express appends fail fast until they answer"
        );
    }
    Ok(Some(ExpressConfig {
        zones,
        publish_deadline: deadline,
        linger: Duration::from_millis(config.s3_express_linger_ms),
        buffer_bytes: config.s3_express_memory_buffer_mib * nova_core::limits::MIB,
    }))
}

fn rand_suffix() -> u64 {
    nova_core::entropy::Entropy::from_os().next_u64()
}
