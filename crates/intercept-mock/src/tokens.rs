//! What the token routes (vLLM's `/inference/v1/generate`, SGLang's `/generate`) share:
//! the completion a reply becomes, as Qwen3/hermes text and then as ids, the echo read from
//! the prompt ids, the stop id and the `max_tokens` cut, and the mock's logprobs.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use intercept_tokens::Tokenizer;
use serde::Serialize;

use super::chat::contains_ignore_case;
use super::reply::Completion;

/// The tokenizer of the token routes, with what they read of it on every request.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) tokenizer: Arc<Tokenizer>,
    /// The number of ids (counted once: `Tokenizer::vocab_size` lists the vocabulary).
    pub(crate) size: usize,
    /// The id of the tokenizer's end-of-sequence token.
    pub(crate) eos: Option<u32>,
}

impl Vocab {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let size = tokenizer.vocab_size();
        let eos = tokenizer
            .eos_token()
            .and_then(|token| tokenizer.token_id(token));
        Self {
            tokenizer,
            size,
            eos,
        }
    }

    /// The size as an id bound.
    pub(crate) fn size_u32(&self) -> u32 {
        u32::try_from(self.size).unwrap_or(u32::MAX)
    }
}

/// What a token route answers; the server frames it.
#[derive(Debug)]
pub(crate) enum Output {
    /// A JSON body with this status (the reply's `disconnect_after` applies).
    Json(StatusCode, Bytes),
    /// SSE events (the reply's chunk delay and `disconnect_after` apply).
    Stream(Vec<Bytes>),
    /// An error the mock made itself (a request it refuses): a JSON body with this status.
    Error(StatusCode, Bytes),
}

/// How a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// It sampled a stop id (the last id of the completion), or ended without one when
    /// the tokenizer names no end-of-sequence token.
    Stop(Option<u32>),
    /// `max_tokens` (or the script) cut it before its stop id.
    Length,
}

/// A completion as ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generated {
    /// The completion's ids, the stop id included.
    pub(crate) ids: Vec<u32>,
    pub(crate) finish: Finish,
}

/// The limits a request puts on its completion.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits<'a> {
    /// The request's stop ids; the first one ends the completion.
    pub(crate) stop_token_ids: &'a [u32],
    /// At most this many ids.
    pub(crate) max_tokens: Option<u64>,
}

/// The completion a reply gives for `prompt`: its text in the Qwen3/hermes layout (or the
/// raw text, or the echo), tokenized, then the stop id or the `max_tokens` cut.
pub(crate) fn generate(
    vocab: &Vocab,
    completion: &Completion,
    prompt: &[u32],
    limits: Limits<'_>,
) -> Generated {
    let text = completion_text(&vocab.tokenizer, completion, prompt);
    let mut ids = vocab.tokenizer.encode(&text);
    let length = completion.finish_reason.as_deref() == Some("length");
    let stop = limits.stop_token_ids.first().copied().or(vocab.eos);
    let mut finish = if length {
        Finish::Length
    } else {
        if let Some(stop) = stop {
            ids.push(stop);
        }
        Finish::Stop(stop)
    };
    if let Some(max) = limits.max_tokens {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        if ids.len() > max {
            ids.truncate(max);
            finish = Finish::Length;
        }
    }
    Generated { ids, finish }
}

/// The completion's text: the raw text of [`Reply::raw_completion`](super::Reply::raw_completion),
/// else the reasoning, content and tool calls in Qwen3's layout (the echo fills them in
/// from the prompt).
fn completion_text(tokenizer: &Tokenizer, completion: &Completion, prompt: &[u32]) -> String {
    if completion.raw {
        return completion.content.clone().unwrap_or_default();
    }
    let mut content = completion.content.clone();
    let mut calls: Vec<(String, String)> = completion
        .tool_calls
        .iter()
        .map(|call| (call.name.clone(), call.arguments.clone()))
        .collect();
    if completion.echo {
        match echo(&tokenizer.decode(prompt)) {
            Echo::Text(text) => content = Some(text),
            Echo::ToolCall { name, arguments } => {
                content = None;
                calls.push((name, arguments));
            }
        }
    }
    qwen3_layout(
        completion.reasoning.as_deref(),
        content.as_deref().unwrap_or(""),
        &calls,
    )
}

/// An assistant turn as Qwen3 samples it (hermes tool calls), as `renderers`' Qwen3
/// renderer writes it: `<think>\n{reasoning}\n</think>\n\n` when there is reasoning, the
/// content, then each call as `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>`,
/// calls separated by `\n` and the first one preceded by `\n` when there is content.
pub(crate) fn qwen3_layout(
    reasoning: Option<&str>,
    content: &str,
    calls: &[(String, String)],
) -> String {
    let mut text = String::with_capacity(
        64 + content.len()
            + reasoning.map_or(0, str::len)
            + calls
                .iter()
                .map(|(name, arguments)| 48 + name.len() + arguments.len())
                .sum::<usize>(),
    );
    let content = match reasoning {
        Some(reasoning) => {
            text.push_str("<think>\n");
            text.push_str(reasoning.trim_matches('\n'));
            text.push_str("\n</think>\n\n");
            content.trim_start_matches('\n')
        }
        None => content,
    };
    text.push_str(content);
    for (index, (name, arguments)) in calls.iter().enumerate() {
        if index > 0 || !content.is_empty() {
            text.push('\n');
        }
        let arguments = if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        };
        text.push_str("<tool_call>\n{\"name\": \"");
        text.push_str(name);
        text.push_str("\", \"arguments\": ");
        text.push_str(arguments);
        text.push_str("}\n</tool_call>");
    }
    text
}

/// What the echo answers.
#[derive(Debug, PartialEq, Eq)]
enum Echo {
    Text(String),
    ToolCall { name: String, arguments: String },
}

const USER_TURN: &str = "<|im_start|>user\n";
const END_OF_TURN: &str = "<|im_end|>";
const TOOL_RESPONSE: &str = "<tool_response>";
const TOOL_RESPONSE_END: &str = "</tool_response>";

/// The echo read from a decoded prompt (ChatML, as Qwen3's template writes it): the last
/// user turn's text, `tool said: <text>` when that turn holds tool responses (several
/// joined by newlines), or a call of the first tool of the system prompt's `<tools>` when
/// the text says `use a tool`. A prompt without a user turn is echoed whole.
fn echo(prompt: &str) -> Echo {
    let user = match prompt.rfind(USER_TURN) {
        Some(start) => {
            let turn = &prompt[start + USER_TURN.len()..];
            turn.find(END_OF_TURN).map_or(turn, |end| &turn[..end])
        }
        None => prompt,
    };
    if user.trim_start().starts_with(TOOL_RESPONSE) {
        let mut outputs = Vec::new();
        let mut rest = user;
        while let Some(start) = rest.find(TOOL_RESPONSE) {
            let body = &rest[start + TOOL_RESPONSE.len()..];
            let end = body.find(TOOL_RESPONSE_END).unwrap_or(body.len());
            outputs.push(body[..end].trim_matches('\n'));
            rest = &body[end..];
        }
        return Echo::Text(format!("tool said: {}", outputs.join("\n")));
    }
    if contains_ignore_case(user, "use a tool") {
        if let Some(name) = first_tool(prompt) {
            #[derive(Serialize)]
            struct Query<'q> {
                query: &'q str,
            }
            let arguments = serde_json::to_string(&Query { query: user })
                .unwrap_or_else(|_| String::from("{}"));
            return Echo::ToolCall { name, arguments };
        }
    }
    Echo::Text(format!("echo: {user}"))
}

/// The name of the first tool in the prompt's `<tools>` block (one JSON definition a line:
/// `{"type": "function", "function": {"name": ..}}` or `{"name": ..}`).
fn first_tool(prompt: &str) -> Option<String> {
    let start = prompt.find("<tools>\n")? + "<tools>\n".len();
    let line = prompt[start..].lines().next()?;
    let tool: serde_json::Value = serde_json::from_str(line).ok()?;
    tool.pointer("/function/name")
        .or_else(|| tool.get("name"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

/// The mock's logprob of sampling `id`: deterministic, in (-1.52, -0.01], never vLLM's
/// -9999 sentinel.
pub(crate) fn logprob(id: u32) -> f64 {
    -(f64::from(id % 97) + 1.0) / 64.0
}

/// The candidates at one position for `n` requested logprobs: the sampled id first (rank
/// 1), then `n - 1` others (ids following it, less likely), at least one and at most
/// [`MAX_LOGPROBS`].
pub(crate) fn candidates(id: u32, n: u64, vocab: u32) -> impl Iterator<Item = (u32, f64, u64)> {
    let sampled = logprob(id);
    let n = n.clamp(1, MAX_LOGPROBS);
    (0..n).map(move |k| {
        let other = if vocab == 0 {
            id
        } else {
            // k < MAX_LOGPROBS, so this neither overflows nor truncates.
            ((u64::from(id) + k) % u64::from(vocab)) as u32
        };
        (other, sampled - k as f64, k + 1)
    })
}

/// The most logprobs a request may ask for (vLLM's default `max_logprobs`).
pub(crate) const MAX_LOGPROBS: u64 = 20;

/// Splits `ids` into at most `n` (at least 1) non-empty pieces of about equal length; no
/// piece for no ids.
pub(crate) fn id_pieces(ids: &[u32], n: usize) -> Vec<&[u32]> {
    let len = ids.len();
    let n = n.clamp(1, len.max(1));
    let mut pieces = Vec::with_capacity(n);
    let mut start = 0;
    for i in 1..=n {
        // n <= len, so len * i fits in u128 whatever the platform.
        let end = (len as u128 * i as u128 / n as u128) as usize;
        if end > start {
            pieces.push(&ids[start..end]);
            start = end;
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(name, arguments)| ((*name).to_owned(), (*arguments).to_owned()))
            .collect()
    }

    #[test]
    fn layout_follows_qwen3() {
        assert_eq!(qwen3_layout(None, "Hi", &[]), "Hi");
        assert_eq!(
            qwen3_layout(Some("\nthink\n"), "\nHi", &[]),
            "<think>\nthink\n</think>\n\nHi"
        );
        assert_eq!(
            qwen3_layout(Some("r"), "", &calls(&[("a", r#"{"x": 1}"#), ("b", "")])),
            "<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n\
             </tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>"
        );
        assert_eq!(
            qwen3_layout(None, "Let me look.", &calls(&[("a", "{}")])),
            "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>"
        );
    }

    #[test]
    fn echo_reads_the_last_user_turn() {
        let prompt = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nfirst<|im_end|>\n\
                      <|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nsecond one<|im_end|>\n\
                      <|im_start|>assistant\n";
        assert_eq!(echo(prompt), Echo::Text("echo: second one".to_owned()));
        assert_eq!(
            echo("plain text"),
            Echo::Text("echo: plain text".to_owned())
        );
        let tools = "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n\
                     x\ny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(echo(tools), Echo::Text("tool said: 42\nx\ny".to_owned()));
    }

    #[test]
    fn echo_calls_the_first_tool_when_asked() {
        let prompt = "<|im_start|>system\n# Tools\n\n<tools>\n\
                      {\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {}}}\n\
                      {\"type\": \"function\", \"function\": {\"name\": \"open\"}}\n</tools><|im_end|>\n\
                      <|im_start|>user\nPlease USE A TOOL<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(
            echo(prompt),
            Echo::ToolCall {
                name: "search".to_owned(),
                arguments: r#"{"query":"Please USE A TOOL"}"#.to_owned()
            }
        );
        // Without tools the text is echoed.
        assert_eq!(
            echo("<|im_start|>user\nuse a tool<|im_end|>"),
            Echo::Text("echo: use a tool".to_owned())
        );
    }

    #[test]
    fn logprobs_are_deterministic_and_ranked() {
        assert_eq!(logprob(0), -1.0 / 64.0);
        assert_eq!(logprob(96), -97.0 / 64.0);
        assert_eq!(logprob(97), logprob(0));
        let got: Vec<_> = candidates(10, 3, 12).collect();
        assert_eq!(
            got,
            [
                (10, logprob(10), 1),
                (11, logprob(10) - 1.0, 2),
                (0, logprob(10) - 2.0, 3)
            ]
        );
        assert_eq!(candidates(5, 0, 100).count(), 1);
        assert_eq!(candidates(5, 1000, 100).count(), MAX_LOGPROBS as usize);
    }

    #[test]
    fn id_pieces_split_evenly() {
        let ids: Vec<u32> = (0..10).collect();
        let pieces = id_pieces(&ids, 4);
        assert_eq!(pieces.len(), 4);
        assert_eq!(pieces.concat(), ids);
        assert_eq!(id_pieces(&ids[..2], 4), [&[0][..], &[1][..]]);
        assert!(id_pieces(&[], 4).is_empty());
        assert_eq!(id_pieces(&ids, 0), [&ids[..]]);
    }
}
