//! Every default bound in one place. The binaries turn each of these into a flag; the docs in
//! `docs/budgets.md` say what each one bounds and what happens at its limit.

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

/// `--s3-memory-buffer-mib`: bytes of appends retained from decode to resolution.
pub const ADMISSION_BUFFER_MIB: u64 = 256;
/// `--s3-chain-backlog-flights`: flights acknowledged but not yet absorbed.
pub const CHAIN_BACKLOG_FLIGHTS: u32 = 1024;
/// `--tail-window-cache-mib`: acknowledged payloads kept in memory for hot reads.
pub const TAIL_WINDOW_CACHE_MIB: u64 = 128;
/// `--recycle-buffer-mib` when not given: this share of the admission buffer (64 MiB at the
/// default 256) of append buffers whose records have left memory, kept (already resident) for
/// the next appends of their size.
pub const RECYCLE_BUFFER_SHARE: u64 = 4;

/// The default `--recycle-buffer-mib` for an admission buffer of `admission_mib`.
pub fn recycle_buffer_mib(admission_mib: u64) -> u64 {
    admission_mib / RECYCLE_BUFFER_SHARE
}
/// `--max-producer-sessions`: concurrent producer sessions per star.
pub const MAX_PRODUCER_SESSIONS: u32 = 4096;
/// `--max-subscriptions`: reads in progress at once, every read counted (those waiting at a
/// stream's tail for new records included).
pub const MAX_SUBSCRIPTIONS: u32 = 16_384;
/// `--max-streams`: streams a star holds. Each costs about 1 KiB of fixed memory (its entry in
/// the registry and two metric series), so the default adds at most ~10 MiB to the overhead.
pub const MAX_STREAMS: u32 = 10_000;

/// gRPC connections open at once per listener. Clients multiplex every session and read over
/// one connection each, so this is a count of clients; each connection costs a few tens of KiB
/// of HTTP/2 and TLS state (docs/security.md), which at the cap stays well under the budgets.
pub const MAX_CONNECTIONS: u32 = 4096;

/// HTTP/2 streams (calls) open at once on one connection: enough for a client multiplexing a
/// thousand producer sessions and reads, few enough that one connection cannot make the
/// server keep state for a flood of streams.
pub const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Bytes of request headers one call may send: gRPC metadata is a few hundred bytes, a bearer
/// token under a KiB.
pub const MAX_HEADER_LIST_BYTES: u64 = 16 << 10;

/// Streams exported with metric series of their own: the busiest, by appended bytes.
pub const METRICS_TOP_STREAMS: usize = 100;
/// The longest a read may wait at the tail (`wait_ms` is capped to it).
pub const MAX_READ_WAIT_MS: u64 = 60_000;
/// `--read-memory-mib`: bytes reads hold at once beyond the tail window cache: fetched
/// sections, the page built from them and its encoded response. A default read (8 MiB page)
/// holds at most about 18 MiB, so 64 MiB serves three such reads in full at once and many
/// smaller ones; a read that finds the budget spent returns a short page (never empty).
pub const READ_MEMORY_MIB: u64 = 64;
/// `--grpc-stream-window-kib`: the HTTP/2 per-stream receive window (the protocol floor).
pub const GRPC_STREAM_WINDOW_KIB: u32 = 64;
/// `--max-batch-bytes`: content bytes of one append batch.
pub const MAX_BATCH_BYTES: u64 = 100 * MIB;
/// `--max-batch-records`: records in one append batch.
pub const MAX_BATCH_RECORDS: u32 = 65_536;
/// `--max-record-bytes`: content bytes of one record (body plus header names and values).
pub const MAX_RECORD_BYTES: u64 = MIB;
/// The most protobuf framing a record of an append request can carry on the wire: its field
/// tag and length (6 bytes), its body's (6), its timestamp (11), and a header's worth of
/// framing (18), since a batch may hold as many headers as records.
pub const WIRE_FRAMING_PER_RECORD: u64 = 41;
/// `--max-read-bytes`: content bytes in one read response.
pub const MAX_READ_BYTES: u64 = 8 * MIB;
/// `--max-read-records`: records in one read response.
pub const MAX_READ_RECORDS: u32 = 8192;

/// `--flight-max-bytes`: a flight closes once its sections reach this size. 8 MiB keeps S3
/// request cost at 128 PUTs per GiB while a single PUT still completes in tens of milliseconds.
pub const FLIGHT_MAX_BYTES: u64 = 8 * MIB;
/// `--flight-linger-ms`: an open flight closes this long after its first batch arrived (twice
/// as long if it is half full by then), so a lightly loaded star adds at most this much to ack
/// latency and issues at most 20 PUTs per second.
pub const FLIGHT_LINGER_MS: u64 = 50;
/// The largest section a flight holds for one stream (unless a single record is larger): a
/// stream's records beyond it start another section. Each section is one ref for readers, so a
/// read with 8 GETs running has at most 8 MiB on its way (what has landed and waits to be
/// consumed is charged to the read's budget, and bounded by its page).
pub const MAX_SECTION_BYTES: u64 = MIB;
/// GETs a cold read keeps running (the next starts as any of them lands).
pub const COLD_READ_REFS: usize = 8;
/// The most sections a cold read plans for one page (or, on the star, one stretch of a page
/// between tail-cached records): enough for an 8 MiB page of sections of 256 KiB or more, four
/// windows of `COLD_READ_REFS`, so GETs keep starting instead of draining every 8.
pub const PAGE_REFS: usize = 32;
/// The most refs one `ResolveRefs` answers with.
pub const MAX_RESOLVED_REFS: usize = 64;
/// `--saturation-threshold`: the formula's share of the ceiling at which a star reads saturated.
pub const SATURATION_THRESHOLD: f64 = 0.9;
/// `--saturation-clear-margin`: how far below the threshold saturation must fall to clear.
pub const SATURATION_CLEAR_MARGIN: f64 = 0.1;
/// `--shutdown-timeout-secs`: how long SIGTERM waits for admitted work to land.
pub const SHUTDOWN_TIMEOUT_SECS: u64 = 30;
/// `--flight-max-inflight`: flights being written to the object store at once.
pub const FLIGHT_MAX_INFLIGHT: u32 = 8;

/// Appends a session may have admitted but not yet answered. Past it the session stops reading
/// frames until the oldest is answered, so one session's pipeline depth is bounded even when
/// its producer never reads an ack. 128 answers waiting keep a session within its place's
/// stated 64 KiB (measured by `novad/tests/hostile.rs`: 256 did not); at 100 ms to durability
/// it still lets one session carry 1,280 batches a second, and a producer that needs more
/// sends larger batches or opens more sessions.
pub const SESSION_PIPELINE_DEPTH: usize = 128;

/// Request messages of calls other than `Append` in arrival at once, for a whole server
/// (`net::small`): part of its fixed overhead.
pub const REQUEST_MESSAGES_BUDGET: u64 = 8 * MIB;

/// The shed label of a request message refused because that budget (or its token's share of
/// it) is full.
pub const REQUEST_BODIES_SHED: &str = "request_bodies";

/// Refusals a session may have waiting to be read, of its `SESSION_PIPELINE_DEPTH`: each holds
/// an error message, and costs the producer nothing to cause.
pub const QUEUED_REFUSALS: usize = 32;

/// Streams in one `ListStreams` page when the request asks for none, and the most it may ask for.
pub const LIST_STREAMS_DEFAULT: u32 = 100;
pub const LIST_STREAMS_MAX: u32 = 1000;

/// Longest stream name, in bytes.
pub const MAX_STREAM_NAME_BYTES: usize = 512;

/// Retry hint sent with a shed session open.
pub const SESSION_SHED_RETRY_AFTER_MS: u64 = 1000;

/// `--s3-express-memory-buffer-mib`: Express bytes from admission until the Standard store
/// holds them.
pub const EXPRESS_BUFFER_MIB: u64 = 32;

/// `--s3-express-linger-ms`: how long an express bundle waits for more batches.
pub const EXPRESS_LINGER_MS: u64 = 5;

/// How many times one read resolves its records again after finding an object gone, on the star
/// and on a gateway. Each time means the auditor moved the records and collected the old object
/// in between; more than a few in one read means something else deleted it.
pub const STALE_REF_RETRIES: u32 = 3;

/// The most partitions a Kafka topic may have (CreateTopics, auto-creation): each is a stream.
pub const KAFKA_MAX_PARTITIONS: u32 = 4096;

/// Kafka requests (other than Produce) up to this size are read into the connection's own
/// buffer, uncharged: with what they decode to (at most `KAFKA_DECODED_PER_WIRE_BYTE` times
/// their size) it is the per-connection state `--max-connections` bounds, as HTTP/2's is.
/// Larger ones, and every produce request, are charged to the admission buffer from their
/// length prefix.
pub const KAFKA_SMALL_REQUEST_BYTES: u64 = 4 * KIB;

/// How much larger than its wire form a decoded Kafka request other than Produce can be (a
/// flexible version's tagged fields decode to a map entry per few bytes); such a request over
/// `KAFKA_SMALL_REQUEST_BYTES` is charged this many times its size.
pub const KAFKA_DECODED_PER_WIRE_BYTE: u64 = 24;

/// The largest Kafka request other than Produce (Metadata, Fetch, topic administration) a
/// star reads; a larger one closes its connection, as a Kafka broker's
/// socket.request.max.bytes does.
pub const KAFKA_MAX_CONTROL_REQUEST_BYTES: u64 = MIB;

/// Kafka requests one connection may have read and not yet answered: produce requests charged
/// and sent on to the packer, fetches waiting their turn. Each holds its charge; past this the
/// connection stops reading until its client takes answers.
pub const KAFKA_PIPELINE_DEPTH: usize = 16;

/// Kafka consumer groups a star coordinates at once; a join that would make one more is
/// refused with COORDINATOR_NOT_AVAILABLE (retriable).
pub const KAFKA_MAX_GROUPS: usize = 1024;

/// Members of one Kafka consumer group; past it a join is refused with GROUP_MAX_SIZE_REACHED.
pub const KAFKA_MAX_GROUP_MEMBERS: usize = 256;

/// The most a member's protocol metadata, or its assignment, may hold.
pub const KAFKA_MAX_MEMBER_METADATA_BYTES: u64 = 64 * KIB;

/// What all consumer groups' members may hold in all (metadata, assignments, names); a join
/// past it is refused with COORDINATOR_NOT_AVAILABLE (retriable).
pub const KAFKA_GROUP_MEMORY_BYTES: u64 = 64 * MIB;

/// The most partitions one Metadata answer lists when a client asks for every topic.
pub const KAFKA_MAX_LISTED_PARTITIONS: u32 = 10_000;

/// Batches an idempotent Kafka producer's retry is recognised among, per partition: Kafka's
/// own five (a producer has at most five requests in flight per connection).
pub const KAFKA_PRODUCER_BATCHES: usize = 5;

/// Records of a partition read for an idempotent producer's marks when a star has no state
/// for it there (after a restart or takeover, or once forgotten): as many as the largest batch
/// holds by default, so the batch a producer is retrying is within them.
pub const KAFKA_PRODUCER_SCAN_RECORDS: u64 = 65_536;

/// Idempotent producers' states (one per producer and partition) a star keeps; past it the
/// least recently made is forgotten, and read back from the partition when it next writes.
pub const KAFKA_PRODUCER_STATES: usize = 10_000;
