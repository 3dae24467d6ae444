//! The Qwen3 renderer against the Python reference (PyPI renderers==0.1.12, through
//! `oracle.py`): full renders, bridges (a Rust `Decline` exactly where Python returns
//! `None`) and parses agree id for id and field for field on generated conversations;
//! streamed parses agree with whole ones.

mod support;

use std::sync::Arc;

use intercept_tokens::{
    ChatMessage, ParsedResponse, ParsedToolCall, Qwen3Renderer, Rendered, Renderer,
    RendererOptions, StreamEvent, ThinkingRetention, Tokenizer, ToolSpec,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use support::{id_list, ids_of, oracle, quote, tokenizer, Oracle};

const CASES: u32 = 256;

// ---------------------------------------------------------------------------------
// Settings and comparisons

#[derive(Debug, Clone, Copy)]
struct Settings {
    thinking: bool,
    retention: Option<ThinkingRetention>,
    /// Messages and tools read as verifiers' train client reads them (through its Chat
    /// dialect on the Python side).
    verifiers: bool,
}

impl Settings {
    fn json(&self) -> String {
        let retention = match self.retention {
            None => "null",
            Some(ThinkingRetention::ToolCycle) => "\"tool_cycle\"",
            Some(ThinkingRetention::All) => "\"all\"",
        };
        format!(
            r#""enable_thinking":{},"thinking_retention":{},"via_verifiers":{}"#,
            self.thinking, retention, self.verifiers
        )
    }

    fn renderer(&self, tok: &Arc<Tokenizer>) -> Qwen3Renderer {
        let mut o = RendererOptions::default().with_enable_thinking(self.thinking);
        if let Some(r) = self.retention {
            o = o.with_thinking_retention(r);
        }
        Qwen3Renderer::new(tok.clone(), o).expect("the Qwen3 tokenizer has every token")
    }

    fn messages(&self, json: &str) -> Vec<ChatMessage> {
        if self.verifiers {
            ChatMessage::parse_array(json)
        } else {
            ChatMessage::parse_raw_array(json)
        }
        .unwrap_or_else(|e| panic!("{json} reads: {e}"))
    }

    fn tools(&self, json: &str) -> Vec<ToolSpec> {
        if self.verifiers {
            ToolSpec::parse_array(json)
        } else {
            ToolSpec::parse_raw_array(json)
        }
        .unwrap_or_else(|e| panic!("{json} reads: {e}"))
    }
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        any::<bool>(),
        prop_oneof![
            4 => Just(None),
            1 => Just(Some(ThinkingRetention::ToolCycle)),
            1 => Just(Some(ThinkingRetention::All)),
        ],
    )
        .prop_map(|(thinking, retention)| Settings {
            thinking,
            retention,
            verifiers: false,
        })
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

fn rendered_of(v: &Value) -> Rendered {
    Rendered {
        token_ids: ids_of(&v["token_ids"]),
        message_indices: v["message_indices"]
            .as_array()
            .expect("indices")
            .iter()
            .map(|x| x.as_i64().expect("an index") as i32)
            .collect(),
        sampled_mask: v["sampled_mask"]
            .as_array()
            .expect("a mask")
            .iter()
            .map(|x| x.as_bool().expect("a flag"))
            .collect(),
    }
}

/// Where two id lists first differ, decoded, for a readable failure.
fn diff(tok: &Tokenizer, ours: &[u32], theirs: &[u32]) -> String {
    let at = ours
        .iter()
        .zip(theirs)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.len().min(theirs.len()));
    let from = at.saturating_sub(8);
    format!(
        "lengths {} vs {}, first difference at {at}:\n ours:   {:?}\n theirs: {:?}",
        ours.len(),
        theirs.len(),
        tok.decode(&ours[from..(at + 8).min(ours.len())]),
        tok.decode(&theirs[from..(at + 8).min(theirs.len())]),
    )
}

fn same_rendered(
    tok: &Tokenizer,
    ours: &Rendered,
    theirs: &Rendered,
    what: &str,
) -> Result<(), TestCaseError> {
    check(ours.token_ids == theirs.token_ids, || {
        format!(
            "{what}: ids differ; {}",
            diff(tok, &ours.token_ids, &theirs.token_ids)
        )
    })?;
    check(ours.message_indices == theirs.message_indices, || {
        format!("{what}: message indices differ")
    })?;
    check(ours.sampled_mask == theirs.sampled_mask, || {
        format!("{what}: sampled masks differ")
    })
}

fn render_both(
    py: &mut Oracle,
    tok: &Arc<Tokenizer>,
    s: Settings,
    messages: &str,
    tools: &str,
    add_generation_prompt: bool,
) -> Result<Rendered, TestCaseError> {
    let r = s.renderer(tok);
    let ours = r
        .render(
            &s.messages(messages),
            &s.tools(tools),
            add_generation_prompt,
        )
        .map_err(|e| TestCaseError::fail(format!("render failed: {e}")))?;
    let answer = py.ask(&format!(
        r#"{{"op":"render","messages":{messages},"tools":{tools},"add_generation_prompt":{add_generation_prompt},{}}}"#,
        s.json()
    ));
    check(answer.get("error").is_none(), || {
        format!("the reference failed: {}", answer["trace"])
    })?;
    same_rendered(tok, &ours, &rendered_of(&answer), "render")?;
    Ok(ours)
}

fn bridge_both(
    py: &mut Oracle,
    tok: &Arc<Tokenizer>,
    s: Settings,
    prompt: &[u32],
    completion: &[u32],
    new_messages: &str,
    tools: &str,
) -> Result<Option<Rendered>, TestCaseError> {
    let r = s.renderer(tok);
    let ours = r.bridge(
        prompt,
        completion,
        &s.messages(new_messages),
        &s.tools(tools),
    );
    let answer = py.ask(&format!(
        r#"{{"op":"bridge","previous_prompt_ids":{},"previous_completion_ids":{},"new_messages":{new_messages},"tools":{tools},{}}}"#,
        id_list(prompt),
        id_list(completion),
        s.json()
    ));
    check(answer.get("error").is_none(), || {
        format!("the reference failed: {}", answer["trace"])
    })?;
    match (ours, answer.get("none").is_some()) {
        (Err(d), true) => {
            let _ = d.as_str();
            Ok(None)
        }
        (Ok(ours), false) => {
            same_rendered(tok, &ours, &rendered_of(&answer), "bridge")?;
            Ok(Some(ours))
        }
        (Err(d), false) => Err(TestCaseError::fail(format!(
            "we declined ({}: {d}) where the reference bridged",
            d.as_str()
        ))),
        (Ok(_), true) => Err(TestCaseError::fail(
            "we bridged where the reference declined",
        )),
    }
}

fn tool_call_of(v: &Value) -> ParsedToolCall {
    let span = ids_of(&v["token_span"]);
    ParsedToolCall {
        raw: v["raw"].as_str().expect("raw").to_owned(),
        name: v["name"].as_str().map(str::to_owned),
        arguments: v["arguments"].as_str().map(str::to_owned),
        status: match v["status"].as_str().expect("a status") {
            "ok" => intercept_tokens::ToolCallStatus::Ok,
            "invalid_json" => intercept_tokens::ToolCallStatus::InvalidJson,
            "unclosed_block" => intercept_tokens::ToolCallStatus::UnclosedBlock,
            "missing_name" => intercept_tokens::ToolCallStatus::MissingName,
            other => panic!("status {other}"),
        },
        token_span: (span[0] as usize, span[1] as usize),
    }
}

fn parse_both(
    py: &mut Oracle,
    tok: &Arc<Tokenizer>,
    s: Settings,
    completion: &[u32],
    prompt: &[u32],
) -> Result<ParsedResponse, TestCaseError> {
    let r = s.renderer(tok);
    let ours = r.parse(completion, prompt);
    let answer = py.ask(&format!(
        r#"{{"op":"parse","completion_ids":{},"prompt_ids":{},{}}}"#,
        id_list(completion),
        id_list(prompt),
        s.json()
    ));
    check(answer.get("error").is_none(), || {
        format!("the reference failed: {}", answer["trace"])
    })?;
    let theirs = ParsedResponse {
        content: answer["content"].as_str().expect("content").to_owned(),
        reasoning_content: answer["reasoning_content"].as_str().map(str::to_owned),
        tool_calls: answer["tool_calls"]
            .as_array()
            .expect("calls")
            .iter()
            .map(tool_call_of)
            .collect(),
        reasoning_complete: answer["reasoning_complete"].as_bool().expect("a flag"),
    };
    check(ours == theirs, || {
        format!(
            "parse differs for {:?}\n ours:   {ours:?}\n theirs: {theirs:?}",
            tok.decode(completion)
        )
    })?;
    Ok(ours)
}

/// The stream, fed in the given chunk sizes (cycled), joined.
fn streamed(
    r: &dyn Renderer,
    completion: &[u32],
    prompt: &[u32],
    chunks: &[usize],
) -> Vec<StreamEvent> {
    let mut s = r.stream(prompt);
    let mut events = Vec::new();
    let mut at = 0;
    let mut k = 0;
    while at < completion.len() {
        let n = chunks
            .get(k % chunks.len().max(1))
            .copied()
            .unwrap_or(1)
            .max(1);
        let end = (at + n).min(completion.len());
        events.extend(s.push(&completion[at..end]));
        at = end;
        k += 1;
    }
    events.extend(s.finish());
    events.extend(s.push(&completion[..completion.len().min(1)]));
    events
}

/// A stream's events equal the whole parse: content and reasoning joined, the calls in
/// order (a reasoning left open keeps its leading whitespace only in the whole parse).
fn same_as_parse(parsed: &ParsedResponse, events: &[StreamEvent]) -> Result<(), TestCaseError> {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            StreamEvent::Content(c) => content.push_str(c),
            StreamEvent::Reasoning(r) => reasoning.push_str(r),
            StreamEvent::ToolCall(t) => calls.push(t.clone()),
        }
    }
    let want_reasoning = parsed.reasoning_content.clone().unwrap_or_default();
    let want_reasoning = if parsed.reasoning_complete {
        want_reasoning
    } else {
        want_reasoning
            .trim_start_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
            .to_owned()
    };
    check(content == parsed.content, || {
        format!(
            "streamed content {content:?} vs parsed {:?}",
            parsed.content
        )
    })?;
    check(reasoning == want_reasoning, || {
        format!("streamed reasoning {reasoning:?} vs parsed {want_reasoning:?}")
    })?;
    check(calls == parsed.tool_calls, || {
        format!("streamed calls {calls:?} vs parsed {:?}", parsed.tool_calls)
    })
}

// ---------------------------------------------------------------------------------
// Generators: texts, JSON values, messages, completions

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-zA-Z]{1,8}".prop_map(String::from),
        3 => prop::sample::select(vec![" ", "  ", "\n", "\n\n", "\n\n\n", " \n", "\t", "\r\n", ".\n"]).prop_map(String::from),
        2 => prop::sample::select(vec!["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "🦀", "𝔘𝔫𝔦"]).prop_map(String::from),
        2 => prop::sample::select(vec!["中文", "日本語の", "한국어", "Ελληνικά", "русский", "עברית", "ไทย"]).prop_map(String::from),
        1 => prop::sample::select(vec!["e\u{301}", "a\u{308}\u{301}", "\u{1100}\u{1161}", "A\u{30a}", "\u{200d}"]).prop_map(String::from),
        2 => prop::sample::select(vec![
            "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
            "</tool_response>", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "</thi", "nk>",
        ]).prop_map(String::from),
        2 => prop::sample::select(vec![".", ",", "!", "?", ":", "\"", "\\", "{", "}", "[", "]", "'s", "-", "#"]).prop_map(String::from),
        1 => "[0-9]{1,6}".prop_map(String::from),
        1 => prop::sample::select(vec!["\u{1}", "\u{1f}", "\u{7f}", "\u{a0}", "\u{3000}", "\u{85}", "\u{1c}", "\u{2028}", "\u{feff}"]).prop_map(String::from),
    ]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..max).prop_map(|p| p.concat())
}

fn ws() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", "", " ", "\t", " \r "])
}

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => text(5).prop_map(|t| quote(&t)),
        1 => prop::sample::select(vec![
            r#""\u00e9t\u00e9""#, r#""\ud83d\ude00""#, r#""a\/b""#, r#""\u0000\u001f""#,
            r#""tab\tnl\nquote\"""#, r#""\\back""#, r#""""#,
        ]).prop_map(String::from),
    ]
}

fn json_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i32>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
        prop::sample::select(vec![
            "0",
            "-0",
            "12345678901234567890123456789",
            "-98765432109876543210",
            "1.5",
            "-0.0",
            "1e5",
            "1E-7",
            "3.14159",
            "2.5e+300",
            "0.1",
            "1e400",
            "1.0000000000000002",
            "123456789.123456789",
            "1e16",
            "1e15",
            "0.00001",
            "100.0",
            "5e-324",
        ])
        .prop_map(String::from),
    ]
}

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["a", "b", "z", "name", "arguments", "x y", "é", "😀", "type", "items"]).prop_map(quote),
        1 => Just(r#""a\u0062""#.to_owned()),
    ]
}

fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        json_number(),
        json_string(),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..4), ws())
                .prop_map(|(items, w)| { format!("[{w}{}{w}]", items.join(&format!(",{w}"))) }),
            (prop::collection::vec((json_key(), inner), 0..4), ws()).prop_map(|(members, w)| {
                let body: Vec<String> = members
                    .into_iter()
                    .map(|(k, v)| format!("{k}{w}:{w}{v}"))
                    .collect();
                format!("{{{w}{}{w}}}", body.join(&format!(",{w}")))
            }),
        ]
    })
}

fn json_object() -> impl Strategy<Value = String> {
    (
        prop::collection::vec((json_key(), json_value()), 0..4),
        ws(),
    )
        .prop_map(|(members, w)| {
            let body: Vec<String> = members
                .into_iter()
                .map(|(k, v)| format!("{k}:{w}{v}"))
                .collect();
            format!("{{{}}}", body.join(","))
        })
}

fn tool_name() -> impl Strategy<Value = String> {
    prop_oneof![
        5 => prop::sample::select(vec!["get_weather", "search", "run_bash", "read_file", "f"]).prop_map(String::from),
        1 => prop::sample::select(vec!["naïve_tool", "工具", "a\"b", "tab\tname"]).prop_map(String::from),
    ]
}

fn tools_json(verifiers: bool) -> impl Strategy<Value = String> {
    let tool = (tool_name(), text(4), json_object(), 0u8..4).prop_map(move |(name, desc, params, shape)| {
        let name = quote(&name);
        let desc = quote(&desc);
        match shape {
            0 => format!(r#"{{"type":"function","function":{{"name":{name},"description":{desc},"parameters":{params}}}}}"#),
            1 => format!(r#"{{"function":{{"parameters":{params},"name":{name}}},"type":"function"}}"#),
            2 if verifiers => format!(r#"{{"type":"function","function":{{"name":{name},"strict":true,"parameters":{params}}}}}"#),
            2 => format!(r#"{{"name":{name},"description":{desc},"parameters":{params}}}"#),
            _ => format!(r#"{{"type":"function","function":{{"name":{name},"description":{desc}}}}}"#),
        }
    });
    prop_oneof![
        1 => Just("[]".to_owned()),
        3 => prop::collection::vec(tool, 1..4).prop_map(|t| format!("[{}]", t.join(","))),
    ]
}

#[derive(Debug, Clone)]
enum ContentG {
    Absent,
    Null,
    Text(String),
    /// (kind, text): 0 a text part, 1 an image, 2 a bare string, 3 another typed text
    Parts(Vec<(u8, String)>),
}

impl ContentG {
    fn json(&self) -> Option<String> {
        match self {
            ContentG::Absent => None,
            ContentG::Null => Some("null".to_owned()),
            ContentG::Text(t) => Some(quote(t)),
            ContentG::Parts(parts) => {
                let items: Vec<String> = parts
                    .iter()
                    .map(|(k, t)| match k {
                        0 => format!(r#"{{"type":"text","text":{}}}"#, quote(t)),
                        1 => {
                            r#"{"type":"image_url","image_url":{"url":"https://x.invalid/a.png"}}"#
                                .to_owned()
                        }
                        2 => quote(t),
                        _ => format!(r#"{{"type":"input_text","text":{}}}"#, quote(t)),
                    })
                    .collect();
                Some(format!("[{}]", items.join(",")))
            }
        }
    }
}

fn content(verifiers: bool) -> impl Strategy<Value = ContentG> {
    let part_kinds: Vec<u8> = if verifiers {
        vec![0, 0, 1, 2, 3]
    } else {
        vec![0, 0, 0, 1, 2]
    };
    prop_oneof![
        6 => text(12).prop_map(ContentG::Text),
        1 => Just(ContentG::Null),
        1 => Just(ContentG::Absent),
        2 => prop::collection::vec((prop::sample::select(part_kinds), text(5)), 0..4).prop_map(ContentG::Parts),
    ]
}

#[derive(Debug, Clone)]
struct CallG {
    name: Option<String>,
    /// 0: arguments as a JSON value, 1: as a string holding JSON, 2: missing, 3: as a
    /// string holding any text
    args_kind: u8,
    args: String,
    /// `name` and `arguments` on the call itself, no `function` (renderers' flat shape)
    flat: bool,
}

fn call(verifiers: bool) -> impl Strategy<Value = CallG> {
    (
        prop_oneof![9 => tool_name().prop_map(Some), 1 => Just(None)],
        0u8..4,
        prop_oneof![3 => json_object(), 1 => json_value()],
        text(4),
        any::<bool>(),
    )
        .prop_map(move |(name, kind, value, any_text, flat)| {
            let kind = if verifiers {
                if kind % 2 == 0 {
                    1
                } else {
                    3
                }
            } else {
                kind
            };
            CallG {
                name: if verifiers {
                    Some(name.unwrap_or_else(|| "f".into()))
                } else {
                    name
                },
                args_kind: kind,
                args: if kind == 3 { any_text } else { value },
                flat: flat && !verifiers,
            }
        })
}

impl CallG {
    fn json(&self, n: usize) -> String {
        let mut f = Vec::new();
        if let Some(name) = &self.name {
            f.push(format!(r#""name":{}"#, quote(name)));
        }
        match self.args_kind {
            0 => f.push(format!(r#""arguments":{}"#, self.args)),
            1 | 3 => f.push(format!(r#""arguments":{}"#, quote(&self.args))),
            _ => {}
        }
        if self.flat {
            f.insert(0, format!(r#""id":"call_{n}""#));
            format!("{{{}}}", f.join(","))
        } else {
            format!(
                r#"{{"id":"call_{n}","type":"function","function":{{{}}}}}"#,
                f.join(",")
            )
        }
    }
}

#[derive(Debug, Clone)]
struct MsgG {
    role: &'static str,
    content: ContentG,
    /// (key, value) of the reasoning fields
    reasoning: Vec<(&'static str, String)>,
    calls: Vec<CallG>,
}

impl MsgG {
    fn json(&self, n: usize) -> String {
        let mut f = vec![format!(r#""role":"{}""#, self.role)];
        if let Some(c) = self.content.json() {
            f.push(format!(r#""content":{c}"#));
        }
        for (k, v) in &self.reasoning {
            f.push(format!(r#""{k}":{}"#, quote(v)));
        }
        if !self.calls.is_empty() {
            let calls: Vec<String> = self
                .calls
                .iter()
                .enumerate()
                .map(|(k, c)| c.json(n * 10 + k))
                .collect();
            f.push(format!(r#""tool_calls":[{}]"#, calls.join(",")));
        }
        if self.role == "tool" {
            f.push(format!(r#""tool_call_id":"call_{n}""#));
        }
        format!("{{{}}}", f.join(","))
    }
}

fn messages_json(msgs: &[MsgG]) -> String {
    let items: Vec<String> = msgs.iter().enumerate().map(|(n, m)| m.json(n)).collect();
    format!("[{}]", items.join(","))
}

fn reasoning_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => text(8),
        1 => text(6).prop_map(|t| format!("\n{t}\n")),
        1 => Just(String::new()),
    ]
}

fn assistant(verifiers: bool) -> impl Strategy<Value = MsgG> {
    let keys: Vec<&'static str> = if verifiers {
        vec!["reasoning_content", "reasoning", "reasoning_details"]
    } else {
        vec!["reasoning_content"]
    };
    (
        prop_oneof![
            3 => content(verifiers),
            1 => (text(5), text(5)).prop_map(|(r, c)| ContentG::Text(format!("<think>\n{r}\n</think>\n\n{c}"))),
            1 => (text(5), text(5)).prop_map(|(r, c)| ContentG::Text(format!("{r}</think>{c}"))),
        ],
        prop::collection::vec((prop::sample::select(keys), reasoning_text()), 0..2),
        prop_oneof![2 => Just(0usize), 1 => 1usize..4],
        prop::collection::vec(call(verifiers), 3),
    )
        .prop_map(|(content, reasoning, n_calls, calls)| MsgG {
            role: "assistant",
            content,
            reasoning,
            calls: calls.into_iter().take(n_calls).collect(),
        })
}

fn simple(role: &'static str, verifiers: bool) -> impl Strategy<Value = MsgG> {
    prop_oneof![
        5 => content(verifiers),
        1 => text(4).prop_map(|t| ContentG::Text(format!("<tool_response>\n{t}\n</tool_response>"))),
    ]
    .prop_map(move |content| MsgG {
        role,
        content,
        reasoning: Vec::new(),
        calls: Vec::new(),
    })
}

fn message(verifiers: bool) -> impl Strategy<Value = MsgG> {
    let mut roles = vec!["user", "tool", "system"];
    if verifiers {
        roles.push("developer");
    }
    prop_oneof![
        3 => assistant(verifiers),
        4 => prop::sample::select(roles).prop_flat_map(move |r| simple(r, verifiers)),
    ]
}

/// A conversation: an optional system message, then turns.
fn conversation(verifiers: bool, max: usize) -> impl Strategy<Value = Vec<MsgG>> {
    (
        prop::option::of(simple("system", verifiers)),
        prop::collection::vec(message(verifiers), 1..max),
    )
        .prop_map(|(system, rest)| system.into_iter().chain(rest).collect())
}

/// The tail after a sampled turn: tool results, users, systems (now and then an
/// assistant, which the bridge refuses).
fn tail() -> impl Strategy<Value = Vec<MsgG>> {
    prop_oneof![
        1 => Just(Vec::new()),
        12 => prop::collection::vec(
            prop_oneof![
                6 => simple("tool", false),
                3 => simple("user", false),
                1 => simple("system", false),
                1 => assistant(false),
            ],
            1..5,
        ),
    ]
}

/// A completion as the model might write it, or as junk.
#[derive(Debug, Clone)]
enum Frag {
    Text(String),
    /// One of the format's special ids
    Special(u8),
    /// The first ids of a text's encoding (a character cut short)
    Cut(String, usize),
    /// `\n{json}\n`, a tool call's body
    Body(String),
    /// `<|im_start|>assistant\n`
    Header,
}

fn frag() -> impl Strategy<Value = Frag> {
    prop_oneof![
        5 => text(6).prop_map(Frag::Text),
        4 => (0u8..8).prop_map(Frag::Special),
        1 => (prop::sample::select(vec!["😀", "👍🏽中", "日本", "é"]), 1usize..4).prop_map(|(s, k)| Frag::Cut(s.to_owned(), k)),
        2 => body().prop_map(Frag::Body),
        1 => Just(Frag::Header),
    ]
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        5 => (tool_name(), json_object(), ws()).prop_map(|(n, a, w)| format!(r#"{{"name":{w}{},{w}"arguments":{w}{a}}}"#, quote(&n))),
        1 => (tool_name(), json_value()).prop_map(|(n, a)| format!(r#"{{"arguments": {a}, "name": {}}}"#, quote(&n))),
        1 => json_value(),
        1 => json_object().prop_map(|a| format!(r#"{{"name": "", "arguments": {a}}}"#)),
        1 => json_object().prop_map(|a| format!(r#"{{"name": 7, "arguments": {a}}}"#)),
        1 => text(5),
        1 => json_object().prop_map(|a| format!(r#"{{"name": "f", "arguments": {a}"#)),
    ]
}

/// A completion shaped like Qwen3's: header?, whitespace?, reasoning?, content, calls,
/// an end.
fn shaped() -> impl Strategy<Value = Vec<Frag>> {
    (
        prop::option::weighted(0.1, Just(Frag::Header)),
        prop::option::weighted(
            0.2,
            prop::sample::select(vec!["\n", " ", "\n\n", "\u{3000}"])
                .prop_map(|s| Frag::Text(s.to_owned())),
        ),
        prop::option::weighted(0.7, (text(10), prop::sample::select(vec![0u8, 0, 0, 1, 2]))),
        text(10),
        prop::collection::vec((body(), any::<bool>()), 0..3),
        prop::sample::select(vec![0u8, 0, 0, 1, 2, 3]),
    )
        .prop_map(|(header, lead, think, content, calls, end)| {
            let mut f: Vec<Frag> = header.into_iter().chain(lead).collect();
            if let Some((r, close)) = think {
                f.push(Frag::Special(0));
                f.push(Frag::Text(format!("\n{r}\n")));
                match close {
                    0 => {
                        f.push(Frag::Special(1));
                        f.push(Frag::Text("\n\n".into()));
                    }
                    1 => f.push(Frag::Special(2)), // a tool call opens inside the reasoning
                    _ => {}
                }
            }
            f.push(Frag::Text(content));
            let n = calls.len();
            for (k, (b, closed)) in calls.into_iter().enumerate() {
                if k > 0 {
                    f.push(Frag::Text("\n".into()));
                }
                f.push(Frag::Special(2));
                f.push(Frag::Body(b));
                if closed || k + 1 < n {
                    f.push(Frag::Special(3));
                }
            }
            match end {
                0 => f.push(Frag::Special(4)),
                1 => f.push(Frag::Special(5)),
                2 => {}
                _ => {
                    f.push(Frag::Special(4));
                    f.push(Frag::Text("after the stop".into()));
                }
            }
            f
        })
}

fn completion() -> impl Strategy<Value = Vec<Frag>> {
    prop_oneof![
        3 => shaped(),
        2 => prop::collection::vec(frag(), 0..14),
    ]
}

fn ids_of_frags(tok: &Tokenizer, frags: &[Frag]) -> Vec<u32> {
    let special = |k: u8| {
        let name = [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<|im_end|>",
            "<|endoftext|>",
            "<|im_start|>",
            "<tool_response>",
        ][k as usize % 8];
        tok.token_id(name).expect("a special token")
    };
    let mut ids = Vec::new();
    for f in frags {
        match f {
            Frag::Text(t) => ids.extend(tok.encode(t)),
            Frag::Special(k) => ids.push(special(*k)),
            Frag::Cut(s, k) => {
                let e = tok.encode(s);
                ids.extend(&e[..(*k).min(e.len())]);
            }
            Frag::Body(b) => ids.extend(tok.encode(&format!("\n{b}\n"))),
            Frag::Header => ids.extend(tok.encode("<|im_start|>assistant\n")),
        }
    }
    ids
}

/// The prompt a completion continues.
#[derive(Debug, Clone, Copy)]
enum PromptG {
    /// A rendered conversation with the generation prompt
    Generation,
    /// ... and `<think>\n` after it: the completion starts inside the reasoning
    Prefilled,
    /// ... and a closed empty think block
    Closed,
    /// No prompt at all
    Empty,
}

fn prompt_kind() -> impl Strategy<Value = PromptG> {
    prop_oneof![
        4 => Just(PromptG::Generation),
        2 => Just(PromptG::Prefilled),
        1 => Just(PromptG::Closed),
        1 => Just(PromptG::Empty),
    ]
}

fn prompt_ids(tok: &Tokenizer, r: &Qwen3Renderer, kind: PromptG) -> Vec<u32> {
    let base = || {
        r.render(&[ChatMessage::user("Hi")], &[], true)
            .expect("renders")
            .token_ids
    };
    match kind {
        PromptG::Generation => base(),
        PromptG::Prefilled => {
            let mut p = base();
            p.extend(tok.encode("<think>\n"));
            p
        }
        PromptG::Closed => {
            let mut p = base();
            p.extend(tok.encode("<think>\n\n</think>\n\n"));
            p
        }
        PromptG::Empty => Vec::new(),
    }
}

/// What a property's cases went through, so that a property cannot pass vacuously.
#[derive(Default)]
struct Coverage(std::cell::RefCell<std::collections::BTreeMap<String, usize>>);

impl Coverage {
    fn hit(&self, what: impl Into<String>) {
        *self.0.borrow_mut().entry(what.into()).or_default() += 1;
    }

    fn require(&self, needed: &[&str]) {
        let seen = self.0.borrow();
        eprintln!("coverage: {seen:?}");
        for n in needed {
            assert!(seen.contains_key(*n), "no case went through {n}: {seen:?}");
        }
    }
}

fn runner() -> TestRunner {
    runner_of(CASES)
}

fn runner_of(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

// ---------------------------------------------------------------------------------
// The tests

/// The check a reader can redo by hand: a system and a user message with one tool, a
/// completion that thinks and calls the tool, then the tool's result.
#[test]
fn worked_example() {
    let Some(tok) = tokenizer() else { return };
    let Some(mut py) = oracle() else { return };
    let s = Settings {
        thinking: true,
        retention: None,
        verifiers: true,
    };
    let messages = r#"[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the weather in Paris?"}]"#;
    let tools = r#"[{"type":"function","function":{"name":"get_weather","description":"Current weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#;
    let prompt = render_both(&mut py, &tok, s, messages, tools, true).expect("renders alike");
    assert!(tok
        .decode(&prompt.token_ids)
        .ends_with("What is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"));

    let mut completion = tok.encode(
        "<think>\nThe user wants the weather; I should call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    );
    completion.push(tok.token_id("<|im_end|>").expect("known"));
    let parsed =
        parse_both(&mut py, &tok, s, &completion, &prompt.token_ids).expect("parses alike");
    assert_eq!(parsed.content, "");
    assert_eq!(
        parsed.reasoning_content.as_deref(),
        Some("The user wants the weather; I should call the tool.")
    );
    assert_eq!(parsed.tool_calls.len(), 1);
    let call = &parsed.tool_calls[0];
    assert_eq!(call.status, intercept_tokens::ToolCallStatus::Ok);
    assert_eq!(call.name.as_deref(), Some("get_weather"));
    assert_eq!(call.arguments.as_deref(), Some(r#"{"city": "Paris"}"#));

    let tail = r#"[{"role":"tool","tool_call_id":"call_0","content":"Paris"}]"#;
    let bridged = bridge_both(
        &mut py,
        &tok,
        s,
        &prompt.token_ids,
        &completion,
        tail,
        tools,
    )
    .expect("bridges alike")
    .expect("bridges");
    let mut previous = prompt.token_ids.clone();
    previous.extend(&completion);
    assert!(bridged.token_ids.starts_with(&previous));
    assert!(tok.decode(&bridged.token_ids).ends_with(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nParis\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ));
    // A new user query re-renders under the default retention; the stream agrees.
    let query = r#"[{"role":"user","content":"And in Rome?"}]"#;
    assert!(bridge_both(
        &mut py,
        &tok,
        s,
        &prompt.token_ids,
        &completion,
        query,
        tools
    )
    .expect("declines alike")
    .is_none());
    let r = s.renderer(&tok);
    same_as_parse(&parsed, &streamed(&r, &completion, &prompt.token_ids, &[1]))
        .expect("streams alike");
}

#[test]
fn renders_agree() {
    let Some(tok) = tokenizer() else { return };
    let Some(py) = oracle() else { return };
    let py = std::cell::RefCell::new(py);
    runner()
        .run(
            &(
                settings(),
                conversation(false, 9),
                tools_json(false),
                any::<bool>(),
            ),
            |(s, msgs, tools, gen)| {
                let mut py = py.borrow_mut();
                let json = messages_json(&msgs);
                render_both(&mut py, &tok, s, &json, &tools, gen)?;
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn renders_through_verifiers_agree() {
    let Some(tok) = tokenizer() else { return };
    let Some(py) = oracle() else { return };
    let py = std::cell::RefCell::new(py);
    runner()
        .run(
            &(settings(), conversation(true, 9), tools_json(true)),
            |(s, msgs, tools)| {
                let mut py = py.borrow_mut();
                let s = Settings {
                    verifiers: true,
                    ..s
                };
                let json = messages_json(&msgs);
                render_both(&mut py, &tok, s, &json, &tools, true)?;
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn bridges_agree() {
    let seen = Coverage::default();
    let Some(tok) = tokenizer() else { return };
    let Some(py) = oracle() else { return };
    let py = std::cell::RefCell::new(py);
    runner()
        .run(
            &(
                settings(),
                conversation(false, 6),
                tools_json(false),
                prop_oneof![3 => assistant(false).prop_map(Ok), 2 => completion().prop_map(Err)],
                0u8..6,
                tail(),
                prompt_kind(),
            ),
            |(s, history, tools, sampled, cut, tail, kind)| {
                let mut py = py.borrow_mut();
                let r = s.renderer(&tok);
                // The previous prompt: the history with the generation prompt (or an
                // edited one: the last message dropped), sometimes prefilled.
                let history_json = messages_json(&history);
                let mut prompt =
                    render_both(&mut py, &tok, s, &history_json, &tools, true)?.token_ids;
                match kind {
                    PromptG::Prefilled => prompt.extend(tok.encode("<think>\n")),
                    PromptG::Empty => prompt.clear(),
                    _ => {}
                }
                // The previous completion: an assistant message's sampled ids as the
                // renderer writes them (whole, or cut short), or any completion.
                let completion = match sampled {
                    Ok(msg) => {
                        let mut with = history.clone();
                        with.push(msg);
                        let full =
                            render_both(&mut py, &tok, s, &messages_json(&with), &tools, false)?;
                        let last = (with.len() - 1) as i32;
                        let mine: Vec<u32> = full
                            .token_ids
                            .iter()
                            .zip(&full.message_indices)
                            .zip(&full.sampled_mask)
                            .filter(|((_, m), s)| **m == last && **s)
                            .map(|((t, _), _)| *t)
                            .collect();
                        let keep = match cut {
                            0 => mine.len().saturating_sub(1),
                            1 => mine.len() / 2,
                            _ => mine.len(),
                        };
                        mine[..keep].to_vec()
                    }
                    Err(frags) => ids_of_frags(&tok, &frags),
                };
                let tail_json = messages_json(&tail);
                let bridged =
                    bridge_both(&mut py, &tok, s, &prompt, &completion, &tail_json, &tools)?;
                match r.bridge(&prompt, &completion, &s.messages(&tail_json), &[]) {
                    Err(d) => seen.hit(d.as_str()),
                    Ok(_) => seen.hit("bridged"),
                }
                if let Some(b) = bridged {
                    check(b.token_ids.starts_with(&prompt), || {
                        "the bridge keeps the prompt".into()
                    })?;
                    check(b.token_ids.len() == b.message_indices.len(), || {
                        "one index per id".into()
                    })?;
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    seen.require(&[
        "bridged",
        "empty_previous_prompt",
        "no_new_messages",
        "assistant_in_tail",
        "open_reasoning_at_stop",
        "thinking_retention",
    ]);
}

#[test]
fn parses_agree_and_streams_match() {
    let seen = Coverage::default();
    let Some(tok) = tokenizer() else { return };
    let Some(py) = oracle() else { return };
    let py = std::cell::RefCell::new(py);
    runner()
        .run(
            &(
                settings(),
                completion(),
                prompt_kind(),
                prop::collection::vec(1usize..6, 1..4),
            ),
            |(s, frags, kind, chunks)| {
                let mut py = py.borrow_mut();
                let r = s.renderer(&tok);
                let completion = ids_of_frags(&tok, &frags);
                let prompt = prompt_ids(&tok, &r, kind);
                let parsed = parse_both(&mut py, &tok, s, &completion, &prompt)?;
                for t in &parsed.tool_calls {
                    seen.hit(t.status.as_str());
                }
                if !parsed.reasoning_complete {
                    seen.hit("open reasoning");
                } else if parsed.reasoning_content.is_some() {
                    seen.hit(if parsed.content.is_empty() {
                        "reasoning"
                    } else {
                        "reasoning and content"
                    });
                } else if !parsed.content.is_empty() {
                    seen.hit("content only");
                }
                if r.prompt_ends_in_reasoning(&prompt) {
                    seen.hit("prefilled");
                }
                // Split at every id boundary, then in random chunks.
                same_as_parse(&parsed, &streamed(&r, &completion, &prompt, &[1]))?;
                same_as_parse(&parsed, &streamed(&r, &completion, &prompt, &chunks))?;
                same_as_parse(&parsed, &streamed(&r, &completion, &prompt, &[usize::MAX]))?;
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    seen.require(&[
        "ok",
        "invalid_json",
        "unclosed_block",
        "missing_name",
        "open reasoning",
        "reasoning",
        "reasoning and content",
        "content only",
        "prefilled",
    ]);
}

/// Multi-turn episodes as a train client runs them: render the first turn, then bridge
/// each next one from the previous prompt and the completion the model "sampled" (the
/// renderer's own ids of a generated assistant message), whichever side declines.
#[test]
fn episodes_agree() {
    let seen = Coverage::default();
    let Some(tok) = tokenizer() else { return };
    let Some(py) = oracle() else { return };
    let py = std::cell::RefCell::new(py);
    // A turn: the model's reply, the messages after it, and now and then an edit of an
    // earlier message's text (the harness rewrote its history: a full render follows).
    let turn = (
        assistant(false),
        tail(),
        prop::option::weighted(0.15, (any::<prop::sample::Index>(), text(6))),
    );
    // Each case is several turns of two or three calls each.
    runner_of(CASES / 2)
        .run(
            &(
                settings(),
                conversation(false, 4),
                tools_json(false),
                prop::collection::vec(turn, 1..5),
            ),
            |(s, start, tools, turns)| {
                let mut py = py.borrow_mut();
                let mut history = start;
                let mut prompt =
                    render_both(&mut py, &tok, s, &messages_json(&history), &tools, true)?
                        .token_ids;
                for (reply, tail, edit) in turns {
                    let mut with = history.clone();
                    with.push(reply.clone());
                    let full = render_both(&mut py, &tok, s, &messages_json(&with), &tools, false)?;
                    let last = (with.len() - 1) as i32;
                    let completion: Vec<u32> = full
                        .token_ids
                        .iter()
                        .zip(&full.message_indices)
                        .zip(&full.sampled_mask)
                        .filter(|((_, m), s)| **m == last && **s)
                        .map(|((t, _), _)| *t)
                        .collect();
                    parse_both(&mut py, &tok, s, &completion, &prompt)?;
                    history = with;
                    history.extend(tail.iter().cloned());
                    if let Some((at, text)) = edit {
                        let k = at.index(history.len());
                        if history[k].role != "assistant" {
                            history[k].content = ContentG::Text(text);
                            seen.hit("edited");
                            prompt = render_both(
                                &mut py,
                                &tok,
                                s,
                                &messages_json(&history),
                                &tools,
                                true,
                            )?
                            .token_ids;
                            continue;
                        }
                    }
                    prompt = match bridge_both(
                        &mut py,
                        &tok,
                        s,
                        &prompt,
                        &completion,
                        &messages_json(&tail),
                        &tools,
                    )? {
                        Some(b) => {
                            seen.hit("bridged");
                            b.token_ids
                        }
                        None => {
                            seen.hit("rendered again");
                            render_both(&mut py, &tok, s, &messages_json(&history), &tools, true)?
                                .token_ids
                        }
                    };
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    seen.require(&["bridged", "rendered again", "edited"]);
}
