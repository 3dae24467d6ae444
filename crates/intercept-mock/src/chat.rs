//! Chat Completions: the parts of a request the mock reads, the echo behaviour, and the
//! rendering of an answer as a `chat.completion` object or a `chat.completion.chunk`
//! stream.
//!
//! Requests are parsed into borrowed views of the body (no `serde_json::Value`), and the
//! output is serialised from borrowed structs into one buffer, so the echo path costs a
//! handful of allocations.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::reply::{Completion, Usage};

/// A string borrowed from the body when it has no escapes.
#[derive(Debug)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

/// The fields of a chat request the mock looks at; everything else is ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChatRequest<'a> {
    #[serde(borrow, default)]
    pub(crate) model: Option<Str<'a>>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(borrow, default)]
    pub(crate) messages: Option<Vec<Message<'a>>>,
    #[serde(borrow, default)]
    pub(crate) tools: Option<Vec<Tool<'a>>>,
}

impl ChatRequest<'_> {
    pub(crate) fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|options| options.include_usage)
            .unwrap_or(false)
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<Str<'a>>,
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
}

impl Message<'_> {
    fn role(&self) -> &str {
        self.role.as_ref().map_or("", |role| &role.0)
    }

    /// The message text: the content string, or its parts' texts joined by newlines.
    fn text(&self) -> Cow<'_, str> {
        self.content
            .as_ref()
            .map_or(Cow::Borrowed(""), Content::text)
    }

    fn words(&self) -> usize {
        self.content.as_ref().map_or(0, Content::words)
    }
}

/// A message's `content`: a string, a list of parts, or anything else (ignored).
#[derive(Debug)]
pub(crate) enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
    Other,
}

impl Content<'_> {
    /// The text: the string, or the parts' `text`s joined by newlines.
    pub(crate) fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(text) => Cow::Borrowed(text),
            Content::Parts(parts) => join_lines(parts.iter().filter_map(|part| part.text())),
            Content::Other => Cow::Borrowed(""),
        }
    }

    /// Words of the string, or of the parts' `text`s.
    pub(crate) fn words(&self) -> usize {
        match self {
            Content::Text(text) => words(text),
            Content::Parts(parts) => parts.iter().filter_map(Part::text).map(words).sum(),
            Content::Other => 0,
        }
    }

    /// The parts (none for a string).
    pub(crate) fn parts(&self) -> &[Part<'_>] {
        match self {
            Content::Parts(parts) => parts,
            Content::Text(_) | Content::Other => &[],
        }
    }
}

/// Joins texts with newlines, borrowing when there is at most one.
pub(crate) fn join_lines<'t>(mut texts: impl Iterator<Item = &'t str>) -> Cow<'t, str> {
    match (texts.next(), texts.next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(only), None) => Cow::Borrowed(only),
        (Some(first), Some(second)) => {
            let mut joined = format!("{first}\n{second}");
            for text in texts {
                joined.push('\n');
                joined.push_str(text);
            }
            Cow::Owned(joined)
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(1).min(64));
                while let Some(part) = seq.next_element::<Part<'de>>()? {
                    parts.push(part);
                }
                Ok(Content::Parts(parts))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
        }
        deserializer.deserialize_any(ContentVisitor)
    }
}

/// A content part (or an Anthropic content block); only its `type`, `text` and nested
/// `content` (of a `tool_result` block) matter.
#[derive(Debug)]
pub(crate) struct Part<'a> {
    kind: Option<Str<'a>>,
    text: Option<Str<'a>>,
    content: Option<Box<Content<'a>>>,
}

impl Part<'_> {
    /// The part's `type` (`""` when missing).
    pub(crate) fn kind(&self) -> &str {
        self.kind.as_ref().map_or("", |kind| &kind.0)
    }

    /// The part's `text`.
    pub(crate) fn text(&self) -> Option<&str> {
        self.text.as_ref().map(|text| &*text.0)
    }

    /// The part's nested `content` (a `tool_result` block's).
    pub(crate) fn content(&self) -> Option<&Content<'_>> {
        self.content.as_deref()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Part<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PartVisitor;
        impl<'de> Visitor<'de> for PartVisitor {
            type Value = Part<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a content part")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut kind, mut text, mut content) = (None, None, None);
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match &*key.0 {
                        "text" if text.is_none() => {
                            text = map.next_value::<Option<Str<'de>>>()?;
                        }
                        "type" if kind.is_none() => {
                            kind = map.next_value::<Option<Str<'de>>>()?;
                        }
                        "content" if content.is_none() => {
                            content = map.next_value::<Option<Content<'de>>>()?.map(Box::new);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Part {
                    kind,
                    text,
                    content,
                })
            }
            // A bare string in the list counts as a text part.
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Part {
                    kind: None,
                    text: Some(Str(Cow::Borrowed(v))),
                    content: None,
                })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Part {
                    kind: None,
                    text: Some(Str(Cow::Owned(v.to_owned()))),
                    content: None,
                })
            }
        }
        deserializer.deserialize_any(PartVisitor)
    }
}

/// A tool definition: OpenAI's `{"type":"function","function":{"name":..}}`, or a bare
/// `{"name":..}`.
#[derive(Debug, Deserialize)]
pub(crate) struct Tool<'a> {
    #[serde(borrow, default)]
    function: Option<ToolFunction<'a>>,
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
}

#[derive(Debug, Deserialize)]
struct ToolFunction<'a> {
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
}

impl Tool<'_> {
    pub(crate) fn name(&self) -> Option<&str> {
        self.function
            .as_ref()
            .and_then(|function| function.name.as_ref())
            .or(self.name.as_ref())
            .map(|name| &*name.0)
    }
}

/// Whitespace-separated words, the mock's token count.
pub(crate) fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// What the echo and the usage need from a request, whatever its dialect.
pub(crate) trait Conversation {
    /// The request's `model`.
    fn model(&self) -> Option<&str>;
    /// The prompt's token count (the mock's deterministic count).
    fn prompt_tokens(&self) -> u64;
    /// The turn the echo answers.
    fn last_turn(&self) -> LastTurn<'_>;
    /// The name of the first tool offered.
    fn first_tool(&self) -> Option<&str>;
    /// Whether it holds the conversation the echo needs (`messages` or `input`).
    fn has_input(&self) -> bool;
    /// Whether it asks for a stream.
    fn streams(&self) -> bool;
}

/// The turn the echo answers.
#[derive(Debug)]
pub(crate) enum LastTurn<'a> {
    /// The conversation ends with a tool result with this text.
    ToolResult(Cow<'a, str>),
    /// The text of the last user message (empty without one).
    User(Cow<'a, str>),
}

impl Conversation for ChatRequest<'_> {
    fn has_input(&self) -> bool {
        self.messages.is_some()
    }

    fn streams(&self) -> bool {
        self.is_stream()
    }

    fn model(&self) -> Option<&str> {
        self.model.as_ref().map(|model| &*model.0)
    }

    /// Words of every message's text plus 4 per message.
    fn prompt_tokens(&self) -> u64 {
        let messages = self.messages.as_deref().unwrap_or(&[]);
        messages
            .iter()
            .map(|message| message.words() as u64 + 4)
            .sum()
    }

    fn last_turn(&self) -> LastTurn<'_> {
        let messages = self.messages.as_deref().unwrap_or(&[]);
        if let Some(last) = messages.last().filter(|message| message.role() == "tool") {
            return LastTurn::ToolResult(last.text());
        }
        LastTurn::User(
            messages
                .iter()
                .rev()
                .find(|message| message.role() == "user")
                .map_or(Cow::Borrowed(""), Message::text),
        )
    }

    fn first_tool(&self) -> Option<&str> {
        first_tool(self.tools.as_deref())
    }
}

/// The name of the first named tool.
pub(crate) fn first_tool<'t>(tools: Option<&'t [Tool<'t>]>) -> Option<&'t str> {
    tools.unwrap_or(&[]).iter().find_map(Tool::name)
}

/// The prompt's token count: words of every message's text plus 4 per message.
#[cfg(test)]
pub(crate) fn prompt_tokens(request: &ChatRequest<'_>) -> u64 {
    request.prompt_tokens()
}

/// `needle` (ASCII, lower case) occurs in `haystack`, ignoring ASCII case.
pub(crate) fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let needle = needle.as_bytes();
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|window| window.eq_ignore_ascii_case(needle))
}

/// A tool call of an answer.
#[derive(Debug)]
pub(crate) struct AnswerToolCall<'a> {
    pub(crate) id: Cow<'a, str>,
    pub(crate) name: Cow<'a, str>,
    pub(crate) arguments: Cow<'a, str>,
}

/// A completion with everything resolved: what the mock will send.
#[derive(Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) model: &'a str,
    pub(crate) content: Option<Cow<'a, str>>,
    pub(crate) reasoning: Option<&'a str>,
    pub(crate) tool_calls: Vec<AnswerToolCall<'a>>,
    pub(crate) finish_reason: &'a str,
    pub(crate) usage: Usage,
    /// Prompt tokens served from a cache (at most `usage.prompt_tokens`).
    pub(crate) cached_tokens: u64,
}

impl Answer<'_> {
    /// Reasoning tokens: the words of the reasoning, at most the completion tokens.
    pub(crate) fn reasoning_tokens(&self) -> u64 {
        (self.reasoning.map_or(0, words) as u64).min(self.usage.completion_tokens)
    }
}

/// Resolves a completion reply against the request. `next_call_id` numbers tool calls
/// that have no id, which are then named `<call_prefix><N>`.
pub(crate) fn resolve<'a>(
    completion: &'a Completion,
    request: &'a dyn Conversation,
    default_model: &'a str,
    call_prefix: &str,
    next_call_id: &mut dyn FnMut() -> u64,
) -> Answer<'a> {
    let mut content: Option<Cow<'a, str>> = completion.content.as_deref().map(Cow::Borrowed);
    let mut tool_calls: Vec<AnswerToolCall<'a>> = completion
        .tool_calls
        .iter()
        .map(|call| AnswerToolCall {
            id: match &call.id {
                Some(id) => Cow::Borrowed(id.as_str()),
                None => Cow::Owned(format!("{call_prefix}{}", next_call_id())),
            },
            name: Cow::Borrowed(&call.name),
            arguments: Cow::Borrowed(&call.arguments),
        })
        .collect();
    if completion.echo {
        echo(
            request,
            &mut content,
            &mut tool_calls,
            call_prefix,
            next_call_id,
        );
    }

    let reasoning = completion.reasoning.as_deref();
    let finish_reason = match &completion.finish_reason {
        Some(reason) => reason.as_str(),
        None if tool_calls.is_empty() => "stop",
        None => "tool_calls",
    };
    let usage = completion.usage.unwrap_or_else(|| {
        let completion_words = content.as_deref().map_or(0, words)
            + reasoning.map_or(0, words)
            + tool_calls
                .iter()
                .map(|call| words(&call.name) + words(&call.arguments))
                .sum::<usize>();
        Usage::new(request.prompt_tokens(), completion_words as u64)
    });
    let model = completion
        .model
        .as_deref()
        .or_else(|| request.model())
        .unwrap_or(default_model);
    Answer {
        model,
        content,
        reasoning,
        tool_calls,
        finish_reason,
        usage,
        cached_tokens: completion
            .cached_tokens
            .unwrap_or(0)
            .min(usage.prompt_tokens),
    }
}

/// The echo behaviour: fills in content or a tool call from the request.
fn echo<'a>(
    request: &'a dyn Conversation,
    content: &mut Option<Cow<'a, str>>,
    tool_calls: &mut Vec<AnswerToolCall<'a>>,
    call_prefix: &str,
    next_call_id: &mut dyn FnMut() -> u64,
) {
    let user_text = match request.last_turn() {
        LastTurn::ToolResult(output) => {
            *content = Some(Cow::Owned(format!("tool said: {output}")));
            return;
        }
        LastTurn::User(text) => text,
    };
    let first_tool = request.first_tool();
    if let Some(name) = first_tool.filter(|_| contains_ignore_case(&user_text, "use a tool")) {
        #[derive(Serialize)]
        struct Query<'q> {
            query: &'q str,
        }
        let arguments = serde_json::to_string(&Query { query: &user_text })
            .unwrap_or_else(|_| String::from("{}"));
        tool_calls.push(AnswerToolCall {
            id: Cow::Owned(format!("{call_prefix}{}", next_call_id())),
            name: Cow::Borrowed(name),
            arguments: Cow::Owned(arguments),
        });
        *content = None;
    } else {
        *content = Some(Cow::Owned(format!("echo: {user_text}")));
    }
}

// ---------------------------------------------------------------------------------------
// Rendering

#[derive(Serialize)]
struct CompletionOut<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [ChoiceOut<'a>; 1],
    usage: ChatUsage,
}

/// `usage` of a chat answer: [`Usage`], plus `prompt_tokens_details` when some prompt
/// tokens were cached.
#[derive(Serialize, Clone, Copy)]
struct ChatUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<CachedTokens>,
}

#[derive(Serialize, Clone, Copy)]
struct CachedTokens {
    cached_tokens: u64,
}

impl ChatUsage {
    fn of(answer: &Answer<'_>) -> Self {
        Self {
            prompt_tokens: answer.usage.prompt_tokens,
            completion_tokens: answer.usage.completion_tokens,
            total_tokens: answer.usage.total_tokens,
            prompt_tokens_details: (answer.cached_tokens > 0).then_some(CachedTokens {
                cached_tokens: answer.cached_tokens,
            }),
        }
    }
}

#[derive(Serialize)]
struct ChoiceOut<'a> {
    index: u32,
    message: MessageOut<'a>,
    finish_reason: &'a str,
    logprobs: Option<()>,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: &'a [ToolCallOut<'a>],
}

#[derive(Serialize)]
struct ToolCallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// A plain answer (`content`, finish `stop`, `usage`) exactly as the mock renders it: the
/// non-streamed `chat.completion` body, and the streamed events with `content` in one
/// piece (role, content, finish, usage, `data: [DONE]`, each `Bytes` one event with `\n`
/// line ends). For other servers that must speak like the mock, e.g. benchmark upstreams.
pub fn render_chat(
    model: &str,
    content: &str,
    usage: Usage,
    id: &str,
    created: u64,
) -> (Bytes, Vec<Bytes>) {
    let answer = Answer {
        model,
        content: Some(Cow::Borrowed(content)),
        reasoning: None,
        tool_calls: Vec::new(),
        finish_reason: "stop",
        usage,
        cached_tokens: 0,
    };
    let shape = StreamShape {
        chunks: 1,
        include_usage: true,
        crlf: false,
        done: true,
    };
    (
        render_json(&answer, id, created),
        render_stream(&answer, id, created, shape),
    )
}

/// The answer as a `chat.completion` object.
pub(crate) fn render_json(answer: &Answer<'_>, id: &str, created: u64) -> Bytes {
    let tool_calls: Vec<ToolCallOut<'_>> = answer
        .tool_calls
        .iter()
        .map(|call| ToolCallOut {
            id: &call.id,
            kind: "function",
            function: FunctionOut {
                name: &call.name,
                arguments: &call.arguments,
            },
        })
        .collect();
    let out = CompletionOut {
        id,
        object: "chat.completion",
        created,
        model: answer.model,
        choices: [ChoiceOut {
            index: 0,
            message: MessageOut {
                role: "assistant",
                content: answer.content.as_deref(),
                reasoning_content: answer.reasoning,
                tool_calls: &tool_calls,
            },
            finish_reason: answer.finish_reason,
            logprobs: None,
        }],
        usage: ChatUsage::of(answer),
    };
    let mut buf = Vec::with_capacity(256 + answer.content.as_deref().map_or(0, str::len));
    write_json(&mut buf, &out);
    Bytes::from(buf)
}

#[derive(Serialize)]
struct ChunkOut<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<ChatUsage>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallDelta<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallDelta<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// How a stream is cut and framed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamShape {
    pub(crate) chunks: usize,
    pub(crate) include_usage: bool,
    pub(crate) crlf: bool,
    pub(crate) done: bool,
}

/// Writes SSE events into one buffer, remembering where each ends.
struct EventWriter<'a> {
    buf: Vec<u8>,
    ends: Vec<usize>,
    id: &'a str,
    created: u64,
    model: &'a str,
    eol: &'static [u8],
}

impl EventWriter<'_> {
    fn finish_event(&mut self) {
        self.buf.extend_from_slice(self.eol);
        self.buf.extend_from_slice(self.eol);
        self.ends.push(self.buf.len());
    }

    fn chunk(&mut self, delta: Delta<'_>, finish_reason: Option<&str>) {
        let choices = [ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        }];
        self.write(&choices, None);
    }

    fn write(&mut self, choices: &[ChunkChoice<'_>], usage: Option<ChatUsage>) {
        let out = ChunkOut {
            id: self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model,
            choices,
            usage,
        };
        self.buf.extend_from_slice(b"data: ");
        write_json(&mut self.buf, &out);
        self.finish_event();
    }

    fn done(&mut self) {
        self.buf.extend_from_slice(b"data: [DONE]");
        self.finish_event();
    }

    fn into_events(self) -> Vec<Bytes> {
        let all = Bytes::from(self.buf);
        let mut start = 0;
        self.ends
            .into_iter()
            .map(|end| {
                let event = all.slice(start..end);
                start = end;
                event
            })
            .collect()
    }
}

/// The answer as `chat.completion.chunk` events, one `Bytes` per event (all slices of
/// one buffer): the role chunk, reasoning pieces, content pieces, each tool call (head,
/// then argument pieces), the finish chunk, the usage chunk if asked for, `[DONE]`.
pub(crate) fn render_stream(
    answer: &Answer<'_>,
    id: &str,
    created: u64,
    shape: StreamShape,
) -> Vec<Bytes> {
    let text_len = answer.content.as_deref().map_or(0, str::len)
        + answer.reasoning.map_or(0, str::len)
        + answer
            .tool_calls
            .iter()
            .map(|call| call.arguments.len() + call.name.len() + call.id.len())
            .sum::<usize>();
    // A capacity hint only: a piece is at least one byte, so `chunks` beyond the text
    // length adds no events.
    let events = 4 + shape.chunks.clamp(1, 64) * (2 + answer.tool_calls.len());
    let mut writer = EventWriter {
        buf: Vec::with_capacity(text_len + events * (120 + id.len() + answer.model.len())),
        ends: Vec::with_capacity(events),
        id,
        created,
        model: answer.model,
        eol: if shape.crlf { b"\r\n" } else { b"\n" },
    };

    writer.chunk(
        Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Delta::default()
        },
        None,
    );
    for piece in pieces(answer.reasoning.unwrap_or(""), shape.chunks) {
        writer.chunk(
            Delta {
                reasoning_content: Some(piece),
                ..Delta::default()
            },
            None,
        );
    }
    for piece in pieces(answer.content.as_deref().unwrap_or(""), shape.chunks) {
        writer.chunk(
            Delta {
                content: Some(piece),
                ..Delta::default()
            },
            None,
        );
    }
    for (index, call) in answer.tool_calls.iter().enumerate() {
        let head = ToolCallDelta {
            index,
            id: Some(&call.id),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(&call.name),
                arguments: "",
            },
        };
        writer.chunk(
            Delta {
                tool_calls: Some([head]),
                ..Delta::default()
            },
            None,
        );
        for piece in pieces(&call.arguments, shape.chunks) {
            let fragment = ToolCallDelta {
                index,
                id: None,
                kind: None,
                function: FunctionDelta {
                    name: None,
                    arguments: piece,
                },
            };
            writer.chunk(
                Delta {
                    tool_calls: Some([fragment]),
                    ..Delta::default()
                },
                None,
            );
        }
    }
    writer.chunk(Delta::default(), Some(answer.finish_reason));
    if shape.include_usage {
        writer.write(&[], Some(ChatUsage::of(answer)));
    }
    if shape.done {
        writer.done();
    }
    writer.into_events()
}

/// Serialises into `buf`. The output types here cannot fail to serialise; should one
/// ever fail, `null` is written so the output stays JSON.
pub(crate) fn write_json(buf: &mut Vec<u8>, value: &impl Serialize) {
    let start = buf.len();
    if let Err(err) = serde_json::to_writer(&mut *buf, value) {
        tracing::error!(%err, "mock upstream: cannot serialise a response");
        buf.truncate(start);
        buf.extend_from_slice(b"null");
    }
}

/// Splits `text` into at most `n` (at least 1) non-empty pieces of about equal byte
/// length, cut at char boundaries. An empty text gives no piece.
pub(crate) fn pieces(text: &str, n: usize) -> impl Iterator<Item = &str> {
    let len = text.len();
    // More pieces than bytes could not all be non-empty.
    let n = n.clamp(1, len.max(1));
    let mut start = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < n && start < len {
            i += 1;
            // n <= len, so len * i fits in u128 whatever the platform.
            let mut end = (len as u128 * i as u128 / n as u128) as usize;
            while !text.is_char_boundary(end) {
                end += 1;
            }
            if end > start {
                let piece = &text[start..end];
                start = end;
                return Some(piece);
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_evenly_and_reassemble() {
        let got: Vec<&str> = pieces("abcdefgh", 4).collect();
        assert_eq!(got, ["ab", "cd", "ef", "gh"]);
        let got: Vec<&str> = pieces("abc", 4).collect();
        assert_eq!(got.concat(), "abc");
        assert!(got.len() <= 3 && got.iter().all(|p| !p.is_empty()));
        assert_eq!(pieces("", 4).count(), 0);
        assert_eq!(pieces("abc", 0).collect::<Vec<_>>(), ["abc"]);
        assert_eq!(
            pieces("abc", usize::MAX).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn pieces_respect_char_boundaries() {
        for text in ["héllo wörld", "日本語のテキスト", "a😀b😀c", "😀"] {
            for n in 1..12 {
                let got: Vec<&str> = pieces(text, n).collect();
                assert_eq!(got.concat(), text, "n = {n}");
                assert!(got.len() <= n);
                assert!(got.iter().all(|piece| !piece.is_empty()));
            }
        }
    }

    #[test]
    fn parses_borrowed_request_and_counts_words() {
        let body = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},
            "messages":[{"role":"system","content":"be brief"},
                        {"role":"user","content":[{"type":"text","text":"hello there"},
                                                  {"type":"image_url","image_url":{"url":"x"}},
                                                  {"type":"text","text":"again"}]}],
            "tools":[{"type":"function","function":{"name":"search","parameters":{}}}]}"#;
        let request: ChatRequest<'_> = serde_json::from_slice(body).expect("valid request");
        assert!(request.is_stream());
        assert!(request.include_usage());
        assert!(matches!(
            request.model.as_ref().map(|m| &m.0),
            Some(Cow::Borrowed("m"))
        ));
        let messages = request.messages.as_deref().expect("messages");
        assert_eq!(messages[1].text(), "hello there\nagain");
        // 2 + 3 words, plus 4 per message.
        assert_eq!(prompt_tokens(&request), 13);
        assert_eq!(
            request.tools.as_deref().and_then(|t| t[0].name()),
            Some("search")
        );
    }

    #[test]
    fn echo_decisions() {
        let mut counter = 0;
        let mut next = || {
            counter += 1;
            counter
        };
        let body = br#"{"messages":[{"role":"user","content":"Please USE A TOOL now"}],
                        "tools":[{"name":"lookup"}]}"#;
        let request: ChatRequest<'_> = serde_json::from_slice(body).expect("valid request");
        let completion = Completion {
            echo: true,
            ..Completion::default()
        };
        let answer = resolve(&completion, &request, "dflt", "call_", &mut next);
        assert_eq!(answer.model, "dflt");
        assert!(answer.content.is_none());
        assert_eq!(answer.finish_reason, "tool_calls");
        assert_eq!(answer.tool_calls[0].name, "lookup");
        assert_eq!(answer.tool_calls[0].id, "call_1");
        assert_eq!(
            answer.tool_calls[0].arguments,
            r#"{"query":"Please USE A TOOL now"}"#
        );

        let body = br#"{"messages":[{"role":"user","content":"x"},
                                    {"role":"tool","tool_call_id":"call_1","content":"42"}],
                        "tools":[{"name":"lookup"}]}"#;
        let request: ChatRequest<'_> = serde_json::from_slice(body).expect("valid request");
        let answer = resolve(&completion, &request, "dflt", "call_", &mut next);
        assert_eq!(answer.content.as_deref(), Some("tool said: 42"));
        assert_eq!(answer.finish_reason, "stop");
        assert_eq!(answer.usage, Usage::new(10, 3));
    }

    #[test]
    fn content_of_odd_shapes_is_tolerated() {
        let body =
            br#"{"messages":[{"role":"user","content":null},{"role":"user","content":{"a":1}},
                                    {"role":"user","content":5},{"role":"user","content":["bare"]},
                                    {"content":"no role"}]}"#;
        let request: ChatRequest<'_> = serde_json::from_slice(body).expect("tolerated");
        let messages = request.messages.as_deref().expect("messages");
        assert_eq!(messages[0].text(), "");
        assert_eq!(messages[1].text(), "");
        assert_eq!(messages[2].text(), "");
        assert_eq!(messages[3].text(), "bare");
        assert_eq!(messages[4].role(), "");
    }
}
