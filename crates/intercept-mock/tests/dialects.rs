//! The mock upstream's Responses and Anthropic Messages dialects, through real HTTP.

// Clippy only exempts `#[test]` functions, not the helpers of an integration test.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use intercept_core::Dialect as _;
use intercept_mock::{
    MockConfig, MockUpstream, Reply, ToolCall, ANTHROPIC_CONTEXT_LENGTH_MESSAGE,
    CONTEXT_LENGTH_MESSAGE, COUNT_TOKENS_PATH, MESSAGES_PATH, RESPONSES_PATH,
};
use serde_json::{json, Map, Value};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// Whether the body ended cleanly (false when the mock cut the connection).
    complete: bool,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    /// The events of an LF-framed stream as (event name, data) pairs.
    fn events(&self) -> Vec<(Option<String>, String)> {
        let text = self.text();
        assert!(
            text.ends_with("\n\n"),
            "stream must end with a complete event: {text:?}"
        );
        text.split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let (name, data) = match event.strip_prefix("event: ") {
                    Some(rest) => {
                        let (name, data) = rest.split_once('\n').unwrap();
                        (Some(name.to_owned()), data)
                    }
                    None => (None, event),
                };
                let data = data
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {event:?}"));
                (name, data.to_owned())
            })
            .collect()
    }

    /// The JSON events; each `event:` name must equal the data's `type`.
    fn json_events(&self) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|(_, data)| data != "[DONE]")
            .map(|(name, data)| {
                let value: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(name.as_deref(), value["type"].as_str(), "{data}");
                value
            })
            .collect()
    }
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

async fn send_with(
    client: &HttpClient,
    mock: &MockUpstream,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", mock.addr()))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let (parts, mut body) = response.into_parts();
    let mut bytes = Vec::new();
    let mut complete = true;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Err(_) => {
                complete = false;
                break;
            }
        }
    }
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: Bytes::from(bytes),
        complete,
    }
}

const ANTHROPIC_HEADERS: &[(&str, &str)] = &[
    ("x-api-key", "sk-ant-test"),
    ("anthropic-version", "2023-06-01"),
];

async fn responses(client: &HttpClient, mock: &MockUpstream, body: &Value) -> Answer {
    let headers = [("authorization", "Bearer sk-test")];
    send_with(
        client,
        mock,
        Method::POST,
        RESPONSES_PATH,
        &headers,
        &body.to_string(),
    )
    .await
}

async fn messages(client: &HttpClient, mock: &MockUpstream, body: &Value) -> Answer {
    send_with(
        client,
        mock,
        Method::POST,
        MESSAGES_PATH,
        ANTHROPIC_HEADERS,
        &body.to_string(),
    )
    .await
}

fn streaming(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
}

/// A Responses request: instructions and a string input.
fn responses_body(text: &str) -> Value {
    json!({"model": "policy-7b", "instructions": "You are terse.", "input": text})
}

/// An Anthropic request: a system prompt and one user message.
fn messages_body(text: &str) -> Value {
    json!({
        "model": "claude-mock",
        "max_tokens": 1024,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": text}],
    })
}

/// Asks the same scripted reply of two fresh mocks (so ids match), once as JSON and once
/// streamed.
async fn json_and_stream(path: &str, body: &Value, reply: impl Fn() -> Reply) -> (Answer, Answer) {
    let client = client();
    let mut answers = Vec::new();
    for stream in [false, true] {
        let mock = MockUpstream::start().await.unwrap();
        mock.push(reply());
        let body = if stream {
            streaming(body.clone())
        } else {
            body.clone()
        };
        let answer = send_with(
            &client,
            &mock,
            Method::POST,
            path,
            ANTHROPIC_HEADERS,
            &body.to_string(),
        )
        .await;
        answers.push(answer);
        mock.shutdown().await;
    }
    let streamed = answers.pop().unwrap();
    (answers.pop().unwrap(), streamed)
}

// ---------------------------------------------------------------------------------------
// Responses

#[tokio::test]
async fn responses_echo_has_the_response_shape() {
    let mock = MockUpstream::start().await.unwrap();
    assert_eq!(
        mock.responses_url(),
        format!("{}/responses", mock.base_url())
    );
    let client = client();

    let answer = responses(&client, &mock, &responses_body("hello mock world")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "application/json");
    let expected = json!({
        "id": "resp_mock_1",
        "object": "response",
        "created_at": MockConfig::FIXED_CREATED,
        "status": "completed",
        "error": null,
        "incomplete_details": null,
        "instructions": "You are terse.",
        "model": "policy-7b",
        "output": [{
            "type": "message",
            "id": "msg_mock_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "echo: hello mock world", "annotations": [], "logprobs": []}],
        }],
        // input: 3 + 4 (instructions) + 3 + 4 (input); output: 4 words.
        "usage": {
            "input_tokens": 14,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 18,
        },
    });
    assert_eq!(answer.json(), expected);

    // Items: the last user message's text (string or input_text parts) is echoed.
    let body = json!({"input": [
        {"role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "second"},
            {"type": "input_image", "image_url": "data:x"},
            {"type": "input_text", "text": "part"},
        ]},
    ]});
    let answer = responses(&client, &mock, &body).await.json();
    assert_eq!(answer["id"], "resp_mock_2");
    assert_eq!(answer["model"], "mock-model");
    assert_eq!(answer["instructions"], Value::Null);
    assert_eq!(
        answer["output"][0]["content"][0]["text"],
        "echo: second\npart"
    );
    // 1 + 4, 1 + 4, 2 + 4.
    assert_eq!(answer["usage"]["input_tokens"], 16);

    // Scripted: reasoning, cached tokens, explicit usage.
    mock.push(
        Reply::text("42")
            .with_reasoning("six times seven")
            .with_usage(100, 9)
            .with_cached_tokens(60),
    );
    let answer = responses(&client, &mock, &responses_body("q")).await.json();
    assert_eq!(
        answer["output"],
        json!([
            {"type": "reasoning", "id": "rs_mock_3", "summary": [],
             "content": [{"type": "reasoning_text", "text": "six times seven"}]},
            {"type": "message", "id": "msg_mock_3", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "42", "annotations": [], "logprobs": []}]},
        ])
    );
    assert_eq!(
        answer["usage"],
        json!({
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 60},
            "output_tokens": 9,
            "output_tokens_details": {"reasoning_tokens": 3},
            "total_tokens": 109,
        })
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn responses_tool_calls_and_tool_outputs() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let tools = json!([
        {"type": "function", "name": "search", "parameters": {"type": "object"}},
        {"type": "function", "name": "other", "parameters": {"type": "object"}},
    ]);

    let body = json!({"model": "m", "input": "please use a tool", "tools": tools});
    let answer = responses(&client, &mock, &body).await.json();
    assert_eq!(answer["status"], "completed");
    assert_eq!(
        answer["output"],
        json!([{
            "type": "function_call", "id": "fc_mock_1_0", "status": "completed",
            "call_id": "call_1", "name": "search",
            "arguments": r#"{"query":"please use a tool"}"#,
        }])
    );

    let body = json!({"model": "m", "tools": tools, "input": [
        {"role": "user", "content": "please use a tool"},
        {"type": "function_call", "call_id": "call_1", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42 results"},
    ]});
    let answer = responses(&client, &mock, &body).await.json();
    assert_eq!(
        answer["output"][0]["content"][0]["text"],
        "tool said: 42 results"
    );
    // Output as input_text parts works too.
    let body = json!({"input": [
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "parts"}]},
    ]});
    let answer = responses(&client, &mock, &body).await.json();
    assert_eq!(
        answer["output"][0]["content"][0]["text"],
        "tool said: parts"
    );

    // Scripted calls with text: message first, then the calls in order.
    mock.push(
        Reply::text("Let me look.")
            .with_tool_call(ToolCall::new("search", r#"{"q":"rust"}"#).with_id("call_a"))
            .with_tool_call(ToolCall::new("open", r#"{"url":"x"}"#)),
    );
    let answer = responses(&client, &mock, &json!({"input": "x"}))
        .await
        .json();
    let output = answer["output"].as_array().unwrap();
    assert_eq!(output.len(), 3);
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[1]["call_id"], "call_a");
    assert_eq!(output[1]["id"], "fc_mock_4_0");
    assert_eq!(output[2]["call_id"], "call_2");
    assert_eq!(output[2]["name"], "open");
    mock.shutdown().await;
}

#[tokio::test]
async fn responses_stream_follows_the_event_sequence() {
    let reply = || {
        Reply::text("The answer is 42.")
            .with_reasoning("six times seven")
            .with_chunks(2)
    };
    let (json, stream) = json_and_stream(RESPONSES_PATH, &responses_body("q"), reply).await;
    assert_eq!(stream.status, StatusCode::OK);
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    assert!(!stream.text().contains("[DONE]"));
    let events = stream.json_events();
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], n);
    }
    let mut in_progress = json.json();
    in_progress["status"] = json!("in_progress");
    in_progress["output"] = json!([]);
    in_progress["usage"] = Value::Null;
    assert_eq!(events[0]["response"], in_progress);
    assert_eq!(events[1]["response"], in_progress);
    assert_eq!(
        events[9],
        json!({"type": "response.output_item.added", "sequence_number": 9, "output_index": 1,
               "item": {"type": "message", "id": "msg_mock_1", "status": "in_progress",
                        "role": "assistant", "content": []}})
    );
    assert_eq!(
        events[10],
        json!({"type": "response.content_part.added", "sequence_number": 10,
               "item_id": "msg_mock_1", "output_index": 1, "content_index": 0,
               "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
    );
    assert_eq!(
        events[11],
        json!({"type": "response.output_text.delta", "sequence_number": 11,
               "item_id": "msg_mock_1", "output_index": 1, "content_index": 0,
               "delta": "The answ", "logprobs": []})
    );

    // The deltas reassemble to the texts; the done events and the terminal event carry
    // exactly the non-streamed response.
    let concat = |kind: &str| -> String {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["delta"].as_str().unwrap())
            .collect()
    };
    assert_eq!(concat("response.reasoning_text.delta"), "six times seven");
    assert_eq!(concat("response.output_text.delta"), "The answer is 42.");
    assert_eq!(events[13]["text"], "The answer is 42.");
    let json = json.json();
    assert_eq!(events[8]["item"], json["output"][0]);
    assert_eq!(events[15]["item"], json["output"][1]);
    assert_eq!(events[16]["response"], json);
}

#[tokio::test]
async fn responses_streamed_tool_calls_reassemble() {
    let reply = || {
        Reply::tool_call("search", r#"{"query":"rust sse"}"#)
            .with_tool_call(ToolCall::new("open", r#"{"url":"https://x"}"#).with_id("call_b"))
            .with_chunks(3)
    };
    let (json, stream) = json_and_stream(RESPONSES_PATH, &responses_body("q"), reply).await;
    let json = json.json();
    let events = stream.json_events();
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(
        events[2]["item"],
        json!({"type": "function_call", "id": "fc_mock_1_0", "status": "in_progress",
               "call_id": "call_1", "name": "search", "arguments": ""})
    );
    // Rebuild each call from its added item and argument deltas.
    let mut rebuilt = Vec::new();
    for event in &events {
        match event["type"].as_str().unwrap() {
            "response.output_item.added" => rebuilt.push(event["item"].clone()),
            "response.function_call_arguments.delta" => {
                let item = rebuilt.last_mut().unwrap();
                assert_eq!(event["item_id"], item["id"]);
                let args = format!(
                    "{}{}",
                    item["arguments"].as_str().unwrap(),
                    event["delta"].as_str().unwrap()
                );
                item["arguments"] = json!(args);
            }
            "response.function_call_arguments.done" => {
                let item = rebuilt.last_mut().unwrap();
                assert_eq!(event["arguments"], item["arguments"]);
                assert_eq!(event["name"], item["name"]);
                item["status"] = json!("completed");
            }
            _ => {}
        }
    }
    assert_eq!(Value::Array(rebuilt), json["output"]);
    assert_eq!(events.last().unwrap()["response"], json);
    assert_eq!(json["status"], "completed");
}

#[tokio::test]
async fn responses_truncation_failure_and_cut_streams() {
    // Finish reason length: incomplete, streamed with response.incomplete.
    let reply = || Reply::text("Once upon a").with_finish_reason("length");
    let (json, stream) = json_and_stream(RESPONSES_PATH, &responses_body("q"), reply).await;
    let json = json.json();
    assert_eq!(json["status"], "incomplete");
    assert_eq!(
        json["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(json["output"][0]["status"], "incomplete");
    let events = stream.json_events();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(last["response"], json);

    // A failed response, as JSON and streamed.
    let reply = || Reply::responses_failed("server_error", "The model crashed.");
    let (json, stream) = json_and_stream(RESPONSES_PATH, &responses_body("q"), reply).await;
    assert_eq!(json.status, StatusCode::OK);
    let expected = json!({
        "id": "resp_mock_1",
        "object": "response",
        "created_at": MockConfig::FIXED_CREATED,
        "status": "failed",
        "error": {"code": "server_error", "message": "The model crashed."},
        "incomplete_details": null,
        "instructions": "You are terse.",
        "model": "policy-7b",
        "output": [],
        "usage": null,
    });
    assert_eq!(json.json(), expected);
    let events = stream.json_events();
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(events[0]["response"]["error"], Value::Null);
    assert_eq!(events[2]["response"], expected);

    // without_done: the stream ends cleanly before its terminal event; the sentinel adds
    // [DONE]; disconnect_after cuts the connection.
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push_many([
        Reply::text("cut short").without_done(),
        Reply::text("with sentinel").with_done_sentinel(),
        Reply::text("never finished").disconnect_after(3),
        Reply::responses_failed("rate_limit_exceeded", "slow").without_done(),
    ]);
    let body = streaming(responses_body("q"));
    let answer = responses(&client, &mock, &body).await;
    assert!(answer.complete);
    let events = answer.json_events();
    assert_eq!(events.last().unwrap()["type"], "response.output_item.done");

    let answer = responses(&client, &mock, &body).await;
    let raw = answer.events();
    assert_eq!(raw.last().unwrap(), &(None, "[DONE]".to_owned()));
    assert_eq!(raw[raw.len() - 2].0.as_deref(), Some("response.completed"));

    let answer = responses(&client, &mock, &body).await;
    assert!(!answer.complete);
    assert_eq!(
        types(&answer.json_events()),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added"
        ]
    );

    let answer = responses(&client, &mock, &body).await;
    assert_eq!(
        types(&answer.json_events()),
        ["response.created", "response.in_progress"]
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn responses_errors_have_the_openai_shape() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push_many([
        Reply::error(429, "Rate limit reached").with_retry_after(3),
        Reply::context_length_error(),
        Reply::text("partial").with_stream_error("server_error", "stream broke"),
        Reply::stream_error("rate_limit_exceeded", "too fast"),
    ]);
    let answer = responses(&client, &mock, &responses_body("q")).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.headers["retry-after"], "3");
    assert_eq!(
        answer.json(),
        json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error", "param": null, "code": null}})
    );

    let answer = responses(&client, &mock, &streaming(responses_body("q"))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(
        answer.json(),
        json!({"error": {"message": CONTEXT_LENGTH_MESSAGE, "type": "invalid_request_error",
                         "param": "input", "code": "context_length_exceeded"}})
    );
    assert!(CONTEXT_LENGTH_MESSAGE.contains("context length"));

    // An in-stream error after the output, instead of the terminal event.
    let answer = responses(&client, &mock, &streaming(responses_body("q"))).await;
    let events = answer.json_events();
    assert_eq!(
        events[events.len() - 2]["type"],
        "response.output_item.done"
    );
    assert_eq!(
        events.last().unwrap(),
        &json!({"type": "error", "sequence_number": events.len() - 1,
                "code": "server_error", "message": "stream broke", "param": null})
    );
    // Without a stream, the same reply is an HTTP error.
    let answer = responses(&client, &mock, &responses_body("q")).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.json()["error"]["type"], "rate_limit_exceeded");

    // Bad requests.
    let answer = send_with(&client, &mock, Method::POST, RESPONSES_PATH, &[], "nope {").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    let answer = responses(&client, &mock, &json!({"model": "m"})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.json()["error"]["message"],
        "Missing required parameter: 'input'."
    );
    let answer = responses(&client, &mock, &json!({"input": [{"role": 5}]})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Invalid Responses request"));
    let answer = send_with(&client, &mock, Method::GET, RESPONSES_PATH, &[], "").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.headers["allow"], "POST");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    mock.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages

#[tokio::test]
async fn messages_echo_has_the_message_shape_and_headers_are_logged() {
    let mock = MockUpstream::start().await.unwrap();
    assert_eq!(mock.anthropic_base_url(), format!("http://{}", mock.addr()));
    assert_eq!(
        mock.messages_url(),
        format!("{}/v1/messages", mock.anthropic_base_url())
    );
    let client = client();

    let answer = messages(&client, &mock, &messages_body("hello mock world")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "application/json");
    let expected = json!({
        "id": "msg_mock_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-mock",
        "content": [{"type": "text", "text": "echo: hello mock world"}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        // input: 3 + 4 (system) + 3 + 4; output: 4 words.
        "usage": {"input_tokens": 14, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 4},
    });
    assert_eq!(answer.json(), expected);

    let logged = mock.last_request().unwrap();
    assert_eq!(logged.path, MESSAGES_PATH);
    assert_eq!(logged.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(logged.header("Anthropic-Version"), Some("2023-06-01"));
    assert_eq!(logged.json().unwrap()["system"], "You are terse.");

    // Block content and system blocks; the last user message is echoed.
    let body = json!({
        "model": "claude-mock",
        "system": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "first"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                {"type": "text", "text": "look"},
                {"type": "text", "text": "here"},
            ]},
        ],
    });
    let answer = messages(&client, &mock, &body).await.json();
    assert_eq!(answer["content"][0]["text"], "echo: look\nhere");
    // 2 + 4, 1 + 4, 1 + 4, 2 + 4.
    assert_eq!(answer["usage"]["input_tokens"], 22);

    // count_tokens: the same count, and it leaves scripted replies alone.
    mock.push(Reply::text("for the next turn"));
    let counted = send_with(
        &client,
        &mock,
        Method::POST,
        COUNT_TOKENS_PATH,
        ANTHROPIC_HEADERS,
        &body.to_string(),
    )
    .await;
    assert_eq!(counted.status, StatusCode::OK);
    assert_eq!(counted.json(), json!({"input_tokens": 22}));
    assert_eq!(mock.pending_replies(), 1);
    assert_eq!(mock.last_request().unwrap().path, COUNT_TOKENS_PATH);
    assert_eq!(
        mock.count_tokens_url(),
        format!("{}{COUNT_TOKENS_PATH}", mock.anthropic_base_url())
    );
    let answer = messages(&client, &mock, &body).await.json();
    assert_eq!(answer["content"][0]["text"], "for the next turn");

    // Reasoning, cached tokens and usage.
    mock.push(
        Reply::text("42")
            .with_reasoning("six times seven")
            .with_usage(100, 9)
            .with_cached_tokens(60),
    );
    let answer = messages(&client, &mock, &messages_body("q")).await.json();
    assert_eq!(
        answer["content"],
        json!([
            {"type": "thinking", "thinking": "six times seven", "signature": "sig_mock_4"},
            {"type": "text", "text": "42"},
        ])
    );
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": 40, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 60, "output_tokens": 9})
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn messages_tool_use_and_tool_results() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let tools = json!([
        {"name": "search", "description": "d", "input_schema": {"type": "object"}},
        {"name": "other", "input_schema": {"type": "object"}},
    ]);
    let mut body = messages_body("Please USE A TOOL");
    body["tools"] = tools.clone();
    let answer = messages(&client, &mock, &body).await.json();
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(
        answer["content"],
        json!([{"type": "tool_use", "id": "toolu_1", "name": "search",
                "input": {"query": "Please USE A TOOL"}}])
    );

    let body = json!({"model": "m", "tools": tools, "messages": [
        {"role": "user", "content": "use a tool"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"query": "x"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42 results"}]},
    ]});
    let answer = messages(&client, &mock, &body).await.json();
    assert_eq!(
        answer["content"],
        json!([{"type": "text", "text": "tool said: 42 results"}])
    );
    assert_eq!(answer["stop_reason"], "end_turn");
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text", "text": "one"}]},
        {"type": "tool_result", "tool_use_id": "b", "content": "two"},
    ]}]});
    let answer = messages(&client, &mock, &body).await.json();
    assert_eq!(answer["content"][0]["text"], "tool said: one\ntwo");

    // Scripted calls: explicit ids kept, arguments parsed into `input`, `{}` when empty.
    mock.push(
        Reply::text("Looking.")
            .with_tool_call(ToolCall::new("search", r#"{"q":"rust","n":2}"#).with_id("toolu_a"))
            .with_tool_call(ToolCall::new("noop", "")),
    );
    let answer = messages(&client, &mock, &messages_body("x")).await.json();
    assert_eq!(
        answer["content"],
        json!([
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_a", "name": "search", "input": {"q": "rust", "n": 2}},
            {"type": "tool_use", "id": "toolu_2", "name": "noop", "input": {}},
        ])
    );
    assert_eq!(answer["stop_reason"], "tool_use");
    mock.shutdown().await;
}

/// Rebuilds a message from its stream the way the Anthropic SDK does.
fn assemble_message(events: &[Value]) -> Value {
    let mut message = events[0]["message"].clone();
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    for event in events {
        match event["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!(event["index"], blocks.len());
                blocks.push(event["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let index = event["index"].as_u64().unwrap() as usize;
                let block = &mut blocks[index];
                let delta = &event["delta"];
                let append = |block: &mut Value, field: &str| {
                    let text = format!(
                        "{}{}",
                        block[field].as_str().unwrap(),
                        delta[field].as_str().unwrap()
                    );
                    block[field] = json!(text);
                };
                match delta["type"].as_str().unwrap() {
                    "text_delta" => append(block, "text"),
                    "thinking_delta" => append(block, "thinking"),
                    "signature_delta" => append(block, "signature"),
                    "input_json_delta" => {
                        partial[index].push_str(delta["partial_json"].as_str().unwrap())
                    }
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let index = event["index"].as_u64().unwrap() as usize;
                if blocks[index]["type"] == "tool_use" {
                    blocks[index]["input"] = if partial[index].is_empty() {
                        Value::Object(Map::new())
                    } else {
                        serde_json::from_str(&partial[index]).unwrap()
                    };
                }
            }
            "message_delta" => {
                message["stop_reason"] = event["delta"]["stop_reason"].clone();
                message["stop_sequence"] = event["delta"]["stop_sequence"].clone();
                message["usage"]["output_tokens"] = event["usage"]["output_tokens"].clone();
            }
            _ => {}
        }
    }
    message["content"] = Value::Array(blocks);
    message
}

#[tokio::test]
async fn messages_stream_follows_the_event_sequence_and_reassembles() {
    let reply = || {
        Reply::text("The answer is 42.")
            .with_reasoning("six times seven")
            .with_tool_call(ToolCall::new("search", r#"{"query":"rust sse"}"#))
            .with_chunks(2)
    };
    let (json, stream) = json_and_stream(MESSAGES_PATH, &messages_body("q"), reply).await;
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    assert!(!stream.text().contains("[DONE]"));
    let events = stream.json_events();
    assert_eq!(
        types(&events),
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let json = json.json();
    assert_eq!(
        events[0],
        json!({"type": "message_start", "message": {
            "id": "msg_mock_1", "type": "message", "role": "assistant", "model": "claude-mock",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": json["usage"]["input_tokens"], "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 1}}})
    );
    assert_eq!(events[1], json!({"type": "ping"}));
    assert_eq!(
        events[2],
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
    );
    assert_eq!(
        events[5],
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "signature_delta", "signature": "sig_mock_1"}})
    );
    assert_eq!(
        events[8],
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "text_delta", "text": "The answ"}})
    );
    assert_eq!(
        events[11],
        json!({"type": "content_block_start", "index": 2,
               "content_block": {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}})
    );
    assert_eq!(
        events[12],
        json!({"type": "content_block_delta", "index": 2,
               "delta": {"type": "input_json_delta", "partial_json": r##"{"query":""##}})
    );
    assert_eq!(
        events[15],
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"output_tokens": json["usage"]["output_tokens"]}})
    );
    assert_eq!(events[16], json!({"type": "message_stop"}));
    assert_eq!(assemble_message(&events), json);
}

#[tokio::test]
async fn messages_truncation_and_cut_streams() {
    let reply = || Reply::text("Once upon a").with_finish_reason("length");
    let (json, stream) = json_and_stream(MESSAGES_PATH, &messages_body("q"), reply).await;
    let json = json.json();
    assert_eq!(json["stop_reason"], "max_tokens");
    let events = stream.json_events();
    assert_eq!(assemble_message(&events), json);

    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push_many([
        Reply::text("cut short").without_done(),
        Reply::text("with sentinel")
            .with_done_sentinel()
            .with_finish_reason("stop_sequence"),
        Reply::text("never finished").disconnect_after(3),
        Reply::echo().with_crlf(),
    ]);
    let body = streaming(messages_body("q"));
    let answer = messages(&client, &mock, &body).await;
    assert!(answer.complete);
    assert_eq!(
        answer.json_events().last().unwrap()["type"],
        "message_delta"
    );

    let answer = messages(&client, &mock, &body).await;
    let raw = answer.events();
    assert_eq!(raw.last().unwrap(), &(None, "[DONE]".to_owned()));
    let events = answer.json_events();
    assert_eq!(events.last().unwrap()["type"], "message_stop");
    assert_eq!(
        events[events.len() - 2]["delta"]["stop_reason"],
        "stop_sequence"
    );

    let answer = messages(&client, &mock, &body).await;
    assert!(!answer.complete);
    assert_eq!(
        types(&answer.json_events()),
        ["message_start", "ping", "content_block_start"]
    );

    let answer = messages(&client, &mock, &body).await;
    assert!(answer.text().starts_with("event: message_start\r\ndata: {"));
    assert!(answer
        .text()
        .ends_with("event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"));
    mock.shutdown().await;
}

#[tokio::test]
async fn messages_errors_have_the_anthropic_shape() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    for (status, kind) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (529, "overloaded_error"),
    ] {
        mock.push(Reply::error(status, "nope"));
        let answer = messages(&client, &mock, &streaming(messages_body("q"))).await;
        assert_eq!(answer.status.as_u16(), status);
        assert_eq!(answer.headers["content-type"], "application/json");
        assert_eq!(
            answer.json(),
            json!({"type": "error", "error": {"type": kind, "message": "nope"}})
        );
    }

    mock.push(Reply::context_length_error());
    let answer = messages(&client, &mock, &messages_body("q")).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.json(),
        json!({"type": "error", "error": {"type": "invalid_request_error",
                                          "message": "prompt is too long: 5000 tokens > 4096 maximum"}})
    );
    assert_eq!(
        ANTHROPIC_CONTEXT_LENGTH_MESSAGE,
        "prompt is too long: 5000 tokens > 4096 maximum"
    );

    // Overloaded mid-stream: the opening events, then `event: error`.
    mock.push(Reply::stream_error("overloaded_error", "Overloaded"));
    let answer = messages(&client, &mock, &streaming(messages_body("q"))).await;
    assert_eq!(answer.status, StatusCode::OK);
    let events = answer.json_events();
    assert_eq!(types(&events), ["message_start", "ping", "error"]);
    assert_eq!(
        events[2],
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    assert!(answer.text().ends_with(
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
    ));
    // After some text.
    mock.push(Reply::text("partial").with_stream_error("api_error", "Internal server error"));
    let answer = messages(&client, &mock, &streaming(messages_body("q"))).await;
    let events = answer.json_events();
    assert_eq!(events[events.len() - 2]["type"], "content_block_stop");
    assert_eq!(events.last().unwrap()["error"]["type"], "api_error");
    // Without a stream it is an HTTP error with the status the type implies.
    mock.push(Reply::stream_error("overloaded_error", "Overloaded"));
    let answer = messages(&client, &mock, &messages_body("q")).await;
    assert_eq!(answer.status.as_u16(), 529);
    assert_eq!(answer.json()["error"]["type"], "overloaded_error");

    // responses_failed elsewhere is a plain 500.
    mock.push(Reply::responses_failed("server_error", "boom"));
    let answer = messages(&client, &mock, &messages_body("q")).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.json(),
        json!({"type": "error", "error": {"type": "api_error", "message": "boom"}})
    );

    // Errors the mock makes itself.
    let answer = send_with(
        &client,
        &mock,
        Method::POST,
        MESSAGES_PATH,
        ANTHROPIC_HEADERS,
        "{oops",
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.json()["type"], "error");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    let answer = messages(&client, &mock, &json!({"model": "m"})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.json()["error"]["message"],
        "messages: Field required"
    );
    for path in [MESSAGES_PATH, COUNT_TOKENS_PATH] {
        let answer = send_with(&client, &mock, Method::GET, path, &[], "").await;
        assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(answer.headers["allow"], "POST");
        assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    }
    let answer = send_with(&client, &mock, Method::POST, COUNT_TOKENS_PATH, &[], "[]").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.json()["type"], "error");
    assert_eq!(mock.pending_replies(), 0);
    mock.shutdown().await;
}

#[tokio::test]
async fn each_route_renders_the_same_reply_in_its_dialect() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push_many([
        Reply::text("same"),
        Reply::text("same"),
        Reply::text("same"),
        Reply::error(503, "busy"),
        Reply::error(503, "busy"),
    ]);
    let chat = json!({"messages": [{"role": "user", "content": "q"}]});
    let answer = send_with(
        &client,
        &mock,
        Method::POST,
        "/v1/chat/completions",
        &[],
        &chat.to_string(),
    )
    .await;
    assert_eq!(answer.json()["choices"][0]["message"]["content"], "same");
    let answer = responses(&client, &mock, &responses_body("q")).await;
    assert_eq!(answer.json()["output"][0]["content"][0]["text"], "same");
    let answer = messages(&client, &mock, &messages_body("q")).await;
    assert_eq!(answer.json()["content"][0]["text"], "same");
    let answer = responses(&client, &mock, &responses_body("q")).await;
    assert_eq!(answer.json()["error"]["type"], "server_error");
    let answer = messages(&client, &mock, &messages_body("q")).await;
    assert_eq!(answer.json()["error"]["type"], "overloaded_error");

    let paths: Vec<String> = mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            RESPONSES_PATH,
            MESSAGES_PATH,
            RESPONSES_PATH,
            MESSAGES_PATH
        ]
    );
    mock.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// What intercept itself reads from these streams

/// Feeds a stream to the dialect's assembler, as the server does.
fn assemble_with(
    dialect: &dyn intercept_core::Dialect,
    stream: &Answer,
) -> Result<intercept_core::internal::Assembled, intercept_core::Error> {
    let mut assembler = dialect.assembler(&intercept_core::internal::Prepared {
        stream: true,
        hide_stream_usage: false,
    });
    let mut splitter = intercept_core::internal::SseSplitter::new();
    splitter.push(&stream.body);
    while let Some(event) = splitter.next_event() {
        assembler.push(&intercept_core::internal::SseEvent::new(&event));
    }
    assembler.finish()
}

#[tokio::test]
async fn intercept_core_assembles_the_streams_into_the_json_answers() {
    let reply = || {
        Reply::text("The answer is 42.")
            .with_reasoning("six times seven")
            .with_tool_call(ToolCall::new("search", r#"{"query":"rust sse"}"#))
            .with_cached_tokens(2)
            .with_chunks(3)
    };
    let cases: [(&str, Value, &dyn intercept_core::Dialect); 2] = [
        (
            RESPONSES_PATH,
            responses_body("q"),
            &intercept_core::ResponsesDialect,
        ),
        (
            MESSAGES_PATH,
            messages_body("q"),
            &intercept_core::MessagesDialect,
        ),
    ];
    for (path, body, dialect) in cases {
        let (json, stream) = json_and_stream(path, &body, reply).await;
        let assembled = assemble_with(dialect, &stream).unwrap();
        assert_eq!(assembled.response.to_value(), json.json(), "{path}");
        let summary = dialect.summarize(&json.body).unwrap();
        assert_eq!(assembled.summary, summary, "{path}");
        assert_eq!(
            summary.finish_reason.as_deref(),
            Some("tool_calls"),
            "{path}"
        );
        assert_eq!(summary.usage.cached_input_tokens, 2, "{path}");

        // A stream cut before its terminal event, or ending in an error event, is no answer.
        for reply in [
            || Reply::text("cut").without_done(),
            || Reply::text("cut").with_stream_error("overloaded_error", "Overloaded"),
        ] {
            let (_, stream) = json_and_stream(path, &body, reply).await;
            assert!(assemble_with(dialect, &stream).is_err(), "{path}");
        }
    }

    let (json, stream) = json_and_stream(RESPONSES_PATH, &responses_body("q"), || {
        Reply::text("Once upon a").with_finish_reason("length")
    })
    .await;
    let summary = intercept_core::ResponsesDialect
        .summarize(&json.body)
        .unwrap();
    assert_eq!(summary.finish_reason.as_deref(), Some("length"));
    let assembled = assemble_with(&intercept_core::ResponsesDialect, &stream).unwrap();
    assert_eq!(assembled.summary, summary);
}
