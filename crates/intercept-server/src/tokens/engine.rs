//! The engine's side of the token path: the request to its token endpoint (vLLM's
//! `/inference/v1/generate`, SGLang's `/generate`), and [`EngineAnswer`], the engine's
//! answer (JSON or a stream of ids) turned into the dialect's answer as it arrives.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use intercept_core::internal::{SseEvent, SseSplitter};
use intercept_core::{JsonBody, TokenEngine, TurnTokens};
use intercept_tokens::{Renderer, StreamParser};
use parking_lot::Mutex;
use serde_json::{Map, Value};

use super::answer::AnswerWriter;
use crate::upstream::{BodyError, UpstreamBody};

/// What a token-path call leaves for its record: the ids sent and received, and what
/// the next turn needs (filled by the call's opening and by [`EngineAnswer`]).
#[derive(Debug, Default)]
pub(crate) struct TokenSlot {
    /// The ids and how the prompt was made; `completion_ids` and `logprobs` fill in as
    /// the answer arrives, and `complete` says the engine finished.
    pub(crate) tokens: Option<TurnTokens>,
    /// The engine's answer was read to its end.
    pub(crate) complete: bool,
    /// The conversation the turn covers, for the next turn's bridge.
    pub(crate) pending: Option<super::Pending>,
    /// Set for a call sent to the upstream's chat endpoint (`on_mismatch = "chat"`): why.
    pub(crate) chat_reason: Option<String>,
    /// The tool calls that did not parse, as the answer lists them
    /// (`tool_call_errors`), for the record of a streamed answer.
    pub(crate) malformed: Option<Value>,
}

/// Sampling settings of a request that the engines take under the same name.
const SAME_NAME: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "min_tokens",
];

/// The engine request of a call: the prompt ids, the sampling settings read from the
/// request in its dialect (`max_tokens` under each dialect's name), the renderer's stop
/// ids, logprobs on.
pub(crate) fn request_body(
    engine: TokenEngine,
    body: &JsonBody,
    prompt_ids: &[u32],
    stop_ids: &[u32],
    stream: bool,
) -> Result<Bytes, intercept_core::Error> {
    let mut sampling = Map::new();
    for key in SAME_NAME {
        if let Some(Ok(v)) = body.get::<Value>(key) {
            if !v.is_null() {
                sampling.insert((*key).to_owned(), v);
            }
        }
    }
    if let Some(n) = body.get::<Value>("n").and_then(Result::ok) {
        if !(n.is_null() || n == 1) {
            return Err(intercept_core::Error::invalid(
                "token path: `n` must be 1 (one completion per call)",
            ));
        }
    }
    // Chat `max_completion_tokens` / `max_tokens`, Responses `max_output_tokens`,
    // Anthropic `max_tokens`.
    let max_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| {
            body.get::<Value>(k)
                .and_then(Result::ok)
                .filter(|v| !v.is_null())
        });
    let mut extra_stops: Vec<u32> = body
        .get::<Vec<u32>>("stop_token_ids")
        .and_then(Result::ok)
        .unwrap_or_default();
    let mut stops = stop_ids.to_vec();
    stops.append(&mut extra_stops);
    stops.dedup();
    // Anthropic's `stop_sequences` are its `stop`.
    if let Some(Ok(v)) = body.get::<Value>("stop_sequences") {
        if !v.is_null() {
            sampling.insert("stop".into(), v);
        }
    }
    let value = match engine {
        TokenEngine::Sglang => {
            if let Some(m) = max_tokens {
                sampling.insert("max_new_tokens".into(), m);
            }
            sampling.insert("stop_token_ids".into(), stops.into());
            sampling.insert("skip_special_tokens".into(), false.into());
            serde_json::json!({
                "input_ids": prompt_ids,
                "sampling_params": sampling,
                "return_logprob": true,
                "stream": stream,
            })
        }
        _ => {
            if let Some(m) = max_tokens {
                sampling.insert("max_tokens".into(), m);
            }
            sampling.insert("stop_token_ids".into(), stops.into());
            sampling.insert("logprobs".into(), 1.into());
            sampling.insert("skip_special_tokens".into(), false.into());
            let mut v = serde_json::json!({
                "model": body.str("model").unwrap_or_default(),
                "token_ids": prompt_ids,
                "sampling_params": sampling,
                "stream": stream,
            });
            if stream {
                v["stream_options"] = serde_json::json!({"include_usage": true});
            }
            v
        }
    };
    serde_json::to_vec(&value).map(Bytes::from).map_err(|e| {
        intercept_core::Error::Internal(format!("cannot write the engine request: {e}"))
    })
}

/// The ids, logprobs and finish reason of one engine answer or stream chunk.
#[derive(Debug, Default)]
struct Piece {
    ids: Vec<u32>,
    logprobs: Vec<f64>,
    finish: Option<String>,
    prompt_tokens: Option<u64>,
}

/// Reads one engine answer (or one streamed chunk) of `engine`. SGLang's chunks carry
/// the output so far; `seen` ids are skipped.
fn piece(engine: TokenEngine, value: &Value, seen: usize) -> Result<Piece, String> {
    match engine {
        TokenEngine::Sglang => {
            let ids: Vec<u32> = serde_json::from_value(
                value
                    .get("output_ids")
                    .cloned()
                    .unwrap_or(Value::Array(vec![])),
            )
            .map_err(|e| format!("`output_ids` is not a list of token ids: {e}"))?;
            let meta = value.get("meta_info");
            let logprobs: Vec<f64> = meta
                .and_then(|m| m.get("output_token_logprobs"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|e| e.get(0).and_then(Value::as_f64))
                        .collect()
                })
                .unwrap_or_default();
            let finish = meta
                .and_then(|m| m.get("finish_reason"))
                .and_then(|f| f.get("type").or(Some(f)))
                .and_then(Value::as_str)
                .map(str::to_owned);
            // Cumulative chunks (the whole output so far) or incremental ones.
            let (ids, logprobs) = if ids.len() >= seen && seen > 0 {
                (
                    ids[seen..].to_vec(),
                    logprobs
                        .get(seen..)
                        .map(<[f64]>::to_vec)
                        .unwrap_or_default(),
                )
            } else {
                (ids, logprobs)
            };
            Ok(Piece {
                ids,
                logprobs,
                finish,
                prompt_tokens: meta
                    .and_then(|m| m.get("prompt_tokens"))
                    .and_then(Value::as_u64),
            })
        }
        _ => {
            let usage_prompt = value
                .get("usage")
                .and_then(|u| u.get("prompt_tokens"))
                .and_then(Value::as_u64);
            let Some(choice) = value.get("choices").and_then(|c| c.get(0)) else {
                // A usage-only chunk.
                return Ok(Piece {
                    prompt_tokens: usage_prompt,
                    ..Piece::default()
                });
            };
            let ids: Vec<u32> = match choice.get("token_ids") {
                None | Some(Value::Null) => Vec::new(),
                Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                    format!("`choices[0].token_ids` is not a list of token ids: {e}")
                })?,
            };
            let logprobs = choice
                .get("logprobs")
                .and_then(|l| l.get("content"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|e| e.get("logprob").and_then(Value::as_f64))
                        .collect()
                })
                .unwrap_or_default();
            let finish = choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .map(str::to_owned);
            Ok(Piece {
                ids,
                logprobs,
                finish,
                prompt_tokens: usage_prompt,
            })
        }
    }
}

/// How the engine answers.
enum Intake {
    /// One JSON answer, gathered up to a bound.
    Json { buf: BytesMut, limit: u64 },
    /// A stream of SSE chunks, each parsed as it arrives; at most `limit` bytes in all
    /// (an engine that sends forever, or one endless event, is cut off).
    Stream {
        limit: u64,
        received: u64,
        splitter: SseSplitter,
        /// Behind a lock only so that the body is `Sync`; one task polls it.
        parser: Mutex<Box<dyn StreamParser>>,
    },
}

/// The engine's answer, turned into the dialect's answer as it arrives (a body made
/// in-process). The ids it reads go to the call's [`TokenSlot`].
pub(crate) struct EngineAnswer {
    inner: UpstreamBody,
    intake: Intake,
    engine: TokenEngine,
    renderer: Arc<dyn Renderer>,
    writer: AnswerWriter,
    slot: Arc<Mutex<TokenSlot>>,
    completion: Vec<u32>,
    logprobs: Vec<f64>,
    finish: Option<String>,
    prompt_len: usize,
    done: bool,
}

impl EngineAnswer {
    pub(crate) fn new(
        inner: UpstreamBody,
        stream: bool,
        engine: TokenEngine,
        renderer: Arc<dyn Renderer>,
        writer: AnswerWriter,
        slot: Arc<Mutex<TokenSlot>>,
        limit: u64,
    ) -> Self {
        let prompt_ids: Vec<u32> = slot
            .lock()
            .tokens
            .as_ref()
            .map(|t| t.prompt_ids.clone())
            .unwrap_or_default();
        let intake = if stream {
            Intake::Stream {
                limit,
                received: 0,
                splitter: SseSplitter::new(),
                parser: Mutex::new(renderer.stream(&prompt_ids)),
            }
        } else {
            Intake::Json {
                buf: BytesMut::new(),
                limit,
            }
        };
        EngineAnswer {
            inner,
            intake,
            engine,
            renderer,
            writer,
            slot,
            completion: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            prompt_len: prompt_ids.len(),
            done: false,
        }
    }

    /// Takes one engine answer or chunk; what the harness gets of it goes to `out`.
    fn take(&mut self, value: &Value, out: &mut BytesMut) -> Result<(), String> {
        let p = piece(self.engine, value, self.completion.len())?;
        if let Some(n) = p.prompt_tokens {
            // The engine's own count of the prompt, when it gives one, must be ours.
            if n as usize != self.prompt_len && self.prompt_len > 0 {
                tracing::debug!(
                    engine = n,
                    sent = self.prompt_len,
                    "the engine counted another prompt length"
                );
            }
        }
        self.completion.extend_from_slice(&p.ids);
        self.logprobs.extend_from_slice(&p.logprobs);
        if p.finish.is_some() {
            self.finish = p.finish;
        }
        if let Intake::Stream { parser, .. } = &mut self.intake {
            for event in parser.get_mut().push(&p.ids) {
                self.writer.event(&event, out);
            }
        }
        Ok(())
    }

    /// The engine finished: the dialect's last words, and the ids to the slot.
    fn end(&mut self, out: &mut BytesMut) -> Result<(), String> {
        match &mut self.intake {
            Intake::Json { buf, .. } => {
                let value: Value = serde_json::from_slice(buf)
                    .map_err(|e| format!("the engine's answer is not JSON: {e}"))?;
                self.take(&value, out)?;
                let prompt = self
                    .slot
                    .lock()
                    .tokens
                    .as_ref()
                    .map(|t| t.prompt_ids.clone())
                    .unwrap_or_default();
                let parsed = self.renderer.parse(&self.completion, &prompt);
                self.writer.complete(
                    &parsed,
                    self.finish.as_deref(),
                    self.prompt_len,
                    self.completion.len(),
                    out,
                );
            }
            Intake::Stream { parser, .. } => {
                for event in parser.get_mut().finish() {
                    self.writer.event(&event, out);
                }
                self.writer.finish(
                    self.finish.as_deref(),
                    self.prompt_len,
                    self.completion.len(),
                    out,
                );
            }
        }
        let mut slot = self.slot.lock();
        if let Some(t) = &mut slot.tokens {
            t.completion_ids = std::mem::take(&mut self.completion);
            t.logprobs = std::mem::take(&mut self.logprobs);
        }
        slot.complete = true;
        if matches!(self.intake, Intake::Stream { .. }) {
            slot.malformed = self.writer.malformed();
        }
        Ok(())
    }

    /// What arrived of the stream so far goes to the slot (a stream cut short is
    /// recorded with the ids it had).
    fn keep_partial(&mut self) {
        let mut slot = self.slot.lock();
        if let Some(t) = &mut slot.tokens {
            t.completion_ids = self.completion.clone();
            t.logprobs = self.logprobs.clone();
        }
    }

    fn feed(&mut self, data: &Bytes, out: &mut BytesMut) -> Result<(), String> {
        match &mut self.intake {
            Intake::Json { buf, limit } => {
                if (buf.len() + data.len()) as u64 > *limit {
                    return Err(format!(
                        "the engine's answer passed the configured max_response_bytes ({limit} bytes)"
                    ));
                }
                buf.extend_from_slice(data);
                Ok(())
            }
            Intake::Stream {
                splitter,
                limit,
                received,
                ..
            } => {
                *received += data.len() as u64;
                if *received > *limit {
                    return Err(format!(
                        "the engine's stream passed the configured max_response_bytes ({limit} bytes)"
                    ));
                }
                splitter.push_bytes(data.clone());
                loop {
                    let Intake::Stream { splitter, .. } = &mut self.intake else {
                        return Ok(());
                    };
                    let Some(event) = splitter.next_event() else {
                        return Ok(());
                    };
                    let event = SseEvent::new(&event);
                    if event.is_done() {
                        continue;
                    }
                    let Some(data) = event.data() else { continue };
                    let value: Value = serde_json::from_slice(&data)
                        .map_err(|e| format!("an engine stream chunk is not JSON: {e}"))?;
                    if let Some(err) = value.get("error").filter(|e| !e.is_null()) {
                        return Err(format!("the engine's stream failed: {err}"));
                    }
                    self.take(&value, out)?;
                }
            }
        }
    }
}

impl Body for EngineAnswer {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let mut out = BytesMut::new();
            if !this.writer.started() && matches!(this.intake, Intake::Stream { .. }) {
                this.writer.start(&mut out);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending if out.is_empty() => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Some(Ok(Frame::data(out.freeze())))),
                Poll::Ready(frame) => frame,
            };
            let result = match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.feed(&data, &mut out),
                    Err(_) => Ok(()),
                },
                Some(Err(e)) => {
                    this.keep_partial();
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.done = true;
                    this.end(&mut out)
                }
            };
            if let Err(message) = result {
                this.keep_partial();
                this.done = true;
                return Poll::Ready(Some(Err(message.into())));
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
            }
        }
    }
}
