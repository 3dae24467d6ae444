//! The request body sent upstream: shared slices of the harness's buffer. (The response
//! body, which drives its call, is in `detach.rs`.)

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

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
