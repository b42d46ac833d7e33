//! The relay floor: the least a process can do to relay Nova's appends into the object store on
//! this machine, for measuring the star against.
//!
//! It speaks the star's gRPC append sessions (the same messages, the same HTTP/2 windows, so
//! `nova bench` drives it unchanged; tonic assembles each message and the star's own decoder,
//! `WireAppend`, reads it), copies each message into a recycled buffer as the star does (so
//! neither pays page faults for fresh memory), and PUTs the messages of many sessions
//! together, as they are, in objects of `--object-bytes`, `--concurrency` at a time, answering
//! each request once the object holding it is written. It does no admission, no framing, no
//! checksums, no index and no metastore, and it bounds nothing: what it costs is receiving the
//! bytes and sending them on.
//!
//! With `--star`, it is also a read floor: the gateway's fetch plan without the gateway's
//! per-read work. At start it asks the star for each stream's id (`--streams` streams named
//! `--stream-prefix`-0, -1, ...), then reads every flight's footer, as the raw ranged-GET client
//! does (before any reader times it). It answers each Read with the stream's sections from the
//! request's first record on, planned as the gateway plans a page (whole sections until they
//! hold the page's 8 MiB) and fetched with ranged GETs `--read-window` in flight (eight, as the
//! gateway keeps), each checked against its crc32c, decoded and sent as one page. It asks the
//! star nothing per read and has no cache, no budget and no read-ahead. So it measures what
//! that plan itself costs against independent GETs, apart from the gateway's own work.
//!
//! relay --endpoint URL --bucket NAME --listen ADDR [--object-bytes 8MiB] [--concurrency 8]
//!       [--linger-ms 50] [--window-kib 64]
//!       [--star URL --streams N [--stream-prefix bench] [--read-window 8] [--cursor-sections 0]]

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::{Stream, StreamExt};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use nova_core::flight::page::PageBuilder;
use nova_core::flight::{ObjectFooter, SectionEntry, fetch_footer, fetch_section};
use nova_core::limits::{COLD_READ_REFS, MAX_READ_BYTES, MAX_READ_RECORDS};
use nova_core::object_store::{ObjectStore, PutPayload, S3Config, S3Store};
use nova_proto::RequestError;
use nova_proto::server::nova_server::{Nova, NovaServer};
use nova_proto::units::parse_bytes;
use nova_proto::v1;
use nova_proto::validate::read_caps;
use nova_proto::wire::WireAppend;
use nova_server::net::recycle::{RecycleMetrics, Recycler};
use prometheus::Registry;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn number(name: &str, default: u64) -> Result<u64, String> {
    arg(name).map_or(Ok(default), |v| {
        v.parse().map_err(|_| format!("{name} takes a number"))
    })
}

/// Whether a request's object was written.
type Written = Result<(), String>;

/// Bodies waiting for their object, and who waits on it.
#[derive(Default)]
struct Pending {
    parts: Vec<Bytes>,
    bytes: u64,
    waiters: Vec<oneshot::Sender<Written>>,
    since: Option<Instant>,
}

struct Relay {
    store: Arc<S3Store>,
    pending: Mutex<Pending>,
    writers: Arc<Semaphore>,
    object_bytes: u64,
    next_key: AtomicU64,
    recycler: Recycler,
}

impl Relay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one request; PUTs the object once it is full, waiting for a writer first (so a
    /// relay whose writers are all busy stops reading, as the transport pushes back).
    async fn add(self: &Arc<Self>, message: Bytes, waiter: oneshot::Sender<Written>) {
        let full = {
            let mut pending = self.lock();
            pending.bytes += message.len() as u64;
            pending.parts.push(message);
            pending.waiters.push(waiter);
            pending.since.get_or_insert_with(Instant::now);
            (pending.bytes >= self.object_bytes).then(|| std::mem::take(&mut *pending))
        };
        if let Some(object) = full {
            self.put(object).await;
        }
    }

    /// PUTs what waits once it has waited `linger`, so a slow trickle is written too.
    async fn linger(self: Arc<Self>, linger: Duration) {
        let mut ticker = tokio::time::interval(linger / 5);
        loop {
            ticker.tick().await;
            let due = {
                let mut pending = self.lock();
                let due = pending.since.is_some_and(|since| since.elapsed() >= linger);
                due.then(|| std::mem::take(&mut *pending))
            };
            if let Some(object) = due {
                self.put(object).await;
            }
        }
    }

    async fn put(self: &Arc<Self>, object: Pending) {
        let Ok(permit) = self.writers.clone().acquire_owned().await else {
            return;
        };
        let relay = self.clone();
        tokio::spawn(async move {
            let key = format!(
                "relay/{:020}",
                relay.next_key.fetch_add(1, Ordering::Relaxed)
            );
            let written = relay
                .store
                .put_if_absent(&key, PutPayload::from_parts(object.parts))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
            drop(permit);
            for waiter in object.waiters {
                let _ = waiter.send(written.clone());
            }
        });
    }
}

/// One section of a stream: which object holds it, and where.
struct Section {
    key: String,
    entry: SectionEntry,
}

/// The read floor's index: every stream's sections, in order, read once at start.
struct ReadFloor {
    store: Arc<S3Store>,
    streams: HashMap<String, Arc<[Section]>>,
    /// Sections in flight per read (`--read-window`, default the gateway's eight).
    window: usize,
    /// With `--cursor-sections N` above 0, each stream's reads keep fetching across pages:
    /// the sections after a page are fetched while it is sent, up to N of them waiting.
    cursor_sections: usize,
    cursors: Mutex<HashMap<String, Cursor>>,
}

/// A section's records as fetched.
struct Fetched {
    start_seq: u64,
    end_seq: u64,
    bytes: Bytes,
}

/// A stream read on across pages: a task fetching its sections in order, `window` in flight,
/// into a channel of `--cursor-sections` places; and the section the last page stopped inside.
struct Cursor {
    next_seq: u64,
    pending: Option<Fetched>,
    sections: mpsc::Receiver<Result<Fetched, RequestError>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Cursor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReadFloor {
    /// Learns each stream's id from the star, then every flight's sections from its footer.
    async fn load(
        store: Arc<S3Store>,
        star: String,
        names: Vec<String>,
        window: usize,
        cursor_sections: usize,
    ) -> Result<Self, String> {
        let mut client = v1::nova_client::NovaClient::connect(star)
            .await
            .map_err(|e| format!("cannot reach the star: {e}"))?;
        let mut ids = HashMap::new();
        for name in names {
            let refs = client
                .resolve_refs(v1::ResolveRefsRequest {
                    stream: name.clone(),
                    start_seq: 0,
                    max_refs: 1,
                    start_timestamp: None,
                })
                .await
                .map_err(|e| format!("refs of {name}: {e}"))?
                .into_inner();
            let first = refs
                .refs
                .first()
                .ok_or_else(|| format!("{name} has no records in the object store"))?;
            ids.insert(first.stream_id, name);
        }
        let mut streams: HashMap<String, Vec<Section>> = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let listed = store
                .list("chain/", after.as_deref(), 1000)
                .await
                .map_err(|e| e.to_string())?;
            for object in listed.objects {
                let footer = match fetch_footer(store.as_ref(), &object.key).await {
                    Ok(ObjectFooter::Flight(footer)) => footer,
                    // A fence holds no records.
                    Ok(ObjectFooter::Fence(_)) => continue,
                    Err(e) => return Err(format!("the footer of {}: {e}", object.key)),
                };
                for entry in footer.sections {
                    if let Some(name) = ids.get(&entry.stream_id) {
                        streams.entry(name.clone()).or_default().push(Section {
                            key: object.key.clone(),
                            entry,
                        });
                    }
                }
            }
            match listed.next_start_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        // Every stream whole from its first record: a gap or an overlap would serve records
        // under the wrong sequence numbers.
        for (name, sections) in streams.iter_mut() {
            sections.sort_by_key(|s| s.entry.start_seq);
            if let Some(pair) = sections
                .windows(2)
                .find(|pair| pair[0].entry.end_seq != pair[1].entry.start_seq)
            {
                return Err(format!(
                    "{name}'s sections are not contiguous: {} ends at {}, {} starts at {}",
                    pair[0].key, pair[0].entry.end_seq, pair[1].key, pair[1].entry.start_seq
                ));
            }
        }
        Ok(Self {
            store,
            streams: streams
                .into_iter()
                .map(|(name, sections)| (name, sections.into()))
                .collect(),
            window: window.max(1),
            cursor_sections,
            cursors: Mutex::default(),
        })
    }

    /// A page of `request`'s stream from its first record: the sections that fill it, eight
    /// in flight.
    async fn read(&self, request: v1::ReadRequest) -> Result<v1::ReadResponse, RequestError> {
        let sections = self
            .streams
            .get(&request.stream)
            .ok_or_else(|| RequestError::StreamNotFound(request.stream.clone()))?;
        if request.start_timestamp.is_some() || request.wait_ms > 0 {
            return Err(RequestError::InvalidRequest(
                "the read floor reads by sequence number only, and never waits at the tail".into(),
            ));
        }
        let (max_records, max_bytes) = read_caps(&request, MAX_READ_RECORDS, MAX_READ_BYTES);
        let tail = sections.last().map_or(0, |s| s.entry.end_seq);
        let first = sections.partition_point(|s| s.entry.end_seq <= request.start_seq);
        if sections
            .get(first)
            .is_some_and(|s| s.entry.start_seq > request.start_seq)
        {
            return Err(RequestError::InvalidRequest(format!(
                "{:?} holds no records before {} in the object store",
                request.stream, sections[first].entry.start_seq
            )));
        }
        let mut page = PageBuilder::new(
            request.start_seq,
            tail,
            max_records.max(1) as usize,
            max_bytes,
        );
        if self.cursor_sections > 0 {
            return self.read_on(request, sections, first, tail).await;
        }
        let fetch = |section| fetch_one(self.store.as_ref(), section);
        // As the gateway plans a page: whole sections until they hold the page's bytes.
        let mut planned = 0;
        let mut later = sections[first..].iter().take_while(|s| {
            let more = planned < max_bytes;
            planned = planned.saturating_add(s.entry.len);
            more
        });
        let mut in_flight: FuturesOrdered<_> =
            later.by_ref().take(self.window).map(fetch).collect();
        while let Some(fetched) = in_flight.next().await {
            if page.full() {
                break;
            }
            let fetched = fetched?;
            page.take_from(fetched.start_seq, fetched.bytes)
                .map_err(|e| RequestError::DataLoss(e.to_string()))?;
            if let Some(next) = later.next() {
                in_flight.push_back(fetch(next));
            }
        }
        Ok(v1::ReadResponse {
            records: page.records.into_iter().map(Into::into).collect(),
            next_seq: page.next_seq,
            tail_seq: tail,
        })
    }
}

impl ReadFloor {
    /// A page from the stream's cursor: the one left at the request's first record, or a new
    /// one started there.
    async fn read_on(
        &self,
        request: v1::ReadRequest,
        sections: &Arc<[Section]>,
        first: usize,
        tail: u64,
    ) -> Result<v1::ReadResponse, RequestError> {
        let (max_records, max_bytes) = read_caps(&request, MAX_READ_RECORDS, MAX_READ_BYTES);
        let left = self
            .cursors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&request.stream)
            .filter(|cursor| cursor.next_seq == request.start_seq);
        let mut cursor = match left {
            Some(cursor) => cursor,
            None => self.open(sections.clone(), first, request.start_seq),
        };
        let mut page = PageBuilder::new(
            request.start_seq,
            tail,
            max_records.max(1) as usize,
            max_bytes,
        );
        let mut next = cursor.pending.take();
        while !page.full() {
            let fetched = match next.take() {
                Some(fetched) => fetched,
                None => match cursor.sections.recv().await {
                    Some(fetched) => fetched?,
                    None => break,
                },
            };
            page.take_from(fetched.start_seq, fetched.bytes.clone())
                .map_err(|e| RequestError::DataLoss(e.to_string()))?;
            if page.next_seq < fetched.end_seq {
                cursor.pending = Some(fetched);
            }
        }
        cursor.next_seq = page.next_seq;
        if cursor.next_seq < tail {
            self.cursors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(request.stream.clone(), cursor);
        }
        Ok(v1::ReadResponse {
            records: page.records.into_iter().map(Into::into).collect(),
            next_seq: page.next_seq,
            tail_seq: tail,
        })
    }

    /// Starts fetching `sections` from `first` on, `window` in flight, for a cursor at `seq`.
    fn open(&self, sections: Arc<[Section]>, first: usize, seq: u64) -> Cursor {
        let (sender, receiver) = mpsc::channel(self.cursor_sections);
        let store = self.store.clone();
        let window = self.window;
        let task = tokio::spawn(async move {
            let mut later = sections[first..].iter();
            let mut in_flight: FuturesOrdered<_> = later
                .by_ref()
                .take(window)
                .map(|s| fetch_one(&store, s))
                .collect();
            while let Some(fetched) = in_flight.next().await {
                if sender.send(fetched).await.is_err() {
                    return;
                }
                if let Some(section) = later.next() {
                    in_flight.push_back(fetch_one(&store, section));
                }
            }
        });
        Cursor {
            next_seq: seq,
            pending: None,
            sections: receiver,
            task,
        }
    }
}

/// One section's bytes, checked against its crc32c.
async fn fetch_one(store: &S3Store, section: &Section) -> Result<Fetched, RequestError> {
    let entry = &section.entry;
    fetch_section(store, &section.key, entry.offset, entry.len, entry.crc32c)
        .await
        .map(|bytes| Fetched {
            start_seq: entry.start_seq,
            end_seq: entry.end_seq,
            bytes,
        })
        .map_err(RequestError::from)
}

#[derive(Clone)]
struct Service(Arc<Relay>, Option<Arc<ReadFloor>>);

type Acks = Pin<Box<dyn Stream<Item = Result<v1::AppendAck, Status>> + Send>>;

/// Requests a session may have read but not yet answered.
const SESSION_PIPELINE: usize = 256;

fn only_appends() -> Status {
    Status::from(RequestError::Unimplemented(
        "the relay floor only takes appends (and reads, when started with --star)".into(),
    ))
}

fn info(name: String) -> Option<v1::StreamInfo> {
    Some(v1::StreamInfo {
        name,
        ..Default::default()
    })
}

#[tonic::async_trait]
impl Nova for Service {
    type AppendStream = Acks;

    async fn append(
        &self,
        request: Request<Streaming<WireAppend>>,
    ) -> Result<Response<Acks>, Status> {
        let mut inbound = request.into_inner();
        let (order, mut owed) =
            mpsc::channel::<(u64, oneshot::Receiver<Written>)>(SESSION_PIPELINE);
        let relay = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = inbound.next().await {
                // Copied out into a recycled buffer, as the star copies each message once into
                // one: the received message is dropped at once, so tonic reuses its buffer
                // instead of mapping fresh pages for every message.
                let mut copy = relay.recycler.buffer(message.wire_len() as usize);
                copy.extend_from_slice(&message.message());
                let records = message.record_count();
                drop(message);
                let (waiter, written) = oneshot::channel();
                relay.add(copy.freeze(), waiter).await;
                if order.send((records, written)).await.is_err() {
                    return;
                }
            }
        });
        // Answers in request order, each once its object is written.
        let (answer, acks) = mpsc::channel(SESSION_PIPELINE);
        tokio::spawn(async move {
            let mut seq = 0;
            while let Some((records, written)) = owed.recv().await {
                let ack = match written.await {
                    Ok(Ok(())) => Ok(v1::AppendAck {
                        start_seq: seq,
                        end_seq: seq + records,
                        error: None,
                    }),
                    Ok(Err(error)) => Err(Status::from(RequestError::OutcomeUnknown(error))),
                    Err(_) => Err(Status::from(RequestError::OutcomeUnknown(
                        "the relay stopped".into(),
                    ))),
                };
                seq += records;
                let failed = ack.is_err();
                if answer.send(ack).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(acks))))
    }

    async fn read(
        &self,
        request: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        let floor = self.1.as_ref().ok_or_else(only_appends)?;
        Ok(Response::new(floor.read(request.into_inner()).await?))
    }

    async fn resolve_refs(
        &self,
        _: Request<v1::ResolveRefsRequest>,
    ) -> Result<Response<v1::ResolveRefsResponse>, Status> {
        Err(only_appends())
    }

    async fn create_stream(
        &self,
        request: Request<v1::CreateStreamRequest>,
    ) -> Result<Response<v1::CreateStreamResponse>, Status> {
        Ok(Response::new(v1::CreateStreamResponse {
            info: info(request.into_inner().stream),
        }))
    }

    async fn describe_stream(
        &self,
        request: Request<v1::DescribeStreamRequest>,
    ) -> Result<Response<v1::DescribeStreamResponse>, Status> {
        Ok(Response::new(v1::DescribeStreamResponse {
            info: info(request.into_inner().stream),
        }))
    }

    async fn list_streams(
        &self,
        _: Request<v1::ListStreamsRequest>,
    ) -> Result<Response<v1::ListStreamsResponse>, Status> {
        Ok(Response::new(v1::ListStreamsResponse::default()))
    }

    async fn delete_stream(
        &self,
        _: Request<v1::DeleteStreamRequest>,
    ) -> Result<Response<v1::DeleteStreamResponse>, Status> {
        Ok(Response::new(v1::DeleteStreamResponse {}))
    }

    async fn reconfigure_stream(
        &self,
        _: Request<v1::ReconfigureStreamRequest>,
    ) -> Result<Response<v1::ReconfigureStreamResponse>, Status> {
        Err(only_appends())
    }

    async fn get_server_info(
        &self,
        _: Request<v1::GetServerInfoRequest>,
    ) -> Result<Response<v1::GetServerInfoResponse>, Status> {
        Ok(Response::new(v1::GetServerInfoResponse::default()))
    }

    async fn list_groups(
        &self,
        _: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        Err(only_appends())
    }

    async fn describe_group(
        &self,
        _: Request<v1::DescribeGroupRequest>,
    ) -> Result<Response<v1::DescribeGroupResponse>, Status> {
        Err(only_appends())
    }
}

fn main() -> Result<(), String> {
    let endpoint = arg("--endpoint").ok_or("--endpoint is required")?;
    let bucket = arg("--bucket").ok_or("--bucket is required")?;
    let listen: std::net::SocketAddr = arg("--listen")
        .ok_or("--listen is required")?
        .parse()
        .map_err(|_| "--listen takes HOST:PORT")?;
    let object_bytes = parse_bytes(&arg("--object-bytes").unwrap_or_else(|| "8MiB".into()))?;
    let concurrency = number("--concurrency", 8)? as usize;
    let linger = Duration::from_millis(number("--linger-ms", 50)?.max(5));
    let window = (number("--window-kib", 64)? * 1024) as u32;
    let star = arg("--star");
    let prefix = arg("--stream-prefix").unwrap_or_else(|| "bench".into());
    let names: Vec<String> = (0..number("--streams", 0)?)
        .map(|n| format!("{prefix}-{n}"))
        .collect();
    let read_window = number("--read-window", COLD_READ_REFS as u64)? as usize;
    let cursor_sections = number("--cursor-sections", 0)? as usize;
    if star.is_some() && names.is_empty() {
        return Err("--star needs --streams: the streams to serve reads of".into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let mut config = S3Config::new(&bucket);
        config.endpoint = Some(endpoint);
        config.force_path_style = true;
        config.limits.write_concurrency = concurrency;
        let store = Arc::new(S3Store::new(config).await);
        let _ = store.client().create_bucket().bucket(&bucket).send().await;
        let floor = match star {
            Some(star) => Some(Arc::new(
                ReadFloor::load(store.clone(), star, names, read_window, cursor_sections).await?,
            )),
            None => None,
        };
        let relay = Arc::new(Relay {
            store,
            pending: Mutex::default(),
            writers: Arc::new(Semaphore::new(concurrency.max(1))),
            object_bytes,
            next_key: AtomicU64::new(0),
            // As much as a star keeps by default (a quarter of its 256 MiB admission buffer).
            recycler: Recycler::new(64 << 20, RecycleMetrics::register(&Registry::new())),
        });
        tokio::spawn(relay.clone().linger(linger));
        let service = NovaServer::new(Service(relay, floor))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        // The star's transport settings: pinned stream windows, a connection window as wide as
        // its default session cap allows, no adaptive window.
        tonic::transport::Server::builder()
            .initial_stream_window_size(window)
            .initial_connection_window_size(
                (2 * window as u64 * 4096).clamp(1 << 20, (1 << 31) - 1) as u32,
            )
            .http2_adaptive_window(Some(false))
            .add_service(service)
            .serve(listen)
            .await
            .map_err(|e| e.to_string())
    })
}
