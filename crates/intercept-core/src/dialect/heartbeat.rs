//! Dialect-valid heartbeat events for a stream whose upstream is silent.
//!
//! Some SDK watchdogs count parsed events and never see SSE comments. A [`Heartbeat`]
//! follows the events a stream relays to the harness and, when asked, makes an event
//! that the dialect's official SDK readers accept at that point of the stream, or says
//! that none is valid there (the relay then sends a comment):
//!
//! - **Chat**: a chunk with an empty `delta.content`, with the stream's `id`, `created`
//!   and `model` (before the first chunk: `chatcmpl-intercept-heartbeat`, now, and the
//!   session's model); none once a chunk carried a finish reason (SDKs would reset it).
//! - **Responses**: `response.in_progress` carrying the response snapshot of
//!   `response.created`, numbered after the last event; every later event's
//!   `sequence_number` is shifted by the heartbeats sent, so the harness sees consecutive
//!   numbers. None before `response.created` (the SDKs' stream helpers require it first)
//!   and none after a terminal event.
//! - **Anthropic**: a no-op `message_delta` (`stop_reason: null`, the `output_tokens` of
//!   `message_start`) between `message_start` (the SDKs require it first) and the
//!   upstream's own `message_delta` (whose stop reason a heartbeat would reset).
//! - Other dialects: none.
//!
//! Heartbeats are the harness's only: they never reach an assembler or a record.

use std::sync::LazyLock;

use bytes::{BufMut, Bytes, BytesMut};
use memchr::memmem::{Finder, FinderRev};
use serde_json::value::RawValue;

use super::DialectKind;
use crate::sse::SseEvent;

/// The `id` of Chat heartbeats sent before the stream's first chunk.
pub const CHAT_HEARTBEAT_ID: &str = "chatcmpl-intercept-heartbeat";

/// A stream's heartbeat state (see the [module docs](self)).
#[derive(Debug)]
pub struct Heartbeat {
    state: State,
}

#[derive(Debug)]
enum State {
    Chat {
        /// `"id":…,"object":…,"created":…,"model":…` of the stream's chunks, as JSON
        /// members.
        head: Bytes,
        /// The stream's own head was read from its first chunk.
        seen: bool,
        done: bool,
    },
    Responses {
        /// The `response` of `response.created`.
        snapshot: Option<Box<RawValue>>,
        /// The upstream's last `sequence_number`.
        last: Option<u64>,
        /// Heartbeats sent: the shift of every later event's number.
        offset: u64,
        done: bool,
    },
    Anthropic {
        /// `message_start`'s `usage.output_tokens`, once it went out.
        started: Option<u64>,
        done: bool,
    },
    Never,
}

fn chat_head(id: &str, created: u64, model: &str) -> Bytes {
    let mut out = BytesMut::new();
    let s = |v: &str| serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into());
    out.put_slice(
        format!(
            "\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":{}",
            s(id),
            s(model)
        )
        .as_bytes(),
    );
    out.freeze()
}

impl Heartbeat {
    /// The heartbeat of a stream of `kind` whose calls are sent with `model`.
    pub fn new(kind: DialectKind, model: &str) -> Self {
        let state = match kind {
            DialectKind::ChatCompletions => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                State::Chat {
                    head: chat_head(CHAT_HEARTBEAT_ID, now, model),
                    seen: false,
                    done: false,
                }
            }
            DialectKind::Responses => State::Responses {
                snapshot: None,
                last: None,
                offset: 0,
                done: false,
            },
            DialectKind::Messages => State::Anthropic {
                started: None,
                done: false,
            },
            _ => State::Never,
        };
        Heartbeat { state }
    }

    /// Notes one upstream event on its way to the harness (with data, as relayed);
    /// returns it as it must go out: unchanged, except a Responses event after
    /// heartbeats, whose `sequence_number` is shifted.
    pub fn relay(&mut self, event: Bytes) -> Bytes {
        let parsed = SseEvent::new(&event);
        match &mut self.state {
            State::Chat { head, seen, done } => {
                let Some(data) = parsed.data() else {
                    return event;
                };
                if data.as_ref() == b"[DONE]" {
                    *done = true;
                    return event;
                }
                if !*seen {
                    #[derive(serde::Deserialize)]
                    struct Head<'a> {
                        #[serde(borrow)]
                        id: Option<std::borrow::Cow<'a, str>>,
                        created: Option<u64>,
                        #[serde(borrow)]
                        model: Option<std::borrow::Cow<'a, str>>,
                    }
                    if let Ok(h) = serde_json::from_slice::<Head<'_>>(&data) {
                        if let (Some(id), Some(created), Some(model)) = (h.id, h.created, h.model) {
                            *head = chat_head(&id, created, &model);
                            *seen = true;
                        }
                    }
                }
                if has_finish_reason(&data) {
                    *done = true;
                }
                event
            }
            State::Responses {
                snapshot,
                last,
                offset,
                done,
            } => {
                let name = parsed.event_name().unwrap_or_default();
                let data = parsed.data();
                let kind: &[u8] = if name.is_empty() {
                    // Without an `event:` line, the type is in the data.
                    data.as_deref().map(event_type).unwrap_or_default()
                } else {
                    name
                };
                match kind {
                    b"response.created" if snapshot.is_none() => {
                        #[derive(serde::Deserialize)]
                        struct Created {
                            response: Box<RawValue>,
                        }
                        if let Some(Ok(c)) = data.as_deref().map(serde_json::from_slice::<Created>)
                        {
                            *snapshot = Some(c.response);
                        }
                    }
                    b"response.completed"
                    | b"response.incomplete"
                    | b"response.failed"
                    | b"error" => *done = true,
                    _ => {}
                }
                match sequence_number(&event) {
                    Some((at, len, n)) => {
                        *last = Some(n);
                        if *offset == 0 {
                            return event;
                        }
                        let mut out = BytesMut::with_capacity(event.len() + 4);
                        out.put_slice(&event[..at]);
                        out.put_slice((n + *offset).to_string().as_bytes());
                        out.put_slice(&event[at + len..]);
                        out.freeze()
                    }
                    None => event,
                }
            }
            State::Anthropic { started, done } => {
                match parsed.event_name().unwrap_or_default() {
                    b"message_start" => {
                        let tokens = parsed
                            .data()
                            .and_then(|d| serde_json::from_slice::<serde_json::Value>(&d).ok())
                            .and_then(|v| v["message"]["usage"]["output_tokens"].as_u64())
                            .unwrap_or(0);
                        *started = Some(tokens);
                    }
                    b"message_delta" | b"message_stop" | b"error" => *done = true,
                    _ => {}
                }
                event
            }
            State::Never => event,
        }
    }

    /// A heartbeat event valid at this point of the stream, or `None` where no event is
    /// (the relay sends a comment instead).
    pub fn beat(&mut self) -> Option<Bytes> {
        match &mut self.state {
            State::Chat { head, done, .. } => {
                if *done {
                    return None;
                }
                let mut out = BytesMut::with_capacity(head.len() + 100);
                out.put_slice(b"data: {");
                out.put_slice(head);
                out.put_slice(
                    b",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":null}]}\n\n",
                );
                Some(out.freeze())
            }
            State::Responses {
                snapshot,
                last,
                offset,
                done,
            } => {
                let snapshot = snapshot.as_ref().filter(|_| !*done)?;
                let n = last.map_or(0, |l| l + 1) + *offset;
                *offset += 1;
                let mut out = BytesMut::with_capacity(snapshot.get().len() + 120);
                out.put_slice(
                    b"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":",
                );
                out.put_slice(snapshot.get().as_bytes());
                out.put_slice(format!(",\"sequence_number\":{n}}}\n\n").as_bytes());
                Some(out.freeze())
            }
            State::Anthropic { started, done } => {
                let tokens = started.filter(|_| !*done)?;
                Some(Bytes::from(format!(
                    "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":null,\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{tokens}}}}}\n\n"
                )))
            }
            State::Never => None,
        }
    }
}

/// The `type` of a Responses event's data, read without parsing it whole.
fn event_type(data: &[u8]) -> &[u8] {
    // Searchers built once: `memmem::find` builds one at every call, a cost comparable
    // to the search on an event's few hundred bytes.
    static TYPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"type\""));
    let Some(at) = TYPE.find(data) else {
        return b"";
    };
    let rest = skip_ws(&data[at + 6..]);
    let Some(rest) = rest.strip_prefix(b":") else {
        return b"";
    };
    let rest = skip_ws(rest);
    let Some(rest) = rest.strip_prefix(b"\"") else {
        return b"";
    };
    let end = memchr::memchr(b'"', rest).unwrap_or(0);
    &rest[..end]
}

fn skip_ws(b: &[u8]) -> &[u8] {
    let n = b
        .iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &b[n..]
}

/// Where the event's `sequence_number` value is: its offset and length in `event`, and
/// the number. The last `"sequence_number"` key with a number is the event's own: the
/// nested objects of Responses events carry none (metadata values are strings), and
/// inside strings the key's quotes are escaped.
fn sequence_number(event: &[u8]) -> Option<(usize, usize, u64)> {
    const KEY: &[u8] = b"\"sequence_number\"";
    static FINDER: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(KEY));
    let finder = &*FINDER;
    let mut end = event.len();
    while let Some(at) = finder.rfind(&event[..end]) {
        end = at;
        let rest = skip_ws(&event[at + KEY.len()..]);
        let Some(rest) = rest.strip_prefix(b":").map(skip_ws) else {
            continue;
        };
        let start = event.len() - rest.len();
        let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
        if len == 0 {
            continue;
        }
        if let Some(n) = std::str::from_utf8(&rest[..len])
            .ok()
            .and_then(|t| t.parse().ok())
        {
            return Some((start, len, n));
        }
    }
    None
}

/// Whether a Chat chunk carries a finish reason (a `"finish_reason"` that is not
/// `null`).
fn has_finish_reason(data: &[u8]) -> bool {
    const KEY: &[u8] = b"\"finish_reason\"";
    static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
    FINDER.find_iter(data).any(|at| {
        let rest = skip_ws(&data[at + KEY.len()..]);
        rest.strip_prefix(b":")
            .map(skip_ws)
            .is_some_and(|v| !v.starts_with(b"null"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(b: &Bytes) -> &str {
        std::str::from_utf8(b).expect("utf-8")
    }

    #[test]
    fn chat_heartbeats_take_the_stream_head_and_stop_at_the_finish() {
        let mut hb = Heartbeat::new(DialectKind::ChatCompletions, "policy");
        let early = hb.beat().expect("a chunk before the first");
        assert!(text(&early).contains(CHAT_HEARTBEAT_ID));
        assert!(text(&early).contains("\"model\":\"policy\""));
        hb.relay(Bytes::from_static(
            b"data: {\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n",
        ));
        let beat = hb.beat().expect("a chunk");
        let v: serde_json::Value =
            serde_json::from_str(text(&beat).trim().strip_prefix("data: ").expect("data"))
                .expect("json");
        assert_eq!(v["id"], "c-1");
        assert_eq!(v["created"], 7);
        assert_eq!(v["model"], "m");
        assert_eq!(v["choices"][0]["delta"]["content"], "");
        assert!(v["choices"][0]["finish_reason"].is_null());
        hb.relay(Bytes::from_static(
            b"data: {\"id\":\"c-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\": \"stop\"}]}\n\n",
        ));
        assert!(hb.beat().is_none(), "no heartbeat after the finish reason");
    }

    #[test]
    fn responses_heartbeats_wait_for_created_and_renumber_what_follows() {
        let mut hb = Heartbeat::new(DialectKind::Responses, "m");
        assert!(hb.beat().is_none(), "nothing valid before response.created");
        let created = Bytes::from_static(
            b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"metadata\":{\"sequence_number\":\"x\"}}}\n\n",
        );
        assert_eq!(hb.relay(created.clone()), created);
        let beat = hb.beat().expect("in progress");
        assert!(text(&beat).starts_with("event: response.in_progress\ndata: "));
        assert!(
            text(&beat).contains("\"sequence_number\":1}"),
            "{}",
            text(&beat)
        );
        assert!(text(&beat).contains("\"response\":{\"id\":\"r\""));
        let delta = hb.relay(Bytes::from_static(
            b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\\\"sequence_number\\\": 9\",\"sequence_number\": 1}\n\n",
        ));
        assert!(
            text(&delta).ends_with("\"sequence_number\": 2}\n\n"),
            "{}",
            text(&delta)
        );
        assert!(
            text(&delta).contains("\\\"sequence_number\\\": 9"),
            "strings untouched"
        );
        let beat = hb.beat().expect("again");
        assert!(text(&beat).contains("\"sequence_number\":3}"));
        let done = hb.relay(Bytes::from_static(
            b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{},\"sequence_number\":2}\n\n",
        ));
        assert!(text(&done).contains("\"sequence_number\":4}"));
        assert!(hb.beat().is_none(), "nothing after the terminal event");
    }

    #[test]
    fn anthropic_heartbeats_sit_between_message_start_and_message_delta() {
        let mut hb = Heartbeat::new(DialectKind::Messages, "m");
        assert!(hb.beat().is_none());
        hb.relay(Bytes::from_static(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        ));
        let beat = hb.beat().expect("message_delta");
        assert!(text(&beat).starts_with("event: message_delta\n"));
        assert!(text(&beat).contains("\"stop_reason\":null"));
        assert!(text(&beat).contains("\"output_tokens\":1"));
        hb.relay(Bytes::from_static(
            b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
        ));
        assert!(hb.beat().is_none());
    }

    #[test]
    fn completions_have_no_heartbeat_event() {
        assert!(Heartbeat::new(DialectKind::Completions, "m")
            .beat()
            .is_none());
    }
}
