//! Episodes end to end: `async-openai` runs a three-turn tool loop, streamed and not,
//! through the server against a vLLM-like engine whose chat template is prefix-stable;
//! the episode's one branch is exactly the engine's last prompt ids + completion ids, its
//! mask covers the three completions and its logprobs line up with them.

use std::convert::Infallible;
use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{CreateChatCompletionRequest, CreateChatCompletionResponse};
use async_openai::Client;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use intercept_core::{Interception, RolloutSession, SessionConfig, TokenCapture, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const END: u32 = 100_000;

fn word_id(w: &str) -> u32 {
    w.bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 90_000
}

fn role_id(role: &str) -> u32 {
    match role {
        "system" => 100_001,
        "user" => 100_002,
        "assistant" => 100_003,
        _ => 100_004,
    }
}

/// The template's tokens of a message body (no role token): content words, tool calls,
/// then an end token. Rendering a sampled turn gives back exactly its completion ids.
fn body_ids(m: &Value) -> Vec<u32> {
    let mut out: Vec<u32> = m["content"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .map(word_id)
        .collect();
    for call in m["tool_calls"].as_array().into_iter().flatten() {
        out.push(word_id(
            call["function"]["name"].as_str().unwrap_or_default(),
        ));
        out.push(word_id(
            call["function"]["arguments"].as_str().unwrap_or_default(),
        ));
    }
    out.push(END);
    out
}

fn prompt_ids(messages: &[Value]) -> Vec<u32> {
    let mut out = Vec::new();
    for m in messages {
        out.push(role_id(m["role"].as_str().unwrap_or("user")));
        out.extend(body_ids(m));
    }
    out.push(role_id("assistant"));
    out
}

fn logprob(i: usize) -> f64 {
    -((i % 5) as f64 + 1.0) / 4.0
}

/// The engine's turn: a tool call until two tool results are in, then an answer.
fn reply(messages: &[Value]) -> (Value, &'static str) {
    let done = messages.iter().filter(|m| m["role"] == "tool").count();
    if done < 2 {
        (
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{done}"), "type": "function",
                "function": {"name": "run", "arguments": format!("{{\"step\":{done}}}")}}]}),
            "tool_calls",
        )
    } else {
        (
            json!({"role": "assistant", "content": "all two steps done"}),
            "stop",
        )
    }
}

async fn answer(req: http::Request<hyper::body::Incoming>) -> http::Response<Full<Bytes>> {
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes());
    let body: Value = bytes
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let prompt = prompt_ids(&messages);
    let (message, finish) = reply(&messages);
    let completion = body_ids(&message);
    let ids = body["return_token_ids"] == true;
    let lps = json!({"content": (0..completion.len()).map(|i| json!({"token": "t", "logprob": logprob(i), "bytes": [116], "top_logprobs": []})).collect::<Vec<_>>()});
    let lps = if body["logprobs"] == true {
        lps
    } else {
        Value::Null
    };
    let (token_ids, prompt_token_ids) = if ids {
        (json!(completion), json!(prompt))
    } else {
        (Value::Null, Value::Null)
    };
    let usage = json!({"prompt_tokens": prompt.len(), "completion_tokens": completion.len(), "total_tokens": prompt.len() + completion.len()});
    if body["stream"] != true {
        let v = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "policy",
            "choices": [{"index": 0, "message": message, "logprobs": lps, "finish_reason": finish, "token_ids": token_ids}],
            "usage": usage, "prompt_token_ids": prompt_token_ids});
        return http::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .expect("response");
    }
    let chunk = |delta: Value, lps: Value, finish: Value, ids: Value, prompt: Option<Value>| {
        let mut v = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "policy",
            "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish, "token_ids": ids}]});
        if let Some(p) = prompt {
            v["prompt_token_ids"] = p;
        }
        format!("data: {v}\n\n")
    };
    let empty = if ids { json!([]) } else { Value::Null };
    let mut delta = json!({});
    if let Some(c) = message["content"].as_str() {
        delta["content"] = json!(c);
    }
    if let Some(calls) = message["tool_calls"].as_array() {
        delta["tool_calls"] = Value::Array(
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut c = c.clone();
                    c["index"] = json!(i);
                    c
                })
                .collect(),
        );
    }
    let mut out = chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        Value::Null,
        empty.clone(),
        Some(prompt_token_ids),
    );
    out += &chunk(delta, lps, Value::Null, token_ids, None);
    out += &chunk(json!({}), Value::Null, json!(finish), empty, None);
    if body["stream_options"]["include_usage"] == true {
        out += &format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "policy", "choices": [], "usage": usage})
        );
    }
    out += "data: [DONE]\n\n";
    http::Response::builder()
        .header("content-type", "text/event-stream")
        .body(Full::new(Bytes::from(out)))
        .expect("response")
}

struct Engine {
    url: String,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Engine {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (st, t) = (stop.clone(), tasks.clone());
        tasks.spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = st.cancelled() => break,
                    r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                };
                let st = st.clone();
                t.spawn(async move {
                    let service =
                        service_fn(|req| async move { Ok::<_, Infallible>(answer(req).await) });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    tokio::select! {
                        _ = st.cancelled() => {}
                        _ = builder.serve_connection(TokioIo::new(stream), service) => {}
                    }
                });
            }
        });
        Engine { url, stop, tasks }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// One streamed turn, assembled from the chunks the harness got.
async fn streamed_turn(client: &Client<OpenAIConfig>, messages: &[Value]) -> Value {
    let request: CreateChatCompletionRequest =
        serde_json::from_value(json!({"model": "gpt-4o", "stream": true, "messages": messages}))
            .expect("request");
    let mut stream = client.chat().create_stream(request).await.expect("stream");
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = serde_json::to_value(chunk.expect("chunk")).expect("json");
        let Some(delta) = chunk["choices"].get(0).map(|c| c["delta"].clone()) else {
            continue;
        };
        content.push_str(delta["content"].as_str().unwrap_or_default());
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            calls.push(json!({"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"], "arguments": c["function"]["arguments"]}}));
        }
    }
    let mut m = json!({"role": "assistant", "content": if content.is_empty() { Value::Null } else { json!(content) }});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

async fn json_turn(client: &Client<OpenAIConfig>, messages: &[Value]) -> Value {
    let request: CreateChatCompletionRequest =
        serde_json::from_value(json!({"model": "gpt-4o", "messages": messages})).expect("request");
    let response: CreateChatCompletionResponse =
        client.chat().create(request).await.expect("response");
    assert!(response.choices[0].logprobs.is_none(), "capture is hidden");
    let mut m = serde_json::to_value(&response.choices[0].message).expect("json");
    // What an agent loop sends back: role, content and tool calls.
    let keep = ["role", "content", "tool_calls"];
    if let Value::Object(map) = &mut m {
        map.retain(|k, v| keep.contains(&k.as_str()) && !v.is_null() || k == "content");
    }
    m
}

async fn tool_loop(stream: bool) {
    let engine = Engine::start().await;
    let server = InterceptionServer::new(ServerConfig::default()).expect("server");
    server.start().await.expect("start");
    let session = Arc::new(
        RolloutSession::new(SessionConfig::new(
            format!("episode-{stream}"),
            "policy",
            Upstream::new(engine.url.clone()),
        ))
        .with_capture_tokens(true),
    );
    let guard = server.acquire(session.clone()).await.expect("acquire");
    let env: std::collections::HashMap<_, _> = guard.harness_env().into_iter().collect();
    let client = crate::openai(
        OpenAIConfig::new()
            .with_api_base(env["OPENAI_BASE_URL"].clone())
            .with_api_key(env["OPENAI_API_KEY"].clone()),
    );
    let mut messages = vec![
        json!({"role": "system", "content": "you run tools"}),
        json!({"role": "user", "content": "do the two steps"}),
    ];
    for turn in 0..3 {
        let m = if stream {
            streamed_turn(&client, &messages).await
        } else {
            json_turn(&client, &messages).await
        };
        let call_id = m["tool_calls"][0]["id"].as_str().map(str::to_owned);
        messages.push(m);
        match call_id {
            Some(id) => messages.push(
                json!({"role": "tool", "tool_call_id": id, "content": format!("step {turn} ok")}),
            ),
            None => assert_eq!(turn, 2, "the answer comes on the third turn"),
        }
    }
    guard.close().await;

    let trace = session.trace();
    assert_eq!(trace.calls.len(), 3);
    let episode = session.episode();
    assert_eq!(episode, trace.episode(), "live and rebuilt episodes agree");
    // system, user, (assistant, tool) x 2, assistant
    assert_eq!(episode.nodes.len(), 7, "{:#?}", episode.nodes);
    assert_eq!(episode.summary.sampled, 3);
    assert_eq!(episode.summary.token_breaks, 0);
    assert_eq!(episode.branches.len(), 1);
    let mut completions = Vec::new();
    let mut logprobs = Vec::new();
    for r in &trace.calls {
        assert_eq!(r.token_capture, TokenCapture::Captured);
        let node = &episode.nodes[r.node.expect("node") as usize];
        assert!(node.sampled);
        assert_eq!(node.call, Some(r.seq));
        completions.extend(r.completion_token_ids.clone().expect("completion"));
        logprobs.extend(r.completion_logprobs.clone().expect("logprobs"));
    }
    let last = trace.calls.last().expect("last");
    let branch = &episode.branches[0];
    assert_eq!(branch.leaf as u64, last.node.expect("node"));
    let mut want = last.prompt_token_ids.clone().expect("prompt");
    want.extend(last.completion_token_ids.clone().expect("completion"));
    let ids = branch.token_ids.clone().expect("ids");
    assert_eq!(ids, want);
    let mask = branch.mask.clone().expect("mask");
    let masked: Vec<u32> = ids
        .iter()
        .zip(&mask)
        .filter(|(_, m)| **m)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        masked, completions,
        "the mask covers exactly the three completions"
    );
    let lps = branch.logprobs.clone().expect("logprobs");
    assert_eq!(lps.len(), ids.len());
    let masked_lps: Vec<f64> = lps
        .iter()
        .zip(&mask)
        .filter(|(_, m)| **m)
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(masked_lps, logprobs);
    assert_eq!(branch.turns, 3);
    assert_eq!(
        branch.completion_tokens,
        Some(completions.len() as u32),
        "{branch:?}"
    );
    server.stop().await.expect("stop");
    engine.shutdown().await;
}

#[tokio::test]
async fn a_json_tool_loop_is_one_token_exact_branch() {
    tool_loop(false).await;
}

#[tokio::test]
async fn a_streamed_tool_loop_is_one_token_exact_branch() {
    tool_loop(true).await;
}
