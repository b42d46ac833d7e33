//! A directory as an object store: the embedded default.
//!
//! Objects live at `ROOT/objects/KEY`. Every write goes to a temporary file that is fsynced
//! first, then appears under its key atomically: a hard link for conditional creates (link
//! fails with EEXIST when the key is taken, so exactly one of several racing writers wins) and a
//! rename for plain puts. The key's directory is fsynced after the link or rename, so an object
//! that was reported written survives a crash of the machine.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::entropy::Entropy;

use super::{
    ComposePart, CreateOutcome, GetRange, GetResult, ListPage, MAX_LIST_KEYS, ObjectMeta,
    ObjectStore, Op, PutPayload, StoreError, StoreLimits,
};

#[derive(Debug, Clone)]
pub struct LocalStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    objects: PathBuf,
    tmp: PathBuf,
    reads: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    limits: StoreLimits,
    /// Directory fsyncs done, for tests that check an object is reachable before it is reported.
    dir_syncs: std::sync::atomic::AtomicU64,
    /// Directories whose entries (and their ancestors') are known durable.
    durable_dirs: parking_lot::Mutex<std::collections::HashSet<PathBuf>>,
    /// Names temporary files.
    names: Entropy,
}

impl LocalStore {
    /// Opens (creating if needed) a store rooted at `root` for its one writer. Leftover
    /// temporary files from a crash are removed: they were never linked under a key, so nothing
    /// refers to them.
    pub fn open(root: impl AsRef<Path>, limits: StoreLimits) -> io::Result<Self> {
        let store = Self::open_shared(root, limits)?;
        for entry in fs::read_dir(&store.inner.tmp)? {
            let _ = fs::remove_file(entry?.path());
        }
        Ok(store)
    }

    /// Opens a store another process writes (a gateway beside a star): nothing is cleaned up,
    /// since the writer's temporary files may be in use.
    pub fn open_shared(root: impl AsRef<Path>, limits: StoreLimits) -> io::Result<Self> {
        let root = root.as_ref();
        let objects = root.join("objects");
        let tmp = root.join("tmp");
        fs::create_dir_all(&objects)?;
        fs::create_dir_all(&tmp)?;
        Ok(Self {
            inner: Arc::new(Inner {
                objects,
                tmp,
                reads: Arc::new(Semaphore::new(limits.read_concurrency.max(1))),
                writes: Arc::new(Semaphore::new(limits.write_concurrency.max(1))),
                limits,
                dir_syncs: Default::default(),
                durable_dirs: Default::default(),
                names: Entropy::from_os(),
            }),
        })
    }

    async fn run<T, F>(&self, op: Op, key: &str, write: bool, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    {
        let semaphore = if write {
            &self.inner.writes
        } else {
            &self.inner.reads
        };
        let timeout = self.inner.limits.request_timeout;
        let timed_out = || StoreError::Transient {
            op,
            key: key.to_owned(),
            message: format!("timed out after {timeout:?}"),
        };
        let clock = self.inner.limits.clock;
        let deadline = clock.now() + timeout;
        // The deadline covers the wait for a slot too: when every slot is held by calls a hung
        // disk never finishes, new calls fail as timeouts (and the star reports its store
        // failing) rather than wait without a word.
        let permit = clock
            .timeout_at(deadline, semaphore.clone().acquire_owned())
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: "store closed".into(),
            })?;
        let inner = self.inner.clone();
        // The permit travels with the blocking work and is released only when it ends: a caller
        // that stops waiting (the deadline) must not free a slot while a hung disk still holds a
        // thread of the blocking pool.
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&inner)
        });
        match clock.timeout_at(deadline, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: format!("filesystem task failed: {join}"),
            }),
            Err(_) => Err(timed_out()),
        }
    }
}

impl Inner {
    fn path_of(&self, op: Op, key: &str) -> Result<PathBuf, StoreError> {
        let valid = !key.is_empty()
            && !key.starts_with('/')
            && key
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !valid {
            return Err(StoreError::Permanent {
                op,
                key: key.to_owned(),
                message: "invalid key for a local store".into(),
            });
        }
        Ok(self.objects.join(key))
    }

    /// Writes the payload to a fresh temporary file and fsyncs it.
    fn write_temp(&self, payload: &PutPayload) -> io::Result<PathBuf> {
        let name = format!(
            "{:016x}{:016x}.tmp",
            self.names.next_u64(),
            self.names.next_u64()
        );
        let path = self.tmp.join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        write_parts(&mut file, payload.parts())?;
        file.sync_all()?;
        Ok(path)
    }

    /// Creates the key's parent directories and makes their entries durable: each directory
    /// from the key's parent up to the store's root is fsynced in its own parent once per
    /// process (the set of directories is small: a few per chain epoch). Syncing only the
    /// directories this call created would miss one an earlier, failed attempt created.
    fn ensure_parent(&self, path: &Path) -> io::Result<PathBuf> {
        let parent = path.parent().unwrap_or(&self.objects).to_path_buf();
        if self.durable_dirs.lock().contains(&parent) {
            return Ok(parent);
        }
        fs::create_dir_all(&parent)?;
        let mut dir = parent.as_path();
        while dir != self.objects {
            let Some(above) = dir.parent() else { break };
            self.sync_dir(above)?;
            dir = above;
        }
        self.durable_dirs.lock().insert(parent.clone());
        Ok(parent)
    }
}

impl Inner {
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()?;
        self.dir_syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Parts gathered into one vectored write: well under the kernel's IOV_MAX of 1024.
const PARTS_PER_WRITE: usize = 256;

/// Writes a payload's parts with vectored writes: a flight whose records reference their
/// messages has two parts per large record, and a system call each would cost more than the
/// bytes.
fn write_parts(file: &mut File, parts: &[bytes::Bytes]) -> io::Result<()> {
    for group in parts.chunks(PARTS_PER_WRITE) {
        // Empty parts are left out: a write of nothing but them would read as a failed write.
        let mut slices: Vec<IoSlice<'_>> = group
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| IoSlice::new(p))
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let written = match file.write_vectored(rest) {
                Ok(written) => written,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, written);
        }
    }
    Ok(())
}

fn io_error(op: Op, key: &str, err: io::Error) -> StoreError {
    match err.kind() {
        io::ErrorKind::NotFound => StoreError::NotFound {
            key: key.to_owned(),
        },
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => StoreError::Permanent {
            op,
            key: key.to_owned(),
            message: err.to_string(),
        },
        // Disk full, I/O errors and the like may clear; the caller's retry policy decides.
        _ => StoreError::Transient {
            op,
            key: key.to_owned(),
            message: err.to_string(),
        },
    }
}

#[async_trait]
impl ObjectStore for LocalStore {
    fn describe(&self) -> String {
        format!("local directory {}", self.inner.objects.display())
    }

    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError> {
        let owned = key.to_owned();
        self.run(Op::PutIfAbsent, key, true, move |inner| {
            let op = Op::PutIfAbsent;
            let path = inner.path_of(op, &owned)?;
            let err = |e| io_error(op, &owned, e);
            let tmp = inner.write_temp(&payload).map_err(err)?;
            let outcome =
                inner
                    .ensure_parent(&path)
                    .and_then(|parent| match fs::hard_link(&tmp, &path) {
                        Ok(()) => inner.sync_dir(&parent).map(|()| CreateOutcome::Created),
                        // An earlier attempt may have linked the object and lost its answer
                        // before syncing: the caller may treat what it finds as durable, so
                        // make it durable before answering.
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => File::open(&path)
                            .and_then(|existing| existing.sync_all())
                            .and_then(|()| inner.sync_dir(&parent))
                            .map(|()| CreateOutcome::AlreadyExists),
                        Err(e) => Err(e),
                    });
            let _ = fs::remove_file(&tmp);
            outcome.map_err(err)
        })
        .await
    }

    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError> {
        let owned = key.to_owned();
        self.run(Op::Put, key, true, move |inner| {
            let op = Op::Put;
            let path = inner.path_of(op, &owned)?;
            let err = |e| io_error(op, &owned, e);
            let tmp = inner.write_temp(&payload).map_err(err)?;
            let result = inner
                .ensure_parent(&path)
                .and_then(|parent| fs::rename(&tmp, &path).and_then(|()| inner.sync_dir(&parent)));
            if result.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            result.map_err(err)
        })
        .await
    }

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError> {
        let owned = key.to_owned();
        self.run(Op::Get, key, false, move |inner| {
            let op = Op::Get;
            let path = inner.path_of(op, &owned)?;
            let err = |e| io_error(op, &owned, e);
            let mut file = File::open(&path).map_err(err)?;
            let size = file.metadata().map_err(err)?.len();
            let (start, end) = match &range {
                GetRange::All => (0, size),
                GetRange::Suffix(n) => (size.saturating_sub(*n), size),
                GetRange::Bounded(r) => {
                    if r.start >= r.end || r.start >= size {
                        return Err(StoreError::InvalidRange {
                            key: owned.clone(),
                            range: range.clone(),
                        });
                    }
                    (r.start, r.end.min(size))
                }
            };
            let mut buf = vec![0u8; (end - start) as usize];
            file.seek(SeekFrom::Start(start)).map_err(err)?;
            file.read_exact(&mut buf).map_err(err)?;
            Ok(GetResult {
                bytes: Bytes::from(buf),
                object_size: size,
            })
        })
        .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let owned = key.to_owned();
        self.run(Op::Head, key, false, move |inner| {
            let path = inner.path_of(Op::Head, &owned)?;
            let meta = fs::metadata(&path).map_err(|e| io_error(Op::Head, &owned, e))?;
            if !meta.is_file() {
                return Err(StoreError::NotFound { key: owned });
            }
            Ok(ObjectMeta {
                key: owned,
                size: meta.len(),
                modified_ms: modified_ms(&meta),
            })
        })
        .await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError> {
        let prefix = prefix.to_owned();
        let start_after = start_after.map(str::to_owned);
        let max_keys = max_keys.clamp(1, MAX_LIST_KEYS);
        let key = prefix.clone();
        self.run(Op::List, &key, false, move |inner| {
            list_dir(inner, &prefix, start_after.as_deref(), max_keys)
                .map_err(|e| io_error(Op::List, &prefix, e))
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let owned = key.to_owned();
        self.run(Op::Delete, key, true, move |inner| {
            let path = inner.path_of(Op::Delete, &owned)?;
            match fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error(Op::Delete, &owned, e)),
            }
        })
        .await
    }

    /// Copies the parts into a temporary file and renames it into place, as `put` does.
    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError> {
        super::check_compose(key, &parts)?;
        let owned = key.to_owned();
        self.run(Op::Compose, key, true, move |inner| {
            let op = Op::Compose;
            let path = inner.path_of(op, &owned)?;
            let tmp = inner.compose_temp(&owned, &parts)?;
            let result = inner
                .ensure_parent(&path)
                .and_then(|parent| fs::rename(&tmp, &path).and_then(|()| inner.sync_dir(&parent)));
            if result.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            result.map_err(|e| io_error(op, &owned, e))
        })
        .await
    }
}

impl Inner {
    /// Writes the composed object to a fresh temporary file and fsyncs it.
    fn compose_temp(&self, key: &str, parts: &[ComposePart]) -> Result<PathBuf, StoreError> {
        let op = Op::Compose;
        let tmp = self
            .write_temp(&PutPayload::default())
            .map_err(|e| io_error(op, key, e))?;
        let write = || -> Result<(), StoreError> {
            let mut file = OpenOptions::new()
                .append(true)
                .open(&tmp)
                .map_err(|e| io_error(op, key, e))?;
            for part in parts {
                match part {
                    ComposePart::Data(payload) => {
                        write_parts(&mut file, payload.parts())
                            .map_err(|e| io_error(op, key, e))?;
                    }
                    ComposePart::Copy { source, range } => {
                        let from = self.path_of(op, source)?;
                        let err = |e| io_error(op, source, e);
                        let mut src = File::open(&from).map_err(err)?;
                        let size = src.metadata().map_err(err)?.len();
                        if range.start >= range.end || range.end > size {
                            return Err(StoreError::InvalidRange {
                                key: source.clone(),
                                range: GetRange::Bounded(range.clone()),
                            });
                        }
                        src.seek(SeekFrom::Start(range.start)).map_err(err)?;
                        let want = range.end - range.start;
                        let copied = io::copy(&mut src.take(want), &mut file).map_err(err)?;
                        if copied != want {
                            return Err(StoreError::Transient {
                                op,
                                key: source.clone(),
                                message: format!("copied {copied} of {want} bytes"),
                            });
                        }
                    }
                }
            }
            file.sync_all().map_err(|e| io_error(op, key, e))
        };
        match write() {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// Walks the directory tree in key order. Within a directory, entries are ordered by the key
/// text they lead to (a directory `a` sorts as `a/`), so a depth-first walk yields keys in the
/// same byte order S3 lists them in, and the walk can stop after one page.
fn list_dir(
    inner: &Inner,
    prefix: &str,
    start_after: Option<&str>,
    max_keys: usize,
) -> io::Result<ListPage> {
    // Start at the deepest directory the prefix names in full.
    let base = match prefix.rfind('/') {
        Some(i) => &prefix[..=i],
        None => "",
    };
    let mut page = ListPage::default();
    let root = inner.objects.join(base);
    if !root.is_dir() {
        return Ok(page);
    }
    // A stack of directories still to walk, each with its entries sorted in reverse so `pop`
    // yields the smallest first.
    let mut stack: Vec<Vec<(String, bool)>> = vec![sorted_entries(&root, base)?];
    while let Some(level) = stack.last_mut() {
        let Some((key, is_dir)) = level.pop() else {
            stack.pop();
            continue;
        };
        if is_dir {
            let dir_key = format!("{key}/");
            // Skip subtrees that cannot hold a key both matching the prefix and past start_after.
            let may_match = dir_key.starts_with(prefix) || prefix.starts_with(&dir_key);
            let may_follow = start_after
                .is_none_or(|after| dir_key.as_str() > after || after.starts_with(&dir_key));
            if may_match && may_follow {
                stack.push(sorted_entries(&inner.objects.join(&key), &dir_key)?);
            }
            continue;
        }
        if !key.starts_with(prefix) || start_after.is_some_and(|after| key.as_str() <= after) {
            continue;
        }
        // Deleted since the directory was read: like S3, a listing need not show it.
        let meta = match fs::metadata(inner.objects.join(&key)) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        page.objects.push(ObjectMeta {
            key,
            size: meta.len(),
            modified_ms: modified_ms(&meta),
        });
        if page.objects.len() == max_keys {
            page.next_start_after = page.objects.last().map(|o| o.key.clone());
            break;
        }
    }
    Ok(page)
}

fn sorted_entries(dir: &Path, key_prefix: &str) -> io::Result<Vec<(String, bool)>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let is_dir = entry.file_type()?.is_dir();
        entries.push((format!("{key_prefix}{name}"), is_dir));
    }
    entries.sort_by_key(|entry| std::cmp::Reverse(sort_key(entry)));
    Ok(entries)
}

fn sort_key((key, is_dir): &(String, bool)) -> String {
    if *is_dir {
        format!("{key}/")
    } else {
        key.clone()
    }
}

/// A file's modification time, as the store's Last-Modified. On a local directory it is the
/// same machine's clock as the star's: no second opinion, but the best this store can give.
fn modified_ms(meta: &fs::Metadata) -> Option<u64> {
    let modified = meta.modified().ok()?;
    let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(since.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn payload(text: &'static str) -> PutPayload {
        PutPayload::from(Bytes::from_static(text.as_bytes()))
    }

    /// A create that finds its key taken may be meeting its own earlier attempt, whose answer
    /// was lost before the directory was synced; the writer then treats the bytes as durable.
    #[tokio::test]
    async fn a_create_that_finds_the_key_syncs_before_answering() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path(), StoreLimits::default()).unwrap();
        let created = store
            .put_if_absent("a/b/key", payload("one"))
            .await
            .unwrap();
        assert_eq!(created, CreateOutcome::Created);
        let before = store.inner.dir_syncs.load(Ordering::Relaxed);
        let again = store
            .put_if_absent("a/b/key", payload("one"))
            .await
            .unwrap();
        assert_eq!(again, CreateOutcome::AlreadyExists);
        assert!(
            store.inner.dir_syncs.load(Ordering::Relaxed) > before,
            "the key's directory is synced before AlreadyExists is reported"
        );
    }

    /// A hung filesystem call keeps its concurrency slot after the caller's timeout gives up on
    /// it, so hung calls cannot pile up in the blocking pool past the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timed_out_call_keeps_its_slot_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let limits = StoreLimits {
            read_concurrency: 1,
            write_concurrency: 1,
            // Long enough for the plain PUT below to finish on a loaded machine (200 ms once
            // timed out during a full test run).
            request_timeout: Duration::from_millis(1000),
            ..StoreLimits::default()
        };
        let store = LocalStore::open(dir.path(), limits).unwrap();
        store.put("plain", payload("hello")).await.unwrap();
        // Opening a FIFO for reading blocks until a writer opens it: a stand-in for a hung disk.
        let fifo = dir.path().join("objects").join("hung");
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let hung = store.get("hung", GetRange::All).await;
        assert!(
            matches!(hung, Err(StoreError::Transient { .. })),
            "{hung:?}"
        );
        let next = crate::clock::Clock::system()
            .timeout(
                Duration::from_millis(500),
                store.get("plain", GetRange::All),
            )
            .await;
        assert!(
            !matches!(next, Ok(Ok(_))),
            "a read ran while the hung read still held the only read slot"
        );
        // Unblock the hung open; its slot comes back and reads work again.
        let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        drop(writer);
        let mut read = None;
        for _ in 0..20 {
            if let Ok(result) = store.get("plain", GetRange::All).await {
                read = Some(result);
                break;
            }
        }
        assert_eq!(read.expect("reads work again").bytes, "hello");
    }
}
