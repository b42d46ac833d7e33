//! The object-store flags novad and novagateway share, and opening the store they describe.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use nova_core::object_store::{Backend, ObjectStore, S3Config, StoreLimits, StoreStack};

#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// S3 bucket holding the flights. Without it they are in a local directory (novad: under
    /// --data-dir).
    #[arg(long, env = "NOVA_S3_BUCKET", help_heading = "Object store")]
    pub s3_bucket: Option<String>,

    /// Custom S3 endpoint URL (an S3-compatible server); AWS when unset.
    #[arg(long, env = "NOVA_S3_ENDPOINT", help_heading = "Object store")]
    pub s3_endpoint: Option<String>,

    /// S3 region.
    #[arg(
        long,
        env = "NOVA_S3_REGION",
        default_value = "us-east-1",
        help_heading = "Object store"
    )]
    pub s3_region: String,

    /// Key prefix for everything Nova writes in the bucket.
    #[arg(
        long,
        env = "NOVA_S3_PREFIX",
        default_value = "",
        help_heading = "Object store"
    )]
    pub s3_prefix: String,

    /// Address buckets by path (http://endpoint/bucket/key), as most S3-compatible servers need.
    #[arg(long, env = "NOVA_S3_PATH_STYLE", help_heading = "Object store")]
    pub s3_path_style: bool,

    /// Object-store reads in flight at once; more wait their turn.
    #[arg(
        long,
        env = "NOVA_S3_READ_CONCURRENCY",
        default_value_t = 64,
        help_heading = "Object store"
    )]
    pub s3_read_concurrency: usize,

    /// Object-store writes in flight at once; more wait their turn.
    #[arg(
        long,
        env = "NOVA_S3_WRITE_CONCURRENCY",
        default_value_t = 16,
        help_heading = "Object store"
    )]
    pub s3_write_concurrency: usize,

    /// Deadline for one object-store request attempt, in milliseconds.
    #[arg(
        long,
        env = "NOVA_S3_REQUEST_TIMEOUT_MS",
        default_value_t = 30_000,
        help_heading = "Object store"
    )]
    pub s3_request_timeout_ms: u64,

    /// Attempts per object-store request (retryable errors only), with backoff between them.
    #[arg(
        long,
        env = "NOVA_S3_MAX_ATTEMPTS",
        default_value_t = 3,
        help_heading = "Object store"
    )]
    pub s3_max_attempts: u32,
}

impl StoreArgs {
    pub fn limits(&self) -> StoreLimits {
        StoreLimits {
            read_concurrency: self.s3_read_concurrency,
            write_concurrency: self.s3_write_concurrency,
            request_timeout: Duration::from_millis(self.s3_request_timeout_ms),
            clock: nova_core::clock::Clock::system(),
        }
    }

    /// The S3 configuration, when a bucket is given (its limits are the stack's, set where the
    /// store is opened).
    fn s3(&self) -> Option<S3Config> {
        let bucket = self.s3_bucket.clone()?;
        let mut config = S3Config::new(bucket);
        config.prefix = self.s3_prefix.clone();
        config.endpoint = self.s3_endpoint.clone();
        config.region = self.s3_region.clone();
        config.force_path_style = self.s3_path_style;
        config.max_attempts = self.s3_max_attempts;
        Some(config)
    }

    /// Where the flags put the objects: S3 when a bucket is given, else the local directory
    /// store at `local_root` (as its writer, or as a reader beside another process's writer).
    pub fn backend(&self, local_root: &Path, writer: bool) -> Backend {
        match self.s3() {
            Some(s3) => Backend::S3(s3),
            None => Backend::Local {
                root: local_root.to_path_buf(),
                writer,
            },
        }
    }

    /// Opens the store the flags describe (see [`StoreArgs::backend`]).
    pub async fn open(
        &self,
        local_root: &Path,
        writer: bool,
    ) -> std::io::Result<Arc<dyn ObjectStore>> {
        Ok(
            StoreStack::open(self.backend(local_root, writer), self.limits())
                .await?
                .build(),
        )
    }
}
