//! Server-sent-event framing that keeps every byte.
//!
//! intercept relays an upstream stream event by event, unchanged, so it needs the raw
//! bytes of each event (not a decoded `data` string as SSE client libraries give). The
//! [`SseSplitter`] cuts a byte stream at blank lines — any mix of `\r\n`, `\n` and `\r`
//! line endings, one `\r\n` never counted as two endings, delimiters split across chunks
//! handled — and yields each event with its delimiter attached. [`SseEvent`] then reads
//! the `event:` and `data:` fields of one raw event.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

/// Incremental splitter of an SSE byte stream into raw events.
///
/// Events are cut out of the pushed buffers without copying when they lie within one
/// ([`SseSplitter::push_bytes`]); only an event split across reads is copied, once.
#[derive(Debug, Default)]
pub struct SseSplitter {
    /// Bytes pushed and not yet handed out as events.
    buf: Bytes,
    /// Where the line being scanned starts.
    line_start: usize,
    /// How far the buffer has been scanned.
    pos: usize,
}

impl SseSplitter {
    /// A new, empty splitter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the stream (copied).
    pub fn push(&mut self, chunk: &[u8]) {
        self.push_bytes(Bytes::copy_from_slice(chunk));
    }

    /// Appends bytes read from the stream. When nothing is pending, the events are
    /// later handed out as slices of `chunk` itself, without a copy.
    pub fn push_bytes(&mut self, chunk: Bytes) {
        if self.buf.is_empty() {
            self.buf = chunk;
        } else if !chunk.is_empty() {
            let mut joined = BytesMut::with_capacity(self.buf.len() + chunk.len());
            joined.extend_from_slice(&self.buf);
            joined.extend_from_slice(&chunk);
            self.buf = joined.freeze();
        }
    }

    /// Bytes held that do not yet form a complete event.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete event (delimiter included), if one is buffered.
    pub fn next_event(&mut self) -> Option<Bytes> {
        let buf = &self.buf[..];
        while let Some(found) = memchr::memchr2(b'\n', b'\r', &buf[self.pos..]) {
            let at = self.pos + found;
            let ending = if buf[at] == b'\n' {
                1
            } else {
                match buf.get(at + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    // A `\r` at the end may be the first half of `\r\n`: wait for more.
                    None => {
                        self.pos = at;
                        return None;
                    }
                }
            };
            let blank = at == self.line_start;
            self.pos = at + ending;
            self.line_start = self.pos;
            if blank {
                let event = self.buf.split_to(self.pos);
                self.pos = 0;
                self.line_start = 0;
                return Some(event);
            }
        }
        self.pos = buf.len();
        None
    }

    /// At end of stream: whatever is left (an event without its closing blank line).
    pub fn finish(&mut self) -> Option<Bytes> {
        self.pos = 0;
        self.line_start = 0;
        if self.buf.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.buf))
        }
    }
}

/// The fields of one raw SSE event.
#[derive(Debug, Clone, Copy)]
pub struct SseEvent<'a> {
    raw: &'a [u8],
}

fn lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = raw;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
        let line = &rest[..end];
        let mut next = end;
        if rest.get(end) == Some(&b'\r') && rest.get(end + 1) == Some(&b'\n') {
            next += 2;
        } else if end < rest.len() {
            next += 1;
        }
        rest = &rest[next..];
        Some(line)
    })
}

fn field<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(name)?;
    let rest = rest.strip_prefix(b":")?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

impl<'a> SseEvent<'a> {
    /// Wraps the raw bytes of one event.
    pub fn new(raw: &'a [u8]) -> Self {
        SseEvent { raw }
    }

    /// The raw bytes.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The `data` payload: every `data:` line's value joined by `\n`; `None` when the
    /// event has no `data:` line.
    pub fn data(&self) -> Option<Cow<'a, [u8]>> {
        // The common shape, one `data:` line and the blank line: no joining needed.
        if let Some(rest) = self.raw.strip_prefix(b"data:") {
            let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
            if rest[end..].iter().all(|b| *b == b'\n' || *b == b'\r') {
                let value = &rest[..end];
                return Some(Cow::Borrowed(value.strip_prefix(b" ").unwrap_or(value)));
            }
        }
        let mut out: Option<Cow<'a, [u8]>> = None;
        for line in lines(self.raw) {
            if let Some(value) = field(line, b"data") {
                out = Some(match out {
                    None => Cow::Borrowed(value),
                    Some(prev) => {
                        let mut joined = prev.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        Cow::Owned(joined)
                    }
                });
            }
        }
        out
    }

    /// The `event:` name, if any.
    pub fn event_name(&self) -> Option<&'a [u8]> {
        lines(self.raw).find_map(|l| field(l, b"event"))
    }

    /// Whether the event carries no `data:` line (only comments, blank lines or other
    /// fields). Such events are not relayed as they are: some clients try to decode an
    /// empty payload.
    pub fn is_dataless(&self) -> bool {
        if self.raw.starts_with(b"data:") {
            return false;
        }
        !lines(self.raw).any(|l| field(l, b"data").is_some())
    }

    /// Whether the data is the `[DONE]` sentinel.
    pub fn is_done(&self) -> bool {
        self.data().is_some_and(|d| d.trim_ascii() == b"[DONE]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split_all(chunks: &[&[u8]]) -> Vec<Bytes> {
        let mut s = SseSplitter::new();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c);
            while let Some(e) = s.next_event() {
                out.push(e);
            }
        }
        out.extend(s.finish());
        out
    }

    #[test]
    fn data_of_single_and_multi_line_events() {
        let cases: [(&[u8], Option<&[u8]>); 8] = [
            (b"data: {\"a\":1}\n\n", Some(b"{\"a\":1}")),
            (b"data:x\r\n\r\n", Some(b"x")),
            (b"data:  two spaces\n\n", Some(b" two spaces")),
            (b"data: a\ndata: b\n\n", Some(b"a\nb")),
            (b"data: a\nevent: e\n\n", Some(b"a")),
            (b"event: e\ndata: a\n\n", Some(b"a")),
            (b": comment\n\n", None),
            (
                b"data: tail without blank line",
                Some(b"tail without blank line"),
            ),
        ];
        for (raw, data) in cases {
            let ev = SseEvent::new(raw);
            assert_eq!(
                ev.data().as_deref(),
                data,
                "{}",
                String::from_utf8_lossy(raw)
            );
            assert_eq!(ev.is_dataless(), data.is_none());
        }
    }

    #[test]
    fn events_within_one_buffer_are_not_copied() {
        let input = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: c");
        let mut s = SseSplitter::new();
        s.push_bytes(input.clone());
        let a = s.next_event().expect("first event");
        assert_eq!(&a[..], b"data: a\n\n");
        assert_eq!(a.as_ptr(), input.as_ptr(), "a slice of the pushed buffer");
        assert_eq!(&s.next_event().expect("second")[..], b"data: b\n\n");
        assert!(s.next_event().is_none());
        s.push_bytes(Bytes::from_static(b"\n\n"));
        assert_eq!(&s.next_event().expect("joined")[..], b"data: c\n\n");
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn splits_mixed_line_endings() {
        let stream = b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\r\n\ndata: e";
        let events = split_all(&[stream]);
        let texts: Vec<&[u8]> = events.iter().map(|e| &e[..]).collect();
        assert_eq!(
            texts,
            vec![
                &b"data: a\n\n"[..],
                b"data: b\r\n\r\n",
                b"data: c\r\r",
                b"data: d\r\n\n",
                b"data: e"
            ]
        );
        assert_eq!(SseEvent::new(&events[1]).data().as_deref(), Some(&b"b"[..]));
    }

    #[test]
    fn crlf_split_across_chunks_is_one_ending() {
        let events = split_all(&[b"data: x\r\n\r", b"\ndata: y\n\n"]);
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(&events[0][..], b"data: x\r\n\r\n");
    }

    #[test]
    fn fields() {
        let e = SseEvent::new(b"event: message_stop\ndata: {\"a\":1}\ndata: 2\n\n");
        assert_eq!(e.event_name(), Some(&b"message_stop"[..]));
        assert_eq!(e.data().as_deref(), Some(&b"{\"a\":1}\n2"[..]));
        assert!(SseEvent::new(b": keepalive\n\n").is_dataless());
        assert!(SseEvent::new(b"data:[DONE]\r\n\r\n").is_done());
        assert!(SseEvent::new(b"data: [DONE]\n\n").is_done());
        assert!(!SseEvent::new(b"data: {}\n\n").is_done());
    }

    fn arb_event() -> impl Strategy<Value = String> {
        let eol = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        (
            prop::collection::vec(
                ("(data|event|: c|id): ?[a-z{}\":0-9 ]{0,6}", eol.clone()),
                1..4,
            ),
            eol,
        )
            .prop_map(|(lines, end)| {
                let mut s = String::new();
                let mut last = "";
                for (l, e) in lines {
                    s.push_str(&l);
                    s.push_str(e);
                    last = e;
                }
                // A bare `\r` ending followed by `\n` would read as one `\r\n` ending.
                s.push_str(if last == "\r" && end == "\n" {
                    "\r"
                } else {
                    end
                });
                s
            })
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_events(
            events in prop::collection::vec(arb_event(), 1..6),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let stream: String = events.concat();
            let bytes = stream.as_bytes();
            let whole = split_all(&[bytes]);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for p in points {
                chunks.push(&bytes[last..p]);
                last = p;
            }
            chunks.push(&bytes[last..]);
            let pieces = split_all(&chunks);
            prop_assert_eq!(&pieces, &whole);
            let rejoined: Vec<u8> = pieces.concat();
            prop_assert_eq!(rejoined, bytes.to_vec());
            prop_assert_eq!(whole.len(), events.len());
        }

        #[test]
        fn every_single_byte_boundary(events in prop::collection::vec(arb_event(), 1..4)) {
            let stream: String = events.concat();
            let bytes = stream.as_bytes();
            let whole = split_all(&[bytes]);
            for i in 0..=bytes.len() {
                prop_assert_eq!(&split_all(&[&bytes[..i], &bytes[i..]]), &whole);
            }
            let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
            prop_assert_eq!(&split_all(&bytewise), &whole);
        }
    }
}
