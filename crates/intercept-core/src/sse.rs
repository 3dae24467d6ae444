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
#[derive(Debug, Default)]
pub struct SseSplitter {
    buf: BytesMut,
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

    /// Appends bytes read from the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held that do not yet form a complete event.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete event (delimiter included), if one is buffered.
    pub fn next_event(&mut self) -> Option<Bytes> {
        let buf = &self.buf[..];
        while self.pos < buf.len() {
            let b = buf[self.pos];
            let ending = match b {
                b'\n' => 1,
                b'\r' => match buf.get(self.pos + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    // A `\r` at the end may be the first half of `\r\n`: wait for more.
                    None => return None,
                },
                _ => {
                    self.pos += 1;
                    continue;
                }
            };
            let blank = self.pos == self.line_start;
            self.pos += ending;
            self.line_start = self.pos;
            if blank {
                let event = self.buf.split_to(self.pos).freeze();
                self.pos = 0;
                self.line_start = 0;
                return Some(event);
            }
        }
        None
    }

    /// At end of stream: whatever is left (an event without its closing blank line).
    pub fn finish(&mut self) -> Option<Bytes> {
        self.pos = 0;
        self.line_start = 0;
        if self.buf.is_empty() {
            None
        } else {
            Some(self.buf.split().freeze())
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
        let end = rest
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
            .unwrap_or(rest.len());
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
