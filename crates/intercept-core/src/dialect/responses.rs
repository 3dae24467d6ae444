//! OpenAI Responses.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{
    whitelisted, Assembled, Dialect, DialectKind, Prepared, Relay, StreamAssembler, Summary,
};
use crate::body::{JsonBody, RawJson};
use crate::error::Error;
use crate::rollout::{Sampling, StopReason};
use crate::sse::SseEvent;
use crate::trace::record::Usage;

const SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "max_output_tokens",
    "max_tool_calls",
    "reasoning",
    "text",
    "tool_choice",
    "parallel_tool_calls",
    "top_logprobs",
    "truncation",
];

/// Terminal event types of a Responses stream.
const TERMINAL: &[&str] = &[
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// OpenAI Responses: `POST /v1/responses`, secret in `Authorization: Bearer`; a stream
/// ends with `response.completed`, `response.incomplete` or `response.failed` (withheld,
/// with anything after it, until the call is recorded).
///
/// Overrides: `model` forced; the session's sampling is authoritative: the harness's
/// `temperature`, `top_p`, `max_output_tokens` and `max_tokens` are dropped, then the
/// session's `temperature`, `top_p`, `max_tokens` (as `max_output_tokens`) and
/// `reasoning_effort` (as `reasoning.effort`) are applied. For OpenAI reasoning models
/// (`gpt-5*`, `o1*`, `o3*`, `o4*`, not `-chat`), `include` gains
/// `reasoning.encrypted_content` and `reasoning.summary` defaults to `auto`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponsesDialect;

/// Whether a model name is an OpenAI reasoning model.
pub(crate) fn is_openai_reasoning_model(model: &str) -> bool {
    let (prefix_ok, name) = match model.rsplit_once('/') {
        Some((prefix, name)) => (prefix == "openai", name),
        None => (true, model),
    };
    prefix_ok
        && ["gpt-5", "o1", "o3", "o4"]
            .iter()
            .any(|p| name.starts_with(p))
        && !name.contains("-chat")
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<Details>,
    #[serde(default)]
    output_tokens_details: Option<Details>,
}

#[derive(Deserialize, Default)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// Reads a response object: status check, finish reason, usage.
fn read_response(v: &Value) -> Result<Summary, Error> {
    let obj = v
        .as_object()
        .ok_or_else(|| Error::UpstreamMalformed("expected a response object".into()))?;
    let status = obj.get("status").and_then(Value::as_str);
    if let Some(status) =
        status.filter(|s| !matches!(*s, "completed" | "incomplete" | "in_progress"))
    {
        let err = obj.get("error").cloned().unwrap_or(Value::Null);
        let code = err.get("code").and_then(Value::as_str).unwrap_or("");
        let message = err.get("message").and_then(Value::as_str).unwrap_or("");
        let body =
            format!("upstream Responses request did not complete: {status}: {code}: {message}");
        let http = match code {
            "context_length_exceeded" => 400,
            "rate_limit_exceeded" | "rate_limit_error" => 429,
            "invalid_prompt" => 400,
            _ => 502,
        };
        let body = if code == "context_length_exceeded" {
            format!("{body} (context_length_exceeded)")
        } else {
            body
        };
        return Err(Error::upstream_status(http, body, None));
    }
    let output = obj.get("output").and_then(Value::as_array);
    let has_calls = output.into_iter().flatten().any(|item| {
        item.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("_call") && t != "web_search_call")
    });
    let finish = if status == Some("incomplete") {
        "length"
    } else if has_calls {
        "tool_calls"
    } else {
        "stop"
    };
    let usage = obj
        .get("usage")
        .filter(|u| !u.is_null())
        .map(|u| serde_json::from_value::<WireUsage>(u.clone()))
        .transpose()
        .map_err(|e| Error::UpstreamMalformed(format!("unreadable Responses usage: {e}")))?
        .unwrap_or_default();
    Ok(Summary {
        finish_reason: Some(finish.to_owned()),
        usage: Usage {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            cached_input_tokens: usage
                .input_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            reasoning_tokens: usage
                .output_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        },
        message: None,
    })
}

impl Dialect for ResponsesDialect {
    fn kind(&self) -> DialectKind {
        DialectKind::Responses
    }

    fn routes(&self) -> &'static [&'static str] {
        &["/v1/responses", "/responses"]
    }

    fn upstream_path(&self) -> &'static str {
        "/responses"
    }

    /// As OpenAI streams a failure: an `error` event (`type`, `code`, `message`,
    /// `param`), then the terminal `response.failed` whose `response.error` carries the
    /// same code and message (what Codex and the Agents SDK read).
    fn error_event(&self, error: &Error) -> bytes::Bytes {
        let status = error.status();
        let context_length = error.is_context_length()
            || matches!(error, Error::RolloutStopped(StopReason::ContextLength));
        let code = match status {
            429 => "rate_limit_exceeded",
            500..=599 => "server_error",
            _ if context_length => "context_length_exceeded",
            _ => error.type_name(),
        };
        let message = error.to_string();
        let error = json!({"type": "error", "code": code, "message": message, "param": null});
        let failed = json!({
            "type": "response.failed",
            "response": {
                "id": "resp_intercept_error",
                "object": "response",
                "status": "failed",
                "error": {"code": code, "message": message},
                "incomplete_details": null,
                "output": [],
                "usage": null,
            },
        });
        let mut out = super::named_event("error", &error).to_vec();
        out.extend_from_slice(&super::named_event("response.failed", &failed));
        bytes::Bytes::from(out)
    }

    fn mediate(
        &self,
        body: &mut JsonBody,
        policy: &crate::network::NetworkPolicy,
    ) -> Result<Vec<String>, Error> {
        super::mediate::responses(body, policy)
    }

    fn prepare(
        &self,
        body: &mut JsonBody,
        model: &str,
        sampling: &Sampling,
    ) -> Result<Prepared, Error> {
        if !body.contains("input") && !body.contains("previous_response_id") {
            return Err(Error::invalid(
                "`input` is required: send the conversation as a string or an array of input items",
            ));
        }
        body.set("model", model)?;
        for key in ["temperature", "top_p", "max_output_tokens", "max_tokens"] {
            body.remove(key);
        }
        for key in ["temperature", "top_p"] {
            if let Some(v) = sampling.get(key).filter(|v| !v.is_null()) {
                body.set(key, v)?;
            }
        }
        if let Some(v) = sampling
            .get("max_tokens")
            .or_else(|| sampling.get("max_output_tokens"))
            .filter(|v| !v.is_null())
        {
            body.set("max_output_tokens", v)?;
        }
        let effort = sampling
            .get("reasoning_effort")
            .filter(|v| !v.is_null())
            .cloned();
        let reasoning_model = is_openai_reasoning_model(model);
        if effort.is_some() || reasoning_model {
            let mut reasoning: Map<String, Value> = match body.value("reasoning") {
                Some(Value::Object(o)) => o,
                _ => Map::new(),
            };
            if let Some(e) = effort {
                reasoning.insert("effort".into(), e);
            }
            if reasoning_model {
                let mut merged = Map::new();
                merged.insert("summary".into(), json!("auto"));
                merged.extend(reasoning);
                reasoning = merged;
                let mut include: Vec<Value> = match body.value("include") {
                    Some(Value::Array(a)) => a,
                    _ => Vec::new(),
                };
                if !include.iter().any(|v| v == "reasoning.encrypted_content") {
                    include.push(json!("reasoning.encrypted_content"));
                }
                body.set("include", &include)?;
            }
            body.set("reasoning", &reasoning)?;
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
            .map_err(|e| Error::UpstreamMalformed(format!("expected a response object: {e}")))?;
        read_response(&v)
    }

    fn assembler(&self, _prepared: &Prepared) -> Box<dyn StreamAssembler> {
        Box::<ResponsesAssembler>::default()
    }

    fn synthesize_stream(&self, response: &Value) -> Vec<bytes::Bytes> {
        let text: String = response["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["type"] == "message")
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["text"].as_str().map(str::to_owned))
            .collect();
        let item_id = response["output"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["type"] == "message")
            .and_then(|i| i["id"].as_str())
            .unwrap_or("msg_intercepted")
            .to_owned();
        let mut created = response.clone();
        created["status"] = json!("in_progress");
        created["output"] = json!([]);
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let item = json!({"id": item_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]});
        let events = [
            (
                "response.created",
                json!({"type": "response.created", "response": created}),
            ),
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 0, "item": {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
            ),
            (
                "response.content_part.added",
                json!({"type": "response.content_part.added", "item_id": item_id, "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            ),
            (
                "response.output_text.delta",
                json!({"type": "response.output_text.delta", "item_id": item_id, "output_index": 0, "content_index": 0, "delta": text}),
            ),
            (
                "response.output_text.done",
                json!({"type": "response.output_text.done", "item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
            ),
            (
                "response.content_part.done",
                json!({"type": "response.content_part.done", "item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
            (
                "response.completed",
                json!({"type": "response.completed", "response": response}),
            ),
        ];
        events
            .into_iter()
            .enumerate()
            .map(|(n, (name, mut v))| {
                v["sequence_number"] = json!(n);
                super::named_event(name, &v)
            })
            .collect()
    }
}

#[derive(Debug, Default)]
struct ResponsesAssembler {
    terminal: Option<Value>,
    upstream_error: Option<String>,
    unreadable: Option<String>,
}

impl StreamAssembler for ResponsesAssembler {
    fn push(&mut self, event: &SseEvent<'_>) -> Relay {
        if self.terminal.is_some() {
            return Relay::Withhold;
        }
        let Some(data) = event.data() else {
            return Relay::Forward;
        };
        if data.trim_ascii() == b"[DONE]" {
            return Relay::Forward;
        }
        let v: Value = match crate::body::from_json_bytes(&data) {
            Ok(v) => v,
            Err(e) => {
                self.unreadable
                    .get_or_insert_with(|| format!("unreadable Responses event: {e}"));
                return Relay::Forward;
            }
        };
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
        if TERMINAL.contains(&ty) {
            self.terminal = Some(v.get("response").cloned().unwrap_or(Value::Null));
            return Relay::Withhold;
        }
        if ty == "error" {
            let message = v
                .get("message")
                .or_else(|| v.get("error").and_then(|e| e.get("message")))
                .and_then(Value::as_str)
                .unwrap_or("the upstream sent an error event");
            self.upstream_error = Some(message.to_owned());
        }
        Relay::Forward
    }

    fn saw_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    fn finish(self: Box<Self>) -> Result<Assembled, Error> {
        if let Some(message) = self.upstream_error {
            return Err(Error::upstream_status(502, message, None));
        }
        let Some(response) = self.terminal else {
            return Err(Error::UpstreamMalformed(match self.unreadable {
                Some(e) => e,
                None => "upstream stream ended before its terminal event (`response.completed`, `response.incomplete` or `response.failed`)".into(),
            }));
        };
        let summary = read_response(&response)?;
        Ok(Assembled {
            response: RawJson::from_value(&response),
            summary,
        })
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
    fn overrides_make_sampling_authoritative() {
        let mut b = body(
            json!({"model":"x","input":"hi","temperature":1.0,"max_tokens":9,"reasoning":{"effort":"low","summary":"detailed"}}),
        );
        let sampling =
            json!({"temperature":0.3,"max_tokens":100,"reasoning_effort":"high","seed":1})
                .as_object()
                .cloned()
                .unwrap_or_default();
        ResponsesDialect
            .prepare(&mut b, "gpt-5-mini", &sampling)
            .expect("prepare");
        let v = b.to_value();
        assert_eq!(v["model"], "gpt-5-mini");
        assert_eq!(v["temperature"], 0.3);
        assert_eq!(v["max_output_tokens"], 100);
        assert!(v.get("max_tokens").is_none() && v.get("seed").is_none());
        assert_eq!(
            v["reasoning"],
            json!({"summary":"detailed","effort":"high"})
        );
        assert_eq!(v["include"], json!(["reasoning.encrypted_content"]));
        // Idempotent.
        let again = b.to_value();
        let mut b2 = body(again.clone());
        ResponsesDialect
            .prepare(&mut b2, "gpt-5-mini", &sampling)
            .expect("prepare");
        assert_eq!(b2.to_value(), again);
    }

    #[test]
    fn reasoning_model_names() {
        assert!(is_openai_reasoning_model("o3-mini"));
        assert!(is_openai_reasoning_model("openai/gpt-5"));
        assert!(!is_openai_reasoning_model("gpt-5-chat-latest"));
        assert!(!is_openai_reasoning_model("qwen/o3"));
        assert!(!is_openai_reasoning_model("gpt-4o"));
    }

    #[test]
    fn failed_statuses_map_to_errors() {
        let ok = ResponsesDialect
            .summarize(br#"{"status":"completed","output":[{"type":"function_call"}],"usage":{"input_tokens":4,"output_tokens":2}}"#)
            .expect("ok");
        assert_eq!(ok.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(ok.usage.prompt_tokens, 4);
        let e = ResponsesDialect
            .summarize(
                br#"{"status":"failed","error":{"code":"rate_limit_exceeded","message":"slow"}}"#,
            )
            .expect_err("failed");
        assert_eq!(e.status(), 429);
        let e = ResponsesDialect
            .summarize(br#"{"status":"failed","error":{"code":"context_length_exceeded","message":"too long"}}"#)
            .expect_err("failed");
        assert!(e.is_context_length(), "{e}");
    }

    #[test]
    fn error_event_is_native() {
        let raw = ResponsesDialect.error_event(&Error::RolloutStopped(StopReason::ContextLength));
        let mut splitter = crate::sse::SseSplitter::new();
        splitter.push(&raw);
        let first = splitter.next_event().expect("error event");
        let first = SseEvent::new(&first);
        assert_eq!(first.event_name(), Some(&b"error"[..]));
        let v: Value = serde_json::from_slice(&first.data().expect("data")).expect("json");
        assert_eq!(v["type"], "error");
        assert_eq!(v["code"], "context_length_exceeded");
        assert_eq!(v["message"], "rollout stopped: context_length");
        let second = splitter.next_event().expect("failed event");
        let second = SseEvent::new(&second);
        assert_eq!(second.event_name(), Some(&b"response.failed"[..]));
        let v: Value = serde_json::from_slice(&second.data().expect("data")).expect("json");
        assert_eq!(v["type"], "response.failed");
        assert_eq!(v["response"]["status"], "failed");
        assert_eq!(v["response"]["error"]["code"], "context_length_exceeded");
        assert!(splitter.next_event().is_none());
        splitter.push(&ResponsesDialect.error_event(&Error::UpstreamUnavailable("gone".into())));
        let first = splitter.next_event().expect("error event");
        let v: Value =
            serde_json::from_slice(&SseEvent::new(&first).data().expect("data")).expect("json");
        assert_eq!(v["code"], "server_error");
    }

    #[test]
    fn error_event_code_follows_the_kind_not_the_text() {
        let code = |e: Error| {
            let mut splitter = crate::sse::SseSplitter::new();
            splitter.push(&ResponsesDialect.error_event(&e));
            let first = splitter.next_event().expect("error event");
            let v: Value =
                serde_json::from_slice(&SseEvent::new(&first).data().expect("data")).expect("json");
            v["code"].as_str().expect("code").to_owned()
        };
        // A hook's stop condition that reads like a context-length stop is not one.
        let hook = Error::RolloutStopped(StopReason::Hook("context_length".into()));
        assert_eq!(code(hook), "invalid_request_error");
        let upstream = Error::upstream_status(
            400,
            "This model's maximum context length is 8192 tokens".into(),
            None,
        );
        assert_eq!(code(upstream), "context_length_exceeded");
        assert_eq!(
            code(Error::Paused {
                retry_after_secs: 1,
                held: false
            }),
            "rate_limit_exceeded"
        );
    }

    #[test]
    fn stream_withholds_the_terminal_event_and_after() {
        let mut a = ResponsesDialect.assembler(&Prepared::default());
        let created = r#"data: {"type":"response.created","response":{"status":"in_progress"}}"#;
        assert_eq!(
            a.push(&SseEvent::new(format!("{created}\n\n").as_bytes())),
            Relay::Forward
        );
        let done = r#"event: response.completed
data: {"type":"response.completed","response":{"status":"completed","output":[],"usage":{"input_tokens":1,"output_tokens":2}}}"#;
        assert_eq!(
            a.push(&SseEvent::new(format!("{done}\n\n").as_bytes())),
            Relay::Withhold
        );
        assert_eq!(a.push(&SseEvent::new(b"data: [DONE]\n\n")), Relay::Withhold);
        let out = a.finish().expect("assembled");
        assert_eq!(out.summary.usage.completion_tokens, 2);
        let b = ResponsesDialect.assembler(&Prepared::default());
        assert!(b.finish().is_err());
    }
}
