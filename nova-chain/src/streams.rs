//! The registry of the streams a star leads, and their admin: loading them, creating, deleting,
//! setting retention and class, taking one up for the fleet. Each stream's live positions are
//! `stream_state`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

pub use crate::stream_state::StreamState;

use crate::metrics::Metrics;
use nova_core::catalog::{
    Catalog, CatalogError, Occupancy, Retention, StorageClass, StreamMeta, StreamTail,
};
use nova_core::clock::Clock;
use nova_core::metastore::Compare;
use nova_core::object_store::{ObjectStore, StoreError};
use nova_proto::RequestError;
use nova_proto::validate::validate_stream_name;

/// All streams, by name and by id. Creates and deletes go through the catalog first, then the
/// maps, one at a time. Each stream also has a manifest in the object store
/// (`streams/{star}/{id}`), so the bucket alone can rebuild the catalog.
#[derive(Debug)]
pub struct StreamRegistry {
    catalog: Catalog,
    store: Arc<dyn ObjectStore>,
    star: String,
    metrics: Arc<Metrics>,
    clock: Clock,
    /// `--max-streams`.
    max_streams: usize,
    by_name: RwLock<BTreeMap<String, Arc<StreamState>>>,
    by_id: RwLock<HashMap<u64, Arc<StreamState>>>,
    /// Ids deleted since the absorber last looked, so it can forget their tails. Bounded by the
    /// deletes between two absorbs (admin calls, one at a time).
    deleted: parking_lot::Mutex<Vec<u64>>,
    admin: tokio::sync::Mutex<()>,
    /// Creates and deletes in progress, each in a task of its own (see `to_the_end`).
    admin_calls: Arc<tokio::sync::Semaphore>,
    /// Set at shutdown: creates and deletes are refused as the star stopping, not as a shed.
    admin_stopping: AtomicBool,
}

/// Stream creates and deletes in progress at once; more are refused with a retry hint. They
/// run one at a time, so this only bounds the queue of callers.
const ADMIN_CALLS: usize = 64;

/// Tries of one create whose insert keeps meeting other creates' id reservations.
const CREATE_ATTEMPTS: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(
        "a catalog rebuild (novad --rebuild-catalog) was interrupted in this metastore; run it \
         again to finish it before starting novad"
    )]
    RestoreInterrupted,
    #[error("writing the manifests of streams created before manifests existed: {0}")]
    Manifests(StoreError),
}

impl StreamRegistry {
    /// Loads every stream from the catalog, at its absorbed tail, and finishes what an earlier
    /// run left undone in the object store: manifests of deleted streams not yet marked deleted,
    /// and manifests of streams created before manifests existed.
    pub async fn load(
        catalog: Catalog,
        store: Arc<dyn ObjectStore>,
        star: &str,
        metrics: Arc<Metrics>,
        clock: Clock,
        max_streams: usize,
    ) -> Result<Self, LoadError> {
        if catalog.occupancy().await? == Occupancy::Restoring {
            return Err(LoadError::RestoreInterrupted);
        }
        let registry = Self {
            catalog: catalog.clone(),
            store,
            star: star.to_owned(),
            metrics,
            clock,
            max_streams,
            by_name: RwLock::default(),
            by_id: RwLock::default(),
            deleted: parking_lot::Mutex::default(),
            admin: tokio::sync::Mutex::new(()),
            admin_calls: Arc::new(tokio::sync::Semaphore::new(ADMIN_CALLS)),
            admin_stopping: AtomicBool::new(false),
        };
        for (meta, tail) in catalog.load_streams().await? {
            registry.insert(Arc::new(StreamState::new(meta, tail)));
        }
        registry
            .metrics
            .streams_capacity
            .set(max_streams.min(i64::MAX as usize) as i64);
        for meta in catalog.pending_tombstones().await? {
            registry.mark_deleted(&meta).await;
        }
        if !registry.is_empty() && !catalog.manifests_complete().await? {
            let streams = registry.list("", "", usize::MAX);
            for stream in &streams {
                registry
                    .write_manifest(&stream.meta, false)
                    .await
                    .map_err(LoadError::Manifests)?;
            }
            catalog.set_manifests_complete().await?;
            if !streams.is_empty() {
                tracing::info!(
                    streams = streams.len(),
                    "wrote the manifests of streams created before manifests existed"
                );
            }
        }
        Ok(registry)
    }

    fn insert(&self, state: Arc<StreamState>) {
        self.by_id.write().insert(state.id(), state.clone());
        let mut by_name = self.by_name.write();
        by_name.insert(state.name().to_owned(), state);
        self.metrics.streams.set(by_name.len() as i64);
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn get(&self, name: &str) -> Option<Arc<StreamState>> {
        self.by_name.read().get(name).cloned()
    }

    pub fn get_by_id(&self, id: u64) -> Option<Arc<StreamState>> {
        self.by_id.read().get(&id).cloned()
    }

    pub fn len(&self) -> usize {
        self.by_name.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stream ids deleted since the last call.
    /// Up to `max` deleted streams whose tails are still to be removed.
    pub(crate) fn take_deleted(&self, max: usize) -> Vec<u64> {
        let mut deleted = self.deleted.lock();
        let n = deleted.len().min(max);
        deleted.drain(..n).collect()
    }

    pub fn get_or_not_found(&self, name: &str) -> Result<Arc<StreamState>, RequestError> {
        validate_stream_name(name)?;
        self.get(name)
            .ok_or_else(|| RequestError::StreamNotFound(name.to_owned()))
    }

    pub async fn create(
        self: &Arc<Self>,
        name: &str,
        class: StorageClass,
    ) -> Result<Arc<StreamState>, RequestError> {
        self.create_with(name, class, Retention::default()).await
    }

    /// Creates a stream with a retention.
    pub async fn create_with(
        self: &Arc<Self>,
        name: &str,
        class: StorageClass,
        retention: Retention,
    ) -> Result<Arc<StreamState>, RequestError> {
        validate_stream_name(name)?;
        let name = name.to_owned();
        self.to_the_end(move |registry| async move {
            registry.create_now(&name, class, retention).await
        })
        .await
    }

    /// Changes a stream's retention: in the catalog (which the auditor's retention duty reads)
    /// and in its manifest (which a rebuild reads).
    pub async fn set_retention(
        self: &Arc<Self>,
        name: &str,
        retention: Retention,
    ) -> Result<StreamMeta, RequestError> {
        validate_stream_name(name)?;
        let name = name.to_owned();
        self.to_the_end(move |registry| async move {
            // One at a time with deletes: a manifest rewritten after a delete marked it would
            // bring the stream back in a rebuild.
            let _one_at_a_time = registry.admin.lock().await;
            let state = registry
                .get(&name)
                .ok_or_else(|| RequestError::StreamNotFound(name.clone()))?;
            let meta = registry
                .catalog
                .set_retention(&name, retention)
                .await
                .map_err(RequestError::from)?;
            *state.retention.lock() = retention;
            registry.write_manifest(&meta, false).await.map_err(|e| {
                RequestError::from(e).context(format_args!(
                    "the retention of stream {name:?} is set, but writing its manifest failed \
                     (set it again)"
                ))
            })?;
            Ok(meta)
        })
        .await
    }

    /// Records stream `name`'s new storage class in the catalog and its manifest, and takes it
    /// for the appends admitted from now on. The caller has refused the stream's appends and
    /// waited for those in flight (`Star::set_storage_class`).
    pub(crate) async fn set_class(
        self: &Arc<Self>,
        stream: &Arc<StreamState>,
        class: StorageClass,
    ) -> Result<StreamMeta, RequestError> {
        let name = stream.name().to_owned();
        let stream = stream.clone();
        self.to_the_end(move |registry| async move {
            // One at a time with deletes, as for a retention.
            let _one_at_a_time = registry.admin.lock().await;
            // The very stream whose appends were paused: one deleted and created again
            // meanwhile is another stream.
            let state = registry
                .get(&name)
                .filter(|state| Arc::ptr_eq(state, &stream))
                .ok_or_else(|| RequestError::StreamNotFound(name.clone()))?;
            let meta = registry
                .catalog
                .set_class(&name, class)
                .await
                .map_err(RequestError::from)?;
            state.set_class(class);
            registry.write_manifest(&meta, false).await.map_err(|e| {
                RequestError::from(e).context(format_args!(
                    "the storage class of stream {name:?} is set, but writing its manifest \
                     failed (set it again)"
                ))
            })?;
            Ok(meta)
        })
        .await
    }

    /// Refuses new creates and deletes and waits for those in progress: at shutdown, none may
    /// land after the star has stopped.
    pub async fn stop_admin(&self) {
        self.admin_stopping.store(true, Ordering::Release);
        if let Ok(all) = self.admin_calls.acquire_many(ADMIN_CALLS as u32).await {
            all.forget();
        }
        self.admin_calls.close();
    }

    /// Runs an admin call in a task of its own, so that it ends as it began even if the caller
    /// stops waiting: a delete that lands in the catalog while this star still serves the
    /// stream would acknowledge appends that no restart can find.
    async fn to_the_end<T, F, Fut>(self: &Arc<Self>, call: F) -> Result<T, RequestError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Self>) -> Fut,
        Fut: Future<Output = Result<T, RequestError>> + Send + 'static,
    {
        let shutting_down = || nova_core::refusal::shutting_down();
        if self.admin_stopping.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        let slot = match self.admin_calls.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(shutting_down()),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                self.metrics.sheds.with_label_values(&["admin_calls"]).inc();
                tracing::warn!(
                    limit = ADMIN_CALLS,
                    "stream create or delete refused: {ADMIN_CALLS} already in progress"
                );
                return Err(RequestError::LimitReached {
                    cap: "stream creates and deletes in progress",
                    limit: ADMIN_CALLS as u64,
                    what: "retry once the ones in progress have finished",
                });
            }
        };
        let call = call(self.clone());
        tokio::spawn(async move {
            let _slot = slot;
            call.await
        })
        .await
        .unwrap_or_else(|e| {
            Err(RequestError::Internal(format!(
                "a stream admin call failed: {e}"
            )))
        })
    }

    async fn create_now(
        &self,
        name: &str,
        class: StorageClass,
        retention: Retention,
    ) -> Result<Arc<StreamState>, RequestError> {
        let _one_at_a_time = self.admin.lock().await;
        // In a fleet the catalog alone says whether the name is taken: a stream deleted
        // through another star is still known here.
        let shared = self.catalog.store().capabilities().shared;
        if !shared && self.get(name).is_some() {
            return Err(RequestError::StreamExists(name.to_owned()));
        }
        // A create whose outcome was unknown may have landed: ask the catalog before writing a
        // second manifest for the name. If that one could not be marked abandoned, a rebuild
        // would take the newer, empty stream for the real one.
        if let Some(found) = self
            .catalog
            .stream(name)
            .await
            .map_err(RequestError::from)?
        {
            self.adopt(found).await;
            return Err(RequestError::StreamExists(name.to_owned()));
        }
        self.forget_stale(name, None);
        // In a fleet `--max-streams` bounds the streams a star leads, and the fleet places a
        // new stream on a star that has room.
        if !shared && self.len() >= self.max_streams {
            self.metrics.sheds.with_label_values(&["max_streams"]).inc();
            self.metrics.refused.hit(Some(name), None);
            tracing::warn!(
                stream = name,
                limit = self.max_streams,
                "stream not created: --max-streams={} reached",
                self.max_streams
            );
            return Err(RequestError::LimitReached {
                cap: "--max-streams",
                limit: self.max_streams as u64,
                what: "delete streams or raise the cap",
            });
        }
        // Each attempt under a fresh id: another create of the name reserving meanwhile (through
        // another star) fences the insert (see `Catalog::insert_stream`); this one reserves
        // again, and then finds the name taken or takes it.
        let mut attempts = 0;
        let meta = loop {
            attempts += 1;
            let reserved = self
                .catalog
                .reserve_stream_id(name)
                .await
                .map_err(RequestError::from)?;
            let meta = StreamMeta {
                id: reserved.id,
                name: name.to_owned(),
                created_at_ms: self.clock.unix_ms(),
                class,
                retention,
            };
            // The manifest lands before the catalog knows the stream, so every stream whose
            // records can reach a flight is one the bucket can name.
            self.write_manifest(&meta, false).await.map_err(|e| {
                RequestError::from(e)
                    .context(format_args!("writing the manifest of stream {name:?}"))
            })?;
            match self.catalog.insert_stream(&meta, reserved).await {
                Ok(()) => break meta,
                Err(CatalogError::Conflict(why)) => {
                    self.abandon_manifest(&meta).await;
                    if attempts >= CREATE_ATTEMPTS {
                        return Err(RequestError::Unavailable(format!(
                            "creating stream {name:?}: {why}, {attempts} times; retry"
                        )));
                    }
                }
                // A lost answer (the commit may have landed, or may still), or a name the
                // catalog already has: see `settle_insert`.
                Err(err @ (CatalogError::Metastore(_) | CatalogError::AlreadyExists(_))) => {
                    self.settle_insert(&meta, err).await?;
                    break meta;
                }
                Err(err) => {
                    self.abandon_manifest(&meta).await;
                    return Err(RequestError::from(err));
                }
            }
        };
        let state = Arc::new(StreamState::new(meta, StreamTail::default()));
        self.insert(state.clone());
        Ok(state)
    }

    /// Starts serving a stream the catalog has and this star did not know: one whose create
    /// outcome was unknown here. Only in a metastore of its own: in a shared one, the name may
    /// belong to another star.
    async fn adopt(&self, meta: StreamMeta) {
        if self.catalog.store().capabilities().shared || self.get_by_id(meta.id).is_some() {
            return;
        }
        match self.catalog.stream_tail(meta.id).await {
            Ok(tail) => {
                tracing::info!(
                    stream = meta.name,
                    id = meta.id,
                    "serving a stream whose create outcome was unknown"
                );
                self.insert(Arc::new(StreamState::new(meta, tail)));
            }
            Err(err) => tracing::warn!(
                stream = meta.name,
                "reading the tail of a stream to serve: {err}"
            ),
        }
    }

    /// Takes a stream up for leading, in a fleet, under `guard` (see `StreamState::lead_under`):
    /// reads its settings and absorbed tail from the shared catalog (the previous leader
    /// absorbed everything before the leadership moved) and serves from there. `leading` is how
    /// many streams this star leads now: `--max-streams` bounds those, not the streams the
    /// catalog knows. `None` when the catalog has no such stream.
    pub async fn acquire(
        &self,
        name: &str,
        guard: Compare,
        leading: usize,
    ) -> Result<Option<Arc<StreamState>>, CatalogError> {
        let Some(meta) = self.catalog.stream(name).await? else {
            self.forget_stale(name, None);
            return Ok(None);
        };
        let tail = self.catalog.stream_tail(meta.id).await?;
        // A stream of this name deleted through another star (and perhaps created again) is
        // still known here under its old id: it is gone.
        self.forget_stale(name, Some(meta.id));
        if let Some(state) = self.get_by_id(meta.id) {
            // Its settings may have changed while another star led it. Nothing of it is in
            // flight here (it was handed off), so its class can change under it.
            {
                let _admitting = state.admitting();
                state.set_class(meta.class);
            }
            *state.retention.lock() = meta.retention;
            if state.is_deposed() {
                // What this star acknowledged after its leadership moved never reached the
                // index: the stream goes on from where its other leader left it.
                state.reset_tail(tail);
            } else {
                let added = tail.stored_bytes.saturating_sub(state.stored_bytes());
                state.set_next_seq(tail.tail_seq.max(state.tail()));
                state.advance_tail(tail.tail_seq, added);
            }
            state.lead_under(Some(guard));
            return Ok(Some(state));
        }
        if leading >= self.max_streams {
            return Err(CatalogError::Conflict(format!(
                "this star already leads --max-streams={} streams",
                self.max_streams
            )));
        }
        let state = Arc::new(StreamState::new(meta, tail));
        state.lead_under(Some(guard));
        self.insert(state.clone());
        Ok(Some(state))
    }

    /// Drops what this star knows of stream `name` if it is not the stream with id `current`
    /// (`None`: the catalog has no such stream): one deleted through another star of the fleet.
    /// Its records are that star's to forget; here it only stops being served.
    fn forget_stale(&self, name: &str, current: Option<u64>) {
        let Some(stale) = self.get(name).filter(|s| Some(s.id()) != current) else {
            return;
        };
        if !self.catalog.store().capabilities().shared {
            return;
        }
        self.by_name.write().remove(name);
        self.by_id.write().remove(&stale.id());
        stale.set_deleted();
        self.metrics.streams.set(self.len() as i64);
    }

    /// Settles a create of `meta` whose insert answered `err`: a lost answer (the commit may
    /// have landed, or may still), or a name the catalog already has (this very create,
    /// retried inside a metastore client, or an earlier create whose outcome was unknown). The
    /// catalog says which, once the insert can no longer apply. `Ok` when this create landed.
    /// Found by the simulation: taking a landed create for a failed one left a stream that the
    /// catalog had and this star refused to serve or create, with its manifest marked deleted;
    /// and an insert that applied seconds after it was taken for failed brought the name back
    /// after a retried create and a delete.
    async fn settle_insert(
        &self,
        meta: &StreamMeta,
        err: CatalogError,
    ) -> Result<(), RequestError> {
        let name = &meta.name;
        match self.catalog.settle_create(name).await {
            Ok(Some(found)) if found.id == meta.id => Ok(()),
            Ok(Some(found)) => {
                self.abandon_manifest(meta).await;
                self.adopt(found).await;
                Err(RequestError::StreamExists(name.to_owned()))
            }
            Ok(None) => {
                self.abandon_manifest(meta).await;
                Err(RequestError::from(err))
            }
            // Still cannot tell: leave the manifest live (a rebuild restoring an empty stream
            // is harmless) and say so.
            Err(_) => Err(RequestError::OutcomeUnknown(format!(
                "creating stream {name:?}: {err}; create it again: if this create landed, the \
                 answer is that the stream exists"
            ))),
        }
    }

    /// Marks the manifest of a stream that was never created deleted: a rebuild would
    /// otherwise restore it empty (a retried create gets a fresh id that outranks it anyway).
    async fn abandon_manifest(&self, meta: &StreamMeta) {
        let _ = self.write_manifest(meta, true).await;
    }

    pub async fn delete(self: &Arc<Self>, name: &str) -> Result<(), RequestError> {
        validate_stream_name(name)?;
        let name = name.to_owned();
        self.to_the_end(move |registry| async move { registry.delete_now(&name).await })
            .await
    }

    async fn delete_now(&self, name: &str) -> Result<(), RequestError> {
        let _one_at_a_time = self.admin.lock().await;
        let state = self.get(name);
        let meta = match self.catalog.delete_stream(name).await {
            Ok(meta) => meta,
            // The catalog no longer has it: an earlier delete landed without its answer.
            Err(CatalogError::NotFound(_)) => match &state {
                Some(state) => state.meta.clone(),
                None => return Err(RequestError::StreamNotFound(name.to_owned())),
            },
            // The answer was lost: the delete may have landed. Serving a stream the catalog no
            // longer has would acknowledge records no restart can find; forgetting one it still
            // has would drop its unabsorbed records. Until the catalog says which, the stream
            // stays known (its flights keep being absorbed) but refuses appends.
            Err(CatalogError::Metastore(err)) => match self.catalog.stream_exists(name).await {
                Ok(false) => match &state {
                    Some(state) => state.meta.clone(),
                    None => return Err(RequestError::StreamNotFound(name.to_owned())),
                },
                Ok(true) => return Err(RequestError::from(err)),
                Err(_) => {
                    if let Some(state) = &state {
                        state.mark_in_doubt();
                    }
                    return Err(RequestError::OutcomeUnknown(format!(
                        "deleting stream {name:?}: {err}; delete it again to settle it (until \
                         then it refuses appends)"
                    )));
                }
            },
            Err(err) => return Err(RequestError::from(err)),
        };
        match &state {
            Some(state) => self.forget(state),
            // Forgotten after an earlier delete's unknown outcome; the absorber may still
            // hold its tail.
            None => self.deleted.lock().push(meta.id),
        }
        self.mark_deleted(&meta).await;
        Ok(())
    }

    /// Stops serving a stream: appends and reads in progress see it deleted.
    fn forget(&self, state: &Arc<StreamState>) {
        let name = state.name();
        self.by_name.write().remove(name);
        self.by_id.write().remove(&state.id());
        state.set_deleted();
        self.deleted.lock().push(state.id());
        self.metrics.streams.set(self.len() as i64);
    }

    /// Marks a deleted stream's manifest deleted, then forgets the catalog's pending
    /// tombstone. A failure leaves the tombstone pending, for the next start to retry.
    async fn mark_deleted(&self, meta: &StreamMeta) {
        match self.write_manifest(meta, true).await {
            Ok(()) => {
                if let Err(err) = self.catalog.clear_tombstone(meta.id).await {
                    tracing::warn!(id = meta.id, "clearing a pending tombstone: {err}");
                }
            }
            Err(err) => tracing::warn!(
                stream = meta.name,
                id = meta.id,
                "marking the manifest of a deleted stream failed; retried at the next start: {err}"
            ),
        }
    }

    async fn write_manifest(&self, meta: &StreamMeta, deleted: bool) -> Result<(), StoreError> {
        nova_core::manifest::write_manifest(self.store.as_ref(), &self.star, meta, deleted).await
    }

    /// Bytes stored over every stream this registry holds (one pass, nothing collected).
    pub fn stored_bytes_total(&self) -> u64 {
        self.by_name
            .read()
            .values()
            .map(|state| state.stored_bytes())
            .sum()
    }

    /// The `n` streams with the most appended bytes, as (name, records, bytes), busiest first;
    /// streams that took no append are left out. One pass over the streams.
    pub fn busiest(&self, n: usize) -> Vec<(String, u64, u64)> {
        if n == 0 {
            return Vec::new();
        }
        let mut active: Vec<(u64, u64, Arc<StreamState>)> = self
            .by_name
            .read()
            .values()
            .filter_map(|state| {
                let (records, bytes) = state.appended();
                (records > 0).then(|| (bytes, records, state.clone()))
            })
            .collect();
        if active.len() > n {
            active.select_nth_unstable_by(n - 1, |a, b| b.0.cmp(&a.0));
            active.truncate(n);
        }
        active.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.name().cmp(b.2.name())));
        active
            .into_iter()
            .map(|(bytes, records, state)| (state.name().to_owned(), records, bytes))
            .collect()
    }

    /// Streams whose names start with `prefix`, after `start_after`, at most `limit`.
    pub fn list(&self, prefix: &str, start_after: &str, limit: usize) -> Vec<Arc<StreamState>> {
        use std::ops::Bound;
        let by_name = self.by_name.read();
        let lower = if start_after.is_empty() || start_after < prefix {
            Bound::Included(prefix.to_owned())
        } else {
            Bound::Excluded(start_after.to_owned())
        };
        by_name
            .range::<String, _>((lower, Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .take(limit)
            .map(|(_, state)| state.clone())
            .collect()
    }
}
