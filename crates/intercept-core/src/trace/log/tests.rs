//! The log's invariant: every call rebuilt from the log is the call that was recorded
//! (request and response JSON-equal, every other field equal), and the episode read
//! back is the episode the writer built.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::{JsonBody, RawJson, TokenCapture, Usage};

/// A record of `dialect` with this request and response.
pub(crate) fn record(
    seq: u64,
    dialect: DialectKind,
    request: &Value,
    response: Option<&Value>,
) -> CallRecord {
    CallRecord {
        session: "s".into(),
        seq,
        dialect,
        endpoint: "/x".into(),
        model: "m".into(),
        requested_model: None,
        stream: false,
        sampling: Default::default(),
        request: JsonBody::parse(serde_json::to_vec(request).expect("json").into()).expect("body"),
        response: response.map(RawJson::from_value),
        finish_reason: None,
        usage: Usage::default(),
        status: 200,
        started_at: 1.5,
        ended_at: 2.5,
        ttfb_ms: None,
        client_disconnected: false,
        error: None,
        epoch: 0,
        engine: None,
        token_capture: TokenCapture::Off,
        prompt_token_ids: None,
        completion_token_ids: None,
        completion_logprobs: None,
        token_path: None,
        token_reason: None,
        node: None,
        policy: None,
        truncated: false,
        sampled: Default::default(),
    }
}

/// Writes `records` as a log (header, calls, end) and checks that the log gives each
/// back, and the episode; returns the log's text.
fn round_trip(records: Vec<CallRecord>) -> Vec<u8> {
    let mut log = LogWriter::new("s");
    let mut text = log.header(json!({"model": "m"}));
    let mut written = Vec::new();
    for mut r in records {
        log.record(&mut r, &mut text);
        written.push(r);
    }
    text.extend(log.end(&LogEnd {
        calls: written.len() as u64,
        ..LogEnd::default()
    }));
    let read = LogReader::from_bytes(&text).expect("log");
    assert!(read.skipped().is_empty(), "{:?}", read.skipped());
    assert!(!read.incomplete());
    assert_eq!(read.calls().len(), written.len());
    for (i, want) in written.iter().enumerate() {
        let got = read.record(i).expect("record");
        assert_eq!(
            got.request.to_value(),
            want.request.to_value(),
            "call {i} request"
        );
        assert_eq!(
            got.response.as_ref().map(RawJson::to_value),
            want.response.as_ref().map(RawJson::to_value),
            "call {i} response"
        );
        let mut a = serde_json::to_value(&got).expect("json");
        let mut b = serde_json::to_value(want).expect("json");
        for v in [&mut a, &mut b] {
            let o = v.as_object_mut().expect("object");
            o.remove("request");
            o.remove("response");
        }
        assert_eq!(a, b, "call {i}");
    }
    assert_eq!(read.episode(), log.episode());
    text
}

#[test]
fn a_conversation_is_written_as_what_each_call_adds() {
    let long = "a tool result that is long enough to be a value ".repeat(4);
    let tools = json!([{"type": "function", "function": {"name": "run", "description": "x".repeat(300),
        "parameters": {"type": "object"}}}]);
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut records = Vec::new();
    for turn in 0..6u64 {
        messages.push(json!({"role": "user", "content": format!("{long} {turn}")}));
        let request = json!({"model": "x", "messages": messages.clone(), "tools": tools, "n": 1});
        let answer = json!({"role": "assistant", "content": format!("answer {turn} {long}")});
        let response = json!({"id": format!("c{turn}"), "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]});
        records.push(record(
            turn,
            DialectKind::ChatCompletions,
            &request,
            Some(&response),
        ));
        messages.push(answer);
    }
    let text = round_trip(records);
    let text = String::from_utf8(text).expect("utf-8");
    // The tool list once, each tool result once (its user message and its node share
    // it), each answer once (response, node and the next request share it).
    assert_eq!(text.matches(&"x".repeat(300)).count(), 1);
    assert_eq!(text.matches("answer 3 a tool").count(), 1);
    assert_eq!(text.matches("\"type\":\"value\"").count(), 2 + 6 + 6);
    // The last call keeps the one before's conversation and adds two messages.
    let last = text
        .lines()
        .rev()
        .find(|l| l.contains("\"type\":\"call\""))
        .expect("call");
    assert!(
        last.contains("\"$a\":{\"base\":4,\"keep\":10,\"add\":[{"),
        "{last}"
    );
}

#[test]
fn marker_shaped_values_failed_calls_and_deep_values_come_back() {
    let deep = (0..120).fold(json!(1), |v, _| json!([v]));
    let request = json!({"messages": [{"role": "user", "content": "hi"}], "$v": 1,
        "metadata": {"$a": {"base": 0}}, "deep": deep, "x": {"$j": "t", "$e": 2}});
    let failed = {
        let mut r = record(0, DialectKind::ChatCompletions, &request, None);
        r.status = 502;
        r.error = Some(CallError {
            kind: crate::ErrorKind::UpstreamStatus,
            message: "bad gateway".into(),
            status: 502,
        });
        r
    };
    let response = json!({"$v": 0});
    let odd = record(1, DialectKind::ChatCompletions, &request, Some(&response));
    round_trip(vec![failed, odd]);
}

#[test]
fn a_response_that_is_not_text_becomes_a_null_with_an_error_and_the_log_stays_whole() {
    // JSON (what `RawJson` holds) whose strings are not UTF-8: the one thing a recorded
    // body can still fail on; at the top, in a member, in the answer, in a marker.
    let request = json!({"messages": [{"role": "user", "content": "hi"}]});
    let bodies: [&[u8]; 4] = [
        b"\"\xff\"",
        b"{\"id\": \"\xfe\", \"choices\": []}",
        b"{\"id\": \"x\", \"choices\": [{\"message\": {\"content\": \"\xc3\"}}]}",
        b"{\"$v\": [\"\xff\"]}",
    ];
    let mut log = LogWriter::new("s");
    let mut text = log.header(json!({}));
    for (seq, body) in bodies.iter().enumerate() {
        let mut r = record(seq as u64, DialectKind::ChatCompletions, &request, None);
        r.response = Some(RawJson::new(bytes::Bytes::copy_from_slice(body)));
        log.record(&mut r, &mut text);
    }
    // Every line is JSON, and each call says what went wrong.
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        serde_json::from_slice::<Value>(line).expect("a JSON line");
    }
    let read = LogReader::from_bytes(&text).expect("log");
    assert!(read.skipped().is_empty(), "{:?}", read.skipped());
    for seq in 0..bodies.len() {
        let got = read.record(seq).expect("record");
        assert!(got.response.is_none(), "call {seq}");
        let error = got.error.expect("an error");
        assert_eq!(error.kind, crate::ErrorKind::Internal);
        assert!(
            error.message.contains("the response is not UTF-8 JSON"),
            "{}",
            error.message
        );
        assert_eq!(got.request.to_value(), request);
    }
}

#[test]
fn a_torn_or_crashed_log_reads_up_to_its_last_whole_line() {
    let mut log = LogWriter::new("s");
    let mut text = log.header(json!({}));
    for seq in 0..3 {
        let request = json!({"messages": [{"role": "user", "content": format!("q{seq}")}]});
        let response = json!({"choices": [{"message": {"role": "assistant", "content": "a"}}]});
        let mut r = record(seq, DialectKind::ChatCompletions, &request, Some(&response));
        log.record(&mut r, &mut text);
    }
    let whole = LogReader::from_bytes(&text).expect("log");
    assert!(whole.incomplete(), "no end line");
    assert_eq!(whole.calls().len(), 3);
    let cut = &text[..text.len() - 5];
    let torn = LogReader::from_bytes(cut).expect("log");
    assert!(torn.incomplete());
    assert_eq!(torn.calls().len(), 2);
    assert_eq!(torn.skipped().len(), 1);
    assert!(torn.record(1).is_ok());
    // Cut after the last call's node lines, before its call line: those nodes take their
    // messages from that line, so the episode is the first two calls'.
    let last_call = text[..text.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .expect("lines");
    let before = LogReader::from_bytes(&text[..last_call + 1]).expect("log");
    assert_eq!(before.calls().len(), 2);
    assert_eq!(before.nodes().len(), 4);
    assert_eq!(before.episode().nodes.len(), 4);
    assert!(before.skipped().is_empty(), "{:?}", before.skipped());
    // An end line after them: they are left out, and said to be.
    let mut ended = text[..last_call + 1].to_vec();
    ended.extend(log.end(&LogEnd::default()));
    let ended = LogReader::from_bytes(&ended).expect("log");
    assert_eq!(ended.nodes().len(), 4);
    assert_eq!(ended.end().expect("end").summary.nodes, 4);
    assert!(
        ended.skipped()[0].1.contains("left out"),
        "{:?}",
        ended.skipped()
    );
    // A log of another schema is refused, naming it.
    let other = b"{\"type\":\"header\",\"schema\":\"intercept.trace/9\",\"session\":\"s\"}\n";
    let e = LogReader::from_bytes(other).expect_err("refused");
    assert!(e.to_string().contains("intercept.trace/9"), "{e}");
}

/// Short sessions of small messages (one to five calls, in each dialect, with a small
/// tool list): their log is no larger than the same calls as full records (one call: as
/// the full format's files), and a call line leaves out what the call before said.
#[test]
fn a_short_session_logs_no_more_than_its_full_records() {
    let settings = json!({"model": "m", "sampling": {"temperature": 0.7},
        "limits": {"max_turns": null, "max_input_tokens": null},
        "upstream": ["http://127.0.0.1:8000/v1"], "capture_tokens": false});
    for dialect in [
        DialectKind::ChatCompletions,
        DialectKind::Messages,
        DialectKind::Responses,
    ] {
        for calls in 1..=5u64 {
            let mut log = LogWriter::new("rollout-17");
            let mut text = log.header(settings.clone());
            let mut full = 0;
            let mut items = Vec::new();
            for seq in 0..calls {
                items.push(user(dialect, &format!("step {seq}: go on"), false));
                let (response, back) = answer(dialect, seq, &format!("step {seq}"), seq % 2 == 0);
                let mut r = record(seq, dialect, &request(dialect, &items), Some(&response));
                r.session = "rollout-17".into();
                r.endpoint = "/chat/completions".into();
                r.model = "policy-model".into();
                r.requested_model = Some("gpt-4o-mini".into());
                r.finish_reason = Some("stop".into());
                r.engine = Some("http://127.0.0.1:8000/v1".into());
                r.usage = Usage {
                    prompt_tokens: 40 + 20 * seq,
                    completion_tokens: 9,
                    ..Usage::default()
                };
                r.started_at = 1.796e9 + seq as f64 * 0.731;
                r.ended_at = r.started_at + 0.0123;
                r.ttfb_ms = Some(11.25);
                full += r.to_json_vec().len() + 1;
                log.record(&mut r, &mut text);
                items.extend(back);
            }
            text.extend(log.end(&LogEnd {
                calls,
                ..LogEnd::default()
            }));
            // One call: the log's header and end line are more than the record's
            // session id and defaults, so it is held to the full format's files (the
            // record and the episode file); from two calls on, to the records alone.
            if calls == 1 {
                full += serde_json::to_vec(&log.episode()).expect("json").len() + 1;
            }
            assert!(
                text.len() <= full,
                "{dialect:?}, {calls} calls: the log is {} bytes, the full records {full}\n{}",
                text.len(),
                String::from_utf8_lossy(&text)
            );
            let read = LogReader::from_bytes(&text).expect("log");
            assert!(read.skipped().is_empty(), "{:?}", read.skipped());
            assert_eq!(read.records().expect("records").len(), calls as usize);
            // The messages the calls carry are written there only: no user message
            // stands in a node line.
            let nodes: Vec<&[u8]> = text
                .split(|&b| b == b'\n')
                .filter(|l| l.starts_with(b"{\"type\":\"node\""))
                .collect();
            assert!(
                nodes
                    .iter()
                    .all(|l| !String::from_utf8_lossy(l).contains("\"role\":\"user\"")),
                "{dialect:?}: {}",
                String::from_utf8_lossy(&text)
            );
            assert!(
                nodes
                    .iter()
                    .any(|l| String::from_utf8_lossy(l).contains("\"from\":")),
                "{dialect:?}"
            );
            if calls > 1 {
                let last = text
                    .split(|&b| b == b'\n')
                    .rfind(|l| l.starts_with(b"{\"type\":\"call\""))
                    .expect("a call line");
                let last = String::from_utf8_lossy(last);
                assert!(!last.contains("\"model\":\"policy-model\""), "{last}");
                assert!(last.contains("\"usage\":"), "{last}");
            }
        }
    }
}

/// A harness's conversation in one dialect.
#[derive(Debug, Clone)]
struct Lineage {
    dialect: DialectKind,
    items: Vec<Value>,
    tokens: Vec<u32>,
}

#[derive(Debug, Clone)]
enum Op {
    /// A call on lineage `l` (text `t`), failing or not, a tool call, an image, tokens.
    Turn {
        l: usize,
        t: String,
        fail: bool,
        tool: bool,
        image: bool,
        tokens: u8,
    },
    /// The last request sent again (an SDK retry that reached the upstream).
    Retry,
    /// Lineage `l` compacted: its first item and its last two.
    Compact(usize),
    /// Item `i` of lineage `l` rewritten.
    Edit(usize, usize, String),
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z \"\\\\é😀\\n]{0,12}",
        "[a-z \"\\\\é\\n{}$]{60,90}",
        Just("{\"$v\":0}".to_owned()),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..3, text(), any::<bool>(), any::<bool>(), proptest::bool::weighted(0.2), 0u8..4)
            .prop_map(|(l, t, fail, tool, image, tokens)| Op::Turn { l, t, fail: fail && tokens == 0, tool, image, tokens }),
        1 => Just(Op::Retry),
        1 => (0usize..3).prop_map(Op::Compact),
        1 => (0usize..3, 0usize..6, text()).prop_map(|(l, i, t)| Op::Edit(l, i, t)),
    ]
}

/// The user item of a dialect.
fn user(dialect: DialectKind, t: &str, image: bool) -> Value {
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==".repeat(3);
    match (dialect, image) {
        (DialectKind::Messages, true) => {
            json!({"role": "user", "content": [{"type": "text", "text": t},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]})
        }
        (DialectKind::Messages, false) => json!({"role": "user", "content": t}),
        (DialectKind::Responses, true) => {
            json!({"role": "user", "content": [{"type": "input_text", "text": t},
            {"type": "input_image", "image_url": format!("data:image/png;base64,{png}")}]})
        }
        (DialectKind::Responses, false) => json!({"type": "message", "role": "user", "content": t}),
        (_, true) => json!({"role": "user", "content": [{"type": "text", "text": t},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}}]}),
        (_, false) => json!({"role": "user", "content": t}),
    }
}

/// The answer of a dialect: (response, the items the harness sends back).
fn answer(dialect: DialectKind, seq: u64, t: &str, tool: bool) -> (Value, Vec<Value>) {
    let id = format!("call_{seq}");
    match dialect {
        DialectKind::Messages => {
            let mut content = vec![json!({"type": "text", "text": format!("ok {t}")})];
            if tool {
                content.push(
                    json!({"type": "tool_use", "id": id, "name": "run", "input": {"cmd": t}}),
                );
            }
            let back = json!({"role": "assistant", "content": content});
            let mut items = vec![back];
            if tool {
                items.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": format!("out {t}")}]}));
            }
            (
                json!({"id": format!("msg_{seq}"), "type": "message", "role": "assistant", "content": content,
                "stop_reason": if tool {"tool_use"} else {"end_turn"}, "usage": {"input_tokens": 3, "output_tokens": 2}}),
                items,
            )
        }
        DialectKind::Responses => {
            let mut output = vec![
                json!({"type": "message", "role": "assistant", "id": format!("m{seq}"),
                "content": [{"type": "output_text", "text": format!("ok {t}")}]}),
            ];
            if tool {
                output.push(
                    json!({"type": "function_call", "call_id": id, "name": "run",
                    "arguments": format!("{{\"cmd\":{}}}", json!(t))}),
                );
            }
            let mut items = output.clone();
            if tool {
                items.push(json!({"type": "function_call_output", "call_id": id, "output": format!("out {t}")}));
            }
            (
                json!({"id": format!("resp_{seq}"), "object": "response", "output": output, "status": "completed"}),
                items,
            )
        }
        _ => {
            let mut message = json!({"role": "assistant", "content": format!("ok {t}")});
            if tool {
                message["tool_calls"] = json!([{"id": id, "type": "function",
                    "function": {"name": "run", "arguments": format!("{{\"cmd\":{}}}", json!(t))}}]);
            }
            // The harness sends the answer back without the fields it does not keep.
            let mut back = message.clone();
            back["refusal"] = Value::Null;
            let mut items = vec![if seq.is_multiple_of(2) {
                message.clone()
            } else {
                back
            }];
            if tool {
                items.push(
                    json!({"role": "tool", "tool_call_id": id, "content": format!("out {t}")}),
                );
            }
            (
                json!({"id": format!("c{seq}"), "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
                items,
            )
        }
    }
}

fn request(dialect: DialectKind, items: &[Value]) -> Value {
    let tools = json!([{"name": "run", "description": "runs a command ".repeat(30),
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]);
    match dialect {
        DialectKind::Messages => {
            json!({"model": "x", "system": "you are a careful agent ".repeat(4),
            "messages": items, "tools": tools, "max_tokens": 64})
        }
        DialectKind::Responses => json!({"model": "x", "instructions": "be brief", "input": items,
            "tools": tools, "store": false}),
        _ => json!({"model": "x", "messages": items, "tools": tools, "temperature": 0.5}),
    }
}

fn session(ops: &[Op]) -> Vec<CallRecord> {
    let dialects = [
        DialectKind::ChatCompletions,
        DialectKind::Messages,
        DialectKind::Responses,
    ];
    let mut lineages: Vec<Lineage> = dialects
        .iter()
        .map(|&dialect| Lineage {
            dialect,
            items: Vec::new(),
            tokens: Vec::new(),
        })
        .collect();
    let mut out: Vec<CallRecord> = Vec::new();
    for op in ops {
        let seq = out.len() as u64;
        match op {
            Op::Turn {
                l,
                t,
                fail,
                tool,
                image,
                tokens,
            } => {
                let lin = &mut lineages[*l];
                lin.items.push(user(lin.dialect, t, *image));
                let req = request(lin.dialect, &lin.items);
                if *fail {
                    let mut r = record(seq, lin.dialect, &req, None);
                    r.status = 500;
                    r.error = Some(CallError {
                        kind: crate::ErrorKind::UpstreamStatus,
                        message: "down".into(),
                        status: 500,
                    });
                    out.push(r);
                    continue;
                }
                let (response, back) = answer(lin.dialect, seq, t, *tool);
                let mut r = record(seq, lin.dialect, &req, Some(&response));
                r.stream = seq.is_multiple_of(3);
                r.finish_reason = Some("stop".into());
                // The fields most calls leave at their defaults, set now and then (the
                // call line writes each by hand).
                if seq % 4 == 1 {
                    r.requested_model = Some("harness \"model\"".into());
                    r.sampling = json!({"temperature": 0.7, "stop": ["\n"], "top_p": 1})
                        .as_object()
                        .cloned()
                        .unwrap_or_default();
                    r.ttfb_ms = Some(12.5);
                    r.client_disconnected = true;
                    r.epoch = seq;
                    r.engine = Some("http://engine/v1".into());
                    r.truncated = true;
                    r.policy = Some(crate::network::PolicyEvent::new(vec![
                        "tools[0].type".into()
                    ]));
                    r.usage = Usage {
                        prompt_tokens: 10,
                        completion_tokens: 3,
                        cached_input_tokens: 2,
                        reasoning_tokens: 1,
                    };
                    r.started_at = 1.0e9 + seq as f64 / 3.0;
                    r.ended_at = r.started_at + 0.125;
                }
                if *tokens > 0 {
                    // Prompt ids extend the path's (or, once in a while, do not).
                    let mut prompt = if *tokens == 3 {
                        vec![9, 9]
                    } else {
                        lin.tokens.clone()
                    };
                    prompt.extend([seq as u32, 1, 2]);
                    let completion = vec![100 + seq as u32, 7];
                    r.token_capture = TokenCapture::Captured;
                    r.completion_logprobs = (*tokens != 2).then(|| vec![-0.5, -0.25]);
                    lin.tokens = [prompt.clone(), completion.clone()].concat();
                    r.prompt_token_ids = Some(prompt);
                    r.completion_token_ids = Some(completion);
                }
                lin.items.extend(back);
                out.push(r);
            }
            Op::Retry => {
                if let Some(last) = out.last() {
                    let mut again = last.clone();
                    again.seq = seq;
                    again.node = None;
                    out.push(again);
                }
            }
            Op::Compact(l) => {
                let items = &mut lineages[*l].items;
                if items.len() > 3 {
                    let keep = [
                        items[0].clone(),
                        items[items.len() - 2].clone(),
                        items[items.len() - 1].clone(),
                    ];
                    *items = keep.to_vec();
                }
            }
            Op::Edit(l, i, t) => {
                let lin = &mut lineages[*l];
                if let Some(item) = lin.items.get_mut(*i) {
                    *item = user(lin.dialect, t, false);
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any session: three dialects interleaved (subagents), tool loops, images,
    /// compaction, edits, failures, retries, token capture with and without breaks,
    /// text with escapes and marker-shaped strings.
    #[test]
    fn every_call_and_the_episode_come_back_from_the_log(ops in proptest::collection::vec(op(), 1..40)) {
        round_trip(session(&ops));
    }
}
