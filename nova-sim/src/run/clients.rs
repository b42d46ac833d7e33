//! The simulated clients of one life of the star: a producer and a consumer per stream, the
//! stream deletes the plan calls for, and the watchers of trim points and budgets. Each reports
//! to the oracle what it was told.

use super::*;

impl World {
    /// Picks a stream to delete and puts a new one in its place from the next start on. From
    /// now on the old stream's records may vanish, whether or not its delete lands.
    pub(super) fn retire_a_stream(&self) -> usize {
        let mut live = self.live_streams.lock();
        let (streams, next) = &mut *live;
        let victim = streams[self.entropy.below(streams.len() as u64) as usize];
        streams.retain(|&s| s != victim);
        streams.push(*next);
        *next += 1;
        self.oracle.lock().delete_stream(victim);
        victim
    }
}

/// Deletes stream `victim` after a while, retrying through faults until the star says it is
/// gone (the process may die first).
pub(super) async fn delete_stream(cx: Context, victim: usize, after: Duration) {
    cx.clock.sleep(after).await;
    let name = format!("s{victim}");
    for _ in 0..1000 {
        match cx.star.streams().delete(&name).await {
            Ok(()) | Err(RequestError::StreamNotFound(_)) => {
                tracing::info!(stream = name, "deleted");
                return;
            }
            Err(err) => {
                tracing::debug!("deleting {name}: {err}");
                cx.clock.sleep(Duration::from_millis(50)).await;
            }
        }
    }
    cx.oracle.lock().violation(format!(
        "stream {name} could not be deleted in 1,000 attempts"
    ));
}

/// What a client task needs.
#[derive(Clone)]
pub(super) struct Context {
    star: Arc<Star>,
    oracle: Arc<Mutex<Oracle>>,
    plan: Plan,
    entropy: Entropy,
    /// The star's clock: wall time may be off (monotonic time and timers are true).
    clock: Clock,
    /// The true clock, for the oracle.
    truth: Clock,
}

impl World {
    pub(super) fn context(&self, star: &Arc<Star>, clock: Clock, truth: Clock) -> Context {
        Context {
            truth,
            star: star.clone(),
            oracle: self.oracle.clone(),
            plan: self.plan.clone(),
            entropy: Entropy::seeded(self.entropy.next_u64()),
            clock,
        }
    }
}

/// One producer per stream: batches of the plan's shape, up to `window` unanswered.
pub(super) async fn produce(cx: Context, stream_index: usize, stream: Arc<StreamState>) {
    let mut waiting = JoinSet::new();
    for _ in 0..cx.plan.batches_per_life {
        while waiting.len() >= cx.plan.window {
            waiting.join_next().await;
        }
        let lens = cx.plan.batch(&cx.entropy);
        let (batch, ids) = {
            let mut oracle = cx.oracle.lock();
            let (batch, ids) = oracle.new_batch(stream_index, &lens);
            oracle.submitted(batch, cx.truth.unix_ms());
            (batch, ids)
        };
        let records: Vec<Record> = ids
            .iter()
            .zip(&lens)
            .map(|(&id, &len)| Record {
                timestamp: cx.clock.unix_ms(),
                headers: vec![],
                body: body(id, len),
            })
            .collect();
        let content: u64 = records.iter().map(|r| r.body.len() as u64).sum();
        // With nothing unanswered and a known tail, sometimes say where the batch must land:
        // a retry that meets its own earlier attempt is refused, not duplicated.
        let match_seq_num = {
            let oracle = cx.oracle.lock();
            (waiting.is_empty()
                && oracle.settled(stream_index)
                && cx.entropy.chance(cx.plan.match_seq))
            .then(|| oracle.acked_end(stream_index))
        };
        let charge = encoded_charge(records.len() as u64, 0, content);
        let admitted = cx.star.admission().admit(charge).await;
        // An Express batch's charge moves to the express buffer (checked in `watch_budgets`).
        if stream.meta.class == StorageClass::Standard {
            cx.oracle
                .lock()
                .admitted(batch, charge, cx.star.config().admission_bytes);
        }
        let chunks = encode_chunks(&records, MAX_SECTION_BYTES as usize);
        match cx
            .star
            .submit(stream.clone(), chunks, content, match_seq_num, admitted)
            .await
        {
            Ok(receiver) => {
                if let Some(buffer) = cx
                    .star
                    .express_buffer()
                    .filter(|_| stream.meta.class == StorageClass::Express)
                {
                    cx.oracle
                        .lock()
                        .admitted_express(batch, charge, buffer.budget().capacity());
                }
                // The answer is recorded the moment it arrives, not when the window next
                // needs room: an ack the client holds when the process dies counts as one.
                let oracle = cx.oracle.clone();
                waiting.spawn(async move { take_reply(&oracle, batch, receiver.await) });
            }
            Err(err) => cx.oracle.lock().refused(batch, &err.to_string()),
        }
        let pause = cx.entropy.below(10);
        cx.clock.sleep(Duration::from_millis(pause)).await;
    }
    while waiting.join_next().await.is_some() {}
}

pub(super) fn take_reply(
    oracle: &Mutex<Oracle>,
    batch: usize,
    reply: Result<nova_chain::AppendReply, tokio::sync::oneshot::error::RecvError>,
) {
    let mut oracle = oracle.lock();
    match reply {
        Ok(Ok(range)) => oracle.acked(batch, range.start, range.end),
        Ok(Err(RequestError::OutcomeUnknown(_))) | Err(_) => oracle.maybe(batch),
        Ok(Err(err)) => oracle.refused(batch, &err.to_string()),
    }
}

/// One consumer per stream, following it from the start.
pub(super) async fn consume(cx: Context, stream_index: usize, stream: Arc<StreamState>) {
    let mut next = 0;
    loop {
        match cx.star.read(&stream, next, 100, 256 * 1024).await {
            Ok(page) => {
                {
                    let mut oracle = cx.oracle.lock();
                    let mut expect = next;
                    for record in &page.records {
                        if record.seq != expect {
                            oracle.violation(format!(
                            "stream {stream_index}: a read from {next} returned seq {} where {expect} belonged",
                            record.seq
                        ));
                        }
                        let _ = oracle.read(stream_index, record.seq, &record.record.body);
                        expect = record.seq + 1;
                    }
                    oracle.tail(stream_index, page.tail_seq, false, "a read");
                }
                next = page.next_seq;
                if next >= page.tail_seq {
                    cx.clock.sleep(Duration::from_millis(20)).await;
                }
            }
            Err(RequestError::DataLoss(why)) => {
                cx.oracle
                    .lock()
                    .violation(format!("stream {stream_index}: data loss at {next}: {why}"));
                return;
            }
            // A live stream's records are never "not found", and a read is never failed for a
            // fault of the server's own: what a consumer may see is retryable, or the stream
            // gone because it was deleted.
            Err(err @ (RequestError::Internal(_) | RequestError::ObjectNotFound(_))) => {
                cx.oracle.lock().violation(format!(
                    "stream {stream_index}: a read at {next} failed with {err:?}, which a consumer \
                     of a live stream must not be told"
                ));
                return;
            }
            // Retryable, but never because the objects kept vanishing under the read: a read
            // resolves its refs again, and its objects outlive the grace period.
            Err(RequestError::Unavailable(why)) if why.contains("was gone each of") => {
                cx.oracle.lock().violation(format!(
                    "stream {stream_index}: a read at {next} ran out of stale-ref retries: {why}"
                ));
                return;
            }
            Err(_) => cx.clock.sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Samples the trim points of the streams with an age retention: none may pass a record sent
/// less than that age ago by the true clock, whatever the star's wall clock says.
pub(super) async fn watch_trim_points(
    cx: Context,
    streams: Vec<(usize, Arc<StreamState>)>,
    age: Duration,
) {
    let mut ticker = cx.clock.interval(Duration::from_millis(100));
    loop {
        ticker.tick().await;
        for (i, stream) in &streams {
            let Ok(first) = cx.star.first_seq(stream).await else {
                continue;
            };
            // The time after the read: a trim it saw happened before then.
            let now = cx.truth.unix_ms();
            cx.oracle
                .lock()
                .check_trim_point(*i, first, now, age.as_millis() as u64);
        }
    }
}

/// Samples the star's budgets: none may hold more than its limit.
pub(super) async fn watch_budgets(cx: Context) {
    let mut ticker = cx.clock.interval(Duration::from_millis(10));
    loop {
        ticker.tick().await;
        // Let every task woken at this instant run first (see `Oracle::check_charges`).
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        cx.oracle
            .lock()
            .check_charges(cx.star.config().admission_bytes);
        if let Some(buffer) = cx.star.express_buffer() {
            cx.oracle
                .lock()
                .check_express_charges(buffer.budget().capacity());
        }
        let star = &cx.star;
        let checks = [
            (
                "admission buffer",
                star.admission().budget().in_use(),
                star.config().admission_bytes,
            ),
            (
                "tail window cache",
                star.tail_cache().used(),
                star.tail_cache().capacity(),
            ),
        ];
        let express = star.express_buffer().map(|buffer| {
            (
                "express buffer",
                buffer.budget().in_use(),
                buffer.budget().capacity(),
            )
        });
        for (what, used, limit) in checks.into_iter().chain(express) {
            if used > limit {
                cx.oracle
                    .lock()
                    .violation(format!("the {what} holds {used} bytes, over its {limit}"));
            }
        }
    }
}

/// The final check: every stream read from 0 to its tail.
pub(super) async fn read_back(
    world: &World,
    star: &Star,
    streams: &[(usize, Arc<StreamState>)],
    truth: Clock,
) {
    // Taken before the reads: a record read back had to be kept until now at least.
    let now_ms = truth.unix_ms();
    let mut read_ids = HashSet::new();
    let mut first_seqs = HashMap::new();
    let mut kept: HashMap<usize, u64> = HashMap::new();
    let mut retentions = HashMap::new();
    for (i, stream) in streams.iter().cloned() {
        let tail = stream.tail();
        // Retention may have trimmed the stream's front: what is below its trim point is gone,
        // what is from it on must all be there.
        let mut next = match star.first_seq(&stream).await {
            Ok(first) => first,
            Err(err) => {
                world.violation(format!("the trim point of stream {i}: {err}"));
                return;
            }
        };
        if next > 0 && stream.retention().is_unlimited() {
            world.violation(format!("stream {i} without retention starts at {next}"));
        }
        first_seqs.insert(i, next);
        retentions.insert(i, stream.retention());
        while next < tail {
            let page = match star.read(&stream, next, 1000, 4 << 20).await {
                Ok(page) => page,
                Err(err) => {
                    world.violation(format!("final read of stream {i} at {next}: {err}"));
                    return;
                }
            };
            let mut oracle = world.oracle.lock();
            for record in &page.records {
                if record.seq != next {
                    oracle.violation(format!(
                        "final read of stream {i}: seq {} where {next} belonged",
                        record.seq
                    ));
                    return;
                }
                read_ids.extend(oracle.read(i, record.seq, &record.record.body));
                *kept.entry(i).or_default() += record.record.body.len() as u64 + RECORD_FRAMING;
                next += 1;
            }
            if page.records.is_empty() {
                oracle.violation(format!(
                    "final read of stream {i} at {next} returned nothing"
                ));
                return;
            }
        }
    }
    let mut oracle = world.oracle.lock();
    oracle.settle(&read_ids, &first_seqs);
    oracle.check_retention(
        &read_ids,
        now_ms,
        &|i| retentions.get(&i).and_then(|r: &Retention| r.age_ms),
        &|i| retentions.get(&i).and_then(|r: &Retention| r.bytes),
        &kept,
    );
}

/// The most a record's framing in a section takes beside its body (its length, timestamp,
/// headers count and checksum), so that bytes read back bound the bytes a retention kept.
pub(super) const RECORD_FRAMING: u64 = 64;
