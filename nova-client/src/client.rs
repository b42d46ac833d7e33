use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;

use nova_proto::clock::Clock;
use nova_proto::domain::SequencedRecord;
use nova_proto::route::{Router, Settings, Stub};

use crate::config::{ClientConfig, RetryObserver, RetryPolicy, Retrying};
use crate::jitter::Jitter;
use nova_proto::v1;

use crate::error::Error;
use crate::session::AppendSession;

/// A connection to a star, or to a fleet through any of its stars. Cheap to clone: clones
/// share the connections and what they learned.
///
/// In a fleet each stream has one leading star. A star that does not lead a stream answers with
/// a redirect naming the leader; the client follows it, remembers the leader per stream, and
/// forgets it when the leader stops answering (the next call goes through the star it was
/// connected to, which knows the new leader).
#[derive(Debug, Clone)]
pub struct Client {
    router: Router,
    jitter: Arc<Jitter>,
    retry: RetryPolicy,
    on_retry: RetryObserver,
}

/// One stream of a [`Client`]: the stream calls without repeating its name. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StreamHandle {
    client: Client,
    name: String,
}

impl StreamHandle {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn describe(&self) -> Result<StreamInfo, Error> {
        self.client.describe_stream(&self.name).await
    }

    pub async fn reconfigure(&self, retention: Retention) -> Result<StreamInfo, Error> {
        self.client.reconfigure_stream(&self.name, retention).await
    }

    pub async fn delete(&self) -> Result<(), Error> {
        self.client.delete_stream(&self.name).await
    }

    /// One page from `start_seq`.
    pub async fn read(&self, start_seq: u64, options: ReadOptions) -> Result<Page, Error> {
        self.client.read_with(&self.name, start_seq, options).await
    }

    /// A producer appending to this stream exactly once.
    pub async fn producer(&self, config: crate::ProducerConfig) -> Result<crate::Producer, Error> {
        crate::Producer::new(self.client.clone(), self.name.clone(), config).await
    }

    /// A consumer reading this stream from `from_seq`.
    pub fn consumer(&self, from_seq: u64) -> crate::Consumer {
        crate::Consumer::new(self.client.clone(), self.name.clone(), from_seq)
    }

    /// A producer session on the stream's leader.
    pub async fn append_session(&self) -> Result<AppendSession, Error> {
        self.client.describe_stream(&self.name).await?;
        self.client.append_session_for(&self.name).await
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    pub name: String,
    pub tail_seq: u64,
    pub stored_bytes: u64,
    pub storage_class: StorageClass,
    pub created_at_ms: u64,
    /// The first record the stream still holds (retention trims below it).
    pub first_seq: u64,
    pub retention: Retention,
    /// The star leading the stream (its --star-id) and where it listens; empty on a single
    /// star.
    pub leader_id: String,
    pub leader_addr: String,
}

/// Where and how a stream's records are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StorageClass {
    /// Acknowledged once durable in the object store; the default.
    #[default]
    Standard,
    /// Acknowledged once a quorum of single-zone buckets holds the records: lower latency, more
    /// requests. Only stars with express zone buckets create such streams.
    Express,
    /// A class this SDK does not know yet (a newer server).
    Unknown(i32),
}

impl StorageClass {
    pub fn as_str(self) -> &'static str {
        match self {
            StorageClass::Standard => "standard",
            StorageClass::Express => "express",
            StorageClass::Unknown(_) => "unknown",
        }
    }

    fn from_wire(value: i32) -> Self {
        match v1::StorageClass::try_from(value) {
            Ok(v1::StorageClass::Standard | v1::StorageClass::Unspecified) => {
                StorageClass::Standard
            }
            Ok(v1::StorageClass::Express) => StorageClass::Express,
            Err(_) => StorageClass::Unknown(value),
        }
    }

    fn to_wire(self) -> i32 {
        match self {
            StorageClass::Standard => v1::StorageClass::Standard as i32,
            StorageClass::Express => v1::StorageClass::Express as i32,
            StorageClass::Unknown(value) => value,
        }
    }
}

impl std::fmt::Display for StorageClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A new stream's settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamConfig {
    pub storage_class: StorageClass,
    pub retention: Retention,
}

/// How long a stream keeps its records; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub age: Option<Duration>,
    pub bytes: Option<u64>,
}

impl Retention {
    fn to_wire(self) -> Option<v1::Retention> {
        (self.age.is_some() || self.bytes.is_some()).then(|| v1::Retention {
            age_ms: self.age.map(|a| a.as_millis().min(u64::MAX as u128) as u64),
            bytes: self.bytes,
        })
    }
}

impl From<v1::StreamInfo> for StreamInfo {
    fn from(info: v1::StreamInfo) -> Self {
        Self {
            name: info.name,
            tail_seq: info.tail_seq,
            stored_bytes: info.stored_bytes,
            storage_class: StorageClass::from_wire(info.storage_class),
            created_at_ms: info.created_at_ms,
            first_seq: info.first_seq,
            retention: info
                .retention
                .map(|r| Retention {
                    age: r.age_ms.map(Duration::from_millis),
                    bytes: r.bytes,
                })
                .unwrap_or_default(),
            leader_id: info.leader_id,
            leader_addr: info.leader_addr,
        }
    }
}

/// Limits for one read. Zero caps mean the server's own (`--max-read-records`,
/// `--max-read-bytes`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    pub max_records: u32,
    pub max_bytes: u64,
    /// When reading at the tail, how long the server may wait for new records before answering
    /// with an empty page (capped by the server at 60 s).
    pub wait: Duration,
    /// Start at the first record at or after the start sequence number whose timestamp is at or
    /// after this (unix ms). The server may answer an empty page whose `next_seq` moved on:
    /// keep reading from it with the same start time ([`crate::Consumer::from_time`] does).
    pub start_timestamp: Option<u64>,
}

/// One page of a stream.
#[derive(Debug, Clone)]
pub struct Page {
    pub records: Vec<SequencedRecord>,
    pub next_seq: u64,
    pub tail_seq: u64,
}

/// The stream info an answer carries (every stream call's answer does).
fn stream_info(info: Option<v1::StreamInfo>) -> Result<StreamInfo, Error> {
    info.map(Into::into).ok_or_else(|| Error::Status {
        code: tonic::Code::Internal,
        message: "the server's answer carried no stream info".into(),
        retry_after: None,
        next_seq: None,
        first_seq: None,
        leader: None,
    })
}

impl Client {
    /// Connects to one star with no message bound, no deadline and no retries of the
    /// client's own (a `Producer` still retries within its budget).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let config = ClientConfig::new([url])
            .with_retry(RetryPolicy::none())
            .with_max_message_bytes(usize::MAX);
        Self::connect_with(config).await
    }

    /// Connects to the first of `config.endpoints` that answers (any star of a fleet).
    pub async fn connect_with(config: ClientConfig) -> Result<Self, Error> {
        let settings = Settings {
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            max_message_bytes: config.max_message_bytes,
            credentials: config.credentials.clone(),
            tls: config.tls.clone(),
            redirect_hosts: config.redirect_hosts.clone(),
            max_received_frame: Some(nova_proto::route::READER_FRAME_BYTES),
        };
        let mut last = Error::Connect {
            url: String::new(),
            message: "no endpoints configured".into(),
        };
        for url in &config.endpoints {
            let connect_error = |message: String| Error::Connect {
                url: url.clone(),
                message,
            };
            let endpoint = match settings.endpoint(url) {
                Ok(endpoint) => endpoint,
                Err(e) => {
                    last = connect_error(crate::error::with_causes(&e));
                    continue;
                }
            };
            match endpoint.connect().await {
                Ok(channel) => {
                    return Ok(Self {
                        router: Router::with_settings(settings.client(channel), settings.clone())
                            .seeds(url, config.endpoints.iter().map(String::as_str)),
                        jitter: Arc::new(Jitter::new(&Clock::system(), url)),
                        retry: config.retry,
                        on_retry: config.on_retry.clone(),
                    });
                }
                Err(e) => last = connect_error(crate::error::with_causes(&e)),
            }
        }
        Err(last)
    }

    /// Runs an idempotent call about `stream` on its leader, following redirects and retrying
    /// what is worth retrying within the client's retry policy, with jittered waits.
    async fn idempotent<T, F, Fut>(&self, stream: &str, call: F) -> Result<T, Error>
    where
        F: Fn(Stub) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let mut attempt = 1;
        loop {
            match self.on_leader(stream, &call).await {
                Ok(value) => return Ok(value),
                Err(error) if error.is_retryable() && attempt < self.retry.max_attempts => {
                    attempt += 1;
                    let wait = self.retry.wait(attempt, &error, &self.jitter);
                    self.on_retry.tell(|| Retrying {
                        what: if stream.is_empty() {
                            "a call to the server".to_owned()
                        } else {
                            format!("a call about stream {stream:?}")
                        },
                        attempt: attempt - 1,
                        cause: error.clone(),
                        wait,
                        gives_up_in: None,
                    });
                    Clock::system().sleep(wait).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// A handle on one stream: its calls without repeating its name.
    pub fn stream(&self, name: impl Into<String>) -> StreamHandle {
        StreamHandle {
            client: self.clone(),
            name: name.into(),
        }
    }

    /// Every stream whose name starts with `prefix`, page by page as the stream is polled.
    pub fn list_all_streams(
        &self,
        prefix: impl Into<String>,
    ) -> impl futures::Stream<Item = Result<StreamInfo, Error>> + Send + 'static {
        let client = self.clone();
        let prefix = prefix.into();
        futures::stream::try_unfold(
            (client, prefix, Some(String::new())),
            |(client, prefix, after)| async move {
                let Some(after) = after else {
                    return Ok::<_, Error>(None);
                };
                let (page, next) = client.list_streams(&prefix, &after, 0).await?;
                Ok(Some((
                    futures::stream::iter(page.into_iter().map(Ok)),
                    (client, prefix, next),
                )))
            },
        )
        .try_flatten()
    }

    /// Who hears of retries.
    pub(crate) fn retry_observer(&self) -> &RetryObserver {
        &self.on_retry
    }

    /// Learns from a failed call about `stream` where its leader is (or that it moved).
    pub(crate) fn learn(&self, stream: &str, error: &Error) {
        self.router
            .learn(stream, error.leader(), error.is_retryable());
    }

    /// Runs a call about `stream` on its leader, following redirects.
    async fn on_leader<T, F, Fut>(&self, stream: &str, call: F) -> Result<T, Error>
    where
        F: Fn(Stub) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        Ok(self.router.call(stream, call).await?)
    }

    /// The generated client, for calls the SDK does not wrap.
    pub fn raw(&self) -> Stub {
        self.router.seed()
    }

    pub async fn create_stream(&self, name: &str) -> Result<StreamInfo, Error> {
        self.create_stream_with(name, Retention::default()).await
    }

    /// Creates a Standard stream that keeps its records as `retention` says.
    pub async fn create_stream_with(
        &self,
        name: &str,
        retention: Retention,
    ) -> Result<StreamInfo, Error> {
        self.create_stream_configured(
            name,
            StreamConfig {
                retention,
                ..StreamConfig::default()
            },
        )
        .await
    }

    /// Creates a stream with the storage class and retention of `config`.
    pub async fn create_stream_configured(
        &self,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, Error> {
        let response = self
            .router
            .seed()
            .create_stream(v1::CreateStreamRequest {
                stream: name.to_owned(),
                storage_class: config.storage_class.to_wire(),
                retention: config.retention.to_wire(),
            })
            .await?;
        stream_info(response.into_inner().info)
    }

    pub async fn describe_stream(&self, name: &str) -> Result<StreamInfo, Error> {
        let response = self
            .idempotent(name, |mut star| async move {
                star.describe_stream(v1::DescribeStreamRequest {
                    stream: name.to_owned(),
                })
                .await
            })
            .await?;
        stream_info(response.into_inner().info)
    }

    /// One page of stream names starting with `prefix`, after `start_after`. Returns the page
    /// and where the next one starts (`None` at the end).
    pub async fn list_streams(
        &self,
        prefix: &str,
        start_after: &str,
        limit: u32,
    ) -> Result<(Vec<StreamInfo>, Option<String>), Error> {
        // Any star answers a listing; "" is no stream, so it goes to the star connected to.
        let response = self
            .idempotent("", |mut star| async move {
                star.list_streams(v1::ListStreamsRequest {
                    prefix: prefix.to_owned(),
                    start_after: start_after.to_owned(),
                    limit,
                })
                .await
            })
            .await?
            .into_inner();
        let next = (!response.next_start_after.is_empty()).then_some(response.next_start_after);
        Ok((response.streams.into_iter().map(Into::into).collect(), next))
    }

    /// A page of the Kafka consumer groups the star knows (those with committed offsets or
    /// members), after `start_after`; with where the next page starts.
    pub async fn list_groups(
        &self,
        start_after: &str,
        limit: u32,
    ) -> Result<(Vec<crate::GroupSummary>, Option<String>), Error> {
        let response = self
            .idempotent("", |mut star| async move {
                star.list_groups(v1::ListGroupsRequest {
                    start_after: start_after.to_owned(),
                    limit,
                })
                .await
            })
            .await?
            .into_inner();
        let next = (!response.next_start_after.is_empty()).then_some(response.next_start_after);
        Ok((response.groups.into_iter().map(Into::into).collect(), next))
    }

    /// A Kafka consumer group's committed offsets, lag and (from its coordinator) members.
    pub async fn describe_group(&self, group: &str) -> Result<crate::GroupDescription, Error> {
        let response = self
            .idempotent("", |mut star| async move {
                star.describe_group(v1::DescribeGroupRequest {
                    group: group.to_owned(),
                })
                .await
            })
            .await?;
        Ok(response.into_inner().into())
    }

    /// Replaces a stream's retention (`Retention::default()`: keep everything); its storage
    /// class stays.
    pub async fn reconfigure_stream(
        &self,
        name: &str,
        retention: Retention,
    ) -> Result<StreamInfo, Error> {
        self.reconfigure(name, retention, None).await
    }

    /// Gives a stream the storage class and the retention of `config`. A change of class
    /// takes effect for the appends admitted after it: the star refuses the stream's appends
    /// (`UNAVAILABLE`, retryable, with a short hint; a `Producer` retries by itself) until those
    /// admitted before have landed.
    pub async fn reconfigure_stream_configured(
        &self,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, Error> {
        self.reconfigure(name, config.retention, Some(config.storage_class))
            .await
    }

    async fn reconfigure(
        &self,
        name: &str,
        retention: Retention,
        class: Option<StorageClass>,
    ) -> Result<StreamInfo, Error> {
        let response = self
            .on_leader(name, |mut star| async move {
                star.reconfigure_stream(v1::ReconfigureStreamRequest {
                    stream: name.to_owned(),
                    retention: retention.to_wire(),
                    storage_class: class
                        .map_or(v1::StorageClass::Unspecified as i32, |c| c.to_wire()),
                })
                .await
            })
            .await?;
        stream_info(response.into_inner().info)
    }

    pub async fn delete_stream(&self, name: &str) -> Result<(), Error> {
        self.on_leader(name, |mut star| async move {
            star.delete_stream(v1::DeleteStreamRequest {
                stream: name.to_owned(),
            })
            .await
        })
        .await?;
        Ok(())
    }

    /// One page from `start_seq`, at most `max_records` (0: the server's cap).
    pub async fn read(
        &self,
        stream: &str,
        start_seq: u64,
        max_records: u32,
    ) -> Result<Page, Error> {
        let options = ReadOptions {
            max_records,
            ..ReadOptions::default()
        };
        self.read_with(stream, start_seq, options).await
    }

    /// One page from `start_seq`, with caps and an optional wait at the tail.
    pub async fn read_with(
        &self,
        stream: &str,
        start_seq: u64,
        options: ReadOptions,
    ) -> Result<Page, Error> {
        let response = self
            .idempotent(stream, |mut star| async move {
                star.read(v1::ReadRequest {
                    stream: stream.to_owned(),
                    start_seq,
                    max_records: options.max_records,
                    max_bytes: options.max_bytes,
                    wait_ms: options.wait.as_millis().min(u32::MAX as u128) as u32,
                    start_timestamp: options.start_timestamp,
                })
                .await
            })
            .await?
            .into_inner();
        Ok(Page {
            records: response.records.into_iter().map(Into::into).collect(),
            next_seq: response.next_seq,
            tail_seq: response.tail_seq,
        })
    }

    /// What the server this client connected to says about itself: version, role, readiness,
    /// and the limits appends and reads must stay within.
    pub async fn server_info(&self) -> Result<crate::ServerInfo, Error> {
        let response = self
            .idempotent("", |mut star| async move {
                star.get_server_info(v1::GetServerInfoRequest {}).await
            })
            .await?;
        Ok(response.into_inner().into())
    }

    /// Opens a producer session on the star this client connected to.
    pub async fn append_session(&self) -> Result<AppendSession, Error> {
        AppendSession::open(self.router.seed()).await
    }

    /// Opens a producer session on `stream`'s leader, as far as this client knows it (a
    /// `describe_stream` first finds it out).
    pub async fn append_session_for(&self, stream: &str) -> Result<AppendSession, Error> {
        AppendSession::open(self.router.stub(stream)).await
    }
}
