//! novad's flags. Every flag can also be set from the environment (`NOVA_` and the flag's name
//! in upper snake case); the doc comment on each is its `--help` text and says what it bounds
//! and what happens at the limit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use nova_auditor::{AuditorConfig, defaults as auditor_defaults};
use nova_chain::{ChainConfig, RetryPolicy};
use nova_core::clock::Clock;
use nova_core::entropy::Entropy;
use nova_core::limits;
use nova_proto::validate::AppendCaps;
use nova_server::StoreArgs;

use nova_proto::units::ByteSize;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "novad",
    version,
    about = "The Nova star: a durable stream store on object storage.",
    long_about = "The Nova star: accepts appends over gRPC, acknowledges them once they are durable \
in object storage, and serves reads. With no flags it runs on the embedded default: a local \
directory object store and an embedded metastore under --data-dir.\n\n\
Every bound below is a budget: at its limit admitted work blocks (and the wait shows as an age \
in the metrics) or new work is refused with RESOURCE_EXHAUSTED; memory never grows past it."
,
    // One layout throughout: each flag's help on the lines under it.
    next_line_help = true
)]
pub struct Config {
    /// Address the gRPC API listens on.
    #[arg(long, env = "NOVA_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,

    /// Address the Prometheus metrics endpoint (/metrics) listens on.
    #[arg(long, env = "NOVA_METRICS_ADDR", default_value = "127.0.0.1:7401")]
    pub metrics_addr: SocketAddr,

    /// Streams exported with metric series of their own (a `stream` label): the ones with the
    /// most appended bytes, chosen afresh at each scrape. Stream names are unbounded, so the
    /// rest count only in the totals; 0 exports no per-stream series.
    #[arg(long, env = "NOVA_METRICS_TOP_STREAMS", default_value_t = nova_core::limits::METRICS_TOP_STREAMS)]
    pub metrics_top_streams: usize,

    /// Directory for the embedded metastore and, without --s3-bucket, the local object store.
    #[arg(long, env = "NOVA_DATA_DIR", default_value = "nova-data")]
    pub data_dir: PathBuf,

    /// This star's name, unique in its fleet. Its chain of flights lives under
    /// chain/<star-id>/ in the object store. A second live star with the same id on one
    /// etcd metastore is refused.
    #[arg(long, env = "NOVA_STAR_ID", default_value = "nova")]
    pub star_id: String,

    /// Where the catalog lives: `embedded` (a redb file under --data-dir, one star, nothing to
    /// set up) or `etcd://HOST:PORT[,HOST:PORT…]` (a fleet of stars sharing one catalog,
    /// registering under leases and placing streams among themselves).
    #[arg(
        long,
        env = "NOVA_METASTORE",
        default_value = "embedded",
        help_heading = "Fleet"
    )]
    pub metastore: String,

    /// The most operations one metastore transaction may carry: etcd's --max-txn-ops (128
    /// unless the cluster was started with more). Larger writes are split to fit.
    #[arg(long, env = "NOVA_METASTORE_MAX_TXN_OPS", default_value_t = nova_core::metastore::ETCD_DEFAULT_MAX_TXN_OPS, help_heading = "Fleet")]
    pub metastore_max_txn_ops: usize,

    /// Where clients and other stars reach this star: a URL, or HOST:PORT (which gets
    /// https:// when --tls-cert is given, else http://). Default: --listen, the same way.
    /// Redirects name it, so it must be reachable from them.
    #[arg(long, env = "NOVA_ADVERTISE_ADDR", help_heading = "Fleet")]
    pub advertise_addr: Option<String>,

    /// The fleet lease's time to live, seconds. A star renews it every quarter of it; a star
    /// that cannot renew it for three quarters of it stops acknowledging, and once it lapses
    /// the star's registration is gone. Shorter: faster failover; longer: more tolerance of a
    /// slow etcd.
    #[arg(
        long,
        env = "NOVA_LEASE_TTL_SECS",
        default_value_t = 10,
        help_heading = "Fleet"
    )]
    pub lease_ttl_secs: u64,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub listener: nova_server::net::ListenerArgs,

    #[command(flatten)]
    pub kafka: crate::kafka::KafkaArgs,

    // ---- budgets --------------------------------------------------------------------------
    /// Admission buffer, MiB: bytes of appends held from decode until they are acknowledged or
    /// fail. When full, appends block and their sessions stop reading frames, so producers slow
    /// down through gRPC flow control. No error is returned.
    #[arg(long, env = "NOVA_S3_MEMORY_BUFFER_MIB", default_value_t = limits::ADMISSION_BUFFER_MIB, help_heading = "Budgets")]
    pub s3_memory_buffer_mib: u64,

    /// Backlog budget: flights acknowledged but not yet absorbed into the index. When spent,
    /// appends block until the absorb catches up; each stall is logged and counted with its cause.
    #[arg(long, env = "NOVA_S3_CHAIN_BACKLOG_FLIGHTS", default_value_t = limits::CHAIN_BACKLOG_FLIGHTS, help_heading = "Budgets")]
    pub s3_chain_backlog_flights: u32,

    /// Recycled append buffers, MiB: buffers (of 128 KiB or more) of appends whose records have
    /// left memory (their flight landed and the tail window cache let it go), kept resident so
    /// that the next append filling the same pages is copied into one instead of into fresh
    /// pages, which cost a page fault each. When full, the sizes least recently asked for make
    /// room. Default: a quarter of --s3-memory-buffer-mib. 0 keeps none.
    #[arg(long, env = "NOVA_RECYCLE_BUFFER_MIB", help_heading = "Budgets")]
    pub recycle_buffer_mib: Option<u64>,

    /// Tail window cache, MiB: acknowledged records kept in memory for hot reads. The oldest
    /// flights are evicted first; a flight larger than the whole cache is not cached (logged).
    #[arg(long, env = "NOVA_TAIL_WINDOW_CACHE_MIB", default_value_t = limits::TAIL_WINDOW_CACHE_MIB, help_heading = "Budgets")]
    pub tail_window_cache_mib: u64,

    /// Read budget, MiB: what reads hold at once beyond the tail window cache (fetched
    /// sections, the page, its encoded response, until it is sent). A read waits for room only
    /// while it holds nothing, so it always serves at least one record; past that, a read that
    /// finds the budget spent returns a short page. The wait shows in nova_read_memory_wait_seconds.
    #[arg(long, env = "NOVA_READ_MEMORY_MIB", default_value_t = limits::READ_MEMORY_MIB, help_heading = "Budgets")]
    pub read_memory_mib: u64,

    /// Producer sessions open at once. A new session past the cap is refused with
    /// RESOURCE_EXHAUSTED and a retry-after-ms hint; open sessions are never cut.
    #[arg(long, env = "NOVA_MAX_PRODUCER_SESSIONS", default_value_t = limits::MAX_PRODUCER_SESSIONS, help_heading = "Budgets")]
    pub max_producer_sessions: u32,

    /// Streams this star holds. A create past it is refused with RESOURCE_EXHAUSTED naming the
    /// cap; existing streams are unaffected. Each stream costs about 1 KiB of fixed memory.
    #[arg(long, env = "NOVA_MAX_STREAMS", default_value_t = limits::MAX_STREAMS, help_heading = "Budgets")]
    pub max_streams: u32,

    /// Subscriptions: reads in progress at once, each holding one slot while it builds its page
    /// and, for a follow read (wait_ms), while it waits at the stream's tail. A read past the cap
    /// is refused with RESOURCE_EXHAUSTED and a retry hint; reads in progress are never cut.
    #[arg(long, env = "NOVA_MAX_SUBSCRIPTIONS", default_value_t = limits::MAX_SUBSCRIPTIONS, help_heading = "Budgets")]
    pub max_subscriptions: u32,

    /// HTTP/2 receive window per stream, KiB (adaptive windows are off). Bounds the bytes the
    /// transport buffers ahead of each session: sessions × window is the transport's memory.
    #[arg(long, env = "NOVA_GRPC_STREAM_WINDOW_KIB", default_value_t = limits::GRPC_STREAM_WINDOW_KIB, help_heading = "Budgets")]
    pub grpc_stream_window_kib: u32,

    /// Content bytes in one append batch. A larger batch is rejected with INVALID_ARGUMENT and
    /// nothing of it is applied; the session goes on.
    #[arg(long, env = "NOVA_MAX_BATCH_BYTES", default_value_t = ByteSize(limits::MAX_BATCH_BYTES), help_heading = "Budgets")]
    pub max_batch_bytes: ByteSize,

    /// Records in one append batch. More are rejected with INVALID_ARGUMENT; the session goes on.
    #[arg(long, env = "NOVA_MAX_BATCH_RECORDS", default_value_t = limits::MAX_BATCH_RECORDS, help_heading = "Budgets")]
    pub max_batch_records: u32,

    /// Content bytes of one record (body plus header names and values). A batch holding a larger
    /// record is rejected with INVALID_ARGUMENT; the session goes on.
    #[arg(long, env = "NOVA_MAX_RECORD_BYTES", default_value_t = ByteSize(limits::MAX_RECORD_BYTES), help_heading = "Budgets")]
    pub max_record_bytes: ByteSize,

    /// Content bytes in one read response. The page returns short at the cap; the first record
    /// is always served, however large.
    #[arg(long, env = "NOVA_MAX_READ_BYTES", default_value_t = ByteSize(limits::MAX_READ_BYTES), help_heading = "Budgets")]
    pub max_read_bytes: ByteSize,

    /// Records in one read response. The page returns short at the cap.
    #[arg(long, env = "NOVA_MAX_READ_RECORDS", default_value_t = limits::MAX_READ_RECORDS, help_heading = "Budgets")]
    pub max_read_records: u32,

    // ---- flights ----------------------------------------------------------------------------
    /// A flight (one object-store PUT carrying batches from every stream) closes once it holds
    /// this many bytes.
    #[arg(long, env = "NOVA_FLIGHT_MAX_BYTES", default_value_t = ByteSize(limits::FLIGHT_MAX_BYTES), help_heading = "Flights")]
    pub flight_max_bytes: ByteSize,

    /// A flight closes this many milliseconds after its first batch, full or not. Adds at most
    /// this much to ack latency and caps an idle-ish star at 1000/linger PUTs per second.
    #[arg(long, env = "NOVA_FLIGHT_LINGER_MS", default_value_t = limits::FLIGHT_LINGER_MS, help_heading = "Flights")]
    pub flight_linger_ms: u64,

    /// Flights being written to the object store at once. When all are busy the next flight
    /// waits, and admission fills behind it.
    #[arg(long, env = "NOVA_FLIGHT_MAX_INFLIGHT", default_value_t = limits::FLIGHT_MAX_INFLIGHT, help_heading = "Flights")]
    pub flight_max_inflight: u32,

    // ---- express -------------------------------------------------------------------------
    /// An express zone bucket, `name=NAME,bucket=BUCKET[,endpoint=URL]` (S3 Express One Zone
    /// in production; region, path style, prefix and credentials are the regional store's), or
    /// `name=NAME,dir=PATH` (a local directory, to try Express on one machine). Repeat once per
    /// zone (in the environment: separate them with `;`). An Express append is acknowledged once
    /// a majority of the zones holds it. Without zones, creating an Express stream is refused.
    #[arg(
        long = "s3-express-zone",
        env = "NOVA_S3_EXPRESS_ZONE",
        value_delimiter = ';',
        help_heading = "Express"
    )]
    pub s3_express_zone: Vec<crate::zone_spec::ZoneSpec>,

    /// How long an express bundle may take to reach its quorum of zones (`2s`, `500ms`). Past
    /// it the bundle's appends fail fast (UNAVAILABLE with a retry hint, or "outcome unknown"
    /// where a zone may still hold it) instead of queueing behind a dead zone.
    #[arg(
        long,
        env = "NOVA_S3_EXPRESS_PUBLISH_DEADLINE",
        default_value = "2s",
        help_heading = "Express"
    )]
    pub s3_express_publish_deadline: nova_proto::units::DurationArg,

    /// Bytes of Express appends held from admission until the Standard store holds them (the
    /// bundles being published, and acknowledged records not yet in a flight). At the limit
    /// Express appends block.
    #[arg(long, env = "NOVA_S3_EXPRESS_MEMORY_BUFFER_MIB", default_value_t = limits::EXPRESS_BUFFER_MIB, help_heading = "Express")]
    pub s3_express_memory_buffer_mib: u64,

    /// An express bundle closes this many milliseconds after its first batch (or at 1 MiB).
    /// Adds at most this much to an Express ack; caps an idle star at 1000/linger bundles (each
    /// one PUT per zone) per second.
    #[arg(long, env = "NOVA_S3_EXPRESS_LINGER_MS", default_value_t = limits::EXPRESS_LINGER_MS, help_heading = "Express")]
    pub s3_express_linger_ms: u64,

    // ---- memory --------------------------------------------------------------------------
    /// The memory the star may use. Default: the cgroup's memory limit (v2 memory.max or v1
    /// memory.limit_in_bytes) when one is set, else 60% of physical memory. A value above the
    /// cgroup's limit is capped to the limit, with a warning. The budgets' formula plus the
    /// fixed overhead (48 MiB and 64 KiB per session place) must fit under it at the session
    /// cap, or novad refuses to start.
    #[arg(long, env = "NOVA_MEMORY_CEILING", help_heading = "Memory")]
    pub memory_ceiling: Option<ByteSize>,

    /// Saturation (memory formula ÷ ceiling) at which the star reads saturated and refuses new
    /// leadership.
    #[arg(
        long,
        env = "NOVA_SATURATION_THRESHOLD",
        default_value_t = limits::SATURATION_THRESHOLD,
        help_heading = "Memory"
    )]
    pub saturation_threshold: f64,

    /// How far below the threshold saturation must fall before the saturated state clears, so it
    /// never flaps.
    #[arg(
        long,
        env = "NOVA_SATURATION_CLEAR_MARGIN",
        default_value_t = limits::SATURATION_CLEAR_MARGIN,
        help_heading = "Memory"
    )]
    pub saturation_clear_margin: f64,

    /// Start even when the budgets cannot fit under the memory ceiling at the session cap.
    #[arg(long, env = "NOVA_ALLOW_MEMORY_OVERCOMMIT", help_heading = "Memory")]
    pub allow_memory_overcommit: bool,

    /// Rebuild the metastore's catalog (streams, tails, the index and this star's chain) from
    /// the object store alone, then exit. For a star whose --data-dir (or metastore) was lost
    /// while its bucket was kept: run it with the same flags, then start novad normally. It
    /// refuses to touch a metastore that already holds a catalog.
    #[arg(long, env = "NOVA_REBUILD_CATALOG")]
    pub rebuild_catalog: bool,

    /// On SIGTERM or ctrl-c, how long to wait for flights in flight to land and be absorbed
    /// before giving up on them (they fail unacknowledged) and exiting non-zero.
    #[arg(long, env = "NOVA_SHUTDOWN_TIMEOUT_SECS", default_value_t = limits::SHUTDOWN_TIMEOUT_SECS)]
    pub shutdown_timeout_secs: u64,

    /// Run the auditor: settle the chain's flights into per-stream objects and collect what
    /// nothing references. Off (`--auditor false`), the bucket only grows.
    #[arg(long, env = "NOVA_AUDITOR", default_value_t = true, action = clap::ArgAction::Set, help_heading = "Auditor")]
    pub auditor: bool,

    /// Object-store requests per second the auditor may issue, all duties together. At the
    /// budget its work waits, and the backlog shows as nova_auditor_oldest_due_age_seconds.
    #[arg(long, env = "NOVA_AUDITOR_S3_BUDGET", default_value_t = auditor_defaults::S3_BUDGET, help_heading = "Auditor")]
    pub auditor_s3_budget: u32,

    /// MiB per second the auditor may assemble and write itself (settled and rewritten
    /// objects; server-side copies are free of it). At the budget writes wait.
    #[arg(long, env = "NOVA_AUDITOR_REWRITE_MIB", default_value_t = auditor_defaults::REWRITE_MIB, help_heading = "Auditor")]
    pub auditor_rewrite_mib: u32,

    /// Auditor jobs running at once. More due jobs queue (in the catalog, not in memory).
    #[arg(long, env = "NOVA_AUDITOR_WORKERS", default_value_t = auditor_defaults::WORKERS, help_heading = "Auditor")]
    pub auditor_workers: u32,

    /// Disk bytes (MiB) of the settle's whole-object fetch cache, under --data-dir. A flight the
    /// cache cannot admit is read with ranged GETs instead.
    #[arg(long, env = "NOVA_AUDITOR_FETCH_CACHE_MIB", default_value_t = auditor_defaults::FETCH_CACHE_MIB, help_heading = "Auditor")]
    pub auditor_fetch_cache_mib: u64,

    /// Seconds an object stays after nothing references it, so a reader (star or gateway)
    /// holding a ref can still fetch it; one that comes later resolves its refs again. Keep it
    /// above the object store's request timeout.
    #[arg(long, env = "NOVA_AUDITOR_COLLECT_GRACE_SECS", default_value_t = auditor_defaults::COLLECT_GRACE_SECS, help_heading = "Auditor")]
    pub auditor_collect_grace_secs: u64,

    /// Seconds absorbed flights wait before the auditor settles them, unless a window's worth
    /// (256) is waiting: settling in larger windows makes fewer, larger objects per stream.
    #[arg(long, env = "NOVA_AUDITOR_SETTLE_AFTER_SECS", default_value_t = auditor_defaults::SETTLE_AFTER_SECS, help_heading = "Auditor")]
    pub auditor_settle_after_secs: u64,

    /// Settled objects of one stream, one after another, that the rewrite merges into one
    /// without waiting for more (a run that reaches a merge's size limits, 32 MiB or 40
    /// sections, is merged whatever its length). Each record is rewritten at most once.
    #[arg(long, env = "NOVA_AUDITOR_REWRITE_MIN_OBJECTS", default_value_t = auditor_defaults::REWRITE_MIN_OBJECTS, value_parser = clap::value_parser!(u64).range(2..), help_heading = "Auditor")]
    pub auditor_rewrite_min_objects: u64,

    /// Seconds between passes of the sweep, which lists every settled object and queues any
    /// that nothing references (a write that landed after its intent was collected). One LIST
    /// per 1000 objects per pass, within --auditor-s3-budget.
    #[arg(long, env = "NOVA_AUDITOR_SWEEP_SECS", default_value_t = auditor_defaults::SWEEP_SECS, help_heading = "Auditor")]
    pub auditor_sweep_secs: u64,

    /// Milliseconds a duty with nothing due waits before it looks again (it asks only the
    /// metastore, never the object store, while nothing is due).
    #[arg(long, env = "NOVA_AUDITOR_IDLE_MS", default_value_t = auditor_defaults::IDLE_MS, help_heading = "Auditor")]
    pub auditor_idle_ms: u64,

    /// Print every setting as an example environment file (what ops/novad.env.example holds)
    /// and exit.
    #[arg(long, hide = true)]
    pub print_env_example: bool,
}

impl nova_server::process::ServerFlags for Config {
    const ENV_INTRO: &'static str = "Every novad setting as an environment variable (NOVA_ and the flag's name), with its\n\
         default: uncomment and change what you need. Load it with `set -a; . ./novad.env;\n\
         set +a`, or an EnvironmentFile= line in a systemd unit. Generated from the flags by\n\
         `novad --print-env-example` (scripts/env-examples); a test keeps it current.\n\
         \n\
         Object-store credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID and\n\
         AWS_SECRET_ACCESS_KEY, a profile, or instance metadata), not from these settings.";

    fn print_env_example(&self) -> bool {
        self.print_env_example
    }

    fn check(&self) -> Result<(), String> {
        Config::check(self)
    }
}

impl Config {
    /// What `--recycle-buffer-mib` keeps, in bytes (its default follows the admission buffer).
    pub fn recycle_buffer_bytes(&self) -> u64 {
        self.recycle_buffer_mib
            .unwrap_or_else(|| limits::recycle_buffer_mib(self.s3_memory_buffer_mib))
            * limits::MIB
    }

    pub fn chain(&self) -> ChainConfig {
        ChainConfig {
            star: self.star_id.clone(),
            admission_bytes: self.s3_memory_buffer_mib * limits::MIB,
            backlog_flights: self.s3_chain_backlog_flights,
            tail_cache_bytes: self.tail_window_cache_mib * limits::MIB,
            read_bytes: self.read_memory_mib * limits::MIB,
            flight_max_bytes: self.flight_max_bytes.bytes(),
            flight_linger: Duration::from_millis(self.flight_linger_ms),
            flight_max_inflight: self.flight_max_inflight,
            max_streams: self.max_streams as usize,
            retry: RetryPolicy {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(10),
            },
            metastore_slow_after: Duration::from_millis(500),
            clock: Clock::system(),
            entropy: Entropy::from_os(),
            // Opened (and probed) at start-up: `crate::express::open_zones`.
            express: None,
            metrics_top_streams: self.metrics_top_streams,
            leaders: None,
        }
    }

    pub fn caps(&self) -> AppendCaps {
        AppendCaps {
            max_batch_bytes: self.max_batch_bytes.bytes(),
            max_batch_records: self.max_batch_records,
            max_record_bytes: self.max_record_bytes.bytes(),
        }
    }

    /// The largest gRPC message novad decodes: the batch cap, the framing of as many records
    /// and headers as a batch may hold, and 1 MiB, so a batch a little over the cap still decodes
    /// and gets its clean INVALID_ARGUMENT while the session goes on; a larger message ends the
    /// session at the transport, before it is buffered.
    pub fn max_message_bytes(&self) -> usize {
        self.max_batch_bytes
            .bytes()
            .saturating_add(limits::WIRE_FRAMING_PER_RECORD * self.max_batch_records as u64)
            .saturating_add(limits::MIB)
            .min(u32::MAX as u64) as usize
    }

    /// The largest fragment a batch within the caps encodes to.
    pub fn largest_fragment(&self) -> u64 {
        nova_chain::admission::largest_fragment(
            self.max_batch_bytes.bytes(),
            self.max_batch_records,
        )
    }

    /// What the auditor's settle may hold in memory (a term of the memory formula).
    pub fn auditor_memory(&self) -> u64 {
        nova_auditor::working_memory(self.flight_max_bytes.bytes(), self.max_record_bytes.bytes())
    }

    pub fn auditor(&self) -> AuditorConfig {
        AuditorConfig {
            star: self.star_id.clone(),
            s3_budget: self.auditor_s3_budget,
            rewrite_mib: self.auditor_rewrite_mib,
            workers: self.auditor_workers,
            fetch_cache_bytes: self.auditor_fetch_cache_mib * limits::MIB,
            fetch_cache_dir: self.data_dir.join("fetch-cache"),
            whole_object_max: self.flight_max_bytes.bytes(),
            collect_grace: Duration::from_secs(self.auditor_collect_grace_secs),
            settle_after: Duration::from_secs(self.auditor_settle_after_secs),
            rewrite_min_objects: self.auditor_rewrite_min_objects as usize,
            sweep_every: Duration::from_secs(self.auditor_sweep_secs.max(1)),
            idle: Duration::from_millis(self.auditor_idle_ms.max(1)),
            clock: Clock::system(),
            entropy: Entropy::from_os(),
        }
    }

    /// Where redirects send clients for this star: https:// when it speaks TLS, so a client
    /// following a redirect never sends its token in plain text.
    pub fn advertise(&self) -> String {
        let scheme = if self.listener.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        match &self.advertise_addr {
            None => format!("{scheme}://{}", self.listen),
            Some(url) if url.contains("://") => url.clone(),
            // As `nova --server` takes it.
            Some(host_port) => format!("{scheme}://{host_port}"),
        }
    }

    /// Refuses an `--advertise-addr` that no client could follow a redirect to: a redirect to
    /// it would fail, after retries, with a transport error naming nothing.
    fn check_advertise(&self) -> Result<(), String> {
        let Some(given) = &self.advertise_addr else {
            // In a fleet, redirects name this star: an address that means "every interface"
            // names no host a client can reach (and a TLS client would check a certificate
            // against it).
            if self.metastore.starts_with("etcd://") && self.listen.ip().is_unspecified() {
                return Err(format!(
                    "--listen {} is every interface, not an address other stars and clients \
                     can reach: in a fleet, give --advertise-addr with this star's name (the \
                     one its certificate carries, with TLS), e.g. https://star-1.example:{}",
                    self.listen,
                    self.listen.port()
                ));
            }
            return Ok(());
        };
        let url = self.advertise();
        let refused = |why: &str| {
            Err(format!(
                "--advertise-addr {given:?} {why}: give the URL clients and the other stars reach \
                 this star at, as http://HOST:PORT, https://HOST:PORT or HOST:PORT"
            ))
        };
        let Ok(uri) = url.parse::<http::Uri>() else {
            return refused("is not a URL");
        };
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return refused("has a scheme other than http:// or https://");
        }
        if uri.host().is_none_or(str::is_empty) {
            return refused("names no host");
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return refused("has a path; gRPC needs the bare address");
        }
        Ok(())
    }

    /// Refuses settings that cannot work, naming the flag.
    pub fn check(&self) -> Result<(), String> {
        self.check_advertise()?;
        self.kafka.check()?;
        if self.grpc_stream_window_kib < 64 {
            return Err("--grpc-stream-window-kib must be at least 64 (the HTTP/2 floor)".into());
        }
        if self.max_producer_sessions == 0 || self.max_subscriptions == 0 {
            return Err(
                "--max-producer-sessions and --max-subscriptions must be at least 1".into(),
            );
        }
        if self.read_memory_mib == 0 {
            return Err("--read-memory-mib must be at least 1".into());
        }
        if self.s3_memory_buffer_mib == 0 || self.s3_chain_backlog_flights == 0 {
            return Err(
                "--s3-memory-buffer-mib and --s3-chain-backlog-flights must be at least 1".into(),
            );
        }
        if self.flight_max_inflight == 0 || self.flight_max_bytes == ByteSize(0) {
            return Err("--flight-max-inflight and --flight-max-bytes must be at least 1".into());
        }
        if self.max_read_records == 0 || self.max_batch_records == 0 {
            return Err("--max-read-records and --max-batch-records must be at least 1".into());
        }
        if !(self.saturation_threshold > 0.0 && self.saturation_threshold <= 1.0) {
            return Err("--saturation-threshold must be in (0, 1]".into());
        }
        if !(0.0..self.saturation_threshold).contains(&self.saturation_clear_margin) {
            return Err(
                "--saturation-clear-margin must be at least 0 and below the threshold".into(),
            );
        }
        if self.max_record_bytes.bytes() > u32::MAX as u64 / 2 {
            return Err(
                "--max-record-bytes must be under 2GiB (a record's length is 32 bits)".into(),
            );
        }
        if 2 * self.grpc_stream_window_kib as u64 * 1024 * self.max_producer_sessions as u64
            > (1 << 31) - 1
        {
            return Err(
                "--max-producer-sessions × --grpc-stream-window-kib must be at most 1GiB \
                 (twice it is the HTTP/2 connection window, which cannot exceed 2GiB)"
                    .into(),
            );
        }
        if self.auditor_s3_budget == 0 || self.auditor_rewrite_mib == 0 || self.auditor_workers == 0
        {
            return Err(
                "--auditor-s3-budget, --auditor-rewrite-mib and --auditor-workers must be at least \
                 1 (turn the auditor off with --auditor false)"
                    .into(),
            );
        }
        if self.auditor_collect_grace_secs == 0 {
            return Err(
                "--auditor-collect-grace-secs must be at least 1 (readers holding a ref need the \
                 time; keep it above the object store's request timeout)"
                    .into(),
            );
        }
        if !self.s3_express_zone.is_empty() {
            if self.s3_express_memory_buffer_mib == 0 {
                return Err("--s3-express-memory-buffer-mib must be at least 1".into());
            }
            if self.s3_express_publish_deadline.0.is_zero() {
                return Err("--s3-express-publish-deadline must be more than 0".into());
            }
            if self.s3_express_zone.len() > 9 {
                return Err("--s3-express-zone: at most 9 zones".into());
            }
        }
        if self.memory_ceiling == Some(ByteSize(0)) {
            return Err("--memory-ceiling must be more than 0".into());
        }
        nova_proto::validate::validate_stream_name(&self.star_id)
            .map_err(|e| format!("--star-id: {e}"))?;
        match nova_core::metastore::EtcdOptions::parse_url(&self.metastore) {
            Some(Err(problem)) => return Err(format!("--metastore: {problem}")),
            None if self.metastore != "embedded" => {
                return Err(format!(
                    "--metastore {:?}: expected `embedded` or etcd://HOST:PORT[,HOST:PORT…]",
                    self.metastore
                ));
            }
            _ => {}
        }
        if self.lease_ttl_secs < 3 {
            return Err("--lease-ttl-secs must be at least 3 (etcd's shortest lease)".into());
        }
        if self.metastore_max_txn_ops < 128 {
            return Err("--metastore-max-txn-ops must be at least 128".into());
        }
        if self.star_id.contains('/') {
            return Err("--star-id must not contain '/'".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn defaults_match_the_spec() {
        let config = Config::parse_from(["novad"]);
        assert_eq!(config.s3_memory_buffer_mib, 256);
        assert_eq!(config.s3_chain_backlog_flights, 1024);
        assert_eq!(config.tail_window_cache_mib, 128);
        assert_eq!(config.max_producer_sessions, 4096);
        assert_eq!(config.max_subscriptions, 16384);
        assert_eq!(config.grpc_stream_window_kib, 64);
        assert_eq!(config.max_batch_bytes, ByteSize(100 << 20));
        assert_eq!(config.max_batch_records, 65536);
        assert_eq!(config.max_record_bytes, ByteSize(1 << 20));
        assert_eq!(config.max_read_bytes, ByteSize(8 << 20));
        assert_eq!(config.max_read_records, 8192);
        // The auditor's, as the spec gives them: 50 requests a second, 64 MiB a second
        // assembled, 2 jobs at once, a 40 GiB fetch cache.
        assert!(config.auditor);
        assert_eq!(config.auditor_s3_budget, 50);
        assert_eq!(config.auditor_rewrite_mib, 64);
        assert_eq!(config.auditor_workers, 2);
        assert_eq!(config.auditor_fetch_cache_mib, 40_960);
        assert!(config.check().is_ok());
        Config::command().debug_assert();
    }

    /// A bare `HOST:PORT` (how `nova --server` is given) is advertised as a URL; anything no
    /// client could follow a redirect to is refused at start-up, naming the flag. Before,
    /// `127.0.0.1:7401` was accepted and every redirect to the star failed.
    #[test]
    fn advertise_addresses_are_urls_or_refused() {
        let advertised = |args: &[&str]| {
            let mut argv = vec!["novad"];
            argv.extend_from_slice(args);
            let config = Config::parse_from(argv);
            config.check().map(|()| config.advertise())
        };
        assert_eq!(
            advertised(&["--advertise-addr", "127.0.0.1:7401"]),
            Ok("http://127.0.0.1:7401".into())
        );
        assert_eq!(
            advertised(&["--advertise-addr", "https://star-1.internal:7400"]),
            Ok("https://star-1.internal:7400".into())
        );
        assert_eq!(
            advertised(&["--listen", "127.0.0.1:7402"]),
            Ok("http://127.0.0.1:7402".to_owned())
        );
        // A fleet star listening on every interface must say where it is reached.
        let refused =
            advertised(&["--listen", "0.0.0.0:7400", "--metastore", "etcd://e:2379"]).unwrap_err();
        assert!(refused.contains("--advertise-addr"), "{refused}");
        // A single star redirects nobody.
        assert!(advertised(&["--listen", "0.0.0.0:7400"]).is_ok());
        for bad in [
            "ftp://h:1",
            "http://:7400",
            "http://h:1/nova",
            "star one:7400",
        ] {
            let refused = advertised(&["--advertise-addr", bad]).unwrap_err();
            assert!(refused.contains("--advertise-addr"), "{bad}: {refused}");
        }
    }

    /// `novad -h` and `--help` print each flag's description under it, in every section (clap
    /// chose a layout per section before, so the security flags read differently).
    #[test]
    fn help_has_one_layout_throughout() {
        for help in [
            Config::command().render_help().to_string(),
            Config::command().render_long_help().to_string(),
        ] {
            assert_eq!(
                nova_testkit::help::flag_lines_with_help(&help),
                Vec::<&str>::new()
            );
        }
    }

    #[test]
    fn help_names_every_budget() {
        let help = Config::command().render_long_help().to_string();
        for flag in [
            "--s3-memory-buffer-mib",
            "--s3-chain-backlog-flights",
            "--tail-window-cache-mib",
            "--max-producer-sessions",
            "--max-subscriptions",
            "--grpc-stream-window-kib",
            "--max-batch-bytes",
            "--max-batch-records",
            "--max-record-bytes",
            "--max-read-bytes",
            "--max-read-records",
            "--flight-max-bytes",
            "--flight-linger-ms",
            "--memory-ceiling",
            "--saturation-threshold",
            "--metastore",
            "--metastore-max-txn-ops",
            "--star-id",
            "--advertise-addr",
            "--lease-ttl-secs",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help");
        }
        assert!(
            help.contains("NOVA_S3_MEMORY_BUFFER_MIB"),
            "env names are shown"
        );
    }

    fn docs(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The docs' tables of flags and defaults say what `novad --help` says: every flag a table
    /// names exists with the default the table gives, and every budget is in the table.
    #[test]
    fn the_budget_docs_match_the_flags() {
        let command = Config::command();
        let budgets = docs("docs/budgets.md");
        let mut documented = Vec::new();
        for line in budgets.lines().filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let Some(flag_cell) = cells.iter().position(|c| c.starts_with("`--")) else {
                continue;
            };
            let flag = cells[flag_cell].trim_matches('`').trim_start_matches("--");
            let Some(arg) = command.get_arguments().find(|a| a.get_long() == Some(flag)) else {
                panic!("docs/budgets.md names --{flag}, which novad does not have");
            };
            let default: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if let [default] = default.as_slice() {
                assert_eq!(
                    cells[flag_cell + 1],
                    default,
                    "docs/budgets.md gives --{flag} a default --help does not"
                );
            }
            documented.push(flag.to_owned());
        }
        for arg in command.get_arguments() {
            if arg.get_help_heading() == Some("Budgets") {
                let flag = arg.get_long().unwrap_or_default();
                assert!(
                    documented.iter().any(|d| d == flag),
                    "budget --{flag} is missing from docs/budgets.md"
                );
            }
        }
    }

    /// The example environment file is what the flags make of it now: every setting novad
    /// reads from the environment, with its help and default.
    #[test]
    fn the_example_env_file_is_generated_from_the_flags() {
        let example = docs("ops/novad.env.example");
        nova_server::envdoc::check_current(
            "ops/novad.env.example",
            &example,
            &<Config as nova_server::process::ServerFlags>::env_example(),
            "scripts/env-examples",
        );
        for arg in Config::command().get_arguments() {
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(example.contains(&format!("# {env}=")), "{env}");
            }
        }
    }
}
