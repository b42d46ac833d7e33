//! Opening what a star stands on (its metastore, its object store, its fleet), waiting out
//! what does not answer yet: a star started before etcd or its bucket waits, logging what to
//! check, rather than failing its start.

use super::*;

pub(super) async fn open_metastore(config: &Config) -> anyhow::Result<Arc<dyn Metastore>> {
    if let Some(endpoints) = EtcdOptions::parse_url(&config.metastore) {
        let mut options = EtcdOptions::new(endpoints.map_err(|e| anyhow::anyhow!(e))?);
        options.max_txn_ops = config.metastore_max_txn_ops;
        return Ok(Arc::new(connect_etcd(options).await?));
    }
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating --data-dir {}", config.data_dir.display()))?;
    let metastore_path = config.data_dir.join("metastore.redb");
    Ok(Arc::new(
        EmbeddedMetastore::open(&metastore_path).with_context(|| {
            format!(
                "opening the metastore {} (is another novad using this --data-dir?)",
                metastore_path.display()
            )
        })?,
    ))
}

/// Joins the fleet, once its object store is known to be the fleet's, waiting out a metastore
/// that does not answer (etcd started after the star, or a TCP connection that etcd does not
/// serve), as `connect_etcd` does.
pub(super) async fn join_fleet(
    metastore: &Arc<dyn Metastore>,
    store: &Arc<dyn ObjectStore>,
    config: nova_fleet::FleetConfig,
    metrics: nova_fleet::FleetMetrics,
) -> Result<Arc<nova_fleet::Fleet>, nova_fleet::JoinError> {
    let mut wait = Duration::from_millis(250);
    loop {
        let joined = async {
            nova_fleet::check_shared_store(metastore.as_ref(), store.as_ref(), &config.star_id)
                .await?;
            nova_fleet::Fleet::join(
                metastore.clone(),
                config.clone(),
                metrics.clone(),
                Clock::system(),
            )
            .await
        };
        match joined.await {
            Err(nova_fleet::JoinError::Metastore {
                what,
                source: MetastoreError::Unavailable(why),
            }) => {
                let endpoints = metastore.describe();
                tracing::warn!(
                    retry_in_ms = wait.as_millis() as u64,
                    "{what}: {endpoints} does not answer ({why}); novad waits for it and \
                     accepts nothing meanwhile: start etcd, or check --metastore"
                );
                wait = waited(wait).await;
            }
            // The store does not answer yet: waited out as recovery waits it out, since the
            // fleet's store is checked before anything else touches it.
            Err(nova_fleet::JoinError::Store { what, source }) if source.is_retryable() => {
                tracing::warn!(
                    retry_in_ms = wait.as_millis() as u64,
                    "{what}: {source}; novad waits for the object store and accepts nothing \
                     meanwhile"
                );
                wait = waited(wait).await;
            }
            joined => return joined,
        }
    }
}

/// Sleeps `wait` and returns the next, doubled up to 10 s: the start's waits for etcd and the
/// store.
async fn waited(wait: Duration) -> Duration {
    tokio::time::sleep(wait).await;
    (wait * 2).min(Duration::from_secs(10))
}

/// Connects to etcd, waiting out an etcd that does not answer yet (started after the star, or
/// restarting), as a store outage at start is waited out: each failure is logged with the
/// endpoints and what to check, the wait between tries growing to 10 s. Anything else (a
/// refusal that will not change) stops the start.
async fn connect_etcd(options: EtcdOptions) -> anyhow::Result<EtcdMetastore> {
    let endpoints = options.endpoints.join(",");
    let mut wait = Duration::from_millis(250);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match EtcdMetastore::connect(options.clone()).await {
            Ok(metastore) => {
                if attempt > 1 {
                    tracing::info!(endpoints, attempts = attempt, "etcd answers; starting");
                }
                return Ok(metastore);
            }
            Err(MetastoreError::Unavailable(why)) => {
                tracing::warn!(
                    endpoints,
                    attempt,
                    retry_in_ms = wait.as_millis() as u64,
                    "etcd at {endpoints} does not answer ({why}); novad waits for it and \
                     accepts nothing meanwhile: start etcd, or check --metastore"
                );
                wait = waited(wait).await;
            }
            Err(err) => {
                return Err(anyhow::anyhow!(err))
                    .with_context(|| format!("connecting to etcd at {endpoints}"));
            }
        }
    }
}

/// The object store: S3 when a bucket is given, else the local directory under --data-dir.
pub(super) async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let local_root = config.data_dir.join("store");
    config
        .store
        .open(&local_root, true)
        .await
        .with_context(|| format!("opening the local object store at {}", local_root.display()))
}
