//! The token path (token-in/token-out) through real HTTP: a session with a `tokens`
//! setting has its conversation rendered (or bridged) to ids by intercept, generated on the
//! mock engine's `/inference/v1/generate` (or SGLang's `/generate`), and the completion
//! ids parsed back into the dialect's answer; the record holds the ids and how they were
//! made. The expected ids come from `intercept-tokens`' renderer, itself held to
//! `renderers` 0.1.12 by that crate's differential test.

mod common;

use std::sync::Arc;

use common::*;
use intercept_core::{
    Interception, OnMismatch, RolloutSession, SessionConfig, TokenEngine, TokenPath, TokensConfig,
    Upstream,
};
use intercept_test::{MockConfig, MockUpstream, Reply};
use intercept_tokens::{ChatMessage, Renderer, RendererOptions, ToolSpec};
use serde_json::{json, Value};

/// Qwen3's tokenizer folder (`INTERCEPT_QWEN3_TOKENIZER`): required under CI.
fn tokenizer_dir() -> Option<String> {
    match std::env::var("INTERCEPT_QWEN3_TOKENIZER") {
        Ok(dir) => Some(dir),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("INTERCEPT_QWEN3_TOKENIZER must name Qwen3's tokenizer folder under CI")
        }
        Err(_) => {
            eprintln!("INTERCEPT_QWEN3_TOKENIZER is not set: token path tests skipped");
            None
        }
    }
}

struct Rig {
    engine: MockUpstream,
    harness: Harness,
    qwen3: Arc<dyn Renderer>,
    dir: String,
}

impl Rig {
    async fn new() -> Option<Self> {
        let dir = tokenizer_dir()?;
        let tokenizer = intercept_tokens::shared(&dir).expect("tokenizer");
        let engine = MockUpstream::start_with(MockConfig {
            tokenizer: Some(tokenizer.clone()),
            ..MockConfig::default()
        })
        .await
        .expect("engine");
        let qwen3 = intercept_tokens::renderer("qwen3", tokenizer, &RendererOptions::default())
            .expect("renderer");
        Some(Rig {
            engine,
            harness: Harness::new().await,
            qwen3,
            dir,
        })
    }

    fn tokens(&self) -> TokensConfig {
        TokensConfig::new("qwen3", self.dir.clone())
    }

    async fn session(
        &self,
        tokens: TokensConfig,
    ) -> (Arc<RolloutSession>, Arc<Waiter>, intercept_core::SlotGuard) {
        let config = SessionConfig::new(
            "tito",
            "policy",
            Upstream::new(format!(
                "{}/v1",
                self.engine.base_url().trim_end_matches("/v1")
            )),
        )
        .with_tokens(tokens);
        self.harness.session_with(config).await
    }

    /// The token ids of every engine request, in order.
    fn engine_ids(&self) -> Vec<Vec<u32>> {
        self.engine
            .requests()
            .iter()
            .filter_map(|r| r.json().cloned())
            .map(|v| {
                let ids = v.get("token_ids").or_else(|| v.get("input_ids")).cloned();
                serde_json::from_value(ids.unwrap_or_default()).expect("ids")
            })
            .collect()
    }
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                       "opts": {"type": "object"}}, "required": ["city"]}}}])
}

fn first_messages() -> Value {
    json!([{"role": "system", "content": "You are helpful."},
           {"role": "user", "content": "Weather in Paris? Ünïcödé 🌧"}])
}

fn rendered(rig: &Rig, messages: &Value, tools: &Value) -> Vec<u32> {
    let m = ChatMessage::parse_array(&messages.to_string()).expect("messages");
    let t = ToolSpec::parse_array(&tools.to_string()).expect("tools");
    rig.qwen3.render(&m, &t, true).expect("render").token_ids
}

async fn chat(slot: &intercept_core::Slot, body: Value) -> Answer {
    post_json(&slot.base_url, Some(slot.model_secret.expose()), &body).await
}

#[tokio::test]
async fn a_tool_loop_is_rendered_once_then_bridged_and_recorded_id_for_id() {
    let Some(rig) = Rig::new().await else { return };
    let (session, waiter, guard) = rig.session(rig.tokens()).await;
    let slot = guard.slot();
    rig.engine.push(
        Reply::tool_call(
            "get_weather",
            r#"{"city": "Paris", "opts": {"units": ["c", "f"], "n": 1.5}}"#,
        )
        .with_reasoning("The user wants the weather."),
    );
    let body =
        json!({"model": "m", "messages": first_messages(), "tools": tools(), "temperature": 0.5});
    let first = chat(slot, body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let answer = first.json();
    let message = &answer["choices"][0]["message"];
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["reasoning_content"], "The user wants the weather.");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
    let arguments: Value = serde_json::from_str(
        message["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        arguments,
        json!({"city": "Paris", "opts": {"units": ["c", "f"], "n": 1.5}})
    );
    let call_id = message["tool_calls"][0]["id"].as_str().unwrap().to_owned();
    assert!(call_id.starts_with("call_"));

    // The engine got the conversation rendered by the renderer, with its stop ids and
    // the request's sampling.
    let expected = rendered(&rig, &first_messages(), &tools());
    assert_eq!(rig.engine_ids(), vec![expected.clone()]);
    let sent = rig.engine.requests()[0].json().cloned().unwrap();
    assert_eq!(sent["sampling_params"]["temperature"], 0.5);
    assert_eq!(sent["sampling_params"]["logprobs"], 1);
    assert_eq!(sent["sampling_params"]["skip_special_tokens"], false);
    assert_eq!(
        sent["sampling_params"]["stop_token_ids"],
        json!(rig.qwen3.stop_ids())
    );
    assert_eq!(
        rig.engine.requests()[0].header("x-session-id"),
        Some("tito")
    );

    waiter.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    assert_eq!(record.token_path, Some(TokenPath::Rendered));
    assert_eq!(record.token_reason.as_deref(), Some("first_turn"));
    assert_eq!(record.prompt_token_ids.as_deref(), Some(&expected[..]));
    let completion = record.completion_token_ids.clone().unwrap();
    assert_eq!(completion.last(), Some(&rig.qwen3.stop_ids()[0]));
    assert_eq!(
        record.completion_logprobs.as_ref().map(Vec::len),
        Some(completion.len())
    );
    assert_eq!(record.finish_reason.as_deref(), Some("tool_calls"));

    // Turn 2: the harness sends the turn back (without its reasoning, arguments
    // re-serialised) and the tool's result: bridged from the exact ids.
    rig.engine.push(Reply::text("It is sunny in Paris."));
    let mut messages = first_messages().as_array().expect("array").clone();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": call_id, "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"opts\":{\"n\":1.5,\"units\":[\"c\",\"f\"]},\"city\":\"Paris\"}"}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 °C"}));
    let second = chat(
        slot,
        json!({"model": "m", "messages": messages, "tools": tools()}),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(
        second.json()["choices"][0]["message"]["content"],
        "It is sunny in Paris."
    );
    assert_eq!(second.json()["choices"][0]["finish_reason"], "stop");
    let tool = ChatMessage::parse_array(&json!([messages[3]]).to_string()).unwrap();
    let bridged = rig
        .qwen3
        .bridge(
            &expected,
            &completion,
            &tool,
            &ToolSpec::parse_array(&tools().to_string()).unwrap(),
        )
        .unwrap()
        .token_ids;
    assert!(bridged.starts_with(&[&expected[..], &completion[..]].concat()));
    assert_eq!(rig.engine_ids()[1], bridged);
    waiter.wait_for(2).await;
    let record = session.trace().calls[1].clone();
    assert_eq!(record.token_path, Some(TokenPath::Bridged));
    assert_eq!(record.token_reason, None);
    assert_eq!(record.prompt_token_ids.as_deref(), Some(&bridged[..]));

    // Turn 3: a new user query re-renders (thinking retention), the reason recorded.
    rig.engine.push(Reply::text("You're welcome."));
    messages.push(json!({"role": "assistant", "content": "It is sunny in Paris."}));
    messages.push(json!({"role": "user", "content": "Thanks!"}));
    let third = chat(
        slot,
        json!({"model": "m", "messages": messages, "tools": tools()}),
    )
    .await;
    assert_eq!(third.status, 200, "{}", third.text());
    assert_eq!(
        rig.engine_ids()[2],
        rendered(&rig, &Value::Array(messages.clone()), &tools())
    );
    waiter.wait_for(3).await;
    let record = session.trace().calls[2].clone();
    assert_eq!(record.token_path, Some(TokenPath::Rendered));
    assert_eq!(record.token_reason.as_deref(), Some("thinking_retention"));

    // The episode: turns 1 and 2 are one token sequence; the ids are the engine's.
    let episode = session.episode();
    let sampled: Vec<_> = episode
        .nodes
        .iter()
        .filter(|n| n.token_ids.is_some())
        .collect();
    assert_eq!(sampled.len(), 3);
    assert!(sampled[0].token_start);
    assert!(
        !sampled[1].token_start,
        "a bridged turn continues its sequence"
    );
    guard.close().await;
}

#[tokio::test]
async fn a_streamed_call_relays_reasoning_content_and_tool_calls_as_they_arrive() {
    let Some(rig) = Rig::new().await else { return };
    let (session, waiter, guard) = rig.session(rig.tokens()).await;
    let slot = guard.slot();
    rig.engine.push(
        Reply::text("Checking the weather for you.")
            .with_reasoning("Need the tool. 天気")
            .with_tool_call(intercept_test::ToolCall::new(
                "get_weather",
                r#"{"city": "Paris"}"#,
            ))
            .with_tool_call(intercept_test::ToolCall::new(
                "get_weather",
                r#"{"city": "Lyon"}"#,
            )),
    );
    let body = json!({"model": "m", "messages": first_messages(), "tools": tools(), "stream": true,
                      "stream_options": {"include_usage": true}});
    let answer = chat(slot, body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let text = answer.text();
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(reasoning, "Need the tool. 天気");
    assert_eq!(content, "Checking the weather for you.");
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1]["index"], 1);
    assert_eq!(calls[1]["function"]["arguments"], r#"{"city": "Lyon"}"#);
    let finish: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finish, ["tool_calls"]);
    let usage = chunks
        .iter()
        .find(|c| c["usage"].is_object())
        .expect("usage chunk");
    waiter.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    let completion = record.completion_token_ids.clone().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], completion.len());
    assert_eq!(
        record.prompt_token_ids.unwrap(),
        rendered(&rig, &first_messages(), &tools())
    );
    let response = record.response.unwrap().to_value();
    assert_eq!(
        response["choices"][0]["message"]["tool_calls"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        response["choices"][0]["message"]["reasoning_content"],
        "Need the tool. 天気"
    );
    guard.close().await;
}

#[tokio::test]
async fn an_edited_history_is_rendered_whole_or_refused_as_the_session_says() {
    let Some(rig) = Rig::new().await else { return };
    for on_mismatch in [OnMismatch::Render, OnMismatch::Fail] {
        rig.engine.take_requests();
        let mut tokens = rig.tokens();
        tokens.on_mismatch = on_mismatch;
        let (session, waiter, guard) = rig.session(tokens).await;
        let slot = guard.slot();
        rig.engine.push(Reply::text("Hello."));
        let first = chat(slot, json!({"model": "m", "messages": first_messages()})).await;
        assert_eq!(first.status, 200, "{}", first.text());
        // The harness rewrote the system prompt.
        rig.engine.push(Reply::text("Hi again."));
        let edited = json!([{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris? Ünïcödé 🌧"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "And now?"}]);
        let second = chat(slot, json!({"model": "m", "messages": edited})).await;
        match on_mismatch {
            OnMismatch::Fail => {
                assert_eq!(second.status, 409, "{}", second.text());
                assert!(
                    second.text().contains("history_edited"),
                    "{}",
                    second.text()
                );
                assert_eq!(rig.engine_ids().len(), 1, "nothing sent to the engine");
            }
            _ => {
                assert_eq!(second.status, 200, "{}", second.text());
                waiter.wait_for(2).await;
                let record = session.trace().calls[1].clone();
                assert_eq!(record.token_path, Some(TokenPath::Rendered));
                assert_eq!(record.token_reason.as_deref(), Some("history_edited"));
                assert_eq!(rig.engine_ids()[1], rendered(&rig, &edited, &json!([])));
            }
        }
        guard.close().await;
    }
}

#[tokio::test]
async fn a_truncated_turn_finishes_with_length_and_the_next_turn_closes_it() {
    let Some(rig) = Rig::new().await else { return };
    let (session, waiter, guard) = rig.session(rig.tokens()).await;
    let slot = guard.slot();
    rig.engine.push(Reply::text(
        "one two three four five six seven eight nine ten",
    ));
    let first = chat(
        slot,
        json!({"model": "m", "messages": first_messages(), "max_tokens": 3}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["choices"][0]["finish_reason"], "length");
    waiter.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    assert_eq!(record.completion_token_ids.as_ref().map(Vec::len), Some(3));
    assert_eq!(
        rig.engine.requests()[0].json().unwrap()["sampling_params"]["max_tokens"],
        3
    );
    guard.close().await;
}

#[tokio::test]
async fn engine_errors_keep_their_status_and_the_record_keeps_the_prompt() {
    let Some(rig) = Rig::new().await else { return };
    let (session, waiter, guard) = rig.session(rig.tokens()).await;
    let slot = guard.slot();
    rig.engine.push(Reply::error(503, "engine overloaded"));
    let answer = chat(slot, json!({"model": "m", "messages": first_messages()})).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(
        answer.text().contains("engine overloaded"),
        "{}",
        answer.text()
    );
    waiter.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    assert_eq!(record.status, 503);
    assert!(record.error.is_some());
    assert_eq!(
        record.prompt_token_ids.unwrap(),
        rendered(&rig, &first_messages(), &json!([]))
    );
    assert_eq!(record.token_path, Some(TokenPath::Rendered));
    guard.close().await;
}

#[tokio::test]
async fn bad_settings_are_refused_when_the_session_is_acquired() {
    let Some(rig) = Rig::new().await else { return };
    let server = &rig.harness.server;
    let upstream = Upstream::new(rig.engine.base_url());
    let missing = TokensConfig::new("qwen3", "/no/such/tokenizer-folder");
    let session = Arc::new(RolloutSession::new(
        SessionConfig::new("bad", "policy", upstream.clone()).with_tokens(missing),
    ));
    let err = server.acquire(session).await.expect_err("refused");
    assert_eq!(err.status(), 400);
    assert!(
        err.to_string().contains("/no/such/tokenizer-folder"),
        "{err}"
    );
    let unknown = TokensConfig::new("llama9", rig.dir.clone());
    let session = Arc::new(RolloutSession::new(
        SessionConfig::new("bad2", "policy", upstream).with_tokens(unknown),
    ));
    let err = server.acquire(session).await.expect_err("refused");
    assert_eq!(err.status(), 400);
    assert!(err.to_string().contains("llama9"), "{err}");
}

#[tokio::test]
async fn sglang_engines_take_input_ids_on_generate() {
    let Some(rig) = Rig::new().await else { return };
    let mut tokens = rig.tokens();
    tokens.engine = TokenEngine::Sglang;
    let (session, waiter, guard) = rig.session(tokens).await;
    let slot = guard.slot();
    rig.engine.push(Reply::text("Bonjour."));
    let answer = chat(
        slot,
        json!({"model": "m", "messages": first_messages(), "max_tokens": 64}),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.json()["choices"][0]["message"]["content"],
        "Bonjour."
    );
    let request = rig.engine.requests()[0].clone();
    assert_eq!(
        request.json().unwrap()["sampling_params"]["max_new_tokens"],
        64
    );
    assert_eq!(
        rig.engine_ids()[0],
        rendered(&rig, &first_messages(), &json!([]))
    );
    waiter.wait_for(1).await;
    assert!(session.trace().calls[0]
        .completion_token_ids
        .as_ref()
        .is_some_and(|c| !c.is_empty()));
    guard.close().await;
}

#[tokio::test]
async fn responses_and_messages_calls_take_the_token_path_too() {
    let Some(rig) = Rig::new().await else { return };
    let (session, waiter, guard) = rig.session(rig.tokens()).await;
    let slot = guard.slot();
    let secret = slot.model_secret.expose();
    // Responses, JSON then streamed.
    rig.engine.push(
        Reply::tool_call("get_weather", r#"{"city": "Paris"}"#).with_reasoning("Use the tool."),
    );
    let body = json!({"model": "m", "instructions": "You are helpful.",
        "input": [{"role": "user", "content": "Weather in Paris? Ünïcödé 🌧"}],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather of a city",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                  "opts": {"type": "object"}}, "required": ["city"]}}]});
    let answer = post(
        &slot.base_url,
        "/v1/responses",
        Some(secret),
        serde_json::to_vec(&body).unwrap(),
        &[],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let output = answer.json()["output"].clone();
    let call = output
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(
        rig.engine_ids()[0],
        rendered(&rig, &first_messages(), &tools())
    );
    // Anthropic Messages, streamed.
    rig.engine
        .push(Reply::text("Sunny.").with_reasoning("Easy."));
    let body = json!({"model": "m", "max_tokens": 100, "system": "You are helpful.", "stream": true,
        "messages": [{"role": "user", "content": "Weather in Paris? Ünïcödé 🌧"}]});
    let answer = post(
        &slot.base_url,
        "/v1/messages",
        Some(secret),
        serde_json::to_vec(&body).unwrap(),
        &[("x-api-key", secret), ("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let text = answer.text();
    assert!(text.contains("\"thinking_delta\""), "{text}");
    assert!(text.contains("\"text_delta\""), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    waiter.wait_for(2).await;
    let trace = session.trace();
    let record = &trace.calls[1];
    assert_eq!(record.token_path, Some(TokenPath::Rendered));
    let response = record.response.as_ref().unwrap().to_value();
    assert_eq!(
        response["content"].as_array().map(Vec::len),
        Some(2),
        "{response}"
    );
    assert_eq!(response["stop_reason"], "end_turn");
    guard.close().await;
}

#[tokio::test]
async fn a_malformed_tool_call_is_reported_in_the_answer_and_the_record() {
    let Some(rig) = Rig::new().await else { return };
    let (session, waiter, guard) = rig.session(rig.tokens()).await;
    let slot = guard.slot();
    let broken = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>";
    for stream in [false, true] {
        rig.engine.push(Reply::raw_completion(broken));
        let body =
            json!({"model": "m", "messages": first_messages(), "tools": tools(), "stream": stream});
        let answer = chat(slot, body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let text = answer.text();
        assert!(text.contains("tool_call_errors"), "{text}");
        assert!(text.contains("invalid_json"), "{text}");
        assert!(
            !text.contains("\"tool_calls\":[{"),
            "no well-formed call: {text}"
        );
    }
    waiter.wait_for(2).await;
    for record in session.trace().calls {
        let response = record.response.unwrap().to_value().to_string();
        assert!(
            response.contains("invalid_json"),
            "stream={}: {response}",
            record.stream
        );
        assert_eq!(record.finish_reason.as_deref(), Some("stop"));
    }
    guard.close().await;
}

#[tokio::test]
async fn the_newer_vllm_logprobs_shape_is_read_too() {
    let Some(dir) = tokenizer_dir() else { return };
    let tokenizer = intercept_tokens::shared(&dir).expect("tokenizer");
    let engine = MockUpstream::start_with(MockConfig {
        tokenizer: Some(tokenizer),
        vllm_version: intercept_test::VllmVersion::V0_34,
        ..MockConfig::default()
    })
    .await
    .expect("engine");
    let harness = Harness::new().await;
    let config = SessionConfig::new("new-vllm", "policy", Upstream::new(engine.base_url()))
        .with_tokens(TokensConfig::new("qwen3", dir));
    let (session, waiter, guard) = harness.session_with(config).await;
    engine.push(Reply::text("Fine."));
    let answer = chat(
        guard.slot(),
        json!({"model": "m", "messages": first_messages(), "stream": true}),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let content: String = answer
        .text()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, "Fine.");
    waiter.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    let completion = record.completion_token_ids.unwrap();
    let logprobs = record.completion_logprobs.unwrap();
    assert_eq!(logprobs.len(), completion.len());
    assert!(logprobs.iter().all(|l| *l < 0.0));
    guard.close().await;
}

#[tokio::test]
async fn images_are_refused_with_a_clear_error() {
    let Some(rig) = Rig::new().await else { return };
    let (session, _waiter, guard) = rig.session(rig.tokens()).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}]}]});
    let answer = chat(guard.slot(), body).await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert!(answer.text().contains("text only"), "{}", answer.text());
    assert!(
        rig.engine.requests().is_empty(),
        "nothing reached the engine"
    );
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1, "the refused call is recorded once");
    assert_eq!(trace.calls[0].status, 400);
    assert_eq!(trace.calls[0].prompt_token_ids, None);
    guard.close().await;
}

#[tokio::test]
async fn on_mismatch_chat_sends_the_turn_to_the_chat_endpoint_and_bridges_from_its_ids() {
    use common::fake_engine::{answer_text, ids_of, EngineConfig, FakeEngine};
    let Some(dir) = tokenizer_dir() else { return };
    let engine = FakeEngine::start(EngineConfig {
        name: "fake".into(),
        token_ids: true,
    })
    .await;
    let harness = Harness::new().await;
    let mut tokens = TokensConfig::new("qwen3", dir.clone());
    tokens.on_mismatch = OnMismatch::Chat;
    tokens.enable_thinking = Some(false);
    let config = SessionConfig::new("chat-path", "policy", Upstream::new(engine.base_url()))
        .with_tokens(tokens);
    let (session, waiter, guard) = harness.session_with(config).await;
    let slot = guard.slot();
    let first = chat(slot, json!({"model": "m", "messages": first_messages()})).await;
    assert_eq!(first.status, 200, "{}", first.text());
    // The harness edits the history: the chat endpoint renders this turn.
    let edited = json!([{"role": "user", "content": "hi there"}]);
    let second = chat(slot, json!({"model": "m", "messages": edited})).await;
    assert_eq!(second.status, 200, "{}", second.text());
    let reply = second.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(reply, answer_text("hi there"));
    assert!(
        second.json()["prompt_token_ids"].is_null(),
        "the harness did not ask for ids"
    );
    waiter.wait_for(2).await;
    let record = session.trace().calls[1].clone();
    assert_eq!(record.token_path, Some(TokenPath::Chat));
    assert_eq!(record.token_reason.as_deref(), Some("history_edited"));
    let prompt = record.prompt_token_ids.clone().unwrap();
    let completion = record.completion_token_ids.clone().unwrap();
    assert_eq!(prompt, ids_of("hi there"));
    // The next turn extends the chat turn: bridged from the ids the engine returned.
    let mut messages = edited.as_array().unwrap().clone();
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": "and again"}));
    let third = chat(slot, json!({"model": "m", "messages": messages})).await;
    assert_eq!(third.status, 200, "{}", third.text());
    waiter.wait_for(3).await;
    let record = session.trace().calls[2].clone();
    assert_eq!(record.token_path, Some(TokenPath::Bridged));
    let sent = engine.seen().last().unwrap().body.clone();
    let ids: Vec<u32> = serde_json::from_value(sent["token_ids"].clone()).unwrap();
    assert!(
        ids.starts_with(&[&prompt[..], &completion[..]].concat()),
        "{ids:?}"
    );
    guard.close().await;
}

#[tokio::test]
async fn an_engine_answer_past_max_response_bytes_is_cut_off_and_recorded_as_failed() {
    let Some(dir) = tokenizer_dir() else { return };
    let tokenizer = intercept_tokens::shared(&dir).expect("tokenizer");
    let engine = MockUpstream::start_with(MockConfig {
        tokenizer: Some(tokenizer),
        ..MockConfig::default()
    })
    .await
    .expect("engine");
    let harness = Harness::with_config(intercept_server::ServerConfig {
        max_response_bytes: 4096,
        ..intercept_server::ServerConfig::default()
    })
    .await;
    let config = SessionConfig::new("big", "policy", Upstream::new(engine.base_url()))
        .with_tokens(TokensConfig::new("qwen3", dir));
    let (session, waiter, guard) = harness.session_with(config).await;
    let long = "word ".repeat(3000);
    for stream in [false, true] {
        engine.push(Reply::text(long.clone()).with_chunks(50));
        let answer = chat(
            guard.slot(),
            json!({"model": "m", "messages": first_messages(), "stream": stream}),
        )
        .await;
        if stream {
            // The head was sent: the stream ends with the dialect's error event.
            assert!(
                answer.text().contains("max_response_bytes"),
                "{}",
                answer.text()
            );
            assert!(!answer.text().contains("[DONE]"), "{}", answer.text());
        } else {
            assert!(answer.status >= 500, "{}", answer.text());
            assert!(
                answer.text().contains("max_response_bytes"),
                "{}",
                answer.text()
            );
        }
    }
    waiter.wait_for(2).await;
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 2);
    for record in &trace.calls {
        assert!(record.error.is_some(), "{:?}", record.status);
        assert!(record.prompt_token_ids.is_some());
    }
    guard.close().await;
}
