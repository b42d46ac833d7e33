//! Whether the gateway can serve: its object store answers, and its star answers. Checked once
//! at start-up, where a misconfiguration is refused with a message that names the flag (a
//! `--store-dir` that is not the star's store used to surface only as `object … not found` at
//! read time), and then every few seconds, into the health service, the
//! `nova_gateway_*_reachable` gauges and a log line at every change.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use nova_core::object_store::{ObjectStore, StoreError};
use nova_proto::route::Router;
use nova_proto::v1;

use crate::metrics::GatewayMetrics;

/// How often the store and the star are probed after start-up.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long one probe may take before it counts as a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the gateway last learned about its dependencies.
#[derive(Debug)]
pub struct Health {
    store_ok: AtomicBool,
    star_ok: AtomicBool,
    /// Why the gateway is not ready, as last probed; empty when it is.
    problem: Mutex<String>,
    metrics: GatewayMetrics,
}

impl Health {
    pub fn new(metrics: GatewayMetrics) -> Arc<Self> {
        Arc::new(Self {
            store_ok: AtomicBool::new(false),
            star_ok: AtomicBool::new(false),
            problem: Mutex::new("not probed yet".to_owned()),
            metrics,
        })
    }

    pub fn is_ready(&self) -> bool {
        self.store_ok.load(Ordering::Acquire) && self.star_ok.load(Ordering::Acquire)
    }

    /// Why the gateway is not ready; empty when it is.
    pub fn problem(&self) -> String {
        self.problem.lock().clone()
    }

    /// Records one round of probes; returns whether readiness changed.
    fn record(&self, store: Result<(), String>, star: Result<(), String>) -> bool {
        let was = self.is_ready();
        self.store_ok.store(store.is_ok(), Ordering::Release);
        self.star_ok.store(star.is_ok(), Ordering::Release);
        self.metrics.store_reachable.set(store.is_ok() as i64);
        self.metrics.star_reachable.set(star.is_ok() as i64);
        let problems: Vec<String> = [store.err(), star.err()].into_iter().flatten().collect();
        *self.problem.lock() = problems.join("; ");
        let ready = self.is_ready();
        self.metrics.ready.set(ready as i64);
        was != ready
    }
}

/// How long a gateway waits at start-up for its `--store-dir` to become an object store: a star
/// started alongside it creates the store's folders within moments of starting.
const STORE_DIR_WAIT: Duration = Duration::from_secs(60);

/// Refuses a `--store-dir` that is not an object store before anything is created in it (the
/// local store would otherwise make an empty one there), after waiting a while for a star
/// starting alongside to create it. The store's own `objects/` folder (the path a star's
/// status shows) is taken for the store it is in. Returns the store's directory.
pub async fn check_store_dir(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    if dir.file_name().is_some_and(|name| name == "objects")
        && !dir.join("objects").is_dir()
        && let Some(store) = dir
            .parent()
            .filter(|parent| parent.join("objects").is_dir())
    {
        tracing::info!(
            store_dir = %store.display(),
            "--store-dir names the store's objects/ folder; serving the store it is in"
        );
        return Ok(store.to_path_buf());
    }
    let deadline = tokio::time::Instant::now() + STORE_DIR_WAIT;
    let mut said = false;
    while !dir.join("objects").is_dir() {
        let what = if dir.is_dir() {
            "has no objects/ folder"
        } else {
            "does not exist"
        };
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "--store-dir {} {what}, so it is not a Nova object store: point it at the \
                 star's <data-dir>/store (nova-data/store by default), or give --s3-bucket",
                dir.display()
            );
        }
        if !said {
            tracing::warn!(
                store_dir = %dir.display(),
                "--store-dir {what}; waiting up to {} s for a star to create it",
                STORE_DIR_WAIT.as_secs()
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(dir.to_path_buf())
}

/// One probe of the store: does it answer a one-key listing? A bucket that refuses listings
/// with AccessDenied answers all the same (the credentials are known and the bucket is there),
/// and a gateway needs only reads: that counts as reachable.
async fn probe_store(store: &dyn ObjectStore) -> Result<(), StoreError> {
    match tokio::time::timeout(PROBE_TIMEOUT, store.list("", None, 1)).await {
        Ok(Err(StoreError::Permanent { message, .. })) if message.contains("AccessDenied") => {
            Ok(())
        }
        Ok(result) => result.map(|_| ()),
        Err(_) => Err(StoreError::Transient {
            op: nova_core::object_store::Op::List,
            key: String::new(),
            message: format!("no answer within {PROBE_TIMEOUT:?}"),
        }),
    }
}

/// `call`, or `None` when it takes longer than a probe may.
async fn within<T>(call: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(PROBE_TIMEOUT, call).await.ok()
}

/// One probe of the star: its server info (`None` from a star too old to have the call).
async fn probe_star(star: &Router) -> Result<Option<v1::GetServerInfoResponse>, tonic::Status> {
    let mut stub = star.seed();
    let call = stub.get_server_info(v1::GetServerInfoRequest {});
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(Ok(response)) => Ok(Some(response.into_inner())),
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => Ok(None),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(nova_proto::RequestError::Unavailable(format!(
            "no answer within {PROBE_TIMEOUT:?}"
        ))
        .into()),
    }
}

/// Checks, before serving, that the store answers and holds what the star indexes. A store
/// that refuses for good (a missing bucket, refused credentials) or that lacks the star's
/// objects stops the gateway with the reason; a store or a star that is down for now is only
/// logged, since either may come up after the gateway.
pub async fn check_at_start(
    store: &Arc<dyn ObjectStore>,
    star: &Router,
    star_url: &str,
    health: &Health,
) -> anyhow::Result<()> {
    let store_probe = match probe_store(store.as_ref()).await {
        Ok(()) => Ok(()),
        Err(err) if !err.is_retryable() => anyhow::bail!(
            "the object store {} refuses the gateway: {err}",
            store.describe()
        ),
        Err(err) => {
            tracing::warn!(
                store = %store.describe(),
                "the object store does not answer yet; reads of history fail until it does: {err}"
            );
            Err(format!("object store: {err}"))
        }
    };
    let star_probe = match probe_star(star).await {
        Ok(info) => {
            if let Some(info) = &info {
                tracing::info!(
                    star = star_url,
                    id = %info.id,
                    version = %info.version,
                    star_store = %info.store,
                    "reached the star"
                );
            }
            if store_probe.is_ok() {
                check_same_store(store, star, star_url, info.as_ref()).await?;
            }
            Ok(())
        }
        Err(status) => {
            tracing::warn!(
                star = star_url,
                "cannot reach the star (--star) yet; reads at the tail fail until it answers: {}",
                status.message()
            );
            Err(format!("star {star_url}: {}", status.message()))
        }
    };
    health.record(store_probe, star_probe);
    Ok(())
}

/// Finds one object the star indexes and looks for it in the gateway's store: absent means the
/// two were pointed at different stores.
async fn check_same_store(
    store: &Arc<dyn ObjectStore>,
    star: &Router,
    star_url: &str,
    info: Option<&v1::GetServerInfoResponse>,
) -> anyhow::Result<()> {
    let mut stub = star.seed();
    // Each call is bounded: a star that answers slowly delays the start by seconds, not
    // forever, and the check is skipped.
    let Some(Ok(listed)) = within(stub.list_streams(v1::ListStreamsRequest {
        prefix: String::new(),
        start_after: String::new(),
        limit: 20,
    }))
    .await
    else {
        return Ok(());
    };
    for stream in listed.into_inner().streams {
        if stream.tail_seq <= stream.first_seq {
            continue;
        }
        let Some(Ok(refs)) = within(stub.resolve_refs(v1::ResolveRefsRequest {
            stream: stream.name.clone(),
            start_seq: stream.first_seq,
            max_refs: 1,
            start_timestamp: None,
        }))
        .await
        else {
            continue;
        };
        let Some(found) = refs.into_inner().refs.into_iter().next() else {
            // Everything is still in the star's memory: nothing to look for yet.
            continue;
        };
        return match within(store.head(&found.object_key)).await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(StoreError::NotFound { .. })) => {
                // The auditor may have moved it between the two calls; ask once more.
                let again = within(stub.resolve_refs(v1::ResolveRefsRequest {
                    stream: stream.name.clone(),
                    start_seq: stream.first_seq,
                    max_refs: 1,
                    start_timestamp: None,
                }))
                .await
                .and_then(Result::ok)
                .and_then(|r| r.into_inner().refs.into_iter().next());
                match again {
                    Some(again) if again.object_key != found.object_key => Ok(()),
                    _ => anyhow::bail!(
                        "the gateway's object store ({}) does not hold {}, which the star at {} \
                         indexes for stream {:?}: the gateway reads a different store than the \
                         star writes ({}); point --store-dir or --s3-bucket at the star's store",
                        store.describe(),
                        found.object_key,
                        star_url,
                        stream.name,
                        info.map_or("the star did not say which", |i| i.store.as_str()),
                    ),
                }
            }
            Some(Err(err)) if !err.is_retryable() => anyhow::bail!(
                "the object store {} refuses the gateway a read of {}: {err}",
                store.describe(),
                found.object_key
            ),
            // Probed a moment ago; a blip now is not a misconfiguration.
            Some(Err(_)) => Ok(()),
        };
    }
    Ok(())
}

/// Probes the store and the star every few seconds until `stopping`, keeping the health
/// service, the gauges and the log current.
pub async fn watch(
    store: Arc<dyn ObjectStore>,
    star: Router,
    star_url: String,
    health: Arc<Health>,
    reporter: tonic_health::server::HealthReporter,
    stopping: CancellationToken,
) {
    let mut ticker = tokio::time::interval(PROBE_EVERY);
    let mut first = true;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopping.cancelled() => return,
        }
        let store_probe = probe_store(store.as_ref())
            .await
            .map_err(|err| format!("object store: {err}"));
        let star_probe = probe_star(&star)
            .await
            .map(|_| ())
            .map_err(|status| format!("star {star_url}: {}", status.message()));
        let changed = health.record(store_probe, star_probe);
        if changed || first {
            let service = nova_proto::server::nova_server::SERVICE_NAME;
            if health.is_ready() {
                reporter
                    .set_service_status(service, tonic_health::ServingStatus::Serving)
                    .await;
                if !first {
                    tracing::info!("ready again: the object store and the star answer");
                }
            } else {
                reporter
                    .set_service_status(service, tonic_health::ServingStatus::NotServing)
                    .await;
                tracing::warn!("not ready: {}", health.problem());
            }
        }
        first = false;
    }
}
