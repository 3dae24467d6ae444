//! Building `event:`/`data:` SSE streams in one buffer, one `Bytes` per event.

use bytes::Bytes;
use serde::Serialize;

use super::chat::write_json;

/// Writes SSE events into one buffer, remembering where each ends.
#[derive(Debug)]
pub(crate) struct SseBuf {
    buf: Vec<u8>,
    ends: Vec<usize>,
    eol: &'static [u8],
}

impl SseBuf {
    pub(crate) fn new(capacity: usize, events: usize, crlf: bool) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
            ends: Vec::with_capacity(events),
            eol: if crlf { b"\r\n" } else { b"\n" },
        }
    }

    /// `event: <name>` (if any), then `data: <json>`, then the blank line.
    pub(crate) fn json(&mut self, name: Option<&str>, data: &impl Serialize) {
        if let Some(name) = name {
            self.buf.extend_from_slice(b"event: ");
            self.buf.extend_from_slice(name.as_bytes());
            self.buf.extend_from_slice(self.eol);
        }
        self.buf.extend_from_slice(b"data: ");
        write_json(&mut self.buf, data);
        self.end();
    }

    /// `data: <data>`, the data written as it is (a JSON document).
    pub(crate) fn raw_data(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(b"data: ");
        self.buf.extend_from_slice(data);
        self.end();
    }

    /// `data: [DONE]`.
    pub(crate) fn done(&mut self) {
        self.buf.extend_from_slice(b"data: [DONE]");
        self.end();
    }

    fn end(&mut self) {
        self.buf.extend_from_slice(self.eol);
        self.buf.extend_from_slice(self.eol);
        self.ends.push(self.buf.len());
    }

    pub(crate) fn into_events(self) -> Vec<Bytes> {
        let all = Bytes::from(self.buf);
        let mut start = 0;
        self.ends
            .into_iter()
            .map(|end| {
                let event = all.slice(start..end);
                start = end;
                event
            })
            .collect()
    }
}
