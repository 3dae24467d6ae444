//! Scripted replies.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::StatusCode;
use serde::Serialize;

/// The message of [`Reply::context_length_error`] on the OpenAI routes (Chat Completions
/// and Responses), in the words vLLM and OpenAI use.
pub const CONTEXT_LENGTH_MESSAGE: &str = "This model's maximum context length is 4096 tokens. \
     However, your messages resulted in 5000 tokens.";

/// The message of [`Reply::context_length_error`] on the Anthropic route, in Anthropic's
/// words.
pub const ANTHROPIC_CONTEXT_LENGTH_MESSAGE: &str = "prompt is too long: 5000 tokens > 4096 maximum";

/// The message of [`Reply::context_length_error`] on vLLM's `/inference/v1/generate`, in
/// vLLM's words (its input processor's).
pub const VLLM_CONTEXT_LENGTH_MESSAGE: &str =
    "The decoder prompt (length 5000) is longer than the \
     maximum model length of 4096. Make sure that `max_model_len` is no smaller than the number \
     of text tokens.";

/// The message of [`Reply::context_length_error`] on SGLang's `/generate`, in SGLang's
/// words.
pub const SGLANG_CONTEXT_LENGTH_MESSAGE: &str =
    "The input (5000 tokens) is longer than the model's context length (4096 tokens).";

/// One scripted answer of the mock, pushed with
/// [`MockUpstream::push`](super::MockUpstream::push) and used by the next request.
///
/// Start from a constructor ([`Reply::text`], [`Reply::tool_call`], [`Reply::error`],
/// [`Reply::raw`], [`Reply::hang`], ...) and refine it with the `with_*` methods.
///
/// A reply is rendered in the dialect of the route that takes it. A completion
/// ([`Reply::echo`], [`Reply::text`], [`Reply::tool_call`], [`Reply::tool_calls`],
/// [`Reply::stream_error`]) becomes a `chat.completion` object on
/// `/v1/chat/completions`, a `response` object on `/v1/responses` and a `message` object
/// on `/v1/messages`, or that dialect's event stream when the request has
/// `"stream": true`; on the token routes (vLLM's `/inference/v1/generate`, SGLang's
/// `/generate`) it becomes completion ids, laid out as Qwen3 samples them (see the
/// [crate docs](crate#token-routes)). [`Reply::error`], [`Reply::context_length_error`]
/// and [`Reply::responses_failed`] take the route's error shape (any other path gets
/// OpenAI's). [`Reply::raw`], [`Reply::error_json`] and [`Reply::events`] are sent
/// verbatim whatever the route and the request asked for.
///
/// ```
/// use std::time::Duration;
/// use intercept_mock::{Reply, ToolCall};
///
/// let truncated = Reply::text("Once upon a").with_finish_reason("length").with_usage(10, 3);
/// let thinking = Reply::text("42").with_reasoning("6 times 7").with_chunks(2);
/// let tools = Reply::tool_call("search", r#"{"q":"rust"}"#)
///     .with_tool_call(ToolCall::new("open", r#"{"url":"x"}"#).with_id("call_b"));
/// let slow = Reply::echo().with_header_delay(Duration::from_millis(50));
/// let limited = Reply::error(429, "slow down").with_retry_after(2);
/// let broken = Reply::text("never finished").disconnect_after(3);
/// # let _ = (truncated, thinking, tools, slow, limited, broken);
/// ```
#[derive(Debug, Clone)]
pub struct Reply {
    pub(crate) kind: ReplyKind,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) header_delay: Option<Duration>,
    pub(crate) chunk_delay: Option<Duration>,
    pub(crate) chunks: Option<usize>,
    pub(crate) crlf: bool,
    pub(crate) done: bool,
    pub(crate) sentinel: bool,
    pub(crate) disconnect_after: Option<usize>,
}

/// What a reply sends.
#[derive(Debug, Clone)]
pub(crate) enum ReplyKind {
    /// A completion (JSON or stream, as the request asks) in the route's dialect.
    Completion(Completion),
    /// An error with this status and message in the route's error shape.
    Error { status: StatusCode, message: String },
    /// The route's context-length error.
    ContextLength,
    /// A Responses `failed` response with this error code and message.
    Failed { code: String, message: String },
    /// A fixed status, content type and body.
    Fixed {
        status: StatusCode,
        content_type: HeaderValue,
        body: Bytes,
    },
    /// Verbatim SSE events, one body frame each.
    Events(Vec<Bytes>),
    /// No answer until the server shuts down.
    Hang,
    /// Close the connection without an answer.
    Drop,
}

/// The parts of a completion reply; `None` fields are derived from the request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Completion {
    /// Compute content and tool calls from the request (the echo behaviour).
    pub(crate) echo: bool,
    pub(crate) content: Option<String>,
    /// `content` is the whole completion text of the token routes, sent as is
    /// ([`Reply::raw_completion`]).
    pub(crate) raw: bool,
    pub(crate) reasoning: Option<String>,
    pub(crate) tool_calls: Vec<ToolCall>,
    pub(crate) finish_reason: Option<String>,
    pub(crate) usage: Option<Usage>,
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) model: Option<String>,
    /// End a stream with this error event instead of its terminal events.
    pub(crate) stream_error: Option<StreamError>,
}

/// An error sent inside a stream: its type (Anthropic's `error.type`, OpenAI's `code` or
/// `type`) and message.
#[derive(Debug, Clone)]
pub(crate) struct StreamError {
    pub(crate) kind: String,
    pub(crate) message: String,
}

/// A function call made by the mock model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call id; `None` lets the mock number it (`call_N`).
    pub id: Option<String>,
    /// The function name.
    pub name: String,
    /// The arguments, a JSON document as a string (as OpenAI sends them).
    pub arguments: String,
}

impl ToolCall {
    /// A call of `name` with `arguments` (a JSON document as a string) and a generated id.
    pub fn new(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            id: None,
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Sets the call id instead of a generated `call_N`.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
}

/// Token usage as reported in a completion's `usage` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
}

impl Usage {
    /// Usage with the given counts; `total_tokens` is their (saturating) sum.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
        }
    }
}

impl Reply {
    fn new(kind: ReplyKind) -> Self {
        Self {
            kind,
            headers: Vec::new(),
            header_delay: None,
            chunk_delay: None,
            chunks: None,
            crlf: false,
            done: true,
            sentinel: false,
            disconnect_after: None,
        }
    }

    fn completion(completion: Completion) -> Self {
        Self::new(ReplyKind::Completion(completion))
    }

    /// The default behaviour (what an empty queue does), as a reply that can be refined
    /// (delays, finish reason, usage, ...). Content and tool calls come from the request:
    /// `echo: <last user text>`, `tool said: <content>` after a tool message, or a call of
    /// the first tool when tools are offered and the last user text says `use a tool`.
    pub fn echo() -> Self {
        Self::completion(Completion {
            echo: true,
            ..Completion::default()
        })
    }

    /// An assistant message with this content; finish reason `stop`.
    pub fn text(content: impl Into<String>) -> Self {
        Self::completion(Completion {
            content: Some(content.into()),
            ..Completion::default()
        })
    }

    /// A completion whose text is exactly `text`, for the token routes
    /// (`/inference/v1/generate`, `/generate`): tokenized as it is, with no think block or
    /// tool-call layout around it, so a script can send what a real model gets wrong (an
    /// unclosed `<think>`, a `<tool_call>` with broken JSON or without its end tag). The
    /// stop id is appended as for any completion. The other routes answer it as a message
    /// with this content.
    pub fn raw_completion(text: impl Into<String>) -> Self {
        Self::completion(Completion {
            content: Some(text.into()),
            raw: true,
            ..Completion::default()
        })
    }

    /// One call of function `name` with `arguments` (a JSON document as a string); content
    /// `null`, finish reason `tool_calls`, id `call_N`.
    pub fn tool_call(name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self::tool_calls([ToolCall::new(name, arguments)])
    }

    /// Several tool calls in one message; content `null`, finish reason `tool_calls`.
    pub fn tool_calls(calls: impl IntoIterator<Item = ToolCall>) -> Self {
        Self::completion(Completion {
            tool_calls: calls.into_iter().collect(),
            ..Completion::default()
        })
    }

    /// An error answer in the route's shape, its type following the status:
    ///
    /// - OpenAI (Chat Completions, Responses, any other path):
    ///   `{"error":{"message":..,"type":..,"param":null,"code":null}}`, type
    ///   `invalid_request_error` for 400, `authentication_error` for 401,
    ///   `rate_limit_error` for 429, `server_error` for 5xx, ...;
    /// - Anthropic (`/v1/messages`): `{"type":"error","error":{"type":..,"message":..}}`,
    ///   type `invalid_request_error` for 400, `authentication_error` for 401,
    ///   `permission_error` for 403, `not_found_error` for 404, `request_too_large` for
    ///   413, `rate_limit_error` for 429, `overloaded_error` for 503 and 529, `api_error`
    ///   for other 5xx;
    /// - vLLM (`/inference/v1/generate`):
    ///   `{"error":{"message":..,"type":..,"param":null,"code":<status>}}`, type
    ///   `BadRequestError` for 400, `NotFoundError` for 404, `UnprocessableEntityError`
    ///   for 422, `InternalServerError` for 500, `NotImplementedError` for 501, else the
    ///   status phrase (`Service Unavailable`, ...);
    /// - SGLang (`/generate`): `{"error":{"message":..}}` for 400, else
    ///   `{"object":"error","message":..,"type":"<status>","param":null,"code":<status>}`.
    ///
    /// A status outside 100..=999 becomes 500.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Self::new(ReplyKind::Error {
            status: status_or_500(status),
            message: message.into(),
        })
    }

    /// An error answer with this status and JSON body, sent as is.
    pub fn error_json(status: u16, body: serde_json::Value) -> Self {
        Self::new(ReplyKind::Fixed {
            status: status_or_500(status),
            content_type: HeaderValue::from_static("application/json"),
            body: Bytes::from(body.to_string()),
        })
    }

    /// The 400 a server answers when the prompt is too long, in the route's shape:
    ///
    /// - Chat Completions: message [`CONTEXT_LENGTH_MESSAGE`], type
    ///   `invalid_request_error`, param `messages`, code `context_length_exceeded`;
    /// - Responses: the same with param `input`;
    /// - Anthropic: `{"type":"error","error":{"type":"invalid_request_error","message":
    ///   `[`ANTHROPIC_CONTEXT_LENGTH_MESSAGE`]`}}`;
    /// - vLLM's `/inference/v1/generate`: `{"error":{"message":`
    ///   [`VLLM_CONTEXT_LENGTH_MESSAGE`]`,"type":"BadRequestError","param":null,"code":400}}`;
    /// - SGLang's `/generate`: `{"error":{"message":`[`SGLANG_CONTEXT_LENGTH_MESSAGE`]`}}`.
    pub fn context_length_error() -> Self {
        Self::new(ReplyKind::ContextLength)
    }

    /// A Responses answer whose generation failed: status `failed`, `error: {code,
    /// message}`, no output, `usage: null`. As JSON it is a 200 `response` object; as a
    /// stream `response.created`, `response.in_progress`, then `response.failed` carrying
    /// it. Typical codes: `server_error`, `rate_limit_exceeded`, `invalid_prompt`,
    /// `context_length_exceeded`. Other routes answer it as `Reply::error(500, message)`.
    pub fn responses_failed(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ReplyKind::Failed {
            code: code.into(),
            message: message.into(),
        })
    }

    /// A stream that fails at once: the dialect's opening events, then an error event
    /// (see [`Reply::with_stream_error`]). `Reply::stream_error("overloaded_error",
    /// "Overloaded")` is what Anthropic sends when overloaded mid-stream.
    pub fn stream_error(error_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self::completion(Completion::default()).with_stream_error(error_type, message)
    }

    /// Any body with any status and content type, sent verbatim whatever the request
    /// asked for: malformed JSON, an HTML error page, JSON to a streaming request. A
    /// status outside 100..=999 becomes 500; an invalid content type becomes
    /// `application/octet-stream`.
    pub fn raw(status: u16, content_type: &str, body: impl Into<Bytes>) -> Self {
        let content_type = HeaderValue::from_str(content_type)
            .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
        Self::new(ReplyKind::Fixed {
            status: status_or_500(status),
            content_type,
            body: body.into(),
        })
    }

    /// A `text/event-stream` answer made of these events, written verbatim (include the
    /// `data: ` prefix and the blank line yourself), one body frame each, separated by the
    /// chunk delay. Use it for streams the mock would not make itself: comments, `event:`
    /// lines, an event split across frames, an error object mid-stream.
    pub fn events<I>(events: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<Bytes>,
    {
        Self::new(ReplyKind::Events(
            events.into_iter().map(Into::into).collect(),
        ))
    }

    /// Never answers: the request stays open until the mock shuts down (then the
    /// connection is closed) or the client gives up.
    pub fn hang() -> Self {
        Self::new(ReplyKind::Hang)
    }

    /// Closes the connection without sending a response at all.
    pub fn drop_connection() -> Self {
        Self::new(ReplyKind::Drop)
    }

    fn completion_mut(&mut self) -> Option<&mut Completion> {
        match &mut self.kind {
            ReplyKind::Completion(completion) => Some(completion),
            _ => None,
        }
    }

    /// Adds reasoning text, before the content: Chat `message.reasoning_content` (streamed
    /// as `delta.reasoning_content`), a Responses `reasoning` item with one
    /// `reasoning_text` part (streamed as `response.reasoning_text.delta`s), an Anthropic
    /// `thinking` block with a signature (streamed as `thinking_delta`s and a
    /// `signature_delta`). Its words count as reasoning tokens where the dialect reports
    /// them. No effect on non-completion replies.
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.reasoning = Some(reasoning.into());
        }
        self
    }

    /// Appends a tool call (after the content, if any; on [`Reply::echo`], before what
    /// the echo produces). The finish reason becomes `tool_calls` unless set explicitly.
    /// No effect on non-completion replies.
    pub fn with_tool_call(mut self, call: ToolCall) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.tool_calls.push(call);
        }
        self
    }

    /// Sets the finish reason (e.g. `"length"`), in Chat's words. Responses: `length` gives
    /// status `incomplete` with `incomplete_details.reason` `max_output_tokens`
    /// (`content_filter` likewise, reason `content_filter`), anything else `completed`.
    /// Anthropic: `stop` becomes `end_turn`, `length` `max_tokens`, `tool_calls`
    /// `tool_use`, anything else (`stop_sequence`, `refusal`, ...) is sent as is. The
    /// token routes: `length` ends the ids without the stop id (finish reason `length`),
    /// anything else is a normal `stop`. No effect on non-completion replies.
    pub fn with_finish_reason(mut self, reason: impl Into<String>) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.finish_reason = Some(reason.into());
        }
        self
    }

    /// Reports this usage instead of the computed word counts (Responses and Anthropic:
    /// `input_tokens` and `output_tokens`; the token routes: instead of the id counts).
    /// No effect on non-completion replies.
    pub fn with_usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.usage = Some(Usage::new(prompt_tokens, completion_tokens));
        }
        self
    }

    /// Reports this many of the prompt tokens as read from a prompt cache (at most the
    /// prompt tokens): Chat `usage.prompt_tokens_details.cached_tokens`, Responses
    /// `usage.input_tokens_details.cached_tokens`, Anthropic
    /// `usage.cache_read_input_tokens` (then `input_tokens` counts the rest). No effect on
    /// non-completion replies.
    pub fn with_cached_tokens(mut self, cached_tokens: u64) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.cached_tokens = Some(cached_tokens);
        }
        self
    }

    /// Ends a stream with an error event after the content instead of its terminal
    /// events (on the chat routes no finish chunk or `[DONE]`, no
    /// `message_delta`/`message_stop`, no `response.completed`):
    ///
    /// - Chat: `data: {"error":{"message":..,"type":<error_type>,"param":null,"code":null}}`;
    /// - Responses: `event: error` with
    ///   `{"type":"error","sequence_number":N,"code":<error_type>,"message":..,"param":null}`;
    /// - Anthropic: `event: error` with
    ///   `{"type":"error","error":{"type":<error_type>,"message":..}}`;
    /// - vLLM's `/inference/v1/generate`: the ids without a finish reason, then
    ///   `data: {"error":{"message":..,"type":<error_type>,"param":null,"code":<status>}}`
    ///   and, as vLLM does, `data: [DONE]`;
    /// - SGLang's `/generate`: the outputs, the last one unfinished, then
    ///   `data: {"error":{"message":..,"type":<error_type>,"code":<status>,"retryable":
    ///   false}}` and `data: [DONE]`.
    ///
    /// A request that did not ask for a stream gets the error as an HTTP error in the
    /// route's shape, with this type and the status it implies (`invalid_request_error`
    /// 400, `authentication_error` 401, `permission_error` 403, `not_found_error` 404,
    /// `rate_limit_error`/`rate_limit_exceeded` 429, `overloaded_error` 529, else 500).
    /// No effect on non-completion replies.
    pub fn with_stream_error(
        mut self,
        error_type: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.stream_error = Some(StreamError {
                kind: error_type.into(),
                message: message.into(),
            });
        }
        self
    }

    /// Answers with this model name instead of the request's. No effect on non-completion
    /// replies.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        if let Some(completion) = self.completion_mut() {
            completion.model = Some(model.into());
        }
        self
    }

    /// Adds a response header (appended; does not replace the mock's own headers).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Adds `retry-after: <seconds>`.
    pub fn with_retry_after(self, seconds: u64) -> Self {
        self.with_header(RETRY_AFTER, HeaderValue::from(seconds))
    }

    /// Waits this long before sending the response headers (overrides
    /// [`MockConfig::header_delay`](super::MockConfig::header_delay)).
    pub fn with_header_delay(mut self, delay: Duration) -> Self {
        self.header_delay = Some(delay);
        self
    }

    /// Waits this long between two stream events (overrides
    /// [`MockConfig::chunk_delay`](super::MockConfig::chunk_delay)).
    pub fn with_chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = Some(delay);
        self
    }

    /// Splits each streamed text into this many pieces (overrides
    /// [`MockConfig::chunks`](super::MockConfig::chunks)).
    pub fn with_chunks(mut self, chunks: usize) -> Self {
        self.chunks = Some(chunks);
        self
    }

    /// Ends each line of a generated stream with CRLF (`data: ...\r\n\r\n`).
    pub fn with_crlf(mut self) -> Self {
        self.crlf = true;
        self
    }

    /// Ends a generated stream before its terminal event, the body still ending cleanly:
    /// a Chat stream without `data: [DONE]`, a Responses stream without
    /// `response.completed` (or `.incomplete`/`.failed`), an Anthropic stream without
    /// `message_stop`.
    pub fn without_done(mut self) -> Self {
        self.done = false;
        self
    }

    /// Also sends `data: [DONE]` after the terminal event of a generated Responses or
    /// Anthropic stream (as some compatible servers do). Chat streams send it anyway.
    pub fn with_done_sentinel(mut self) -> Self {
        self.sentinel = true;
        self
    }

    /// Drops the connection after `events` stream events were sent (an `event:` +
    /// `data:` pair counts as one), with no clean end of the body. A non-streamed answer sends its headers and the first half of its body,
    /// then drops the connection. (To send nothing at all use [`Reply::drop_connection`].)
    pub fn disconnect_after(mut self, events: usize) -> Self {
        self.disconnect_after = Some(events);
        self
    }
}

fn status_or_500(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The status an error type implies (for a stream error sent to a non-streaming request).
pub(crate) fn status_for_error_type(error_type: &str) -> StatusCode {
    match error_type {
        "invalid_request_error" | "invalid_prompt" | "context_length_exceeded" => {
            StatusCode::BAD_REQUEST
        }
        "authentication_error" => StatusCode::UNAUTHORIZED,
        "permission_error" => StatusCode::FORBIDDEN,
        "not_found_error" => StatusCode::NOT_FOUND,
        "request_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "rate_limit_error" | "rate_limit_exceeded" => StatusCode::TOO_MANY_REQUESTS,
        "overloaded_error" => status_or_500(529),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Anthropic's error `type` for a status.
pub(crate) fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// OpenAI's error `type` for a status.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 404 | 405 | 409 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "api_error",
    }
}
