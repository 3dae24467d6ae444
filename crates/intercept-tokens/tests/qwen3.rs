//! The Qwen3 renderer on hand-made ids with the real tokenizer, no Python: every reason
//! the bridge declines, how it closes a cut-short turn, streams across split characters,
//! and the errors of the factory.

mod support;

use std::sync::Arc;

use intercept_tokens::{
    renderer, ChatMessage, Decline, MessageError, Qwen3Renderer, Renderer, RendererError,
    RendererOptions, StreamEvent, ThinkingRetention, Tokenizer, ToolCallStatus, RENDERERS,
};
use support::tokenizer;

struct Fixture {
    tok: Arc<Tokenizer>,
    r: Qwen3Renderer,
    prompt: Vec<u32>,
}

fn fixture(options: RendererOptions) -> Option<Fixture> {
    let tok = tokenizer()?;
    let r = Qwen3Renderer::new(tok.clone(), options).expect("Qwen3's tokenizer");
    let prompt = r
        .render(&[ChatMessage::user("List the files.")], &[], true)
        .expect("renders")
        .token_ids;
    Some(Fixture { tok, r, prompt })
}

impl Fixture {
    fn id(&self, token: &str) -> u32 {
        self.tok.token_id(token).expect("a Qwen3 token")
    }

    /// `text` encoded, then `<|im_end|>`.
    fn turn(&self, text: &str) -> Vec<u32> {
        let mut ids = self.tok.encode(text);
        ids.push(self.id("<|im_end|>"));
        ids
    }

    fn decline(&self, completion: &[u32], tail: &[ChatMessage]) -> Option<Decline> {
        self.r.bridge(&self.prompt, completion, tail, &[]).err()
    }
}

#[test]
fn every_decline_has_its_case() {
    let Some(f) = fixture(RendererOptions::default()) else {
        return;
    };
    let done = f.turn("<think>\nok\n</think>\n\nls");
    let result = [ChatMessage::tool("call_0", "a.txt")];
    assert_eq!(
        f.r.bridge(&[], &done, &result, &[]).err(),
        Some(Decline::EmptyPreviousPrompt)
    );
    assert_eq!(f.decline(&done, &[]), Some(Decline::NoNewMessages));
    assert_eq!(
        f.decline(
            &done,
            &[ChatMessage::assistant(Some("x".into()), None, vec![])]
        ),
        Some(Decline::AssistantInTail)
    );
    assert_eq!(
        f.decline(&f.turn("<think>\nstill thinking"), &result),
        Some(Decline::OpenReasoningAtStop)
    );
    assert_eq!(
        f.decline(&done, &[ChatMessage::user("And the hidden ones?")]),
        Some(Decline::ThinkingRetention)
    );
    // A user message that only wraps a tool response is no query.
    assert_eq!(
        f.decline(
            &done,
            &[ChatMessage::user(" <tool_response>x</tool_response>\n")]
        ),
        None
    );
    assert_eq!(f.decline(&done, &result), None);
    for d in [
        Decline::EmptyPreviousPrompt,
        Decline::NoNewMessages,
        Decline::AssistantInTail,
        Decline::OpenReasoningAtStop,
        Decline::ThinkingRetention,
    ] {
        assert!(
            !d.to_string().is_empty()
                && d.as_str()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
        );
    }
}

#[test]
fn retention_follows_thinking_unless_set() {
    let query = [ChatMessage::user("Next question")];
    let Some(off) = fixture(RendererOptions::default().with_enable_thinking(false)) else {
        return;
    };
    assert_eq!(off.r.thinking_retention(), ThinkingRetention::All);
    let done = off.turn("<think>\n\n</think>\n\nhello");
    assert_eq!(off.decline(&done, &query), None);
    let Some(kept) =
        fixture(RendererOptions::default().with_thinking_retention(ThinkingRetention::All))
    else {
        return;
    };
    assert!(kept.r.enable_thinking());
    assert_eq!(kept.decline(&kept.turn("hi"), &query), None);
    let Some(strict) = fixture(
        RendererOptions::default()
            .with_enable_thinking(false)
            .with_thinking_retention(ThinkingRetention::ToolCycle),
    ) else {
        return;
    };
    assert_eq!(
        strict.decline(&done, &query),
        Some(Decline::ThinkingRetention)
    );
}

#[test]
fn cut_short_turns_are_closed() {
    let Some(f) = fixture(RendererOptions::default()) else {
        return;
    };
    let tail = [ChatMessage::tool("call_0", "a.txt")];
    let suffix = f.tok.encode("\n");
    // Truncated inside the reasoning: `</think>` and `<|im_end|>` are added.
    let open = f.tok.encode("<think>\nI wonder");
    let b = f.r.bridge(&f.prompt, &open, &tail, &[]).expect("bridges");
    let n = f.prompt.len() + open.len();
    assert_eq!(&b.token_ids[..n - open.len()], &f.prompt[..]);
    assert_eq!(
        &b.token_ids[n..n + 2],
        &[f.id("</think>"), f.id("<|im_end|>")]
    );
    assert_eq!(&b.token_ids[n + 2..n + 2 + suffix.len()], &suffix[..]);
    let e = f.r.extend(&f.prompt, &open, &tail, &[]).expect("extends");
    assert_eq!(e.keep, n);
    assert_eq!(&e.ids[..2], &[f.id("</think>"), f.id("<|im_end|>")]);
    assert_eq!(e.ids.len(), e.message_indices.len());
    assert_eq!(e.into_rendered(&f.prompt, &open), b);
    // Truncated in the answer: `<|im_end|>` only.
    let answer = f.tok.encode("<think>\nx\n</think>\n\nThe files are");
    let b = f.r.bridge(&f.prompt, &answer, &tail, &[]).expect("bridges");
    assert_eq!(
        b.token_ids[f.prompt.len() + answer.len()],
        f.id("<|im_end|>")
    );
    // Ids after the turn's close are dropped.
    let mut extra = f.turn("<think>\nx\n</think>\n\ndone");
    let closed = extra.len();
    extra.extend(f.tok.encode("garbage"));
    let b = f.r.bridge(&f.prompt, &extra, &tail, &[]).expect("bridges");
    let e = f.r.extend(&f.prompt, &extra, &tail, &[]).expect("extends");
    assert_eq!(e.keep, f.prompt.len() + closed);
    assert_eq!(
        &b.token_ids[f.prompt.len()..f.prompt.len() + closed],
        &extra[..closed]
    );
    assert!(b.sampled_mask.iter().all(|s| !s));
    assert!(b.message_indices[..f.prompt.len() + closed]
        .iter()
        .all(|&i| i == -1));
    assert!(b.message_indices.contains(&0));
    // The tail ends with the next generation prompt.
    assert!(f
        .tok
        .decode(&b.token_ids)
        .ends_with("</tool_response><|im_end|>\n<|im_start|>assistant\n"));
}

#[test]
fn parse_reports_each_status() {
    let Some(f) = fixture(RendererOptions::default()) else {
        return;
    };
    let p = f.r.parse(
        &f.turn(concat!(
            "<think>\nplan\n</think>\n\nHere.\n",
            "<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"path\": \"é\", \"n\": 1.0}}\n</tool_call>\n",
            "<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"path\": }\n</tool_call>\n",
            "<tool_call>\n{\"arguments\": \"{}\"}\n</tool_call>\n",
            "<tool_call>\n{\"name\": \"cat\", \"arguments\": {\"f\""
        )),
        &f.prompt,
    );
    assert_eq!(p.content, "Here.");
    assert_eq!(p.reasoning_content.as_deref(), Some("plan"));
    assert!(p.reasoning_complete);
    let statuses: Vec<_> = p.tool_calls.iter().map(|t| t.status).collect();
    assert_eq!(
        statuses,
        [
            ToolCallStatus::Ok,
            ToolCallStatus::InvalidJson,
            ToolCallStatus::MissingName,
            ToolCallStatus::UnclosedBlock
        ]
    );
    // verifiers writes parsed arguments with json.dumps (ASCII escapes, Python floats).
    assert_eq!(
        p.tool_calls[0].arguments.as_deref(),
        Some(r#"{"path": "\u00e9", "n": 1.0}"#)
    );
    assert_eq!(p.tool_calls[2].arguments.as_deref(), Some("{}"));
    assert_eq!(
        p.tool_calls[3].raw,
        "{\"name\": \"cat\", \"arguments\": {\"f\""
    );

    let open = f.r.parse(&f.tok.encode("<think>\nstill"), &f.prompt);
    assert!(!open.reasoning_complete);
    assert_eq!(open.reasoning_content.as_deref(), Some("\nstill"));
    assert_eq!(f.r.stop_ids(), [f.id("<|im_end|>"), f.id("<|endoftext|>")]);
}

#[test]
fn streams_hold_split_characters() {
    let Some(f) = fixture(RendererOptions::default()) else {
        return;
    };
    let completion = f.turn("<think>\n😀 then 中\n</think>\n\n👍🏽 done");
    let mut s = f.r.stream(&f.prompt);
    let mut events = Vec::new();
    for id in &completion {
        for e in s.push(std::slice::from_ref(id)) {
            if let StreamEvent::Reasoning(t) | StreamEvent::Content(t) = &e {
                assert!(!t.contains('\u{fffd}'), "a split character leaked: {t:?}");
            }
            events.push(e);
        }
    }
    events.extend(s.finish());
    let join = |reasoning: bool| -> String {
        events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Reasoning(t) if reasoning => Some(t.as_str()),
                StreamEvent::Content(t) if !reasoning => Some(t.as_str()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(join(true), "😀 then 中");
    assert_eq!(join(false), "👍🏽 done");
    // A stop id ends the stream; what comes after is ignored.
    assert!(s.push(&completion).is_empty());
}

#[test]
fn the_factory_names_what_it_knows() {
    let Some(tok) = tokenizer() else { return };
    let r = renderer("qwen3", tok.clone(), &RendererOptions::default()).expect("known");
    assert_eq!(r.name(), "qwen3");
    let err = renderer("llama-3", tok, &RendererOptions::default()).expect_err("unknown");
    assert!(matches!(err, RendererError::UnknownRenderer { .. }));
    for known in RENDERERS {
        assert!(err.to_string().contains(known), "{err}");
    }
}

#[test]
fn a_tokenizer_without_the_format_tokens_is_refused() {
    let dir = tempfile::tempdir().expect("a temp folder");
    std::fs::write(
        dir.path().join("tokenizer.json"),
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":true},
            "post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":true},
            "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
                     "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
                     "vocab":{"a":0,"b":1},"merges":[]}}"#,
    )
    .expect("written");
    let tok = Arc::new(Tokenizer::load(dir.path()).expect("a tiny tokenizer"));
    let err = Qwen3Renderer::new(tok, RendererOptions::default()).expect_err("no Qwen3 tokens");
    assert!(
        matches!(
            err,
            RendererError::MissingToken {
                token: "<|im_start|>",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("<|im_start|>"));
}

#[test]
fn unreadable_messages_say_where() {
    let err = ChatMessage::parse_array(r#"[{"role": "user", "content": "\ud800"}]"#)
        .expect_err("a lone surrogate");
    assert!(
        matches!(err, MessageError::LoneSurrogate { index: 0, .. }),
        "{err}"
    );
    let err = ChatMessage::parse_array(r#"{"role": "user"}"#).expect_err("not an array");
    assert!(err.to_string().contains("array"), "{err}");
    let err = ChatMessage::parse_array(r#"[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]"#)
        .expect_err("a call without id");
    assert!(err.to_string().contains("tool_calls[].id"), "{err}");
}
