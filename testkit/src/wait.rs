//! Waiting in tests for something another task or process does.

use std::time::Duration;

/// Polls `check` every 10 ms until it holds, failing the test with `what` after `timeout`. It
/// waits on tokio's clock, so a test with the clock paused waits no real time.
pub async fn eventually(timeout: Duration, what: &str, check: impl FnMut() -> bool) {
    eventually_every(Duration::from_millis(10), timeout, what, check).await
}

/// As [`eventually`], polling every `interval`: checks that scrape a process's metrics page
/// poll less often.
pub async fn eventually_every(
    interval: Duration,
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}
