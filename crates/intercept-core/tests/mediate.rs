//! Network-policy mediation, rule by rule and dialect by dialect: exact output bodies and
//! removed paths; then properties over generated bodies.

use bytes::Bytes;
use intercept_core::network::NOTICE;
use intercept_core::{
    mediate_request, ChatDialect, Dialect, JsonBody, MessagesDialect, NetworkPolicy, OnViolation,
    ResponsesDialect,
};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The text that replaces removed content, as the harness reads it.
const REMOVED_PLACEHOLDER: &str = "[content removed by the network policy]";
/// The 1×1 PNG that replaces a removed screenshot.
const BLANK_PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";

fn body(v: &Value) -> JsonBody {
    JsonBody::parse(Bytes::from(serde_json::to_vec(v).expect("json"))).expect("body")
}

/// `*.ok.org` only: URLs under ok.org pass, and web search can be domain-filtered.
fn ok_org() -> NetworkPolicy {
    NetworkPolicy::new(&["*.ok.org"], &[] as &[&str]).expect("policy")
}

fn with_notice(text: &str) -> String {
    format!("{text}\n\n{NOTICE}")
}

struct Case {
    name: &'static str,
    policy: NetworkPolicy,
    input: Value,
    output: Value,
    paths: &'static [&'static str],
}

fn run(dialect: &dyn Dialect, cases: Vec<Case>) {
    for case in cases {
        let mut b = body(&case.input);
        let paths = dialect.mediate(&mut b, &case.policy).expect(case.name);
        assert_eq!(paths, case.paths, "{}: paths", case.name);
        assert_eq!(b.to_value(), case.output, "{}: body", case.name);
        // Once more changes nothing.
        let again = dialect.mediate(&mut b, &case.policy).expect(case.name);
        assert!(
            again.is_empty(),
            "{}: second pass removed {again:?}",
            case.name
        );
        assert_eq!(b.to_value(), case.output, "{}: second pass", case.name);
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[test]
fn chat_rules() {
    let msgs = json!([user("hi")]);
    let noticed = json!([user(&with_notice("hi"))]);
    run(
        &ChatDialect,
        vec![
            Case {
                name: "nothing to remove: untouched, no notice",
                policy: ok_org(),
                input: json!({"model": "m", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://cdn.ok.org/x.png"}},
                    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                    {"type": "file", "file": {"file_data": "JVBERi0=", "filename": "a.pdf"}}]}],
                    "tools": [{"type": "function", "function": {"name": "f"}}], "audio": {"voice": "alloy"}}),
                output: json!({"model": "m", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://cdn.ok.org/x.png"}},
                    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                    {"type": "file", "file": {"file_data": "JVBERi0=", "filename": "a.pdf"}}]}],
                    "tools": [{"type": "function", "function": {"name": "f"}}], "audio": {"voice": "alloy"}}),
                paths: &[],
            },
            Case {
                name: "web_search_options and plugins",
                policy: ok_org(),
                input: json!({"messages": msgs, "web_search_options": {}, "plugins": [{"id": "web"}]}),
                output: json!({"messages": noticed}),
                paths: &["web_search_options", "plugins"],
            },
            Case {
                name: "audio with a voice id drops the audio modality",
                policy: ok_org(),
                input: json!({"messages": msgs, "audio": {"voice": {"id": "voice_1"}, "format": "mp3"},
                    "modalities": ["text", "audio"]}),
                output: json!({"messages": noticed, "modalities": ["text"]}),
                paths: &["audio.voice.id", "modalities[1]"],
            },
            Case {
                name: "server tools removed, client tools kept, tool_choice of a kept tool kept",
                policy: ok_org(),
                input: json!({"messages": msgs, "tools": [
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "web_search"},
                    {"type": "custom", "custom": {"name": "c"}}],
                    "tool_choice": {"type": "function", "function": {"name": "f"}}}),
                output: json!({"messages": noticed, "tools": [
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "custom", "custom": {"name": "c"}}],
                    "tool_choice": {"type": "function", "function": {"name": "f"}}}),
                paths: &["tools[1].type"],
            },
            Case {
                name: "no tool left: tools, tool_choice and parallel_tool_calls go",
                policy: ok_org(),
                input: json!({"messages": msgs, "tools": [{"type": "web_search"}, {"type": "mcp"}],
                    "tool_choice": "required", "parallel_tool_calls": true}),
                output: json!({"messages": noticed}),
                paths: &["tools[0].type", "tools[1].type", "parallel_tool_calls", "tool_choice"],
            },
            Case {
                name: "allowed_tools choice filtered to the tools left",
                policy: ok_org(),
                input: json!({"messages": msgs, "tools": [
                    {"type": "function", "function": {"name": "f"}}, {"type": "browser"}],
                    "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                        {"type": "function", "function": {"name": "f"}}, {"type": "browser"}]}}}),
                output: json!({"messages": noticed, "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                        {"type": "function", "function": {"name": "f"}}]}}}),
                paths: &["tools[1].type", "tool_choice"],
            },
            Case {
                name: "message audio ids, unknown parts, blocked URLs, file ids and file URLs",
                policy: ok_org(),
                input: json!({"messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "https://evil.com/x.png"}},
                        {"type": "image_url", "image_url": "https://ok.org.evil.com/y.png"},
                        {"type": "video_url", "video_url": {"url": "https://ok.org/v"}},
                        {"type": "file", "file": {"file_id": "file-1"}},
                        {"type": "file", "file": {"file_data": "https://evil.com/a.pdf"}},
                        {"type": "file", "file": {"file_url": "https://docs.ok.org/a.pdf"}}]},
                    {"role": "assistant", "audio": {"id": "audio_1"}, "content": null}]}),
                output: json!({"messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "look"},
                        {"type": "file", "file": {"file_url": "https://docs.ok.org/a.pdf"}},
                        {"type": "text", "text": NOTICE}]},
                    {"role": "assistant", "content": null}]}),
                paths: &["messages[1].content[1].image_url.url", "messages[1].content[2].image_url",
                    "messages[1].content[3].type", "messages[1].content[4].file.file_id",
                    "messages[1].content[5].file.file_data", "messages[2].audio.id"],
            },
            Case {
                name: "an emptied content list gets the placeholder; the notice goes to the earliest user message",
                policy: NetworkPolicy::deny_all(),
                input: json!({"messages": [user("first"), {"role": "assistant", "content": "a"},
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://ok.org/i.png"}}]}]}),
                output: json!({"messages": [user(&with_notice("first")), {"role": "assistant", "content": "a"},
                    {"role": "user", "content": [{"type": "text", "text": REMOVED_PLACEHOLDER}]}]}),
                paths: &["messages[2].content[0].image_url.url"],
            },
            Case {
                name: "no user message: one is added after the system messages",
                policy: ok_org(),
                input: json!({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
                    "plugins": []}),
                output: json!({"messages": [{"role": "system", "content": "s"}, user(NOTICE),
                    {"role": "assistant", "content": "a"}]}),
                paths: &["plugins"],
            },
        ],
    );
}

#[test]
fn responses_rules() {
    let allowed = json!({"allowed_domains": ["ok.org"]});
    run(
        &ResponsesDialect,
        vec![
            Case {
                name: "stored state: previous_response_id, conversation, prompt, plugins",
                policy: ok_org(),
                input: json!({"model": "m", "input": "go on", "previous_response_id": "resp_1",
                    "conversation": "conv_1", "prompt": {"id": "pmpt_1"}, "plugins": []}),
                output: json!({"model": "m", "input": with_notice("go on")}),
                paths: &["previous_response_id", "conversation", "prompt", "plugins"],
            },
            Case {
                name: "no input left: a user message carries the notice",
                policy: ok_org(),
                input: json!({"previous_response_id": "resp_1"}),
                output: json!({"input": [user(NOTICE)]}),
                paths: &["previous_response_id"],
            },
            Case {
                name: "tools: client kept, server removed, web_search domain-filtered, namespaces recurse",
                policy: ok_org(),
                input: json!({"input": "q", "tools": [
                    {"type": "function", "name": "f"},
                    {"type": "web_search"},
                    {"type": "web_search_preview"},
                    {"type": "file_search", "vector_store_ids": ["vs"]},
                    {"type": "local_shell"}, {"type": "apply_patch"}, {"type": "computer_use_preview"},
                    {"type": "shell"}, {"type": "shell", "environment": {"type": "container_auto"}},
                    {"type": "tool_search", "execution": "client"}, {"type": "tool_search"},
                    {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}, {"type": "mcp"}]},
                    {"type": "namespace", "name": "gone", "tools": [{"type": "image_generation"}]}]}),
                output: json!({"input": with_notice("q"), "tools": [
                    {"type": "function", "name": "f"},
                    {"type": "web_search", "filters": allowed},
                    {"type": "local_shell"}, {"type": "apply_patch"}, {"type": "computer_use_preview"},
                    {"type": "shell"},
                    {"type": "tool_search", "execution": "client"},
                    {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]}]}),
                paths: &["tools[1].filters.allowed_domains", "tools[2].type", "tools[3].type",
                    "tools[8].environment.type", "tools[10].execution", "tools[11].tools[1].type",
                    "tools[12].tools[0].type"],
            },
            Case {
                name: "web_search filter intersected with the request's; a choice of a removed tool goes",
                policy: ok_org(),
                input: json!({"input": "q", "tools": [
                    {"type": "web_search", "filters": {"allowed_domains": ["docs.ok.org", "evil.com"]}},
                    {"type": "code_interpreter"}],
                    "tool_choice": {"type": "code_interpreter"}}),
                output: json!({"input": with_notice("q"), "tools": [
                    {"type": "web_search", "filters": {"allowed_domains": ["docs.ok.org"]}}]}),
                paths: &["tools[0].filters.allowed_domains", "tools[1].type", "tool_choice"],
            },
            Case {
                name: "a policy that is no domain filter removes web_search",
                policy: NetworkPolicy::new(&["*"], &["evil.com"]).expect("policy"),
                input: json!({"input": "q", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}),
                output: json!({"input": with_notice("q")}),
                paths: &["tools[0].type", "tool_choice"],
            },
            Case {
                name: "items: references, stateless reasoning, server calls, images, files, screenshots",
                policy: ok_org(),
                input: json!({"input": [
                    {"role": "developer", "content": "d"},
                    {"type": "item_reference", "id": "msg_1"},
                    {"type": "reasoning", "id": "rs_1", "summary": []},
                    {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAA"},
                    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                    {"role": "user", "content": [
                        {"type": "input_text", "text": "see"},
                        {"type": "input_image", "image_url": "https://evil.com/a.png"},
                        {"type": "input_image", "file_id": "file-1"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                        {"type": "input_file", "file_url": "https://ok.org/a.pdf"},
                        {"type": "input_file", "file_id": "file-2"}]},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": [
                        {"type": "input_image", "image_url": "https://evil.com/b.png"}]},
                    {"type": "computer_call_output", "call_id": "c2", "output":
                        {"type": "computer_screenshot", "image_url": "https://evil.com/s.png"}}]}),
                output: json!({"input": [
                    {"role": "developer", "content": "d"},
                    {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAA"},
                    {"role": "user", "content": [
                        {"type": "input_text", "text": "see"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                        {"type": "input_file", "file_url": "https://ok.org/a.pdf"},
                        {"type": "input_text", "text": NOTICE}]},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": [
                        {"type": "input_text", "text": REMOVED_PLACEHOLDER}]},
                    {"type": "computer_call_output", "call_id": "c2", "output":
                        {"type": "computer_screenshot", "image_url": BLANK_PNG}}]}),
                paths: &["input[1].id", "input[2].encrypted_content", "input[4].type",
                    "input[5].content[1].image_url", "input[5].content[2].file_id",
                    "input[5].content[5].file_id", "input[7].output[0].image_url",
                    "input[8].output.image_url"],
            },
        ],
    );
}

#[test]
fn messages_rules() {
    run(
        &MessagesDialect,
        vec![
            Case {
                name: "container and mcp_servers",
                policy: ok_org(),
                input: json!({"model": "m", "max_tokens": 8, "messages": [user("hi")],
                    "container": "cntr_1", "mcp_servers": [{"type": "url", "url": "https://ok.org/mcp", "name": "x"}]}),
                output: json!({"model": "m", "max_tokens": 8, "messages": [user(&with_notice("hi"))]}),
                paths: &["container", "mcp_servers"],
            },
            Case {
                name: "tools: custom and versioned client tools kept, server tools removed or domain-filtered",
                policy: ok_org(),
                input: json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "tools": [
                    {"name": "f", "input_schema": {"type": "object"}},
                    {"type": "custom", "name": "g", "input_schema": {"type": "object"}},
                    {"type": "bash_20250124", "name": "bash"},
                    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                    {"type": "memory_20250818", "name": "memory"},
                    {"type": "code_execution_20250825", "name": "code_execution"},
                    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                    {"type": "web_fetch_20250910", "name": "web_fetch", "blocked_domains": ["x.ok.org"],
                        "allowed_callers": ["code_execution_20250825"]},
                    {"type": "bash_2025", "name": "b2"},
                    {"name": "no_schema"}]}),
                output: json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                        {"type": "text", "text": NOTICE}]}], "tools": [
                    {"name": "f", "input_schema": {"type": "object"}},
                    {"type": "custom", "name": "g", "input_schema": {"type": "object"}},
                    {"type": "bash_20250124", "name": "bash"},
                    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                    {"type": "memory_20250818", "name": "memory"},
                    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3, "allowed_domains": ["ok.org"]},
                    {"type": "web_fetch_20250910", "name": "web_fetch", "allowed_domains": ["ok.org"],
                        "allowed_callers": ["direct"]}]}),
                paths: &["tools[5].type", "tools[6].allowed_domains", "tools[7].allowed_domains",
                    "tools[7].blocked_domains", "tools[7].allowed_callers", "tools[8].type",
                    "tools[9].input_schema"],
            },
            Case {
                name: "deny all: web search removed, its tool_choice too",
                policy: NetworkPolicy::deny_all(),
                input: json!({"messages": [user("hi")], "tools": [
                    {"name": "f", "input_schema": {}}, {"type": "web_search_20250305", "name": "web_search"}],
                    "tool_choice": {"type": "tool", "name": "web_search"}}),
                output: json!({"messages": [user(&with_notice("hi"))], "tools": [{"name": "f", "input_schema": {}}]}),
                paths: &["tools[1].type", "tool_choice"],
            },
            Case {
                name: "content: url and file sources, unknown blocks, nested tool results, system blocks",
                policy: ok_org(),
                input: json!({"system": [{"type": "text", "text": "s"}, {"type": "image", "source": {"type": "file", "file_id": "f0"}}],
                    "messages": [
                    {"role": "user", "content": [
                        {"type": "image", "source": {"type": "url", "url": "https://evil.com/a.png"}},
                        {"type": "image", "source": {"type": "url", "url": "https://img.ok.org/a.png"}},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                        {"type": "document", "source": {"type": "file", "file_id": "file_1"}},
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "t"}}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "ok"},
                        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
                        {"type": "tool_use", "id": "tu_1", "name": "f", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [
                        {"type": "image", "source": {"type": "url", "url": "http://10.0.0.1/x.png"}}]}]}]}),
                output: json!({"system": [{"type": "text", "text": "s"}],
                    "messages": [
                    {"role": "user", "content": [
                        {"type": "image", "source": {"type": "url", "url": "https://img.ok.org/a.png"}},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "t"}},
                        {"type": "text", "text": NOTICE}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "ok"},
                        {"type": "tool_use", "id": "tu_1", "name": "f", "input": {}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [
                        {"type": "text", "text": REMOVED_PLACEHOLDER}]}]}]}),
                paths: &["system[1].source.file_id", "messages[0].content[0].source.url",
                    "messages[0].content[3].source.file_id", "messages[1].content[1].type",
                    "messages[2].content[0].content[0].source.url"],
            },
            Case {
                name: "no user message: one is added first",
                policy: ok_org(),
                input: json!({"messages": [{"role": "assistant", "content": "a"}], "container": "c"}),
                output: json!({"messages": [user(NOTICE), {"role": "assistant", "content": "a"}]}),
                paths: &["container"],
            },
        ],
    );
}

#[test]
fn count_tokens_bodies_are_mediated_like_messages() {
    // `/v1/messages/count_tokens` takes the Messages body without `max_tokens`.
    let input = json!({"model": "m", "messages": [user("hi")], "tools": [
        {"type": "web_search_20250305", "name": "web_search"}], "mcp_servers": []});
    let mut b = body(&input);
    let paths = MessagesDialect
        .mediate(&mut b, &NetworkPolicy::deny_all())
        .expect("mediate");
    assert_eq!(paths, ["mcp_servers", "tools[0].type"]);
    assert_eq!(
        b.to_value(),
        json!({"model": "m", "messages": [user(&with_notice("hi"))]})
    );
}

#[test]
fn reject_mode_names_the_first_path_and_leaves_the_body() {
    let policy = ok_org().with_on_violation(OnViolation::Reject);
    let input =
        json!({"input": "q", "previous_response_id": "r", "tools": [{"type": "file_search"}]});
    let mut b = body(&input);
    let e = mediate_request(&ResponsesDialect, &policy, &mut b).expect_err("rejected");
    assert_eq!(e.status(), 400);
    assert!(
        e.to_string()
            .starts_with("network policy: `previous_response_id` (and 1 more: tools[0].type)"),
        "{e}"
    );
    assert_eq!(b.to_value(), input);
    // A clean request passes untouched.
    let clean = json!({"input": "q", "tools": [{"type": "function", "name": "f"}]});
    let mut b = body(&clean);
    assert_eq!(
        mediate_request(&ResponsesDialect, &policy, &mut b).expect("ok"),
        None
    );
    assert_eq!(b.to_value(), clean);
}

#[test]
fn unchanged_members_stay_slices_of_the_source() {
    let text = r#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a  b"}],"plugins":[1],"metadata":{"k":"v"}}"#;
    let mut b = JsonBody::parse(Bytes::from_static(text.as_bytes())).expect("body");
    let event = mediate_request(&ChatDialect, &NetworkPolicy::deny_all(), &mut b)
        .expect("mediate")
        .expect("removed");
    assert_eq!(event.code, "provider_capability_unavailable");
    assert_eq!(event.paths, ["plugins"]);
    let chunks = b.chunks();
    let source = b.source().as_ptr() as usize..b.source().as_ptr() as usize + text.len();
    let shared: Vec<&[u8]> = chunks
        .iter()
        .filter(|c| source.contains(&(c.as_ptr() as usize)))
        .map(|c| &c[..])
        .collect();
    // `model` and `metadata` are slices of the harness's bytes; `messages` was rebuilt
    // with its untouched assistant message copied byte for byte.
    assert!(shared.contains(&&br#""model":"m""#[..]), "{chunks:?}");
    assert!(
        shared.contains(&&br#""metadata":{"k":"v"}"#[..]),
        "{chunks:?}"
    );
    let out = String::from_utf8(b.to_bytes().to_vec()).expect("utf-8");
    assert!(
        out.contains(r#"{"role":"assistant","content":"a  b"}"#),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

const URLS: &[&str] = &[
    "data:image/png;base64,AAAA",
    "https://ok.org/a.png",
    "https://cdn.ok.org/b.png",
    "https://evil.com/c.png",
    "https://ok.org@evil.com/d.png",
    "http://10.0.0.1/e.png",
    "file:///etc/passwd",
    "ftp://ok.org/f",
];

fn url() -> impl Strategy<Value = String> {
    prop::sample::select(URLS).prop_map(str::to_owned)
}

fn chat_part() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z ]{0,6}".prop_map(|t| json!({"type": "text", "text": t})),
        url().prop_map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
        url().prop_map(|u| json!({"type": "image_url", "image_url": u})),
        Just(json!({"type": "file", "file": {"file_id": "file-1"}})),
        url().prop_map(|u| json!({"type": "file", "file": {"file_url": u}})),
        url().prop_map(|u| json!({"type": "file", "file": {"file_data": u}})),
        Just(json!({"type": "video_url", "video_url": {"url": "https://ok.org/v"}})),
    ]
}

fn chat_body() -> impl Strategy<Value = Value> {
    let tool = prop::sample::select(&["function", "custom", "web_search", "mcp", "browser"][..])
        .prop_map(|t| json!({"type": t, t: {"name": format!("{t}_tool")}}));
    let message = (
        prop::sample::select(&["user", "assistant", "system", "tool"][..]),
        prop::collection::vec(chat_part(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(role, parts, string)| {
            if string {
                json!({"role": role, "content": "text"})
            } else {
                json!({"role": role, "content": parts})
            }
        });
    (
        prop::collection::vec(message, 1..5),
        prop::collection::vec(tool, 0..4),
        any::<(bool, bool, bool)>(),
    )
        .prop_map(|(messages, tools, (search, plugins, choice))| {
            let mut b = json!({"model": "m", "messages": messages});
            if !tools.is_empty() {
                b["tools"] = json!(tools);
            }
            if search {
                b["web_search_options"] = json!({});
            }
            if plugins {
                b["plugins"] = json!([{"id": "web"}]);
            }
            if choice {
                b["tool_choice"] =
                    json!({"type": "function", "function": {"name": "web_search_tool"}});
            }
            b
        })
}

fn responses_body() -> impl Strategy<Value = Value> {
    let part = prop_oneof![
        "[a-z]{0,4}".prop_map(|t| json!({"type": "input_text", "text": t})),
        url().prop_map(|u| json!({"type": "input_image", "image_url": u})),
        Just(json!({"type": "input_image", "file_id": "file-1"})),
        url().prop_map(|u| json!({"type": "input_file", "file_url": u})),
        Just(json!({"type": "input_file", "file_id": "file-2"})),
    ];
    let item = prop_oneof![
        prop::collection::vec(part.clone(), 0..3)
            .prop_map(|c| json!({"role": "user", "content": c})),
        Just(json!({"type": "item_reference", "id": "msg_1"})),
        Just(json!({"type": "reasoning", "id": "rs_1", "summary": []})),
        Just(json!({"type": "mcp_call", "id": "mcp_1"})),
        prop::collection::vec(part, 0..3)
            .prop_map(|o| json!({"type": "function_call_output", "call_id": "c", "output": o})),
        url().prop_map(|u| json!({"type": "computer_call_output", "call_id": "c",
            "output": {"type": "computer_screenshot", "image_url": u}})),
    ];
    let tool = prop::sample::select(
        &[
            "function",
            "web_search",
            "web_search_preview",
            "file_search",
            "mcp",
            "local_shell",
        ][..],
    )
    .prop_map(|t| json!({"type": t, "name": t}));
    (
        prop::collection::vec(item, 0..5),
        prop::collection::vec(tool, 0..4),
        any::<(bool, bool)>(),
    )
        .prop_map(|(input, tools, (previous, prompt))| {
            let mut b = json!({"model": "m", "input": input, "tools": tools});
            if previous {
                b["previous_response_id"] = json!("resp_1");
            }
            if prompt {
                b["prompt"] = json!({"id": "pmpt_1"});
            }
            b
        })
}

fn messages_body() -> impl Strategy<Value = Value> {
    let block = prop_oneof![
        "[a-z]{0,4}".prop_map(|t| json!({"type": "text", "text": t})),
        url().prop_map(|u| json!({"type": "image", "source": {"type": "url", "url": u}})),
        Just(json!({"type": "document", "source": {"type": "file", "file_id": "file_1"}})),
        Just(json!({"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}})),
        url().prop_map(
            |u| json!({"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": u}}]})
        ),
    ];
    let message = (
        prop::sample::select(&["user", "assistant"][..]),
        prop::collection::vec(block, 0..4),
    )
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    let tool = prop::sample::select(
        &[
            "",
            "bash_20250124",
            "web_search_20250305",
            "web_fetch_20250910",
            "code_execution_20250825",
            "mcp_toolset",
        ][..],
    )
    .prop_map(|t| {
        if t.is_empty() {
            json!({"name": "f", "input_schema": {}})
        } else {
            json!({"type": t, "name": t})
        }
    });
    (
        prop::collection::vec(message, 1..4),
        prop::collection::vec(tool, 0..4),
        any::<(bool, bool)>(),
    )
        .prop_map(|(messages, tools, (container, mcp))| {
            let mut b =
                json!({"model": "m", "max_tokens": 8, "messages": messages, "tools": tools});
            if container {
                b["container"] = json!("c");
            }
            if mcp {
                b["mcp_servers"] =
                    json!([{"type": "url", "url": "https://ok.org/mcp", "name": "x"}]);
            }
            b
        })
}

/// An oracle written apart from the mediators: every provider-side way to the network
/// that may still be in a mediated body.
fn violations(v: &Value, policy: &NetworkPolicy, path: &str, out: &mut Vec<String>) {
    const CLIENT_TOOLS: &[&str] = &["function", "custom", "local_shell", "bash_20250124", ""];
    const STATE_KEYS: &[&str] = &[
        "web_search_options",
        "plugins",
        "previous_response_id",
        "conversation",
        "prompt",
        "container",
        "mcp_servers",
    ];
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                let at = format!("{path}.{k}");
                if path.is_empty() && STATE_KEYS.contains(&k.as_str()) {
                    out.push(at.clone());
                }
                if k == "file_id" {
                    out.push(at.clone());
                }
                if matches!(k.as_str(), "url" | "image_url" | "file_url" | "file_data") {
                    if let Value::String(u) = x {
                        if u.contains(':') && !policy.allows_url(u) {
                            out.push(at.clone());
                        }
                    }
                }
                if matches!(
                    x["type"].as_str(),
                    Some("item_reference" | "mcp_call" | "server_tool_use")
                ) || (x["type"] == "reasoning" && x.get("encrypted_content").is_none())
                {
                    out.push(at.clone());
                }
                if k == "tools" && path.is_empty() {
                    for (i, t) in x.as_array().into_iter().flatten().enumerate() {
                        let kind = t["type"].as_str().unwrap_or("");
                        let domains: Vec<String> = serde_json::from_value(
                            t.get("allowed_domains")
                                .or_else(|| t.get("filters").and_then(|f| f.get("allowed_domains")))
                                .cloned()
                                .unwrap_or(Value::Null),
                        )
                        .unwrap_or_default();
                        let filtered =
                            !domains.is_empty() && domains.iter().all(|d| policy.allows_host(d));
                        if !CLIENT_TOOLS.contains(&kind) && !filtered {
                            out.push(format!("tools[{i}]"));
                        }
                    }
                }
                violations(x, policy, &at, out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                violations(x, policy, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn check(
    dialect: &dyn Dialect,
    input: &Value,
    policy: &NetworkPolicy,
) -> Result<(), TestCaseError> {
    let text = serde_json::to_vec(input).expect("json");
    // Unrestricted: byte-identical, not even parsed.
    let mut open = JsonBody::parse(Bytes::from(text.clone())).expect("body");
    prop_assert_eq!(
        mediate_request(dialect, NetworkPolicy::unrestricted(), &mut open).expect("open"),
        None
    );
    prop_assert_eq!(&open.to_bytes()[..], &text[..]);
    // Restricted: nothing that reaches the network is left.
    let mut b = JsonBody::parse(Bytes::from(text)).expect("body");
    let event = mediate_request(dialect, policy, &mut b).expect("mediate");
    let once = b.to_value();
    let mut left = Vec::new();
    violations(&once, policy, "", &mut left);
    prop_assert!(left.is_empty(), "left {:?} in {}", left, once);
    // The notice is there exactly when something was removed.
    let noticed = serde_json::to_string(&once)
        .expect("json")
        .contains("Network protocol blocked");
    prop_assert_eq!(noticed, event.is_some());
    // Mediating twice is mediating once.
    let again = mediate_request(dialect, policy, &mut b).expect("again");
    prop_assert_eq!(again, None);
    prop_assert_eq!(b.to_value(), once);
    Ok(())
}

fn policies() -> impl Strategy<Value = NetworkPolicy> {
    prop_oneof![
        Just(ok_org()),
        Just(NetworkPolicy::deny_all()),
        Just(NetworkPolicy::new(&["*"], &["evil.com"]).expect("policy")),
        Just(NetworkPolicy::new(&["ok.org", "10.0.0.1"], &[] as &[&str]).expect("policy")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn chat_mediation_leaves_no_way_out(input in chat_body(), policy in policies()) {
        check(&ChatDialect, &input, &policy)?;
    }

    #[test]
    fn responses_mediation_leaves_no_way_out(input in responses_body(), policy in policies()) {
        check(&ResponsesDialect, &input, &policy)?;
    }

    #[test]
    fn messages_mediation_leaves_no_way_out(input in messages_body(), policy in policies()) {
        check(&MessagesDialect, &input, &policy)?;
    }
}
