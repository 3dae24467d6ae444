//! The response body, read by the call that polls it from the connection it came on.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};

use super::decode::{Decoder, State, Step};
use super::head::Head;
use super::timer::{read_stalled, IdleTimer};
use super::write::Out;
use super::{Conn, Dial, H1Pool, Tcp};

/// A response body read from the connection it came on; the connection goes back to
/// the pool when the body has been read to its end (and the request written whole).
pub(crate) struct DrivenBody<D: Dial = Tcp> {
    /// `None` once the body ended or failed.
    conn: Option<Conn<D::Io>>,
    decoder: Decoder,
    keep_alive: bool,
    /// Only with a read idle timeout or a request not written whole (kept out of the
    /// way of the common case).
    watch: Option<Box<Watch>>,
    pool: Arc<H1Pool<D>>,
    key: String,
}

/// What a body watches besides its reads.
struct Watch {
    /// The rest of a request the upstream answered before it had all of it.
    unsent: Option<Out>,
    read_timer: IdleTimer,
    write_timer: IdleTimer,
}

impl<D: Dial> std::fmt::Debug for DrivenBody<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivenBody")
            .field("decoder", &self.decoder)
            .finish_non_exhaustive()
    }
}

impl<D: Dial> DrivenBody<D> {
    /// The response of `head`, its body read from `conn` (to `key`, of `pool`);
    /// `unsent` is the rest of a request the upstream answered before it had it all.
    pub(super) fn response(
        pool: Arc<H1Pool<D>>,
        key: String,
        conn: Conn<D::Io>,
        head: Head,
        unsent: Option<Out>,
    ) -> Response<Self> {
        let timeouts = pool.timeouts;
        let watch = (unsent.is_some() || timeouts.read_idle.is_some()).then(|| {
            Box::new(Watch {
                unsent,
                read_timer: IdleTimer::new(timeouts.read_idle),
                write_timer: IdleTimer::new(timeouts.write_idle),
            })
        });
        let mut resp = Response::new(DrivenBody {
            conn: Some(conn),
            decoder: Decoder::new(head.framing),
            keep_alive: head.keep_alive,
            watch,
            pool,
            key,
        });
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        if resp.body().decoder.is_done() {
            resp.body_mut().finish();
        }
        resp
    }

    /// The body ended: the connection rests in the pool, if it can carry another call.
    fn finish(&mut self) {
        self.decoder.state = State::Done;
        if let Some(conn) = self.conn.take() {
            let unsent = self.watch.as_ref().is_some_and(|w| w.unsent.is_some());
            if self.keep_alive && !unsent {
                self.pool.checkin(std::mem::take(&mut self.key), conn);
            }
        }
    }

    /// Writes on the rest of the request, if the upstream answered before it had it
    /// all. Writing stops (and the connection will not be reused) when the upstream
    /// breaks the connection or takes nothing for the write idle timeout: it answered
    /// already.
    fn poll_unsent(&mut self, cx: &mut Context<'_>) {
        let (Some(watch), Some(conn)) = (self.watch.as_deref_mut(), self.conn.as_mut()) else {
            return;
        };
        let Some(out) = watch.unsent.as_mut() else {
            return;
        };
        match out.poll_write(&mut conn.io, &mut watch.write_timer, cx) {
            Poll::Ready(Ok(())) => watch.unsent = None,
            Poll::Pending if !watch.write_timer.poll_expired(cx) => {}
            Poll::Ready(Err(_)) | Poll::Pending => {
                self.keep_alive = false;
                watch.unsent = None;
            }
        }
    }
}

impl<D: Dial> Body for DrivenBody<D> {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.watch.is_some() {
            this.poll_unsent(cx);
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.step(&mut conn.buf) {
                Ok(Step::Data(data)) => {
                    if this.decoder.state == State::Done {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::Done) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let room = this.decoder.read_size();
            if conn.buf.capacity() - conn.buf.len() < room / 2 {
                conn.buf.reserve(room);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf) {
                Poll::Pending
                    if this
                        .watch
                        .as_deref_mut()
                        .is_some_and(|w| w.read_timer.poll_expired(cx)) =>
                {
                    this.conn = None;
                    return Poll::Ready(Some(Err(read_stalled(
                        this.watch.as_ref().and_then(|w| w.read_timer.limit),
                    ))));
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    if this.decoder.state == State::UntilClose {
                        this.decoder.state = State::Done;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upstream closed the connection before the response body ended",
                    ))));
                }
                Poll::Ready(Ok(_)) => {
                    if let Some(watch) = this.watch.as_deref_mut() {
                        watch.read_timer.progress();
                    }
                }
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
