//! The per-call trace record: one per real upstream exchange, also on failure.

use serde::{Deserialize, Serialize};

use crate::body::{JsonBody, RawJson};
use crate::dialect_kind::DialectKind;
use crate::error::{Error, ErrorKind};

mod fields;

pub(crate) use fields::{write as fields_write, LastFields, Shape};
pub use fields::{CallField, Omit, CALL_FIELDS};

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

/// How a call's prompt ids were made, when intercept (or the session) rendered the prompt
/// itself instead of letting the engine render the conversation (token-in/token-out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TokenPath {
    /// The previous turn's prompt ids and completion ids, closed and extended by only the
    /// new messages: the branch continues.
    Bridged,
    /// The whole conversation rendered (a first turn, or a turn the bridge declined: the
    /// branch breaks here).
    Rendered,
    /// Sent to the engine's chat endpoint with `return_token_ids` (the session's
    /// `on_mismatch = "chat"`): the engine rendered the prompt.
    Chat,
}

impl TokenPath {
    /// The snake_case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenPath::Bridged => "bridged",
            TokenPath::Rendered => "rendered",
            TokenPath::Chat => "chat",
        }
    }
}

/// The token data of a call whose prompt was rendered to ids before it reached the
/// engine: exactly the ids sent and received, and how the prompt was made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnTokens {
    /// The prompt's ids, as sent to the engine.
    pub prompt_ids: Vec<u32>,
    /// The completion's ids, as the engine returned them.
    pub completion_ids: Vec<u32>,
    /// The log-probability of each completion id (empty when the engine returned none).
    pub logprobs: Vec<f64>,
    /// How the prompt was made; `None` when the session did not say.
    pub path: Option<TokenPath>,
    /// Why the turn was not bridged (the bridge's reason for declining), when it was not.
    pub reason: Option<String>,
}

/// One model call, as recorded on the rollout's trace.
///
/// Serialises to one JSON object (one line of a JSONL trace file). A field added here
/// also goes in the private `write_parts` or `write_tail` that [`CallRecord::write_json`]
/// writes the line with, in the same place (a test compares that line with this type's
/// `Serialize`).
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
    /// How the prompt's ids were made when intercept rendered them (token-in/token-out):
    /// `bridged`, `rendered` or `chat`. Absent when the engine rendered the conversation
    /// itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_path: Option<TokenPath>,
    /// Why the call's prompt was not bridged from the previous turn (the bridge's reason,
    /// `first_turn`, `history_edited`, ...), when [`CallRecord::token_path`] is not
    /// `bridged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_reason: Option<String>,
    /// The episode node the call produced (its sampled response; see
    /// [`crate::trace::episode`]). `None` for a failed call, or when the session keeps no
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
pub struct SampledHint(Option<Box<crate::trace::message::Message>>);

impl SampledHint {
    /// A hint holding `message` (boxed, so that a record, and every future holding one,
    /// grows by a pointer only).
    pub fn new(message: Option<Box<crate::trace::message::Message>>) -> Self {
        SampledHint(message)
    }

    /// The message, if the server read it.
    pub fn get(&self) -> Option<&crate::trace::message::Message> {
        self.0.as_deref()
    }

    /// Takes the message out, leaving no hint.
    pub fn take(&mut self) -> Option<crate::trace::message::Message> {
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

    /// The record as serde writes it, field by field in the order of [`CALL_FIELDS`]
    /// (`fields.rs`). The request needs no UTF-8 check: its source was checked when it
    /// was parsed and what was set since is JSON (see [`JsonBody::set_raw`]); the
    /// response is checked.
    fn write_parts(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let response = match &self.response {
            Some(r) => Some(
                std::str::from_utf8(r.bytes())
                    .map_err(<serde_json::Error as serde::ser::Error>::custom)?,
            ),
            None => None,
        };
        fields::write(self, Shape::Record { response }, out)
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

/// Seconds since the Unix epoch, as a float.
pub fn epoch_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn minimal() -> CallRecord {
        serde_json::from_value(serde_json::json!({
            "session": "s\"é", "seq": 3, "dialect": "chat_completions", "endpoint": "/chat/completions",
            "model": "m", "stream": false, "sampling": {}, "request": {"model": "x"},
            "response": null, "finish_reason": null, "usage": {"prompt_tokens": 1,
            "completion_tokens": 2, "cached_input_tokens": 0, "reasoning_tokens": 0},
            "status": 200, "started_at": 1.5, "ended_at": 2.25, "ttfb_ms": null, "error": null
        }))
        .expect("record")
    }

    /// A record with every field away from its default.
    pub(crate) fn full() -> CallRecord {
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
        full.token_path = Some(TokenPath::Bridged);
        full.token_reason = Some("first_turn".into());
        full.truncated = true;
        full
    }

    #[test]
    fn the_line_in_parts_is_what_serde_writes() {
        for record in [minimal(), full()] {
            let serde = serde_json::to_vec(&record).expect("serde");
            assert_eq!(
                String::from_utf8(record.to_json_vec()).expect("utf-8"),
                String::from_utf8(serde).expect("utf-8")
            );
        }
    }

    /// The keys of a JSON object's text, in order.
    pub(crate) fn keys(line: &[u8]) -> Vec<String> {
        #[derive(serde::Deserialize)]
        struct Keys(#[serde(with = "keys_in_order")] Vec<String>);
        mod keys_in_order {
            use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
            pub(super) fn deserialize<'de, D: Deserializer<'de>>(
                d: D,
            ) -> Result<Vec<String>, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Vec<String>;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        mut m: A,
                    ) -> Result<Self::Value, A::Error> {
                        let mut out = Vec::new();
                        while let Some((k, IgnoredAny)) = m.next_entry::<String, IgnoredAny>()? {
                            out.push(k);
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V)
            }
        }
        serde_json::from_slice::<Keys>(line).expect("an object").0
    }

    #[test]
    fn serde_and_the_line_follow_the_field_table() {
        let names: Vec<String> = CALL_FIELDS.iter().map(|f| f.name.to_owned()).collect();
        // Every field away from its default: serde writes each field of the table, in
        // its order, and so does the line.
        let full = full();
        assert_eq!(keys(&serde_json::to_vec(&full).expect("serde")), names);
        assert_eq!(keys(&full.to_json_vec()), names);
        // At their defaults, the line leaves out exactly the fields the table says, and
        // serde reads it back whole.
        let kept: Vec<String> = CALL_FIELDS
            .iter()
            .filter(|f| f.omit != Omit::WhenDefault)
            .map(|f| f.name.to_owned())
            .collect();
        let minimal = minimal();
        assert_eq!(keys(&minimal.to_json_vec()), kept);
        let back: CallRecord = serde_json::from_slice(&minimal.to_json_vec()).expect("read");
        assert_eq!(back, minimal);
        // A reader fills in each field left out with the table's default.
        let mut value = serde_json::to_value(&minimal).expect("serde");
        for f in CALL_FIELDS.iter().filter(|f| f.omit == Omit::WhenDefault) {
            let default: serde_json::Value = serde_json::from_str(f.default).expect("json");
            value[f.name] = default;
        }
        assert_eq!(
            serde_json::from_value::<CallRecord>(value).expect("read"),
            minimal
        );
    }

    proptest::proptest! {
        /// Any record: strings with quotes, backslashes, control characters and
        /// non-ASCII text, every dialect, integers and floats of any size (not finite
        /// ones included), every optional field present or absent.
        #[test]
        fn any_record_is_written_as_serde_writes_it(
            text in proptest::collection::vec("[a-z\"\\\\\\x00-\\x1f\\x7fé€😀 ]{0,12}", 5),
            ints in proptest::collection::vec(proptest::num::u64::ANY, 6),
            floats in proptest::collection::vec(proptest::num::f64::ANY, 3),
            flags in proptest::collection::vec(proptest::bool::ANY, 9),
            dialect in 0usize..4,
        ) {
            let mut r = minimal();
            r.session = text[0].clone();
            r.endpoint = text[1].clone();
            r.model = text[2].clone();
            r.dialect = [
                DialectKind::ChatCompletions,
                DialectKind::Responses,
                DialectKind::Messages,
                DialectKind::Completions,
            ][dialect];
            r.seq = ints[0];
            r.status = ints[1] as u16;
            r.epoch = ints[2];
            r.usage = Usage {
                prompt_tokens: ints[3],
                completion_tokens: ints[4],
                cached_input_tokens: ints[5],
                reasoning_tokens: ints[0] / 3,
            };
            r.started_at = floats[0];
            r.ended_at = floats[1];
            r.ttfb_ms = flags[0].then_some(floats[2]);
            r.requested_model = flags[1].then(|| text[3].clone());
            r.finish_reason = flags[2].then(|| text[4].clone());
            r.engine = flags[3].then(|| text[4].clone());
            r.node = flags[4].then_some(ints[1]);
            r.stream = flags[5];
            r.client_disconnected = flags[6];
            r.truncated = flags[7];
            r.token_capture = if flags[8] { TokenCapture::Missing } else { TokenCapture::Off };
            r.completion_logprobs = flags[8].then(|| floats.clone());
            r.error = flags[0].then(|| CallError {
                kind: ErrorKind::Internal,
                message: text[2].clone(),
                status: 500,
            });
            let serde = serde_json::to_vec(&r).expect("serde");
            proptest::prop_assert_eq!(
                String::from_utf8(r.to_json_vec()).expect("utf-8"),
                String::from_utf8(serde).expect("utf-8")
            );
        }
    }
}
