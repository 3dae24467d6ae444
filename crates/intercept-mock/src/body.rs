//! The response body: one buffer, or a sequence of frames with optional pauses and an
//! optional abort at the end.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

/// The error that makes hyper drop a connection: returned by the service to send no
/// response, or by the body to cut a response short.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Disconnect;

impl fmt::Display for Disconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mock upstream dropped the connection on purpose")
    }
}

impl std::error::Error for Disconnect {}

/// A response body of the mock.
#[derive(Debug)]
pub(crate) enum MockBody {
    /// One buffer with a known length (sent with `content-length`).
    Full(Option<Bytes>),
    /// Frames of unknown total length (sent chunked), paused by `delay` between two
    /// frames, ending with an error (a dropped connection) when `abort` is set.
    Frames {
        frames: std::vec::IntoIter<Bytes>,
        delay: Duration,
        sleep: Option<Pin<Box<Sleep>>>,
        abort: bool,
        /// Whether the body already yielded once before aborting (see `poll_frame`).
        yielded: bool,
    },
}

impl MockBody {
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self::Full(Some(bytes))
    }

    pub(crate) fn frames(frames: Vec<Bytes>, delay: Duration, abort: bool) -> Self {
        Self::Frames {
            frames: frames.into_iter(),
            delay,
            sleep: None,
            abort,
            yielded: false,
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Disconnect;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Disconnect>>> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            Self::Frames {
                frames,
                delay,
                sleep,
                abort,
                yielded,
            } => {
                if let Some(timer) = sleep {
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    *sleep = None;
                }
                match frames.next() {
                    Some(frame) => {
                        if !delay.is_zero() && frames.len() > 0 {
                            *sleep = Some(Box::pin(tokio::time::sleep(*delay)));
                        }
                        Poll::Ready(Some(Ok(Frame::data(frame))))
                    }
                    // hyper drops what it has buffered when a body fails, so yield once
                    // first: it flushes the frames sent so far to the socket, then polls
                    // again and gets the error.
                    None if *abort && !*yielded => {
                        *yielded = true;
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    None if *abort => {
                        *abort = false;
                        Poll::Ready(Some(Err(Disconnect)))
                    }
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(bytes) => bytes.is_none(),
            Self::Frames { frames, abort, .. } => frames.len() == 0 && !*abort,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Frames { .. } => SizeHint::default(),
        }
    }
}
