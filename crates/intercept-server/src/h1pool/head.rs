//! The exchange up to the response head: the request written while the answer is read,
//! interim answers skipped, the final head parsed and its framing decided.

use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite};

use super::decode::{Chunk, State, READ_MIN};
use super::timer::{read_stalled, write_stalled, IdleTimer};
use super::write::Out;
use super::{invalid, Conn, Timeouts};

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Most response headers accepted.
const MAX_HEADERS: usize = 128;
/// Most interim (`1xx`) answers accepted before the final one.
const MAX_INTERIM: usize = 32;

/// How long an answer may take to arrive once the upstream closed the connection
/// before the request was written whole.
const EARLY_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// An exchange that got no response head.
pub(super) struct Failed {
    pub(super) error: io::Error,
    /// The request could not be written whole, so the upstream cannot have taken it.
    pub(super) unsent: bool,
}

/// A parsed response head.
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    pub(super) framing: State,
    pub(super) keep_alive: bool,
}

/// Writes the request and, at the same time, reads the response head (skipping
/// interim `1xx` answers). An answer may come before the whole request was written:
/// the rest is then left in `out`, for the body to write while it is read. When the
/// upstream breaks the connection while the request is written, an answer it sent
/// before is still the response (a body it refuses), and the connection is not reused.
pub(super) async fn exchange<Io: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<Io>,
    out: &mut Out,
    timeouts: Timeouts,
) -> Result<Head, Failed> {
    let mut write_timer = IdleTimer::new(timeouts.write_idle);
    let mut read_timer = IdleTimer::new(timeouts.read_idle);
    let mut write_error: Option<io::Error> = None;
    let mut interim = 0;
    std::future::poll_fn(|cx| {
        loop {
            if write_error.is_none() && !out.is_done() {
                match out.poll_write(&mut conn.io, &mut write_timer, cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        write_error = Some(e);
                        // The answer, if any, is already on its way.
                        read_timer = IdleTimer::new(Some(
                            timeouts
                                .read_idle
                                .map_or(EARLY_ANSWER_WAIT, |t| t.min(EARLY_ANSWER_WAIT)),
                        ));
                    }
                    Poll::Pending if write_timer.poll_expired(cx) => {
                        return Poll::Ready(Err(Failed {
                            error: write_stalled(timeouts.write_idle),
                            unsent: true,
                        }))
                    }
                    Poll::Pending => {}
                }
            }
            let writing = write_error.is_none() && !out.is_done();
            match final_head(&mut conn.buf, &mut interim) {
                Ok(Some(mut head)) => {
                    if write_error.is_some() {
                        head.keep_alive = false;
                    }
                    return Poll::Ready(Ok(head));
                }
                Ok(None) => {}
                Err(error) => {
                    return Poll::Ready(Err(Failed {
                        error,
                        unsent: false,
                    }))
                }
            }
            let unsent = write_error.is_some() || !out.is_done();
            let end = |error: io::Error, write_error: &mut Option<io::Error>| {
                Poll::Ready(Err(Failed {
                    error: write_error.take().unwrap_or(error),
                    unsent,
                }))
            };
            conn.buf.reserve(READ_MIN);
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf) {
                Poll::Ready(Ok(0)) => {
                    return end(
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the upstream closed the connection without answering",
                        ),
                        &mut write_error,
                    )
                }
                Poll::Ready(Ok(_)) => read_timer.progress(),
                Poll::Ready(Err(e)) => return end(e, &mut write_error),
                // While the request is being written, the upstream is taking it: the
                // read idle timeout starts once it has all of it.
                Poll::Pending if writing => return Poll::Pending,
                Poll::Pending if read_timer.poll_expired(cx) => {
                    let stalled = read_stalled(read_timer.limit);
                    return end(stalled, &mut write_error);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

/// The final response head at the start of `buf`, past interim (`1xx`) answers
/// (`interim` counts them across reads); `None` while it is incomplete.
#[inline]
fn final_head(buf: &mut BytesMut, interim: &mut usize) -> io::Result<Option<Head>> {
    while !buf.is_empty() {
        let Some((used, head)) = parse_head(buf)? else {
            return Ok(None);
        };
        buf.advance(used);
        if !head.status.is_informational() {
            return Ok(Some(head));
        }
        if head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(invalid("the upstream switched protocols on a model call"));
        }
        *interim += 1;
        if *interim > MAX_INTERIM {
            return Err(invalid(format!(
                "the upstream sent over {MAX_INTERIM} interim (1xx) answers"
            )));
        }
    }
    Ok(None)
}

/// Parses a complete response head at the start of `buf`: its length and content, or
/// `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> io::Result<Option<(usize, Head)>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    let used = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(invalid(format!(
                "the upstream's response head is over {} KiB",
                MAX_HEAD / 1024
            )))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(invalid(format!(
                "the upstream's answer is not an HTTP/1.x response ({e})"
            )))
        }
    };
    let code = resp.code.unwrap_or_default();
    let status = StatusCode::from_u16(code)
        .map_err(|_| invalid(format!("the upstream answered with status {code}")))?;
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut framing = FramingHeaders::default();
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| invalid(format!("the upstream sent a bad header name `{}`", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| invalid(format!("the upstream sent a bad `{name}` header value")))?;
        framing.note(&name, h.value)?;
        headers.append(name, value);
    }
    let (framing, keep_alive) = framing.decide(status, version, &mut headers);
    Ok(Some((
        used,
        Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        },
    )))
}

/// What the headers of a response head say of its body's framing and of its
/// connection.
#[derive(Debug, Default)]
struct FramingHeaders {
    /// Whether the last transfer coding is chunked, if there is a `Transfer-Encoding`.
    chunked: Option<bool>,
    length: Option<u64>,
    /// `Connection: close` anywhere.
    close: bool,
    /// `Connection: keep-alive` (what an HTTP/1.0 answer needs to be reused).
    keep_alive: bool,
}

impl FramingHeaders {
    /// Notes one header of the head.
    fn note(&mut self, name: &HeaderName, value: &[u8]) -> io::Result<()> {
        if name == header::TRANSFER_ENCODING {
            // The last coding decides: chunked is the only one that frames a body.
            if let Some(last) = value.rsplit(|&b| b == b',').next() {
                self.chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
        } else if name == header::CONTENT_LENGTH {
            for part in value.split(|&b| b == b',') {
                let n = std::str::from_utf8(part.trim_ascii())
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| invalid("the upstream sent a bad content-length"))?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(invalid("the upstream sent two different content-lengths"));
                }
                self.length = Some(n);
            }
        } else if name == header::CONNECTION {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                }
            }
        }
        Ok(())
    }

    /// The body's framing, and whether the connection may be reused after it.
    fn decide(
        self,
        status: StatusCode,
        version: Version,
        headers: &mut HeaderMap,
    ) -> (State, bool) {
        // A `close` anywhere wins over any `keep-alive`, which only an HTTP/1.0 answer
        // needs.
        let mut keep_alive = !self.close && (version == Version::HTTP_11 || self.keep_alive);
        let framing = if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            State::Length(0)
        } else if let Some(chunked) = self.chunked {
            if self.length.is_some() {
                // Transfer-Encoding overrides Content-Length, but a message with both
                // may be an attempt at response splitting: it is read by its transfer
                // coding, relayed without the length, and its connection is closed
                // after it (RFC 9112, section 6.3).
                headers.remove(header::CONTENT_LENGTH);
                keep_alive = false;
            }
            if chunked {
                State::Chunked(Chunk::Size)
            } else {
                keep_alive = false;
                State::UntilClose
            }
        } else if let Some(n) = self.length {
            State::Length(n)
        } else {
            keep_alive = false;
            State::UntilClose
        };
        (framing, keep_alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(wire: &str) -> io::Result<Option<(usize, Head)>> {
        parse_head(wire.as_bytes())
    }

    #[test]
    fn response_heads_set_the_framing_and_the_reuse() {
        let wire = "HTTP/1.1 200 OK\r\ncontent-length: 12\r\nx-a: b\r\n\r\nrest";
        let (used, h) = head(wire).expect("parsed").expect("complete");
        assert_eq!(used, wire.len() - "rest".len());
        assert_eq!(
            (h.status, h.framing, h.keep_alive),
            (StatusCode::OK, State::Length(12), true)
        );
        assert_eq!(h.headers["x-a"], "b");

        for (wire, framing, keep_alive) in [
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                State::Chunked(Chunk::Size),
                true,
            ),
            // Both framings: the transfer coding frames the body, and the connection
            // is closed after it (RFC 9112, section 6.3).
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n",
                State::Chunked(Chunk::Size),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: identity\r\n\r\n",
                State::UntilClose,
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                State::UntilClose,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", State::UntilClose, false),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
                State::Length(0),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\n\r\n",
                State::Length(4),
                true,
            ),
        ] {
            let h = head(wire).expect("parsed").expect("complete").1;
            assert_eq!((h.framing, h.keep_alive), (framing, keep_alive), "{wire:?}");
        }

        assert!(head("HTTP/1.1 200 OK\r\ncontent-")
            .expect("partial")
            .is_none());
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x3\r\n\r\n",
            "SSH-2.0-OpenSSH_9.6\r\n\r\n",
        ] {
            let e = head(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} is refused"));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(head(&huge)
            .err()
            .expect("too large")
            .to_string()
            .contains("KiB"));
    }
}
