//! The object store a star writes flights to, and its two backends: a local directory (the
//! zero-setup default) and S3 through aws-sdk-s3. Both pass the suite in `conformance`.

mod concurrency_limited;
pub mod conformance;
pub mod faulty;
mod instrumented;
mod local;
mod payload;
mod probe;
mod rate_limited;
#[cfg(feature = "s3")]
mod s3;
mod stack;

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

pub use concurrency_limited::ConcurrencyLimited;
pub use instrumented::Instrumented;
pub use local::LocalStore;
pub use payload::PutPayload;
pub use probe::{ProbeError, probe_conditional_create};
pub use rate_limited::{RateLimited, RateLimitedMetrics};
#[cfg(feature = "s3")]
pub use s3::{S3Config, S3Store};
pub use stack::{Backend, StoreStack};

/// Which part of an object to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetRange {
    All,
    /// Byte range, end exclusive. An end past the object's size is clamped to it.
    Bounded(Range<u64>),
    /// The last n bytes, or the whole object when it is shorter.
    Suffix(u64),
}

#[derive(Debug, Clone)]
pub struct GetResult {
    pub bytes: Bytes,
    /// The whole object's size, whatever range was read.
    pub object_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    /// When the object was last written, in Unix milliseconds by the store's own clock (S3's
    /// Last-Modified), when the store says. The auditor's retention takes it as a second clock
    /// beside the stars' (see docs/auditor.md).
    pub modified_ms: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    /// Pass as `start_after` to read the next page; `None` on the last page.
    pub next_start_after: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateOutcome {
    Created,
    /// Something already exists at the key; nothing was written.
    AlreadyExists,
}

/// Object-store operations, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Put,
    PutIfAbsent,
    Get,
    Head,
    List,
    Delete,
    Compose,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::PutIfAbsent => "put_if_absent",
            Op::Get => "get",
            Op::Head => "head",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Compose => "compose",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {key} not found")]
    NotFound { key: String },
    #[error("range {range:?} is not satisfiable for object {key}")]
    InvalidRange { key: String, range: GetRange },
    /// Worth retrying: a timeout, a connection failure, throttling, a 5xx.
    #[error("object store {op} of {key} failed (retryable): {message}")]
    Transient {
        op: Op,
        key: String,
        message: String,
    },
    /// Retrying will not help: bad credentials, a missing bucket, a malformed request.
    #[error("object store {op} of {key} failed: {message}")]
    Permanent {
        op: Op,
        key: String,
        message: String,
    },
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Transient { .. })
    }
}

/// Conditional creates are the chain's fencing primitive, so a backend must make them atomic:
/// among concurrent `put_if_absent` calls on one key exactly one returns `Created`.
#[async_trait]
pub trait ObjectStore: Send + Sync + fmt::Debug + 'static {
    /// A short description for logs: the backend and where it points.
    fn describe(&self) -> String;

    /// Writes the object only if nothing exists at `key`. Durable when it returns `Created`.
    async fn put_if_absent(
        &self,
        key: &str,
        payload: PutPayload,
    ) -> Result<CreateOutcome, StoreError>;

    /// Writes the object, replacing whatever was there.
    async fn put(&self, key: &str, payload: PutPayload) -> Result<(), StoreError>;

    async fn get(&self, key: &str, range: GetRange) -> Result<GetResult, StoreError>;

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;

    /// Keys under `prefix` in byte order, strictly after `start_after`, at most `max_keys`
    /// (capped at 1000) per page.
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, StoreError>;

    /// Deletes the object; deleting a missing key succeeds.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// Writes `key` (replacing whatever was there) as the concatenation of `parts`, copying each
    /// `ComposePart::Copy` inside the store, so those bytes never pass through this process. On
    /// S3 this is a multipart upload whose copied parts are UploadPartCopy requests: every part
    /// but the last must be at least `MIN_COMPOSE_PART` bytes, and a backend refuses anything
    /// else, so callers keep to the rule whatever store they write to.
    async fn compose(&self, key: &str, parts: Vec<ComposePart>) -> Result<(), StoreError>;

    /// The smallest part of a composed object but the last that this store takes: S3's
    /// multipart minimum unless a store says otherwise (the simulation's takes smaller, so
    /// that its small objects are copied too).
    fn min_compose_part(&self) -> u64 {
        MIN_COMPOSE_PART
    }
}

/// S3's smallest multipart part (all but the last): 5 MiB.
pub const MIN_COMPOSE_PART: u64 = 5 * 1024 * 1024;
/// S3's most parts in one multipart upload.
pub const MAX_COMPOSE_PARTS: usize = 10_000;

/// One part of an object written by `ObjectStore::compose`.
#[derive(Debug, Clone)]
pub enum ComposePart {
    /// Bytes `range` (end exclusive) of the object at `source`, copied by the store.
    Copy { source: String, range: Range<u64> },
    /// Bytes sent with the request.
    Data(PutPayload),
}

impl ComposePart {
    pub fn len(&self) -> u64 {
        match self {
            ComposePart::Copy { range, .. } => range.end.saturating_sub(range.start),
            ComposePart::Data(payload) => payload.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Checks `parts` against the multipart rules every backend enforces: at least one part, none
/// empty, all but the last at least `MIN_COMPOSE_PART`, at most `MAX_COMPOSE_PARTS`.
pub fn check_compose(key: &str, parts: &[ComposePart]) -> Result<(), StoreError> {
    check_compose_with(key, parts, MIN_COMPOSE_PART)
}

/// `check_compose` for a store whose smallest part but the last is `min_part`.
pub fn check_compose_with(
    key: &str,
    parts: &[ComposePart],
    min_part: u64,
) -> Result<(), StoreError> {
    let refuse = |message: String| {
        Err(StoreError::Permanent {
            op: Op::Compose,
            key: key.to_owned(),
            message,
        })
    };
    if parts.is_empty() || parts.len() > MAX_COMPOSE_PARTS {
        return refuse(format!(
            "a composed object needs 1 to {MAX_COMPOSE_PARTS} parts, not {}",
            parts.len()
        ));
    }
    if let Some((i, part)) = parts
        .iter()
        .enumerate()
        .find(|(i, part)| part.is_empty() || (*i + 1 < parts.len() && part.len() < min_part))
    {
        return refuse(format!(
            "part {} of {} is {} bytes: every part but the last needs at least {min_part}",
            i + 1,
            parts.len(),
            part.len()
        ));
    }
    Ok(())
}

/// The largest page a list call returns, matching S3's own cap.
pub const MAX_LIST_KEYS: usize = 1000;

/// Read and write concurrency limits, and a deadline per request, shared by the backends.
#[derive(Debug, Clone)]
pub struct StoreLimits {
    pub read_concurrency: usize,
    pub write_concurrency: usize,
    pub request_timeout: std::time::Duration,
    /// What the request deadline is measured on.
    pub clock: crate::clock::Clock,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            read_concurrency: 64,
            write_concurrency: 16,
            request_timeout: std::time::Duration::from_secs(30),
            clock: crate::clock::Clock::system(),
        }
    }
}
