//! A history of appends and reads on streams, recorded by test producers and consumers while
//! stars come and go, and a checker that it is what a linearizable log allows:
//!
//! - **no lost write**: every acknowledged record is in the stream at the sequence number its
//!   acknowledgement gave;
//! - **no duplicate**: no record body is in a stream twice;
//! - **reads agree with the log**: every record a read returned is the record the stream holds
//!   at that sequence number;
//! - **no read goes backwards**: a read that began after another read of the stream ended sees a
//!   tail at least as far;
//! - **acknowledged means visible**: a read that began after an append was acknowledged sees a
//!   tail past that append.
//!
//! Record bodies must be unique per stream (producers number them).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Clone)]
enum Event {
    Acked {
        stream: String,
        body: String,
        seq: u64,
        at: Instant,
    },
    Read {
        stream: String,
        began: Instant,
        ended: Instant,
        records: Vec<(u64, String)>,
        tail: u64,
    },
}

/// Events recorded from many tasks at once. Bounded by what a test records.
#[derive(Debug, Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// An append of `body` acknowledged at `seq`, at `at` (when the ack arrived).
    pub fn acked(&self, stream: &str, body: &str, seq: u64) {
        lock(&self.events).push(Event::Acked {
            stream: stream.to_owned(),
            body: body.to_owned(),
            seq,
            at: Instant::now(),
        });
    }

    /// A read of `stream` that began at `began` and returned `records` (seq, body) and `tail`.
    pub fn read(&self, stream: &str, began: Instant, records: Vec<(u64, String)>, tail: u64) {
        lock(&self.events).push(Event::Read {
            stream: stream.to_owned(),
            began,
            ended: Instant::now(),
            records,
            tail,
        });
    }

    pub fn len(&self) -> usize {
        lock(&self.events).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the history against each stream's final contents (`finals`: stream to its
    /// records from seq 0). Returns every violation found, described.
    pub fn check(&self, finals: &HashMap<String, Vec<String>>) -> Vec<String> {
        let events = lock(&self.events).clone();
        let mut problems = Vec::new();
        for (stream, records) in finals {
            let mut seen: HashMap<&str, usize> = HashMap::new();
            for (seq, body) in records.iter().enumerate() {
                if let Some(first) = seen.insert(body, seq) {
                    problems.push(format!("{stream}: {body} is at {first} and again at {seq}"));
                }
            }
        }
        // From the producers' acknowledgements alone: no sequence number given to two records.
        let mut given: HashMap<(&str, u64), &str> = HashMap::new();
        for event in &events {
            if let Event::Acked {
                stream, body, seq, ..
            } = event
                && let Some(other) = given.insert((stream, *seq), body)
                && other != body
            {
                problems.push(format!(
                    "{stream}: seq {seq} was acknowledged for {other} and again for {body}"
                ));
            }
        }
        // Per stream: acks by time, reads by start.
        let mut acks: BTreeMap<&str, Vec<(Instant, u64)>> = BTreeMap::new();
        let mut reads: BTreeMap<&str, Vec<(Instant, Instant, u64)>> = BTreeMap::new();
        for event in &events {
            match event {
                Event::Acked {
                    stream,
                    body,
                    seq,
                    at,
                } => {
                    let held = finals.get(stream).and_then(|r| r.get(*seq as usize));
                    if held != Some(body) {
                        problems.push(format!(
                            "{stream}: {body} was acknowledged at {seq}, but the stream holds {held:?} there"
                        ));
                    }
                    acks.entry(stream).or_default().push((*at, *seq));
                }
                Event::Read {
                    stream,
                    began,
                    ended,
                    records,
                    tail,
                } => {
                    for (seq, body) in records {
                        let held = finals.get(stream).and_then(|r| r.get(*seq as usize));
                        if held != Some(body) {
                            problems.push(format!(
                                "{stream}: a read returned {body} at {seq}, but the stream holds {held:?} there"
                            ));
                        }
                    }
                    reads
                        .entry(stream)
                        .or_default()
                        .push((*began, *ended, *tail));
                }
            }
        }
        for (stream, reads) in &reads {
            // The farthest tail seen by a read that ended before each read began.
            let mut by_end = reads.clone();
            by_end.sort_by_key(|(_, ended, _)| *ended);
            for (began, _, tail) in reads {
                let before = by_end
                    .iter()
                    .take_while(|(_, ended, _)| ended < began)
                    .map(|(_, _, t)| *t)
                    .max();
                if let Some(before) = before
                    && *tail < before
                {
                    problems.push(format!(
                        "{stream}: a read saw the tail at {tail}, after an earlier read saw {before}"
                    ));
                }
                let acked_before = acks
                    .get(stream)
                    .into_iter()
                    .flatten()
                    .filter(|(at, _)| at < began)
                    .map(|(_, seq)| seq + 1)
                    .max();
                if let Some(acked) = acked_before
                    && *tail < acked
                {
                    problems.push(format!(
                        "{stream}: a read saw the tail at {tail}, after a record at {} was acknowledged",
                        acked - 1
                    ));
                }
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finals(records: &[&str]) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "s".to_owned(),
            records.iter().map(|r| r.to_string()).collect(),
        )])
    }

    #[test]
    fn a_consistent_history_passes() {
        let history = History::new();
        history.acked("s", "a", 0);
        let began = Instant::now();
        history.read("s", began, vec![(0, "a".into())], 1);
        history.acked("s", "b", 1);
        let began = Instant::now();
        history.read("s", began, vec![(1, "b".into())], 2);
        assert_eq!(history.check(&finals(&["a", "b"])), Vec::<String>::new());
    }

    #[test]
    fn lost_duplicated_and_misplaced_records_are_caught() {
        let history = History::new();
        history.acked("s", "a", 0);
        history.acked("s", "b", 1);
        let problems = history.check(&finals(&["a", "a"]));
        assert!(
            problems.iter().any(|p| p.contains("again at 1")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("b was acknowledged at 1")),
            "{problems:?}"
        );
        let problems = history.check(&finals(&["a"]));
        assert!(
            problems.iter().any(|p| p.contains("holds None")),
            "{problems:?}"
        );
    }

    /// Two stars acknowledging one sequence number for different records is caught from the
    /// acknowledgements alone, whatever the stream holds in the end.
    #[test]
    fn a_sequence_number_acknowledged_twice_is_caught() {
        let history = History::new();
        history.acked("s", "a", 0);
        history.acked("s", "b", 0);
        let problems = history.check(&HashMap::new());
        assert!(
            problems
                .iter()
                .any(|p| p.contains("seq 0 was acknowledged for a and again for b")),
            "{problems:?}"
        );
    }

    #[test]
    fn reads_going_backwards_or_missing_acknowledged_records_are_caught() {
        let history = History::new();
        let began = Instant::now();
        history.read("s", began, vec![(0, "a".into()), (1, "b".into())], 2);
        let began = Instant::now();
        history.read("s", began, vec![], 1);
        let problems = history.check(&finals(&["a", "b"]));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("after an earlier read saw 2")),
            "{problems:?}"
        );

        let history = History::new();
        history.acked("s", "a", 0);
        history.acked("s", "b", 1);
        let began = Instant::now();
        history.read("s", began, vec![(0, "a".into())], 1);
        let problems = history.check(&finals(&["a", "b"]));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("record at 1 was acknowledged")),
            "{problems:?}"
        );

        let history = History::new();
        let began = Instant::now();
        history.read("s", began, vec![(0, "x".into())], 1);
        let problems = history.check(&finals(&["a"]));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("a read returned x at 0")),
            "{problems:?}"
        );
    }
}
