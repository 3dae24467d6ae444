//! The mock upstream through its public API, with real HTTP clients.

// Clippy only exempts `#[test]` functions, not the helpers of an integration test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use intercept_mock::{
    MockConfig, MockUpstream, Reply, RequestBody, ToolCall, CONTEXT_LENGTH_MESSAGE,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn request(method: Method, uri: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .header("X-Custom-Header", "Mixed")
        .body(Full::new(body.into()))
        .unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    /// The payloads of the `data:` events of an LF-framed stream.
    fn events(&self) -> Vec<String> {
        sse_payloads(self.text(), "\n\n")
    }

    /// The JSON chunks of the stream (every event but `[DONE]`).
    fn chunks(&self) -> Vec<Value> {
        self.events()
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }
}

fn sse_payloads(text: &str, delimiter: &str) -> Vec<String> {
    assert!(
        text.ends_with(delimiter),
        "stream must end with a complete event: {text:?}"
    );
    text.split(delimiter)
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_owned()
        })
        .collect()
}

async fn read(response: hyper::Response<Incoming>) -> Answer {
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn post(client: &HttpClient, mock: &MockUpstream, body: &Value) -> Answer {
    let uri = mock.chat_completions_url();
    let response = client
        .request(request(Method::POST, &uri, body.to_string()))
        .await
        .unwrap();
    read(response).await
}

async fn send(
    client: &HttpClient,
    mock: &MockUpstream,
    method: Method,
    path: &str,
    body: &str,
) -> Answer {
    let uri = format!("http://{}{path}", mock.addr());
    let response = client
        .request(request(method, &uri, body.to_owned()))
        .await
        .unwrap();
    read(response).await
}

fn chat(text: &str) -> Value {
    json!({
        "model": "policy-7b",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": text},
        ],
    })
}

fn streaming(mut body: Value, include_usage: bool) -> Value {
    body["stream"] = json!(true);
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn with_tools(mut body: Value) -> Value {
    body["tools"] = json!([
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]);
    body
}

/// Concatenates the `delta.content` of every chunk.
fn streamed_content(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test]
async fn echo_reply_has_the_openai_shape() {
    let mock = MockUpstream::start().await.unwrap();
    assert_eq!(
        mock.base_url(),
        format!("http://127.0.0.1:{}/v1", mock.addr().port())
    );
    let client = client();

    let answer = post(&client, &mock, &chat("hello mock world")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "application/json");
    let expected = json!({
        "id": "chatcmpl-mock-1",
        "object": "chat.completion",
        "created": MockConfig::FIXED_CREATED,
        "model": "policy-7b",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "echo: hello mock world"},
            "finish_reason": "stop",
            "logprobs": null,
        }],
        // prompt: 3 + 3 words, plus 4 per message; completion: 4 words.
        "usage": {"prompt_tokens": 14, "completion_tokens": 4, "total_tokens": 18},
    });
    assert_eq!(answer.json(), expected);

    // Ids count up; a request without a model gets the default one.
    let answer = post(
        &client,
        &mock,
        &json!({"messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(answer.json()["id"], "chatcmpl-mock-2");
    assert_eq!(answer.json()["model"], "mock-model");
    mock.shutdown().await;
}

#[tokio::test]
async fn echo_uses_the_last_user_message_and_content_parts() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let body = json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": [
                {"type": "text", "text": "look at"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "this"},
            ]},
        ],
    });
    let answer = post(&client, &mock, &body).await.json();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "echo: look at\nthis"
    );
    assert_eq!(answer["usage"]["prompt_tokens"], 2 + 2 + 3 + 12);
}

#[tokio::test]
async fn streamed_echo_reassembles_to_the_same_content() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let text = "the quick brown fox jumps over the lazy dog";

    let plain = post(&client, &mock, &chat(text)).await.json();
    let answer = post(&client, &mock, &streaming(chat(text), true)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "text/event-stream");
    assert!(
        answer.headers.get("content-length").is_none(),
        "streams are chunked"
    );

    let events = answer.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = answer.chunks();
    // role chunk, 4 content pieces, finish chunk, usage chunk
    assert_eq!(chunks.len(), 7, "{events:#?}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], "chatcmpl-mock-2");
        assert_eq!(chunk["model"], "policy-7b");
        assert_eq!(chunk["created"], MockConfig::FIXED_CREATED);
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(chunks[0]["choices"][0]["finish_reason"].is_null());
    for piece in &chunks[1..5] {
        assert!(!piece["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .is_empty());
    }
    assert_eq!(
        streamed_content(&chunks),
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(chunks[5]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[5]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[6]["choices"], json!([]));
    assert_eq!(chunks[6]["usage"], plain["usage"]);

    // Without include_usage there is no usage chunk; the chunk count follows the config.
    let answer = post(&client, &mock, &streaming(chat(text), false)).await;
    let chunks = answer.chunks();
    assert_eq!(chunks.len(), 6);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn chunk_count_is_configurable_globally_and_per_reply() {
    let config = MockConfig {
        chunks: 2,
        ..MockConfig::default()
    };
    let mock = MockUpstream::start_with(config).await.unwrap();
    let client = client();
    let body = streaming(chat("one two three four five six"), false);

    let chunks = post(&client, &mock, &body).await.chunks();
    assert_eq!(chunks.len(), 1 + 2 + 1);
    assert_eq!(
        streamed_content(&chunks),
        "echo: one two three four five six"
    );

    mock.push(Reply::text("abcdefghij").with_chunks(10));
    let chunks = post(&client, &mock, &body).await.chunks();
    assert_eq!(chunks.len(), 1 + 10 + 1);
    let pieces: Vec<&str> = chunks[1..11]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(pieces, ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]);
}

#[tokio::test]
async fn echo_calls_the_first_tool_when_asked() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let body = with_tools(chat("Please USE A TOOL to find rust docs"));

    let answer = post(&client, &mock, &body).await.json();
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null());
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "search");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        arguments,
        json!({"query": "Please USE A TOOL to find rust docs"})
    );

    // Without tools the same text is echoed.
    let answer = post(&client, &mock, &chat("use a tool")).await.json();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "echo: use a tool"
    );

    // After the tool answered, the model reports what the tool said.
    let mut body = body;
    body["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": null, "tool_calls": calls}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "found 3 pages"}),
    ]);
    let answer = post(&client, &mock, &body).await.json();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "tool said: found 3 pages"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn streamed_tool_calls_follow_openai_deltas() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let body = streaming(with_tools(chat("use a tool: weather in Paris")), true);

    let chunks = post(&client, &mock, &body).await.chunks();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"].get("tool_calls"))
        .collect();
    assert_eq!(deltas.len(), 1 + 4, "head plus 4 argument fragments");
    let head = &deltas[0][0];
    assert_eq!(head["index"], 0);
    assert_eq!(head["id"], "call_1");
    assert_eq!(head["type"], "function");
    assert_eq!(head["function"], json!({"name": "search", "arguments": ""}));
    let mut arguments = String::new();
    for fragment in &deltas[1..] {
        let fragment = &fragment[0];
        assert_eq!(fragment["index"], 0);
        assert!(fragment.get("id").is_none() && fragment["function"].get("name").is_none());
        arguments.push_str(fragment["function"]["arguments"].as_str().unwrap());
    }
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"query": "use a tool: weather in Paris"})
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    assert!(chunks.iter().all(|c| c["choices"]
        .get(0)
        .is_none_or(|choice| choice["delta"].get("content").is_none_or(|c| c == ""))));

    // Scripted: several calls, given and generated ids, each with its own index.
    mock.push(
        Reply::tool_calls([
            ToolCall::new("a", r#"{"x":1}"#).with_id("call_a"),
            ToolCall::new("b", r#"{"y":2}"#),
        ])
        .with_chunks(1),
    );
    let chunks = post(&client, &mock, &body).await.chunks();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"].get("tool_calls"))
        .map(|calls| &calls[0])
        .collect();
    assert_eq!(deltas.len(), 4);
    assert_eq!(
        (&deltas[0]["index"], &deltas[0]["id"]),
        (&json!(0), &json!("call_a"))
    );
    assert_eq!(deltas[1]["function"]["arguments"], r#"{"x":1}"#);
    assert_eq!(
        (&deltas[2]["index"], &deltas[2]["id"]),
        (&json!(1), &json!("call_2"))
    );
    assert_eq!(deltas[3]["function"]["arguments"], r#"{"y":2}"#);
}

#[tokio::test]
async fn scripted_replies_are_used_in_order_then_echo_resumes() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push_many([
        Reply::text("first")
            .with_finish_reason("length")
            .with_usage(100, 7),
        Reply::text("second").with_model("served-model"),
    ]);
    assert_eq!(mock.pending_replies(), 2);

    let first = post(&client, &mock, &chat("q")).await.json();
    assert_eq!(first["choices"][0]["message"]["content"], "first");
    assert_eq!(first["choices"][0]["finish_reason"], "length");
    assert_eq!(
        first["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107})
    );
    let second = post(&client, &mock, &chat("q")).await.json();
    assert_eq!(second["choices"][0]["message"]["content"], "second");
    assert_eq!(second["model"], "served-model");
    let third = post(&client, &mock, &chat("q")).await.json();
    assert_eq!(third["choices"][0]["message"]["content"], "echo: q");
    assert_eq!(mock.pending_replies(), 0);

    mock.push(Reply::text("never used"));
    mock.clear_replies();
    let fourth = post(&client, &mock, &chat("q")).await.json();
    assert_eq!(fourth["choices"][0]["message"]["content"], "echo: q");
}

#[tokio::test]
async fn scripted_error_carries_status_body_and_retry_after() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(Reply::error(429, "Rate limit reached").with_retry_after(7));
    mock.push(Reply::error(503, "overloaded"));

    let answer = post(&client, &mock, &chat("q")).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.headers["retry-after"], "7");
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(
        answer.json(),
        json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error", "param": null, "code": null}})
    );

    // An error ignores "stream": true.
    let answer = post(&client, &mock, &streaming(chat("q"), false)).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(answer.headers.get("retry-after").is_none());
    assert_eq!(answer.json()["error"]["type"], "server_error");

    // The queue is drained: echo again.
    assert_eq!(
        post(&client, &mock, &chat("q")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn context_length_error_and_raw_bodies() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push_many([
        Reply::context_length_error(),
        Reply::raw(
            200,
            "application/json",
            r#"{"id": "chatcmpl-1", "choices": [ "#,
        ),
        Reply::raw(502, "text/html", "<html><body>Bad gateway</body></html>"),
        Reply::error_json(
            400,
            json!({"object": "error", "message": "vLLM style", "code": 400}),
        ),
    ]);

    let answer = post(&client, &mock, &chat("a very long prompt")).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let error = &answer.json()["error"];
    assert_eq!(error["message"], CONTEXT_LENGTH_MESSAGE);
    assert_eq!(
        CONTEXT_LENGTH_MESSAGE,
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens."
    );
    assert_eq!(error["code"], "context_length_exceeded");

    // JSON (and malformed at that) to a streaming request.
    let answer = post(&client, &mock, &streaming(chat("q"), false)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(answer.text(), r#"{"id": "chatcmpl-1", "choices": [ "#);

    let answer = post(&client, &mock, &chat("q")).await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    assert_eq!(answer.headers["content-type"], "text/html");
    assert!(answer.text().starts_with("<html>"));

    let answer = post(&client, &mock, &chat("q")).await;
    assert_eq!(
        answer.json(),
        json!({"object": "error", "message": "vLLM style", "code": 400})
    );
}

#[tokio::test]
async fn scripted_replies_answer_any_post_path() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(Reply::events([
        "event: response.created\ndata: {\"type\":\"response.created\"}\n\n",
        ": a comment\n\n",
        "data: {\"type\":\"response.completed\"}\n\n",
    ]));
    let answer = send(&client, &mock, Method::POST, "/v1/responses", "{}").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["content-type"], "text/event-stream");
    assert_eq!(
        answer.text(),
        "event: response.created\ndata: {\"type\":\"response.created\"}\n\n: a comment\n\ndata: {\"type\":\"response.completed\"}\n\n"
    );
    // A path of no dialect takes scripted replies too...
    mock.push(Reply::text("embedded"));
    let answer = send(&client, &mock, Method::POST, "/v1/embeddings", "{}").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.json()["choices"][0]["message"]["content"],
        "embedded"
    );
    // ... but with the queue empty it is unknown.
    let answer = send(&client, &mock, Method::POST, "/v1/embeddings", "{}").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(
        answer.json()["error"]["message"],
        "Invalid URL (POST /v1/embeddings)"
    );
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();

    let answer = send(
        &client,
        &mock,
        Method::POST,
        "/v1/chat/completions",
        "not json {",
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let error = &answer.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("could not parse the JSON body"));

    let answer = send(
        &client,
        &mock,
        Method::POST,
        "/v1/chat/completions",
        r#"{"model":"m"}"#,
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("messages"));

    let answer = send(
        &client,
        &mock,
        Method::POST,
        "/v1/chat/completions",
        r#"{"messages":"x"}"#,
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Invalid chat completion request"));

    let answer = send(&client, &mock, Method::GET, "/v1/chat/completions", "").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.headers["allow"], "POST");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");

    let answer = send(&client, &mock, Method::POST, "/nope", "{}").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);

    // A GET never takes a scripted reply.
    mock.push(Reply::text("for the POST"));
    let answer = send(&client, &mock, Method::GET, "/v1/files", "").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(mock.pending_replies(), 1);
    assert_eq!(mock.request_count(), 6);
}

#[tokio::test]
async fn request_log_records_what_arrived() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let body = streaming(chat("log me"), false);
    post(&client, &mock, &body).await;
    send(
        &client,
        &mock,
        Method::POST,
        "/v1/chat/completions?debug=1",
        "plain text",
    )
    .await;
    mock.wait_for_requests(2).await;

    let log = mock.requests();
    assert_eq!(log.len(), 2);
    assert_eq!(mock.request_count(), 2);
    let first = &log[0];
    assert_eq!(first.seq, 0);
    assert_eq!(first.method, Method::POST);
    assert_eq!(first.path, "/v1/chat/completions");
    assert_eq!(first.query, None);
    assert_eq!(first.version, Version::HTTP_11);
    assert_eq!(first.headers["authorization"], "Bearer sk-test");
    assert_eq!(first.headers["x-custom-header"], "Mixed");
    assert_eq!(first.header("X-Custom-Header"), Some("Mixed"));
    assert!(first
        .headers
        .keys()
        .all(|name| *name == name.to_lowercase()));
    assert_eq!(first.json(), Some(&body));
    assert!(first.is_stream());

    let second = &log[1];
    assert_eq!(second.seq, 1);
    assert_eq!(second.query.as_deref(), Some("debug=1"));
    assert_eq!(second.body, RequestBody::Text("plain text".to_owned()));
    assert!(second.received_at >= first.received_at);

    let taken = mock.take_requests();
    assert_eq!(taken.len(), 2);
    assert!(mock.requests().is_empty());
    post(&client, &mock, &chat("again")).await;
    assert_eq!(mock.last_request().unwrap().seq, 2);
    assert_eq!(mock.request_count(), 3);
}

#[tokio::test]
async fn fast_mode_counts_but_does_not_log() {
    let mock = MockUpstream::start_with(MockConfig::fast()).await.unwrap();
    let client = client();
    let answer = post(&client, &mock, &chat("quick")).await;
    assert_eq!(
        answer.json()["choices"][0]["message"]["content"],
        "echo: quick"
    );
    let answer = post(&client, &mock, &streaming(chat("quick"), false)).await;
    assert_eq!(streamed_content(&answer.chunks()), "echo: quick");
    mock.wait_for_requests(2).await;
    assert_eq!(mock.request_count(), 2);
    assert!(mock.requests().is_empty());
}

/// Sends `body` on an HTTP/1.1 connection and reads the whole response.
async fn send_on(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    mock: &MockUpstream,
    body: &Value,
) -> Answer {
    sender.ready().await.unwrap();
    let mut req = request(Method::POST, "/v1/chat/completions", body.to_string());
    req.headers_mut()
        .insert("host", mock.addr().to_string().parse().unwrap());
    read(sender.send_request(req).await.unwrap()).await
}

async fn http1_connection(
    mock: &MockUpstream,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = TcpStream::connect(mock.addr()).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

#[tokio::test]
async fn keep_alive_reuses_one_connection() {
    let mock = MockUpstream::start().await.unwrap();
    let (mut sender, _task) = http1_connection(&mock).await;
    for text in ["one", "two", "three"] {
        let answer = send_on(&mut sender, &mock, &chat(text)).await;
        assert_eq!(
            answer.json()["choices"][0]["message"]["content"],
            format!("echo: {text}")
        );
    }
    // A stream, then a plain reply, on the same connection.
    let answer = send_on(&mut sender, &mock, &streaming(chat("four"), true)).await;
    assert_eq!(streamed_content(&answer.chunks()), "echo: four");
    send_on(&mut sender, &mock, &chat("five")).await;
    assert_eq!(mock.connections(), 1);
    assert_eq!(mock.open_connections(), 1);
    assert!(mock.requests().iter().all(|r| r.connection == 1));

    let (mut other, _task) = http1_connection(&mock).await;
    send_on(&mut other, &mock, &chat("six")).await;
    assert_eq!(mock.connections(), 2);
    assert_eq!(mock.last_request().unwrap().connection, 2);
    assert_eq!(mock.request_count(), 6);
}

#[tokio::test]
async fn h2c_requests_share_one_connection() {
    let mock = MockUpstream::start().await.unwrap();
    let tcp = TcpStream::connect(mock.addr()).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let requests = (0..8).map(|i| {
        let mut sender = sender.clone();
        let uri = mock.chat_completions_url();
        async move {
            let req = Request::builder()
                .method(Method::POST)
                .uri(uri)
                .body(Full::new(Bytes::from(
                    streaming(chat(&format!("h2 {i}")), false).to_string(),
                )))
                .unwrap();
            let answer = read(sender.send_request(req).await.unwrap()).await;
            (i, answer)
        }
    });
    for (i, answer) in futures_util::future::join_all(requests).await {
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(streamed_content(&answer.chunks()), format!("echo: h2 {i}"));
    }
    assert_eq!(mock.connections(), 1);
    assert!(mock.requests().iter().all(|r| r.version == Version::HTTP_2));
    mock.shutdown().await;
}

/// The body ended because the connection closed before the chunked body's end.
fn assert_unexpected_eof(error: &hyper::Error) {
    let io = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .unwrap_or_else(|| panic!("not an I/O error: {error:?}"));
    assert_eq!(io.kind(), std::io::ErrorKind::UnexpectedEof, "{error:?}");
}

#[tokio::test]
async fn disconnect_mid_stream_cuts_the_body() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(Reply::text("this stream will break").disconnect_after(3));

    let uri = mock.chat_completions_url();
    let body = streaming(chat("q"), false).to_string();
    let response = client
        .request(request(Method::POST, &uri, body))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = Vec::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => received.extend_from_slice(frame.data_ref().unwrap()),
            Some(Err(error)) => break error,
            None => panic!(
                "the body ended cleanly: {}",
                String::from_utf8_lossy(&received)
            ),
        }
    };
    assert_unexpected_eof(&error);
    let received = String::from_utf8(received).unwrap();
    let events = sse_payloads(&received, "\n\n");
    assert_eq!(events.len(), 3, "{received}");
    assert!(!received.contains("[DONE]"));

    // The mock itself is fine: the next request (on a new connection) works.
    assert_eq!(
        post(&client, &mock, &chat("q")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn disconnect_of_a_plain_reply_sends_half_a_body() {
    let mock = MockUpstream::start().await.unwrap();
    mock.push(Reply::text("a plain body").disconnect_after(0));
    let (mut sender, _task) = http1_connection(&mock).await;
    sender.ready().await.unwrap();
    let mut req = request(Method::POST, "/v1/chat/completions", chat("q").to_string());
    req.headers_mut().insert("host", "mock".parse().unwrap());
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("content-length").is_none());
    let mut body = response.into_body();
    let mut received = Vec::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => received.extend_from_slice(frame.data_ref().unwrap()),
            Some(Err(error)) => break error,
            None => panic!("the body ended cleanly"),
        }
    };
    assert_unexpected_eof(&error);
    let received = String::from_utf8(received).unwrap();
    assert!(
        received.starts_with(r#"{"id":"chatcmpl-mock-1""#),
        "{received}"
    );
    assert!(
        serde_json::from_str::<Value>(&received).is_err(),
        "only half a document"
    );
}

#[tokio::test]
async fn dropped_connection_gets_no_response() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(Reply::drop_connection());
    let uri = mock.chat_completions_url();
    let result = client
        .request(request(Method::POST, &uri, chat("q").to_string()))
        .await;
    assert!(result.is_err(), "expected no response, got {result:?}");
    assert_eq!(mock.request_count(), 1);
    assert_eq!(
        post(&client, &mock, &chat("q")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn stream_without_done_ends_cleanly_after_the_finish_chunk() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(Reply::text("no sentinel").without_done());
    let answer = post(&client, &mock, &streaming(chat("q"), true)).await;
    let events = answer.events();
    assert!(events.iter().all(|e| e != "[DONE]"));
    let chunks = answer.chunks();
    assert_eq!(
        chunks.last().unwrap()["choices"],
        json!([]),
        "usage chunk last"
    );
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(streamed_content(&chunks), "no sentinel");
}

#[tokio::test]
async fn crlf_events() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(Reply::text("carriage returns").with_crlf());
    let answer = post(&client, &mock, &streaming(chat("q"), false)).await;
    let text = answer.text();
    assert!(text.contains("\r\n\r\n"));
    for (i, byte) in text.bytes().enumerate() {
        if byte == b'\n' {
            assert_eq!(text.as_bytes()[i - 1], b'\r', "bare LF at {i}");
        }
    }
    let events = sse_payloads(text, "\r\n\r\n");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let content: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, "carriage returns");
}

#[tokio::test]
async fn reasoning_is_streamed_before_content() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    mock.push(
        Reply::text("42")
            .with_reasoning("six times seven")
            .with_chunks(3),
    );
    mock.push(Reply::text("42").with_reasoning("six times seven"));

    let chunks = post(&client, &mock, &streaming(chat("q"), false))
        .await
        .chunks();
    let kinds: Vec<&str> = chunks[1..chunks.len() - 1]
        .iter()
        .map(|c| {
            let delta = &c["choices"][0]["delta"];
            if delta.get("reasoning_content").is_some() {
                "reasoning"
            } else {
                "content"
            }
        })
        .collect();
    assert_eq!(
        kinds,
        ["reasoning", "reasoning", "reasoning", "content", "content"]
    );
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["reasoning_content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(reasoning, "six times seven");
    assert_eq!(streamed_content(&chunks), "42");

    let answer = post(&client, &mock, &chat("q")).await.json();
    assert_eq!(
        answer["choices"][0]["message"]["reasoning_content"],
        "six times seven"
    );
    assert_eq!(answer["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn delays_before_headers_and_between_chunks() {
    let mock = MockUpstream::start().await.unwrap();
    let client = client();
    let header_delay = Duration::from_millis(60);
    let chunk_delay = Duration::from_millis(25);
    mock.push(Reply::echo().with_header_delay(header_delay));
    mock.push(
        Reply::text("abcd")
            .with_chunks(4)
            .with_chunk_delay(chunk_delay),
    );

    let started = Instant::now();
    let answer = post(&client, &mock, &chat("slow")).await;
    assert_eq!(
        answer.json()["choices"][0]["message"]["content"],
        "echo: slow"
    );
    assert!(started.elapsed() >= header_delay);

    let started = Instant::now();
    let answer = post(&client, &mock, &streaming(chat("q"), false)).await;
    // role + 4 pieces + finish + [DONE]: 6 pauses.
    assert_eq!(answer.events().len(), 7);
    assert!(
        started.elapsed() >= chunk_delay * 6,
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn shutdown_releases_a_hanging_request() {
    let mock = MockUpstream::start().await.unwrap();
    mock.push(Reply::hang());
    let client = client();
    let uri = mock.chat_completions_url();
    let pending = tokio::spawn(client.request(request(Method::POST, &uri, chat("q").to_string())));
    mock.wait_for_requests(1).await;
    assert_eq!(mock.open_connections(), 1);
    mock.shutdown().await;
    let result = pending.await.unwrap();
    assert!(
        result.is_err(),
        "a hung request ends with a closed connection: {result:?}"
    );
}

#[tokio::test]
async fn dropping_the_mock_stops_serving() {
    let mock = MockUpstream::start().await.unwrap();
    let addr = mock.addr();
    let (mut sender, task) = http1_connection(&mock).await;
    send_on(&mut sender, &mock, &chat("q")).await;
    drop(mock);
    // The open connection is closed by the server...
    task.await.unwrap();
    assert!(sender.is_closed());
    // ...and a new connection is not served (refused or closed without an answer).
    if let Ok(mut tcp) = TcpStream::connect(addr).await {
        let _ = tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = Vec::new();
        let read = tcp.read_to_end(&mut buf).await;
        assert!(
            read.is_err() || buf.is_empty(),
            "got {:?}",
            String::from_utf8_lossy(&buf)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_connections() {
    let mock = MockUpstream::start_with(MockConfig::fast()).await.unwrap();
    const N: usize = 500;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let addr = mock.addr();
        tasks.spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn);
            let body = if i % 2 == 0 {
                streaming(chat(&format!("n{i}")), true)
            } else {
                chat(&format!("n{i}"))
            };
            let req = Request::builder()
                .method(Method::POST)
                .uri("/v1/chat/completions")
                .header("host", "mock")
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            let answer = read(sender.send_request(req).await.unwrap()).await;
            assert_eq!(answer.status, StatusCode::OK);
            let content = if i % 2 == 0 {
                streamed_content(&answer.chunks())
            } else {
                answer.json()["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            };
            assert_eq!(content, format!("echo: n{i}"));
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    assert_eq!(mock.connections(), N);
    assert_eq!(mock.request_count(), N);
    mock.shutdown().await;
}

#[tokio::test]
async fn garbage_on_the_socket_does_not_hurt_the_server() {
    let mock = MockUpstream::start().await.unwrap();
    let mut tcp = TcpStream::connect(mock.addr()).await.unwrap();
    tcp.write_all(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tcp.read_to_end(&mut buf).await;
    // A body that lies about its length: the client gives up half way.
    let mut tcp = TcpStream::connect(mock.addr()).await.unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"mess",
    )
    .await
    .unwrap();
    drop(tcp);
    let client = client();
    let answer = post(&client, &mock, &chat("still alive")).await;
    assert_eq!(
        answer.json()["choices"][0]["message"]["content"],
        "echo: still alive"
    );
    mock.wait_for_connections(3).await;
    assert_eq!(mock.connections(), 3);
}

#[tokio::test]
async fn config_body_limit_current_time_and_extra_headers() {
    let config = MockConfig {
        max_body_bytes: 64,
        created: None,
        default_model: "house-model".to_owned(),
        ..MockConfig::default()
    };
    let mock = MockUpstream::start_with(config).await.unwrap();
    let client = client();

    let answer = post(&client, &mock, &chat(&"long ".repeat(40))).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    assert_eq!(mock.request_count(), 1);

    mock.push(Reply::echo().with_header(
        http::HeaderName::from_static("x-request-id"),
        http::HeaderValue::from_static("req-1"),
    ));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let answer = post(&client, &mock, &json!({"messages": []})).await;
    assert_eq!(answer.headers["x-request-id"], "req-1");
    let body = answer.json();
    assert!(body["created"].as_u64().unwrap() >= before);
    assert_eq!(body["model"], "house-model");
    assert_eq!(body["choices"][0]["message"]["content"], "echo: ");
    assert_eq!(body["usage"]["prompt_tokens"], 0);
}
