//! One stream's live positions as its star holds them: the next sequence number to assign, the
//! acknowledged tail, the absorbed tail, its trim point, and whether it is led, released,
//! deposed or deleted. The registry of every stream a star leads is `streams`.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use nova_core::catalog::{Retention, StorageClass, StreamMeta, StreamTail};
use nova_core::clock::{Clock, Instant};
use nova_core::metastore::Compare;
use nova_proto::RequestError;

/// The retry hint of an append refused while its stream is handed to another star.
const HANDOFF_RETRY_AFTER: Duration = Duration::from_millis(100);

/// Terms of leadership handed out in this process (`StreamState::term`).
static TERMS: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub struct StreamState {
    pub meta: StreamMeta,
    /// Next sequence number to assign. Written only by the packer, which owns sequencing.
    next_seq: AtomicU64,
    /// One past the last acknowledged record.
    acked: AtomicU64,
    /// Encoded bytes of the acknowledged records.
    stored_bytes: AtomicU64,
    deleted: AtomicBool,
    /// Being handed to another star, in a fleet: appends are refused from here on.
    released: AtomicBool,
    /// In a fleet, what this star leads the stream under: a compare on its leader record at
    /// the version this star wrote when it took the stream up. Each batch is sequenced under
    /// it, and the absorb of the batch's records compares it, so a star whose leadership moved
    /// on can commit neither index entries nor a tail. `None` outside a fleet.
    leadership: parking_lot::Mutex<Option<Compare>>,
    /// See `term`.
    term: AtomicU64,
    /// An absorb found the leadership moved while this star held records of the stream: its
    /// appends are refused, and those not yet answered are not acknowledged.
    deposed: AtomicBool,
    /// Held by the packer from the refusal check to the sequence assignment, and by a release
    /// setting `released`: once a release holds it, no batch can be between the two.
    admitting: parking_lot::Mutex<()>,
    /// A delete of this stream has an unknown outcome: appends are refused until a delete
    /// settles it (or a restart finds what the catalog says).
    in_doubt: AtomicBool,
    /// The retention as last set (`meta` holds the one it was created or loaded with).
    pub(crate) retention: parking_lot::Mutex<Retention>,
    /// The first record the stream holds as this star last read it from the catalog (retention
    /// moves it), and when it read it (`None`: never). Monotonic: a wall clock stepped back
    /// would keep a trim point read long ago fresh for as long as the step.
    first_seq: AtomicU64,
    first_seq_read: parking_lot::Mutex<Option<Instant>>,
    /// Wakes readers waiting at the tail.
    tail_moved: tokio::sync::Notify,
    /// Records and content bytes acknowledged since this star loaded the stream, for its
    /// metrics (`stream_series`).
    appended_records: AtomicU64,
    appended_bytes: AtomicU64,
    /// The storage class as last set, as `StorageClass::code` (`meta` holds the one it was
    /// created or loaded with). Changed only while `reclassing` refuses appends.
    class: AtomicU8,
    /// Its storage class is being changed: appends are refused until every one admitted before
    /// is absorbed and the new class is in the catalog.
    reclassing: AtomicBool,
    /// Held for the whole of a change of storage class, and tried by a handoff: one change at
    /// a time, and never beside a handoff.
    pub(crate) class_change: tokio::sync::Mutex<()>,
}

impl StreamState {
    pub fn new(meta: StreamMeta, tail: StreamTail) -> Self {
        let class = meta.class.code();
        Self {
            next_seq: AtomicU64::new(tail.tail_seq),
            acked: AtomicU64::new(tail.tail_seq),
            stored_bytes: AtomicU64::new(tail.stored_bytes),
            deleted: AtomicBool::new(false),
            released: AtomicBool::new(false),
            leadership: parking_lot::Mutex::new(None),
            term: AtomicU64::new(0),
            deposed: AtomicBool::new(false),
            admitting: parking_lot::Mutex::new(()),
            in_doubt: AtomicBool::new(false),
            retention: parking_lot::Mutex::new(meta.retention),
            meta,
            first_seq: AtomicU64::new(0),
            first_seq_read: parking_lot::Mutex::new(None),
            tail_moved: tokio::sync::Notify::new(),
            appended_records: AtomicU64::new(0),
            appended_bytes: AtomicU64::new(0),
            class: AtomicU8::new(class),
            reclassing: AtomicBool::new(false),
            class_change: tokio::sync::Mutex::new(()),
        }
    }

    /// The storage class appends are admitted under now.
    pub fn class(&self) -> StorageClass {
        StorageClass::from_code(self.class.load(Ordering::Acquire)).unwrap_or(self.meta.class)
    }

    /// The class the catalog now records for the stream.
    pub(crate) fn set_class(&self, class: StorageClass) {
        self.class.store(class.code(), Ordering::Release);
    }

    /// Refuses appends from now on (`true`) while the storage class changes, or takes them
    /// again. Like `set_released`, returns once no batch is between its refusal check and its
    /// sequence assignment.
    pub fn set_reclassing(&self, reclassing: bool) {
        let _admitting = self.admitting.lock();
        self.reclassing.store(reclassing, Ordering::Release);
    }

    /// Counts an acknowledged batch in the stream's append metrics.
    pub(crate) fn count_appended(&self, records: u64, content_bytes: u64) {
        self.appended_records.fetch_add(records, Ordering::Relaxed);
        self.appended_bytes
            .fetch_add(content_bytes, Ordering::Relaxed);
    }

    /// Records and content bytes acknowledged since this star loaded the stream.
    pub fn appended(&self) -> (u64, u64) {
        (
            self.appended_records.load(Ordering::Relaxed),
            self.appended_bytes.load(Ordering::Relaxed),
        )
    }

    pub fn id(&self) -> u64 {
        self.meta.id
    }

    pub fn name(&self) -> &str {
        &self.meta.name
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq.load(Ordering::Acquire)
    }

    pub(crate) fn set_next_seq(&self, seq: u64) {
        self.next_seq.store(seq, Ordering::Release);
    }

    /// The acknowledged tail: every record below it is durable and readable.
    pub fn tail(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes.load(Ordering::Relaxed)
    }

    /// Puts the stream back at `tail`, forgetting what this star acknowledged past it: for a
    /// deposed stream taken up again, whose records past the absorbed tail never reached the
    /// index.
    pub(crate) fn reset_tail(&self, tail: StreamTail) {
        let _admitting = self.admitting.lock();
        self.next_seq.store(tail.tail_seq, Ordering::Release);
        self.acked.store(tail.tail_seq, Ordering::Release);
        self.stored_bytes
            .store(tail.stored_bytes, Ordering::Relaxed);
        self.tail_moved.notify_waiters();
    }

    /// Publishes a new acknowledged tail. Callers make the records readable first.
    pub(crate) fn advance_tail(&self, tail: u64, added_bytes: u64) {
        self.stored_bytes.fetch_add(added_bytes, Ordering::Relaxed);
        self.acked.fetch_max(tail, Ordering::AcqRel);
        self.tail_moved.notify_waiters();
    }

    /// Waits until the tail passes `seq`, the stream is deleted, or `timeout` elapses, and
    /// returns the tail then. Holds nothing but a registration with the stream's notifier.
    pub async fn wait_past(&self, seq: u64, timeout: std::time::Duration, clock: Clock) -> u64 {
        let deadline = clock.now() + timeout;
        loop {
            // Register before checking, so an advance between the check and the wait is seen.
            let notified = self.tail_moved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let tail = self.tail();
            if tail > seq || self.is_deleted() {
                return tail;
            }
            if clock.timeout_at(deadline, notified).await.is_err() {
                return self.tail();
            }
        }
    }

    pub fn retention(&self) -> Retention {
        *self.retention.lock()
    }

    /// The first record the stream holds as this star last read it (0 before it read it).
    pub fn first_seq_cached(&self) -> u64 {
        self.first_seq.load(Ordering::Acquire)
    }

    /// The first record the stream holds, as last read, if it was read within `fresh` of now
    /// (`None`: read at all).
    pub(crate) fn first_seq_if_fresh(&self, clock: Clock, fresh: Option<Duration>) -> Option<u64> {
        let read = (*self.first_seq_read.lock())?;
        fresh
            .is_none_or(|fresh| clock.since(read) <= fresh)
            .then(|| self.first_seq.load(Ordering::Acquire))
    }

    pub(crate) fn set_first_seq(&self, first_seq: u64, read: Instant) {
        self.first_seq.fetch_max(first_seq, Ordering::AcqRel);
        *self.first_seq_read.lock() = Some(read);
    }

    /// Refuses appends from now on (`true`), or takes them again. Returns once no batch is
    /// between its refusal check and its sequence assignment, so `next_seq` read after a
    /// release is final.
    pub fn set_released(&self, released: bool) {
        let _admitting = self.admitting.lock();
        self.released.store(released, Ordering::Release);
    }

    /// Whether appends are refused because the stream is being handed to another star.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Leads the stream from now on under `guard` (see `leadership`), taking appends again.
    /// Like `set_released`, returns once no batch is between its refusal check and its
    /// sequence assignment: every batch sequenced after it carries the new guard.
    pub fn lead_under(&self, guard: Option<Compare>) {
        self.term
            .store(TERMS.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Release);
        self.keep_leading_under(guard);
    }

    /// Goes on leading under another guard, in the same term: a handoff that could not tell
    /// whether its move applied took the record back, and this star never stopped leading.
    pub fn keep_leading_under(&self, guard: Option<Compare>) {
        let _admitting = self.admitting.lock();
        *self.leadership.lock() = guard;
        self.deposed.store(false, Ordering::Release);
        self.released.store(false, Ordering::Release);
    }

    /// The guard batches are sequenced under now.
    /// This process's term of leading the stream: a number no other term of any stream here
    /// has had, new each time the stream is taken up (0 while it never was, as on a single
    /// star). What a term learned of the stream (a Kafka producer's recent batches) holds only
    /// within it: in between, another star may have written it.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    pub fn leadership(&self) -> Option<Compare> {
        self.leadership.lock().clone()
    }

    /// The leadership moved on while this star held records of the stream.
    pub(crate) fn depose(&self) {
        let _admitting = self.admitting.lock();
        self.deposed.store(true, Ordering::Release);
    }

    /// Whether an absorb found this star's leadership of the stream gone.
    pub fn is_deposed(&self) -> bool {
        self.deposed.load(Ordering::Acquire)
    }

    /// Held while the packer checks and assigns a batch's sequence numbers.
    pub(crate) fn admitting(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.admitting.lock()
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// The stream is gone: appends are refused, and reads waiting at its tail wake to see it.
    pub(crate) fn set_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.tail_moved.notify_waiters();
    }

    /// A delete of the stream has an unknown outcome: appends are refused until a delete
    /// settles it.
    pub(crate) fn mark_in_doubt(&self) {
        self.in_doubt.store(true, Ordering::Release);
    }

    /// Why an append to this stream is refused now, if it is.
    pub fn refusal(&self) -> Option<RequestError> {
        if self.is_deposed() {
            Some(RequestError::Unavailable(format!(
                "this star no longer leads stream {:?}: another star took its leadership; \
                 retry (the SDK asks the fleet for the new leader)",
                self.name()
            )))
        } else if self.released.load(Ordering::Acquire) {
            // A handoff takes as long as landing and absorbing what is in flight: come back
            // soon, to the new leader by then.
            Some(RequestError::UnavailableFor {
                reason: format!(
                    "stream {:?} is being handed to another star; retry (the SDK follows the \
                     redirect to its new leader)",
                    self.name()
                ),
                retry_after: HANDOFF_RETRY_AFTER,
            })
        } else if self.reclassing.load(Ordering::Acquire) {
            Some(RequestError::UnavailableFor {
                reason: format!(
                    "stream {:?} is changing its storage class; retry (it takes as long as \
                     landing the appends in flight)",
                    self.name()
                ),
                retry_after: HANDOFF_RETRY_AFTER,
            })
        } else if self.is_deleted() {
            Some(RequestError::StreamNotFound(self.name().to_owned()))
        } else if self.in_doubt.load(Ordering::Acquire) {
            Some(RequestError::Unavailable(format!(
                "a delete of stream {:?} has an unknown outcome; delete it again to settle it",
                self.name()
            )))
        } else {
            None
        }
    }

    pub fn tail_snapshot(&self) -> StreamTail {
        StreamTail {
            tail_seq: self.tail(),
            stored_bytes: self.stored_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use nova_core::clock::ClockSkew;

    use super::*;

    /// A trim point read a second ago is stale however the wall clock stepped meanwhile: one
    /// stepped back an hour would otherwise keep it fresh for the hour, and readers would be
    /// answered from a trim point retention has long passed.
    #[tokio::test(start_paused = true)]
    async fn a_trim_point_goes_stale_whatever_the_wall_clock_does() {
        let skew: &'static ClockSkew = Box::leak(Box::default());
        let origin = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let clock = Clock::simulated(origin).skewed(skew);
        let meta = StreamMeta {
            id: 1,
            name: "s".into(),
            created_at_ms: 0,
            class: StorageClass::Standard,
            retention: Retention::default(),
        };
        let stream = StreamState::new(meta, StreamTail::default());
        let fresh = Some(Duration::from_secs(1));
        assert_eq!(stream.first_seq_if_fresh(clock, None), None, "never read");
        stream.set_first_seq(10, clock.now());
        assert_eq!(stream.first_seq_if_fresh(clock, fresh), Some(10));
        skew.set_ms(-3_600_000);
        clock.sleep(Duration::from_millis(1500)).await;
        assert_eq!(stream.first_seq_if_fresh(clock, fresh), None, "stale");
        // Still what to answer with when the catalog cannot be read.
        assert_eq!(stream.first_seq_if_fresh(clock, None), Some(10));
    }
}
