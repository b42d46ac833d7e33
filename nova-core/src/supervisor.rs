//! One watch over a process's critical tasks: the star's write path, the auditor's duties, the
//! fleet's loops, the servers. A critical task that ends before it was asked to stop (it
//! returned, failed or panicked) leaves the process unable to do its job, and nothing else would
//! notice: the supervisor records the first such end, naming the task and why, and the process
//! shuts down on it.
//!
//! Each task is registered with the token that asks it to stop; an end after that is expected.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a watched task's handle answers: `Err` with why it ended, if it ended badly.
pub type Watched = JoinHandle<Result<(), String>>;

#[derive(Clone, Default)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    failed: CancellationToken,
    reason: Mutex<Option<String>>,
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("failed", &*self.inner.reason.lock())
            .finish()
    }
}

impl Supervisor {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task`, named `name`, as a critical task: if it ends (or panics) before `stop` is
    /// cancelled, the supervisor fails naming it.
    pub fn watch<F>(&self, name: impl Into<String>, stop: CancellationToken, task: F) -> Watched
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.watch_fallible(name, stop, async move {
            task.await;
            Ok::<(), std::convert::Infallible>(())
        })
    }

    /// As [`Supervisor::watch`], for a task that can fail: its error is the reason.
    pub fn watch_fallible<F, E>(
        &self,
        name: impl Into<String>,
        stop: CancellationToken,
        task: F,
    ) -> Watched
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let name = name.into();
        let task = fault::hooked(&name, task);
        self.watch_hooked(name, stop, task)
    }

    /// As [`Supervisor::watch`], with `task` in a task of its own that the watch awaits (the
    /// star's chain tasks run so). A panic in it is reported as the task's panic.
    pub fn watch_spawned<F>(
        &self,
        name: impl Into<String>,
        stop: CancellationToken,
        task: F,
    ) -> Watched
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let name = name.into();
        let task = fault::hooked(&name, task);
        self.watch_hooked(name, stop, async move {
            match tokio::spawn(task).await {
                Ok(()) => Ok(()),
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(cancelled) => Err(cancelled),
            }
        })
    }

    fn watch_hooked<F, E>(&self, name: String, stop: CancellationToken, task: F) -> Watched
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        use futures::FutureExt as _;
        let supervisor = self.clone();
        // One task, the watch and the work together: a watched task is scheduled exactly as
        // it would be spawned bare (the simulation's seeds replay the same).
        tokio::spawn(async move {
            let outcome = match std::panic::AssertUnwindSafe(task).catch_unwind().await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(err)) => Err(format!("task {name} failed: {err}")),
                Err(panic) => Err(format!("task {name} panicked: {}", panic_message(&panic))),
            };
            if !stop.is_cancelled() {
                let why = match &outcome {
                    Ok(()) => format!("task {name} stopped unexpectedly"),
                    Err(why) => why.clone(),
                };
                supervisor.fail(why);
            } else if let Err(why) = &outcome {
                tracing::warn!("while stopping: {why}");
            }
            outcome
        })
    }

    /// Records a failure found some other way; the first one is the one reported.
    pub fn fail(&self, reason: String) {
        let mut recorded = self.inner.reason.lock();
        if recorded.is_none() {
            tracing::error!("{reason}");
            *recorded = Some(reason);
            self.inner.failed.cancel();
        }
    }

    /// Resolves with the first failure.
    pub async fn failed(&self) -> String {
        self.inner.failed.cancelled().await;
        self.reason()
            .unwrap_or_else(|| "a critical task stopped".to_owned())
    }

    /// The first failure, if there was one.
    pub fn reason(&self) -> Option<String> {
        self.inner.reason.lock().clone()
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// `NOVA_FAULT_KILL_TASK=NAME`, in debug builds only: the task of that name panics a second
/// after it starts, so a test can check that the process notices and says which. Release
/// builds carry no hook.
mod fault {
    #[cfg(debug_assertions)]
    use std::future::Future;

    #[cfg(debug_assertions)]
    pub(super) fn hooked<F, T>(name: &str, task: F) -> impl Future<Output = T> + Send + 'static
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let doomed = std::env::var("NOVA_FAULT_KILL_TASK").is_ok_and(|victim| victim == name);
        let name = name.to_owned();
        async move {
            if !doomed {
                return task.await;
            }
            tokio::select! {
                out = task => out,
                _ = crate::clock::Clock::system().sleep(std::time::Duration::from_secs(1)) => {
                    panic!("NOVA_FAULT_KILL_TASK killed task {name}")
                }
            }
        }
    }

    #[cfg(not(debug_assertions))]
    pub(super) fn hooked<F>(_name: &str, task: F) -> F {
        task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_before_its_stop_fails_the_supervisor_naming_it() {
        let supervisor = Supervisor::new();
        let stop = CancellationToken::new();
        let quiet = supervisor.watch("quiet", stop.clone(), std::future::pending::<()>());
        let ended = supervisor.watch("packer", stop.clone(), async {});
        assert_eq!(
            supervisor.failed().await,
            "task packer stopped unexpectedly"
        );
        assert!(ended.await.unwrap().is_ok());
        // The first failure stays the one reported.
        let later = supervisor.watch("later", CancellationToken::new(), async {
            panic!("boom");
        });
        assert!(later.await.unwrap().is_err());
        assert_eq!(
            supervisor.reason().unwrap(),
            "task packer stopped unexpectedly"
        );
        quiet.abort();
    }

    #[tokio::test]
    async fn panics_and_errors_are_reasons_and_ends_after_stop_are_not() {
        let supervisor = Supervisor::new();
        let stop = CancellationToken::new();
        stop.cancel();
        let stopped = supervisor.watch("asked", stop, async {});
        assert!(stopped.await.unwrap().is_ok());
        assert!(supervisor.reason().is_none());

        let failing = supervisor.watch_fallible("fleet renew", CancellationToken::new(), async {
            Err::<(), _>("etcd refused")
        });
        assert_eq!(
            failing.await.unwrap(),
            Err("task fleet renew failed: etcd refused".to_owned())
        );
        assert_eq!(
            supervisor.failed().await,
            "task fleet renew failed: etcd refused"
        );

        let other = Supervisor::new();
        let panicked = other.watch("absorber", CancellationToken::new(), async {
            panic!("bad");
        });
        let why = panicked.await.unwrap().unwrap_err();
        assert!(why.starts_with("task absorber panicked"), "{why}");
        assert_eq!(other.failed().await, why);

        // A task in a task of its own reads the same.
        let spawned = Supervisor::new();
        let handle = spawned.watch_spawned("chain packer", CancellationToken::new(), async {
            panic!("sequence gap");
        });
        assert_eq!(
            handle.await.unwrap().unwrap_err(),
            "task chain packer panicked: sequence gap"
        );
    }
}
