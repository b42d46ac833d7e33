//! Watches the admission buffer for stalls. Appends wait for room one by one, so the buffer
//! itself cannot tell a passing wait from a stall; this task can. Admission counts as stalled
//! once some append has been waiting continuously for a second, and the stall ends once nothing
//! has waited for a second, so a buffer hovering at its limit is one stall, not thousands.
//! The cause is re-diagnosed while the stall lasts: when it changes (a saturated star whose
//! object store then goes down), the stall under the old cause ends and one under the new
//! cause begins.

use std::sync::Arc;
use std::time::Duration;

use nova_core::clock::Instant;

use tokio_util::sync::CancellationToken;

use crate::shared::Shared;
use crate::stall::Stall;

const SAMPLE: Duration = Duration::from_millis(100);
const BEGIN_AFTER: Duration = Duration::from_secs(1);
const END_AFTER: Duration = Duration::from_secs(1);

pub(crate) async fn run_monitor(shared: Arc<Shared>, stop: CancellationToken) {
    let clock = shared.config.clock;
    let mut ticker = clock.interval(SAMPLE);
    let mut waiting_since: Option<Instant> = None;
    let mut idle_since: Option<Instant> = None;
    let mut stall: Option<Stall> = None;
    loop {
        tokio::select! {
            biased;
            _ = ticker.tick() => {}
            _ = stop.cancelled() => return,
        }
        // A backlog stall ends once no flight has waited for the backlog for a while.
        {
            let mut backlog = shared.backlog_stall.lock();
            if backlog.as_ref().is_some_and(|(_, last)| {
                clock.since(*last) >= END_AFTER && shared.backlog.waiters() == 0
            }) {
                *backlog = None;
            }
        }
        if shared.admission.budget().waiters() > 0 {
            idle_since = None;
            let since = *waiting_since.get_or_insert_with(|| clock.now());
            let cause = shared.diagnose_admission();
            if stall.as_ref().is_some_and(|s| s.cause() != cause) {
                stall = None;
            }
            if stall.is_none() && clock.since(since) >= BEGIN_AFTER {
                let detail = format!(
                    "{} bytes admitted and unresolved (--s3-memory-buffer-mib); producers are slowed by flow control",
                    shared.admission.budget().in_use()
                );
                stall = Some(Stall::begin(
                    shared.metrics.clone(),
                    clock,
                    "admission_buffer",
                    cause,
                    &detail,
                ));
            }
        } else {
            waiting_since = None;
            let since = *idle_since.get_or_insert_with(|| clock.now());
            if clock.since(since) >= END_AFTER {
                stall = None;
            }
        }
    }
}
