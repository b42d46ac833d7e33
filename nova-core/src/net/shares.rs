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
    held: Mutex<HashMap<String, u64>>,
    /// Wakes the takers waiting for a holder's share to free.
    freed: tokio::sync::Notify,
}

impl Shares {
    /// Shares of `percent` of a budget of `budget` bytes.
    pub fn of(budget: u64, percent: u8) -> Arc<Self> {
        Self::new((budget / 100 * percent.min(100) as u64).max(1))
    }

    /// Shares of `cap` bytes each.
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: Mutex::new(HashMap::new()),
            freed: tokio::sync::Notify::new(),
        })
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// What `holder` holds now.
    pub fn held(&self, holder: &str) -> u64 {
        self.held.lock().get(holder).copied().unwrap_or(0)
    }

    /// Takes `bytes` for `holder` if they fit its share (or it holds nothing yet).
    pub fn try_take(self: &Arc<Self>, holder: &str, bytes: u64) -> Option<Share> {
        let mut held = self.held.lock();
        let now = held.get(holder).copied().unwrap_or(0);
        if now > 0 && now.saturating_add(bytes) > self.cap {
            return None;
        }
        held.insert(holder.to_owned(), now + bytes);
        Some(Share {
            shares: self.clone(),
            holder: holder.to_owned(),
            bytes,
        })
    }

    /// Takes `bytes` for `holder` once they fit its share: the holder's own charges block it,
    /// nobody else's.
    pub async fn take_waiting(self: &Arc<Self>, holder: &str, bytes: u64) -> Share {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a release in between is not missed.
            freed.as_mut().enable();
            if let Some(share) = self.try_take(holder, bytes) {
                return share;
            }
            freed.await;
        }
    }

    /// Takes `bytes` for `holder` whatever it holds: a charge already made elsewhere, counted
    /// so that the holder's next request sees it.
    pub fn take(self: &Arc<Self>, holder: &str, bytes: u64) -> Share {
        *self.held.lock().entry(holder.to_owned()).or_insert(0) += bytes;
        Share {
            shares: self.clone(),
            holder: holder.to_owned(),
            bytes,
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
    /// Adds `bytes` if the holder's share has room for them now.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let mut held = self.shares.held.lock();
        let now = held.get(&self.holder).copied().unwrap_or(0);
        if now.saturating_add(bytes) > self.shares.cap {
            return false;
        }
        held.insert(self.holder.clone(), now + bytes);
        self.bytes += bytes;
        true
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
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

impl Shares {
    fn give_back(&self, holder: &str, bytes: u64) {
        {
            let mut held = self.held.lock();
            if let Some(now) = held.get_mut(holder) {
                *now = now.saturating_sub(bytes);
                if *now == 0 {
                    held.remove(holder);
                }
            }
        }
        self.freed.notify_waiters();
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
        let mut second = waiting.await.unwrap();
        assert!(!second.try_grow(1), "the share is full");
        drop(theirs);
        let theirs = shares.take_waiting("b", 10).await;
        assert_eq!(shares.held("a"), 100);
        first.shrink_to(40);
        assert!(second.try_grow(10));
        assert_eq!((shares.held("a"), second.bytes()), (100, 60));
        drop((first, second, theirs));
        assert_eq!(shares.held("a"), 0);
    }
}
