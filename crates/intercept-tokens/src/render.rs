//! What every renderer offers: full renders, the bridge to the next turn, parsing a
//! completion (whole or streamed), and its stop ids.

use crate::message::{ChatMessage, Role, ToolSpec};

/// The ids of a prompt, with the message each id belongs to and whether the model
/// sampled it (renderers' `RenderedTokens`, without the content mask).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The prompt's ids.
    pub token_ids: Vec<u32>,
    /// Per id, the index of the message it renders, `-1` for template scaffolding that
    /// belongs to none (a generation prompt; in a bridge, the previous turn's ids).
    /// A bridge's indices count from the first new message.
    pub message_indices: Vec<i32>,
    /// Per id, whether the model sampled it (an assistant turn's body and its
    /// `<|im_end|>`); all false in a bridge.
    pub sampled_mask: Vec<bool>,
}

/// The next turn's prompt as an extension of the previous turn's ids
/// ([`Renderer::extend`]): no copy of the context, so its cost is that of the new
/// messages only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extension {
    /// How many ids of the previous prompt followed by the previous completion the next
    /// prompt starts with: all of the prompt, and the completion up to its last
    /// turn-closing id (all of it when it has none).
    pub keep: usize,
    /// The ids after those: the `</think>` and `<|im_end|>` a cut-short completion lacks,
    /// the new messages, the next generation prompt.
    pub ids: Vec<u32>,
    /// Per id of `ids`, the index of the new message it renders (`-1` for scaffolding).
    pub message_indices: Vec<i32>,
}

impl Extension {
    /// The whole prompt: the kept ids, then the extension (renderers' bridge result:
    /// every kept id belongs to no new message, no id is sampled).
    pub fn into_rendered(
        self,
        previous_prompt_ids: &[u32],
        previous_completion_ids: &[u32],
    ) -> Rendered {
        let total = self.keep + self.ids.len();
        let mut token_ids = Vec::with_capacity(total);
        let from_prompt = self.keep.min(previous_prompt_ids.len());
        token_ids.extend_from_slice(&previous_prompt_ids[..from_prompt]);
        let from_completion = (self.keep - from_prompt).min(previous_completion_ids.len());
        token_ids.extend_from_slice(&previous_completion_ids[..from_completion]);
        token_ids.extend_from_slice(&self.ids);
        let mut message_indices = Vec::with_capacity(total);
        message_indices.resize(token_ids.len() - self.ids.len(), -1);
        message_indices.extend_from_slice(&self.message_indices);
        Rendered {
            sampled_mask: vec![false; token_ids.len()],
            token_ids,
            message_indices,
        }
    }
}

/// Why [`Renderer::bridge`] did not extend the previous turn (renderers'
/// `bridge_to_next_turn` returns `None`): the caller renders the whole conversation
/// instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decline {
    /// The previous prompt has no ids.
    EmptyPreviousPrompt,
    /// There are no new messages to append.
    NoNewMessages,
    /// A new message is an assistant turn: bridging would put template text where the
    /// model's sampled ids belong.
    AssistantInTail,
    /// The previous completion stopped (hit a stop id) inside its reasoning, which no
    /// `</think>` closed.
    OpenReasoningAtStop,
    /// A new user query arrived while thinking is kept only within a tool cycle: the
    /// template drops the previous reasoning, so the prompt is rendered again.
    ThinkingRetention,
}

impl Decline {
    /// A stable snake_case name, recorded in traces.
    pub fn as_str(&self) -> &'static str {
        match self {
            Decline::EmptyPreviousPrompt => "empty_previous_prompt",
            Decline::NoNewMessages => "no_new_messages",
            Decline::AssistantInTail => "assistant_in_tail",
            Decline::OpenReasoningAtStop => "open_reasoning_at_stop",
            Decline::ThinkingRetention => "thinking_retention",
        }
    }
}

impl std::fmt::Display for Decline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decline::EmptyPreviousPrompt => {
                "the previous prompt is empty, so there is no turn to extend; the conversation is rendered whole"
            }
            Decline::NoNewMessages => {
                "no new message follows the previous turn; the conversation is rendered whole"
            }
            Decline::AssistantInTail => {
                "the new messages include an assistant turn, whose ids only the model's own sampling gives; the conversation is rendered whole"
            }
            Decline::OpenReasoningAtStop => {
                "the previous completion stopped inside an unclosed <think> block; the conversation is rendered whole"
            }
            Decline::ThinkingRetention => {
                "a new user query drops the previous turns' reasoning from the template; the conversation is rendered whole"
            }
        })
    }
}

impl std::error::Error for Decline {}

/// Whether verifiers' train client would try to bridge to a turn whose messages after
/// the last assistant turn are `tail` (its `_is_valid_incremental_tail`): tool results,
/// optionally followed by one user message. Any other tail is rendered whole without
/// asking the renderer.
pub fn is_incremental_tail(tail: &[ChatMessage]) -> bool {
    match tail.split_last() {
        None => false,
        Some((last, rest)) => {
            let tools = |m: &ChatMessage| m.role() == Role::Tool;
            (last.role() == Role::User || tools(last)) && rest.iter().all(tools)
        }
    }
}

/// Why a conversation could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The conversation has no message.
    #[error("no messages to render; send at least one message")]
    NoMessages,
}

/// How one `<tool_call>` block parsed (renderers' `ToolCallParseStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallStatus {
    /// A JSON object with a name.
    Ok,
    /// The block's body is not JSON.
    InvalidJson,
    /// The completion ended before the block's closing tag.
    UnclosedBlock,
    /// JSON without a (truthy) `name`.
    MissingName,
    /// JSON of a shape the format does not allow (formats other than Qwen3's).
    MalformedStructure,
    /// A name that is not among the request's tools (formats other than Qwen3's).
    UnknownTool,
}

impl ToolCallStatus {
    /// The status's name, as renderers spell it.
    pub fn as_str(&self) -> &'static str {
        match self {
            ToolCallStatus::Ok => "ok",
            ToolCallStatus::InvalidJson => "invalid_json",
            ToolCallStatus::UnclosedBlock => "unclosed_block",
            ToolCallStatus::MissingName => "missing_name",
            ToolCallStatus::MalformedStructure => "malformed_structure",
            ToolCallStatus::UnknownTool => "unknown_tool",
        }
    }
}

/// One tool-call attempt of a completion, good or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    /// The block's text as the model wrote it, stripped of surrounding whitespace.
    pub raw: String,
    /// The function's name, when the JSON has a `name` that is a non-empty string.
    /// (renderers also report a name of another truthy type, with status OK; verifiers
    /// cannot use such a call, and here it has no name.)
    pub name: Option<String>,
    /// The arguments as verifiers' train client writes them into the assistant message:
    /// a string as it is, any other value as Python's `json.dumps(arguments or {})`
    /// (`ensure_ascii=True`). `None` when the block did not parse.
    pub arguments: Option<String>,
    /// How it parsed.
    pub status: ToolCallStatus,
    /// The ids it spans in the completion (from its `<tool_call>` through its
    /// `</tool_call>`, or to the end when unclosed), half-open.
    pub token_span: (usize, usize),
}

/// A completion read back as a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedResponse {
    /// The text the model answered with.
    pub content: String,
    /// Its reasoning, if any.
    pub reasoning_content: Option<String>,
    /// Every tool-call attempt, in order.
    pub tool_calls: Vec<ParsedToolCall>,
    /// False when the completion ended inside its reasoning.
    pub reasoning_complete: bool,
}

/// What a streamed completion yields as its ids arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// More reasoning text.
    Reasoning(String),
    /// More answer text.
    Content(String),
    /// A tool call, once its block is closed (or, unclosed, at the end).
    ToolCall(ParsedToolCall),
}

/// Parses a completion as its ids arrive. Joined, the events of a completion are what
/// [`Renderer::parse`] gives for it: the content, the reasoning and the tool calls in
/// order. (One exception, which no stream can avoid: when the completion ends inside its
/// reasoning, `parse` keeps that reasoning's leading whitespace, which the stream dropped
/// when it could not yet know that no `</think>` would come.)
pub trait StreamParser: Send + std::fmt::Debug {
    /// Takes the next ids; returns what they make certain.
    fn push(&mut self, ids: &[u32]) -> Vec<StreamEvent>;
    /// Ends the completion; returns what was held back.
    fn finish(&mut self) -> Vec<StreamEvent>;
}

/// A renderer: a model family's chat format, in ids.
pub trait Renderer: Send + Sync + std::fmt::Debug {
    /// The renderer's name (`"qwen3"`).
    fn name(&self) -> &'static str;

    /// Renders a whole conversation (renderers' `render`), with the opening of the next
    /// assistant turn when `add_generation_prompt`.
    fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        add_generation_prompt: bool,
    ) -> Result<Rendered, RenderError>;

    /// The next turn's prompt from the previous turn's prompt and completion ids and the
    /// messages that came after it (renderers' `bridge_to_next_turn`): only the new
    /// messages are tokenized. [`Decline`] says why it would not.
    fn bridge(
        &self,
        previous_prompt_ids: &[u32],
        previous_completion_ids: &[u32],
        new_messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<Rendered, Decline> {
        self.extend(
            previous_prompt_ids,
            previous_completion_ids,
            new_messages,
            tools,
        )
        .map(|e| e.into_rendered(previous_prompt_ids, previous_completion_ids))
    }

    /// [`bridge`](Self::bridge) without building the whole prompt: how many previous ids
    /// it keeps and the ids after them, for a caller that appends them to ids it holds.
    fn extend(
        &self,
        previous_prompt_ids: &[u32],
        previous_completion_ids: &[u32],
        new_messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<Extension, Decline>;

    /// Reads a completion back (renderers' `parse_response`); `prompt_ids` tells whether
    /// the prompt opened the reasoning.
    fn parse(&self, completion_ids: &[u32], prompt_ids: &[u32]) -> ParsedResponse;

    /// The ids that end a turn (the engine's `stop_token_ids`).
    fn stop_ids(&self) -> &[u32];

    /// Parses a streamed completion of the prompt `prompt_ids` incrementally.
    fn stream(&self, prompt_ids: &[u32]) -> Box<dyn StreamParser>;
}

/// How much of the previous turns' reasoning the bridge keeps (renderers'
/// `thinking_retention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThinkingRetention {
    /// Bridge within a tool cycle; render again at a new user query.
    ToolCycle,
    /// Bridge across user queries too.
    All,
}

/// A renderer's settings (renderers' `RendererConfig`); `None` takes renderers' default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RendererOptions {
    /// Whether the model thinks (Qwen3's `enable_thinking`, default true). Off, the
    /// generation prompt holds an empty `<think>\n\n</think>\n\n`.
    pub enable_thinking: Option<bool>,
    /// The bridge's retention; by default `ToolCycle` when thinking and `All` when not.
    pub thinking_retention: Option<ThinkingRetention>,
}

impl RendererOptions {
    /// Options with `enable_thinking` set.
    pub fn with_enable_thinking(mut self, on: bool) -> Self {
        self.enable_thinking = Some(on);
        self
    }

    /// Options with `thinking_retention` set.
    pub fn with_thinking_retention(mut self, retention: ThinkingRetention) -> Self {
        self.thinking_retention = Some(retention);
        self
    }
}

/// Why a renderer could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RendererError {
    /// No renderer has that name.
    #[error("no renderer is named {name:?}; the known renderers are: {}", known.join(", "))]
    UnknownRenderer {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<&'static str>,
    },
    /// The tokenizer lacks one of the format's special tokens.
    #[error("the tokenizer at {path} has no {token:?} token, which the {renderer} renderer needs; load the model's own tokenizer")]
    MissingToken {
        /// The renderer.
        renderer: &'static str,
        /// The token.
        token: &'static str,
        /// Where the tokenizer was loaded from.
        path: String,
    },
    /// The tokenizer's decoder is not byte-level, which the renderer's parsers assume.
    #[error("the tokenizer at {path} does not decode byte-level (GPT-2 style), which the {renderer} renderer needs; load the model's own tokenizer")]
    NotByteLevel {
        /// The renderer.
        renderer: &'static str,
        /// Where the tokenizer was loaded from.
        path: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_tails_are_verifiers() {
        let tool = || ChatMessage::tool("c", "r");
        let user = || ChatMessage::user("u");
        assert!(!is_incremental_tail(&[]));
        assert!(is_incremental_tail(&[tool()]));
        assert!(is_incremental_tail(&[tool(), tool(), user()]));
        assert!(is_incremental_tail(&[user()]));
        assert!(!is_incremental_tail(&[user(), tool()]));
        assert!(!is_incremental_tail(&[tool(), user(), user()]));
        assert!(!is_incremental_tail(&[ChatMessage::system("s")]));
        assert!(!is_incremental_tail(&[
            tool(),
            ChatMessage::assistant(None, None, vec![])
        ]));
    }

    #[test]
    fn names_are_stable() {
        let all = [
            Decline::EmptyPreviousPrompt,
            Decline::NoNewMessages,
            Decline::AssistantInTail,
            Decline::OpenReasoningAtStop,
            Decline::ThinkingRetention,
        ];
        let names: Vec<_> = all.iter().map(Decline::as_str).collect();
        assert_eq!(
            names,
            [
                "empty_previous_prompt",
                "no_new_messages",
                "assistant_in_tail",
                "open_reasoning_at_stop",
                "thinking_retention"
            ]
        );
        for d in all {
            assert!(d.to_string().ends_with("rendered whole"), "{d}");
        }
        assert_eq!(ToolCallStatus::InvalidJson.as_str(), "invalid_json");
        assert_eq!(ToolCallStatus::UnclosedBlock.as_str(), "unclosed_block");
    }
}
