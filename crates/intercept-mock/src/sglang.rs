//! SGLang's native endpoint, `POST /generate`: the request as SGLang 0.5.23 checks it
//! (its JSON contract, then its value checks), and the answer as it writes it, as JSON or
//! as an SSE stream of cumulative outputs.

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use super::chat::write_json;
use super::reply::{status_for_error_type, Completion, Reply, StreamError, Usage};
use super::sse::SseBuf;
use super::tokens::{self, id_pieces, Finish, Generated, Limits, Output, Vocab};
use super::Shared;

/// SGLang's `max_new_tokens` when the request names none.
const DEFAULT_MAX_NEW_TOKENS: u64 = 128;

/// The sampling parameters SGLang's contract knows; any other key is refused.
const SAMPLING_FIELDS: &[&str] = &[
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
];

/// The fields of a `/generate` request the mock reads, checked.
#[derive(Debug, Default)]
pub(crate) struct GenerateRequest {
    input_ids: Vec<u32>,
    rid: Option<String>,
    stream: bool,
    return_logprob: bool,
    return_text_in_logprobs: bool,
    return_prompt_token_ids: bool,
    max_new_tokens: Option<u64>,
    stop_token_ids: Vec<u32>,
    skip_special_tokens: bool,
    no_stop_trim: bool,
}

/// A request SGLang refuses.
#[derive(Debug, PartialEq)]
pub(crate) enum Invalid {
    /// The JSON contract's error text: `{"error": "<text>"}`.
    Contract(String),
    /// A value check: `{"error": {"message": "<text>"}}`.
    Value(String),
}

impl Invalid {
    fn body(&self) -> Bytes {
        #[derive(Serialize)]
        struct ContractOut<'a> {
            error: &'a str,
        }
        match self {
            Invalid::Contract(text) => {
                let mut buf = Vec::with_capacity(16 + text.len());
                write_json(&mut buf, &ContractOut { error: text });
                Bytes::from(buf)
            }
            Invalid::Value(message) => error_body(StatusCode::BAD_REQUEST, message),
        }
    }
}

/// serde's description of an unexpected JSON value, as SGLang's contract words it.
fn unexpected(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => match n.as_i64() {
            Some(i) => format!("integer `{i}`"),
            None => format!("floating point `{:?}`", n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".to_owned(),
        Value::Object(_) => "map".to_owned(),
    }
}

fn invalid_type(value: &Value, expected: &str) -> Invalid {
    Invalid::Contract(format!(
        "invalid type: {}, expected {expected}",
        unexpected(value)
    ))
}

fn batch() -> Invalid {
    Invalid::Value(
        "the mock answers one prompt per request: send input_ids (or text) and \
         sampling_params for one prompt, not a batch"
            .to_owned(),
    )
}

fn get<'v>(fields: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    fields.get(key).filter(|value| !value.is_null())
}

fn bool_field(fields: &Map<String, Value>, key: &str) -> Result<Option<bool>, Invalid> {
    get(fields, key)
        .map(|value| {
            value
                .as_bool()
                .ok_or_else(|| invalid_type(value, "a boolean"))
        })
        .transpose()
}

fn int_field(fields: &Map<String, Value>, key: &str) -> Result<Option<i64>, Invalid> {
    get(fields, key)
        .map(|value| value.as_i64().ok_or_else(|| invalid_type(value, "i64")))
        .transpose()
}

fn int_list(value: &Value) -> Result<Vec<i64>, Invalid> {
    let Value::Array(items) = value else {
        return Err(invalid_type(value, "a sequence"));
    };
    items
        .iter()
        .map(|item| item.as_i64().ok_or_else(|| invalid_type(item, "i64")))
        .collect()
}

/// An id of the vocabulary, or the error naming it.
fn vocab_id(id: i64, vocab: usize, field: &str) -> Result<u32, Invalid> {
    u32::try_from(id)
        .ok()
        .filter(|id| usize::try_from(*id).is_ok_and(|id| id < vocab))
        .ok_or_else(|| {
            Invalid::Value(format!(
                "{field} holds token id {id}, which is out of vocabulary: the mock's \
                 tokenizer has ids 0 to {}",
                vocab.saturating_sub(1)
            ))
        })
}

/// Reads and checks a request: SGLang's contract (types, unknown sampling parameters),
/// then its value checks. A `text` prompt is tokenized.
pub(crate) fn parse(body: &[u8], vocab: &Vocab) -> Result<GenerateRequest, Invalid> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|err| Invalid::Contract(format!("invalid JSON: {err}")))?;
    let Value::Object(fields) = &value else {
        return Err(invalid_type(&value, "struct GenerateRequest"));
    };
    let string_or_list = |key: &str| -> Result<Option<String>, Invalid> {
        match get(fields, key) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(Value::Array(_)) => Err(batch()),
            Some(other) => Err(invalid_type(
                other,
                "a value or an array of values for StringOrList",
            )),
        }
    };
    let rid = string_or_list("rid")?;
    let text = string_or_list("text")?;
    let input_ids = match get(fields, "input_ids") {
        None => None,
        Some(Value::Array(items)) if items.first().is_some_and(|first| !first.is_number()) => {
            if items.iter().all(Value::is_array) {
                return Err(batch());
            }
            return Err(invalid_type(&items[0], "i64"));
        }
        Some(list @ Value::Array(_)) => Some(int_list(list)?),
        Some(other) => {
            return Err(invalid_type(
                other,
                "a value or an array of values for TokenIdsOrList",
            ))
        }
    };
    let stream = bool_field(fields, "stream")?.unwrap_or(false);
    let return_logprob = match get(fields, "return_logprob") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Array(_)) => return Err(batch()),
        Some(other) => {
            return Err(invalid_type(
                other,
                "a value or an array of values for BoolOrList",
            ))
        }
    };
    let return_text_in_logprobs = bool_field(fields, "return_text_in_logprobs")?.unwrap_or(false);
    let return_prompt_token_ids = bool_field(fields, "return_prompt_token_ids")?.unwrap_or(false);
    let empty = Map::new();
    let sampling = match get(fields, "sampling_params") {
        None => &empty,
        Some(Value::Object(sampling)) => sampling,
        Some(Value::Array(_)) => return Err(batch()),
        Some(other) => {
            return Err(invalid_type(
                other,
                "a value or an array of values for SamplingParamsOrList",
            ))
        }
    };
    if let Some(key) = sampling
        .keys()
        .find(|key| !SAMPLING_FIELDS.contains(&key.as_str()))
    {
        let listed: Vec<String> = SAMPLING_FIELDS
            .iter()
            .map(|field| format!("`{field}`"))
            .collect();
        return Err(Invalid::Contract(format!(
            "unknown field `{key}`, expected one of {}",
            listed.join(", ")
        )));
    }
    let max_new_tokens = match sampling.get("max_new_tokens") {
        None => Some(DEFAULT_MAX_NEW_TOKENS as i64),
        Some(Value::Null) => None,
        Some(value) => Some(value.as_i64().ok_or_else(|| invalid_type(value, "i64"))?),
    };
    let stop_token_ids = get(sampling, "stop_token_ids")
        .map(int_list)
        .transpose()?
        .unwrap_or_default();
    let temperature = get(sampling, "temperature")
        .map(|value| value.as_f64().ok_or_else(|| invalid_type(value, "f64")))
        .transpose()?;
    let n = int_field(sampling, "n")?.unwrap_or(1);
    let skip_special_tokens = bool_field(sampling, "skip_special_tokens")?.unwrap_or(true);
    let no_stop_trim = bool_field(sampling, "no_stop_trim")?.unwrap_or(false);
    bool_field(sampling, "ignore_eos")?;

    // Value checks, in SGLang's words where it has them.
    let input_ids = match (input_ids, text) {
        (Some(ids), _) => ids,
        (None, Some(text)) => vocab
            .tokenizer
            .encode(&text)
            .into_iter()
            .map(i64::from)
            .collect(),
        (None, None) => {
            return Err(Invalid::Value(
                "Either text, input_ids or input_embeds should be provided.".to_owned(),
            ))
        }
    };
    if input_ids.is_empty() {
        return Err(Invalid::Value("input_ids cannot be empty.".to_owned()));
    }
    if let Some(t) = temperature.filter(|t| !t.is_finite() || *t < 0.0) {
        return Err(Invalid::Value(format!(
            "temperature must be a non-negative finite number, got {t}."
        )));
    }
    if n != 1 {
        return Err(Invalid::Value(format!(
            "the mock samples one sequence per request: n must be 1, got {n}."
        )));
    }
    let max_new_tokens = match max_new_tokens {
        Some(n) if n < 0 => {
            return Err(Invalid::Value(format!(
                "max_new_tokens must be at least 0, got {n}."
            )))
        }
        other => other.map(|n| n as u64),
    };
    let vocab = vocab.size;
    let input_ids = input_ids
        .iter()
        .map(|id| vocab_id(*id, vocab, "input_ids"))
        .collect::<Result<Vec<u32>, Invalid>>()?;
    let stop_token_ids = stop_token_ids
        .iter()
        .map(|id| vocab_id(*id, vocab, "stop_token_ids"))
        .collect::<Result<Vec<u32>, Invalid>>()?;
    Ok(GenerateRequest {
        input_ids,
        rid,
        stream,
        return_logprob,
        return_text_in_logprobs,
        return_prompt_token_ids,
        max_new_tokens,
        stop_token_ids,
        skip_special_tokens,
        no_stop_trim,
    })
}

/// SGLang's error body for a status: `{"error": {"message"}}` for a 400 (a `ValueError`),
/// else its `ErrorResponse`, `{"object": "error", "message", "type": "<status>",
/// "param": null, "code": <status>}`.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Bytes {
    #[derive(Serialize)]
    struct ValueErrorOut<'a> {
        error: MessageOut<'a>,
    }
    #[derive(Serialize)]
    struct MessageOut<'a> {
        message: &'a str,
    }
    #[derive(Serialize)]
    struct ErrorResponse<'a> {
        object: &'static str,
        message: &'a str,
        #[serde(rename = "type")]
        kind: String,
        param: Option<()>,
        code: u16,
    }
    let mut buf = Vec::with_capacity(80 + message.len());
    if status == StatusCode::BAD_REQUEST {
        write_json(
            &mut buf,
            &ValueErrorOut {
                error: MessageOut { message },
            },
        );
    } else {
        write_json(
            &mut buf,
            &ErrorResponse {
                object: "error",
                message,
                kind: status.as_u16().to_string(),
                param: None,
                code: status.as_u16(),
            },
        );
    }
    Bytes::from(buf)
}

/// Answers a completion on `/generate`.
pub(crate) fn respond(
    shared: &Shared,
    body: &Bytes,
    completion: &Completion,
    reply: &Reply,
) -> Output {
    let config = &shared.config;
    let Some(vocab) = shared.vocab.as_ref() else {
        let status = StatusCode::NOT_IMPLEMENTED;
        let message = super::vllm::no_tokenizer(super::SGLANG_GENERATE_PATH);
        return Output::Error(status, error_body(status, &message));
    };
    let request = match parse(body, vocab) {
        Ok(request) => request,
        Err(invalid) => return Output::Error(StatusCode::BAD_REQUEST, invalid.body()),
    };
    if let Some(error) = completion.stream_error.as_ref().filter(|_| !request.stream) {
        let status = status_for_error_type(&error.kind);
        return Output::Json(status, error_body(status, &error.message));
    }
    let generated = tokens::generate(
        vocab,
        completion,
        &request.input_ids,
        Limits {
            stop_token_ids: &request.stop_token_ids,
            max_tokens: request.max_new_tokens,
        },
    );
    let rid = request
        .rid
        .clone()
        .unwrap_or_else(|| format!("{:032x}", shared.next_number()));
    let usage = completion
        .usage
        .unwrap_or_else(|| Usage::new(request.input_ids.len() as u64, generated.ids.len() as u64));
    let answer = AnswerParts {
        request: &request,
        tokenizer: &vocab.tokenizer,
        generated: &generated,
        rid: &rid,
        usage,
        cached_tokens: completion
            .cached_tokens
            .unwrap_or(0)
            .min(usage.prompt_tokens),
    };
    if request.stream {
        let chunks = reply.chunks.unwrap_or(config.chunks);
        Output::Stream(answer.stream(
            chunks,
            reply.crlf,
            reply.done,
            completion.stream_error.as_ref(),
        ))
    } else {
        let mut buf = Vec::with_capacity(512 + generated.ids.len() * 48);
        write_json(&mut buf, &answer.output(generated.ids.len(), true));
        Output::Json(StatusCode::OK, Bytes::from(buf))
    }
}

struct AnswerParts<'a> {
    request: &'a GenerateRequest,
    tokenizer: &'a intercept_tokens::Tokenizer,
    generated: &'a Generated,
    rid: &'a str,
    usage: Usage,
    cached_tokens: u64,
}

/// `meta_info.finish_reason`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum FinishOut {
    Stop { matched: Option<u32> },
    Length { length: u64 },
}

#[derive(Serialize)]
struct MetaInfo<'a> {
    id: &'a str,
    finish_reason: Option<FinishOut>,
    prompt_tokens: u64,
    weight_version: &'static str,
    num_retractions: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_token_logprobs: Option<&'static [u32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_token_logprobs: Option<Vec<(f64, u32, Option<String>)>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_token_logprobs_length: Option<usize>,
    reasoning_tokens: u64,
    completion_tokens: u64,
    cached_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    e2e_latency: Option<f64>,
}

#[derive(Serialize)]
struct GenerateOut<'a> {
    text: String,
    output_ids: &'a [u32],
    meta_info: MetaInfo<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
}

impl AnswerParts<'_> {
    /// The output after the first `len` ids: cumulative, as SGLang streams by default,
    /// and the whole answer when `finished`.
    fn output(&self, len: usize, finished: bool) -> GenerateOut<'_> {
        let ids = &self.generated.ids[..len];
        let finish_reason = finished.then_some(match self.generated.finish {
            Finish::Stop(matched) => FinishOut::Stop { matched },
            Finish::Length => FinishOut::Length { length: len as u64 },
        });
        // The detokenizer trims the matched stop id from the text unless `no_stop_trim`.
        let text_ids = match self.generated.finish {
            Finish::Stop(Some(_)) if finished && !self.request.no_stop_trim => {
                &ids[..len.saturating_sub(1)]
            }
            _ => ids,
        };
        let mut text = self
            .tokenizer
            .inner()
            .decode(text_ids, self.request.skip_special_tokens)
            .unwrap_or_default();
        if !finished {
            // An incomplete character waits for its next id.
            let kept = text.trim_end_matches('\u{FFFD}').len();
            text.truncate(kept);
        }
        let logprobs = self.request.return_logprob.then(|| {
            ids.iter()
                .map(|&id| {
                    let text = self
                        .request
                        .return_text_in_logprobs
                        .then(|| self.tokenizer.decode(&[id]));
                    (tokens::logprob(id), id, text)
                })
                .collect::<Vec<_>>()
        });
        let completion_tokens = if finished {
            self.usage.completion_tokens
        } else {
            len as u64
        };
        GenerateOut {
            text,
            output_ids: ids,
            meta_info: MetaInfo {
                id: self.rid,
                finish_reason,
                prompt_tokens: self.usage.prompt_tokens,
                weight_version: "default",
                num_retractions: 0,
                input_token_logprobs: self.request.return_logprob.then_some(&[]),
                output_token_logprobs_length: logprobs.as_ref().map(Vec::len),
                output_token_logprobs: logprobs,
                reasoning_tokens: 0,
                completion_tokens,
                cached_tokens: self.cached_tokens,
                e2e_latency: finished.then_some(0.0),
            },
            prompt_token_ids: self
                .request
                .return_prompt_token_ids
                .then_some(self.request.input_ids.as_slice()),
        }
    }

    /// The answer as SSE events: one cumulative output per piece of `chunks`, the last
    /// one finished, then `data: [DONE]`. A stream error replaces the finished output.
    fn stream(
        &self,
        chunks: usize,
        crlf: bool,
        done: bool,
        error: Option<&StreamError>,
    ) -> Vec<Bytes> {
        let ids = &self.generated.ids;
        let mut ends: Vec<usize> = Vec::with_capacity(chunks.max(1));
        let mut end = 0;
        for piece in id_pieces(ids, chunks) {
            end += piece.len();
            ends.push(end);
        }
        if ends.is_empty() {
            ends.push(0);
        }
        let mut sse = SseBuf::new(ends.len() * (512 + ids.len() * 16), ends.len() + 2, crlf);
        for (index, &end) in ends.iter().enumerate() {
            let finished = index + 1 == ends.len() && error.is_none();
            sse.json(None, &self.output(end, finished));
        }
        if let Some(error) = error {
            #[derive(Serialize)]
            struct StreamErrorOut<'a> {
                error: StreamErrorBody<'a>,
            }
            #[derive(Serialize)]
            struct StreamErrorBody<'a> {
                message: &'a str,
                #[serde(rename = "type")]
                kind: &'a str,
                code: u16,
                retryable: bool,
            }
            sse.json(
                None,
                &StreamErrorOut {
                    error: StreamErrorBody {
                        message: &error.message,
                        kind: &error.kind,
                        code: status_for_error_type(&error.kind).as_u16(),
                        retryable: false,
                    },
                },
            );
        }
        if done {
            sse.done();
        }
        sse.into_events()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_words_follow_serde() {
        assert_eq!(unexpected(&serde_json::json!("x")), "string \"x\"");
        assert_eq!(unexpected(&serde_json::json!(1.5)), "floating point `1.5`");
        assert_eq!(unexpected(&serde_json::json!(2.0)), "floating point `2.0`");
        assert_eq!(unexpected(&serde_json::json!(-2)), "integer `-2`");
        assert_eq!(unexpected(&serde_json::json!({})), "map");
        let body = Invalid::Contract("unknown field `x`".to_owned()).body();
        assert_eq!(&body[..], br#"{"error":"unknown field `x`"}"#);
        assert_eq!(
            &error_body(StatusCode::BAD_REQUEST, "no")[..],
            br#"{"error":{"message":"no"}}"#
        );
        assert_eq!(
            &error_body(StatusCode::SERVICE_UNAVAILABLE, "busy")[..],
            br#"{"object":"error","message":"busy","type":"503","param":null,"code":503}"#
        );
    }
}
