//! The fleet's clients: producers and consumers that reach stars the way the SDK does (send
//! to the stream's remembered leader, or to any star; follow a redirect and remember it;
//! forget a leader that stops answering), and stream creates and deletes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;

use nova_chain::admission::encoded_charge;
use nova_chain::streams::StreamState;
use nova_core::catalog::{Retention, StorageClass};
use nova_core::entropy::Entropy;
use nova_core::flight::section::encode_chunks;
use nova_core::limits::MAX_SECTION_BYTES;
use nova_core::record::Record;
use nova_proto::RequestError;
use nova_proto::route::MAX_REDIRECTS;
use tonic::Code as tonic_code;

use super::World;
use super::link::Blocked;
use super::node::{Node, Up};
use crate::oracle::body;

/// How long a client waits for one answer before it gives up on it (its outcome then unknown).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client's call came to.
pub enum Outcome<T> {
    Done(T),
    /// Nothing happened: refused before it was applied (including every redirect).
    Refused(String),
    /// It may have happened: the answer was lost.
    Unknown(String),
}

/// The SDK's router, over simulated connections: each stream's leader as last learned.
#[derive(Clone)]
pub struct Router {
    world: Arc<World>,
    leaders: Arc<Mutex<HashMap<String, usize>>>,
    entropy: Entropy,
}

impl Router {
    pub fn new(world: Arc<World>) -> Self {
        let entropy = Entropy::seeded(world.entropy.next_u64());
        Self {
            world,
            leaders: Arc::default(),
            entropy,
        }
    }

    /// Where a call about `stream` goes: its remembered leader, else any star the client
    /// knows (the SDK is given one; here it is one of those running).
    fn target(&self, stream: &str) -> Option<Arc<Node>> {
        if let Some(&index) = self.leaders.lock().get(stream)
            && let Some(node) = self.world.node(index)
        {
            return Some(node);
        }
        let nodes = self.world.running();
        (!nodes.is_empty()).then(|| nodes[self.entropy.below(nodes.len() as u64) as usize].clone())
    }

    /// What a failed call teaches, as `Router::learn` does: a redirect names the leader from
    /// now on; a retryable failure forgets it.
    fn learn(&self, stream: &str, error: &RequestError) {
        let mut leaders = self.leaders.lock();
        match error {
            RequestError::NotLeader { leader_id, .. } => {
                if let Some(index) = super::plan_index(leader_id) {
                    leaders.insert(stream.to_owned(), index);
                }
            }
            // What the SDK takes as retryable: UNAVAILABLE, UNKNOWN, CANCELLED.
            error
                if matches!(
                    error.code(),
                    tonic_code::Unavailable | tonic_code::Unknown | tonic_code::Cancelled
                ) =>
            {
                leaders.remove(stream);
            }
            _ => {}
        }
    }

    fn forget(&self, stream: &str) {
        self.leaders.lock().remove(stream);
    }

    /// Runs `call` on `stream`'s leader, following redirects. The call gets the node, the
    /// star running there and the stream's state on it (the star routed the call there).
    pub async fn on_leader<T, F, Fut>(&self, stream: &str, call: F) -> Outcome<T>
    where
        F: Fn(Arc<Node>, Up, Arc<StreamState>) -> Fut,
        Fut: Future<Output = Outcome<T>>,
    {
        enum Hop<T> {
            Answer(Outcome<T>),
            Redirect(RequestError),
        }
        let mut last = String::from("no star is running");
        for _ in 0..=MAX_REDIRECTS {
            let Some(node) = self.target(stream) else {
                return Outcome::Refused(last);
            };
            let call = &call;
            let hop = self
                .exchange(&node, |up| {
                    let node = node.clone();
                    async move {
                        match up.fleet.route(&up.star, stream).await {
                            Ok(state) => Outcome::Done(Hop::Answer(call(node, up, state).await)),
                            Err(error) => Outcome::Done(Hop::Redirect(error)),
                        }
                    }
                })
                .await;
            let outcome = match hop {
                Outcome::Done(Hop::Redirect(error)) => {
                    self.learn(stream, &error);
                    last = error.to_string();
                    if matches!(error, RequestError::NotLeader { .. }) {
                        continue;
                    }
                    return Outcome::Refused(last);
                }
                Outcome::Done(Hop::Answer(outcome)) => outcome,
                Outcome::Refused(why) => Outcome::Refused(why),
                Outcome::Unknown(why) => Outcome::Unknown(why),
            };
            if !matches!(outcome, Outcome::Done(_)) {
                self.forget(stream);
            }
            return outcome;
        }
        Outcome::Refused(format!("redirected {MAX_REDIRECTS} times: {last}"))
    }

    /// One request to `node` and its answer, across its client link.
    pub async fn exchange<T, F, Fut>(&self, node: &Node, call: F) -> Outcome<T>
    where
        F: FnOnce(Up) -> Fut,
        Fut: Future<Output = Outcome<T>>,
    {
        let clock = self.world.clock;
        match node.clients.reach().await {
            Ok(()) => {}
            Err(Blocked::Refused) => return Outcome::Refused(format!("{} refused", node.id)),
            Err(Blocked::Lost) => return Outcome::Unknown(format!("{} did not answer", node.id)),
        }
        let Some(up) = node.up() else {
            return Outcome::Refused(format!("{} is starting", node.id));
        };
        if node.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return Outcome::Refused(format!("{} is shutting down", node.id));
        }
        let answer = match clock.timeout(CALL_TIMEOUT, call(up)).await {
            Ok(answer) => answer,
            Err(_) => return Outcome::Unknown(format!("{} timed out", node.id)),
        };
        match clock.timeout(CALL_TIMEOUT, node.clients.answer()).await {
            Ok(Ok(())) => answer,
            _ => Outcome::Unknown(format!("{}'s answer was lost", node.id)),
        }
    }
}

/// One producer per stream: batches of the plan's shape, up to `window` unanswered, until
/// the run ends (the task is dropped) or the stream is deleted.
pub async fn produce(world: Arc<World>, stream_index: usize) {
    let router = Router::new(world.clone());
    let entropy = Entropy::seeded(world.entropy.next_u64());
    let name = format!("s{stream_index}");
    let mut waiting = JoinSet::new();
    while !world.is_deleted(stream_index) {
        while waiting.len() >= world.plan.window {
            waiting.join_next().await;
        }
        let lens = world.plan.batch(&entropy);
        let (batch, ids) = world.oracle.lock().new_batch(stream_index, &lens);
        let match_seq_num = {
            let oracle = world.oracle.lock();
            (waiting.is_empty()
                && oracle.settled(stream_index)
                && entropy.chance(world.plan.match_seq))
            .then(|| oracle.acked_end(stream_index))
        };
        let records: Vec<Record> = ids
            .iter()
            .zip(&lens)
            .map(|(&id, &len)| Record {
                timestamp: world.clock.unix_ms(),
                headers: vec![],
                body: body(id, len),
            })
            .collect();
        let (router, name, answered) = (router.clone(), name.clone(), world.clone());
        waiting.spawn(async move {
            let outcome = append(&router, &name, records, match_seq_num).await;
            let mut oracle = answered.oracle.lock();
            match outcome {
                Outcome::Done((start, end, source)) => oracle.acked_by(batch, start, end, &source),
                Outcome::Refused(why) => oracle.refused(batch, &why),
                Outcome::Unknown(_) => oracle.maybe(batch),
            }
        });
        let pause = entropy.below(30);
        world.clock.sleep(Duration::from_millis(pause)).await;
    }
    while waiting.join_next().await.is_some() {}
}

/// One append through the router: acknowledged at `start..end` by a star (named, with its
/// epoch), refused, or unknown.
async fn append(
    router: &Router,
    stream: &str,
    records: Vec<Record>,
    match_seq_num: Option<u64>,
) -> Outcome<(u64, u64, String)> {
    router
        .on_leader(stream, |node, up, state| {
            let records = records.clone();
            async move {
                let content: u64 = records.iter().map(|r| r.body.len() as u64).sum();
                let charge = encoded_charge(records.len() as u64, 0, content);
                let admitted = up.star.admission().admit(charge).await;
                let chunks = encode_chunks(&records, MAX_SECTION_BYTES as usize);
                let receiver = match up
                    .star
                    .submit(state, chunks, content, match_seq_num, admitted)
                    .await
                {
                    Ok(receiver) => receiver,
                    Err(RequestError::OutcomeUnknown(why)) => return Outcome::Unknown(why),
                    Err(error) => return Outcome::Refused(error.to_string()),
                };
                match receiver.await {
                    Ok(Ok(range)) => Outcome::Done((
                        range.start,
                        range.end,
                        format!(
                            "an acknowledgement from {} incarnation {} epoch {}",
                            node.id,
                            node.incarnation,
                            up.star.epoch()
                        ),
                    )),
                    Ok(Err(RequestError::OutcomeUnknown(why))) => Outcome::Unknown(why),
                    Ok(Err(error)) => Outcome::Refused(error.to_string()),
                    Err(_) => Outcome::Unknown("the star dropped the append".into()),
                }
            }
        })
        .await
}

/// Reads `stream` from `from` on its leader: `(records as (seq, body), next, tail)`.
pub async fn read(
    router: &Router,
    stream: &str,
    from: u64,
    max_records: u32,
) -> Outcome<Result<(Vec<(u64, bytes::Bytes)>, u64, u64), RequestError>> {
    router
        .on_leader(stream, |_, up, state| async move {
            match up.star.read(&state, from, max_records, 256 * 1024).await {
                Ok(page) => Outcome::Done(Ok((
                    page.records
                        .iter()
                        .map(|r| (r.seq, r.record.body.clone()))
                        .collect(),
                    page.next_seq,
                    page.tail_seq,
                ))),
                Err(error @ RequestError::DataLoss(_)) => Outcome::Done(Err(error)),
                Err(error) => Outcome::Refused(error.to_string()),
            }
        })
        .await
}

/// One consumer per stream, following it from the start.
pub async fn consume(world: Arc<World>, stream_index: usize) {
    let router = Router::new(world.clone());
    let name = format!("s{stream_index}");
    let mut next = 0;
    while !world.is_deleted(stream_index) {
        match read(&router, &name, next, 100).await {
            Outcome::Done(Ok((records, page_next, tail))) => {
                {
                    let mut oracle = world.oracle.lock();
                    let mut expect = next;
                    for (seq, body) in &records {
                        if *seq != expect {
                            oracle.violation(format!(
                                "stream {stream_index}: a read from {next} returned seq {seq} where {expect} belonged"
                            ));
                        }
                        let _ = oracle.read(stream_index, *seq, body);
                        expect = seq + 1;
                    }
                    oracle.tail(stream_index, tail, false, "a read");
                }
                next = page_next;
                if next >= tail {
                    world.clock.sleep(Duration::from_millis(50)).await;
                }
            }
            Outcome::Done(Err(error)) => {
                if !world.is_deleted(stream_index) {
                    world.violation(format!("stream {stream_index}: at {next}: {error}"));
                }
                return;
            }
            _ => world.clock.sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Creates stream `s{index}` through some star, retrying until it exists. `false` if it
/// could not be created in the time given.
pub async fn create(world: &Arc<World>, index: usize, patience: Duration) -> bool {
    let router = Router::new(world.clone());
    let name = format!("s{index}");
    let started = world.clock.now();
    while world.clock.since(started) < patience {
        if let Some(node) = router.target(&name) {
            let created = router
                .exchange(&node, |up| {
                    let name = name.clone();
                    async move {
                        match up
                            .fleet
                            .create_stream(
                                &up.star,
                                &name,
                                StorageClass::Standard,
                                Retention::default(),
                            )
                            .await
                        {
                            Ok(_) | Err(RequestError::StreamExists(_)) => Outcome::Done(()),
                            Err(error) => Outcome::Refused(error.to_string()),
                        }
                    }
                })
                .await;
            if let Outcome::Done(()) = created {
                return true;
            }
        }
        world.clock.sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Deletes stream `s{index}` through its leader, retrying until it is gone.
pub async fn delete(world: &Arc<World>, index: usize, patience: Duration) -> bool {
    let router = Router::new(world.clone());
    let name = format!("s{index}");
    let started = world.clock.now();
    while world.clock.since(started) < patience {
        let deleted = router
            .on_leader(&name, |_, up, _| {
                let name = name.clone();
                async move {
                    match up.fleet.delete_stream(&up.star, &name).await {
                        Ok(()) | Err(RequestError::StreamNotFound(_)) => Outcome::Done(()),
                        Err(error) => Outcome::Refused(error.to_string()),
                    }
                }
            })
            .await;
        match deleted {
            Outcome::Done(()) => return true,
            Outcome::Refused(why) if why.contains("not found") => return true,
            _ => world.clock.sleep(Duration::from_millis(200)).await,
        }
    }
    false
}
