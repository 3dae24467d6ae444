//! A response body's framing decoded out of the read buffer: a length, chunked, or up
//! to the close; everything that is not data bounded.

use std::io;

use bytes::{Buf as _, Bytes, BytesMut};

use super::invalid;

/// Longest chunk-size line accepted.
const MAX_LINE: usize = 8 * 1024;
/// Most bytes of chunk extensions accepted over one body (hyper's limit).
const MAX_EXTENSIONS: u64 = 16 * 1024;
/// Largest trailer section accepted (hyper's limit).
const MAX_TRAILERS: u64 = 16 * 1024;
/// Room made in the read buffer before a read, and the most made for a long body.
pub(super) const READ_MIN: usize = 8 * 1024;
const READ_MAX: usize = 64 * 1024;

/// Where a body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// This many bytes are still to come.
    Length(u64),
    /// A chunked body.
    Chunked(Chunk),
    /// The body ends when the upstream closes the connection.
    UntilClose,
    /// The body ended.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk are still to come.
    Data(u64),
    /// The line end after a chunk's data is next.
    DataEnd,
    /// Trailer lines, up to an empty one.
    Trailers,
}

/// What decoding the buffered bytes gave.
pub(super) enum Step {
    Data(Bytes),
    NeedMore,
    Done,
}

/// A body's decoding: where it is, and what it has used of the bounds on what is not
/// data (chunk extensions, trailers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decoder {
    pub(super) state: State,
    extensions: u64,
    trailers: u64,
}

impl Decoder {
    pub(super) fn new(state: State) -> Self {
        Decoder {
            state,
            extensions: 0,
            trailers: 0,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        matches!(self.state, State::Done | State::Length(0))
    }

    /// Decodes from the front of `buf`: the next piece of body, or what is missing.
    pub(super) fn step(&mut self, buf: &mut BytesMut) -> io::Result<Step> {
        loop {
            match &mut self.state {
                State::Done | State::Length(0) => {
                    self.state = State::Done;
                    return Ok(Step::Done);
                }
                State::UntilClose if buf.is_empty() => return Ok(Step::NeedMore),
                State::UntilClose => return Ok(Step::Data(buf.split().freeze())),
                State::Length(rem) | State::Chunked(Chunk::Data(rem)) => {
                    if buf.is_empty() {
                        return Ok(Step::NeedMore);
                    }
                    let n = (*rem).min(buf.len() as u64);
                    *rem -= n;
                    let data = buf.split_to(n as usize).freeze();
                    match self.state {
                        State::Length(0) => self.state = State::Done,
                        State::Chunked(Chunk::Data(0)) => {
                            self.state = State::Chunked(Chunk::DataEnd)
                        }
                        _ => {}
                    }
                    return Ok(Step::Data(data));
                }
                State::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(buf, MAX_LINE as u64)? else {
                        return Ok(Step::NeedMore);
                    };
                    let (size, extensions) = chunk_size(&line)?;
                    self.extensions += extensions;
                    if self.extensions > MAX_EXTENSIONS {
                        return Err(invalid(format!(
                            "the upstream's chunked body has over {} KiB of chunk extensions",
                            MAX_EXTENSIONS / 1024
                        )));
                    }
                    self.state = if size == 0 {
                        State::Chunked(Chunk::Trailers)
                    } else {
                        State::Chunked(Chunk::Data(size))
                    };
                }
                State::Chunked(Chunk::DataEnd) => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                    } else if buf.starts_with(b"\n") {
                        buf.advance(1);
                    } else if buf.is_empty() || &buf[..] == b"\r" {
                        return Ok(Step::NeedMore);
                    } else {
                        return Err(invalid(
                            "the upstream's chunked body has data past a chunk's end",
                        ));
                    }
                    self.state = State::Chunked(Chunk::Size);
                }
                State::Chunked(Chunk::Trailers) => {
                    let room = MAX_TRAILERS - self.trailers;
                    let Some(line) = take_line(buf, room)? else {
                        return Ok(Step::NeedMore);
                    };
                    // The line and its `\r\n`.
                    self.trailers += line.len() as u64 + 2;
                    if line.is_empty() {
                        self.state = State::Done;
                    } else if self.trailers > MAX_TRAILERS {
                        return Err(over_trailers());
                    }
                }
            }
        }
    }

    /// How much room to make in the read buffer before the next read.
    pub(super) fn read_size(&self) -> usize {
        match self.state {
            State::Length(rem) | State::Chunked(Chunk::Data(rem)) => {
                rem.clamp(READ_MIN as u64, READ_MAX as u64) as usize
            }
            _ => READ_MIN,
        }
    }
}

fn over_trailers() -> io::Error {
    invalid(format!(
        "the upstream's chunked body has trailers over {} KiB",
        MAX_TRAILERS / 1024
    ))
}

/// Takes one line (without its `\r\n` or `\n`) off the front of `buf`, if a whole one is
/// there; a line longer than `max` is an error.
fn take_line(buf: &mut BytesMut, max: u64) -> io::Result<Option<BytesMut>> {
    match memchr::memchr(b'\n', buf) {
        Some(end) if end as u64 > max => Err(long_line(max)),
        Some(end) => {
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            if line.ends_with(b"\r") {
                line.truncate(end - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() as u64 > max => Err(long_line(max)),
        None => Ok(None),
    }
}

fn long_line(max: u64) -> io::Error {
    if max == MAX_LINE as u64 {
        invalid(format!(
            "the upstream's chunked body has a line over {} KiB",
            MAX_LINE / 1024
        ))
    } else {
        over_trailers()
    }
}

/// The size on a chunk-size line (hex digits, then maybe `;extensions`), and how many
/// bytes of extensions the line has.
fn chunk_size(line: &[u8]) -> io::Result<(u64, u64)> {
    let (digits, extensions) = match memchr::memchr(b';', line) {
        Some(i) => (&line[..i], (line.len() - i) as u64),
        None => (line, 0),
    };
    let digits = digits.trim_ascii();
    let bad = || invalid("the upstream's chunked body has a bad chunk size");
    if digits.is_empty() || digits.len() > 15 {
        return Err(bad());
    }
    let mut size = 0u64;
    for &d in digits {
        let v = (d as char).to_digit(16).ok_or_else(bad)?;
        size = size * 16 + u64::from(v);
    }
    Ok((size, extensions))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed `step` bytes at a time: the body and how decoding ended.
    fn decode(state: State, wire: &[u8], step: usize) -> (Vec<u8>, io::Result<State>) {
        let mut state = Decoder::new(state);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match state.step(&mut buf) {
                    Ok(Step::Data(d)) => body.extend_from_slice(&d),
                    Ok(Step::NeedMore) => break,
                    Ok(Step::Done) => return (body, Ok(State::Done)),
                    Err(e) => return (body, Err(e)),
                }
            }
        }
        (body, Ok(state.state))
    }

    #[test]
    fn chunked_bodies_decode_however_the_bytes_arrive() {
        let wire =
            b"5;name=value\r\nhello\r\n6\r\n world\r\nA\n, and more\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, wire.len()] {
            let (body, end) = decode(State::Chunked(Chunk::Size), wire, step);
            assert_eq!(body, b"hello world, and more", "step {step}");
            assert_eq!(end.expect("decoded"), State::Done, "step {step}");
        }
        // Up to the last byte, the body is not over.
        let (body, end) = decode(State::Chunked(Chunk::Size), &wire[..wire.len() - 1], 4);
        assert_eq!(body, b"hello world, and more");
        assert_eq!(end.expect("partial"), State::Chunked(Chunk::Trailers));
        // A body with a length ends after that many bytes, whatever follows.
        let mut buf = BytesMut::from(&b"abcdef"[..]);
        let mut state = Decoder::new(State::Length(4));
        assert!(matches!(state.step(&mut buf), Ok(Step::Data(d)) if d == "abcd"));
        assert_eq!(state.state, State::Done);
        assert_eq!(&buf[..], b"ef");
    }

    #[test]
    fn malformed_chunked_bodies_are_errors() {
        for wire in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"1234567890abcdef0\r\n",
            b"3\r\nabcXY",
        ] {
            let (_, end) = decode(State::Chunked(Chunk::Size), wire, 1);
            let e = end.expect_err("malformed");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{wire:?}: {e}");
        }
        let long = vec![b'1'; MAX_LINE + 2];
        let (_, end) = decode(State::Chunked(Chunk::Size), &long, long.len());
        assert!(end.expect_err("too long").to_string().contains("line over"));
    }

    #[test]
    fn what_is_not_data_is_bounded() {
        // Trailers: lines of 1 KiB each, 17 of them.
        let line = format!("x-t: {}\r\n", "a".repeat(1000));
        let mut wire = b"1\r\na\r\n0\r\n".to_vec();
        for _ in 0..17 {
            wire.extend_from_slice(line.as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let (_, end) = decode(State::Chunked(Chunk::Size), &wire, 100);
        let e = end.expect_err("too many trailers");
        assert!(e.to_string().contains("trailers over 16 KiB"), "{e}");
        // One trailer line past the budget, never ended.
        let mut wire = b"0\r\nx-t: ".to_vec();
        wire.extend(std::iter::repeat_n(b'a', 17 * 1024));
        let (_, end) = decode(State::Chunked(Chunk::Size), &wire, 512);
        assert!(end
            .expect_err("unbounded")
            .to_string()
            .contains("trailers over"));
        // Within the budget, trailers are fine.
        let mut wire = b"1\r\na\r\n0\r\n".to_vec();
        for _ in 0..15 {
            wire.extend_from_slice(line.as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let (body, end) = decode(State::Chunked(Chunk::Size), &wire, 100);
        assert_eq!((body, end.expect("decoded")), (b"a".to_vec(), State::Done));

        // Chunk extensions: 1 KiB on each of 17 chunks.
        let ext = format!(";e={}", "b".repeat(1020));
        let mut wire = Vec::new();
        for _ in 0..17 {
            wire.extend_from_slice(format!("1{ext}\r\nz\r\n").as_bytes());
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let (body, end) = decode(State::Chunked(Chunk::Size), &wire, 64);
        assert!(body.len() < 17);
        let e = end.expect_err("too many extensions");
        assert!(e.to_string().contains("chunk extensions"), "{e}");
    }
}
