//! The few HTTP/1.1 pieces the slow-stream rig writes by hand (`slow-upstream` and
//! `slowgen`'s HTTP/1.1 mode): an incremental `Transfer-Encoding: chunked` decoder, the
//! matching encoder, request and response heads read with `httparse`, and a finder for
//! a byte string that may be split across reads (`data: [DONE]`).
//!
//! The decoder is strict about sizes and framing and lenient only where RFC 9112 allows
//! it (chunk extensions and trailer fields are skipped, a bare LF ends a line).

use std::fmt;

/// Headers read at most (requests and responses of the rig carry a handful).
const MAX_HEADERS: usize = 32;

/// A framing error of a chunked body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkedError(&'static str);

impl fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed chunked body: {}", self.0)
    }
}

impl std::error::Error for ChunkedError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the hex digits of a chunk size (`digits` so far).
    Size { size: u64, digits: u8 },
    /// Skipping a chunk extension up to the end of the size line.
    Extension { size: u64 },
    /// After the CR of a size line.
    SizeLf { size: u64 },
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// After chunk data: CR LF expected.
    DataCr,
    /// After chunk data and its CR: LF expected.
    DataLf,
    /// At the start of a trailer line (after the last chunk's size line).
    TrailerStart,
    /// Inside a trailer field line.
    TrailerLine,
    /// After the CR of the empty line that ends the body.
    EndLf,
    /// The body is complete.
    Done,
}

/// An incremental decoder of a chunked message body: feed it reads as they come, it
/// hands out the data bytes and says when the body is complete.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder {
            state: State::Size { size: 0, digits: 0 },
        }
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the last chunk and the final empty line have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes from `input`, calling `data` with each run of body bytes. Returns how many
    /// bytes of `input` were consumed: all of them, unless the body ends inside `input`
    /// (what follows belongs to the next message and is left alone).
    pub fn decode(
        &mut self,
        input: &[u8],
        mut data: impl FnMut(&[u8]),
    ) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            self.state = match self.state {
                State::Done => return Ok(i),
                State::Data(left) => {
                    let n = (input.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    data(&input[i..i + n]);
                    i += n;
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data(left)
                    };
                    continue;
                }
                State::Size { size, digits } => match hex(b) {
                    Some(v) if digits < 15 => State::Size {
                        size: size << 4 | u64::from(v),
                        digits: digits + 1,
                    },
                    Some(_) => return Err(ChunkedError("chunk size too large")),
                    None if digits == 0 => return Err(ChunkedError("chunk size expected")),
                    None => match b {
                        b'\r' => State::SizeLf { size },
                        b'\n' => after_size_line(size),
                        b';' | b' ' | b'\t' => State::Extension { size },
                        _ => return Err(ChunkedError("bad character in a chunk size")),
                    },
                },
                State::Extension { size } => match b {
                    b'\r' => State::SizeLf { size },
                    b'\n' => after_size_line(size),
                    _ => State::Extension { size },
                },
                State::SizeLf { size } => match b {
                    b'\n' => after_size_line(size),
                    _ => return Err(ChunkedError("LF expected after a chunk size")),
                },
                State::DataCr => match b {
                    b'\r' => State::DataLf,
                    b'\n' => State::Size { size: 0, digits: 0 },
                    _ => return Err(ChunkedError("CRLF expected after chunk data")),
                },
                State::DataLf => match b {
                    b'\n' => State::Size { size: 0, digits: 0 },
                    _ => return Err(ChunkedError("LF expected after chunk data")),
                },
                State::TrailerStart => match b {
                    b'\r' => State::EndLf,
                    b'\n' => State::Done,
                    _ => State::TrailerLine,
                },
                State::TrailerLine => match b {
                    b'\n' => State::TrailerStart,
                    _ => State::TrailerLine,
                },
                State::EndLf => match b {
                    b'\n' => State::Done,
                    _ => return Err(ChunkedError("LF expected at the end of the body")),
                },
            };
            i += 1;
        }
        Ok(i)
    }
}

fn after_size_line(size: u64) -> State {
    if size == 0 {
        State::TrailerStart
    } else {
        State::Data(size)
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Appends `data` to `out` as one chunk (`<hex size>\r\n<data>\r\n`); nothing for empty
/// data, which would end the body.
pub fn encode_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk and the end of a chunked body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes (responses only).
    Close,
}

/// What the rig needs from a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method, e.g. `POST`.
    pub method: String,
    /// Request target, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Body framing (`Length(0)` when the request has no body).
    pub framing: Framing,
    /// The client asked to close the connection after this exchange (or spoke HTTP/1.0).
    pub close: bool,
    /// Length of the head, CRLFCRLF included.
    pub head_len: usize,
}

/// What the rig needs from a response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Body framing.
    pub framing: Framing,
    /// The server will close the connection after this response.
    pub close: bool,
    /// Length of the head, CRLFCRLF included.
    pub head_len: usize,
}

/// A head that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadError(pub String);

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed HTTP/1.1 head: {}", self.0)
    }
}

impl std::error::Error for HeadError {}

struct Headers {
    framing: Option<Framing>,
    close: bool,
}

fn read_headers(headers: &[httparse::Header<'_>], version: u8) -> Result<Headers, HeadError> {
    let mut framing = None;
    let mut close = version == 0;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| HeadError("bad content-length".into()))?;
            if framing.is_some_and(|f| f != Framing::Length(n)) {
                return Err(HeadError("conflicting body lengths".into()));
            }
            framing = Some(Framing::Length(n));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let chunked = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            if !chunked || matches!(framing, Some(Framing::Length(_))) {
                return Err(HeadError("unsupported transfer-encoding".into()));
            }
            framing = Some(Framing::Chunked);
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    close = false;
                }
            }
        }
    }
    Ok(Headers { framing, close })
}

/// Reads a request head from the start of `buf`: `Ok(None)` if it is not complete yet.
pub fn parse_request(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(HeadError(e.to_string())),
    };
    let h = read_headers(req.headers, req.version.unwrap_or(1))?;
    Ok(Some(RequestHead {
        method: req.method.unwrap_or_default().to_owned(),
        path: req.path.unwrap_or_default().to_owned(),
        framing: h.framing.unwrap_or(Framing::Length(0)),
        close: h.close,
        head_len,
    }))
}

/// Reads a response head from the start of `buf`: `Ok(None)` if it is not complete yet.
pub fn parse_response(buf: &[u8]) -> Result<Option<ResponseHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(HeadError(e.to_string())),
    };
    let status = resp.code.unwrap_or(0);
    let h = read_headers(resp.headers, resp.version.unwrap_or(1))?;
    // 1xx, 204 and 304 have no body.
    let framing = if status < 200 || status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        h.framing.unwrap_or(Framing::Close)
    };
    Ok(Some(ResponseHead {
        status,
        framing,
        close: h.close || framing == Framing::Close,
        head_len,
    }))
}

/// Longest needle a [`Finder`] takes.
const MAX_NEEDLE: usize = 16;

/// Finds a byte string in a stream of pieces, also when a piece boundary cuts it.
#[derive(Debug, Clone)]
pub struct Finder {
    needle: &'static [u8],
    /// The last `needle.len() - 1` bytes seen (at most), in `carry[..carry_len]`.
    carry: [u8; MAX_NEEDLE],
    carry_len: usize,
    found: bool,
}

impl Finder {
    /// A finder of `needle` (at most 16 bytes; a longer one is cut to its first 16).
    pub fn new(needle: &'static [u8]) -> Self {
        let needle = &needle[..needle.len().min(MAX_NEEDLE)];
        Finder {
            needle,
            carry: [0; MAX_NEEDLE],
            carry_len: 0,
            found: needle.is_empty(),
        }
    }

    /// Whether the needle has been seen.
    pub fn found(&self) -> bool {
        self.found
    }

    /// Looks at the next piece.
    pub fn push(&mut self, piece: &[u8]) {
        if self.found || piece.is_empty() {
            return;
        }
        let keep = self.needle.len() - 1;
        // Across the boundary: the carry followed by the start of the piece.
        let mut joint = [0u8; 2 * MAX_NEEDLE];
        let head = &piece[..piece.len().min(keep)];
        let joint_len = self.carry_len + head.len();
        joint[..self.carry_len].copy_from_slice(&self.carry[..self.carry_len]);
        joint[self.carry_len..joint_len].copy_from_slice(head);
        if contains(&joint[..joint_len], self.needle) || contains(piece, self.needle) {
            self.found = true;
            return;
        }
        // The new carry: the last `keep` bytes of carry + piece.
        let tail: &[u8] = if piece.len() >= keep {
            &piece[piece.len() - keep..]
        } else {
            &joint[joint_len.saturating_sub(keep)..joint_len]
        };
        self.carry[..tail.len()].copy_from_slice(tail);
        self.carry_len = tail.len();
    }
}

/// Whether `needle` occurs in `haystack` (a scan for its first byte, then a compare:
/// SSE data rarely holds that byte, so this stays a tight loop).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let mut from = 0;
    while let Some(at) = haystack[from..].iter().position(|&b| b == first) {
        let at = from + at;
        if haystack[at + 1..].starts_with(rest) {
            return true;
        }
        from = at + 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(pieces: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in pieces {
            encode_chunk(&mut out, p);
        }
        out.extend_from_slice(LAST_CHUNK);
        out
    }

    /// Decodes `input` fed in pieces cut at `cuts`; returns (data, consumed, done).
    fn decode_split(input: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, usize, bool), ChunkedError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut consumed = 0;
        let mut start = 0;
        for &end in cuts.iter().chain(std::iter::once(&input.len())) {
            let piece = &input[start..end];
            let n = d.decode(piece, |b| out.extend_from_slice(b))?;
            consumed += n;
            if n < piece.len() {
                break;
            }
            start = end;
        }
        Ok((out, consumed, d.is_done()))
    }

    #[test]
    fn chunked_round_trip_at_every_split() {
        let body = encoded(&[
            b"data: {\"a\":1}\n\n",
            b"x",
            &[b'y'; 300],
            b"data: [DONE]\n\n",
        ]);
        let want: Vec<u8> = [
            &b"data: {\"a\":1}\n\n"[..],
            b"x",
            &[b'y'; 300],
            b"data: [DONE]\n\n",
        ]
        .concat();
        for a in 0..=body.len() {
            for b in [a, (a + 1).min(body.len()), (a + 7).min(body.len())] {
                let (data, consumed, done) = decode_split(&body, &[a, b]).expect("valid");
                assert_eq!(data, want, "split at {a},{b}");
                assert_eq!(consumed, body.len());
                assert!(done);
            }
        }
    }

    #[test]
    fn chunked_stops_at_the_end_of_the_body() {
        let mut input = encoded(&[b"hello"]);
        let body_len = input.len();
        input.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let (data, consumed, done) = decode_split(&input, &[]).expect("valid");
        assert_eq!(data, b"hello");
        assert_eq!(consumed, body_len);
        assert!(done);
    }

    #[test]
    fn chunked_skips_extensions_and_trailers_and_takes_upper_hex() {
        let input =
            b"A;name=value\r\n0123456789\r\n1\r\nZ\r\n0\r\nx-trailer: 1\r\nx-other: 2\r\n\r\nrest";
        let (data, consumed, done) = decode_split(input, &[3]).expect("valid");
        assert_eq!(data, b"0123456789Z");
        assert_eq!(consumed, input.len() - 4);
        assert!(done);
    }

    #[test]
    fn chunked_incomplete_is_not_done() {
        let body = encoded(&[b"abc"]);
        for end in 0..body.len() {
            let (_, consumed, done) = decode_split(&body[..end], &[]).expect("valid prefix");
            assert_eq!(consumed, end);
            assert!(!done, "done after {end} of {} bytes", body.len());
        }
    }

    #[test]
    fn chunked_rejects_bad_framing() {
        for bad in [
            &b"xyz\r\n"[..],
            b"\r\n",
            b"3\r\nabcX",
            b"3\r\nabc\rX",
            b"3\rX",
            b"1000000000000000\r\n",
            b"0\r\n\rX",
        ] {
            assert!(
                decode_split(bad, &[]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn encode_chunk_writes_hex_sizes() {
        let mut out = Vec::new();
        encode_chunk(&mut out, &[b'a'; 26]);
        encode_chunk(&mut out, b"");
        assert_eq!(&out[..4], b"1a\r\n");
        assert_eq!(out.len(), 4 + 26 + 2);
    }

    #[test]
    fn request_heads() {
        let req =
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{\"a\":1}";
        let head = parse_request(req).expect("valid").expect("complete");
        assert_eq!(head.method, "POST");
        assert_eq!(head.path, "/v1/chat/completions");
        assert_eq!(head.framing, Framing::Length(12));
        assert!(!head.close);
        assert_eq!(&req[head.head_len..], b"{\"a\":1}");
        assert_eq!(parse_request(&req[..20]).expect("valid prefix"), None);

        let req =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n";
        let head = parse_request(req).expect("valid").expect("complete");
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.close);

        let req = b"GET / HTTP/1.0\r\n\r\n";
        let head = parse_request(req).expect("valid").expect("complete");
        assert_eq!(head.framing, Framing::Length(0));
        assert!(head.close);

        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(
                parse_request(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_heads() {
        let resp = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let head = parse_response(resp).expect("valid").expect("complete");
        assert_eq!(
            (head.status, head.framing, head.close),
            (200, Framing::Chunked, false)
        );
        assert_eq!(head.head_len, resp.len());

        let resp = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata";
        let head = parse_response(resp).expect("valid").expect("complete");
        assert_eq!((head.framing, head.close), (Framing::Close, true));

        let resp = b"HTTP/1.1 204 No Content\r\n\r\n";
        let head = parse_response(resp).expect("valid").expect("complete");
        assert_eq!((head.status, head.framing), (204, Framing::Length(0)));
    }

    #[test]
    fn contains_finds_needles_anywhere_and_only_whole() {
        assert!(contains(b"abc", b""));
        assert!(contains(b"[DONE]", b"[DONE]"));
        assert!(contains(b"x[[DONE]", b"[DONE]"));
        assert!(contains(b"[DON[DONE]]", b"[DONE]"));
        assert!(!contains(b"[DONE", b"[DONE]"));
        assert!(!contains(b"", b"["));
        assert!(!contains(b"DONE]", b"[DONE]"));
    }

    #[test]
    fn finder_sees_a_needle_cut_anywhere() {
        let text = b"data: {\"x\":1}\n\ndata: [DONE]\n\n";
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let mut f = Finder::new(b"[DONE]");
                f.push(&text[..a]);
                f.push(&text[a..b]);
                f.push(&text[b..]);
                assert!(f.found(), "cut at {a},{b}");
            }
        }
        // One byte at a time, and a near miss.
        let mut f = Finder::new(b"[DONE]");
        for b in text.iter() {
            f.push(std::slice::from_ref(b));
        }
        assert!(f.found());
        let mut f = Finder::new(b"[DONE]");
        for piece in [&b"[DO"[..], b"N", b"", b"X]", b"[DONE"] {
            f.push(piece);
        }
        assert!(!f.found());
    }
}
