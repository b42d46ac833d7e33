//! A producer: appends records to one stream, exactly once, over one pipelined session.
//!
//! Records are batched by size and linger. Every batch is sent with `match_seq_num` set to the
//! sequence number it must start at, so the star applies it only in its place. When the session
//! breaks (a dropped connection, a restarted star), the producer reconnects, asks the stream's
//! tail, counts every pending batch below the tail as acknowledged and sends the rest again in
//! order: no record is written twice and none is skipped. An append whose outcome the star could
//! not tell ("outcome unknown": its flight may or may not land) is resolved the same way, from
//! the tail once the star has settled its chain. This relies on the producer being the stream's
//! only writer; a second writer shows up as a `FAILED_PRECONDITION` error.
//!
//! Memory is bounded: `append` waits while `max_unacked_bytes` of records are unacknowledged.
//! Retrying is bounded in time: a batch not acknowledged within `delivery_timeout` of its first
//! send (retries included, each waiting for the server's `retry-after-ms` hint when it sent one,
//! else an exponential backoff) fails with `Error::DeliveryTimeout`, naming the last refusal and
//! whether the batch may have landed anyway. A star that keeps answering and keeps refusing
//! (a shed, an Express quorum out of reach, an object-store outage) is therefore given up on
//! too, not only one that cannot be reached. Reconnecting is bounded in attempts as well:
//! after `max_retries` consecutive failed attempts the producer stops with
//! `Error::RetriesExhausted`. Either way the producer stops, and every later append fails with
//! the same error: none is sent after a gap.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use nova_proto::clock::{Clock, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::Code;

use nova_proto::domain::Record;

use crate::client::Client;
use crate::config::{RetryPolicy, Retrying};
use crate::error::Error;
use crate::jitter::Jitter;
use crate::session::{AckReceiver, AppendSender};

/// [`ProducerConfig::delivery_timeout`]'s default.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// A batch is sent once its records hold this many content bytes.
    pub batch_bytes: usize,
    /// A batch is sent once it holds this many records.
    pub batch_records: usize,
    /// A batch is sent this long after its first record, full or not.
    pub linger: Duration,
    /// `append` waits while this many content bytes are sent but unacknowledged.
    pub max_unacked_bytes: usize,
    /// Records larger than this are refused by `append` (keep it at the star's
    /// `--max-record-bytes`).
    pub max_record_bytes: usize,
    /// Consecutive failed attempts to reconnect before the producer gives up.
    pub max_retries: u32,
    /// The longest a batch may wait for its acknowledgement, from its first send, retries
    /// included; then it fails, and the producer with it. Two minutes by default (Kafka's
    /// `delivery.timeout.ms` too): long enough to ride out a star's restart or a leader's
    /// move, short enough that a persistent refusal surfaces as an error.
    pub delivery_timeout: Duration,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// What lingers and backoffs are timed on: the system clock, or a simulated one in tests.
    pub clock: Clock,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            batch_bytes: 256 * 1024,
            batch_records: 1000,
            linger: Duration::from_millis(5),
            max_unacked_bytes: 32 << 20,
            max_record_bytes: 1 << 20,
            max_retries: 10,
            delivery_timeout: DEFAULT_DELIVERY_TIMEOUT,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            clock: Clock::system(),
        }
    }
}

/// Resolves to a record's sequence number once it is durable.
pub struct AppendTicket(oneshot::Receiver<Result<u64, Error>>);

impl AppendTicket {
    pub async fn wait(self) -> Result<u64, Error> {
        self.0
            .await
            .unwrap_or_else(|_| Err(Error::SessionClosed("the producer stopped".into())))
    }
}

enum Command {
    Append {
        record: Record,
        ticket: oneshot::Sender<Result<u64, Error>>,
        permit: OwnedSemaphorePermit,
    },
    Flush(oneshot::Sender<Result<(), Error>>),
}

pub struct Producer {
    commands: mpsc::Sender<Command>,
    /// Why the producer stopped, once it has.
    stopped: Arc<Mutex<Option<Error>>>,
    unacked: Arc<Semaphore>,
    max_unacked: usize,
    max_record_bytes: usize,
    task: JoinHandle<()>,
}

impl Producer {
    /// Starts producing to `stream`, which must exist.
    pub async fn new(
        client: Client,
        stream: impl Into<String>,
        config: ProducerConfig,
    ) -> Result<Self, Error> {
        let stream = stream.into();
        let jitter = Jitter::new(&config.clock, &stream);
        let mut worker = Worker {
            client,
            stream,
            next_seq: 0,
            open: Batch::default(),
            inflight: VecDeque::new(),
            session: None,
            flushes: Vec::new(),
            config: config.clone(),
            stopped: Arc::new(Mutex::new(None)),
            jitter,
            last_failure: None,
            retries: 0,
        };
        worker.next_seq = worker.first_connect().await?;
        // Appends queue here only until the worker picks them up; the unacked-bytes budget in
        // front of it is what bounds memory.
        let (commands, receiver) = mpsc::channel(1024);
        let stopped = worker.stopped.clone();
        let task = tokio::spawn(worker.run(receiver));
        let max_unacked = config.max_unacked_bytes.clamp(1, Semaphore::MAX_PERMITS);
        Ok(Self {
            commands,
            stopped,
            unacked: Arc::new(Semaphore::new(max_unacked)),
            max_unacked,
            max_record_bytes: config.max_record_bytes,
            task,
        })
    }

    /// Queues one record. Waits while `max_unacked_bytes` are unacknowledged. The ticket
    /// resolves to the record's sequence number once it is durable.
    pub async fn append(&self, record: Record) -> Result<AppendTicket, Error> {
        let size = record.content_bytes() as usize;
        if size > self.max_record_bytes {
            return Err(Error::Status {
                code: Code::InvalidArgument,
                message: format!(
                    "record holds {size} bytes, over the producer's max_record_bytes={}",
                    self.max_record_bytes
                ),
                retry_after: None,
                next_seq: None,
                first_seq: None,
                leader: None,
            });
        }
        let charge = size.clamp(1, self.max_unacked) as u32;
        let permit = self
            .unacked
            .clone()
            .acquire_many_owned(charge)
            .await
            .map_err(|_| self.stop_cause())?;
        let (ticket, receiver) = oneshot::channel();
        self.commands
            .send(Command::Append {
                record,
                ticket,
                permit,
            })
            .await
            .map_err(|_| self.stop_cause())?;
        Ok(AppendTicket(receiver))
    }

    /// Sends whatever is batched and waits until everything appended so far is durable.
    pub async fn flush(&self) -> Result<(), Error> {
        let (reply, done) = oneshot::channel();
        self.commands
            .send(Command::Flush(reply))
            .await
            .map_err(|_| self.stop_cause())?;
        done.await.map_err(|_| self.stop_cause())?
    }

    /// Why the producer stopped.
    fn stop_cause(&self) -> Error {
        let cause = self
            .stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        cause.unwrap_or_else(|| Error::SessionClosed("the producer stopped".into()))
    }

    /// Flushes and stops.
    pub async fn close(self) -> Result<(), Error> {
        let flushed = self.flush().await;
        drop(self.commands);
        let _ = self.task.await;
        flushed
    }
}

#[derive(Default)]
struct Batch {
    records: Vec<Record>,
    tickets: Vec<oneshot::Sender<Result<u64, Error>>>,
    permits: Vec<OwnedSemaphorePermit>,
    bytes: usize,
    opened: Option<Instant>,
}

/// A batch sent and not yet acknowledged, starting at `start`.
struct Inflight {
    start: u64,
    batch: Batch,
    /// When it was first sent: its delivery timeout runs from here.
    first_sent: Instant,
    /// Its latest attempt is sent and unanswered.
    outstanding: bool,
    /// An earlier attempt ended without a definite answer (the session broke under it, or the
    /// star answered "outcome unknown"): it may land yet.
    maybe_landed: bool,
}

impl Inflight {
    /// Whether the batch may be durable although it was never acknowledged.
    fn outcome_unknown(&self) -> bool {
        self.outstanding || self.maybe_landed
    }

    fn end(&self) -> u64 {
        self.start + self.batch.records.len() as u64
    }

    fn resolve(self) {
        for (i, ticket) in self.batch.tickets.into_iter().enumerate() {
            let _ = ticket.send(Ok(self.start + i as u64));
        }
    }

    fn fail(self, error: &Error) {
        for ticket in self.batch.tickets {
            let _ = ticket.send(Err(error.clone()));
        }
    }
}

struct Worker {
    client: Client,
    stream: String,
    /// Where the next batch starts.
    next_seq: u64,
    open: Batch,
    inflight: VecDeque<Inflight>,
    session: Option<(AppendSender, AckReceiver)>,
    flushes: Vec<oneshot::Sender<Result<(), Error>>>,
    config: ProducerConfig,
    stopped: Arc<Mutex<Option<Error>>>,
    /// Spreads backoffs apart from other producers'.
    jitter: Jitter,
    /// Why the latest attempt failed, for the error a delivery timeout gives.
    last_failure: Option<Error>,
    /// Retries since the last acknowledgement: backoffs grow with it even when each retry
    /// reconnects fine and is refused again (a star that answers and keeps refusing).
    retries: u32,
}

/// Why the current session is no longer usable.
enum Broken {
    Retry(Error),
    Fatal(Error),
}

impl Worker {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut commands_open = true;
        loop {
            let linger_until = self.open.opened.map(|at| at + self.config.linger);
            let waiting_for_ack = !self.inflight.is_empty();
            let delivery_deadline = self.delivery_deadline();
            let outcome = tokio::select! {
                // An ack that arrives with the deadline is taken first: the batch landed.
                biased;
                answer = next_answer(&mut self.session), if waiting_for_ack => self.on_ack(answer),
                _ = sleep_until(self.config.clock, delivery_deadline), if delivery_deadline.is_some() => {
                    Err(Broken::Fatal(self.timed_out()))
                }
                command = commands.recv(), if commands_open => match command {
                    Some(Command::Append { record, ticket, permit }) => {
                        self.open.bytes += record.content_bytes() as usize;
                        self.open.records.push(record);
                        self.open.tickets.push(ticket);
                        self.open.permits.push(permit);
                        let clock = self.config.clock;
                        self.open.opened.get_or_insert_with(|| clock.now());
                        if self.open.bytes >= self.config.batch_bytes
                            || self.open.records.len() >= self.config.batch_records
                        {
                            self.send_open().await
                        } else {
                            Ok(())
                        }
                    }
                    Some(Command::Flush(reply)) => {
                        self.flushes.push(reply);
                        self.send_open().await
                    }
                    None => {
                        commands_open = false;
                        self.send_open().await
                    }
                },
                _ = sleep_until(self.config.clock, linger_until), if linger_until.is_some() => self.send_open().await,
            };
            let outcome = match outcome {
                Ok(()) => Ok(()),
                Err(Broken::Retry(error)) => self.reconnect(error).await,
                Err(Broken::Fatal(error)) => Err(error),
            };
            if let Err(error) = outcome {
                self.fail_everything(&error, &mut commands).await;
                return;
            }
            if self.inflight.is_empty() && self.open.records.is_empty() {
                for flush in self.flushes.drain(..) {
                    let _ = flush.send(Ok(()));
                }
                if !commands_open {
                    self.end_session().await;
                    return;
                }
            }
        }
    }

    /// Ends the session as a client that is done does: it stops sending and reads on to the
    /// server's end of the call, so the star counts an orderly end (OK), not a cancelled call.
    /// Everything was acknowledged already; a server that does not end the call within a
    /// second is left to see it cancelled.
    async fn end_session(&mut self) {
        let Some((sender, mut receiver)) = self.session.take() else {
            return;
        };
        drop(sender);
        let drained = async { while let Ok(Some(_)) = receiver.acks.message().await {} };
        let _ = self
            .config
            .clock
            .timeout(Duration::from_secs(1), drained)
            .await;
    }

    /// Sends the open batch, if any.
    async fn send_open(&mut self) -> Result<(), Broken> {
        if self.open.records.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.open);
        let inflight = Inflight {
            start: self.next_seq,
            batch,
            first_sent: self.config.clock.now(),
            outstanding: false,
            maybe_landed: false,
        };
        self.next_seq = inflight.end();
        self.inflight.push_back(inflight);
        // Sending waits while the transport pushes back (a star whose admission is full stops
        // reading); that wait counts against the oldest batch's delivery timeout too. Answers
        // are not read meanwhile, so at the deadline those that came in are taken first: the
        // oldest batch may have been acknowledged, which moves the deadline on.
        let clock = self.config.clock;
        loop {
            let Some(deadline) = self.delivery_deadline() else {
                return Ok(());
            };
            let Some(batch) = self.inflight.back_mut() else {
                return Ok(());
            };
            // A send cut off by the deadline did not queue the batch (mpsc sends are
            // all-or-nothing), so sending it again is safe.
            if let Ok(sent) = clock
                .timeout_at(deadline, send(&mut self.session, &self.stream, batch))
                .await
            {
                return sent;
            }
            let mut answered = false;
            while let Some(answer) = next_answer(&mut self.session).now_or_never() {
                self.on_ack(answer)?;
                answered = true;
            }
            if !answered || self.delivery_deadline().is_none_or(|next| next <= deadline) {
                return Err(Broken::Fatal(self.timed_out()));
            }
        }
    }

    /// When the oldest unacknowledged batch runs out of time.
    fn delivery_deadline(&self) -> Option<Instant> {
        self.inflight
            .front()
            .map(|batch| batch.first_sent + self.config.delivery_timeout)
    }

    /// The error for the oldest batch's delivery timeout: every batch after it fails the same
    /// way (none of them can land before it does, each being sent at its place).
    fn timed_out(&self) -> Error {
        let last = self.last_failure.clone().unwrap_or_else(|| Error::Status {
            code: Code::DeadlineExceeded,
            message: "no answer came for it: nothing refused it, and nothing acknowledged it"
                .into(),
            retry_after: None,
            next_seq: None,
            first_seq: None,
            leader: None,
        });
        match self.inflight.front() {
            Some(batch) => Error::DeliveryTimeout {
                start_seq: batch.start,
                records: batch.batch.records.len() as u64,
                timeout: self.config.delivery_timeout,
                outcome_unknown: batch.outcome_unknown(),
                last: Box::new(last),
            },
            None => last,
        }
    }

    /// The session is gone: whatever it carried unanswered may land yet.
    fn session_lost(&mut self) {
        for batch in &mut self.inflight {
            if batch.outstanding {
                batch.outstanding = false;
                batch.maybe_landed = true;
            }
        }
    }

    fn on_ack(
        &mut self,
        answer: Result<Result<crate::session::Ack, Error>, Error>,
    ) -> Result<(), Broken> {
        let ack = match answer {
            Ok(ack) => ack,
            // The session ended (a status on the stream, a broken connection): that answers
            // no batch, so whatever is outstanding may land yet (`session_lost`).
            Err(error) if error.is_retryable() => return Err(Broken::Retry(error)),
            Err(error) => return Err(Broken::Fatal(error)),
        };
        match ack {
            Ok(ack) => {
                let Some(batch) = self.inflight.pop_front() else {
                    return Err(Broken::Fatal(protocol("an ack arrived for nothing sent")));
                };
                if ack.start_seq != batch.start {
                    return Err(Broken::Fatal(protocol("an ack arrived out of place")));
                }
                batch.resolve();
                self.retries = 0;
                self.last_failure = None;
                Ok(())
            }
            // A mismatch right after a reconnect means an earlier attempt of this batch was
            // admitted and is still landing: resynchronise (within the budget) rather than fail.
            Err(error)
                if error.is_retryable() || error.code() == Some(Code::FailedPrecondition) =>
            {
                // The star answers in order, so its refusal is the front batch's, and applied
                // nothing of this attempt.
                if let Some(front) = self.inflight.front_mut() {
                    front.outstanding = false;
                    front.maybe_landed |= error.is_outcome_unknown();
                }
                Err(Broken::Retry(error))
            }
            Err(error) => Err(Broken::Fatal(error)),
        }
    }

    /// The first session, retried within the budget like any other (a star at its session cap
    /// answers with a retry hint, which is honoured).
    async fn first_connect(&mut self) -> Result<u64, Error> {
        let mut attempt = 0;
        loop {
            match self.connect().await {
                Ok(tail) => return Ok(tail),
                Err(error) if error.is_retryable() => {
                    attempt += 1;
                    if attempt > self.config.max_retries {
                        return Err(Error::RetriesExhausted {
                            attempts: self.config.max_retries,
                            last: Box::new(error),
                        });
                    }
                    self.config
                        .clock
                        .sleep(self.backoff(attempt, attempt, &error))
                        .await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Opens a session and learns where the stream ends.
    async fn connect(&mut self) -> Result<u64, Error> {
        self.session = None;
        // Describing the stream finds its leader (following redirects) before the session
        // opens there.
        let tail = self.client.describe_stream(&self.stream).await?.tail_seq;
        let session = self.client.append_session_for(&self.stream).await?;
        self.session = Some(session.split());
        Ok(tail)
    }

    /// Re-establishes the session after `cause`, resolving what the star already has and
    /// sending the rest again, within the retry budget and the oldest batch's delivery timeout.
    async fn reconnect(&mut self, mut cause: Error) -> Result<(), Error> {
        self.session = None;
        self.session_lost();
        for attempt in 1..=self.config.max_retries {
            self.client.learn(&self.stream, &cause);
            self.retries = self.retries.saturating_add(1);
            let wait = self.backoff(attempt, self.retries, &cause);
            self.last_failure = Some(cause.clone());
            let deadline = self.delivery_deadline();
            let now = self.config.clock.now();
            if deadline.is_some_and(|deadline| now + wait >= deadline) {
                // The next attempt would go out past the oldest batch's timeout.
                return Err(self.timed_out());
            }
            self.client.retry_observer().tell(|| Retrying {
                what: format!("append to {:?}", self.stream),
                attempt: self.retries,
                cause: cause.clone(),
                wait,
                gives_up_in: deadline.map(|deadline| deadline.saturating_duration_since(now)),
            });
            self.config.clock.sleep(wait).await;
            match self.resynchronise().await {
                Ok(()) => return Ok(()),
                Err(Broken::Retry(error)) => {
                    self.session = None;
                    self.session_lost();
                    cause = error;
                }
                Err(Broken::Fatal(error)) => return Err(error),
            }
        }
        Err(Error::RetriesExhausted {
            attempts: self.config.max_retries,
            last: Box::new(cause),
        })
    }

    /// One attempt to carry on: a new session, the stream's tail, what landed resolved, the
    /// rest sent again in order. Each step ends at the oldest unresolved batch's delivery
    /// timeout (which moves on once the tail shows the oldest ones landed).
    async fn resynchronise(&mut self) -> Result<(), Broken> {
        let clock = self.config.clock;
        let connected = match self.delivery_deadline() {
            Some(deadline) => match clock.timeout_at(deadline, self.connect()).await {
                Ok(connected) => connected,
                Err(_) => return Err(Broken::Fatal(self.timed_out())),
            },
            None => self.connect().await,
        };
        let tail = match connected {
            Ok(tail) => tail,
            Err(error) if error.is_retryable() => return Err(Broken::Retry(error)),
            Err(error) => return Err(Broken::Fatal(error)),
        };
        // Everything below the tail landed (the producer is the stream's only writer).
        while self.inflight.front().is_some_and(|b| b.end() <= tail) {
            if let Some(batch) = self.inflight.pop_front() {
                batch.resolve();
            }
        }
        if let Some(first) = self.inflight.front()
            && first.start != tail
        {
            // An earlier attempt was admitted but is not durable yet, or another writer
            // appended: ask again after a pause, and let the budget decide.
            return Err(Broken::Retry(Error::Status {
                code: Code::FailedPrecondition,
                message: format!(
                    "stream {:?} ends at {tail}, but the producer's next batch starts at {}",
                    self.stream, first.start
                ),
                retry_after: None,
                next_seq: Some(tail),
                first_seq: None,
                leader: None,
            }));
        }
        let Some(deadline) = self.delivery_deadline() else {
            return Ok(());
        };
        let resend = async {
            for batch in &mut self.inflight {
                send(&mut self.session, &self.stream, batch).await?;
            }
            Ok(())
        };
        match clock.timeout_at(deadline, resend).await {
            Ok(resent) => resent,
            Err(_) => Err(Broken::Fatal(self.timed_out())),
        }
    }

    /// How long to wait before attempt `attempt` of an episode after `cause`: none for its
    /// first after a redirect (the leader is known), else the server's hint when it sent one,
    /// else an exponential backoff at `step` (the retries since the last acknowledgement, so
    /// it grows across reconnects that succeed and are refused again). Each wait is jittered
    /// (between half and all of it) so that producers failed by one event do not come back in
    /// lockstep.
    fn backoff(&self, attempt: u32, step: u32, cause: &Error) -> Duration {
        if cause.leader().is_some() && attempt == 1 {
            return Duration::ZERO;
        }
        let policy = RetryPolicy {
            max_attempts: self.config.max_retries.saturating_add(1),
            initial_backoff: self.config.initial_backoff,
            max_backoff: self.config.max_backoff,
        };
        // The producer counts retries from 1; the policy counts attempts, the first retry 2.
        policy.wait(step.saturating_add(1), cause, &self.jitter)
    }

    async fn fail_everything(&mut self, error: &Error, commands: &mut mpsc::Receiver<Command>) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.clone());
        commands.close();
        for batch in self.inflight.drain(..) {
            batch.fail(error);
        }
        let open = std::mem::take(&mut self.open);
        for ticket in open.tickets {
            let _ = ticket.send(Err(error.clone()));
        }
        while let Some(command) = commands.recv().await {
            match command {
                Command::Append { ticket, .. } => {
                    let _ = ticket.send(Err(error.clone()));
                }
                Command::Flush(reply) => {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
        for flush in self.flushes.drain(..) {
            let _ = flush.send(Err(error.clone()));
        }
    }
}

fn protocol(what: &str) -> Error {
    Error::Status {
        code: Code::Internal,
        message: format!("protocol error: {what}"),
        retry_after: None,
        next_seq: None,
        first_seq: None,
        leader: None,
    }
}

async fn send(
    session: &mut Option<(AppendSender, AckReceiver)>,
    stream: &str,
    batch: &mut Inflight,
) -> Result<(), Broken> {
    let Some((sender, _)) = session.as_ref() else {
        return Err(Broken::Retry(Error::SessionClosed("no session".into())));
    };
    // From here until its answer, the attempt may land.
    batch.outstanding = true;
    sender
        .send(stream, batch.batch.records.clone(), Some(batch.start))
        .await
        .map_err(Broken::Retry)
}

async fn next_answer(
    session: &mut Option<(AppendSender, AckReceiver)>,
) -> Result<Result<crate::session::Ack, Error>, Error> {
    match session.as_mut() {
        Some((_, receiver)) => receiver.next_answer().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(clock: Clock, deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => clock.sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
