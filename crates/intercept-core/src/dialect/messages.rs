//! Anthropic Messages.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{
    whitelisted, Assembled, Dialect, DialectKind, Prepared, Relay, StreamAssembler, Summary,
};
use crate::body::{JsonBody, RawJson};
use crate::error::{error_type_for_status, Error};
use crate::rollout::Sampling;
use crate::sse::SseEvent;
use crate::trace::record::Usage;

const SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop_sequences",
    "thinking",
    "tool_choice",
    "output_config",
];

/// The `anthropic-version` sent upstream (it replaces the harness's).
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Anthropic Messages: `POST /v1/messages` (and `/v1/messages/count_tokens`, relayed and
/// never recorded), secret in `x-api-key` or `Authorization: Bearer`; a stream ends with
/// `event: message_stop`.
///
/// Overrides: `model` forced; the harness's `temperature` and `top_p` are dropped and the
/// session's applied if set; `max_tokens` is replaced only when the session sets it (the
/// API requires one); `reasoning_effort` becomes `output_config.effort`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessagesDialect;

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

fn usage_of(u: Option<&Value>) -> Usage {
    let w = u
        .and_then(|u| serde_json::from_value::<WireUsage>(u.clone()).ok())
        .unwrap_or_default();
    let cached = w.cache_read_input_tokens.unwrap_or(0);
    Usage {
        prompt_tokens: w.input_tokens + w.cache_creation_input_tokens.unwrap_or(0) + cached,
        completion_tokens: w.output_tokens,
        cached_input_tokens: cached,
        reasoning_tokens: 0,
    }
}

fn finish_of(stop_reason: Option<&str>) -> Option<String> {
    stop_reason.map(|r| {
        match r {
            "end_turn" | "stop_sequence" => "stop",
            "max_tokens" => "length",
            "tool_use" => "tool_calls",
            other => other,
        }
        .to_owned()
    })
}

fn read_message(v: &Value) -> Result<Summary, Error> {
    let obj = v
        .as_object()
        .ok_or_else(|| Error::UpstreamMalformed("expected a message object".into()))?;
    if obj.get("type").and_then(Value::as_str) == Some("error") {
        let message = obj
            .get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("error");
        return Err(Error::upstream_status(502, message.to_owned(), None));
    }
    if !obj.get("content").is_some_and(Value::is_array) {
        return Err(Error::UpstreamMalformed(
            "expected a message with a `content` array".into(),
        ));
    }
    Ok(Summary {
        finish_reason: finish_of(obj.get("stop_reason").and_then(Value::as_str)),
        usage: usage_of(obj.get("usage")),
        message: None,
    })
}

impl Dialect for MessagesDialect {
    fn kind(&self) -> DialectKind {
        DialectKind::Messages
    }

    fn routes(&self) -> &'static [&'static str] {
        &["/v1/messages", "/messages"]
    }

    fn upstream_path(&self) -> &'static str {
        "/v1/messages"
    }

    fn aux_routes(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("/v1/messages/count_tokens", "/v1/messages/count_tokens"),
            ("/messages/count_tokens", "/v1/messages/count_tokens"),
        ]
    }

    fn secret<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .filter(|s| !s.is_empty())
            .or_else(|| super::bearer(headers))
    }

    fn upstream_auth(&self, api_key: &str, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(api_key) {
            headers.insert(HeaderName::from_static("x-api-key"), v);
        }
    }

    fn upstream_headers(&self, headers: &mut HeaderMap) {
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
    }

    fn error_body(&self, status: u16, message: &str) -> Bytes {
        let body = json!({"type": "error", "error": {"type": error_type_for_status(status), "message": message}});
        Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
    }

    fn error_event(&self, error: &Error) -> Bytes {
        let mut out = b"event: error\ndata: ".to_vec();
        out.extend_from_slice(&self.error_body(error.status(), &error.to_string()));
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    fn mediate(
        &self,
        body: &mut JsonBody,
        policy: &crate::network::NetworkPolicy,
    ) -> Result<Vec<String>, Error> {
        super::mediate::messages(body, policy)
    }

    fn prepare(
        &self,
        body: &mut JsonBody,
        model: &str,
        sampling: &Sampling,
    ) -> Result<Prepared, Error> {
        match body.raw("messages").map(|r| r.first().copied()) {
            Some(Some(b'[')) => {}
            _ => {
                return Err(Error::invalid(
                    "`messages` is required: send the conversation as an array of messages",
                ))
            }
        }
        body.set("model", model)?;
        for key in ["temperature", "top_p"] {
            body.remove(key);
            if let Some(v) = sampling.get(key).filter(|v| !v.is_null()) {
                body.set(key, v)?;
            }
        }
        for key in ["max_tokens", "top_k", "stop_sequences", "thinking"] {
            if let Some(v) = sampling.get(key).filter(|v| !v.is_null()) {
                body.set(key, v)?;
            }
        }
        if let Some(effort) = sampling.get("reasoning_effort").filter(|v| !v.is_null()) {
            let mut config: Map<String, Value> = match body.value("output_config") {
                Some(Value::Object(o)) => o,
                _ => Map::new(),
            };
            config.insert("effort".into(), effort.clone());
            body.set("output_config", &config)?;
        }
        Ok(Prepared {
            stream: body.is_true("stream"),
            hide_stream_usage: false,
        })
    }

    fn sampling_of(&self, body: &JsonBody) -> Sampling {
        whitelisted(body, SAMPLING_KEYS)
    }

    fn summarize(&self, response: &[u8]) -> Result<Summary, Error> {
        let v: Value = crate::body::from_json_bytes(response)
            .map_err(|e| Error::UpstreamMalformed(format!("expected a message object: {e}")))?;
        read_message(&v)
    }

    fn assembler(&self, _prepared: &Prepared) -> Box<dyn StreamAssembler> {
        Box::<MessagesAssembler>::default()
    }

    fn synthesize_stream(&self, response: &Value) -> Vec<Bytes> {
        let mut start = response.clone();
        start["content"] = json!([]);
        start["stop_reason"] = Value::Null;
        start["stop_sequence"] = Value::Null;
        let usage = response.get("usage").cloned().unwrap_or_else(|| json!({}));
        let mut start_usage = usage.clone();
        start_usage["output_tokens"] = json!(0);
        start["usage"] = start_usage;
        let mut events = vec![super::named_event(
            "message_start",
            &json!({"type": "message_start", "message": start}),
        )];
        for (i, block) in response["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let (empty, delta) = match block["type"].as_str() {
                Some("text") => (
                    json!({"type": "text", "text": ""}),
                    json!({"type": "text_delta", "text": block["text"]}),
                ),
                Some("thinking") => (
                    json!({"type": "thinking", "thinking": ""}),
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                ),
                Some("tool_use") => {
                    let mut empty = block.clone();
                    empty["input"] = json!({});
                    let partial =
                        serde_json::to_string(&block["input"]).unwrap_or_else(|_| "{}".into());
                    (
                        empty,
                        json!({"type": "input_json_delta", "partial_json": partial}),
                    )
                }
                _ => (block.clone(), Value::Null),
            };
            events.push(super::named_event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": i, "content_block": empty}),
            ));
            if !delta.is_null() {
                events.push(super::named_event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": i, "delta": delta}),
                ));
            }
            events.push(super::named_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            ));
        }
        events.push(super::named_event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": response["stop_reason"], "stop_sequence": response["stop_sequence"]}, "usage": usage}),
        ));
        events.push(super::named_event(
            "message_stop",
            &json!({"type": "message_stop"}),
        ));
        events
    }
}

#[derive(Debug, Default, Clone)]
struct Block {
    value: Map<String, Value>,
    partial_json: String,
}

#[derive(Debug, Default, Clone)]
struct MessagesAssembler {
    message: Option<Map<String, Value>>,
    blocks: BTreeMap<u64, Block>,
    stopped: bool,
    upstream_error: Option<(u16, String)>,
    unreadable: Option<String>,
}

impl MessagesAssembler {
    fn absorb(&mut self, v: Map<String, Value>) {
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match ty {
            "message_start" => {
                self.message = v.get("message").and_then(Value::as_object).cloned();
            }
            "content_block_start" => {
                let value = v
                    .get("content_block")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                self.blocks.insert(
                    index,
                    Block {
                        value,
                        partial_json: String::new(),
                    },
                );
            }
            "content_block_delta" => self.absorb_block_delta(index, &v),
            "message_delta" => self.absorb_message_delta(&v),
            "message_stop" => self.stopped = true,
            "error" => self.absorb_error(&v),
            _ => {}
        }
    }

    /// A `content_block_delta`: text, thinking, a signature or a piece of a tool call's
    /// JSON input, appended to block `index`.
    fn absorb_block_delta(&mut self, index: u64, v: &Map<String, Value>) {
        let block = self.blocks.entry(index).or_default();
        let Some(delta) = v.get("delta") else { return };
        let append = |block: &mut Block, field: &str, text: &str| {
            let entry = block
                .value
                .entry(field.to_owned())
                .or_insert_with(|| json!(""));
            if let Value::String(s) = entry {
                s.push_str(text);
            }
        };
        match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => append(
                block,
                "text",
                delta.get("text").and_then(Value::as_str).unwrap_or(""),
            ),
            Some("thinking_delta") => append(
                block,
                "thinking",
                delta.get("thinking").and_then(Value::as_str).unwrap_or(""),
            ),
            Some("signature_delta") => append(
                block,
                "signature",
                delta.get("signature").and_then(Value::as_str).unwrap_or(""),
            ),
            Some("input_json_delta") => block.partial_json.push_str(
                delta
                    .get("partial_json")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            ),
            _ => {}
        }
    }

    /// A `message_delta`: the message's members (a `null` one only where the message has
    /// none), and its usage.
    fn absorb_message_delta(&mut self, v: &Map<String, Value>) {
        let message = self.message.get_or_insert_with(Map::new);
        if let Some(Value::Object(delta)) = v.get("delta") {
            for (k, val) in delta {
                if !val.is_null() || !message.contains_key(k) {
                    message.insert(k.clone(), val.clone());
                }
            }
        }
        if let Some(Value::Object(usage)) = v.get("usage") {
            let entry = message.entry("usage").or_insert_with(|| json!({}));
            if let Value::Object(existing) = entry {
                for (k, val) in usage {
                    if !val.is_null() {
                        existing.insert(k.clone(), val.clone());
                    }
                }
            }
        }
    }

    /// An `error` event: its status (by its type) and message, for `finish`.
    fn absorb_error(&mut self, v: &Map<String, Value>) {
        let err = v.get("error");
        let ty = err
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("api_error");
        let status = match ty {
            "overloaded_error" => 529,
            "rate_limit_error" => 429,
            "invalid_request_error" => 400,
            _ => 502,
        };
        let message = err
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("upstream error event");
        self.upstream_error = Some((status, message.to_owned()));
    }
}

impl StreamAssembler for MessagesAssembler {
    fn push(&mut self, event: &SseEvent<'_>) -> Relay {
        if self.stopped {
            return Relay::Withhold;
        }
        let Some(data) = event.data() else {
            return Relay::Forward;
        };
        match crate::body::from_json_bytes::<Map<String, Value>>(&data) {
            Ok(v) => self.absorb(v),
            Err(e) => {
                self.unreadable
                    .get_or_insert_with(|| format!("unreadable Messages event: {e}"));
            }
        }
        if self.stopped || event.event_name() == Some(b"message_stop") {
            self.stopped = true;
            Relay::Withhold
        } else {
            Relay::Forward
        }
    }

    fn saw_terminal(&self) -> bool {
        self.stopped
    }

    fn finish(mut self: Box<Self>) -> Result<Assembled, Error> {
        if let Some((status, message)) = self.upstream_error.take() {
            return Err(Error::upstream_status(status, message, None));
        }
        if let Some(e) = self.unreadable.take() {
            return Err(Error::UpstreamMalformed(e));
        }
        if !self.stopped {
            return Err(Error::UpstreamMalformed(
                "upstream stream ended before its terminal event (`message_stop`)".into(),
            ));
        }
        let response = (*self).assemble(false)?;
        let summary = read_message(&response)?;
        Ok(Assembled {
            response: RawJson::from_value(&response),
            summary,
        })
    }

    fn partial(&self) -> Option<crate::RawJson> {
        if self.message.is_none() && self.blocks.is_empty() {
            return None;
        }
        self.clone()
            .assemble(true)
            .ok()
            .map(|v| RawJson::from_value(&v))
    }
}

impl MessagesAssembler {
    /// The message built from what arrived. For a `partial` one, a tool input cut off
    /// mid-JSON is kept as the text that arrived (`{"partial_json": ...}`).
    fn assemble(self, partial: bool) -> Result<Value, Error> {
        let mut message = self.message.unwrap_or_default();
        let mut content = Vec::with_capacity(self.blocks.len());
        for (_, mut block) in self.blocks {
            if block.value.get("type").and_then(Value::as_str) == Some("tool_use")
                || !block.partial_json.is_empty()
            {
                let input = if block.partial_json.trim().is_empty() {
                    json!({})
                } else {
                    match serde_json::from_str(&block.partial_json) {
                        Ok(input) => input,
                        Err(_) if partial => json!({"partial_json": block.partial_json}),
                        Err(e) => {
                            return Err(Error::UpstreamMalformed(format!(
                                "tool input is not valid JSON: {e}"
                            )))
                        }
                    }
                };
                block.value.insert("input".into(), input);
            }
            content.push(Value::Object(block.value));
        }
        message.insert("content".into(), Value::Array(content));
        message.entry("type").or_insert_with(|| json!("message"));
        message.entry("role").or_insert_with(|| json!("assistant"));
        Ok(Value::Object(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body(v: Value) -> JsonBody {
        JsonBody::parse(Bytes::from(serde_json::to_vec(&v).expect("json"))).expect("body")
    }

    #[test]
    fn secret_from_x_api_key_or_bearer() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer b"));
        assert_eq!(MessagesDialect.secret(&h), Some("b"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        assert_eq!(MessagesDialect.secret(&h), Some("k"));
    }

    #[test]
    fn overrides() {
        let mut b = body(json!({"model":"claude","max_tokens":100,"temperature":1,"messages":[]}));
        let s = json!({"top_p":0.9,"reasoning_effort":"high"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        MessagesDialect
            .prepare(&mut b, "policy", &s)
            .expect("prepare");
        let v = b.to_value();
        assert_eq!(
            v,
            json!({"model":"policy","max_tokens":100,"messages":[],"top_p":0.9,"output_config":{"effort":"high"}})
        );
        let err = MessagesDialect.error_body(429, "slow");
        let e: Value = serde_json::from_slice(&err).expect("json");
        assert_eq!(
            e,
            json!({"type":"error","error":{"type":"rate_limit_error","message":"slow"}})
        );
    }

    fn events(text: &str, thinking: &str, tool_json: &str, cuts: &[usize]) -> (Value, Vec<String>) {
        let split = |s: &str| -> Vec<String> {
            let chars: Vec<char> = s.chars().collect();
            let mut out = Vec::new();
            let mut last = 0;
            for c in cuts {
                let c = (*c).min(chars.len());
                if c > last {
                    out.push(chars[last..c].iter().collect());
                    last = c;
                }
            }
            out.push(chars[last..].iter().collect());
            out
        };
        let mut ev = vec![(
            "message_start",
            json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":1}}}),
        )];
        let mut content = Vec::new();
        let mut idx = 0;
        if !thinking.is_empty() {
            ev.push(("content_block_start", json!({"type":"content_block_start","index":idx,"content_block":{"type":"thinking","thinking":""}})));
            for p in split(thinking) {
                ev.push(("content_block_delta", json!({"type":"content_block_delta","index":idx,"delta":{"type":"thinking_delta","thinking":p}})));
            }
            ev.push((
                "content_block_stop",
                json!({"type":"content_block_stop","index":idx}),
            ));
            content.push(json!({"type":"thinking","thinking":thinking}));
            idx += 1;
        }
        ev.push(("content_block_start", json!({"type":"content_block_start","index":idx,"content_block":{"type":"text","text":""}})));
        for p in split(text) {
            ev.push(("content_block_delta", json!({"type":"content_block_delta","index":idx,"delta":{"type":"text_delta","text":p}})));
        }
        ev.push((
            "content_block_stop",
            json!({"type":"content_block_stop","index":idx}),
        ));
        content.push(json!({"type":"text","text":text}));
        idx += 1;
        let tool = !tool_json.is_empty();
        if tool {
            ev.push(("content_block_start", json!({"type":"content_block_start","index":idx,"content_block":{"type":"tool_use","id":"tu_1","name":"f","input":{}}})));
            for p in split(tool_json) {
                ev.push(("content_block_delta", json!({"type":"content_block_delta","index":idx,"delta":{"type":"input_json_delta","partial_json":p}})));
            }
            ev.push((
                "content_block_stop",
                json!({"type":"content_block_stop","index":idx}),
            ));
            content.push(json!({"type":"tool_use","id":"tu_1","name":"f","input":serde_json::from_str::<Value>(tool_json).expect("json")}));
        }
        let stop = if tool { "tool_use" } else { "end_turn" };
        ev.push(("message_delta", json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":{"output_tokens":9}})));
        ev.push(("message_stop", json!({"type":"message_stop"})));
        let full = json!({"id":"msg_1","type":"message","role":"assistant","model":"m","content":content,"stop_reason":stop,"stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":9}});
        let sse = ev
            .into_iter()
            .map(|(name, v)| format!("event: {name}\ndata: {v}\n\n"))
            .collect();
        (full, sse)
    }

    proptest! {
        #[test]
        fn stream_assembly_equals_the_non_streamed_message(
            text in "[a-zA-Z é\"]{0,20}",
            thinking in "[a-z ]{0,10}",
            tool in prop_oneof![Just(String::new()), "\\{\"q\": \"[a-z]{0,8}\"\\}"],
            cuts in prop::collection::vec(0usize..24, 0..4),
        ) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let (full, sse) = events(&text, &thinking, &tool, &cuts);
            let mut a = MessagesDialect.assembler(&Prepared::default());
            let mut relays = Vec::new();
            for e in &sse {
                relays.push(a.push(&SseEvent::new(e.as_bytes())));
            }
            prop_assert_eq!(relays.last(), Some(&Relay::Withhold));
            prop_assert_eq!(relays.iter().filter(|r| **r == Relay::Withhold).count(), 1);
            let out = a.finish().expect("assembled");
            prop_assert_eq!(&out.response.to_value(), &full);
            let summary = MessagesDialect.summarize(&serde_json::to_vec(&full).expect("json")).expect("summary");
            prop_assert_eq!(out.summary, summary);
        }
    }

    #[test]
    fn a_stream_cut_short_keeps_what_arrived() {
        let mut a = MessagesDialect.assembler(&Prepared::default());
        assert!(a.partial().is_none(), "nothing arrived yet");
        for e in [
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"stop_reason\":null}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\": \\\"ab\"}}\n\n",
        ] {
            a.push(&SseEvent::new(e.as_bytes()));
        }
        let partial = a.partial().expect("something arrived").to_value();
        assert_eq!(partial["id"], "m1");
        assert_eq!(partial["content"][0]["text"], "Hel");
        assert!(partial["stop_reason"].is_null(), "{partial}");
        // A tool input cut off mid-JSON is kept as the text that arrived.
        assert_eq!(
            partial["content"][1]["input"]["partial_json"], "{\"q\": \"ab",
            "{partial}"
        );
        let e = a.finish().expect_err("no message_stop");
        assert!(e.to_string().contains("terminal event"), "{e}");
    }
}
