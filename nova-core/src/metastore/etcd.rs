//! The etcd metastore: the catalog and the fleet's records in an etcd cluster, so that several
//! stars share one catalog. A key's version is its `mod_revision`, so a compare-and-set is a
//! transaction comparing it; a transaction's puts all get the revision it commits at, as in the
//! embedded store. Leases are etcd's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, GetOptions, PutOptions,
    Txn as EtcdTxn, TxnOp, TxnOpResponse,
};
use tokio::sync::Semaphore;

use super::{
    Capabilities, Compare, ETCD_DEFAULT_MAX_TXN_OPS, KeyValue, MAX_SCAN, Metastore, MetastoreError,
    Mutation, Txn, TxnOutcome,
};

/// Reads (and, in their own lane, transactions) a star has in flight to etcd at once.
pub const ETCD_MAX_INFLIGHT: usize = 64;

/// How to reach etcd and what it accepts.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `host:port` (or `http://host:port`) of each member.
    pub endpoints: Vec<String>,
    /// Deadline of one request; past it the call fails as unavailable (its effect unknown).
    pub request_timeout: Duration,
    /// The cluster's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// Requests in flight at once; callers past it wait for a turn.
    pub max_inflight: usize,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            request_timeout: Duration::from_secs(5),
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
            max_inflight: ETCD_MAX_INFLIGHT,
        }
    }

    /// Parses `etcd://host:port[,host:port…]`; `None` when `url` is not an etcd URL.
    pub fn parse_url(url: &str) -> Option<Result<Vec<String>, String>> {
        let rest = url.strip_prefix("etcd://")?;
        let endpoints: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        if endpoints.is_empty() {
            return Some(Err(format!(
                "{url:?} names no etcd member: expected etcd://HOST:PORT[,HOST:PORT…]"
            )));
        }
        for endpoint in &endpoints {
            if !endpoint.contains(':') || endpoint.contains('/') {
                return Some(Err(format!(
                    "{endpoint:?} in {url:?} is not HOST:PORT: expected etcd://HOST:PORT[,HOST:PORT…]"
                )));
            }
        }
        Some(Ok(endpoints))
    }
}

/// The cluster, one client per member. A call goes to the member that answered last; one that
/// fails it (refused, reset, timed out, or dropped by its caller unanswered) sends the next call
/// to the next member. Reads, lease calls and transactions that never left are tried on the
/// other members at once, so a dead or stalled member costs a failover, not an outage.
/// (etcd-client's own balanced channel keeps sending calls to a member that is down.)
#[derive(Clone)]
pub struct EtcdMetastore {
    members: Arc<[Client]>,
    current: Arc<AtomicUsize>,
    options: EtcdOptions,
    /// Turns for reads, which clients' calls make (a describe of a stream another star leads,
    /// a listing), each lane `max_inflight` wide.
    reads: Arc<Semaphore>,
    /// Turns for transactions (the absorb's commits, placements, handoffs): a lane of their
    /// own, so a flood of reads can slow other reads but never the commits appends wait on.
    writes: Arc<Semaphore>,
    /// The lane this handle's reads wait in: `Read`, or `Write` for the priority handle.
    read_lane: Lane,
}

/// Which queue a call waits in.
#[derive(Clone, Copy)]
enum Lane {
    Read,
    Write,
}

/// One call on one member. Dropped before `answered` (an error, a timeout, the caller gone), it
/// moves the cluster's next call to the next member.
struct Attempt<'a> {
    current: &'a AtomicUsize,
    member: usize,
    members: usize,
    answered: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let next = (self.member + 1) % self.members;
            let _ = self.current.compare_exchange(
                self.member,
                next,
                AtomicOrdering::AcqRel,
                AtomicOrdering::Acquire,
            );
        }
    }
}

/// How far a failed call may be tried on another member.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Safe to send again anywhere (reads, lease calls).
    Idempotent,
    /// Only if it never reached the member (a transaction).
    IfNotSent,
}

/// Whether `err` says the call never left this process (no connection to the member).
fn never_sent(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable
                && (status.message().contains("tcp connect error")
                    || status.message().contains("Connection refused"))
        }
        _ => false,
    }
}

impl std::fmt::Debug for EtcdMetastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMetastore")
            .field("endpoints", &self.options.endpoints)
            .finish()
    }
}

fn error(err: etcd_client::Error) -> MetastoreError {
    use etcd_client::Error;
    match err {
        Error::GRpcStatus(status) => match status.code() {
            tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Cancelled
            | tonic::Code::Aborted
            | tonic::Code::ResourceExhausted
            | tonic::Code::Unknown => MetastoreError::Unavailable(format!(
                "etcd: {:?}: {}",
                status.code(),
                status.message()
            )),
            _ => {
                MetastoreError::Internal(format!("etcd: {:?}: {}", status.code(), status.message()))
            }
        },
        Error::TransportError(e) => MetastoreError::Unavailable(format!("etcd: {e}")),
        Error::IoError(e) => MetastoreError::Unavailable(format!("etcd: {e}")),
        Error::LeaseKeepAliveError(e) => MetastoreError::Unavailable(format!("etcd lease: {e}")),
        other => MetastoreError::Internal(format!("etcd: {other}")),
    }
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or an empty prefix): the range runs to the end of the keyspace.
    vec![0]
}

fn lease_id(lease: u64) -> Result<i64, MetastoreError> {
    i64::try_from(lease)
        .map_err(|_| MetastoreError::Internal(format!("lease id {lease} out of range")))
}

fn revision(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl EtcdMetastore {
    /// Connects lazily: an unreachable cluster shows up as `Unavailable` on the first call,
    /// which start-up waits out like any outage.
    pub async fn connect(options: EtcdOptions) -> Result<Self, MetastoreError> {
        let connect = ConnectOptions::new()
            .with_timeout(options.request_timeout)
            .with_connect_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), options.request_timeout);
        let mut members = Vec::with_capacity(options.endpoints.len());
        for endpoint in &options.endpoints {
            members.push(
                Client::connect([endpoint], Some(connect.clone()))
                    .await
                    .map_err(error)?,
            );
        }
        if members.is_empty() {
            return Err(MetastoreError::Internal("no etcd endpoint given".into()));
        }
        Ok(Self {
            members: members.into(),
            current: Arc::new(AtomicUsize::new(0)),
            reads: Arc::new(Semaphore::new(options.max_inflight.max(1))),
            writes: Arc::new(Semaphore::new(options.max_inflight.max(1))),
            read_lane: Lane::Read,
            options,
        })
    }

    /// Runs `call` on the member that answered last, and on the others as `retry` allows.
    async fn on_member<T, F, Fut>(&self, retry: Retry, call: F) -> Result<T, MetastoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let members = self.members.len();
        let first = self.current.load(AtomicOrdering::Acquire) % members;
        let mut last = None;
        for k in 0..members {
            let member = (first + k) % members;
            let mut attempt = Attempt {
                current: &self.current,
                member,
                members,
                answered: false,
            };
            match call(self.members[member].clone()).await {
                Ok(value) => {
                    attempt.answered = true;
                    self.current.store(member, AtomicOrdering::Release);
                    return Ok(value);
                }
                Err(err) => {
                    let again = match retry {
                        Retry::Idempotent => true,
                        Retry::IfNotSent => never_sent(&err),
                    };
                    let err = error(err);
                    if !matches!(err, MetastoreError::Unavailable(_)) {
                        // The member answered (a refusal is an answer): it stays the one to ask.
                        attempt.answered = true;
                        return Err(err);
                    }
                    if !again {
                        return Err(err);
                    }
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or_else(|| MetastoreError::Unavailable("no etcd member answered".into())))
    }

    async fn turn(&self, lane: Lane) -> Result<tokio::sync::SemaphorePermit<'_>, MetastoreError> {
        match lane {
            Lane::Read => &self.reads,
            Lane::Write => &self.writes,
        }
        .acquire()
        .await
        .map_err(|_| MetastoreError::Unavailable("metastore closed".into()))
    }

    fn to_etcd(&self, txn: Txn) -> Result<EtcdTxn, MetastoreError> {
        let compares: Vec<EtcdCompare> = txn
            .compares
            .into_iter()
            .map(|compare| match compare {
                // A key that does not exist has create_revision 0.
                Compare::Missing(key) => EtcdCompare::create_revision(key, CompareOp::Equal, 0),
                Compare::Version(key, version) => EtcdCompare::mod_revision(
                    key,
                    CompareOp::Equal,
                    i64::try_from(version).unwrap_or(i64::MAX),
                ),
            })
            .collect();
        let mut ops = Vec::with_capacity(txn.mutations.len());
        for mutation in txn.mutations {
            ops.push(match mutation {
                Mutation::Put(key, value) => TxnOp::put(key, value, None),
                Mutation::PutLeased(key, value, lease) => TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(lease_id(lease)?)),
                ),
                Mutation::Delete(key) => TxnOp::delete(key, None),
            });
        }
        Ok(EtcdTxn::new().when(compares).and_then(ops))
    }
}

#[async_trait]
impl Metastore for EtcdMetastore {
    fn describe(&self) -> String {
        format!("etcd metastore {}", self.options.endpoints.join(","))
    }

    /// The database size of the member this client is connected to (etcd's own
    /// `etcd_mvcc_db_total_size_in_bytes`): what counts against its --quota-backend-bytes.
    async fn size_bytes(&self) -> Result<Option<u64>, MetastoreError> {
        let _turn = self.turn(Lane::Read).await?;
        let status = self
            .on_member(Retry::Idempotent, |client| async move {
                client.maintenance_client().status().await
            })
            .await?;
        Ok(Some(status.db_size().max(0) as u64))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            leases: true,
            shared: true,
            max_txn_ops: self.options.max_txn_ops,
        }
    }

    fn priority(&self) -> Option<Arc<dyn Metastore>> {
        Some(Arc::new(Self {
            read_lane: Lane::Write,
            ..self.clone()
        }))
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, MetastoreError> {
        let _turn = self.turn(self.read_lane).await?;
        let mut response = self
            .on_member(Retry::Idempotent, |client| async move {
                client.kv_client().get(key, None).await
            })
            .await?;
        Ok(response.take_kvs().into_iter().next().map(|kv| KeyValue {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            version: revision(kv.mod_revision()),
        }))
    }

    /// One transaction of reads per `max_txn_ops` keys: a listing's tails in one round trip.
    async fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<KeyValue>>, MetastoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(self.options.max_txn_ops.max(1)) {
            let txn = EtcdTxn::new().and_then(
                chunk
                    .iter()
                    .map(|key| TxnOp::get(key.clone(), None))
                    .collect::<Vec<_>>(),
            );
            let _turn = self.turn(self.read_lane).await?;
            let response = self
                .on_member(Retry::Idempotent, |client| {
                    let txn = txn.clone();
                    async move { client.kv_client().txn(txn).await }
                })
                .await?;
            let answers = response.op_responses();
            if answers.len() != chunk.len() {
                return Err(MetastoreError::Internal(format!(
                    "etcd answered {} reads of {}",
                    answers.len(),
                    chunk.len()
                )));
            }
            for answer in answers {
                let TxnOpResponse::Get(get) = answer else {
                    return Err(MetastoreError::Internal(
                        "etcd answered a read with something else".into(),
                    ));
                };
                out.push(get.kvs().first().map(|kv| KeyValue {
                    key: kv.key().to_vec(),
                    value: kv.value().to_vec(),
                    version: revision(kv.mod_revision()),
                }));
            }
        }
        Ok(out)
    }

    async fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<KeyValue>, MetastoreError> {
        let limit = limit.clamp(1, MAX_SCAN);
        // The smallest key after `start_after` is `start_after` followed by a zero byte.
        let start = match start_after {
            Some(after) if after >= prefix => {
                let mut start = after.to_vec();
                start.push(0);
                start
            }
            _ => prefix.to_vec(),
        };
        let end = prefix_end(prefix);
        if end != [0] && start >= end {
            return Ok(Vec::new());
        }
        let _turn = self.turn(self.read_lane).await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut response = self
            .on_member(Retry::Idempotent, |client| {
                let (start, end) = (start.clone(), end.clone());
                async move {
                    let options = GetOptions::new().with_range(end).with_limit(limit);
                    client.kv_client().get(start, Some(options)).await
                }
            })
            .await?;
        Ok(response
            .take_kvs()
            .into_iter()
            .map(|kv| KeyValue {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                version: revision(kv.mod_revision()),
            })
            .collect())
    }

    async fn commit(&self, txn: Txn) -> Result<TxnOutcome, MetastoreError> {
        txn.check(self.options.max_txn_ops, true)?;
        let txn = self.to_etcd(txn)?;
        let _turn = self.turn(Lane::Write).await?;
        let response = self
            .on_member(Retry::IfNotSent, |client| {
                let txn = txn.clone();
                async move { client.kv_client().txn(txn).await }
            })
            .await?;
        if !response.succeeded() {
            return Ok(TxnOutcome::Conflict);
        }
        let revision = response
            .header()
            .map(|h| revision(h.revision()))
            .ok_or_else(|| {
                MetastoreError::Internal("etcd answered a txn without a header".into())
            })?;
        Ok(TxnOutcome::Committed { revision })
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<u64, MetastoreError> {
        // Lease calls bypass the request queue: a star's renewals must not wait behind its
        // own request traffic, or a busy star would lose its lease.
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        // A grant whose answer is lost leaves a lease nobody renews: it lapses on its own.
        let response = self
            .on_member(Retry::Idempotent, |client| async move {
                client.lease_client().grant(secs, None).await
            })
            .await?;
        if !response.error().is_empty() {
            return Err(MetastoreError::Internal(format!(
                "etcd refused a lease: {}",
                response.error()
            )));
        }
        u64::try_from(response.id())
            .map_err(|_| MetastoreError::Internal("etcd granted a negative lease id".into()))
    }

    async fn keep_alive(&self, lease: u64) -> Result<Option<Duration>, MetastoreError> {
        let id = lease_id(lease)?;
        // Lease calls bypass the request queue: a star's renewals must not wait behind its
        // own request traffic, or a busy star would lose its lease.
        let timeout = self.options.request_timeout;
        let ttl = self
            .on_member(Retry::Idempotent, |client| async move {
                let mut leases = client.lease_client();
                let exchange = async {
                    // Opening the stream sends a renewal and reads its answer; the client
                    // reports a lease that is gone as this error rather than as a zero ttl.
                    let (mut keeper, mut answers) = match leases.keep_alive(id).await {
                        Ok(stream) => stream,
                        Err(etcd_client::Error::LeaseKeepAliveError(e))
                            if e.contains("not found") =>
                        {
                            return Ok(None);
                        }
                        Err(e) => return Err(e),
                    };
                    // A second renewal on the open stream, for the ttl the client does not
                    // hand back.
                    keeper.keep_alive().await?;
                    Ok(answers.message().await?.map(|a| a.ttl()))
                };
                // The keep-alive stream has no deadline of its own.
                crate::clock::Clock::system()
                    .timeout(timeout, exchange)
                    .await
                    .unwrap_or_else(|_| {
                        Err(etcd_client::Error::LeaseKeepAliveError(
                            "lease keep-alive timed out".into(),
                        ))
                    })
            })
            .await?;
        Ok(ttl.and_then(|ttl| {
            u64::try_from(ttl)
                .ok()
                .filter(|&ttl| ttl > 0)
                .map(Duration::from_secs)
        }))
    }

    async fn revoke_lease(&self, lease: u64) -> Result<(), MetastoreError> {
        let id = lease_id(lease)?;
        // Lease calls bypass the request queue: a star's renewals must not wait behind its
        // own request traffic, or a busy star would lose its lease.
        self.on_member(Retry::Idempotent, |client| async move {
            match client.lease_client().revoke(id).await {
                Ok(_) => Ok(()),
                // Already gone is what revoking wants.
                Err(etcd_client::Error::GRpcStatus(status))
                    if status.code() == tonic::Code::NotFound =>
                {
                    Ok(())
                }
                Err(err) => Err(err),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite_against_a_real_etcd() {
        let etcd = nova_testkit::Etcd::start();
        let store = EtcdMetastore::connect(EtcdOptions::new(vec![etcd.endpoint()]))
            .await
            .unwrap();
        crate::metastore::conformance::run_all(&store, "conformance/").await;
    }

    /// Reads and transactions wait in lanes of their own: with every read turn taken (a flood
    /// of describes, say), a commit (the absorb's) still goes through at once, and so do the
    /// absorb's reads.
    #[tokio::test]
    async fn a_flood_of_reads_does_not_hold_up_commits() {
        let etcd = nova_testkit::Etcd::start();
        let options = EtcdOptions {
            max_inflight: 4,
            ..EtcdOptions::new(vec![etcd.endpoint()])
        };
        let store = EtcdMetastore::connect(options).await.unwrap();
        let _flood = store.reads.acquire_many(4).await.unwrap();
        let clock = crate::clock::Clock::system();
        let commit = store.commit(Txn::new().put(b"lanes/k".to_vec(), b"v".to_vec()));
        assert!(
            matches!(
                clock.timeout(Duration::from_secs(5), commit).await,
                Ok(Ok(TxnOutcome::Committed { .. }))
            ),
            "a commit waited behind reads"
        );
        assert!(
            clock
                .timeout(Duration::from_millis(200), store.get(b"lanes/k"))
                .await
                .is_err(),
            "a read past its lane's turns waits"
        );
        // The priority handle (the absorb's) reads in the transactions' lane.
        let priority = store.priority().expect("etcd has a priority lane");
        assert!(
            matches!(
                clock
                    .timeout(Duration::from_secs(5), priority.get(b"lanes/k"))
                    .await,
                Ok(Ok(Some(_)))
            ),
            "the absorb's read waited behind the flood"
        );
    }

    /// A cluster of three with one member stopped (SIGSTOP: it holds its connections and
    /// answers nothing), then killed, is still a metastore: calls fail over to the members that
    /// answer. etcd-client's balanced channel alone kept sending calls to the dead one.
    #[tokio::test]
    async fn a_cluster_with_a_member_down_or_stalled_still_serves() {
        let mut cluster = nova_testkit::EtcdCluster::start(3);
        let endpoints = EtcdOptions::parse_url(&cluster.url())
            .expect("an etcd url")
            .expect("endpoints");
        let options = EtcdOptions {
            request_timeout: Duration::from_secs(1),
            ..EtcdOptions::new(endpoints)
        };
        let store = EtcdMetastore::connect(options).await.unwrap();
        // Losing a member may cost an election (a second or so); after it, calls go through.
        let answers = || async {
            let clock = crate::clock::Clock::system();
            let started = clock.now();
            while let Err(err) = store.get(b"probe").await {
                assert!(
                    clock.since(started) < Duration::from_secs(20),
                    "the cluster stopped answering: {err}"
                );
                clock.sleep(Duration::from_millis(200)).await;
            }
        };
        answers().await;
        // The member calls go to first, stopped: they go to another.
        cluster.pause(0);
        answers().await;
        let lease = store.grant_lease(Duration::from_secs(30)).await.unwrap();
        assert!(store.keep_alive(lease).await.unwrap().is_some());
        crate::metastore::conformance::run_all(&store, "stalled/").await;
        cluster.resume(0);
        // Then killed.
        cluster.kill(0);
        answers().await;
        crate::metastore::conformance::run_all(&store, "down/").await;
    }

    #[test]
    fn prefix_ends_cover_the_prefix_and_nothing_after() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn etcd_urls_name_host_and_port_pairs() {
        assert_eq!(
            EtcdOptions::parse_url("etcd://127.0.0.1:2379,10.0.0.2:2379"),
            Some(Ok(vec!["127.0.0.1:2379".into(), "10.0.0.2:2379".into()]))
        );
        assert!(EtcdOptions::parse_url("etcd://").unwrap().is_err());
        assert!(EtcdOptions::parse_url("etcd://host").unwrap().is_err());
        assert_eq!(EtcdOptions::parse_url("/var/lib/nova"), None);
    }
}
