//! A call driven by the task that waits for it, detached onto the server's tracker if
//! that task lets go of it first.
//!
//! A model call must run to its record even if the harness disconnects (hyper then
//! drops the request's service future, or the response body). Spawning every call as
//! a task of its own guarantees that, but costs a task, a oneshot wakeup and, for a
//! stream, a wakeup of the harness's connection for every piece relayed. Instead the
//! call is polled by the harness's connection task itself (the service future until the
//! response head exists, then the response body), and only when that task drops it
//! unfinished is the rest spawned on the server's [`TaskTracker`].

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::FutureExt as _;
use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

type CallFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A call future, polled in place until it ends or is dropped; dropped unfinished, it
/// goes on as a task of the tracker.
pub(crate) struct Detachable {
    call: Option<CallFuture>,
    tasks: TaskTracker,
    runtime: Handle,
}

impl Detachable {
    /// Wraps `call` (counted by `tasks` from now on, so a server waiting for its calls
    /// waits for this one wherever it runs). A panic in the call ends the call only.
    pub(crate) fn new(
        call: impl Future<Output = ()> + Send + 'static,
        tasks: &TaskTracker,
    ) -> Self {
        let call = tasks.track_future(AssertUnwindSafe(call).catch_unwind().map(|r| {
            if r.is_err() {
                tracing::error!("a model call panicked");
            }
        }));
        Detachable {
            call: Some(Box::pin(call)),
            tasks: tasks.clone(),
            runtime: Handle::current(),
        }
    }

    /// Polls the call once; `Ready` once it has ended (and every poll after that).
    pub(crate) fn poll_call(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.call {
            Some(call) => match call.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.call = None;
                    Poll::Ready(())
                }
                Poll::Pending => Poll::Pending,
            },
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // On a runtime that is shutting down the task is dropped instead, as every
            // other task of that runtime.
            self.tasks.spawn_on(call, &self.runtime);
        }
    }
}

impl std::fmt::Debug for Detachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detachable")
            .field("running", &self.call.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_in_place_and_detaches_when_dropped_unfinished() {
        let tasks = TaskTracker::new();
        let ended = Arc::new(AtomicBool::new(false));
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let flag = ended.clone();
        let mut call = Detachable::new(
            async move {
                let _ = go_rx.await;
                flag.store(true, Ordering::SeqCst);
            },
            &tasks,
        );
        // Polled in place: pending, and counted by the tracker.
        assert!(std::future::poll_fn(|cx| Poll::Ready(call.poll_call(cx)))
            .await
            .is_pending());
        assert_eq!(tasks.len(), 1);
        // Dropped unfinished: it goes on as a task and still ends.
        drop(call);
        go_tx.send(()).expect("the detached call still waits");
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .expect("the detached call ended");
        assert!(ended.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_finished_call_is_not_spawned_again_and_a_panic_stays_inside() {
        let tasks = TaskTracker::new();
        let mut call = Detachable::new(async { panic!("boom") }, &tasks);
        std::future::poll_fn(|cx| call.poll_call(cx)).await;
        assert!(std::future::poll_fn(|cx| Poll::Ready(call.poll_call(cx)))
            .await
            .is_ready());
        drop(call);
        assert_eq!(tasks.len(), 0, "nothing left running");
    }
}
