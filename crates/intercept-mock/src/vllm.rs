//! vLLM's token-in/token-out endpoint, `POST /inference/v1/generate`: the request as
//! vLLM validates it, and the answer as vLLM 0.31.0 (or 0.34.0) writes it, as JSON or as
//! an SSE stream.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use super::chat::write_json;
use super::config::unix_now;
use super::reply::{status_for_error_type, Completion, Reply, Usage};
use super::sse::SseBuf;
use super::tokens::{self, candidates, id_pieces, Finish, Generated, Limits, Output, Vocab};
use super::{Shared, VllmVersion};

/// The fields of a generate request the mock reads, validated.
#[derive(Debug, Default)]
pub(crate) struct GenerateRequest {
    pub(crate) token_ids: Vec<u32>,
    request_id: Option<String>,
    model: Option<String>,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    return_token_ids: bool,
    max_tokens: Option<u64>,
    stop_token_ids: Vec<u32>,
    logprobs: Option<u64>,
    prompt_logprobs: Option<u64>,
}

/// A request vLLM refuses: a validation error of the request model (type `Bad Request`,
/// `param` the field's path) or an error of the engine's checks (type
/// `BadRequestError`).
#[derive(Debug, PartialEq)]
pub(crate) enum Invalid {
    /// pydantic's error, `{'type': kind, 'loc': loc, 'msg': msg, 'input': input}`.
    Validation {
        kind: &'static str,
        loc: String,
        msg: String,
        input: String,
    },
    /// A check after parsing, with the parameter it names.
    Engine {
        message: String,
        param: Option<&'static str>,
    },
}

impl Invalid {
    fn validation(kind: &'static str, loc: &str, msg: impl Into<String>, input: &Value) -> Self {
        Invalid::Validation {
            kind,
            loc: format!("body.{loc}"),
            msg: msg.into(),
            input: py_input(input),
        }
    }

    fn engine(message: String, param: Option<&'static str>) -> Self {
        Invalid::Engine { message, param }
    }

    /// The 400 body vLLM answers.
    fn body(&self) -> Bytes {
        match self {
            Invalid::Validation {
                kind,
                loc,
                msg,
                input,
            } => {
                let message = format!(
                    "1 validation error:\n  {{'type': {}, 'loc': {}, 'msg': {}, 'input': {input}}}",
                    py_str(kind),
                    py_str(loc),
                    py_str(msg)
                );
                error_body("Bad Request", StatusCode::BAD_REQUEST, Some(loc), &message)
            }
            Invalid::Engine { message, param } => {
                error_body("BadRequestError", StatusCode::BAD_REQUEST, *param, message)
            }
        }
    }
}

/// Python's `repr` of a string.
fn py_str(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// A validation error's `input` as vLLM reports it: containers described, not shown.
fn py_input(value: &Value) -> String {
    match value {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Number(number) => number.to_string(),
        Value::String(text) => py_str(text),
        Value::Array(items) => py_str(&format!("<list of {} items>", items.len())),
        Value::Object(fields) => py_str(&format!("<dict of {} items>", fields.len())),
    }
}

/// An integer field (`None` for a missing field or `null`).
fn int_field(fields: &Map<String, Value>, key: &str, loc: &str) -> Result<Option<i64>, Invalid> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_i64().map(Some).ok_or_else(|| {
            Invalid::validation("int_type", loc, "Input should be a valid integer", value)
        }),
    }
}

/// A boolean field (`None` for a missing field or `null`).
fn bool_field(fields: &Map<String, Value>, key: &str, loc: &str) -> Result<Option<bool>, Invalid> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_bool().map(Some).ok_or_else(|| {
            Invalid::validation("bool_type", loc, "Input should be a valid boolean", value)
        }),
    }
}

/// A string field (`None` for a missing field or `null`).
fn str_field(fields: &Map<String, Value>, key: &str, loc: &str) -> Result<Option<String>, Invalid> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(value) => Err(Invalid::validation(
            "string_type",
            loc,
            "Input should be a valid string",
            value,
        )),
    }
}

/// A list of integers (`None` for a missing field or `null`).
fn int_list(
    fields: &Map<String, Value>,
    key: &str,
    loc: &str,
) -> Result<Option<Vec<i64>>, Invalid> {
    let items = match fields.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(value) => {
            return Err(Invalid::validation(
                "list_type",
                loc,
                "Input should be a valid list",
                value,
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_i64().ok_or_else(|| {
                Invalid::validation(
                    "int_type",
                    &format!("{loc}.{index}"),
                    "Input should be a valid integer",
                    item,
                )
            })
        })
        .collect::<Result<Vec<i64>, Invalid>>()
        .map(Some)
}

/// An id of the vocabulary (`0..vocab`).
fn token_id(id: i64, vocab: usize) -> Option<u32> {
    u32::try_from(id)
        .ok()
        .filter(|id| usize::try_from(*id).is_ok_and(|id| id < vocab))
}

/// A requested number of logprobs, checked as vLLM checks it (at most
/// [`tokens::MAX_LOGPROBS`], `-1` meaning the whole vocabulary).
fn logprobs_count(
    value: Option<i64>,
    param: &'static str,
    what: &str,
    vocab: usize,
) -> Result<Option<u64>, Invalid> {
    let Some(n) = value else { return Ok(None) };
    if n < -1 {
        return Err(Invalid::engine(
            format!("{param} must be non-negative or -1, got {n}."),
            Some(param),
        ));
    }
    let requested = if n == -1 { vocab as u64 } else { n as u64 };
    if requested > tokens::MAX_LOGPROBS {
        return Err(Invalid::engine(
            format!(
                "Requested {what} logprobs of {requested}, which is greater than max allowed: {}",
                tokens::MAX_LOGPROBS
            ),
            Some(param),
        ));
    }
    Ok(Some(requested))
}

/// Reads and checks a request: the fields vLLM's `GenerateRequest` and `SamplingParams`
/// validate that the mock uses (unknown fields are ignored, as vLLM does), then the
/// engine's checks (ids in the vocabulary, `max_tokens`, `logprobs`).
pub(crate) fn parse(body: &[u8], vocab: usize) -> Result<GenerateRequest, Invalid> {
    let value: Value = serde_json::from_slice(body).map_err(|err| Invalid::Validation {
        kind: "json_invalid",
        loc: "body".to_owned(),
        msg: format!("JSON decode error: {err}"),
        input: "{}".to_owned(),
    })?;
    let Value::Object(fields) = &value else {
        return Err(Invalid::Validation {
            kind: "model_attributes_type",
            loc: "body".to_owned(),
            msg: "Input should be a valid dictionary or object to extract fields from".to_owned(),
            input: py_input(&value),
        });
    };
    let token_ids = match int_list(fields, "token_ids", "token_ids")? {
        None => {
            return Err(Invalid::validation(
                "missing",
                "token_ids",
                "Field required",
                &value,
            ))
        }
        Some(ids) if ids.is_empty() => {
            return Err(Invalid::validation(
                "too_short",
                "token_ids",
                "List should have at least 1 item after validation, not 0",
                &Value::Array(Vec::new()),
            ))
        }
        Some(ids) => ids,
    };
    if token_ids.iter().any(|id| *id < 0) {
        return Err(Invalid::validation(
            "value_error",
            "token_ids",
            "Value error, token_ids must not contain negative values",
            &fields["token_ids"],
        ));
    }
    let sampling = match fields.get("sampling_params") {
        None => {
            return Err(Invalid::validation(
                "missing",
                "sampling_params",
                "Field required",
                &value,
            ))
        }
        Some(Value::Object(sampling)) => sampling,
        Some(other) => {
            return Err(Invalid::validation(
                "dict_type",
                "sampling_params",
                "Input should be a valid dictionary",
                other,
            ))
        }
    };
    let stream = bool_field(fields, "stream", "stream")?.unwrap_or(false);
    let (include_usage, continuous_usage) = match fields.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(options)) => {
            let include = bool_field(options, "include_usage", "stream_options.include_usage")?
                .unwrap_or(false);
            let continuous = bool_field(
                options,
                "continuous_usage_stats",
                "stream_options.continuous_usage_stats",
            )?
            .unwrap_or(false);
            (include, include && continuous)
        }
        Some(other) => {
            return Err(Invalid::validation(
                "model_type",
                "stream_options",
                "Input should be a valid dictionary or instance of StreamOptions",
                other,
            ))
        }
    };
    let request_id = str_field(fields, "request_id", "request_id")?;
    let model = str_field(fields, "model", "model")?;
    str_field(fields, "cache_salt", "cache_salt")?;
    int_field(fields, "priority", "priority")?;
    let return_token_ids =
        bool_field(fields, "return_token_ids", "return_token_ids")?.unwrap_or(false);

    let max_tokens = int_field(sampling, "max_tokens", "sampling_params.max_tokens")?;
    let stop_token_ids =
        int_list(sampling, "stop_token_ids", "sampling_params.stop_token_ids")?.unwrap_or_default();
    let logprobs = int_field(sampling, "logprobs", "sampling_params.logprobs")?;
    let prompt_logprobs = int_field(
        sampling,
        "prompt_logprobs",
        "sampling_params.prompt_logprobs",
    )?;
    let n = int_field(sampling, "n", "sampling_params.n")?.unwrap_or(1);
    for key in ["skip_special_tokens", "detokenize", "ignore_eos"] {
        bool_field(sampling, key, &format!("sampling_params.{key}"))?;
    }
    int_field(sampling, "seed", "sampling_params.seed")?;
    let temperature = match sampling.get("temperature") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_f64().ok_or_else(|| {
            Invalid::validation(
                "float_type",
                "sampling_params.temperature",
                "Input should be a valid number",
                value,
            )
        })?),
    };

    // The engine's checks, in vLLM's words.
    if n != 1 {
        return Err(Invalid::engine(
            format!("The mock samples one sequence per request: n must be 1, got {n}."),
            Some("n"),
        ));
    }
    if let Some(t) = temperature {
        if t < 0.0 {
            return Err(Invalid::engine(
                format!("temperature must be non-negative, got {t}."),
                Some("temperature"),
            ));
        }
        if t > 2.0 {
            return Err(Invalid::engine(
                format!("temperature must be in [0, 2], got {t}."),
                Some("temperature"),
            ));
        }
    }
    let max_tokens = match max_tokens {
        Some(n) if n < 1 => {
            return Err(Invalid::engine(
                format!("max_tokens must be at least 1, got {n}."),
                Some("max_tokens"),
            ))
        }
        other => other.map(|n| n as u64),
    };
    let logprobs = logprobs_count(logprobs, "logprobs", "sample", vocab)?;
    let prompt_logprobs = logprobs_count(prompt_logprobs, "prompt_logprobs", "prompt", vocab)?;
    let stop_token_ids = stop_token_ids
        .iter()
        .map(|id| {
            token_id(*id, vocab).ok_or_else(|| {
                Invalid::engine(
                    format!(
                        "stop_token_ids must be ids of the mock's vocabulary (0 to {}), got {id}.",
                        vocab.saturating_sub(1)
                    ),
                    Some("stop_token_ids"),
                )
            })
        })
        .collect::<Result<Vec<u32>, Invalid>>()?;
    let max_id = token_ids.iter().copied().max().unwrap_or(0);
    if token_id(max_id, vocab).is_none() {
        return Err(Invalid::engine(
            format!("Token id {max_id} is out of vocabulary"),
            None,
        ));
    }
    let token_ids = token_ids
        .iter()
        .filter_map(|id| token_id(*id, vocab))
        .collect();
    Ok(GenerateRequest {
        token_ids,
        request_id,
        model,
        stream,
        include_usage,
        continuous_usage,
        return_token_ids,
        max_tokens,
        stop_token_ids,
        logprobs,
        prompt_logprobs,
    })
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    error: ErrorInfo<'a>,
}

#[derive(Serialize)]
struct ErrorInfo<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: u16,
}

/// vLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code": <status>}}`.
pub(crate) fn error_body(
    kind: &str,
    status: StatusCode,
    param: Option<&str>,
    message: &str,
) -> Bytes {
    let mut buf = Vec::with_capacity(80 + message.len());
    write_json(
        &mut buf,
        &ErrorOut {
            error: ErrorInfo {
                message,
                kind,
                param,
                code: status.as_u16(),
            },
        },
    );
    Bytes::from(buf)
}

/// vLLM's error `type` for a status: its exception classes' names for the statuses they
/// raise, else the status phrase.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "BadRequestError",
        404 => "NotFoundError",
        422 => "UnprocessableEntityError",
        500 => "InternalServerError",
        501 => "NotImplementedError",
        _ => status.canonical_reason().unwrap_or("Error"),
    }
}

/// The 501 of a token route on a mock without a tokenizer.
pub(crate) fn no_tokenizer(path: &str) -> String {
    format!(
        "the mock has no tokenizer, and {path} reads and answers token ids: set \
         MockConfig::tokenizer (e.g. to intercept_tokens::shared(<folder with tokenizer.json>)) \
         to serve it"
    )
}

/// Answers a completion on `/inference/v1/generate`.
pub(crate) fn respond(
    shared: &Shared,
    body: &Bytes,
    completion: &Completion,
    reply: &Reply,
    request_id_header: Option<&str>,
) -> Output {
    let config = &shared.config;
    let Some(vocab) = shared.vocab.as_ref() else {
        let status = StatusCode::NOT_IMPLEMENTED;
        let message = no_tokenizer(super::VLLM_GENERATE_PATH);
        return Output::Error(
            status,
            error_body(error_type(status), status, None, &message),
        );
    };
    let request = match parse(body, vocab.size) {
        Ok(request) => request,
        Err(invalid) => return Output::Error(StatusCode::BAD_REQUEST, invalid.body()),
    };
    if let Some(error) = completion.stream_error.as_ref().filter(|_| !request.stream) {
        let status = status_for_error_type(&error.kind);
        return Output::Json(
            status,
            error_body(&error.kind, status, None, &error.message),
        );
    }
    let generated = tokens::generate(
        vocab,
        completion,
        &request.token_ids,
        Limits {
            stop_token_ids: &request.stop_token_ids,
            max_tokens: request.max_tokens,
        },
    );
    let id = match request_id_header.or(request.request_id.as_deref()) {
        Some(id) => format!("generate-tokens-{id}"),
        None => format!("generate-tokens-mock-{}", shared.next_number()),
    };
    let usage = completion
        .usage
        .unwrap_or_else(|| Usage::new(request.token_ids.len() as u64, generated.ids.len() as u64));
    let answer = AnswerParts {
        request: &request,
        vocab,
        generated: &generated,
        id: &id,
        model: completion
            .model
            .as_deref()
            .or(request.model.as_deref())
            .unwrap_or(&config.default_model),
        created: config.created.unwrap_or_else(unix_now),
        usage,
        cached_tokens: completion
            .cached_tokens
            .unwrap_or(0)
            .min(usage.prompt_tokens),
        version: config.vllm_version,
    };
    if request.stream {
        let shape = StreamShape {
            chunks: reply.chunks.unwrap_or(config.chunks),
            crlf: reply.crlf,
            done: reply.done,
        };
        Output::Stream(answer.stream(shape, completion.stream_error.as_ref()))
    } else {
        Output::Json(StatusCode::OK, answer.json())
    }
}

/// How a stream is cut and framed.
#[derive(Debug, Clone, Copy)]
struct StreamShape {
    chunks: usize,
    crlf: bool,
    done: bool,
}

/// Everything an answer is made of.
struct AnswerParts<'a> {
    request: &'a GenerateRequest,
    vocab: &'a Vocab,
    generated: &'a Generated,
    id: &'a str,
    model: &'a str,
    created: u64,
    usage: Usage,
    cached_tokens: u64,
    version: VllmVersion,
}

/// How much of `usage` is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UsageStyle {
    /// Every field, `null`s included (`model_dump()`); 0.34.0 leaves out
    /// `prompt_tokens_details` when it is `null`.
    Full(VllmVersion),
    /// Only the fields with a value (`model_dump_json(exclude_none=True)`).
    ExcludeNone,
}

#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: u64,
    total_tokens: u64,
    completion_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<Option<PromptDetails>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_tokens_details: Option<Option<()>>,
}

#[derive(Serialize)]
struct PromptDetails {
    cached_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_cache_tokens: Option<Option<()>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    multimodal_tokens: Option<Option<()>>,
}

impl UsageOut {
    fn new(prompt: u64, completion: u64, cached: u64, style: UsageStyle) -> Self {
        let full = style != UsageStyle::ExcludeNone;
        let details = (cached > 0).then(|| PromptDetails {
            cached_tokens: cached,
            created_cache_tokens: full.then_some(None),
            multimodal_tokens: full.then_some(None),
        });
        let prompt_tokens_details = match (style, details) {
            (_, Some(details)) => Some(Some(details)),
            (UsageStyle::Full(VllmVersion::V0_31), None) => Some(None),
            _ => None,
        };
        Self {
            prompt_tokens: prompt,
            total_tokens: prompt.saturating_add(completion),
            completion_tokens: completion,
            prompt_tokens_details,
            completion_tokens_details: full.then_some(None),
        }
    }
}

/// 0.31.0's logprobs: OpenAI's shape with `token_id:<id>` tokens.
#[derive(Serialize)]
struct PlaceholderLogprobs {
    content: Vec<PlaceholderContent>,
}

#[derive(Serialize)]
struct PlaceholderContent {
    token: String,
    logprob: f64,
    bytes: Option<()>,
    top_logprobs: Vec<PlaceholderTop>,
}

#[derive(Serialize)]
struct PlaceholderTop {
    token: String,
    logprob: f64,
    bytes: Option<()>,
}

/// 0.34.0's logprobs: integer ids and ranks.
#[derive(Serialize)]
struct IdLogprobs {
    content: Vec<IdContent>,
}

#[derive(Serialize)]
struct IdContent {
    token_id: u32,
    logprob: f64,
    rank: Option<u64>,
    top_logprobs: Vec<IdTop>,
}

#[derive(Serialize)]
struct IdTop {
    token_id: u32,
    logprob: f64,
    rank: Option<u64>,
}

/// One `prompt_logprobs` entry (vLLM's `Logprob`).
#[derive(Serialize)]
struct PromptLogprob {
    logprob: f64,
    rank: Option<u64>,
    decoded_token: Option<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Logprobs {
    Placeholders(PlaceholderLogprobs),
    Ids(IdLogprobs),
}

#[derive(Serialize)]
struct ResponseV031<'a> {
    request_id: &'a str,
    model: &'a str,
    created: u64,
    choices: [ChoiceV031<'a>; 1],
    usage: UsageOut,
    prompt_logprobs: Option<Vec<Option<BTreeMap<u32, PromptLogprob>>>>,
    prompt_token_id_logprobs: Option<()>,
    prompt_token_ids: Option<&'a [u32]>,
    mm_placeholders: Option<()>,
    metrics: Option<()>,
    kv_transfer_params: Option<()>,
    ec_transfer_params: Option<()>,
}

#[derive(Serialize)]
struct ChoiceV031<'a> {
    index: u32,
    logprobs: Option<Logprobs>,
    finish_reason: Option<&'a str>,
    token_ids: &'a [u32],
    routed_experts: Option<()>,
    sampling_mask: Option<()>,
}

#[derive(Serialize)]
struct ResponseV034<'a> {
    request_id: &'a str,
    model: &'a str,
    created: u64,
    usage: UsageOut,
    prompt_logprobs: Option<Vec<Option<BTreeMap<u32, PromptLogprob>>>>,
    prompt_token_id_logprobs: Option<()>,
    prompt_token_ids: Option<&'a [u32]>,
    mm_placeholders: Option<()>,
    metrics: Option<()>,
    kv_transfer_params: Option<()>,
    ec_transfer_params: Option<()>,
    output_mode: &'static str,
    choices: [ChoiceV034<'a>; 1],
}

#[derive(Serialize)]
struct ChoiceV034<'a> {
    index: u32,
    finish_reason: Option<&'a str>,
    stop_reason: Option<u32>,
    token_ids: &'a [u32],
    routed_experts: Option<()>,
    sampling_mask: Option<()>,
    weight_versions: Option<()>,
    logprobs: Option<Logprobs>,
}

/// A stream chunk of 0.31.0: `usage` is always written, `prompt_token_ids` only on the
/// chunk that carries it.
#[derive(Serialize)]
struct ChunkV031<'a> {
    request_id: &'a str,
    choices: &'a [ChoiceV031<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageOut>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
}

#[derive(Serialize)]
struct ChunkV034<'a> {
    request_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageOut>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
    output_mode: &'static str,
    choices: &'a [ChoiceV034<'a>],
}

impl AnswerParts<'_> {
    /// The logprobs of `ids`, if the request asked for them.
    fn logprobs(&self, ids: &[u32]) -> Option<Logprobs> {
        let n = self.request.logprobs?;
        let vocab = self.vocab.size_u32();
        Some(match self.version {
            VllmVersion::V0_31 => Logprobs::Placeholders(PlaceholderLogprobs {
                content: ids
                    .iter()
                    .map(|&id| PlaceholderContent {
                        token: format!("token_id:{id}"),
                        logprob: tokens::logprob(id),
                        bytes: None,
                        top_logprobs: candidates(id, n, vocab)
                            .map(|(other, logprob, _)| PlaceholderTop {
                                token: format!("token_id:{other}"),
                                logprob,
                                bytes: None,
                            })
                            .collect(),
                    })
                    .collect(),
            }),
            VllmVersion::V0_34 => Logprobs::Ids(IdLogprobs {
                content: ids
                    .iter()
                    .map(|&id| IdContent {
                        token_id: id,
                        logprob: tokens::logprob(id),
                        rank: Some(1),
                        top_logprobs: candidates(id, n, vocab)
                            .map(|(other, logprob, rank)| IdTop {
                                token_id: other,
                                logprob,
                                rank: Some(rank),
                            })
                            .collect(),
                    })
                    .collect(),
            }),
        })
    }

    /// `prompt_logprobs`, if asked for: `null` for the first prompt token, then the
    /// prompt token and `n - 1` others per position, keyed by id.
    fn prompt_logprobs(&self) -> Option<Vec<Option<BTreeMap<u32, PromptLogprob>>>> {
        let n = self.request.prompt_logprobs?;
        let vocab = self.vocab.size_u32();
        let ids = &self.request.token_ids;
        Some(
            std::iter::once(None)
                .chain(ids.iter().skip(1).map(|&id| {
                    Some(
                        candidates(id, n, vocab)
                            .map(|(other, logprob, rank)| {
                                let decoded = self.vocab.tokenizer.decode(&[other]);
                                (
                                    other,
                                    PromptLogprob {
                                        logprob,
                                        rank: Some(rank),
                                        decoded_token: Some(decoded),
                                    },
                                )
                            })
                            .collect(),
                    )
                }))
                .collect(),
        )
    }

    fn finish_reason(&self) -> &'static str {
        match self.generated.finish {
            Finish::Stop(_) => "stop",
            Finish::Length => "length",
        }
    }

    /// 0.34.0's `stop_reason`: the stop id when it came from `stop_token_ids` and is not
    /// the tokenizer's end-of-sequence token, else `null`.
    fn stop_reason(&self) -> Option<u32> {
        let Finish::Stop(Some(stop)) = self.generated.finish else {
            return None;
        };
        (self.request.stop_token_ids.first() == Some(&stop) && self.vocab.eos != Some(stop))
            .then_some(stop)
    }

    fn prompt_token_ids(&self) -> Option<&[u32]> {
        self.request
            .return_token_ids
            .then_some(self.request.token_ids.as_slice())
    }

    fn usage(&self, completion_tokens: u64, style: UsageStyle) -> UsageOut {
        UsageOut::new(
            self.usage.prompt_tokens,
            completion_tokens,
            self.cached_tokens,
            style,
        )
    }

    /// The whole answer, as vLLM's `JSONResponse(model_dump())` writes it.
    fn json(&self) -> Bytes {
        let ids = &self.generated.ids;
        let usage = self.usage(self.usage.completion_tokens, UsageStyle::Full(self.version));
        let mut buf = Vec::with_capacity(512 + ids.len() * 64);
        match self.version {
            VllmVersion::V0_31 => write_json(
                &mut buf,
                &ResponseV031 {
                    request_id: self.id,
                    model: self.model,
                    created: self.created,
                    choices: [ChoiceV031 {
                        index: 0,
                        logprobs: self.logprobs(ids),
                        finish_reason: Some(self.finish_reason()),
                        token_ids: ids,
                        routed_experts: None,
                        sampling_mask: None,
                    }],
                    usage,
                    prompt_logprobs: self.prompt_logprobs(),
                    prompt_token_id_logprobs: None,
                    prompt_token_ids: self.prompt_token_ids(),
                    mm_placeholders: None,
                    metrics: None,
                    kv_transfer_params: None,
                    ec_transfer_params: None,
                },
            ),
            VllmVersion::V0_34 => write_json(
                &mut buf,
                &ResponseV034 {
                    request_id: self.id,
                    model: self.model,
                    created: self.created,
                    usage,
                    prompt_logprobs: self.prompt_logprobs(),
                    prompt_token_id_logprobs: None,
                    prompt_token_ids: self.prompt_token_ids(),
                    mm_placeholders: None,
                    metrics: None,
                    kv_transfer_params: None,
                    ec_transfer_params: None,
                    output_mode: "tokens",
                    choices: [ChoiceV034 {
                        index: 0,
                        finish_reason: Some(self.finish_reason()),
                        stop_reason: self.stop_reason(),
                        token_ids: ids,
                        routed_experts: None,
                        sampling_mask: None,
                        weight_versions: None,
                        logprobs: self.logprobs(ids),
                    }],
                },
            ),
        }
        Bytes::from(buf)
    }

    /// The answer as SSE events: the ids in `shape.chunks` pieces, the last one with the
    /// finish reason (0.31.0 sends no chunk for an empty completion unless it carries the
    /// prompt ids), the usage chunk if asked for, `data: [DONE]`. A stream error takes
    /// the finish reason and the usage chunk away and comes before `[DONE]`.
    fn stream(&self, shape: StreamShape, error: Option<&super::reply::StreamError>) -> Vec<Bytes> {
        let ids = &self.generated.ids;
        let mut pieces = id_pieces(ids, shape.chunks);
        if pieces.is_empty()
            && (self.version == VllmVersion::V0_34 || self.request.return_token_ids)
        {
            pieces.push(&[]);
        }
        let mut sse = SseBuf::new(
            pieces.len() * 256 + ids.len() * 64,
            pieces.len() + 3,
            shape.crlf,
        );
        let mut sent = 0u64;
        for (index, piece) in pieces.iter().enumerate() {
            let last = index + 1 == pieces.len();
            sent += piece.len() as u64;
            let finish_reason = (last && error.is_none()).then(|| self.finish_reason());
            let prompt_token_ids = if index == 0 {
                self.prompt_token_ids()
            } else {
                None
            };
            let usage = self
                .request
                .continuous_usage
                .then(|| self.usage(sent, UsageStyle::Full(self.version)));
            match self.version {
                VllmVersion::V0_31 => {
                    let choices = [ChoiceV031 {
                        index: 0,
                        logprobs: self.logprobs(piece),
                        finish_reason,
                        token_ids: piece,
                        routed_experts: None,
                        sampling_mask: None,
                    }];
                    sse.json(
                        None,
                        &ChunkV031 {
                            request_id: self.id,
                            choices: &choices,
                            usage: Some(usage),
                            prompt_token_ids,
                        },
                    );
                }
                VllmVersion::V0_34 => {
                    let choices = [ChoiceV034 {
                        index: 0,
                        finish_reason,
                        stop_reason: if finish_reason.is_some() {
                            self.stop_reason()
                        } else {
                            None
                        },
                        token_ids: piece,
                        routed_experts: None,
                        sampling_mask: None,
                        weight_versions: None,
                        logprobs: self.logprobs(piece),
                    }];
                    sse.json(
                        None,
                        &ChunkV034 {
                            request_id: self.id,
                            usage: Some(usage),
                            prompt_token_ids,
                            output_mode: "tokens",
                            choices: &choices,
                        },
                    );
                }
            }
        }
        match error {
            Some(error) => {
                let status = status_for_error_type(&error.kind);
                sse.raw_data(&error_body(&error.kind, status, None, &error.message));
            }
            None if self.request.include_usage => {
                let usage = Some(Some(
                    self.usage(self.usage.completion_tokens, UsageStyle::ExcludeNone),
                ));
                match self.version {
                    VllmVersion::V0_31 => sse.json(
                        None,
                        &ChunkV031 {
                            request_id: self.id,
                            choices: &[],
                            usage,
                            prompt_token_ids: None,
                        },
                    ),
                    VllmVersion::V0_34 => sse.json(
                        None,
                        &ChunkV034 {
                            request_id: self.id,
                            usage,
                            prompt_token_ids: None,
                            output_mode: "tokens",
                            choices: &[],
                        },
                    ),
                }
            }
            None => {}
        }
        if shape.done {
            sse.done();
        }
        sse.into_events()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_reprs() {
        assert_eq!(py_str("a'b"), "\"a'b\"");
        assert_eq!(py_str("a\"b'c\n"), "'a\"b\\'c\\n'");
        assert_eq!(py_input(&serde_json::json!([1, 2])), "'<list of 2 items>'");
        assert_eq!(py_input(&serde_json::json!(null)), "None");
        assert_eq!(py_input(&serde_json::json!(-3)), "-3");
    }

    #[test]
    fn validation_errors_name_the_field() {
        let err = parse(br#"{"sampling_params":{}}"#, 100).unwrap_err();
        let body: Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(body["error"]["type"], "Bad Request");
        assert_eq!(body["error"]["param"], "body.token_ids");
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(
            body["error"]["message"],
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.token_ids', \
             'msg': 'Field required', 'input': '<dict of 1 items>'}"
        );
        let err = parse(br#"{"token_ids":[1,"x"],"sampling_params":{}}"#, 100).unwrap_err();
        assert!(matches!(err, Invalid::Validation { ref loc, .. } if loc == "body.token_ids.1"));
        let err = parse(
            br#"{"token_ids":[1],"sampling_params":{"max_tokens":0}}"#,
            100,
        )
        .unwrap_err();
        assert_eq!(
            err,
            Invalid::engine(
                "max_tokens must be at least 1, got 0.".to_owned(),
                Some("max_tokens")
            )
        );
        let err = parse(br#"{"token_ids":[1, 100],"sampling_params":{}}"#, 100).unwrap_err();
        assert_eq!(
            err,
            Invalid::engine("Token id 100 is out of vocabulary".to_owned(), None)
        );
        let err = parse(
            br#"{"token_ids":[1],"sampling_params":{"logprobs":21}}"#,
            100,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            Invalid::Engine {
                param: Some("logprobs"),
                ..
            }
        ));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let request = parse(
            br#"{"token_ids":[1,2],"sampling_params":{"max_tokens":5,"stop_token_ids":[7],
                 "logprobs":1,"whatever":{"x":1}},"features":null,"extra":true,
                 "stream":true,"stream_options":{"include_usage":true}}"#,
            100,
        )
        .unwrap();
        assert_eq!(request.token_ids, [1, 2]);
        assert_eq!(request.max_tokens, Some(5));
        assert_eq!(request.stop_token_ids, [7]);
        assert_eq!(request.logprobs, Some(1));
        assert!(request.stream && request.include_usage && !request.continuous_usage);
    }
}
