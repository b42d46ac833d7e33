//! Writing one object to every zone at once and deciding, as the answers come in, whether a
//! quorum holds it.
//!
//! Each zone gets a conditional create (`put_if_absent`), retried on transient errors with the
//! chain's backoff until the deadline. A zone *holds* the object when the create succeeds, or
//! when the object already there is ours (an earlier attempt landed and its answer was lost:
//! same size, same footer and trailer). A zone *refuses* it when another writer's object is
//! there, and *rejects* it on a permanent error. A zone with no answer by the deadline is
//! *unanswered*: its write may still land.
//!
//! The call returns as soon as the outcome is decided. Once a quorum holds the object the zone
//! writes still running get `STRAGGLER_GRACE` to finish (so a healthy zone a little behind the
//! others still ends up holding it) and then stop; short of a quorum they run on until the
//! deadline, since a late write may still make one. Every zone write is a task bounded by the deadline, and a caller has at most as
//! many objects in flight as its express buffer admits, so the tasks are bounded too.
//!
//! The outcome, for `n` zones and quorum `q`:
//! - `Quorum`: `q` zones hold it. Durable: any later quorum read finds it.
//! - `Fenced`: `q` zones hold another writer's object at the key; it can never reach a quorum.
//! - `NotHeld`: it can never reach a quorum (too many zones refused or rejected it, or gave no
//!   answer while fewer than `q` could still hold it): answered as not acknowledged.
//! - `Unknown`: the deadline passed with fewer than `q` holding it, but with the unanswered
//!   zones a quorum might: answered as "outcome unknown", for a recovery to settle.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use nova_core::object_store::{CreateOutcome, ObjectStore, PutPayload};

use super::Zones;
use crate::config::Backoff;
use crate::writer::is_ours;

/// How long the zone writes still running once a quorum holds an object go on: enough for a
/// healthy zone a little behind the others to finish (a copy in every zone makes a successor's
/// walk cheaper), short enough that a dead zone holds each bundle's bytes only briefly past its
/// quorum.
pub const STRAGGLER_GRACE: Duration = Duration::from_millis(100);

/// What one zone answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneAnswer {
    Held,
    /// Another writer's object is at the key.
    Refused,
    /// A permanent error: the zone did not write it.
    Rejected,
    /// No answer by the deadline: the write may still land.
    Unanswered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Quorum,
    Fenced,
    NotHeld,
    Unknown,
}

/// The outcome, with each zone's answer as known when it was decided (`Unanswered` for a zone
/// still writing) and how long each zone that held it took.
#[derive(Debug, Clone)]
pub struct Publication {
    pub outcome: Outcome,
    pub answers: Vec<ZoneAnswer>,
    pub latencies: Vec<Option<Duration>>,
}

/// Writes `payload` at `key` in every zone and returns once a quorum holds it, once it never
/// can, or at `deadline` (see the module's comment).
pub async fn publish(
    zones: &Zones,
    key: &str,
    payload: PutPayload,
    deadline: Duration,
    backoff: &Backoff,
) -> Publication {
    publish_holding(zones, key, payload, deadline, backoff, Arc::new(())).await
}

/// `publish`, with `hold` kept by every zone write until it ends: what charges the payload's
/// bytes must outlive the writes still sending them, not only the outcome.
pub async fn publish_holding<H: Send + Sync + 'static>(
    zones: &Zones,
    key: &str,
    payload: PutPayload,
    deadline: Duration,
    backoff: &Backoff,
    hold: Arc<H>,
) -> Publication {
    publish_until(zones, key, payload, deadline, backoff, false, hold).await
}

/// Like `publish`, but short of a quorum it waits for every zone's answer (up to the deadline)
/// rather than returning once the outcome is certain: a successor deciding a slot's fate needs
/// to know what every zone holds.
pub(crate) async fn publish_until<H: Send + Sync + 'static>(
    zones: &Zones,
    key: &str,
    payload: PutPayload,
    deadline: Duration,
    backoff: &Backoff,
    every_answer: bool,
    hold: Arc<H>,
) -> Publication {
    let n = zones.len();
    let quorum = zones.quorum();
    let clock = backoff.clock;
    let (answers_tx, mut answers_rx) = mpsc::channel::<(usize, ZoneAnswer, Duration)>(n);
    // Set once a quorum holds the object: the zone writes still running get a short grace,
    // then stop, so a dead zone does not keep every bundle's bytes for a whole deadline.
    let (held_tx, held_rx) = watch::channel(false);
    for (index, zone) in zones.iter().enumerate() {
        let store = zone.store.clone();
        let key = key.to_owned();
        let payload = payload.clone();
        let backoff = backoff.clone();
        let answers = answers_tx.clone();
        let hold = hold.clone();
        let mut held = held_rx.clone();
        tokio::spawn(async move {
            let _hold = hold;
            let started = clock.now();
            let straggling = async {
                let reached = held.wait_for(|held| *held).await.is_ok();
                if reached {
                    clock.sleep(STRAGGLER_GRACE).await;
                } else {
                    // Decided otherwise: a late write may still matter, so it runs on.
                    std::future::pending::<()>().await;
                }
            };
            let answer = tokio::select! {
                answer = clock.timeout(deadline, write_one(store, &key, payload, &backoff)) => {
                    answer.unwrap_or(ZoneAnswer::Unanswered)
                }
                _ = straggling => ZoneAnswer::Unanswered,
            };
            // The receiver is gone once the outcome was decided: nobody needs this answer.
            let _ = answers.send((index, answer, clock.since(started))).await;
        });
    }
    drop(answers_tx);
    let mut answers = vec![ZoneAnswer::Unanswered; n];
    let mut latencies = vec![None; n];
    let mut pending = n;
    let decided = clock
        .timeout(deadline, async {
            while let Some((index, answer, took)) = answers_rx.recv().await {
                answers[index] = answer;
                pending -= 1;
                if answer == ZoneAnswer::Held {
                    latencies[index] = Some(took);
                }
                let decided = decide(&answers, quorum, false);
                if let Some(outcome) = decided
                    && (!every_answer || pending == 0 || outcome == Outcome::Quorum)
                {
                    return outcome;
                }
            }
            // Every zone answered and nothing was decided: only possible when every answer was
            // unanswered at the zone's own deadline.
            decide(&answers, quorum, true).unwrap_or(Outcome::Unknown)
        })
        .await;
    let outcome = match decided {
        Ok(outcome) => outcome,
        Err(_) => decide(&answers, quorum, true).unwrap_or(Outcome::Unknown),
    };
    if outcome == Outcome::Quorum {
        let _ = held_tx.send(true);
    }
    Publication {
        outcome,
        answers,
        latencies,
    }
}

/// The outcome once it is certain, given the answers so far. At the deadline (`final_`) an
/// undecided outcome is `Unknown`.
///
/// Every `Unanswered` entry counts as a zone that may yet hold the object: a zone still writing,
/// and just as much a zone whose own timeout fired, since its last PUT may have been sent and
/// may still land. Counting only the zones still writing would answer a producer "never
/// acknowledged" for a bundle that a late PUT then completes into a quorum, which a seal or a
/// successor would carry: a retry would store its records twice.
fn decide(answers: &[ZoneAnswer], quorum: usize, final_: bool) -> Option<Outcome> {
    let count = |a: ZoneAnswer| answers.iter().filter(|x| **x == a).count();
    let held = count(ZoneAnswer::Held);
    let refused = count(ZoneAnswer::Refused);
    let unanswered = count(ZoneAnswer::Unanswered);
    if held >= quorum {
        return Some(Outcome::Quorum);
    }
    if refused >= quorum {
        return Some(Outcome::Fenced);
    }
    if held + unanswered < quorum {
        return Some(Outcome::NotHeld);
    }
    final_.then_some(Outcome::Unknown)
}

/// One zone's write: retried on transient errors until it is decided (the caller bounds it by
/// the deadline).
async fn write_one(
    store: Arc<dyn ObjectStore>,
    key: &str,
    payload: PutPayload,
    backoff: &Backoff,
) -> ZoneAnswer {
    let mut attempt = 0u32;
    // Whether an earlier attempt may have written it (a timeout, a lost answer): a permanent
    // error after one does not say the zone does not hold it.
    let mut uncertain = false;
    loop {
        attempt += 1;
        let error = match store.put_if_absent(key, payload.clone()).await {
            Ok(CreateOutcome::Created) => return ZoneAnswer::Held,
            Ok(CreateOutcome::AlreadyExists) => {
                match is_ours(store.as_ref(), key, &payload).await {
                    Ok(true) => return ZoneAnswer::Held,
                    Ok(false) => return ZoneAnswer::Refused,
                    Err(error) => error,
                }
            }
            Err(error) => error,
        };
        if !error.is_retryable() {
            tracing::warn!(key, "express zone write rejected: {error}");
            return if uncertain {
                ZoneAnswer::Unanswered
            } else {
                ZoneAnswer::Rejected
            };
        }
        uncertain = true;
        backoff.clock.sleep(backoff.delay(attempt)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ZoneAnswer::*;

    #[test]
    fn a_majority_decides_and_the_deadline_leaves_the_rest_unknown() {
        // Three zones, quorum two.
        assert_eq!(
            decide(&[Held, Held, Unanswered], 2, false),
            Some(Outcome::Quorum)
        );
        assert_eq!(decide(&[Held, Unanswered, Unanswered], 2, false), None);
        assert_eq!(
            decide(&[Refused, Refused, Unanswered], 2, false),
            Some(Outcome::Fenced)
        );
        // One held, two rejected: it can never reach two.
        assert_eq!(
            decide(&[Held, Rejected, Rejected], 2, false),
            Some(Outcome::NotHeld)
        );
        assert_eq!(
            decide(&[Held, Refused, Rejected], 2, false),
            Some(Outcome::NotHeld)
        );
        // A zone that timed out on its own may still land its PUT: never "not held" while
        // one held and one timed out could yet make two.
        assert_eq!(decide(&[Held, Unanswered, Rejected], 2, false), None);
        // At the deadline: one held and one silent might be two.
        assert_eq!(
            decide(&[Held, Unanswered, Rejected], 2, true),
            Some(Outcome::Unknown)
        );
        assert_eq!(
            decide(&[Unanswered, Rejected, Rejected], 2, true),
            Some(Outcome::NotHeld)
        );
    }
}
