//! The per-call trace record: one per real upstream exchange, also on failure.

use serde::{Deserialize, Serialize};

use crate::body::{JsonBody, RawJson};
use crate::dialect::DialectKind;
use crate::error::{Error, ErrorKind};

/// Token usage of one call, read from the upstream's `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens as the upstream counts them (cached ones included).
    pub prompt_tokens: u64,
    /// Completion tokens (reasoning included).
    pub completion_tokens: u64,
    /// Prompt tokens served from the upstream's cache.
    pub cached_input_tokens: u64,
    /// Completion tokens spent on reasoning.
    pub reasoning_tokens: u64,
}

/// What went wrong with a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallError {
    /// Machine-readable kind (see [`ErrorKind`]).
    pub kind: ErrorKind,
    /// What happened, for a person.
    pub message: String,
    /// The HTTP status the harness got (or would have got).
    pub status: u16,
}

impl From<&Error> for CallError {
    fn from(e: &Error) -> Self {
        CallError {
            kind: e.kind(),
            message: e.to_string(),
            status: e.status(),
        }
    }
}

/// Whether a call's token ids and logprobs were captured (session option
/// `capture_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TokenCapture {
    /// Capture was not asked for (or the dialect cannot capture): no token fields.
    #[default]
    Off,
    /// The upstream returned prompt and completion token ids.
    Captured,
    /// Capture was asked for but the upstream did not return prompt and completion
    /// token ids (an engine without `return_token_ids`, or a failed call); whatever it
    /// did return is kept.
    Missing,
}

/// One model call, as recorded on the rollout's trace.
///
/// Serialises to one JSON object (one line of a JSONL trace file). A field added here
/// also goes in the private `Head` or `Tail` that [`CallRecord::write_json`] writes the
/// line from (a test compares that line with this type's `Serialize`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The session (rollout) id.
    pub session: String,
    /// Per-session sequence number, in the order calls started (from 0).
    pub seq: u64,
    /// The wire format.
    pub dialect: DialectKind,
    /// The upstream path the call was sent to (e.g. `/chat/completions`).
    pub endpoint: String,
    /// The model sent upstream (the session's, imposed on the request).
    pub model: String,
    /// The model the harness asked for in its request, before the session's was
    /// imposed; `None` when the request named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_model: Option<String>,
    /// Whether the harness asked for a stream.
    pub stream: bool,
    /// The sampling settings of the effective request (the dialect's whitelist).
    pub sampling: serde_json::Map<String, serde_json::Value>,
    /// The request body exactly as sent upstream.
    pub request: JsonBody,
    /// The response: the upstream JSON, or for a stream the assembled completion. For a
    /// stream cut short (cancelled, disconnected, broken, ended early; `error` says
    /// which), the completion assembled from the events that arrived, which is what the
    /// harness was sent; its finish reason is `null` unless the upstream sent one
    /// (Chat Completions, Completions and Messages; a Responses stream carries its
    /// response only in its terminal event). `None` when nothing usable arrived, and for
    /// a `truncated` answer.
    pub response: Option<RawJson>,
    /// Normalised finish reason (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
    /// Token usage.
    pub usage: Usage,
    /// HTTP status the harness got (for a stream whose headers were sent: 200).
    pub status: u16,
    /// When the call started, seconds since the Unix epoch.
    pub started_at: f64,
    /// When the call ended (recorded), seconds since the Unix epoch.
    pub ended_at: f64,
    /// Time to the first upstream byte of the body, milliseconds.
    pub ttfb_ms: Option<f64>,
    /// Whether the harness disconnected before the call ended. The upstream exchange is
    /// still read to its end and recorded.
    #[serde(default)]
    pub client_disconnected: bool,
    /// `null` on success.
    pub error: Option<CallError>,
    /// The pause epoch in which the call was admitted (0 until the first resume): which
    /// weights served it.
    #[serde(default)]
    pub epoch: u64,
    /// The engine base URL the call went to (one of the upstream's `base_urls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Whether token ids were captured.
    #[serde(default, skip_serializing_if = "is_off")]
    pub token_capture: TokenCapture,
    /// The prompt's token ids, as the engine tokenised it (capture only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The completion's token ids (first choice; a stream's chunks concatenated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_token_ids: Option<Vec<u32>>,
    /// The log-probability of each completion token, aligned with
    /// `completion_token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_logprobs: Option<Vec<f64>>,
    /// The episode node the call produced (its sampled response; see
    /// [`crate::episode`]). `None` for a failed call, or when the session keeps no
    /// episode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// What network-policy mediation removed from the request (`request` is the
    /// mediated body); absent when nothing was removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::network::PolicyEvent>,
    /// The upstream's answer passed the server's `max_response_bytes` and was cut off:
    /// the call failed (`error` says how many bytes arrived) and `response` is `None`.
    /// Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The sampled message, when the server read it out of `response` in the pass that
    /// read the summary, so that the session's episode does not read the response again.
    /// Not serialised and not compared; a session takes it when it commits the record.
    #[serde(skip)]
    pub sampled: SampledHint,
}

/// [`CallRecord::sampled`]: the first choice's message of a record's `response`, already
/// read. It must be that message (the server sets it from the same bytes); a record
/// without it is read from its `response`.
#[derive(Debug, Clone, Default)]
pub struct SampledHint(Option<Box<crate::episode::Message>>);

impl SampledHint {
    /// A hint holding `message` (boxed, so that a record, and every future holding one,
    /// grows by a pointer only).
    pub fn new(message: Option<Box<crate::episode::Message>>) -> Self {
        SampledHint(message)
    }

    /// The message, if the server read it.
    pub fn get(&self) -> Option<&crate::episode::Message> {
        self.0.as_deref()
    }

    /// Takes the message out, leaving no hint.
    pub fn take(&mut self) -> Option<crate::episode::Message> {
        self.0.take().map(|m| *m)
    }
}

impl PartialEq for SampledHint {
    /// A hint is a cache of what `response` holds: records that differ only in it are
    /// the same record.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

fn is_off(c: &TokenCapture) -> bool {
    *c == TokenCapture::Off
}

impl CallRecord {
    /// The record as JSON. A record that cannot be serialised (a body that is not UTF-8)
    /// is replaced by an error record: the same call, without its request and response,
    /// whose error says why. A trace is therefore always written and answered whole,
    /// never as `null`.
    pub fn to_json_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.json_size_hint());
        self.write_json(&mut out);
        out
    }

    /// Appends the record as JSON to `out` (see [`CallRecord::to_json_vec`]), so that a
    /// writer can put many records, or a record and its newline, in one buffer. The
    /// request and response are copied in as they stand.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let start = out.len();
        if let Err(e) = self.write_parts(out) {
            out.truncate(start);
            let replaced = CallRecord {
                request: crate::body::JsonBody::empty(),
                response: None,
                error: Some(CallError {
                    kind: ErrorKind::Internal,
                    message: format!("the record of this call could not be serialised: {e}"),
                    status: self.status,
                }),
                prompt_token_ids: None,
                completion_token_ids: None,
                completion_logprobs: None,
                sampled: Default::default(),
                ..self.clone()
            };
            // Every remaining field is plain data and always serialises.
            if serde_json::to_writer(&mut *out, &replaced).is_err() {
                out.truncate(start);
                out.extend_from_slice(b"{}");
            }
        }
    }

    /// The record as serde writes it, in three parts: the fields before `request`, the
    /// two bodies copied in as they stand (the request's pieces one after the other,
    /// without joining them first), and the fields after `response`. The request needs
    /// no UTF-8 check: its source was checked when it was parsed and what was set since
    /// is JSON (see [`JsonBody::set_raw`]); the response is checked.
    fn write_parts(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let response = match &self.response {
            Some(r) => Some(
                std::str::from_utf8(r.bytes())
                    .map_err(<serde_json::Error as serde::ser::Error>::custom)?,
            ),
            None => None,
        };
        serde_json::to_writer(
            &mut *out,
            &Head {
                session: &self.session,
                seq: self.seq,
                dialect: self.dialect,
                endpoint: &self.endpoint,
                model: &self.model,
                requested_model: &self.requested_model,
                stream: self.stream,
                sampling: &self.sampling,
            },
        )?;
        out.pop(); // the closing brace
        out.extend_from_slice(b",\"request\":");
        for chunk in self.request.chunks() {
            out.extend_from_slice(&chunk);
        }
        out.extend_from_slice(b",\"response\":");
        out.extend_from_slice(response.map_or(&b"null"[..], str::as_bytes));
        let tail = out.len();
        serde_json::to_writer(
            &mut *out,
            &Tail {
                finish_reason: &self.finish_reason,
                usage: &self.usage,
                status: self.status,
                started_at: self.started_at,
                ended_at: self.ended_at,
                ttfb_ms: self.ttfb_ms,
                client_disconnected: self.client_disconnected,
                error: &self.error,
                epoch: self.epoch,
                engine: &self.engine,
                token_capture: self.token_capture,
                prompt_token_ids: &self.prompt_token_ids,
                completion_token_ids: &self.completion_token_ids,
                completion_logprobs: &self.completion_logprobs,
                node: &self.node,
                policy: &self.policy,
                truncated: self.truncated,
            },
        )?;
        // The tail's opening brace continues the object.
        out[tail] = b',';
        Ok(())
    }

    /// About how many bytes [`CallRecord::write_json`] writes: the bodies, plus room for
    /// the other fields, so that one allocation usually holds the line.
    pub fn json_size_hint(&self) -> usize {
        let tokens = self.prompt_token_ids.as_ref().map_or(0, Vec::len)
            + self.completion_token_ids.as_ref().map_or(0, Vec::len);
        self.request.size_hint()
            + self.response.as_ref().map_or(0, |r| r.bytes().len())
            + tokens * 8
            + 1024
    }

    /// Whether the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }

    /// One JSON line (no trailing newline), as [`CallRecord::to_json_vec`] makes it.
    pub fn to_json_line(&self) -> String {
        // serde_json writes UTF-8 only.
        String::from_utf8(self.to_json_vec()).unwrap_or_default()
    }
}

/// The fields of a [`CallRecord`] before `request`, as its `Serialize` writes them.
#[derive(Serialize)]
struct Head<'a> {
    session: &'a str,
    seq: u64,
    dialect: DialectKind,
    endpoint: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    requested_model: &'a Option<String>,
    stream: bool,
    sampling: &'a serde_json::Map<String, serde_json::Value>,
}

/// The fields of a [`CallRecord`] after `response`, as its `Serialize` writes them.
#[derive(Serialize)]
struct Tail<'a> {
    finish_reason: &'a Option<String>,
    usage: &'a Usage,
    status: u16,
    started_at: f64,
    ended_at: f64,
    ttfb_ms: Option<f64>,
    client_disconnected: bool,
    error: &'a Option<CallError>,
    epoch: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: &'a Option<String>,
    #[serde(skip_serializing_if = "is_off")]
    token_capture: TokenCapture,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: &'a Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_token_ids: &'a Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_logprobs: &'a Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: &'a Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: &'a Option<crate::network::PolicyEvent>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

/// Seconds since the Unix epoch, as a float.
pub fn epoch_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> CallRecord {
        serde_json::from_value(serde_json::json!({
            "session": "s\"é", "seq": 3, "dialect": "chat_completions", "endpoint": "/chat/completions",
            "model": "m", "stream": false, "sampling": {}, "request": {"model": "x"},
            "response": null, "finish_reason": null, "usage": {"prompt_tokens": 1,
            "completion_tokens": 2, "cached_input_tokens": 0, "reasoning_tokens": 0},
            "status": 200, "started_at": 1.5, "ended_at": 2.25, "ttfb_ms": null, "error": null
        }))
        .expect("record")
    }

    #[test]
    fn the_line_in_parts_is_what_serde_writes() {
        let mut full = minimal();
        full.requested_model = Some("asked".into());
        full.stream = true;
        full.sampling = serde_json::json!({"temperature": 0.5, "stop": ["\n"]})
            .as_object()
            .cloned()
            .expect("map");
        // A rewritten request: pieces of the source and set values.
        full.request = JsonBody::parse(bytes::Bytes::from_static(
            br#"{ "model" : "x", "messages": [{"role":"user","content":"h\u00e9"}], "n": 1 }"#,
        ))
        .expect("body");
        full.request.set("model", "policy").expect("set");
        full.request.set("temperature", &0.5).expect("set");
        full.response = Some(RawJson::new(bytes::Bytes::from_static(
            br#"{"choices": [ {"message": {"content": "ok"}} ]}"#,
        )));
        full.finish_reason = Some("stop".into());
        full.ttfb_ms = Some(12.5);
        full.client_disconnected = true;
        full.error = Some(CallError {
            kind: ErrorKind::UpstreamStatus,
            message: "bad".into(),
            status: 502,
        });
        full.epoch = 2;
        full.engine = Some("http://e/v1".into());
        full.token_capture = TokenCapture::Captured;
        full.prompt_token_ids = Some(vec![1, 2]);
        full.completion_token_ids = Some(vec![3]);
        full.completion_logprobs = Some(vec![-0.25]);
        full.node = Some(7);
        full.policy = Some(crate::network::PolicyEvent::new(vec![
            "tools[0].type".into()
        ]));
        full.truncated = true;
        for record in [minimal(), full] {
            let serde = serde_json::to_vec(&record).expect("serde");
            assert_eq!(
                String::from_utf8(record.to_json_vec()).expect("utf-8"),
                String::from_utf8(serde).expect("utf-8")
            );
        }
    }
}
