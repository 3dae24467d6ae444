//! OpenAI Chat Completions.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::{
    whitelisted, Assembled, Dialect, DialectKind, Prepared, Relay, StreamAssembler, Summary,
};
use crate::body::{JsonBody, RawJson};
use crate::capture::{CaptureShape, HarnessAsked, TokenCollector};
use crate::episode::{Message, Role};
use crate::error::Error;
use crate::record::Usage;
use crate::session::Sampling;
use crate::sse::SseEvent;

/// Sampling keys recorded for a Chat Completions call.
pub(crate) const CHAT_SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "reasoning_effort",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "response_format",
    "tool_choice",
    "parallel_tool_calls",
    "extra_body",
];

/// OpenAI Chat Completions: `POST /v1/chat/completions`, secret in
/// `Authorization: Bearer`, streaming ends with `data: [DONE]`.
///
/// Overrides: every non-null key of the session's sampling is set on the body (extra
/// keys included), then `model` is forced. The harness's own sampling keys stay unless
/// the session sets the same key. A streaming call also asks the upstream for usage
/// (`stream_options.include_usage`) so limits and records see token counts; when the
/// harness did not ask for it, the extra usage event is not relayed.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatDialect;

#[derive(Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_input_tokens: u
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            reasoning_tokens: u
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    message: Option<crate::episode::SampledChat>,
}

#[derive(Deserialize)]
struct WireResponse {
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// Normalises a finish reason: `function_call` becomes `tool_calls`; others are kept.
pub(crate) fn normalise_finish(reason: Option<String>) -> Option<String> {
    reason.map(|r| {
        if r == "function_call" {
            "tool_calls".to_owned()
        } else {
            r
        }
    })
}

impl Dialect for ChatDialect {
    fn kind(&self) -> DialectKind {
        DialectKind::ChatCompletions
    }

    fn routes(&self) -> &'static [&'static str] {
        &["/v1/chat/completions", "/chat/completions"]
    }

    fn upstream_path(&self) -> &'static str {
        "/chat/completions"
    }

    fn mediate(
        &self,
        body: &mut JsonBody,
        policy: &crate::network::NetworkPolicy,
    ) -> Result<Vec<String>, Error> {
        super::mediate::chat(body, policy)
    }

    fn prepare(
        &self,
        body: &mut JsonBody,
        model: &str,
        sampling: &Sampling,
    ) -> Result<Prepared, Error> {
        match body.raw("messages").map(|r| r.first().copied()) {
            Some(Some(b'[')) => {}
            Some(_) => {
                return Err(Error::invalid(
                    "`messages` must be an array of chat messages",
                ))
            }
            None => {
                return Err(Error::invalid(
                    "`messages` is required: send the conversation as an array of chat messages",
                ))
            }
        }
        for (key, value) in sampling {
            if !value.is_null() {
                body.set(key, value)?;
            }
        }
        body.set("model", model)?;
        if let Some(n) = body.get::<Value>("n").and_then(Result::ok) {
            if !(n.is_null() || n == json!(1)) {
                return Err(Error::invalid(format!(
                    "`n` must be 1 (one completion per call), got {n}"
                )));
            }
        }
        let stream = body.is_true("stream");
        let mut hide_stream_usage = false;
        if stream {
            let mut options: Map<String, Value> = match body.value("stream_options") {
                Some(Value::Object(o)) => o,
                _ => Map::new(),
            };
            if options.get("include_usage") != Some(&Value::Bool(true)) {
                options.insert("include_usage".into(), Value::Bool(true));
                body.set("stream_options", &options)?;
                hide_stream_usage = true;
            }
        }
        Ok(Prepared {
            stream,
            hide_stream_usage,
        })
    }

    fn sampling_of(&self, body: &JsonBody) -> Sampling {
        whitelisted(body, CHAT_SAMPLING_KEYS)
    }

    fn capture_tokens(&self, body: &mut JsonBody) -> Result<Option<TokenCollector>, Error> {
        let keep_logprobs = body.is_true("logprobs");
        let keep_token_ids = body.is_true("return_token_ids");
        if !keep_logprobs {
            body.set_raw("logprobs", bytes::Bytes::from_static(b"true"));
        }
        if !keep_token_ids {
            body.set_raw("return_token_ids", bytes::Bytes::from_static(b"true"));
        }
        Ok(Some(TokenCollector::new(
            CaptureShape::Chat,
            HarnessAsked {
                logprobs: keep_logprobs,
                token_ids: keep_token_ids,
            },
        )))
    }

    fn summarize(&self, response: &[u8]) -> Result<Summary, Error> {
        let r: WireResponse = crate::body::from_json_bytes(response).map_err(|e| {
            Error::UpstreamMalformed(format!("expected a chat.completion object: {e}"))
        })?;
        let (finish_reason, message) = match r.choices.into_iter().next() {
            Some(c) => (
                c.finish_reason,
                c.message.and_then(|m| m.into_plain()).map(Box::new),
            ),
            None => (None, None),
        };
        Ok(Summary {
            finish_reason: normalise_finish(finish_reason),
            usage: r.usage.map(Usage::from).unwrap_or_default(),
            message,
        })
    }

    fn assembler(&self, prepared: &Prepared) -> Box<dyn StreamAssembler> {
        Box::new(ChatAssembler {
            hide_usage: prepared.hide_stream_usage,
            prefix_tries: PREFIX_TRIES,
            ..ChatAssembler::default()
        })
    }

    fn synthesize_stream(&self, response: &Value) -> Vec<bytes::Bytes> {
        let choice = &response["choices"][0];
        let mut delta = choice
            .get("message")
            .cloned()
            .unwrap_or_else(|| json!({"role": "assistant"}));
        if let Some(Value::Array(calls)) = delta.get_mut("tool_calls") {
            for (i, call) in calls.iter_mut().enumerate() {
                call["index"] = json!(i);
            }
        }
        let mut chunk = Map::new();
        for key in ["id", "created", "model", "system_fingerprint"] {
            if let Some(v) = response.get(key) {
                chunk.insert(key.to_owned(), v.clone());
            }
        }
        chunk.insert("object".into(), json!("chat.completion.chunk"));
        chunk.insert(
            "choices".into(),
            json!([{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason").cloned().unwrap_or(json!("stop"))}]),
        );
        vec![
            super::data_event(&Value::Object(chunk)),
            bytes::Bytes::from_static(b"data: [DONE]\n\n"),
        ]
    }
}

#[derive(Debug, Default, Clone)]
struct ToolCall {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Default, Clone)]
struct ChatAssembler {
    hide_usage: bool,
    head: Option<Map<String, Value>>,
    content: String,
    saw_content: bool,
    reasoning_content: String,
    reasoning: String,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCall>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    done: bool,
    errors: Vec<String>,
    upstream_error: Option<String>,
    /// The members every chunk repeats before `choices` (`{"id":…,"object":…,
    /// "created":…,"model":…,`), byte for byte as the last fully parsed chunk had them;
    /// empty until found. A chunk that starts with them is parsed from `choices` on.
    prefix: Vec<u8>,
    /// Attempts left at finding `prefix` (an upstream whose chunks differ in it, say a
    /// `created` that changes, stops being looked at).
    prefix_tries: u8,
    /// `{` and the rest of a chunk after `prefix`, parsed in place of the chunk.
    scratch: String,
    /// The bytes around the delta of a chunk whose only effect was its delta (see
    /// [`delta_frame`]); empty until found. A chunk made of the same bytes around one
    /// JSON object is read as that delta alone.
    delta_head: Vec<u8>,
    delta_tail: Vec<u8>,
}

/// How many chunks of a stream may be searched for the repeated prefix.
const PREFIX_TRIES: u8 = 4;

/// The bytes of `chunk` up to and including the comma that closes its top-level members
/// before `"choices"`, when there are any and they form a valid object on their own.
fn repeated_prefix(chunk: &[u8]) -> Option<&[u8]> {
    // An unescaped quote cannot follow a comma inside a string, so `,"choices":` is a
    // member boundary; checking that what precedes it closes as an object makes sure it
    // is a top-level one (a nested `choices` leaves braces open).
    static CHOICES: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b",\"choices\":"));
    // (A `Finder` built once: `memmem::find` builds one at every call.)
    let comma = CHOICES.find(chunk)?;
    let mut probe = Vec::with_capacity(comma + 1);
    probe.extend_from_slice(&chunk[..comma]);
    probe.push(b'}');
    // Members whose effect is not the same when taken once as when repeated (a usage or
    // an error another chunk may change in between) are never skipped.
    let members: ProbedMembers<'_> = crate::body::from_json_bytes(&probe).ok()?;
    if members.usage.is_some() || members.error.is_some() {
        return None;
    }
    Some(&chunk[..=comma])
}

/// The members before `choices` that must not be skipped when present.
#[derive(Deserialize)]
struct ProbedMembers<'a> {
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// A chunk read only to find where its one choice's `delta` sits.
#[derive(Deserialize)]
struct LocateDelta<'a> {
    #[serde(borrow)]
    choices: Vec<LocateChoice<'a>>,
}

#[derive(Deserialize)]
struct LocateChoice<'a> {
    #[serde(borrow)]
    delta: &'a RawValue,
}

/// For a chunk whose only effect is its delta (one choice, of index 0, no finish
/// reason, no usage, no error, as `chunk` was read): the bytes before the delta's value
/// and after it. Another chunk made of the same bytes around another JSON value differs
/// from this one only in that value, which is then its delta.
fn delta_frame<'d>(data: &'d [u8], chunk: &WireChunk<'_>) -> Option<(&'d [u8], &'d [u8])> {
    let choices = chunk.choices.as_ref()?;
    let [choice] = choices.as_slice() else {
        return None;
    };
    if choice.index != 0
        || choice.finish_reason.is_some()
        || choice.delta.is_none()
        || chunk.usage.is_some()
        || chunk.error.is_some()
    {
        return None;
    }
    let located: LocateDelta<'_> = crate::body::from_json_bytes(data).ok()?;
    let [choice] = located.choices.as_slice() else {
        return None;
    };
    let raw = choice.delta.get().as_bytes();
    let start = (raw.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    let end = start.checked_add(raw.len())?;
    (end <= data.len()).then(|| (&data[..start], &data[end..]))
}

/// A `chat.completion.chunk` as providers send it, read without building a
/// `serde_json::Value` tree (the hot path of every streamed call). Chunks that do not fit
/// these types are read by the general path instead.
#[derive(Deserialize)]
struct WireChunk<'a> {
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    choices: Option<Vec<WireChunkChoice<'a>>>,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    created: Option<&'a RawValue>,
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    system_fingerprint: Option<&'a RawValue>,
    #[serde(default, borrow)]
    service_tier: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireChunkChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<WireDelta<'a>>,
}

#[derive(Deserialize)]
struct WireDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<WireToolDelta<'a>>>,
}

#[derive(Deserialize)]
struct WireToolDelta<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<WireFunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct WireFunctionDelta<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// The text of a delta that is exactly `open` (`{"content":"`, say) + a string + `"}`
/// with nothing in the string to unescape (no quote, backslash or control character):
/// that text as it stands.
fn plain_text<'d>(delta: &'d [u8], open: &[u8]) -> Option<&'d str> {
    let text = delta.strip_prefix(open)?.strip_suffix(br#""}"#)?;
    if text.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    std::str::from_utf8(text).ok()
}

fn raw_value(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

impl ChatAssembler {
    /// Reads a chunk that fits [`WireChunk`]; same effect as [`ChatAssembler::absorb`].
    fn absorb_wire(&mut self, chunk: WireChunk<'_>) -> Relay {
        if let Some(err) = chunk.error {
            self.upstream_error = Some(super::error_text(&raw_value(err)));
            return Relay::Forward;
        }
        let usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
        if let Some(u) = chunk.usage {
            self.usage = Some(raw_value(u));
        }
        if self.head.is_none() {
            let mut head = Map::new();
            for (key, value) in [
                ("id", chunk.id),
                ("created", chunk.created),
                ("model", chunk.model),
                ("system_fingerprint", chunk.system_fingerprint),
                ("service_tier", chunk.service_tier),
            ] {
                if let Some(v) = value {
                    head.insert(key.to_owned(), raw_value(v));
                }
            }
            self.head = Some(head);
        }
        for choice in chunk.choices.into_iter().flatten().filter(|c| c.index == 0) {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason.into_owned());
            }
            if let Some(delta) = choice.delta {
                self.absorb_delta(delta);
            }
        }
        if usage_only && self.hide_usage {
            Relay::Drop
        } else {
            Relay::Forward
        }
    }

    /// The delta of the call's choice (index 0).
    fn absorb_delta(&mut self, delta: WireDelta<'_>) {
        if let Some(text) = delta.content {
            self.content.push_str(&text);
            self.saw_content = true;
        }
        if let Some(text) = delta.reasoning_content {
            self.reasoning_content.push_str(&text);
        }
        if let Some(text) = delta.reasoning {
            self.reasoning.push_str(&text);
        }
        if let Some(text) = delta.refusal {
            self.refusal.get_or_insert_with(String::new).push_str(&text);
        }
        for call in delta.tool_calls.into_iter().flatten() {
            let entry = self.tool_calls.entry(call.index).or_default();
            if let Some(id) = call.id.filter(|s| !s.is_empty()) {
                entry.id = id.into_owned();
            }
            if let Some(kind) = call.kind.filter(|s| !s.is_empty()) {
                entry.kind = kind.into_owned();
            }
            if let Some(f) = call.function {
                if let Some(name) = f.name.filter(|s| !s.is_empty()) {
                    entry.name = name.into_owned();
                }
                if let Some(args) = f.arguments {
                    entry.arguments.push_str(&args);
                }
            }
        }
    }

    fn absorb(&mut self, chunk: Map<String, Value>) -> Relay {
        if let Some(err) = chunk.get("error") {
            self.upstream_error = Some(super::error_text(err));
            return Relay::Forward;
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        let usage_only = choices.is_some_and(|c| c.is_empty());
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        if self.head.is_none() {
            let mut head = Map::new();
            for key in [
                "id",
                "created",
                "model",
                "system_fingerprint",
                "service_tier",
            ] {
                if let Some(v) = chunk.get(key) {
                    head.insert(key.to_owned(), v.clone());
                }
            }
            self.head = Some(head);
        }
        for choice in choices.into_iter().flatten() {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.content.push_str(text);
                self.saw_content = true;
            }
            if let Some(text) = delta.get("reasoning_content").and_then(Value::as_str) {
                self.reasoning_content.push_str(text);
            }
            if let Some(text) = delta.get("reasoning").and_then(Value::as_str) {
                self.reasoning.push_str(text);
            }
            if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
                self.refusal.get_or_insert_with(String::new).push_str(text);
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let entry = self.tool_calls.entry(index).or_default();
                if let Some(id) = call
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    entry.id = id.to_owned();
                }
                if let Some(kind) = call
                    .get("type")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    entry.kind = kind.to_owned();
                }
                if let Some(f) = call.get("function") {
                    if let Some(name) = f
                        .get("name")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                    {
                        entry.name = name.to_owned();
                    }
                    if let Some(args) = f.get("arguments").and_then(Value::as_str) {
                        entry.arguments.push_str(args);
                    }
                }
            }
        }
        if usage_only && self.hide_usage {
            Relay::Drop
        } else {
            Relay::Forward
        }
    }
}

impl StreamAssembler for ChatAssembler {
    fn push(&mut self, event: &SseEvent<'_>) -> Relay {
        if self.done {
            return Relay::Withhold;
        }
        let Some(data) = event.data() else {
            return Relay::Forward;
        };
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return Relay::Withhold;
        }
        // The usual content chunk: the same bytes as an earlier one around another delta.
        if !self.delta_head.is_empty()
            && data.len() > self.delta_head.len() + self.delta_tail.len()
            && data.starts_with(&self.delta_head)
            && data.ends_with(&self.delta_tail)
        {
            let delta = &data[self.delta_head.len()..data.len() - self.delta_tail.len()];
            if let Some(text) = plain_text(delta, br#"{"content":""#) {
                self.content.push_str(text);
                self.saw_content = true;
                return Relay::Forward;
            }
            if let Some(text) = plain_text(delta, br#"{"reasoning_content":""#) {
                self.reasoning_content.push_str(text);
                return Relay::Forward;
            }
            if let Some(text) = plain_text(delta, br#"{"reasoning":""#) {
                self.reasoning.push_str(text);
                return Relay::Forward;
            }
            if let Ok(delta) = crate::body::from_json_bytes::<WireDelta<'_>>(delta) {
                self.absorb_delta(delta);
                return Relay::Forward;
            }
        }
        // The members already read from an earlier chunk, repeated byte for byte, are
        // skipped: they are only those whose effect was taken then (the head).
        if !self.prefix.is_empty() && data.len() > self.prefix.len() {
            if let Some(rest) = data
                .strip_prefix(self.prefix.as_slice())
                .and_then(|r| std::str::from_utf8(r).ok())
            {
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                scratch.push('{');
                scratch.push_str(rest);
                let relay = serde_json::from_str::<WireChunk<'_>>(&scratch)
                    .ok()
                    .map(|chunk| self.absorb_wire(chunk));
                self.scratch = scratch;
                if let Some(relay) = relay {
                    return relay;
                }
            }
        }
        if let Ok(chunk) = crate::body::from_json_bytes::<WireChunk<'_>>(&data) {
            if self.prefix_tries > 0 && chunk.error.is_none() && chunk.choices.is_some() {
                self.prefix_tries -= 1;
                self.prefix.clear();
                if let Some(p) = repeated_prefix(&data) {
                    self.prefix.extend_from_slice(p);
                }
                if let Some((head, tail)) = delta_frame(&data, &chunk) {
                    self.delta_head.clear();
                    self.delta_head.extend_from_slice(head);
                    self.delta_tail.clear();
                    self.delta_tail.extend_from_slice(tail);
                }
            }
            return self.absorb_wire(chunk);
        }
        match crate::body::from_json_bytes::<Map<String, Value>>(&data) {
            Ok(chunk) => self.absorb(chunk),
            Err(e) => {
                if self.errors.len() < 4 {
                    self.errors
                        .push(format!("unreadable chat.completion.chunk: {e}"));
                }
                Relay::Forward
            }
        }
    }

    fn saw_terminal(&self) -> bool {
        self.done
    }

    fn finish(mut self: Box<Self>) -> Result<Assembled, Error> {
        if let Some(message) = self.upstream_error.take() {
            return Err(Error::upstream_status(502, message, None));
        }
        if let Some(e) = self.errors.drain(..).next() {
            return Err(Error::UpstreamMalformed(e));
        }
        if !self.done {
            return Err(Error::UpstreamMalformed(
                "upstream stream ended before its terminal event (`data: [DONE]`)".into(),
            ));
        }
        Ok((*self).assemble(Some("stop")))
    }

    fn partial(&self) -> Option<crate::RawJson> {
        let started = self.head.is_some() || self.saw_content || !self.tool_calls.is_empty();
        started.then(|| self.clone().assemble(None).response)
    }
}

impl ChatAssembler {
    /// The `chat.completion` built from what arrived; `default_finish` stands in for a
    /// finish reason the upstream did not send (`None`: `null`).
    fn assemble(self, default_finish: Option<&str>) -> Assembled {
        let has_tools = !self.tool_calls.is_empty();
        let finish_reason =
            normalise_finish(self.finish_reason).or_else(|| default_finish.map(str::to_owned));
        let choice = OutChoice {
            index: 0,
            message: OutMessage {
                role: "assistant",
                content: (self.saw_content || !has_tools).then_some(self.content.as_str()),
                reasoning_content: &self.reasoning_content,
                reasoning: &self.reasoning,
                refusal: self.refusal.as_deref(),
                tool_calls: self
                    .tool_calls
                    .values()
                    .map(|c| OutToolCall {
                        id: &c.id,
                        kind: if c.kind.is_empty() {
                            "function"
                        } else {
                            &c.kind
                        },
                        function: OutFunction {
                            name: &c.name,
                            arguments: &c.arguments,
                        },
                    })
                    .collect(),
            },
            finish_reason: finish_reason.as_deref(),
            logprobs: (),
        };
        let mut assembled = assembled_completion(
            self.head.as_ref(),
            "chat.completion",
            &choice,
            self.usage.as_ref(),
            finish_reason.as_deref().unwrap_or_default(),
        );
        // The sampled message as `summarize` reads it from the response just encoded:
        // none with tool calls; the text when `content` was written; `reasoning_content`,
        // else `reasoning`, when not empty (empty ones are not written).
        let content = choice.message.content.is_some();
        drop(choice);
        assembled.summary.message = (!has_tools).then(|| {
            let mut msg = Message::new(Role::Assistant);
            if content {
                msg.push_text(self.content);
            }
            if !self.reasoning_content.is_empty() {
                msg.push_reasoning(&self.reasoning_content);
            } else if !self.reasoning.is_empty() {
                msg.push_reasoning(&self.reasoning);
            }
            Box::new(msg)
        });
        assembled
    }
}

/// The assembled `chat.completion`'s choice, written straight from the assembler's
/// buffers (no `serde_json::Value` tree, no copy of the text) by its
/// [`AssembledChoice`] impl; the derived `Serialize` is what the tests compare it with.
#[derive(Serialize)]
struct OutChoice<'a> {
    index: u32,
    message: OutMessage<'a>,
    finish_reason: Option<&'a str>,
    /// Always `null`.
    logprobs: (),
}

#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    reasoning_content: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reasoning: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
}

#[derive(Serialize)]
struct OutToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// The one choice of an assembled completion, written into the response.
pub(super) trait AssembledChoice {
    fn write_json(&self, out: &mut Vec<u8>);
}

impl AssembledChoice for OutChoice<'_> {
    /// The choice as its derived `Serialize` writes it (the tests' reference), with the
    /// text fields escaped by [`crate::json_text`] (serde_json escapes byte by byte).
    fn write_json(&self, out: &mut Vec<u8>) {
        use crate::json_text::{write_opt_str, write_str};
        let m = &self.message;
        out.extend_from_slice(b"{\"index\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.index).as_bytes());
        out.extend_from_slice(b",\"message\":{\"role\":");
        write_str(out, m.role);
        out.extend_from_slice(b",\"content\":");
        write_opt_str(out, m.content);
        if !m.reasoning_content.is_empty() {
            out.extend_from_slice(b",\"reasoning_content\":");
            write_str(out, m.reasoning_content);
        }
        if !m.reasoning.is_empty() {
            out.extend_from_slice(b",\"reasoning\":");
            write_str(out, m.reasoning);
        }
        if let Some(refusal) = m.refusal {
            out.extend_from_slice(b",\"refusal\":");
            write_str(out, refusal);
        }
        if !m.tool_calls.is_empty() {
            out.extend_from_slice(b",\"tool_calls\":[");
            for (i, call) in m.tool_calls.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"id\":");
                write_str(out, call.id);
                out.extend_from_slice(b",\"type\":");
                write_str(out, call.kind);
                out.extend_from_slice(b",\"function\":{\"name\":");
                write_str(out, call.function.name);
                out.extend_from_slice(b",\"arguments\":");
                write_str(out, call.function.arguments);
                out.extend_from_slice(b"}}");
            }
            out.push(b']');
        }
        out.extend_from_slice(b"},\"finish_reason\":");
        write_opt_str(out, self.finish_reason);
        out.extend_from_slice(b",\"logprobs\":null}");
    }
}

impl AssembledChoice for Value {
    fn write_json(&self, out: &mut Vec<u8>) {
        // A `Value` always serialises.
        let _ = serde_json::to_writer(out, self);
    }
}

/// An assembled OpenAI-style stream (`object` is `chat.completion` or
/// `text_completion`): the response (the stream's head fields, `id` defaulting to
/// `intercept-assembled`, then `object`, one choice and the usage), encoded at once, and
/// its summary (usage read as zero when absent or unreadable).
pub(super) fn assembled_completion<C: AssembledChoice>(
    head: Option<&Map<String, Value>>,
    object: &'static str,
    choice: &C,
    usage: Option<&Value>,
    finish_reason: &str,
) -> Assembled {
    use crate::json_text::write_str;
    // Written as serde_json writes a map of these entries, in this order.
    let mut out = Vec::with_capacity(512);
    out.push(b'{');
    if !head.is_some_and(|h| h.contains_key("id")) {
        out.extend_from_slice(b"\"id\":\"intercept-assembled\",");
    }
    for (key, value) in head
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "object" | "choices" | "usage"))
    {
        write_str(&mut out, key);
        out.push(b':');
        // A `Value` always serialises.
        let _ = serde_json::to_writer(&mut out, value);
        out.push(b',');
    }
    out.extend_from_slice(b"\"object\":");
    write_str(&mut out, object);
    out.extend_from_slice(b",\"choices\":[");
    choice.write_json(&mut out);
    out.push(b']');
    if let Some(u) = usage {
        out.extend_from_slice(b",\"usage\":");
        let _ = serde_json::to_writer(&mut out, u);
    }
    out.push(b'}');
    let response = RawJson::new(bytes::Bytes::from(out));
    Assembled {
        response,
        summary: Summary {
            finish_reason: Some(finish_reason.to_owned()),
            usage: usage
                .and_then(|u| WireUsage::deserialize(u).ok())
                .map(Usage::from)
                .unwrap_or_default(),
            message: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    /// The assembled completion as serde_json writes it from the derived `Serialize`
    /// (the reference for the hand-written encoder).
    fn assembled_by_serde<C: Serialize>(
        head: Option<&Map<String, Value>>,
        object: &'static str,
        choice: &C,
        usage: Option<&Value>,
    ) -> Vec<u8> {
        struct Out<'a, C> {
            head: Option<&'a Map<String, Value>>,
            object: &'static str,
            choice: &'a C,
            usage: Option<&'a Value>,
        }
        impl<C: Serialize> Serialize for Out<'_, C> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap as _;
                let mut map = serializer.serialize_map(None)?;
                if !self.head.is_some_and(|h| h.contains_key("id")) {
                    map.serialize_entry("id", "intercept-assembled")?;
                }
                for (key, value) in self
                    .head
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| !matches!(k.as_str(), "object" | "choices" | "usage"))
                {
                    map.serialize_entry(key, value)?;
                }
                map.serialize_entry("object", self.object)?;
                map.serialize_entry("choices", &[self.choice])?;
                if let Some(u) = self.usage {
                    map.serialize_entry("usage", u)?;
                }
                map.end()
            }
        }
        serde_json::to_vec(&Out {
            head,
            object,
            choice,
            usage,
        })
        .expect("json")
    }

    proptest! {
        /// The hand-written response is byte for byte the derived one: any text (quotes,
        /// controls, non-ASCII), any optional field, tool calls, head fields and usage.
        #[test]
        fn the_assembled_completion_is_what_serde_json_writes(
            content in proptest::option::of("(\\PC|[\u{0}-\u{1f}\"\\\\]){0,30}"),
            reasoning_content in "(\\PC|\n){0,10}",
            reasoning in "(\\PC|\"){0,10}",
            refusal in proptest::option::of("\\PC{0,10}"),
            calls in proptest::collection::vec(("\\PC{0,6}", "[a-z]{0,8}", "\\PC{0,6}", "(\\PC|[{}\":]){0,20}"), 0..3),
            finish in proptest::option::of("[a-z_]{1,12}"),
            head_id in proptest::option::of("\\PC{0,8}"),
            extra in proptest::collection::btree_map("[a-z\"]{1,6}", "\\PC{0,6}", 0..3),
            usage in any::<bool>(),
        ) {
            let choice = OutChoice {
                index: 0,
                message: OutMessage {
                    role: "assistant",
                    content: content.as_deref(),
                    reasoning_content: &reasoning_content,
                    reasoning: &reasoning,
                    refusal: refusal.as_deref(),
                    tool_calls: calls
                        .iter()
                        .map(|(id, kind, name, args)| OutToolCall {
                            id,
                            kind,
                            function: OutFunction { name, arguments: args },
                        })
                        .collect(),
                },
                finish_reason: finish.as_deref(),
                logprobs: (),
            };
            let mut head = Map::new();
            if let Some(id) = head_id {
                head.insert("id".into(), json!(id));
            }
            head.insert("object".into(), json!("chat.completion.chunk"));
            for (k, v) in extra {
                head.insert(k, json!(v));
            }
            let usage = usage.then(|| json!({"prompt_tokens": 3, "completion_tokens": 4}));
            for head in [None, Some(&head)] {
                let ours = assembled_completion(head, "chat.completion", &choice, usage.as_ref(), "");
                let reference = assembled_by_serde(head, "chat.completion", &choice, usage.as_ref());
                prop_assert_eq!(
                    String::from_utf8(ours.response.bytes().to_vec()).unwrap(),
                    String::from_utf8(reference).unwrap()
                );
            }
        }
    }

    fn body(v: Value) -> JsonBody {
        JsonBody::parse(Bytes::from(serde_json::to_vec(&v).expect("json"))).expect("body")
    }

    #[test]
    fn prepare_imposes_model_and_sampling() {
        let mut b =
            body(json!({"model":"gpt","messages":[],"temperature":1.0,"max_completion_tokens":5}));
        let sampling = json!({"temperature":0.2,"top_k":5,"seed":null})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let p = ChatDialect
            .prepare(&mut b, "policy", &sampling)
            .expect("prepare");
        assert!(!p.stream);
        let v = b.to_value();
        assert_eq!(v["model"], "policy");
        assert_eq!(v["temperature"], 0.2);
        assert_eq!(v["top_k"], 5);
        assert_eq!(v["max_completion_tokens"], 5);
        assert!(v.get("seed").is_none());
        let s = ChatDialect.sampling_of(&b);
        assert_eq!(s.get("top_k"), Some(&json!(5)));
        assert!(!s.contains_key("model"));
    }

    #[test]
    fn prepare_rejects_bad_requests() {
        let mut b = body(json!({"model":"x"}));
        assert!(ChatDialect.prepare(&mut b, "m", &Sampling::new()).is_err());
        let mut b = body(json!({"messages":"hi"}));
        assert!(ChatDialect.prepare(&mut b, "m", &Sampling::new()).is_err());
        let mut b = body(json!({"messages":[],"n":2}));
        let e = ChatDialect
            .prepare(&mut b, "m", &Sampling::new())
            .expect_err("n=2");
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn streaming_asks_for_usage_and_hides_it() {
        let mut b = body(json!({"messages":[],"stream":true}));
        let p = ChatDialect
            .prepare(&mut b, "m", &Sampling::new())
            .expect("prepare");
        assert!(p.stream && p.hide_stream_usage);
        assert_eq!(
            b.to_value()["stream_options"],
            json!({"include_usage": true})
        );
        let mut b =
            body(json!({"messages":[],"stream":true,"stream_options":{"include_usage":true}}));
        let p = ChatDialect
            .prepare(&mut b, "m", &Sampling::new())
            .expect("prepare");
        assert!(!p.hide_stream_usage);
    }

    #[test]
    fn summarize_reads_usage_and_rejects_garbage() {
        let s = ChatDialect
            .summarize(br#"{"choices":[{"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":1}}}"#)
            .expect("summary");
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        assert_eq!(
            s.usage,
            Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                cached_input_tokens: 1,
                reasoning_tokens: 0
            }
        );
        let e = ChatDialect
            .summarize(b"<html>bad gateway</html>")
            .expect_err("html");
        assert_eq!(e.status(), 502);
    }

    /// A non-streamed response and the equivalent stream, cut into pieces.
    fn stream_for(
        content: &str,
        reasoning: &str,
        args: &str,
        cuts: &[usize],
    ) -> (Value, Vec<String>) {
        let mut events = vec![
            json!({"id":"c1","created":7,"model":"m","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}),
        ];
        let pieces = |s: &str| -> Vec<String> {
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
        for p in pieces(reasoning) {
            events.push(json!({"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":p}}]}));
        }
        for p in pieces(content) {
            events.push(json!({"id":"c1","choices":[{"index":0,"delta":{"content":p}}]}));
        }
        let has_tool = !args.is_empty();
        if has_tool {
            events.push(json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}));
            for p in pieces(args) {
                events.push(json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":p}}]}}]}));
            }
        }
        let finish = if has_tool { "tool_calls" } else { "stop" };
        events.push(json!({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":finish}]}));
        events.push(json!({"id":"c1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}));
        let mut message = json!({"role":"assistant","content":content});
        if !reasoning.is_empty() {
            message["reasoning_content"] = json!(reasoning);
        }
        if has_tool {
            message["tool_calls"] =
                json!([{"id":"call_1","type":"function","function":{"name":"f","arguments":args}}]);
        }
        let full = json!({"id":"c1","created":7,"model":"m","object":"chat.completion",
            "choices":[{"index":0,"message":message,"finish_reason":finish,"logprobs":null}],
            "usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}});
        let mut sse: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        sse.push("data: [DONE]\n\n".into());
        (full, sse)
    }

    proptest! {
        #[test]
        fn stream_assembly_equals_the_non_streamed_response(
            content in "[a-zA-Z é{}\"]{0,24}",
            reasoning in "[a-z ]{0,12}",
            args in prop_oneof![Just(String::new()), "\\{\"q\": \"[a-z]{0,10}\"\\}"],
            cuts in prop::collection::vec(0usize..30, 0..5),
        ) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            let (full, events) = stream_for(&content, &reasoning, &args, &cuts);
            let prepared = Prepared { stream: true, hide_stream_usage: true };
            let mut a = ChatDialect.assembler(&prepared);
            let mut relayed = Vec::new();
            for e in &events {
                relayed.push(a.push(&SseEvent::new(e.as_bytes())));
            }
            prop_assert_eq!(relayed.last(), Some(&Relay::Withhold));
            prop_assert_eq!(relayed[relayed.len() - 2], Relay::Drop);
            let out = a.finish().expect("assembled");
            prop_assert_eq!(&out.response.to_value(), &full);
            let summary = ChatDialect.summarize(&serde_json::to_vec(&full).expect("json")).expect("summary");
            prop_assert_eq!(out.summary, summary);
        }
    }

    #[test]
    fn repeated_members_are_skipped_only_when_repeated_byte_for_byte() {
        let chunk = |created: u64, extra: &str, body: &str| {
            format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":\"m\",{extra}\"choices\":[{body}]}}\n\n"
            )
        };
        let delta =
            |t: &str| format!(r#"{{"index":0,"delta":{{"content":"{t}"}},"finish_reason":null}}"#);
        // A `choices` nested in a member before the real one is not a member boundary:
        // no prefix then (every chunk is parsed whole).
        assert_eq!(
            repeated_prefix(br#"{"meta":{"a":1,"choices":2},"choices":[]}"#),
            None
        );
        assert_eq!(
            repeated_prefix(br#"{"id":"x","choices":[]}"#),
            Some(&br#"{"id":"x","#[..])
        );
        // A usage or an error before `choices` is never skipped.
        assert_eq!(
            repeated_prefix(br#"{"id":"x","usage":{"prompt_tokens":1},"choices":[]}"#),
            None
        );
        assert_eq!(
            repeated_prefix(br#"{"id":"x","usage":null,"choices":[]}"#),
            Some(&br#"{"id":"x","usage":null,"#[..])
        );
        assert_eq!(repeated_prefix(br#"{"x":[{"y":1,"choices":[]}]}"#), None);
        let events = [
            chunk(1, "", &delta("a")),
            chunk(1, "", &delta("b\\n")),
            // Another `created`: parsed whole, and becomes the prefix.
            chunk(2, "", &delta("c")),
            chunk(2, "", &delta("d")),
            // The same bytes around something that is not one object: read whole.
            chunk(
                2,
                "",
                r#"{"index":0,"delta":{"content":"x"},"extra":{"content":"y"},"finish_reason":null}"#,
            ),
            chunk(2, r#""meta":{"choices":1},"#, &delta("e")),
            chunk(
                2,
                "",
                r#"{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{},"finish_reason":"stop"}"#,
            ),
            chunk(2, "", "").replace(
                r#""choices":[]}"#,
                r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#,
            ),
            "data: [DONE]\n\n".to_owned(),
        ];
        let mut a = Box::new(ChatAssembler {
            prefix_tries: PREFIX_TRIES,
            ..ChatAssembler::default()
        });
        for e in &events {
            a.push(&SseEvent::new(e.as_bytes()));
        }
        // Parsed whole: the first chunk and the first with `created` 2; the rest after
        // the prefix.
        assert_eq!(a.prefix_tries, PREFIX_TRIES - 2);
        assert_eq!(
            a.prefix,
            br#"{"id":"c1","object":"chat.completion.chunk","created":2,"model":"m","#
        );
        assert_eq!(
            a.delta_head,
            br#"{"id":"c1","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":"#
        );
        assert_eq!(a.delta_tail, br#","finish_reason":null}]}"#);
        let out = a.finish().expect("assembled").response.to_value();
        assert_eq!(out["choices"][0]["message"]["content"], "ab\ncdxe");
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        assert_eq!(out["created"], 1, "the head is the first chunk's");
        assert_eq!(out["usage"]["completion_tokens"], 5);
    }

    #[test]
    fn plain_text_is_taken_as_it_stands_and_anything_else_is_parsed() {
        let plain_content = |delta: &'static [u8]| plain_text(delta, br#"{"content":""#);
        assert_eq!(
            plain_text(br#"{"reasoning":"think"}"#, br#"{"reasoning":""#),
            Some("think")
        );
        assert_eq!(
            plain_content(r#"{"content":"hé there"}"#.as_bytes()),
            Some("hé there")
        );
        assert_eq!(plain_content(br#"{"content":""}"#), Some(""));
        for other in [
            &br#"{"content":"a\nb"}"#[..],
            br#"{"content":"say \"hi\""}"#,
            br#"{"content":"\u00e9"}"#,
            b"{\"content\":\"tab\there\"}",
            br#"{"content":"a","role":"assistant"}"#,
            br#"{"content": "spaced"}"#,
            br#"{"content":null}"#,
            br#"{"reasoning_content":"x"}"#,
            b"{\"content\":\"\xff\"}",
        ] {
            assert_eq!(
                plain_content(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn typical_chunks_take_the_typed_path() {
        for chunk in [
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant","content":"hi","reasoning_content":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":null}]}"#,
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
        ] {
            assert!(
                serde_json::from_str::<WireChunk<'_>>(chunk).is_ok(),
                "{chunk}"
            );
        }
        // A chunk of an unexpected shape still parses through the general path.
        let mut a = ChatDialect.assembler(&Prepared::default());
        let odd = "data: {\"choices\":[{\"index\":\"0\",\"delta\":{\"content\":\"x\"}}]}\n\n";
        assert_eq!(a.push(&SseEvent::new(odd.as_bytes())), Relay::Forward);
        a.push(&SseEvent::new(b"data: [DONE]\n\n"));
        assert!(a.finish().is_ok());
    }

    #[test]
    fn stream_without_done_is_an_error() {
        let mut a = ChatDialect.assembler(&Prepared::default());
        a.push(&SseEvent::new(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
        ));
        assert!(!a.saw_terminal());
        let e = a.finish().expect_err("truncated");
        assert_eq!(e.status(), 502);
        assert!(e.to_string().contains("terminal event"), "{e}");
    }

    #[test]
    fn a_stream_cut_short_keeps_what_arrived() {
        let mut a = ChatDialect.assembler(&Prepared::default());
        assert!(a.partial().is_none(), "nothing arrived yet");
        a.push(&SseEvent::new(
            b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        ));
        a.push(&SseEvent::new(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        ));
        let partial = a.partial().expect("something arrived").to_value();
        assert_eq!(partial["id"], "c1");
        assert_eq!(partial["choices"][0]["message"]["content"], "Hello");
        assert!(
            partial["choices"][0]["finish_reason"].is_null(),
            "{partial}"
        );
        // Taking the partial changes nothing: the stream can still complete.
        a.push(&SseEvent::new(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        ));
        a.push(&SseEvent::new(b"data: [DONE]\n\n"));
        let done = a.finish().expect("complete").response.to_value();
        assert_eq!(done["choices"][0]["finish_reason"], "stop");
        assert_eq!(done["choices"][0]["message"]["content"], "Hello");
    }
}
