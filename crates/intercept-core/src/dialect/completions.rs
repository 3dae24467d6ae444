//! Legacy OpenAI Completions (`/v1/completions`): a prompt in, text out. Kept because
//! token-level RL pipelines drive engines (vLLM) through it.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::chat::{assembled_completion, normalise_finish, WireUsage};
use super::{
    whitelisted, Assembled, Dialect, DialectKind, Prepared, Relay, StreamAssembler, Summary,
};
use crate::body::JsonBody;
use crate::capture::{CaptureShape, HarnessAsked, TokenCollector};
use crate::error::Error;
use crate::rollout::Sampling;
use crate::sse::SseEvent;
use crate::trace::record::Usage;

/// Sampling keys recorded for a Completions call.
const COMPLETIONS_SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "seed",
    "stop",
    "n",
    "best_of",
    "logprobs",
    "echo",
    "logit_bias",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "suffix",
];

/// Legacy OpenAI Completions: `POST /v1/completions`, secret in `Authorization: Bearer`,
/// streaming ends with `data: [DONE]`. Overrides work as in [`ChatDialect`](super::ChatDialect):
/// the session's sampling keys are set, `model` is forced, `n` must be 1, and a stream
/// asks for usage (the extra usage event is not relayed unless the harness asked).
#[derive(Debug, Clone, Copy, Default)]
pub struct CompletionsDialect;

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireResponse {
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

impl Dialect for CompletionsDialect {
    fn kind(&self) -> DialectKind {
        DialectKind::Completions
    }

    fn routes(&self) -> &'static [&'static str] {
        &["/v1/completions", "/completions"]
    }

    fn upstream_path(&self) -> &'static str {
        "/completions"
    }

    fn prepare(
        &self,
        body: &mut JsonBody,
        model: &str,
        sampling: &Sampling,
    ) -> Result<Prepared, Error> {
        match body.raw("prompt").map(|r| r.first().copied()) {
            Some(Some(b'"' | b'[')) => {}
            Some(_) => {
                return Err(Error::invalid(
                    "`prompt` must be a string, an array of strings or an array of token ids",
                ))
            }
            None => return Err(Error::invalid("`prompt` is required")),
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

    fn capture_tokens(&self, body: &mut JsonBody) -> Result<Option<TokenCollector>, Error> {
        // `logprobs` is a count of top alternatives here; 0 still returns each sampled
        // token's logprob.
        let keep_logprobs = body.raw("logprobs").is_some_and(|r| r != b"null");
        let keep_token_ids = body.is_true("return_token_ids");
        if !keep_logprobs {
            body.set_raw("logprobs", bytes::Bytes::from_static(b"0"));
        }
        if !keep_token_ids {
            body.set_raw("return_token_ids", bytes::Bytes::from_static(b"true"));
        }
        Ok(Some(TokenCollector::new(
            CaptureShape::Completions,
            HarnessAsked {
                logprobs: keep_logprobs,
                token_ids: keep_token_ids,
            },
        )))
    }

    fn sampling_of(&self, body: &JsonBody) -> Sampling {
        whitelisted(body, COMPLETIONS_SAMPLING_KEYS)
    }

    fn summarize(&self, response: &[u8]) -> Result<Summary, Error> {
        let r: WireResponse = crate::body::from_json_bytes(response).map_err(|e| {
            Error::UpstreamMalformed(format!("expected a text_completion object: {e}"))
        })?;
        Ok(Summary {
            finish_reason: normalise_finish(
                r.choices.into_iter().next().and_then(|c| c.finish_reason),
            ),
            usage: r.usage.map(Usage::from).unwrap_or_default(),
            message: None,
        })
    }

    fn assembler(&self, prepared: &Prepared) -> Box<dyn StreamAssembler> {
        Box::new(CompletionsAssembler {
            hide_usage: prepared.hide_stream_usage,
            ..CompletionsAssembler::default()
        })
    }

    fn synthesize_stream(&self, response: &Value) -> Vec<bytes::Bytes> {
        let choice = &response["choices"][0];
        let mut chunk = Map::new();
        for key in ["id", "created", "model", "system_fingerprint"] {
            if let Some(v) = response.get(key) {
                chunk.insert(key.to_owned(), v.clone());
            }
        }
        chunk.insert("object".into(), json!("text_completion"));
        chunk.insert(
            "choices".into(),
            json!([{"index": 0, "text": choice.get("text").cloned().unwrap_or(json!("")),
                "logprobs": null,
                "finish_reason": choice.get("finish_reason").cloned().unwrap_or(json!("stop"))}]),
        );
        vec![
            super::data_event(&Value::Object(chunk)),
            bytes::Bytes::from_static(b"data: [DONE]\n\n"),
        ]
    }
}

#[derive(Debug, Default, Clone)]
struct CompletionsAssembler {
    hide_usage: bool,
    head: Option<Map<String, Value>>,
    text: String,
    finish_reason: Option<String>,
    usage: Option<Value>,
    done: bool,
    errors: Vec<String>,
    upstream_error: Option<String>,
}

impl StreamAssembler for CompletionsAssembler {
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
        let chunk = match crate::body::from_json_bytes::<Map<String, Value>>(&data) {
            Ok(c) => c,
            Err(e) => {
                if self.errors.len() < 4 {
                    self.errors
                        .push(format!("unreadable text_completion chunk: {e}"));
                }
                return Relay::Forward;
            }
        };
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
            for key in ["id", "created", "model", "system_fingerprint"] {
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
            if let Some(text) = choice.get("text").and_then(Value::as_str) {
                self.text.push_str(text);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        if usage_only && self.hide_usage {
            Relay::Drop
        } else {
            Relay::Forward
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
        let started = self.head.is_some() || !self.text.is_empty();
        started.then(|| self.clone().assemble(None).response)
    }
}

impl CompletionsAssembler {
    /// The `text_completion` built from what arrived; `default_finish` stands in for a
    /// finish reason the upstream did not send (`None`: `null`).
    fn assemble(self, default_finish: Option<&str>) -> Assembled {
        let finish_reason =
            normalise_finish(self.finish_reason).or_else(|| default_finish.map(str::to_owned));
        let choice = json!({"index": 0, "text": self.text, "logprobs": null, "finish_reason": finish_reason});
        assembled_completion(
            self.head.as_ref(),
            "text_completion",
            &choice,
            self.usage.as_ref(),
            finish_reason.as_deref().unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn body(v: Value) -> JsonBody {
        JsonBody::parse(Bytes::from(serde_json::to_vec(&v).expect("json"))).expect("body")
    }

    #[test]
    fn prepare_checks_the_prompt_and_imposes_the_model() {
        let mut b = body(json!({"model": "x", "prompt": "Once upon", "stream": true}));
        let sampling = json!({"temperature": 0.3})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let p = CompletionsDialect
            .prepare(&mut b, "policy", &sampling)
            .expect("prepare");
        assert!(p.stream && p.hide_stream_usage);
        let v = b.to_value();
        assert_eq!(v["model"], "policy");
        assert_eq!(v["temperature"], 0.3);
        for bad in [
            json!({"prompt": 3}),
            json!({}),
            json!({"prompt": "a", "n": 2}),
        ] {
            assert!(CompletionsDialect
                .prepare(&mut body(bad), "m", &Sampling::new())
                .is_err());
        }
    }

    #[test]
    fn capture_asks_for_ids_and_sampled_logprobs_only() {
        let mut b = body(json!({"prompt": "a"}));
        let c = CompletionsDialect.capture_tokens(&mut b).expect("capture");
        assert!(c.is_some());
        let v = b.to_value();
        assert_eq!(v["logprobs"], 0);
        assert_eq!(v["return_token_ids"], true);
        let mut b = body(json!({"prompt": "a", "logprobs": 3}));
        CompletionsDialect.capture_tokens(&mut b).expect("capture");
        assert_eq!(b.to_value()["logprobs"], 3);
    }

    #[test]
    fn stream_assembles_text_and_usage() {
        let mut a = CompletionsDialect.assembler(&Prepared {
            stream: true,
            hide_stream_usage: true,
        });
        let events = [
            "data: {\"id\":\"c\",\"created\":1,\"model\":\"m\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"Hel\",\"logprobs\":null,\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"lo\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}\n\n",
            "data: [DONE]\n\n",
        ];
        let relays: Vec<Relay> = events
            .iter()
            .map(|e| a.push(&SseEvent::new(e.as_bytes())))
            .collect();
        assert_eq!(
            relays,
            [Relay::Forward, Relay::Forward, Relay::Drop, Relay::Withhold]
        );
        let out = a.finish().expect("assembled");
        assert_eq!(out.response.to_value()["choices"][0]["text"], "Hello");
        assert_eq!(out.summary.finish_reason.as_deref(), Some("length"));
        assert_eq!(out.summary.usage.completion_tokens, 2);
        let summary = CompletionsDialect
            .summarize(out.response.bytes())
            .expect("summary");
        assert_eq!(summary, out.summary);
    }
}
