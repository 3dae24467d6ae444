//! The readers against each other, and the hashes of what they read.

use serde_json::json;

use super::*;
use crate::trace::canonical::canonical;
use crate::trace::episode::{Message, Part};

/// What the general reader makes of a Chat response message.
fn general(raw: &str) -> Message {
    let mut m = from_chat(&serde_json::from_str(raw).unwrap());
    m.role = Role::Assistant;
    m
}

/// The hashes as first defined: every field fed to a streaming XXH3-128 in turn.
fn streamed_hashes(m: &Message) -> (Hash, Hash) {
    use xxhash_rust::xxh3::Xxh3;
    let field = |h: &mut Xxh3, tag: u8, bytes: &[u8]| {
        h.update(&[tag]);
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    let mut h = Xxh3::new();
    field(&mut h, b'r', &[m.role.tag()]);
    for part in &m.content {
        match part {
            Part::Text { text } => field(&mut h, b't', text.as_bytes()),
            Part::Image { url } => field(&mut h, b'i', url.as_bytes()),
            Part::Data { value } => field(&mut h, b'd', canonical(value).as_bytes()),
        }
    }
    for call in &m.tool_calls {
        field(&mut h, b'c', call.id.as_bytes());
        field(&mut h, b'n', call.name.as_bytes());
        field(&mut h, b'a', canonical(&call.arguments).as_bytes());
    }
    if let Some(id) = &m.tool_call_id {
        field(&mut h, b'T', id.as_bytes());
    }
    let visible = h.digest128().to_le_bytes();
    if m.reasoning.is_none() && m.state.is_none() {
        return (visible, visible);
    }
    let mut h = Xxh3::new();
    field(&mut h, b'v', &visible);
    if let Some(r) = &m.reasoning {
        field(&mut h, b'R', r.as_bytes());
    }
    if let Some(s) = &m.state {
        field(&mut h, b'S', s.as_bytes());
    }
    (h.digest128().to_le_bytes(), visible)
}

#[test]
fn hashes_are_the_values_they_always_were() {
    let long = "x".repeat(5000);
    let mut messages = vec![
        Message::text(Role::User, "hi"),
        Message::text(Role::Assistant, long.as_str()),
        Message::new(Role::System),
    ];
    let mut m = Message::text(Role::Assistant, "with reasoning");
    m.push_reasoning("because");
    m.push_state("sig");
    messages.push(m);
    messages.push(from_chat(&json!({"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA"}}],
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{\"b\":1,\"a\":[2]}"}}]})));
    messages.push(from_chat(
        &json!({"role": "tool", "tool_call_id": "c1", "content": "out"}),
    ));
    for m in &messages {
        assert_eq!(m.hashes(), streamed_hashes(m), "{m:?}");
    }
}

#[test]
fn the_sampled_chat_reader_reads_as_the_general_reader_or_declines() {
    let plain = [
        r#"{"role":"assistant","content":"hi"}"#,
        r#"{"role":"assistant","content":"esc\n\"q\" \u00e9 \ud83d\ude00"}"#,
        r#"{"role":"assistant","content":""}"#,
        r#"{"role":"assistant","content":null,"refusal":null,"annotations":[],"audio":{"id":"a"}}"#,
        r#"{"role":"assistant"}"#,
        r#"{}"#,
        r#"{"content":"no role","role":"user"}"#,
        r#"{"role":"assistant","content":"a","reasoning_content":"think"}"#,
        r#"{"role":"assistant","content":"a","reasoning_content":"","reasoning":"other"}"#,
        r#"{"role":"assistant","content":"a","reasoning_content":null,"reasoning":"other"}"#,
        r#"{"role":"assistant","content":"a","reasoning":"only"}"#,
        r#"{"role":"assistant","content":"a","tool_calls":null}"#,
        r#"{"role":"assistant","content":"dup","content":"last"}"#,
        r#"{"role":"assistant","content":["first"],"content":"last"}"#,
        r#"{"role":"assistant","con\u0074ent":"escaped key"}"#,
        r#"{"role":"assistant","content":"a","function_call":null,"extra":{"nested":[1,{"x":"y"}]}}"#,
    ];
    for raw in plain {
        let read: SampledChat = serde_json::from_str(raw).unwrap();
        match read {
            SampledChat::Plain(m) => assert_eq!(m, general(raw), "{raw}"),
            // Declining is always correct (the general reader then reads it); these
            // shapes are the common ones and must be read here.
            SampledChat::Other if raw.contains(r#"["first"]"#) => {}
            SampledChat::Other => panic!("declined {raw}"),
        }
    }
    // Shapes left to the general reader, each still read without an error.
    for raw in [
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        r#"{"role":"assistant","content":[{"type":"text","text":"parts"}]}"#,
        r#"{"role":"assistant","content":"a","reasoning_content":{"not":"text"}}"#,
        r#"{"role":"assistant","content":7}"#,
        r#"{"role":"assistant","content":"a","tool_calls":[]}"#,
        r#""a string""#,
        r#"[1,2]"#,
        r#"12"#,
        r#"true"#,
    ] {
        let read: SampledChat = serde_json::from_str(raw).unwrap();
        assert_eq!(read, SampledChat::Other, "{raw}");
    }
}

#[test]
fn a_chat_summary_carries_the_sampled_message_and_never_fails_on_its_shape() {
    use crate::dialect::{ChatDialect, Dialect as _};
    let summary = |message: &str| {
        let response = format!(
            r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{message},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}}}"#
        );
        ChatDialect.summarize(response.as_bytes()).unwrap()
    };
    let s = summary(r#"{"role":"assistant","content":"hello","reasoning_content":"why"}"#);
    assert_eq!(s.finish_reason.as_deref(), Some("stop"));
    assert_eq!(s.usage.completion_tokens, 2);
    assert_eq!(
        s.message.as_deref(),
        Some(&general(
            r#"{"role":"assistant","content":"hello","reasoning_content":"why"}"#
        ))
    );
    for odd in [
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        r#"{"role":"assistant","content":[{"type":"text","text":"x"}]}"#,
        r#""not an object""#,
        "null",
    ] {
        let s = summary(odd);
        assert_eq!(s.message, None, "{odd}");
        assert_eq!(s.usage.prompt_tokens, 3, "{odd}");
    }
}

#[test]
fn one_tool_turn_hashes_the_same_in_every_dialect() {
    let chat = from_chat(
        &json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"b\": 1, \"a\": [2]}"}}]}),
    );
    let mut anthropic = Vec::new();
    from_anthropic(
        &json!({"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "ls", "input": {"a": [2], "b": 1}}]}),
        &mut anthropic,
    );
    let mut responses = Vec::new();
    from_responses(
        &json!([{"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{\"a\":[2],\"b\":1}"}]),
        &mut responses,
    );
    assert_eq!(anthropic, vec![chat.clone()]);
    assert_eq!(responses, vec![chat.clone()]);
    assert_eq!(anthropic[0].hash(), chat.hash());
    assert_eq!(chat.tool_calls[0].arguments, json!({"a": [2], "b": 1}));
}

#[test]
fn tool_results_split_out_of_an_anthropic_user_message() {
    let mut out = Vec::new();
    from_anthropic(
        &json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "one"},
            {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "two"}]},
            {"type": "text", "text": "go on"}]}),
        &mut out,
    );
    let chat: Vec<Message> = [
        json!({"role": "tool", "tool_call_id": "a", "content": "one"}),
        json!({"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "two"}]}),
        json!({"role": "user", "content": "go on"}),
    ]
    .iter()
    .map(from_chat)
    .collect();
    assert_eq!(out, chat);
}

#[test]
fn images_are_references_and_inline_data_a_digest() {
    let chat = from_chat(&json!({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}]}));
    let mut anthropic = Vec::new();
    from_anthropic(
        &json!({"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}]}),
        &mut anthropic,
    );
    assert_eq!(anthropic, vec![chat.clone()]);
    let Part::Image { url } = &chat.content[0] else {
        panic!("not an image: {chat:?}");
    };
    assert!(url.starts_with("data:image/png;blake2b128="), "{url}");
    assert!(!url.contains("QUJD"));
}

#[test]
fn reasoning_counts_in_the_hash_but_not_in_the_visible_hash() {
    let with = from_chat(&json!({"role": "assistant", "content": "4", "reasoning_content": "2+2"}));
    let without = from_chat(&json!({"role": "assistant", "content": "4"}));
    assert_ne!(with.hash(), without.hash());
    assert_eq!(with.visible_hash(), without.visible_hash());
    assert_eq!(without.hash(), without.visible_hash());
    assert_ne!(
        from_chat(&json!({"role": "user", "content": "4"})).hash(),
        without.hash()
    );
}
