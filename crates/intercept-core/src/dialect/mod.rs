//! Wire formats. A [`Dialect`] knows its routes, where the secret travels, its error
//! body, how streaming is requested, which stream event is terminal, how to impose a
//! model and sampling, and how to read a response or assemble a stream for the record.

use std::fmt;

use bytes::Bytes;
use http::HeaderMap;

use crate::body::JsonBody;
pub use crate::dialect_kind::DialectKind;
use crate::error::{error_type_for_status, Error};
use crate::rollout::Sampling;
use crate::sse::SseEvent;
use crate::trace::record::Usage;

mod chat;
mod completions;
pub mod heartbeat;
pub(crate) mod mediate;
mod messages;
mod responses;

pub use chat::ChatDialect;
pub use completions::CompletionsDialect;
pub use heartbeat::Heartbeat;
pub use mediate::mediate_request;
pub use messages::MessagesDialect;
pub use responses::ResponsesDialect;

/// What the server learns from preparing a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The harness asked for a stream.
    pub stream: bool,
    /// The dialect asked the upstream for stream usage the harness did not ask for; the
    /// assembler drops the extra usage event from the relay.
    pub hide_stream_usage: bool,
}

/// Finish reason and usage read from a response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Normalised finish reason.
    pub finish_reason: Option<String>,
    /// Token usage.
    pub usage: Usage,
    /// The sampled message, when the dialect read it in the same pass (Chat answers of
    /// the usual shape: see [`crate::trace::episode::SampledChat`]); the server hands
    /// it to the episode with the record ([`crate::trace::record::SampledHint`]). Boxed: a
    /// summary is moved with the call's state.
    pub message: Option<Box<crate::trace::episode::Message>>,
}

/// A stream, assembled.
#[derive(Debug, Clone, PartialEq)]
pub struct Assembled {
    /// The response object a non-streamed call would have returned, encoded.
    pub response: crate::body::RawJson,
    /// Its finish reason and usage.
    pub summary: Summary,
}

/// What to do with one upstream stream event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Relay {
    /// Send it to the harness now.
    Forward,
    /// Terminal: send it only after the call is recorded.
    Withhold,
    /// Do not send it (an event the harness did not ask for).
    Drop,
}

/// Reads a stream event by event and builds the complete response.
pub trait StreamAssembler: Send + fmt::Debug {
    /// Feeds one raw event (with data); says what to do with it. Errors mean the event
    /// could not be read; relaying may go on, the error is reported by `finish`.
    fn push(&mut self, event: &SseEvent<'_>) -> Relay;

    /// Whether the dialect's terminal event was seen.
    fn saw_terminal(&self) -> bool;

    /// The assembled response, or why there is none (no terminal event, unreadable
    /// events, an error event from the upstream).
    fn finish(self: Box<Self>) -> Result<Assembled, Error>;

    /// For a call cut short (cancelled, disconnected, broken, over its size limit): the
    /// response assembled from the events that did arrive, which is what was relayed. Its
    /// finish reason is `null` unless the upstream sent one. `None` when nothing can be
    /// assembled (no event yet, or a dialect whose stream carries the response only in
    /// its terminal event, as Responses does).
    fn partial(&self) -> Option<crate::RawJson> {
        None
    }
}

/// Keeps [`Dialect`] implemented only here: the server serves these four wire formats
/// (its routes, error shapes, stream relays and heartbeats are theirs), so a dialect
/// made elsewhere would have nowhere to plug in.
mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ChatDialect {}
    impl Sealed for super::CompletionsDialect {}
    impl Sealed for super::ResponsesDialect {}
    impl Sealed for super::MessagesDialect {}
}

/// One wire format. Sealed: implemented by [`ChatDialect`], [`CompletionsDialect`],
/// [`ResponsesDialect`] and [`MessagesDialect`] only.
pub trait Dialect: sealed::Sealed + Send + Sync + fmt::Debug + 'static {
    /// Which one.
    fn kind(&self) -> DialectKind;

    /// Paths it serves (e.g. `/v1/chat/completions`).
    fn routes(&self) -> &'static [&'static str];

    /// The path appended to the upstream base URL (e.g. `/chat/completions`).
    fn upstream_path(&self) -> &'static str;

    /// The secret the harness sent. The default reads `Authorization: Bearer <secret>`.
    fn secret<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        bearer(headers)
    }

    /// Adds the upstream's authentication headers. The default sends
    /// `Authorization: Bearer <key>` (the OpenAI dialects).
    fn upstream_auth(&self, api_key: &str, headers: &mut HeaderMap) {
        if let Ok(v) = http::HeaderValue::from_str(&format!("Bearer {api_key}")) {
            headers.insert(http::header::AUTHORIZATION, v);
        }
    }

    /// Sets headers the dialect always sends upstream (e.g. `anthropic-version`).
    fn upstream_headers(&self, _headers: &mut HeaderMap) {}

    /// Extra routes relayed without a record (e.g. `/v1/messages/count_tokens`), with
    /// the upstream path each goes to.
    fn aux_routes(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The dialect's JSON error body for a status and message.
    fn error_body(&self, status: u16, message: &str) -> Bytes {
        let body = serde_json::json!({
            "error": {"message": message, "type": error_type_for_status(status), "param": null, "code": null}
        });
        Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
    }

    /// The dialect's in-stream error event for `error` (what the official SDKs raise as
    /// an error): its status and text, and whatever else the dialect says of its kind.
    fn error_event(&self, error: &Error) -> Bytes {
        let mut out = b"data: ".to_vec();
        out.extend_from_slice(&self.error_body(error.status(), &error.to_string()));
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    /// Checks the request and imposes the session's model and sampling.
    fn prepare(
        &self,
        body: &mut JsonBody,
        model: &str,
        sampling: &Sampling,
    ) -> Result<Prepared, Error>;

    /// Network-policy mediation (see [`crate::network`]), run on restricted sessions only,
    /// after the request hook: removes every provider-side capability of the body that
    /// could reach a host the policy does not allow, appends
    /// [`crate::network::NOTICE`] to the earliest user message when it removed
    /// something, and returns the value-free JSON paths it removed or narrowed
    /// (`tools[2].type`), in body order. Mediating a mediated body changes nothing. The
    /// default (a dialect whose requests carry no such capability) changes nothing.
    fn mediate(
        &self,
        _body: &mut JsonBody,
        _policy: &crate::network::NetworkPolicy,
    ) -> Result<Vec<String>, Error> {
        Ok(Vec::new())
    }

    /// Token capture (session option `capture_tokens`): asks the upstream for token ids
    /// and logprobs on top of what the harness asked for, and returns the collector that
    /// reads them out of the reply and strips what the harness did not ask for. Runs on
    /// the final request body, after [`Dialect::prepare`] and the request hook. `None`
    /// (the default): this dialect cannot capture tokens.
    fn capture_tokens(
        &self,
        _body: &mut JsonBody,
    ) -> Result<Option<crate::capture::TokenCollector>, Error> {
        Ok(None)
    }

    /// The sampling settings of an effective request, for the record.
    fn sampling_of(&self, body: &JsonBody) -> Sampling;

    /// Reads a non-streamed response: finish reason and usage. An unreadable body is
    /// [`Error::UpstreamMalformed`].
    fn summarize(&self, response: &[u8]) -> Result<Summary, Error>;

    /// A fresh stream assembler for one call.
    fn assembler(&self, prepared: &Prepared) -> Box<dyn StreamAssembler>;

    /// A minimal valid stream (raw SSE events, terminal event last) that carries a
    /// complete response; used when a hook rewrote a streamed response.
    fn synthesize_stream(&self, response: &serde_json::Value) -> Vec<Bytes>;
}

/// One `data:` event.
pub(crate) fn data_event(value: &serde_json::Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    out.extend_from_slice(&serde_json::to_vec(value).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// One `event:` + `data:` event.
pub(crate) fn named_event(name: &str, value: &serde_json::Value) -> Bytes {
    let mut out = format!("event: {name}\ndata: ").into_bytes();
    out.extend_from_slice(&serde_json::to_vec(value).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The value of `Authorization: Bearer <token>`, if present.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

/// The text of an upstream error object: its `message`, else the whole object.
pub(crate) fn error_text(err: &serde_json::Value) -> String {
    err.get("message")
        .and_then(serde_json::Value::as_str)
        .map_or_else(|| err.to_string(), str::to_owned)
}

/// Copies the keys of `sampling` that appear in `whitelist` out of `body`.
pub(crate) fn whitelisted(body: &JsonBody, whitelist: &[&str]) -> Sampling {
    let mut out = Sampling::new();
    for (key, raw) in body.members() {
        if !whitelist.contains(&key) {
            continue;
        }
        match sampling_value(raw) {
            Some(serde_json::Value::Null) | None => {}
            Some(v) => {
                out.insert(key.to_owned(), v);
            }
        }
    }
    out
}

/// A sampling setting's raw JSON as a value. The usual ones, a count or a seed
/// (`max_tokens`, `n`, `seed`: digits that fit a `u64`) and a flag, are read without
/// the parser; the rest go through serde_json.
fn sampling_value(raw: &[u8]) -> Option<serde_json::Value> {
    match raw {
        b"true" => return Some(serde_json::Value::Bool(true)),
        b"false" => return Some(serde_json::Value::Bool(false)),
        b"null" => return Some(serde_json::Value::Null),
        // Up to 19 digits always fit a u64; a valid JSON integer has no leading zero.
        digits
            if !digits.is_empty()
                && digits.len() <= 19
                && digits.iter().all(u8::is_ascii_digit) =>
        {
            let n = digits
                .iter()
                .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            return Some(serde_json::Value::from(n));
        }
        _ => {}
    }
    crate::body::from_json_bytes(raw).ok()
}

/// Joins an upstream base URL and a dialect path without doubling a version segment
/// (`…/api/v1` + `/v1/messages` gives `…/api/v1/messages`) and without swallowing any
/// other segment (`…/chat` + `/chat/completions` gives `…/chat/chat/completions`).
pub fn join_url(base: &str, path: &str) -> String {
    let base = base.trim_end_matches('/');
    let path = path.trim_start_matches('/');
    if let Some((first, rest)) = path.split_once('/') {
        let is_version = first.len() > 1
            && first.starts_with('v')
            && first[1..].bytes().all(|b| b.is_ascii_digit());
        if is_version && base.rsplit('/').next() == Some(first) {
            return format!("{base}/{rest}");
        }
    }
    format!("{base}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_settings_read_as_serde_json_reads_them() {
        let values = [
            "0",
            "7",
            "256",
            "1234567890123456789",
            "18446744073709551615",
            "99999999999999999999",
            "-1",
            "0.7",
            "1e3",
            "1.0",
            "true",
            "false",
            "null",
            "\"high\"",
            "[\"\\n\", \"stop\"]",
            "{\"a\": [1, {\"b\": null}]}",
        ];
        for v in values {
            let text =
                format!(r#"{{"model": "m", "temperature": {v}, "seed": {v}, "messages": []}}"#);
            let body = JsonBody::parse(bytes::Bytes::from(text)).expect("body");
            let got = whitelisted(&body, &["temperature", "seed", "max_tokens"]);
            let value: serde_json::Value = serde_json::from_str(v).expect("json");
            let mut expected = Sampling::new();
            if !value.is_null() {
                expected.insert("seed".into(), value.clone());
                expected.insert("temperature".into(), value);
            }
            assert_eq!(got, expected, "{v}");
            for (key, raw) in body
                .members()
                .filter(|(k, _)| *k != "model" && *k != "messages")
            {
                let parsed: serde_json::Value = serde_json::from_slice(raw).expect("raw");
                assert_eq!(sampling_value(raw), Some(parsed), "{key} = {v}");
            }
        }
    }

    #[test]
    fn join_url_dedups_only_versions() {
        assert_eq!(
            join_url("http://h/api/v1", "/v1/messages"),
            "http://h/api/v1/messages"
        );
        assert_eq!(
            join_url("http://h/api/v1/", "/chat/completions"),
            "http://h/api/v1/chat/completions"
        );
        assert_eq!(
            join_url("http://h/chat", "/chat/completions"),
            "http://h/chat/chat/completions"
        );
        assert_eq!(join_url("http://h", "/v1/messages"), "http://h/v1/messages");
        assert_eq!(
            join_url("http://h/v2", "/v1/messages"),
            "http://h/v2/v1/messages"
        );
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("abc"),
        );
        assert_eq!(bearer(&h), None);
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("bearer  "),
        );
        assert_eq!(bearer(&h), None);
    }
}

#[cfg(test)]
mod synthesis_tests {
    use super::*;
    use crate::sse::{SseEvent, SseSplitter};
    use serde_json::json;

    /// A synthesised stream assembles back into the response it carries.
    fn round_trip(dialect: &dyn Dialect, response: serde_json::Value) -> serde_json::Value {
        let events = dialect.synthesize_stream(&response);
        let mut splitter = SseSplitter::new();
        let mut assembler = dialect.assembler(&Prepared::default());
        for e in events {
            splitter.push(&e);
        }
        while let Some(e) = splitter.next_event() {
            assembler.push(&SseEvent::new(&e));
        }
        assert!(assembler.saw_terminal());
        assembler.finish().expect("assembled").response.to_value()
    }

    #[test]
    fn chat_messages_and_responses_synthesis_round_trips() {
        let chat = json!({"id":"c","created":1,"model":"m","object":"chat.completion",
            "choices":[{"index":0,"message":{"role":"assistant","content":"rewritten"},"finish_reason":"stop","logprobs":null}]});
        let back = round_trip(&ChatDialect, chat.clone());
        assert_eq!(back["choices"][0]["message"]["content"], "rewritten");
        let msg = json!({"id":"m1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"},{"type":"tool_use","id":"t","name":"f","input":{"a":1}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":4}});
        assert_eq!(round_trip(&MessagesDialect, msg.clone()), msg);
        let resp = json!({"id":"r","object":"response","status":"completed","output":[{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"output_text","text":"x"}]}],"usage":{"input_tokens":1,"output_tokens":1}});
        assert_eq!(round_trip(&ResponsesDialect, resp.clone()), resp);
    }
}
