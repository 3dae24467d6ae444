//! The per-request work of the server that lives in `intercept-core`, each beside the
//! obvious alternative it replaces:
//!
//! - `body/*`: `JsonBody::parse` + model/sampling override (`ChatDialect::prepare`) +
//!   `chunks()`, against parsing the whole document into a `serde_json::Value`,
//!   modifying it and serialising it again; for a 2 KiB and a 1 MiB chat request.
//! - `mediate/*`: network-policy mediation of a 2 KiB agent request (tools, an image
//!   URL) on top of `prepare` + `chunks()`: plain `prepare` (the baseline), an
//!   unrestricted session (one branch), a restricted one with nothing to remove, and
//!   one that strips a server tool and a blocked image URL (and appends the notice), for
//!   Chat Completions and Anthropic Messages.
//! - `sse/split`: `SseSplitter` cutting a 16-chunk chat stream delivered in 1 KiB reads.
//! - `sse/split+assemble`: the same plus `ChatDialect`'s stream assembler, which is what
//!   the relay does per stream.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use intercept_core::internal::ParseMemo;
use intercept_core::internal::Prepared;
use intercept_core::internal::{SseEvent, SseSplitter};
use intercept_core::{
    mediate_request, ChatDialect, Dialect, JsonBody, MessagesDialect, NetworkPolicy, Sampling,
};
use serde_json::json;

fn chat_body(target: usize) -> Bytes {
    let mut pad = String::new();
    while pad.len() + 400 < target {
        pad.push_str(" lorem ipsum dolor sit amet consectetur adipiscing elit");
    }
    let body = json!({
        "model": "harness-model",
        "messages": [
            {"role": "system", "content": format!("You are careful.{pad}")},
            {"role": "user", "content": "please summarise the transcript above in plain words"}
        ],
        "temperature": 0.7,
        "max_tokens": 256,
        "stream": false
    });
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

fn sampling() -> Sampling {
    json!({"temperature": 1.0, "top_p": 0.95})
        .as_object()
        .cloned()
        .unwrap_or_default()
}

fn body(c: &mut Criterion) {
    let sampling = sampling();
    let mut group = c.benchmark_group("body");
    for (name, size) in [("2KiB", 2usize << 10), ("1MiB", 1 << 20)] {
        let source = chat_body(size);
        group.throughput(Throughput::Bytes(source.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("jsonbody_prepare_chunks", name),
            &source,
            |b, source| {
                b.iter(|| {
                    let mut body = JsonBody::parse(source.clone()).ok()?;
                    ChatDialect.prepare(&mut body, "policy", &sampling).ok()?;
                    Some(body.chunks())
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("serde_value_baseline", name),
            &source,
            |b, source| {
                b.iter(|| {
                    let mut v: serde_json::Value = serde_json::from_slice(source).ok()?;
                    let obj = v.as_object_mut()?;
                    for (k, val) in &sampling {
                        obj.insert(k.clone(), val.clone());
                    }
                    obj.insert("model".into(), json!("policy"));
                    serde_json::to_vec(&v).ok()
                })
            },
        );
    }
    group.finish();
}

/// The `turn`-th body of an agent conversation: ~20 KB of tools before the messages
/// (as agents send them), then a system prompt and `turn` rounds of an assistant tool
/// call and a ~2 KB tool result of code (dense in escapes).
fn conversation(turn: usize) -> Bytes {
    let code = "fn main() {\n    println!(\"{}\", \"hello\");\n}\n".repeat(40);
    let tools: Vec<_> = (0..20)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("tool_{i}"),
            "description": "x".repeat(800), "parameters": {"type": "object"}}})
        })
        .collect();
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for t in 0..turn {
        messages.push(json!({"role": "assistant", "tool_calls": [{"id": format!("c{t}"),
            "type": "function", "function": {"name": "tool_1", "arguments": "{\"path\":\"a.rs\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("c{t}"), "content": code}));
    }
    // Keys in the order agents write them: serde_json's map keeps them sorted, so the
    // body is written by hand around the two arrays.
    let text = format!(
        r#"{{"model":"policy","tools":{},"stream":{},"messages":{}}}"#,
        serde_json::to_string(&tools).unwrap_or_default(),
        turn.is_multiple_of(2),
        serde_json::to_string(&messages).unwrap_or_default(),
    );
    Bytes::from(text)
}

/// Parsing the next body of a grown conversation: alone, and after the previous one
/// (`JsonBody::parse_after`), at turn 40 (~200 KB).
fn conversation_bodies(c: &mut Criterion) {
    let mut group = c.benchmark_group("conversation");
    let (before, now) = (conversation(39), conversation(40));
    group.throughput(Throughput::Bytes(now.len() as u64));
    group.bench_function("parse_alone_turn_40", |b| {
        b.iter(|| JsonBody::parse(now.clone()).ok())
    });
    group.bench_function("parse_after_turn_39", |b| {
        b.iter_batched(
            || {
                let mut memo = ParseMemo::default();
                let _ = JsonBody::parse_after(before.clone(), &mut memo);
                memo
            },
            |mut memo| JsonBody::parse_after(now.clone(), &mut memo).ok(),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// A Chat Completions stream of `pieces` content chunks, as vLLM sends it.
/// A 2 KiB agent request with tools and an image; `strip` adds a server tool and an
/// image URL the policy blocks.
fn agent_body(anthropic: bool, strip: bool) -> Bytes {
    let pad = " the repository layout and the failing test output follow".repeat(12);
    let url = if strip {
        "https://evil.example/chart.png"
    } else {
        "https://cdn.ok.org/chart.png"
    };
    let mut body = if anthropic {
        json!({"model": "claude", "max_tokens": 512, "system": format!("You are an agent.{pad}"),
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": format!("Fix it.{pad}")},
                    {"type": "image", "source": {"type": "url", "url": url}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "src tests"}]}],
            "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"}},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]})
    } else {
        json!({"model": "gpt", "messages": [
                {"role": "system", "content": format!("You are an agent.{pad}")},
                {"role": "user", "content": [{"type": "text", "text": format!("Fix it.{pad}")},
                    {"type": "image_url", "image_url": {"url": url}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "src tests"}],
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]})
    };
    if strip {
        let tool = if anthropic {
            json!({"type": "code_execution_20250825", "name": "code_execution"})
        } else {
            json!({"type": "web_search"})
        };
        if let Some(tools) = body["tools"].as_array_mut() {
            tools.push(tool);
        }
    }
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

fn mediate(c: &mut Criterion) {
    let sampling = sampling();
    let restricted = NetworkPolicy::new(&["*.ok.org"], &[] as &[&str]).unwrap_or_default();
    let open = NetworkPolicy::unrestricted();
    let mut group = c.benchmark_group("mediate");
    let dialects: [(&str, &dyn Dialect, bool); 2] = [
        ("chat", &ChatDialect, false),
        ("messages", &MessagesDialect, true),
    ];
    for (name, dialect, anthropic) in dialects {
        let clean = agent_body(anthropic, false);
        let dirty = agent_body(anthropic, true);
        group.throughput(Throughput::Bytes(clean.len() as u64));
        let cases: [(&str, &Bytes, Option<&NetworkPolicy>); 4] = [
            ("prepare", &clean, None),
            ("prepare_unrestricted", &clean, Some(open)),
            ("prepare_restricted_clean", &clean, Some(&restricted)),
            ("prepare_restricted_strip", &dirty, Some(&restricted)),
        ];
        for (case, source, policy) in cases {
            group.bench_with_input(BenchmarkId::new(case, name), source, |b, source| {
                b.iter(|| {
                    let mut body = JsonBody::parse(source.clone()).ok()?;
                    dialect.prepare(&mut body, "policy", &sampling).ok()?;
                    if let Some(policy) = policy {
                        mediate_request(dialect, policy, &mut body).ok()?;
                    }
                    Some(body.chunks())
                })
            });
        }
    }
    group.finish();
}

fn chat_stream(pieces: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut event = |delta: serde_json::Value, finish: Option<&str>| {
        let chunk = json!({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "policy",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&serde_json::to_vec(&chunk).unwrap_or_default());
        out.extend_from_slice(b"\n\n");
    };
    event(json!({"role": "assistant", "content": ""}), None);
    for i in 0..pieces {
        event(json!({"content": format!("word{i} and more ")}), None);
    }
    event(json!({}), Some("stop"));
    let usage = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "policy",
        "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
    });
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&serde_json::to_vec(&usage).unwrap_or_default());
    out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    out
}

fn sse(c: &mut Criterion) {
    let stream = chat_stream(16);
    let reads: Vec<&[u8]> = stream.chunks(1024).collect();
    let mut group = c.benchmark_group("sse");
    group.throughput(Throughput::Bytes(stream.len() as u64));
    group.bench_function("split_16_chunks", |b| {
        b.iter(|| {
            let mut splitter = SseSplitter::new();
            let mut n = 0usize;
            for read in &reads {
                splitter.push(read);
                while let Some(ev) = splitter.next_event() {
                    n += ev.len();
                }
            }
            n
        })
    });
    let prepared = Prepared {
        stream: true,
        hide_stream_usage: true,
    };
    group.bench_function("split_assemble_16_chunks", |b| {
        b.iter(|| {
            let mut splitter = SseSplitter::new();
            let mut assembler = ChatDialect.assembler(&prepared);
            for read in &reads {
                splitter.push(read);
                while let Some(ev) = splitter.next_event() {
                    assembler.push(&SseEvent::new(&ev));
                }
            }
            assembler.finish().ok()
        })
    });
    group.finish();
}

criterion_group!(benches, body, conversation_bodies, mediate, sse);
criterion_main!(benches);
