//! The mock model of intercept: the upstream of `intercept demo` and of the sidecar's
//! `--upstream mock`, and the model server of the tests (re-exported by `intercept-test`).
//! A scriptable mock of a model server (vLLM-like) that speaks three chat dialects, chosen
//! by route: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages; and, given a
//! tokenizer, the token-in/token-out endpoints of two engines: vLLM's
//! `/inference/v1/generate` and SGLang's `/generate` (see [Token routes](#token-routes)).
//!
//! ```
//! use intercept_mock::{MockUpstream, Reply};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let upstream = MockUpstream::start().await?;
//! upstream.push(Reply::text("Hello!").with_finish_reason("length"));
//!
//! // Any HTTP client pointed at `upstream.base_url()` works; a raw request keeps this short.
//! let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
//! let mut tcp = tokio::net::TcpStream::connect(upstream.addr()).await?;
//! tcp.write_all(format!(
//!     "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\nconnection: close\r\n\
//!      content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
//!     body.len(),
//! ).as_bytes()).await?;
//! let mut response = String::new();
//! tcp.read_to_string(&mut response).await?;
//! assert!(response.contains(r#""content":"Hello!""#));
//! assert!(response.contains(r#""finish_reason":"length""#));
//!
//! // Without a scripted reply the mock echoes; every request is logged.
//! assert_eq!(upstream.requests()[0].json().unwrap()["model"], "m");
//! upstream.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! [`MockUpstream`] is a real HTTP server on `127.0.0.1` (HTTP/1.1 with keep-alive, and
//! h2c) that answers `POST /v1/chat/completions`, `POST /v1/responses`,
//! `POST /v1/messages` and `POST /v1/messages/count_tokens`. With nothing scripted it
//! *echoes*, the same way in every dialect:
//!
//! - the reply is `echo: <text of the last user message>`;
//! - if the conversation ends with a tool result (a Chat `tool` message, a Responses
//!   `function_call_output` item, an Anthropic user message with `tool_result` blocks),
//!   the reply is `tool said: <its text>` (several `tool_result`s joined by newlines);
//! - if the request offers `tools` and the last user text contains `use a tool` (any
//!   case), the reply is one call of the first tool, arguments
//!   `{"query":"<last user text>"}`, no text, finish reason `tool_calls` (Anthropic
//!   `tool_use`); generated call ids are `call_N` (Anthropic `toolu_N`);
//! - usage counts whitespace-separated words: prompt = words of every message's text +
//!   4 per message (Responses: per input item, plus the `instructions`; Anthropic: text
//!   and `tool_result` blocks, plus the `system` prompt), completion = words of the reply
//!   (content, reasoning, tool-call names and arguments);
//! - `model` is the request's (or [`MockConfig::default_model`]); times are
//!   [`MockConfig::created`].
//!
//! **Chat Completions** answers a `chat.completion` object (id `chatcmpl-mock-N`). A request
//! with `"stream": true` gets `text/event-stream`: a chunk with
//! `delta: {"role":"assistant","content":""}`, the reasoning (`delta.reasoning_content`)
//! and content split into [`MockConfig::chunks`] pieces, each tool call as OpenAI streams
//! it (a head delta with index, id, type, name and empty arguments, then argument
//! fragments), a chunk with the finish reason, a usage chunk with empty `choices` when
//! `stream_options.include_usage` is true, and `data: [DONE]`.
//!
//! **Responses** reads `instructions` and `input` (a string, or items: messages with string
//! or `input_text` content, `function_call`, `function_call_output`, ...) and answers a
//! `response` object: `id` `resp_mock_N`, `object: "response"`, `created_at`, `status`
//! (`completed`, or `incomplete` with `incomplete_details: {"reason":
//! "max_output_tokens"}` for finish reason `length`), `error: null`, `instructions`,
//! `model`, `output` (a `reasoning` item `rs_mock_N` with one `reasoning_text` part if
//! there is reasoning, a `message` item `msg_mock_N` with one `output_text` part if there
//! is text, a `function_call` item `fc_mock_N_i` with `call_id`, `name`, `arguments` per
//! tool call) and `usage` (`input_tokens`, `input_tokens_details.cached_tokens`,
//! `output_tokens`, `output_tokens_details.reasoning_tokens`, `total_tokens`). Streamed,
//! each event is `event: <type>` + `data: <json>` with a `sequence_number` from 0:
//! `response.created` and `response.in_progress` (status `in_progress`, empty output,
//! `usage: null`); per item `response.output_item.added`, then for text
//! `response.content_part.added`, `response.output_text.delta`s, `response.output_text.done`,
//! `response.content_part.done` (reasoning the same with `response.reasoning_text.*`), for
//! a call `response.function_call_arguments.delta`s and `.done`, then
//! `response.output_item.done`; finally `response.completed` (or `response.incomplete`)
//! carrying the whole response. No `data: [DONE]` unless [`Reply::with_done_sentinel`].
//!
//! **Anthropic Messages** reads `system` (string or text blocks) and `messages` (string or
//! block content: `text`, `tool_result` with string or text-block content, ...) and
//! answers a `message` object: `id` `msg_mock_N`, `type: "message"`, `role: "assistant"`,
//! `model`, `content` (a `thinking` block with `signature` `sig_mock_N` if there is
//! reasoning, a `text` block if there is text, a `tool_use` block per call with `input`
//! the arguments parsed as JSON, `{}` if empty or unreadable), `stop_reason` (`end_turn`,
//! `max_tokens` for finish reason `length`, `tool_use`, other finish reasons as they are),
//! `stop_sequence: null`, `usage` (`input_tokens`, `cache_creation_input_tokens: 0`,
//! `cache_read_input_tokens`, `output_tokens`). Streamed: `message_start` (the message
//! with empty content, `stop_reason: null`, `output_tokens: 1`), `ping`, per block
//! `content_block_start` (empty block), `content_block_delta`s (`thinking_delta` pieces and
//! one `signature_delta`, `text_delta`, or `input_json_delta` with `partial_json` pieces),
//! `content_block_stop`, then `message_delta` (`delta: {stop_reason, stop_sequence}`,
//! `usage: {output_tokens}`) and `message_stop`. `POST /v1/messages/count_tokens` answers
//! `{"input_tokens": N}` with the prompt count `/v1/messages` would report; it never takes
//! a scripted reply (clients call it between turns).
//!
//! # Token routes
//!
//! `POST /inference/v1/generate` (vLLM's token-in/token-out endpoint, at the server's
//! root, not under `/v1`) and `POST /generate` (SGLang's native endpoint; `PUT` too) read
//! prompt ids and answer completion ids, with the tokenizer of [`MockConfig::tokenizer`].
//! Without one they answer a completion with a 501 that says to configure it (scripted
//! errors, [`Reply::raw`] and the like need no tokenizer).
//!
//! ```no_run
//! use intercept_mock::{MockConfig, MockUpstream, Reply, ToolCall};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tokenizer = intercept_tokens::shared("/path/to/qwen3")?; // tokenizer.json, tokenizer_config.json
//! let upstream =
//!     MockUpstream::start_with(MockConfig { tokenizer: Some(tokenizer), ..MockConfig::default() })
//!         .await?;
//! upstream.push(Reply::tool_call("search", r#"{"q": "rust"}"#).with_reasoning("Look it up."));
//! // POST {"token_ids": [...], "sampling_params": {"stop_token_ids": [151645]}} to
//! // upstream.vllm_generate_url(): `choices[0].token_ids` are the ids of
//! // "<think>\nLook it up.\n</think>\n\n<tool_call>\n{\"name\": \"search\", \"arguments\":
//! // {\"q\": \"rust\"}}\n</tool_call>" and 151645.
//! # Ok(())
//! # }
//! ```
//!
//! The completion is text, tokenized (no special tokens added; special tokens written in it
//! are one id each):
//!
//! - a scripted completion is laid out as Qwen3 samples an assistant turn (hermes tool
//!   calls), as `renderers`' Qwen3 renderer writes it, so that parsing the ids gives the
//!   reply back: `<think>\n{reasoning}\n</think>\n\n` when it has reasoning, the content,
//!   then each tool call as `<tool_call>\n{"name": "<name>", "arguments": <arguments>}\n
//!   </tool_call>` (the arguments as scripted, `{}` when empty), calls separated by `\n`,
//!   the first one after a `\n` when there is content; [`Reply::raw_completion`]'s text is
//!   taken as it is (an unclosed `<think>`, a call with broken JSON, ...);
//! - the echo decodes the prompt ids and reads the last `<|im_start|>user\n…<|im_end|>`
//!   turn (ChatML, as Qwen3's template writes it): `tool said: <text>` when the turn holds
//!   `<tool_response>` blocks (their texts joined by newlines), a call of the first tool
//!   of the system prompt's `<tools>` block with arguments `{"query":"<text>"}` when the
//!   text says `use a tool`, else `echo: <text>`; a prompt without a user turn is echoed
//!   whole.
//!
//! The stop id follows: the first of the request's `stop_token_ids`, else the tokenizer's
//! `eos_token` (`<|im_end|>` for Qwen3); the finish reason is `stop` (never `tool_calls`:
//! that is the client's reading). When `max_tokens` (SGLang: `max_new_tokens`, default
//! 128) is shorter, the ids are cut to it, without the stop id, and the finish reason is
//! `length`; a reply `with_finish_reason("length")` ends without the stop id too. The
//! logprob of id `i` is `-((i % 97) + 1) / 64`; top candidates are the sampled id (rank 1)
//! then `i + 1`, `i + 2`, ..., each 1.0 less likely. Usage counts ids (or
//! [`Reply::with_usage`]). Every request is logged with the ids the engine received.
//!
//! **vLLM** mirrors vLLM 0.31.0 (`vllm/entrypoints/scale_out/token_in_token_out/`, which
//! vLLM moved there from `serve/disagg/`), the release whose answer `renderers` 0.1.12's
//! `client.generate` (verifiers' train client) parses; [`VllmVersion::V0_34`] speaks
//! 0.34.0 instead. The request: `token_ids` (required, at least one, each in the
//! vocabulary), `sampling_params` (required; `max_tokens` ≥ 1, `stop_token_ids`,
//! `logprobs` and `prompt_logprobs` (-1 to 20), `n` (1), `temperature` (0 to 2) are read
//! and checked, the others accepted unread, unknown ones ignored as vLLM does),
//! `stream`, `stream_options` (`include_usage`, `continuous_usage_stats`),
//! `return_token_ids`, `request_id` (or the `X-Request-Id` header), `model`, `cache_salt`,
//! `priority`; other fields are ignored. The answer, with every field vLLM writes (`null`
//! included): `request_id` (`generate-tokens-<id>`, `generate-tokens-mock-N` without
//! one), `model` (the reply's, the request's or the default), `created`, `choices[0]`
//! (`index`, `logprobs`: `{"content": [{"token": "token_id:<id>", "logprob", "bytes":
//! null, "top_logprobs": [..]}]}` when `sampling_params.logprobs` is set, else `null`,
//! `finish_reason`, `token_ids`, `routed_experts`, `sampling_mask`), `usage`
//! (`prompt_tokens`, `total_tokens`, `completion_tokens`, `prompt_tokens_details`
//! (`cached_tokens` with [`Reply::with_cached_tokens`]), `completion_tokens_details`),
//! `prompt_logprobs` (`[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]` when
//! asked for), `prompt_token_ids` (with `return_token_ids`), and `null`
//! `prompt_token_id_logprobs`, `mm_placeholders`, `metrics`, `kv_transfer_params`,
//! `ec_transfer_params`. 0.34.0 adds `output_mode: "tokens"`, gives each choice
//! `stop_reason` (the stop id when it came from `stop_token_ids` and is not the eos) and
//! `weight_versions`, writes logprobs as `{"token_id", "logprob", "rank",
//! "top_logprobs"}`, and leaves out a `null` `prompt_tokens_details`. Streamed
//! (`text/event-stream`): `data:` chunks `{"request_id", "choices": [{..., "token_ids":
//! <new ids>, "logprobs": <theirs>}], "usage": null}` with the ids in
//! [`MockConfig::chunks`] pieces, `prompt_token_ids` on the first chunk, the finish
//! reason on the last, a usage chunk (`"choices": []`) when `include_usage`, then `data:
//! [DONE]`. Errors are vLLM's `{"error": {"message", "type", "param", "code": <status>}}`:
//! request validation as `Bad Request` with pydantic's message (`1 validation error:\n
//! {'type': 'missing', 'loc': 'body.token_ids', ...}`) and `param` the field's path, the
//! engine's checks (`Token id N is out of vocabulary`, `max_tokens must be at least 1,
//! ...`) as `BadRequestError`, scripted errors typed by status (`BadRequestError`,
//! `NotFoundError`, `InternalServerError`, `NotImplementedError`, else the status phrase).
//! A [`Reply::with_stream_error`] ends a stream as vLLM does: the ids without a finish
//! reason, `data: {"error": ...}`, `data: [DONE]`.
//!
//! **SGLang** mirrors SGLang 0.5.23 (`srt/entrypoints/http_server.py`'s `/generate`,
//! `srt/managers/io_struct.py`'s `GenerateReqInput`, `tokenizer_manager.py`'s outputs and
//! the `sglang.api.v1` JSON contract). The request: `input_ids` (or `text`, tokenized),
//! `sampling_params` (`max_new_tokens`, `stop_token_ids`, `temperature`, `n`,
//! `skip_special_tokens`, `no_stop_trim` are read; a key SGLang does not know is refused
//! as SGLang's contract refuses it), `return_logprob`, `return_text_in_logprobs`,
//! `return_prompt_token_ids`, `stream`, `rid`. The answer: `{"text", "output_ids",
//! "meta_info": {"id", "finish_reason": {"type": "stop", "matched": <stop id>} or
//! {"type": "length", "length": N}, "prompt_tokens", "weight_version": "default",
//! "num_retractions": 0, "input_token_logprobs": [], "output_token_logprobs": [[logprob,
//! id, null], ...], "output_token_logprobs_length" (the last three with
//! `return_logprob`), "reasoning_tokens": 0, "completion_tokens", "cached_tokens",
//! "e2e_latency": 0.0}}` (plus `prompt_token_ids` when asked for); `text` decodes the ids
//! without the matched stop id (unless `no_stop_trim`), special tokens skipped unless
//! `skip_special_tokens` is false; `id` is `rid` or 32 hex digits. Streamed, each `data:`
//! event holds the whole output so far (SGLang's default, not incremental), the last one
//! finished (with `e2e_latency`), then `data: [DONE]`. Errors: a contract violation is
//! `{"error": "<serde's text>"}`, a value error `{"error": {"message"}}` (400), other
//! statuses `{"object": "error", "message", "type": "<status>", "param": null, "code"}`;
//! a stream error is `data: {"error": {"message", "type", "code", "retryable": false}}`
//! before `[DONE]`.
//!
//! Where the mock differs from the engines on purpose: it samples nothing (the completion
//! is the script's or the echo's, whatever the temperature or seed); one sequence per
//! request (`n` must be 1, no batches on SGLang); any `model` is served; `stop` strings,
//! `min_tokens`, `ignore_eos`, structured outputs, multimodal `features` and LoRA are
//! ignored; an absent `max_tokens` does not cut (vLLM fills in the room left in the
//! context); `stop_token_ids` must be ids of the vocabulary (vLLM takes any integer);
//! ids are checked against the tokenizer's vocabulary (vLLM also allows the model's
//! padded rows); SGLang's `input_ids` are checked too (SGLang does not); at most 20
//! logprobs; `e2e_latency` is 0 and `reasoning_tokens` 0; validation reports the first
//! error only; SGLang's `top_logprobs_num` and `logprob_start_len` are ignored.
//!
//! `GET /v1/models` answers a vLLM-like listing of [`MockConfig::default_model`]
//! (`owned_by: "vllm"`, `max_model_len`: [`MODELS_MAX_MODEL_LEN`]); it never takes a
//! scripted reply.
//!
//! [`MockUpstream::push`] queues [`Reply`]s, rendered in the dialect of the route that
//! takes them. Every other `POST`, whatever its path, takes the next one (FIFO); with the
//! queue empty the echo applies to the model routes, other paths get a 404 and
//! other methods a 405, and a body the echo cannot read gets a 400 with type
//! `invalid_request_error` (all in the route's error shape, OpenAI's for unknown paths).
//!
//! Every request is counted and (unless [`MockConfig::log_requests`] is off) logged as a
//! [`ReceivedRequest`] with its path and all its headers (`authorization`, `x-api-key`,
//! `anthropic-version`, ...); accepted TCP connections are counted too, so tests can see
//! whether a client reused connections.
//!
//! The server's tasks (accept loop, connections, HTTP/2 streams) belong to the
//! `MockUpstream`: [`MockUpstream::shutdown`] stops them and waits for them, dropping the
//! value stops them without waiting. Either way open connections are closed at once:
//! streams in flight are cut and [`Reply::hang`] requests see the connection close.

mod anthropic;
mod body;
mod chat;
mod config;
pub mod harness;
mod log;
mod reply;
mod responses;
mod server;
mod sglang;
mod sse;
mod tokens;
mod vllm;

use std::collections::VecDeque;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use chat::render_chat;
pub use config::{MockConfig, VllmVersion};
pub use log::{ReceivedRequest, RequestBody};
pub use reply::{
    Reply, ToolCall, Usage, ANTHROPIC_CONTEXT_LENGTH_MESSAGE, CONTEXT_LENGTH_MESSAGE,
    SGLANG_CONTEXT_LENGTH_MESSAGE, VLLM_CONTEXT_LENGTH_MESSAGE,
};

/// The path of the Chat Completions route.
pub const CHAT_COMPLETIONS_PATH: &str = "/v1/chat/completions";

/// The path of the OpenAI Responses route.
pub const RESPONSES_PATH: &str = "/v1/responses";

/// The path of the model listing (`GET`): the default model, vLLM-like, with
/// `max_model_len` [`MODELS_MAX_MODEL_LEN`].
pub const MODELS_PATH: &str = "/v1/models";

/// The `max_model_len` of the mock's model listing.
pub const MODELS_MAX_MODEL_LEN: u64 = 32_768;

/// The path of the Anthropic Messages route.
pub const MESSAGES_PATH: &str = "/v1/messages";

/// The path of the Anthropic token-counting route.
pub const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// The path of vLLM's token-in/token-out route (at the server's root, not under `/v1`).
pub const VLLM_GENERATE_PATH: &str = "/inference/v1/generate";

/// The path of SGLang's native generate route.
pub const SGLANG_GENERATE_PATH: &str = "/generate";

/// A running mock model server. See the [module docs](self) for what it answers.
///
/// ```
/// use intercept_mock::{MockUpstream, Reply};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let upstream = MockUpstream::start().await?;
/// upstream.push_many([Reply::error(503, "warming up").with_retry_after(1), Reply::text("ready")]);
/// assert_eq!(upstream.base_url(), format!("http://{}/v1", upstream.addr()));
/// // ... point a client at upstream.base_url() ...
/// upstream.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct MockUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tracker: TaskTracker,
}

/// State shared by the handle, the accept loop and the request handlers.
pub(crate) struct Shared {
    config: MockConfig,
    /// The tokenizer of the token routes, from `config`.
    vocab: Option<tokens::Vocab>,
    queue: Mutex<VecDeque<Reply>>,
    /// Length of `queue`, readable without the lock (the echo path skips the lock).
    queued: AtomicUsize,
    log: Mutex<Vec<ReceivedRequest>>,
    requests: AtomicUsize,
    connections: AtomicUsize,
    open_connections: AtomicUsize,
    completion_ids: AtomicU64,
    call_ids: AtomicU64,
    /// Tasks in `wait_until`; `notify` is only touched when this is non-zero.
    waiters: AtomicUsize,
    notify: Notify,
    /// Cancelled on shutdown or drop: stops every task of the server.
    token: CancellationToken,
}

impl Shared {
    fn new(config: MockConfig) -> Self {
        Self {
            vocab: config.tokenizer.clone().map(tokens::Vocab::new),
            config,
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            requests: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            open_connections: AtomicUsize::new(0),
            completion_ids: AtomicU64::new(0),
            call_ids: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            notify: Notify::new(),
            token: CancellationToken::new(),
        }
    }

    /// The number of the next answer (for its id).
    fn next_number(&self) -> u64 {
        self.completion_ids.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn pop_reply(&self) -> Option<Reply> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut queue = self.queue.lock();
        let reply = queue.pop_front();
        self.queued.store(queue.len(), Ordering::Release);
        reply
    }

    /// Wakes the tasks in `wait_until` after a counter changed (SeqCst, see there).
    fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Waits until `done()` holds; `done` must read counters that are changed (SeqCst)
    /// before `wake` is called.
    async fn wait_until(&self, done: impl Fn() -> bool) {
        struct Registered<'a>(&'a AtomicUsize);
        impl Drop for Registered<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register with `notify` before announcing ourselves in `waiters`, and announce
            // before checking: a change either is seen by `done()` or sees `waiters > 0`
            // and finds us registered.
            notified.as_mut().enable();
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let _registered = Registered(&self.waiters);
            if done() {
                return;
            }
            notified.await;
        }
    }
}

impl MockUpstream {
    /// Starts a mock with the default [`MockConfig`] on `127.0.0.1` and a free port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(MockConfig::default()).await
    }

    /// Starts a mock with `config` on `127.0.0.1` and a free port.
    pub async fn start_with(config: MockConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Self::from_listener(listener, config)
    }

    /// Serves on a listener bound by the caller. Must be called inside a tokio runtime.
    pub fn from_listener(listener: TcpListener, config: MockConfig) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        let tracker = TaskTracker::new();
        tracker.spawn(server::accept_loop(
            listener,
            Arc::clone(&shared),
            tracker.clone(),
        ));
        tracker.close();
        Ok(Self {
            addr,
            shared,
            tracker,
        })
    }

    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI base URL, `http://127.0.0.1:<port>/v1` (what `OPENAI_BASE_URL` takes).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The URL of the Chat Completions route, `<base_url>/chat/completions`.
    pub fn chat_completions_url(&self) -> String {
        format!("http://{}{CHAT_COMPLETIONS_PATH}", self.addr)
    }

    /// The URL of the Responses route, `<base_url>/responses`.
    pub fn responses_url(&self) -> String {
        format!("http://{}{RESPONSES_PATH}", self.addr)
    }

    /// The Anthropic base URL, `http://127.0.0.1:<port>` (what `ANTHROPIC_BASE_URL`
    /// takes: the SDK appends `/v1/messages`).
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of the Anthropic Messages route, `<anthropic_base_url>/v1/messages`.
    pub fn messages_url(&self) -> String {
        format!("http://{}{MESSAGES_PATH}", self.addr)
    }

    /// The URL of the token-counting route, `<anthropic_base_url>/v1/messages/count_tokens`.
    pub fn count_tokens_url(&self) -> String {
        format!("http://{}{COUNT_TOKENS_PATH}", self.addr)
    }

    /// The URL of vLLM's token route, `http://127.0.0.1:<port>/inference/v1/generate`.
    pub fn vllm_generate_url(&self) -> String {
        format!("http://{}{VLLM_GENERATE_PATH}", self.addr)
    }

    /// The URL of SGLang's generate route, `http://127.0.0.1:<port>/generate`.
    pub fn sglang_generate_url(&self) -> String {
        format!("http://{}{SGLANG_GENERATE_PATH}", self.addr)
    }

    /// The configuration the mock runs with.
    pub fn config(&self) -> &MockConfig {
        &self.shared.config
    }

    /// Queues a reply for a later request (FIFO).
    pub fn push(&self, reply: Reply) {
        self.push_many([reply]);
    }

    /// Queues several replies, in order.
    pub fn push_many(&self, replies: impl IntoIterator<Item = Reply>) {
        let mut queue = self.shared.queue.lock();
        queue.extend(replies);
        self.shared.queued.store(queue.len(), Ordering::Release);
    }

    /// Number of queued replies not yet used.
    pub fn pending_replies(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Drops every queued reply; later requests get the echo.
    pub fn clear_replies(&self) {
        let mut queue = self.shared.queue.lock();
        queue.clear();
        self.shared.queued.store(0, Ordering::Release);
    }

    /// A copy of the request log, oldest first (empty when
    /// [`MockConfig::log_requests`] is off).
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.shared.log.lock().clone()
    }

    /// Takes the request log, leaving it empty. [`request_count`](Self::request_count)
    /// is not reset.
    pub fn take_requests(&self) -> Vec<ReceivedRequest> {
        std::mem::take(&mut *self.shared.log.lock())
    }

    /// The most recent logged request.
    pub fn last_request(&self) -> Option<ReceivedRequest> {
        self.shared.log.lock().last().cloned()
    }

    /// Number of requests received so far (counted once the body is read, before the
    /// reply is made; with or without the log).
    pub fn request_count(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests were received. When it returns with the log on,
    /// the first `n` requests are in the log (unless taken).
    pub async fn wait_for_requests(&self, n: usize) {
        let shared = &self.shared;
        shared
            .wait_until(|| shared.requests.load(Ordering::SeqCst) >= n)
            .await;
    }

    /// Number of TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Number of TCP connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` TCP connections were accepted.
    pub async fn wait_for_connections(&self, n: usize) {
        let shared = &self.shared;
        shared
            .wait_until(|| shared.connections.load(Ordering::SeqCst) >= n)
            .await;
    }

    /// Stops the server: no more connections are accepted, open connections are closed
    /// (streams in flight are cut, hanging requests released), and every task of the
    /// server has ended when this returns.
    pub async fn shutdown(self) {
        self.shared.token.cancel();
        self.tracker.wait().await;
    }
}

impl Drop for MockUpstream {
    /// Stops the server's tasks (without waiting for them to end).
    fn drop(&mut self) {
        self.shared.token.cancel();
    }
}

impl fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockUpstream")
            .field("addr", &self.addr)
            .field("requests", &self.request_count())
            .field("connections", &self.connections())
            .field("pending_replies", &self.pending_replies())
            .field("config", &self.shared.config)
            .finish()
    }
}
