//! Logging sheds and rejections without flooding the log. The first event of a kind is logged at
//! once; later ones within the same second are counted and summarised in the next line, so a
//! storm of refusals costs one line a second per kind while the metric counts every one.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use nova_core::clock::{Clock, Instant};

const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct ShedLog {
    kinds: Mutex<HashMap<&'static str, Window>>,
    clock: Clock,
}

#[derive(Debug)]
struct Window {
    last_logged: Instant,
    suppressed: u64,
}

impl ShedLog {
    pub fn new(clock: Clock) -> Self {
        Self {
            kinds: Mutex::default(),
            clock,
        }
    }

    /// Logs one shed of new work at the cap `label`, naming the stream and the peer, unless
    /// another of its kind was logged within the second (then it is counted into the next
    /// line). The star and the gateway log every shed through here, in one format.
    pub fn shed(
        &self,
        label: &'static str,
        refusal: &dyn std::fmt::Display,
        stream: Option<&str>,
        peer: Option<std::net::SocketAddr>,
    ) {
        if let Some(unlogged) = self.admit(label) {
            tracing::warn!(
                cap = label,
                stream = stream.unwrap_or("-"),
                peer = %nova_core::top::peer_key(peer),
                unlogged_since_last = unlogged,
                "shed new work: {refusal}"
            );
        }
    }

    /// Records one event of `kind`. Returns `Some(n)` when the caller should log now, where `n`
    /// is how many events of this kind went unlogged since the last line.
    pub fn admit(&self, kind: &'static str) -> Option<u64> {
        let now = self.clock.now();
        let mut kinds = self.kinds.lock();
        match kinds.get_mut(kind) {
            None => {
                // The map holds one entry per kind, and kinds are compile-time names.
                kinds.insert(
                    kind,
                    Window {
                        last_logged: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
            Some(window) if now.duration_since(window.last_logged) >= INTERVAL => {
                let suppressed = window.suppressed;
                window.last_logged = now;
                window.suppressed = 0;
                Some(suppressed)
            }
            Some(window) => {
                window.suppressed += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_and_a_burst_is_summarised() {
        let log = ShedLog::new(Clock::system());
        assert_eq!(log.admit("cap"), Some(0));
        for _ in 0..5 {
            assert_eq!(log.admit("cap"), None);
        }
        assert_eq!(log.admit("other"), Some(0), "kinds are independent");
        log.kinds.lock().get_mut("cap").unwrap().last_logged -= INTERVAL;
        assert_eq!(log.admit("cap"), Some(5));
    }
}
