//! The dialect's answer made from parsed completion ids: a complete JSON response, or a
//! live stream of the dialect's events as the ids arrive (Chat Completions chunks,
//! Responses events, Anthropic Messages events).

use bytes::BytesMut;
use intercept_core::DialectKind;
use intercept_tokens::{ParsedResponse, ParsedToolCall, StreamEvent, ToolCallStatus};
use serde_json::{json, Value};

/// Writes one call's answer in its dialect.
#[derive(Debug)]
pub(crate) struct AnswerWriter {
    shape: Shape,
    model: String,
    id: String,
    created: u64,
    /// Chat: the harness asked for the usage chunk.
    include_usage: bool,
    started: bool,
    /// Tool calls written so far (their ids and whether each parsed).
    calls: Vec<ParsedToolCall>,
    /// Stream state for Responses and Anthropic: the open item or block, and counters.
    open: Option<Open>,
    index: u32,
    sequence: u64,
    text: String,
    reasoning: String,
}

/// The wire shape of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Responses,
    Messages,
}

/// The item (Responses) or content block (Anthropic) being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Text,
}

fn data(out: &mut BytesMut, value: &Value) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&serde_json::to_vec(value).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
}

fn named(out: &mut BytesMut, name: &str, value: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\n");
    data(out, value);
}

/// A tool call id of the dialect: unique, in the shape its SDKs expect.
fn call_id(shape: Shape) -> String {
    let prefix = match shape {
        Shape::Messages => "toolu_",
        _ => "call_",
    };
    let mut s = String::from(prefix);
    for _ in 0..24 {
        s.push(fastrand::alphanumeric());
    }
    s
}

/// A parsed call's arguments as JSON text (`{}` when it had none).
fn arguments(call: &ParsedToolCall) -> String {
    call.arguments.clone().unwrap_or_else(|| "{}".to_owned())
}

fn arguments_value(call: &ParsedToolCall) -> Value {
    serde_json::from_str(&arguments(call)).unwrap_or_else(|_| json!({}))
}

/// The dialect's finish reason for the engine's: `stop` becomes the tool-call reason
/// when a well-formed call was parsed.
fn finish_reason(shape: Shape, engine: Option<&str>, called: bool) -> &'static str {
    let stop = matches!(engine, None | Some("stop"));
    let length = engine == Some("length");
    match shape {
        Shape::Messages => match (called && stop, length) {
            (true, _) => "tool_use",
            (_, true) => "max_tokens",
            _ => "end_turn",
        },
        _ => match (called && stop, length) {
            (true, _) => "tool_calls",
            (_, true) => "length",
            _ => "stop",
        },
    }
}

/// What a malformed call looked like, for the answer and the record.
fn malformed(calls: &[ParsedToolCall]) -> Option<Value> {
    let bad: Vec<Value> = calls
        .iter()
        .filter(|c| c.status != ToolCallStatus::Ok)
        .map(|c| json!({"status": c.status.as_str(), "text": c.raw}))
        .collect();
    (!bad.is_empty()).then_some(Value::Array(bad))
}

impl AnswerWriter {
    pub(crate) fn new(kind: DialectKind, model: String, include_usage: bool) -> Self {
        let shape = match kind {
            DialectKind::Responses => Shape::Responses,
            DialectKind::Messages => Shape::Messages,
            _ => Shape::Chat,
        };
        let mut id = String::from(match shape {
            Shape::Messages => "msg_",
            Shape::Responses => "resp_",
            _ => "chatcmpl-",
        });
        for _ in 0..24 {
            id.push(fastrand::alphanumeric());
        }
        AnswerWriter {
            shape,
            model,
            id,
            created: intercept_core::record::epoch_seconds(std::time::SystemTime::now()) as u64,
            include_usage,
            started: false,
            calls: Vec::new(),
            open: None,
            index: 0,
            sequence: 0,
            text: String::new(),
            reasoning: String::new(),
        }
    }

    /// The streamed tool calls that did not parse, as `tool_call_errors` lists them.
    pub(crate) fn malformed(&self) -> Option<Value> {
        malformed(&self.calls)
    }

    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// The stream's opening (a JSON answer has none).
    pub(crate) fn start(&mut self, out: &mut BytesMut) {
        self.started = true;
        match self.shape {
            Shape::Messages => named(
                out,
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ),
            Shape::Responses => {
                let response = self.response_object("in_progress", Vec::new(), None);
                self.emit(out, "response.created", json!({"response": response}));
                let response = self.response_object("in_progress", Vec::new(), None);
                self.emit(out, "response.in_progress", json!({"response": response}));
            }
            _ => {}
        }
    }

    /// A complete answer (a non-streamed call).
    pub(crate) fn complete(
        &mut self,
        parsed: &ParsedResponse,
        engine_finish: Option<&str>,
        prompt_tokens: usize,
        completion_tokens: usize,
        out: &mut BytesMut,
    ) {
        let calls: Vec<ParsedToolCall> = parsed.tool_calls.clone();
        let ok: Vec<(String, &ParsedToolCall)> = calls
            .iter()
            .filter(|c| c.status == ToolCallStatus::Ok)
            .map(|c| (call_id(self.shape), c))
            .collect();
        let finish = finish_reason(self.shape, engine_finish, !ok.is_empty());
        let reasoning = parsed.reasoning_content.clone().filter(|r| !r.is_empty());
        let value = match self.shape {
            Shape::Messages => {
                let mut content = Vec::new();
                if let Some(r) = &reasoning {
                    content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
                }
                if !parsed.content.is_empty() {
                    content.push(json!({"type": "text", "text": parsed.content}));
                }
                for (id, c) in &ok {
                    content.push(json!({"type": "tool_use", "id": id, "name": c.name, "input": arguments_value(c)}));
                }
                let mut v = json!({
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": content, "stop_reason": finish, "stop_sequence": null,
                    "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
                });
                if let Some(bad) = malformed(&calls) {
                    v["tool_call_errors"] = bad;
                }
                v
            }
            Shape::Responses => {
                let mut output = Vec::new();
                if let Some(r) = &reasoning {
                    output.push(self.reasoning_item(r));
                }
                if !parsed.content.is_empty() {
                    output.push(self.message_item(&parsed.content));
                }
                for (id, c) in &ok {
                    output.push(function_call_item(id, c));
                }
                let status = if engine_finish == Some("length") {
                    "incomplete"
                } else {
                    "completed"
                };
                let usage = json!({"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens});
                let mut v = self.response_object(status, output, Some(usage));
                if status == "incomplete" {
                    v["incomplete_details"] = json!({"reason": "max_output_tokens"});
                }
                if let Some(bad) = malformed(&calls) {
                    v["tool_call_errors"] = bad;
                }
                v
            }
            _ => {
                let mut message = json!({"role": "assistant",
                    "content": if parsed.content.is_empty() && !ok.is_empty() { Value::Null } else { Value::String(parsed.content.clone()) }});
                if let Some(r) = &reasoning {
                    message["reasoning_content"] = Value::String(r.clone());
                }
                if !ok.is_empty() {
                    message["tool_calls"] = ok
                        .iter()
                        .map(|(id, c)| {
                            json!({"id": id, "type": "function",
                            "function": {"name": c.name, "arguments": arguments(c)}})
                        })
                        .collect();
                }
                if let Some(bad) = malformed(&calls) {
                    message["tool_call_errors"] = bad;
                }
                json!({
                    "id": self.id, "object": "chat.completion", "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens},
                })
            }
        };
        out.extend_from_slice(&serde_json::to_vec(&value).unwrap_or_default());
    }

    /// One parsed piece of a streamed completion.
    pub(crate) fn event(&mut self, event: &StreamEvent, out: &mut BytesMut) {
        match event {
            StreamEvent::Reasoning(text) if !text.is_empty() => {
                self.delta(Open::Reasoning, text, out)
            }
            StreamEvent::Content(text) if !text.is_empty() => self.delta(Open::Text, text, out),
            StreamEvent::ToolCall(call) => self.tool_call(call.clone(), out),
            _ => {}
        }
    }

    fn chat_chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
               "model": self.model,
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    }

    fn delta(&mut self, kind: Open, text: &str, out: &mut BytesMut) {
        match self.shape {
            Shape::Chat => {
                if self.sequence == 0 {
                    data(
                        out,
                        &self.chat_chunk(json!({"role": "assistant", "content": ""}), None),
                    );
                    self.sequence = 1;
                }
                let delta = match kind {
                    Open::Reasoning => json!({"reasoning_content": text}),
                    Open::Text => json!({"content": text}),
                };
                data(out, &self.chat_chunk(delta, None));
            }
            Shape::Messages => {
                if self.open != Some(kind) {
                    self.close(out);
                    let block = match kind {
                        Open::Reasoning => json!({"type": "thinking", "thinking": ""}),
                        Open::Text => json!({"type": "text", "text": ""}),
                    };
                    named(
                        out,
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
                    );
                    self.open = Some(kind);
                }
                let delta = match kind {
                    Open::Reasoning => json!({"type": "thinking_delta", "thinking": text}),
                    Open::Text => json!({"type": "text_delta", "text": text}),
                };
                named(
                    out,
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
                );
            }
            Shape::Responses => {
                if self.open != Some(kind) {
                    self.close(out);
                    let item = match kind {
                        Open::Reasoning => {
                            json!({"id": self.item_id("rs"), "type": "reasoning", "summary": [], "content": []})
                        }
                        Open::Text => {
                            json!({"id": self.item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []})
                        }
                    };
                    self.emit(
                        out,
                        "response.output_item.added",
                        json!({"output_index": self.index, "item": item}),
                    );
                    if kind == Open::Text {
                        self.emit(out, "response.content_part.added", json!({"item_id": self.item_id("msg"), "output_index": self.index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
                    }
                    self.open = Some(kind);
                }
                match kind {
                    Open::Reasoning => {
                        self.reasoning.push_str(text);
                        let id = self.item_id("rs");
                        self.emit(out, "response.reasoning_text.delta", json!({"item_id": id, "output_index": self.index, "content_index": 0, "delta": text}));
                    }
                    Open::Text => {
                        self.text.push_str(text);
                        let id = self.item_id("msg");
                        self.emit(out, "response.output_text.delta", json!({"item_id": id, "output_index": self.index, "content_index": 0, "delta": text, "logprobs": []}));
                    }
                }
            }
        }
    }

    fn tool_call(&mut self, call: ParsedToolCall, out: &mut BytesMut) {
        if call.status != ToolCallStatus::Ok {
            self.calls.push(call);
            return;
        }
        let id = call_id(self.shape);
        match self.shape {
            Shape::Chat => {
                if self.sequence == 0 {
                    data(
                        out,
                        &self.chat_chunk(json!({"role": "assistant", "content": ""}), None),
                    );
                    self.sequence = 1;
                }
                let index = self
                    .calls
                    .iter()
                    .filter(|c| c.status == ToolCallStatus::Ok)
                    .count();
                let delta = json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": call.name, "arguments": arguments(&call)}}]});
                data(out, &self.chat_chunk(delta, None));
            }
            Shape::Messages => {
                self.close(out);
                named(
                    out,
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": self.index,
                    "content_block": {"type": "tool_use", "id": id, "name": call.name, "input": {}}}),
                );
                named(
                    out,
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": self.index,
                    "delta": {"type": "input_json_delta", "partial_json": arguments(&call)}}),
                );
                named(
                    out,
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": self.index}),
                );
                self.index += 1;
            }
            Shape::Responses => {
                self.close(out);
                let mut item = function_call_item(&id, &call);
                item["status"] = json!("in_progress");
                item["arguments"] = json!("");
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": self.index, "item": item.clone()}),
                );
                self.emit(out, "response.function_call_arguments.delta", json!({"item_id": item["id"], "output_index": self.index, "delta": arguments(&call)}));
                self.emit(out, "response.function_call_arguments.done", json!({"item_id": item["id"], "output_index": self.index, "arguments": arguments(&call)}));
                let done = function_call_item(&id, &call);
                self.emit(
                    out,
                    "response.output_item.done",
                    json!({"output_index": self.index, "item": done}),
                );
                self.index += 1;
            }
        }
        let mut call = call;
        call.raw = id;
        self.calls.push(call);
    }

    /// Closes the open block or item (Anthropic, Responses).
    fn close(&mut self, out: &mut BytesMut) {
        let Some(open) = self.open.take() else { return };
        match self.shape {
            Shape::Messages => {
                if open == Open::Reasoning {
                    named(
                        out,
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "signature_delta", "signature": ""}}),
                    );
                }
                named(
                    out,
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": self.index}),
                );
            }
            Shape::Responses => match open {
                Open::Reasoning => {
                    let item = self.reasoning_item(&self.reasoning.clone());
                    let id = self.item_id("rs");
                    self.emit(out, "response.reasoning_text.done", json!({"item_id": id, "output_index": self.index, "content_index": 0, "text": self.reasoning.clone()}));
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": self.index, "item": item}),
                    );
                }
                Open::Text => {
                    let id = self.item_id("msg");
                    let text = self.text.clone();
                    self.emit(out, "response.output_text.done", json!({"item_id": id, "output_index": self.index, "content_index": 0, "text": text, "logprobs": []}));
                    self.emit(out, "response.content_part.done", json!({"item_id": id, "output_index": self.index, "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}));
                    let item = self.message_item(&text);
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": self.index, "item": item}),
                    );
                }
            },
            _ => {}
        }
        self.index += 1;
    }

    /// The stream's end: the finish reason, usage and the terminal event.
    pub(crate) fn finish(
        &mut self,
        engine_finish: Option<&str>,
        prompt_tokens: usize,
        completion_tokens: usize,
        out: &mut BytesMut,
    ) {
        let called = self.calls.iter().any(|c| c.status == ToolCallStatus::Ok);
        let finish = finish_reason(self.shape, engine_finish, called);
        let bad = malformed(&self.calls);
        match self.shape {
            Shape::Chat => {
                if self.sequence == 0 {
                    data(
                        out,
                        &self.chat_chunk(json!({"role": "assistant", "content": ""}), None),
                    );
                }
                let mut delta = json!({});
                if let Some(bad) = bad {
                    delta["tool_call_errors"] = bad;
                }
                data(out, &self.chat_chunk(delta, Some(finish)));
                if self.include_usage {
                    data(
                        out,
                        &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                  "total_tokens": prompt_tokens + completion_tokens}}),
                    );
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Shape::Messages => {
                self.close(out);
                let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": finish, "stop_sequence": null},
                    "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}});
                if let Some(bad) = bad {
                    delta["tool_call_errors"] = bad;
                }
                named(out, "message_delta", &delta);
                named(out, "message_stop", &json!({"type": "message_stop"}));
            }
            Shape::Responses => {
                self.close(out);
                let mut output = Vec::new();
                if !self.reasoning.is_empty() {
                    output.push(self.reasoning_item(&self.reasoning.clone()));
                }
                if !self.text.is_empty() {
                    output.push(self.message_item(&self.text.clone()));
                }
                for c in self
                    .calls
                    .clone()
                    .iter()
                    .filter(|c| c.status == ToolCallStatus::Ok)
                {
                    output.push(function_call_item(&c.raw, c));
                }
                let length = engine_finish == Some("length");
                let status = if length { "incomplete" } else { "completed" };
                let usage = json!({"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens});
                let mut response = self.response_object(status, output, Some(usage));
                if length {
                    response["incomplete_details"] = json!({"reason": "max_output_tokens"});
                }
                if let Some(bad) = bad {
                    response["tool_call_errors"] = bad;
                }
                let name = if length {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit(out, name, json!({"response": response}));
            }
        }
    }

    /// A Responses event with its type and sequence number.
    fn emit(&mut self, out: &mut BytesMut, name: &str, mut body: Value) {
        body["type"] = json!(name);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        named(out, name, &body);
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", &self.id[5..], self.index)
    }

    fn reasoning_item(&self, text: &str) -> Value {
        json!({"id": self.item_id("rs"), "type": "reasoning", "summary": [],
               "content": [{"type": "reasoning_text", "text": text}]})
    }

    fn message_item(&self, text: &str) -> Value {
        json!({"id": self.item_id("msg"), "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    fn response_object(&self, status: &str, output: Vec<Value>, usage: Option<Value>) -> Value {
        json!({"id": self.id, "object": "response", "created_at": self.created, "status": status,
               "model": self.model, "output": output, "usage": usage,
               "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
               "incomplete_details": null, "error": null})
    }
}

fn function_call_item(id: &str, call: &ParsedToolCall) -> Value {
    json!({"id": format!("fc_{}", id.trim_start_matches("call_")), "type": "function_call", "status": "completed",
           "call_id": id, "name": call.name, "arguments": arguments(call)})
}
