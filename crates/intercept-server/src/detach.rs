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
//!
//! Here are both pollers: [`answer`], which polls a call until its response head, and
//! [`ResponseBody`], which polls it from then on while its stream is relayed. Neither
//! waits on the channel the call answers through while it polls the call: the call
//! sends only while polled, so each poller looks at the channel right after the call's
//! poll, and a send wakes nobody. A channel is waited on only once its call has ended
//! or gone on as a task of its own.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use intercept_core::{ChatDialect, Dialect, Error};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;

use crate::respond::{render, Shape};

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
        // The call future is large (its state holds the request, the record being built
        // and the upstream connection): it is moved to the heap once, and the adapters
        // wrap the box, not the future (each wrapping by value copied it again).
        let call: CallFuture = Box::pin(call);
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

/// Polls `call` in place until it answers through `head`, then hands what is left of
/// it to the response body, which polls it from then on. `None`: the call ended without
/// answering (it panicked).
///
/// Dropped before the answer (the harness went away), the receiver is closed first, so
/// the call, going on as a task, sees at once that nobody waits for its answer.
pub(crate) async fn answer(
    call: Detachable,
    head: oneshot::Receiver<Response<ResponseBody>>,
) -> Option<Response<ResponseBody>> {
    struct Waiting {
        head: oneshot::Receiver<Response<ResponseBody>>,
        call: Option<Detachable>,
    }
    impl Drop for Waiting {
        fn drop(&mut self) {
            self.head.close();
            drop(self.call.take());
        }
    }
    let mut waiting = Waiting {
        head,
        call: Some(call),
    };
    // The call sends its head from within its own poll, here: the head is looked for
    // right after each poll of the call, never waited for, so sending it wakes nobody
    // (a waker registered on the channel would be this very task's, woken for nothing).
    let answered = std::future::poll_fn(|cx| {
        if let Some(c) = &mut waiting.call {
            if c.poll_call(cx).is_ready() {
                waiting.call = None;
            }
        }
        match waiting.head.try_recv() {
            Ok(resp) => Poll::Ready(Some(resp)),
            Err(oneshot::error::TryRecvError::Closed) => Poll::Ready(None),
            Err(oneshot::error::TryRecvError::Empty) if waiting.call.is_none() => Poll::Ready(None),
            Err(oneshot::error::TryRecvError::Empty) => Poll::Pending,
        }
    })
    .await;
    let mut resp = answered?;
    if let Some(c) = waiting.call.take() {
        resp.body_mut().drive(c);
    }
    Some(resp)
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

/// What the server answers with: a complete body, or a relayed stream.
///
/// A relayed stream is fed by its call; while the harness's connection polls the body,
/// it also polls the call (see `detach`), so relaying a piece needs no wakeup of
/// another task.
#[derive(Debug)]
pub struct ResponseBody(Kind, Option<crate::serve::Busy>);

#[derive(Debug)]
enum Kind {
    Full(Option<Bytes>),
    Channel {
        rx: mpsc::Receiver<Bytes>,
        /// The call feeding `rx`, when the body drives it.
        call: Option<Detachable>,
    },
}

impl ResponseBody {
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        ResponseBody(Kind::Full(Some(bytes.into())), None)
    }

    /// A stream fed through `rx`; ends when the sender is dropped.
    pub(crate) fn channel(rx: mpsc::Receiver<Bytes>) -> Self {
        ResponseBody(Kind::Channel { rx, call: None }, None)
    }

    /// Whether the body is a relayed stream.
    pub(crate) fn is_stream(&self) -> bool {
        matches!(self.0, Kind::Channel { .. })
    }

    /// Keeps `busy` until the body is dropped (written out, or its connection gone).
    pub(crate) fn hold(&mut self, busy: crate::serve::Busy) {
        self.1 = Some(busy);
    }

    /// Hands `call` to the body, which polls it from now on; a complete body has no use
    /// for it and lets it go on as a task.
    pub(crate) fn drive(&mut self, call: Detachable) {
        if let Kind::Channel { call: slot, .. } = &mut self.0 {
            *slot = Some(call);
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().0 {
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Channel { rx, call } => {
                // Let the call work through what its upstream delivered first, so that
                // what it relays is ready below.
                if let Some(c) = call {
                    if c.poll_call(cx).is_ready() {
                        *call = None;
                    }
                }
                match rx.try_recv() {
                    Ok(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                    Err(mpsc::error::TryRecvError::Disconnected) => Poll::Ready(None),
                    // The call still runs here: it feeds the channel only while polled
                    // by this body, and its own wakers (the upstream, its timers) wake
                    // this task. Waiting on the channel too would only have each piece
                    // it sends wake the task that is polling it.
                    Err(mpsc::error::TryRecvError::Empty) if call.is_some() => Poll::Pending,
                    // The call has ended: what it sent is all there is.
                    Err(mpsc::error::TryRecvError::Empty) => {
                        rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.0, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            Kind::Channel { .. } => SizeHint::default(),
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // The harness is gone (or the stream ended): close the channel before the call
        // goes on as a task, so it sees at once that nobody reads.
        if let Kind::Channel { rx, call } = &mut self.0 {
            rx.close();
            drop(call.take());
        }
    }
}

// Responses whose body is a [`ResponseBody`]: errors in a route's shape (rendered by
// `respond`), JSON, event streams.

/// An error in the dialect's shape.
pub(crate) fn error_response(dialect: &dyn Dialect, error: &Error) -> Response<ResponseBody> {
    render(error, Shape::Dialect(dialect)).map(ResponseBody::full)
}

/// An error outside any dialect's routes, in the OpenAI shape.
pub(crate) fn plain_error(error: &Error) -> Response<ResponseBody> {
    error_response(&ChatDialect, error)
}

/// An error of the state, task and tool channels: a flat `{"error": <text>}` body.
pub(crate) fn flat_error(error: &Error) -> Response<ResponseBody> {
    render(error, Shape::Flat).map(ResponseBody::full)
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// An event stream's answer: `body` with the headers of one (`text/event-stream`, not
/// cached).
pub(crate) fn event_stream(body: ResponseBody) -> Response<ResponseBody> {
    let mut head = Response::new(body);
    let h = head.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    head
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
    async fn a_harness_gone_before_the_answer_leaves_the_call_running_and_told() {
        let tasks = TaskTracker::new();
        let told = Arc::new(AtomicBool::new(false));
        let flag = told.clone();
        let (mut tx, rx) = oneshot::channel::<Response<ResponseBody>>();
        let call = Detachable::new(
            async move {
                // Ends only once nobody waits for the answer any more.
                tx.closed().await;
                flag.store(true, Ordering::SeqCst);
            },
            &tasks,
        );
        let mut waiting = Box::pin(answer(call, rx));
        assert!(
            std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx).is_pending())).await
        );
        drop(waiting);
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .expect("the detached call ended");
        assert!(told.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_answer_with_a_stream_hands_the_call_to_the_body() {
        use http_body_util::BodyExt as _;
        let tasks = TaskTracker::new();
        let (tx, rx) = oneshot::channel::<Response<ResponseBody>>();
        let call = Detachable::new(
            async move {
                let (events, body) = tokio::sync::mpsc::channel(1);
                let _ = tx.send(Response::new(ResponseBody::channel(body)));
                for piece in ["a", "b", "c"] {
                    if events.send(bytes::Bytes::from(piece)).await.is_err() {
                        return;
                    }
                }
            },
            &tasks,
        );
        let resp = answer(call, rx).await.expect("answered");
        assert_eq!(tasks.len(), 1, "the call is still running, in the body");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"abc");
        assert_eq!(tasks.len(), 0);
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
