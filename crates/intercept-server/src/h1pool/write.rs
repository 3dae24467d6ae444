//! The request on the wire: its head, and its bytes written as the connection takes them.

use std::io::{self, IoSlice, Write as _};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header;
use tokio::io::AsyncWrite;

use super::timer::IdleTimer;

/// Most buffers handed to one vectored write.
const MAX_IOV: usize = 16;

/// The request line and headers of `parts`, in origin form, with a `Host` header and
/// the body's length.
pub(super) fn encode_head(parts: &http::request::Parts, host: &str, len: u64) -> Vec<u8> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = Vec::with_capacity(128 + path.len() + 64 * parts.headers.len());
    head.extend_from_slice(parts.method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if !parts.headers.contains_key(header::HOST) {
        head.extend_from_slice(b"host: ");
        head.extend_from_slice(host.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let _ = write!(head, "content-length: {len}\r\n\r\n");
    head
}

/// The bytes of a request still to be written: its head, then its body's slices.
pub(super) struct Out {
    parts: Vec<Bytes>,
    /// The first part not written whole.
    next: usize,
    /// How much of `parts[next]` is written.
    offset: usize,
}

impl Out {
    pub(super) fn new(parts: Vec<Bytes>) -> Self {
        Out {
            parts,
            next: 0,
            offset: 0,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.next == self.parts.len()
    }

    /// Back to the first byte, for another connection.
    pub(super) fn rewind(&mut self) {
        self.next = 0;
        self.offset = 0;
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let left = self.parts[self.next].len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.next += 1;
            self.offset = 0;
        }
    }

    /// Writes as much as the connection takes, in as few writes as it allows: `Ready`
    /// once everything is written, `Pending` when the connection takes no more for
    /// now. `timer` is told of each write that made progress.
    pub(super) fn poll_write<Io: AsyncWrite + Unpin>(
        &mut self,
        io: &mut Io,
        timer: &mut IdleTimer,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.is_done() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut used = 0;
            for (i, part) in self.parts[self.next..].iter().take(MAX_IOV).enumerate() {
                let skip = if i == 0 { self.offset } else { 0 };
                iov[i] = IoSlice::new(&part[skip..]);
                used += 1;
            }
            match Pin::new(&mut *io).poll_write_vectored(cx, &iov[..used]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    timer.progress();
                    self.advance(n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(io).poll_flush(cx)
    }
}
