//! The episode graph's cost: committing one call of the load bench's JSON case (a 2 KiB
//! Chat request, a short answer) into a session's graph, and the memory of a 100-turn
//! episode of 2k-token prompts (printed as bytes per token).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use intercept_core::episode::EpisodeBuilder;
use intercept_core::{CallRecord, DialectKind, JsonBody, RawJson, TokenCapture, Usage};
use serde_json::{json, Value};

fn record(
    seq: u64,
    request: &Value,
    response: &Value,
    tokens: Option<(Vec<u32>, Vec<u32>)>,
) -> CallRecord {
    let (p, c) = match tokens {
        Some((p, c)) => (Some(p), Some(c)),
        None => (None, None),
    };
    CallRecord {
        session: "bench".into(),
        seq,
        dialect: DialectKind::ChatCompletions,
        endpoint: "/chat/completions".into(),
        model: "m".into(),
        stream: false,
        sampling: Default::default(),
        request: JsonBody::parse(request.to_string().into()).expect("request"),
        response: Some(RawJson::from_value(response)),
        finish_reason: Some("stop".into()),
        usage: Usage::default(),
        status: 200,
        started_at: 0.0,
        ended_at: 0.0,
        ttfb_ms: None,
        client_disconnected: false,
        error: None,
        epoch: 0,
        engine: None,
        token_capture: if p.is_some() {
            TokenCapture::Captured
        } else {
            TokenCapture::Off
        },
        completion_logprobs: c.as_ref().map(|c| c.iter().map(|_| -0.5).collect()),
        token_path: None,
        token_reason: None,
        requested_model: None,
        policy: None,
        truncated: false,
        sampled: Default::default(),
        prompt_token_ids: p,
        completion_token_ids: c,
        node: None,
    }
}

/// The load bench's JSON request: a padded system prompt and one user message (~2 KiB).
fn c16_request() -> Value {
    let pad = " lorem ipsum dolor sit amet consectetur adipiscing elit".repeat(34);
    json!({"model": "harness-model", "messages": [
        {"role": "system", "content": format!("You are a careful assistant.{pad}")},
        {"role": "user", "content": "Write one short sentence about the sea."}],
        "temperature": 0.7, "max_tokens": 256})
}

fn commit(c: &mut Criterion) {
    let request = c16_request();
    assert!(request.to_string().len() >= 2000);
    let response = json!({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "The sea is wide and grey today."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 400, "completion_tokens": 8, "total_tokens": 408}});
    let r = record(0, &request, &response, None);
    c.bench_function("episode: commit one json c16 call", |b| {
        let mut graph = EpisodeBuilder::new();
        b.iter(|| graph.commit(&r));
    });
    // The whole record path a RolloutSession adds per call, for scale: the record is
    // cloned into the trace.
    c.bench_function("episode: clone of the same record (trace push)", |b| {
        b.iter(|| r.clone());
    });
}

fn memory(_c: &mut Criterion) {
    // 100 turns; each prompt is ~2k tokens: a fixed 2k-token system prompt, then every
    // earlier turn; each turn adds a 40-token user message and a 60-token completion.
    let system: Vec<u32> = (0..2000).collect();
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    let mut ids = system.clone();
    let mut graph = EpisodeBuilder::new();
    let mut record_tokens = 0usize;
    for turn in 0..100u32 {
        messages.push(json!({"role": "user", "content": format!("user {turn}")}));
        ids.extend((0..40).map(|i| 10_000 + turn * 100 + i));
        let completion: Vec<u32> = (0..60).map(|i| 50_000 + turn * 100 + i).collect();
        let answer = json!({"role": "assistant", "content": format!("answer {turn}")});
        let request = json!({"model": "m", "messages": messages});
        let response = json!({"choices": [{"index": 0, "message": answer}]});
        record_tokens += ids.len() + completion.len();
        graph.commit(&record(
            u64::from(turn),
            &request,
            &response,
            Some((ids.clone(), completion.clone())),
        ));
        messages.push(answer);
        ids.extend(completion);
    }
    let e = graph.episode("bench");
    let held = e.summary.tokens as usize;
    assert_eq!(held, ids.len(), "every token is held once");
    let bytes = graph.heap_bytes();
    println!(
        "episode memory: 100 turns, {held} distinct tokens ({record_tokens} in the records' prompt+completion ids): {bytes} heap bytes, {:.1} bytes per distinct token",
        bytes as f64 / held as f64
    );
}

criterion_group!(benches, commit, memory);
criterion_main!(benches);
