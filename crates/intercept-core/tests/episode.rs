//! The episode graph over generated conversations: linear turns, tool loops, compaction,
//! edits and interleaved subagents; the token invariant with a prefix-stable engine and
//! with one that re-renders earlier turns; the same conversation in three dialects.

use std::collections::HashSet;

use intercept_core::episode::{Episode, EpisodeBuilder, TokenBreak};
use intercept_core::{CallRecord, DialectKind, JsonBody, RawJson, TokenCapture, Usage};
use proptest::prelude::*;
use serde_json::{json, Value};

/// One message of a generated conversation (Chat shape).
#[derive(Debug, Clone, PartialEq)]
struct Msg {
    role: &'static str,
    text: String,
    tool_call: Option<String>,
    tool_result: Option<String>,
}

impl Msg {
    fn user(text: impl Into<String>) -> Self {
        Msg {
            role: "user",
            text: text.into(),
            tool_call: None,
            tool_result: None,
        }
    }
    fn chat(&self) -> Value {
        match (&self.tool_call, &self.tool_result) {
            (Some(id), _) => json!({"role": "assistant", "content": self.text, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "run", "arguments": format!("{{\"cmd\": \"{id}\"}}")}}]}),
            (_, Some(id)) => json!({"role": "tool", "tool_call_id": id, "content": self.text}),
            _ => json!({"role": self.role, "content": self.text}),
        }
    }
}

/// A fake engine's tokeniser: `[role] text bytes [end]` per message.
#[derive(Debug, Clone, Copy)]
enum Engine {
    /// Renders history exactly as it sampled it.
    PrefixStable,
    /// Renders the system prompt with a token that counts the turns so far (like a
    /// template that re-renders earlier messages on each turn).
    Rerenders,
}

fn role_token(role: &str) -> u32 {
    match role {
        "system" => 1_000_001,
        "user" => 1_000_002,
        "assistant" => 1_000_003,
        _ => 1_000_004,
    }
}
const END: u32 = 1_000_000;
const MARK: u32 = 1_000_009;

fn render(engine: Engine, prompt: &[Msg]) -> Vec<u32> {
    let mut out = Vec::new();
    let turns = prompt.iter().filter(|m| m.role == "assistant").count() as u32;
    for m in prompt {
        out.push(role_token(m.role));
        if m.role == "system" && matches!(engine, Engine::Rerenders) {
            out.push(MARK + turns);
        }
        out.extend(completion_ids(m));
    }
    out.push(role_token("assistant"));
    out
}

fn completion_ids(m: &Msg) -> Vec<u32> {
    let mut out: Vec<u32> = m.text.bytes().map(u32::from).collect();
    if let Some(id) = &m.tool_call {
        out.extend(id.bytes().map(|b| u32::from(b) + 500));
    }
    out.push(END);
    out
}

fn record(seq: u64, prompt: &[Msg], reply: &Msg, engine: Option<Engine>) -> CallRecord {
    let request =
        json!({"model": "m", "messages": prompt.iter().map(Msg::chat).collect::<Vec<_>>()});
    let response = json!({"id": format!("r{seq}"), "object": "chat.completion",
        "choices": [{"index": 0, "message": reply.chat(), "finish_reason": "stop"}]});
    let (capture, p, c, l) = match engine {
        Some(e) => {
            let c = completion_ids(reply);
            let l: Vec<f64> = (0..c.len()).map(|i| -(i as f64) / 8.0 - 0.01).collect();
            (
                TokenCapture::Captured,
                Some(render(e, prompt)),
                Some(c),
                Some(l),
            )
        }
        None => (TokenCapture::Off, None, None, None),
    };
    CallRecord {
        session: "s".into(),
        seq,
        dialect: DialectKind::ChatCompletions,
        endpoint: "/chat/completions".into(),
        model: "m".into(),
        stream: false,
        sampling: Default::default(),
        request: JsonBody::parse(request.to_string().into()).expect("request"),
        response: Some(RawJson::from_value(&response)),
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
        token_capture: capture,
        prompt_token_ids: p,
        completion_token_ids: c,
        completion_logprobs: l,
        token_path: None,
        token_reason: None,
        requested_model: None,
        policy: None,
        truncated: false,
        sampled: Default::default(),
        node: None,
    }
}

/// What a generated rollout does next.
#[derive(Debug, Clone)]
enum Step {
    /// Agent `a` takes a turn (a tool call when `tool`), then the next message follows.
    Turn { agent: usize, tool: bool },
    /// Agent `a` compacts: its history becomes the system prompt and one summary.
    Compact { agent: usize },
    /// Agent `a` rewrites its `at`-th user message and drops everything after it.
    Edit { agent: usize, at: usize },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        6 => (0usize..3, any::<bool>()).prop_map(|(agent, tool)| Step::Turn { agent, tool }),
        1 => (0usize..3).prop_map(|agent| Step::Compact { agent }),
        1 => (0usize..3, 0usize..4).prop_map(|(agent, at)| Step::Edit { agent, at }),
    ];
    prop::collection::vec(step, 1..40)
}

/// Plays the steps: each call's prompt and reply, in order.
fn play(steps: &[Step]) -> Vec<(Vec<Msg>, Msg)> {
    let mut agents: Vec<Vec<Msg>> = (0..3)
        .map(|a| {
            vec![
                Msg {
                    role: "system",
                    text: format!("agent {a}"),
                    tool_call: None,
                    tool_result: None,
                },
                Msg::user(format!("task of {a}")),
            ]
        })
        .collect();
    let mut calls = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        match *step {
            Step::Turn { agent, tool } => {
                let history = &mut agents[agent];
                let reply = Msg {
                    role: "assistant",
                    text: format!("answer {n}"),
                    tool_call: tool.then(|| format!("call{n}")),
                    tool_result: None,
                };
                calls.push((history.clone(), reply.clone()));
                history.push(reply);
                history.push(if tool {
                    Msg {
                        role: "tool",
                        text: format!("output {n}"),
                        tool_call: None,
                        tool_result: Some(format!("call{n}")),
                    }
                } else {
                    Msg::user(format!("more {n}"))
                });
            }
            Step::Compact { agent } => {
                let history = &mut agents[agent];
                let summary = Msg::user(format!("summary {n} of {} messages", history.len()));
                history.truncate(1);
                history.push(summary);
            }
            Step::Edit { agent, at } => {
                let history = &mut agents[agent];
                let users: Vec<usize> = (0..history.len())
                    .filter(|&i| history[i].role == "user")
                    .collect();
                let i = users[at % users.len()];
                history.truncate(i);
                history.push(Msg::user(format!("edited {n}")));
            }
        }
    }
    calls
}

fn build(calls: &[(Vec<Msg>, Msg)], engine: Option<Engine>) -> (Vec<CallRecord>, Episode) {
    let mut b = EpisodeBuilder::new();
    let mut records = Vec::new();
    for (seq, (prompt, reply)) in calls.iter().enumerate() {
        let mut r = record(seq as u64, prompt, reply, engine);
        r.node = b.commit(&r);
        assert!(r.node.is_some(), "call {seq} added no node");
        records.push(r);
    }
    (records, b.episode("s"))
}

/// The message texts on the path ending at `node`, root first.
fn path_texts(e: &Episode, node: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = Some(node);
    while let Some(n) = at {
        out.push(text_of(&e.nodes[n as usize].message));
        at = e.nodes[n as usize].parent;
    }
    out.reverse();
    out
}

fn text_of(m: &intercept_core::episode::Message) -> String {
    m.content
        .iter()
        .map(|p| match p {
            intercept_core::episode::Part::Text { text } => text.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The concatenated token ids from the sequence start to `node`.
fn sequence(e: &Episode, node: u32) -> (Vec<u32>, usize) {
    let mut pieces = Vec::new();
    let mut at = Some(node);
    while let Some(n) = at {
        let nd = &e.nodes[n as usize];
        if nd.sampled {
            pieces.push(nd.token_ids.clone().expect("a sampled node with tokens"));
            if nd.token_start {
                break;
            }
        }
        at = nd.parent;
    }
    let turns = pieces.len();
    pieces.reverse();
    (pieces.concat(), turns)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every call's prompt is a path; nodes are never duplicated; there is one leaf per
    /// distinct branch; rebuilding from the records gives the same episode.
    #[test]
    fn prompts_are_paths_and_leaves_are_branches(steps in steps()) {
        let calls = play(&steps);
        prop_assume!(!calls.is_empty());
        let (records, e) = build(&calls, None);
        for (r, (prompt, reply)) in records.iter().zip(&calls) {
            let node = r.node.expect("node") as u32;
            let n = &e.nodes[node as usize];
            prop_assert!(n.sampled);
            prop_assert_eq!(n.call, Some(r.seq));
            let mut want: Vec<String> = prompt.iter().map(|m| m.text.clone()).collect();
            want.push(reply.text.clone());
            prop_assert_eq!(path_texts(&e, node), want);
        }
        let mut seen = HashSet::new();
        for n in &e.nodes {
            prop_assert!(seen.insert((n.parent, n.hash.clone(), n.call)), "duplicate node {:?}", n);
            if !n.sampled {
                prop_assert!(n.call.is_none());
            }
        }
        // Distinct branches: full conversations (prompt + reply) that no later call extends.
        let full: Vec<Vec<String>> = calls.iter().map(|(p, r)| {
            let mut v: Vec<String> = p.iter().map(|m| m.text.clone()).collect();
            v.push(r.text.clone());
            v
        }).collect();
        let distinct = full.iter().filter(|f| !full.iter().any(|g| g.len() > f.len() && g.starts_with(f))).count();
        prop_assert_eq!(e.branches.len(), distinct);
        prop_assert_eq!(e.summary.branches as usize, distinct);
        prop_assert_eq!(e.summary.sampled as usize, calls.len());
        let trace = intercept_core::Trace { id: "s".into(), stop_condition: None, calls: records, replays: 0 };
        prop_assert_eq!(trace.episode(), e);
    }

    /// A prompt read from where the previous one ended (its bytes extended) gives the
    /// same graph as one read message by message: requests re-encoded with other
    /// whitespace on some calls, and with a message rewritten in place on others, match
    /// the compact rollout node for node.
    #[test]
    fn continued_prompts_match_prompts_read_whole(steps in steps(), pretty in prop::collection::vec(any::<bool>(), 64)) {
        let calls = play(&steps);
        prop_assume!(!calls.is_empty());
        let (_, compact) = build(&calls, None);
        let mut b = EpisodeBuilder::new();
        for (seq, (prompt, reply)) in calls.iter().enumerate() {
            let mut r = record(seq as u64, prompt, reply, None);
            if pretty[seq % pretty.len()] {
                let v: Value = serde_json::from_slice(r.request.source()).expect("json");
                let text = serde_json::to_string_pretty(&v).expect("pretty");
                r.request = JsonBody::parse(text.into()).expect("request");
            }
            r.node = b.commit(&r);
            prop_assert!(r.node.is_some());
        }
        prop_assert_eq!(b.episode("s"), compact);
    }

    /// A prefix-stable engine: every branch's tokens are exactly its leaf call's prompt +
    /// completion ids, the mask covers exactly the completions, logprobs line up, and no
    /// token is held twice along a sequence.
    #[test]
    fn prefix_stable_tokens_concatenate_exactly(steps in steps()) {
        let calls = play(&steps);
        prop_assume!(!calls.is_empty());
        let (records, e) = build(&calls, Some(Engine::PrefixStable));
        prop_assert_eq!(e.summary.token_breaks, 0);
        for r in &records {
            let node = r.node.expect("node") as u32;
            let mut want = r.prompt_token_ids.clone().expect("prompt");
            want.extend(r.completion_token_ids.clone().expect("completion"));
            prop_assert_eq!(sequence(&e, node).0, want);
            prop_assert_eq!(e.nodes[node as usize].token_break, None);
        }
        for b in &e.branches {
            let leaf = &e.nodes[b.leaf as usize];
            let r = &records[leaf.call.expect("leaf call") as usize];
            let ids = b.token_ids.clone().expect("ids");
            let start = &e.nodes[b.token_start.expect("start") as usize];
            let first = &records[start.call.expect("start call") as usize];
            prop_assert_eq!(b.prompt_len, first.prompt_token_ids.as_ref().map(|p| p.len() as u32));
            let mut want = r.prompt_token_ids.clone().expect("prompt");
            want.extend(r.completion_token_ids.clone().expect("completion"));
            prop_assert_eq!(&ids, &want);
            let mask = b.mask.clone().expect("mask");
            let logprobs = b.logprobs.clone().expect("logprobs");
            prop_assert_eq!(mask.len(), ids.len());
            prop_assert_eq!(logprobs.len(), ids.len());
            // The masked tokens are exactly the completions of the sampled nodes on the path.
            let mut completions = Vec::new();
            let mut lps = Vec::new();
            for &n in &b.path {
                let nd = &e.nodes[n as usize];
                if let Some(c) = nd.call {
                    completions.extend(records[c as usize].completion_token_ids.clone().expect("c"));
                    lps.extend(records[c as usize].completion_logprobs.clone().expect("l"));
                }
            }
            let masked: Vec<u32> = ids.iter().zip(&mask).filter(|(_, m)| **m).map(|(i, _)| *i).collect();
            prop_assert_eq!(masked, completions);
            let masked_lp: Vec<f64> = logprobs.iter().zip(&mask).filter(|(_, m)| **m).map(|(l, _)| *l).collect();
            prop_assert_eq!(masked_lp, lps);
            prop_assert!(logprobs.iter().zip(&mask).all(|(l, m)| *m || *l == 0.0));
        }
    }

    /// An engine that re-renders earlier turns: every turn after the first on a path is a
    /// recorded break that carries its whole prompt, never glued to the turn before.
    #[test]
    fn rerendering_engines_break_and_never_glue(steps in steps()) {
        let calls = play(&steps);
        prop_assume!(!calls.is_empty());
        let (records, e) = build(&calls, Some(Engine::Rerenders));
        let mut breaks = 0;
        for r in &records {
            let node = r.node.expect("node") as u32;
            let nd = &e.nodes[node as usize];
            let mut want = r.prompt_token_ids.clone().expect("prompt");
            want.extend(r.completion_token_ids.clone().expect("completion"));
            prop_assert_eq!(nd.token_ids.clone(), Some(want.clone()));
            prop_assert!(nd.token_start);
            // A sampled node above this one on its path: an earlier turn to extend.
            let mut at = nd.parent;
            let mut has_earlier_turn = false;
            while let Some(p) = at {
                if e.nodes[p as usize].sampled {
                    has_earlier_turn = true;
                    break;
                }
                at = e.nodes[p as usize].parent;
            }
            if has_earlier_turn {
                breaks += 1;
                prop_assert_eq!(nd.token_break, Some(TokenBreak::Rerendered));
            } else {
                prop_assert_eq!(nd.token_break, None);
            }
            prop_assert_eq!(sequence(&e, node), (want, 1));
        }
        prop_assert_eq!(e.summary.token_breaks, breaks);
        prop_assert_eq!(e.summary.token_breaks_by_reason.get(&TokenBreak::Rerendered).copied().unwrap_or(0), breaks);
    }
}

#[test]
fn a_completion_that_does_not_tokenise_back_is_a_retokenized_break() {
    let sys = Msg {
        role: "system",
        text: "s".into(),
        tool_call: None,
        tool_result: None,
    };
    let reply = Msg {
        role: "assistant",
        text: "ab".into(),
        tool_call: None,
        tool_result: None,
    };
    let first = record(
        0,
        &[sys.clone(), Msg::user("u")],
        &reply,
        Some(Engine::PrefixStable),
    );
    let prompt = [sys, Msg::user("u"), reply, Msg::user("v")];
    let mut second = record(1, &prompt, &Msg::user("x"), Some(Engine::PrefixStable));
    // The engine merged "ab" into one token when it re-read the history.
    let mut ids = second.prompt_token_ids.take().expect("ids");
    let at = ids.iter().position(|&t| t == u32::from(b'a')).expect("a");
    ids.splice(at..at + 2, [9_999]);
    second.prompt_token_ids = Some(ids.clone());
    let mut b = EpisodeBuilder::new();
    b.commit(&first);
    let n = b.commit(&second).expect("node") as usize;
    let e = b.episode("s");
    assert_eq!(e.nodes[n].token_break, Some(TokenBreak::Retokenized));
    let mut want = ids;
    want.extend(second.completion_token_ids.clone().expect("completion"));
    assert_eq!(e.nodes[n].token_ids.as_ref(), Some(&want));
    assert_eq!(e.branches.len(), 1);
    assert_eq!(e.branches[0].token_ids.as_ref(), Some(&want));
    assert_eq!(e.branches[0].turns, 1);
    assert_eq!(e.summary.token_breaks, 1);
}

#[test]
fn failed_calls_add_nothing_and_untracked_turns_break() {
    let prompt = [Msg::user("u")];
    let reply = Msg {
        role: "assistant",
        text: "a".into(),
        tool_call: None,
        tool_result: None,
    };
    let mut b = EpisodeBuilder::new();
    let mut failed = record(0, &prompt, &reply, None);
    failed.error = Some(intercept_core::CallError {
        kind: intercept_core::ErrorKind::UpstreamStatus,
        message: "upstream 500".into(),
        status: 500,
    });
    failed.status = 500;
    assert_eq!(b.commit(&failed), None);
    let mut garbage = record(1, &prompt, &reply, None);
    garbage.response = Some(RawJson::from_value(&json!({"choices": []})));
    assert_eq!(b.commit(&garbage), None);
    assert!(b.episode("s").nodes.is_empty());
    // A turn without token ids, then one with: the second cannot extend the first.
    let first = record(2, &prompt, &reply, None);
    let second = record(
        3,
        &[Msg::user("u"), reply.clone(), Msg::user("v")],
        &reply,
        Some(Engine::PrefixStable),
    );
    b.commit(&first).expect("first");
    let n = b.commit(&second).expect("second") as usize;
    let e = b.episode("s");
    assert_eq!(e.nodes[n].token_break, Some(TokenBreak::Untracked));
    assert_eq!(e.summary.failed, 1);
    assert_eq!(e.summary.unreadable, 1);
    assert_eq!(e.summary.calls, 4);
}

/// The same tool loop in Chat, Anthropic Messages and Responses.
fn dialect_record(seq: u64, kind: DialectKind, request: Value, response: Value) -> CallRecord {
    let mut r = record(seq, &[Msg::user("x")], &Msg::user("y"), None);
    r.dialect = kind;
    r.request = JsonBody::parse(request.to_string().into()).expect("request");
    r.response = Some(RawJson::from_value(&response));
    r
}

fn shape(e: &Episode) -> Vec<(Option<u32>, String, bool)> {
    e.nodes
        .iter()
        .map(|n| (n.parent, n.hash.clone(), n.sampled))
        .collect()
}

#[test]
fn anthropic_and_responses_rollouts_give_the_graph_of_the_same_chat_rollout() {
    let call = json!({"id": "t1", "type": "function", "function": {"name": "ls", "arguments": "{\"dir\":\"/\"}"}});
    let chat = [
        dialect_record(
            0,
            DialectKind::ChatCompletions,
            json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list /"}]}),
            json!({"choices": [{"message": {"role": "assistant", "content": "looking", "tool_calls": [call]}}]}),
        ),
        dialect_record(
            1,
            DialectKind::ChatCompletions,
            json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list /"},
                {"role": "assistant", "content": "looking", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "t1", "content": "bin etc"}]}),
            json!({"choices": [{"message": {"role": "assistant", "content": "bin and etc"}}]}),
        ),
    ];
    let tool_use = json!({"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "/"}});
    let anthropic = [
        dialect_record(
            0,
            DialectKind::Messages,
            json!({"system": "be brief", "messages": [{"role": "user", "content": "list /"}]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "looking"}, tool_use]}),
        ),
        dialect_record(
            1,
            DialectKind::Messages,
            json!({"system": [{"type": "text", "text": "be brief"}], "messages": [
                {"role": "user", "content": [{"type": "text", "text": "list /"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "looking"}, tool_use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "bin etc"}]}]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "bin and etc"}]}),
        ),
    ];
    let fc = json!({"type": "function_call", "call_id": "t1", "name": "ls", "arguments": "{\"dir\": \"/\"}"});
    let said = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "looking"}]});
    let responses = [
        dialect_record(
            0,
            DialectKind::Responses,
            json!({"instructions": "be brief", "input": "list /"}),
            json!({"id": "resp_1", "output": [said, fc]}),
        ),
        dialect_record(
            1,
            DialectKind::Responses,
            json!({"instructions": "be brief", "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "list /"}]}, said, fc,
                {"type": "function_call_output", "call_id": "t1", "output": "bin etc"}]}),
            json!({"id": "resp_2", "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "bin and etc"}]}]}),
        ),
    ];
    // Responses with server-side state: the second call continues `previous_response_id`.
    let chained = [
        responses[0].clone(),
        dialect_record(
            1,
            DialectKind::Responses,
            json!({"instructions": "be brief", "previous_response_id": "resp_1", "input": [
                {"type": "function_call_output", "call_id": "t1", "output": "bin etc"}]}),
            json!({"id": "resp_2", "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "bin and etc"}]}]}),
        ),
    ];
    let episode = |records: &[CallRecord]| {
        let mut b = EpisodeBuilder::new();
        for r in records {
            assert!(b.commit(r).is_some(), "{:?} added nothing", r.dialect);
        }
        b.episode("s")
    };
    let want = episode(&chat);
    assert_eq!(want.nodes.len(), 5);
    assert_eq!(want.branches.len(), 1);
    for (name, records) in [
        ("anthropic", &anthropic),
        ("responses", &responses),
        ("chained responses", &chained),
    ] {
        let got = episode(records);
        assert_eq!(shape(&got), shape(&want), "{name}");
        assert_eq!(
            got.nodes.iter().map(|n| &n.message).collect::<Vec<_>>(),
            want.nodes.iter().map(|n| &n.message).collect::<Vec<_>>(),
            "{name}"
        );
    }
}
