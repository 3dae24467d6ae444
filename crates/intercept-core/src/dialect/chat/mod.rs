//! OpenAI Chat Completions.
//!
//! Here, the dialect: its routes, the request it prepares and the response it
//! summarizes. A stream is assembled by `assemble.rs` (with fast paths for the usual
//! chunk) out of the chunk types of `chunk.rs`; `encode.rs` writes the assembled
//! completion (shared with legacy Completions).

mod assemble;
mod chunk;
mod encode;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{whitelisted, Dialect, DialectKind, Prepared, StreamAssembler, Summary};
use crate::body::JsonBody;
use crate::capture::{CaptureShape, HarnessAsked, TokenCollector};
use crate::error::Error;
use crate::rollout::Sampling;
use crate::trace::record::Usage;

use self::assemble::ChatAssembler;
pub(super) use self::encode::assembled_completion;

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
    message: Option<crate::trace::episode::SampledChat>,
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
        Box::new(ChatAssembler::new(prepared.hide_stream_usage))
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    use crate::dialect::Relay;
    use crate::sse::SseEvent;

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
}
