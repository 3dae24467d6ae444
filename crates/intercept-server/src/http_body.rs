//! The two body types the server deals in: a request body sent upstream as shared
//! slices, and a response body that is either complete or fed by a channel.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use crate::detach::Detachable;

/// A body made of byte slices (typically sharing the harness's request buffer), with an
/// exact length so it is sent with `content-length`.
#[derive(Debug, Default)]
pub(crate) struct SliceBody {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl SliceBody {
    pub(crate) fn new(chunks: Vec<Bytes>) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        SliceBody {
            chunks: chunks.into(),
            remaining,
        }
    }

    /// The body's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.remaining
    }

    /// The body's slices.
    pub(crate) fn into_chunks(self) -> Vec<Bytes> {
        self.chunks.into()
    }
}

impl Body for SliceBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.chunks.pop_front() {
            Some(chunk) => {
                self.remaining -= chunk.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
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
                rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
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
