//! A window of fetches that hands its results out in the order they were started, while
//! starting the next as soon as any of them lands.
//!
//! A cold read consumes sections in order, but the store answers them in any order. Kept in a
//! `FuturesOrdered`, a section that has landed still counts against the window until every
//! section before it has landed too, so one slow GET stops new ones from starting behind it
//! and the window drains. Here only the futures still running count: landed results wait,
//! in order, for the caller to take them. What they hold is bounded by the caller, which
//! charges each section before pushing it.

use std::collections::BTreeMap;
use std::future::Future;

use futures::StreamExt;
use futures::future::{Join, Ready, join, ready};
use futures::stream::FuturesUnordered;

/// Futures started in order, run at once, and handed out in the order they were pushed.
pub struct InOrder<F: Future> {
    running: FuturesUnordered<Numbered<F>>,
    /// Results that landed before an earlier one, by the number they were pushed with.
    landed: BTreeMap<u64, F::Output>,
    pushed: u64,
    handed_out: u64,
}

impl<F: Future> Default for InOrder<F> {
    fn default() -> Self {
        Self {
            running: FuturesUnordered::new(),
            landed: BTreeMap::new(),
            pushed: 0,
            handed_out: 0,
        }
    }
}

impl<F: Future> InOrder<F> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Futures started and not yet landed: what counts against a window of GETs in flight.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Whether nothing is running and nothing is left to hand out.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.landed.is_empty()
    }

    /// Starts `future`; its result is handed out after those of every future pushed before it.
    pub fn push(&mut self, future: F) {
        self.running.push(join(ready(self.pushed), future));
        self.pushed += 1;
    }

    /// The next result in order, if it has landed.
    pub fn ready(&mut self) -> Option<F::Output> {
        let output = self.landed.remove(&self.handed_out)?;
        self.handed_out += 1;
        Some(output)
    }

    /// Waits for any running future to land and keeps its result for [`InOrder::ready`].
    /// `false` if none is running.
    pub async fn land(&mut self) -> bool {
        match self.running.next().await {
            Some((number, output)) => {
                self.landed.insert(number, output);
                true
            }
            None => false,
        }
    }

    /// The next result in order, waiting for it to land (starting nothing new meanwhile).
    /// `None` once everything pushed has been handed out.
    pub async fn next(&mut self) -> Option<F::Output> {
        loop {
            if let Some(output) = self.ready() {
                return Some(output);
            }
            if !self.land().await {
                return None;
            }
        }
    }
}

/// A future paired with the number it was pushed with, given back beside its output.
type Numbered<F> = Join<Ready<u64>, F>;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn results_come_out_in_order_and_only_running_futures_count() {
        let mut window = InOrder::new();
        let mut senders = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = oneshot::channel::<u32>();
            senders.push(tx);
            window.push(async move { rx.await.unwrap() });
        }
        assert_eq!(window.running(), 3);
        // The last two land first: they stop counting as running, but wait for the first.
        let first = senders.remove(0);
        for (i, tx) in senders.into_iter().enumerate() {
            tx.send(i as u32 + 1).unwrap();
        }
        assert!(window.land().await);
        assert!(window.land().await);
        assert_eq!(window.running(), 1);
        assert_eq!(window.ready(), None, "the first has not landed");
        first.send(0).unwrap();
        assert_eq!(window.next().await, Some(0));
        assert_eq!(window.next().await, Some(1));
        assert_eq!(window.next().await, Some(2));
        assert_eq!(window.next().await, None);
        assert!(window.is_empty());
    }
}
