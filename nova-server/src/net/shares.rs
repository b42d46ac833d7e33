//! What one client may hold of a shared budget. The budgets bound memory; they do not stop one
//! client from taking all of a budget and keeping everybody else waiting. So where a client
//! can hold a budget's bytes for as long as it likes (a message whose body it trickles, a
//! response it does not take), what it holds is also counted against its share:
//! `--max-client-share-percent` of the budget (half by default).
//!
//! A client is a token: shares apply when the server checks tokens (`--auth-tokens`). Without
//! tokens every client is trusted with everything (it may delete streams), and clients on one
//! host, or a tier of gateways behind one address, could not be told apart anyway.
//!
//! A share is a fairness limit inside the budget, not a second budget: a client holding
//! nothing always gets its first take, however large, so a share smaller than one message never
//! locks a client out.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Principal;

/// Who is charged: the call's token (none when the server checks no tokens).
pub fn holder(principal: Option<&Principal>) -> Option<String> {
    principal.map(|principal| principal.name.clone())
}

/// Shares of one budget, by holder. Holds an entry only for a holder holding something, so
/// at most one per charge outstanding.
#[derive(Debug)]
pub struct Shares {
    cap: u64,
    held: Mutex<HashMap<String, Held>>,
}

/// What one holder holds, and who waits for it to free.
#[derive(Debug, Default)]
struct Held {
    bytes: u64,
    /// Wakes that holder's waiting takers (nobody else's) when it gives back.
    freed: Arc<tokio::sync::Notify>,
}

impl Shares {
    /// Shares of `percent` of a budget of `budget` bytes.
    pub fn of(budget: u64, percent: u8) -> Arc<Self> {
        let share = budget as u128 * percent.min(100) as u128 / 100;
        Self::new((share as u64).max(1))
    }

    /// Shares of `cap` bytes each.
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: Mutex::new(HashMap::new()),
        })
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// What `holder` holds now.
    pub fn held(&self, holder: &str) -> u64 {
        self.held.lock().get(holder).map_or(0, |held| held.bytes)
    }

    /// Takes `bytes` for `holder` if they fit its share (or it holds nothing yet).
    pub fn try_take(self: &Arc<Self>, holder: &str, bytes: u64) -> Option<Share> {
        let mut held = self.held.lock();
        self.take_locked(&mut held, holder, bytes).ok()
    }

    /// Takes `bytes` with the map locked, or says whose releases to wait for.
    fn take_locked(
        self: &Arc<Self>,
        held: &mut HashMap<String, Held>,
        holder: &str,
        bytes: u64,
    ) -> Result<Share, Arc<tokio::sync::Notify>> {
        match held.get_mut(holder) {
            Some(entry) if entry.bytes > 0 && entry.bytes.saturating_add(bytes) > self.cap => {
                Err(entry.freed.clone())
            }
            Some(entry) => {
                entry.bytes += bytes;
                Ok(self.share(holder, bytes))
            }
            None => {
                held.insert(
                    holder.to_owned(),
                    Held {
                        bytes,
                        ..Held::default()
                    },
                );
                Ok(self.share(holder, bytes))
            }
        }
    }

    fn share(self: &Arc<Self>, holder: &str, bytes: u64) -> Share {
        Share {
            shares: self.clone(),
            holder: holder.to_owned(),
            bytes,
        }
    }

    /// Takes `bytes` for `holder` once they fit its share: the holder's own charges block it,
    /// nobody else's, and only its own releases wake it.
    pub async fn take_waiting(self: &Arc<Self>, holder: &str, bytes: u64) -> Share {
        loop {
            let freed;
            let mut notified;
            {
                // The wait is registered before the lock is let go: a release, which needs
                // the lock, cannot fall between the look and the registration.
                let mut held = self.held.lock();
                match self.take_locked(&mut held, holder, bytes) {
                    Ok(share) => return share,
                    Err(notify) => freed = notify,
                }
                notified = Box::pin(freed.notified());
                notified.as_mut().enable();
            }
            notified.await;
        }
    }

    /// Takes `bytes` for `holder` whatever it holds: a charge already made elsewhere, counted
    /// so that the holder's next request sees it.
    pub fn take(self: &Arc<Self>, holder: &str, bytes: u64) -> Share {
        self.held.lock().entry(holder.to_owned()).or_default().bytes += bytes;
        self.share(holder, bytes)
    }

    fn give_back(&self, holder: &str, bytes: u64) {
        let mut held = self.held.lock();
        if let Some(entry) = held.get_mut(holder) {
            entry.bytes = entry.bytes.saturating_sub(bytes);
            entry.freed.notify_waiters();
            if entry.bytes == 0 {
                held.remove(holder);
            }
        }
    }
}

/// Bytes held against a holder's share, until dropped.
#[derive(Debug)]
pub struct Share {
    shares: Arc<Shares>,
    holder: String,
    bytes: u64,
}

impl Share {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes over `other`, a share of the same holder.
    pub fn absorb(&mut self, mut other: Share) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// Gives back all but `bytes` (what was taken for the most a request could hold, once it
    /// is known what it does hold).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.shares.give_back(&self.holder, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.shares.give_back(&self.holder, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_held_to_its_share_and_the_first_take_always_fits() {
        let shares = Shares::new(100);
        let first = shares
            .try_take("a", 250)
            .expect("nothing held: the first take fits");
        assert!(shares.try_take("a", 1).is_none(), "over its share");
        let other = shares
            .try_take("b", 60)
            .expect("another holder has its own share");
        let more = shares.try_take("b", 40).expect("up to its share");
        assert!(shares.try_take("b", 1).is_none());
        drop(first);
        assert_eq!(shares.held("a"), 0);
        assert!(shares.try_take("a", 10).is_some());
        let counted = shares.take("b", 1000);
        assert_eq!(
            shares.held("b"),
            1100,
            "a charge made elsewhere is counted whole"
        );
        assert!(shares.try_take("b", 1).is_none());
        drop((other, more, counted));
        assert!(
            shares.held.lock().get("b").is_none(),
            "an emptied holder leaves no entry"
        );
    }

    #[tokio::test]
    async fn a_waiting_take_proceeds_when_its_holder_gives_back() {
        let shares = Shares::new(100);
        let mut first = shares.try_take("a", 80).unwrap();
        let waiting = {
            let shares = shares.clone();
            tokio::spawn(async move { shares.take_waiting("a", 50).await })
        };
        let theirs = shares.take_waiting("b", 100).await;
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a's own charge blocks it");
        first.shrink_to(50);
        let second = waiting.await.unwrap();
        assert!(shares.try_take("a", 1).is_none(), "the share is full");
        drop(theirs);
        let theirs = shares.take_waiting("b", 10).await;
        assert_eq!(shares.held("a"), 100);
        first.shrink_to(40);
        let mut more = shares.try_take("a", 10).expect("room again");
        more.absorb(shares.take("a", 5));
        assert_eq!((shares.held("a"), more.bytes()), (105, 15));
        drop((first, second, theirs, more));
        assert_eq!(shares.held("a"), 0);
    }
}
