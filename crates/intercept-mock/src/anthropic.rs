//! Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`): the parts of
//! a request the mock reads, and the rendering of an answer as a `message` object or a
//! `message_start` ... `message_stop` event stream.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chat::{
    first_tool, words, write_json, Answer, Content, Conversation, LastTurn, Str, Tool,
};
use super::reply::StreamError;
use super::responses::StreamShape;
use super::sse::SseBuf;

/// The fields of a Messages request the mock looks at; everything else is ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MessagesRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    system: Option<Content<'a>>,
    #[serde(borrow, default)]
    pub(crate) messages: Option<Vec<Message<'a>>>,
    #[serde(borrow, default)]
    tools: Option<Vec<Tool<'a>>>,
}

impl MessagesRequest<'_> {
    pub(crate) fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }
}

/// A message: `role` and `content` (a string or a list of blocks).
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

    /// Words of the string, or of the blocks' texts and `tool_result` contents.
    fn words(&self) -> usize {
        match &self.content {
            Some(Content::Text(text)) => words(text),
            Some(content) => content
                .parts()
                .iter()
                .map(|block| {
                    block.text().map_or(0, words) + block.content().map_or(0, Content::words)
                })
                .sum(),
            None => 0,
        }
    }

    /// The texts of the `tool_result` blocks, if there are any.
    fn tool_results(&self) -> Option<Cow<'_, str>> {
        let content = self.content.as_ref()?;
        let mut results = content
            .parts()
            .iter()
            .filter(|block| block.kind() == "tool_result")
            .map(|block| block.content().map_or(Cow::Borrowed(""), Content::text));
        let first = results.next()?;
        Some(results.fold(first, |mut joined, next| {
            let owned = joined.to_mut();
            owned.push('\n');
            owned.push_str(&next);
            joined
        }))
    }
}

impl Conversation for MessagesRequest<'_> {
    fn has_input(&self) -> bool {
        self.messages.is_some()
    }

    fn streams(&self) -> bool {
        self.is_stream()
    }

    fn model(&self) -> Option<&str> {
        self.model.as_ref().map(|model| &*model.0)
    }

    /// Words of the system prompt and of every message (text blocks and `tool_result`
    /// contents), plus 4 for the system prompt and per message.
    fn prompt_tokens(&self) -> u64 {
        let system = self
            .system
            .as_ref()
            .map_or(0, |system| system.words() as u64 + 4);
        let messages = self.messages.as_deref().unwrap_or(&[]);
        system
            + messages
                .iter()
                .map(|message| message.words() as u64 + 4)
                .sum::<u64>()
    }

    fn last_turn(&self) -> LastTurn<'_> {
        let messages = self.messages.as_deref().unwrap_or(&[]);
        if let Some(results) = messages
            .last()
            .filter(|message| message.role() == "user")
            .and_then(Message::tool_results)
        {
            return LastTurn::ToolResult(results);
        }
        LastTurn::User(
            messages
                .iter()
                .rev()
                .find(|message| message.role() == "user")
                .and_then(|message| message.content.as_ref())
                .map_or(Cow::Borrowed(""), Content::text),
        )
    }

    fn first_tool(&self) -> Option<&str> {
        first_tool(self.tools.as_deref())
    }
}

// ---------------------------------------------------------------------------------------
// Rendering

/// Anthropic's stop reason for a finish reason (`stop` → `end_turn`, `length` →
/// `max_tokens`, `tool_calls` → `tool_use`; anything else as is).
pub(crate) fn stop_reason(finish_reason: &str) -> &str {
    match finish_reason {
        "stop" => "end_turn",
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        other => other,
    }
}

#[derive(Serialize, Clone, Copy)]
struct MessageOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: &'a [Block<'a>],
    stop_reason: Option<&'a str>,
    stop_sequence: Option<()>,
    usage: UsageOut,
}

#[derive(Serialize, Clone, Copy)]
struct UsageOut {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
}

#[derive(Serialize, Clone, Copy)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
        /// The arguments as scripted (streamed as `partial_json`).
        #[serde(skip)]
        arguments: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart {
        message: MessageOut<'a>,
    },
    Ping,
    ContentBlockStart {
        index: usize,
        content_block: Block<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: Delta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: StopDelta<'a>,
        usage: OutputUsage,
    },
    MessageStop,
    Error {
        error: ErrorOut<'a>,
    },
}

impl Event<'_> {
    fn name(&self) -> &'static str {
        match self {
            Event::MessageStart { .. } => "message_start",
            Event::Ping => "ping",
            Event::ContentBlockStart { .. } => "content_block_start",
            Event::ContentBlockDelta { .. } => "content_block_delta",
            Event::ContentBlockStop { .. } => "content_block_stop",
            Event::MessageDelta { .. } => "message_delta",
            Event::MessageStop => "message_stop",
            Event::Error { .. } => "error",
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Delta<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

#[derive(Serialize)]
struct StopDelta<'a> {
    stop_reason: &'a str,
    stop_sequence: Option<()>,
}

#[derive(Serialize)]
struct OutputUsage {
    output_tokens: u64,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: &'a str,
}

/// Anthropic's error body, `{"type":"error","error":{"type":..,"message":..}}`.
pub(crate) fn error_body(kind: &str, message: &str) -> Bytes {
    let mut buf = Vec::with_capacity(64 + message.len());
    write_json(
        &mut buf,
        &Event::Error {
            error: ErrorOut { kind, message },
        },
    );
    Bytes::from(buf)
}

fn usage_of(answer: &Answer<'_>) -> UsageOut {
    UsageOut {
        input_tokens: answer.usage.prompt_tokens - answer.cached_tokens,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: answer.cached_tokens,
        output_tokens: answer.usage.completion_tokens,
    }
}

/// The tool inputs: the arguments parsed as JSON; empty or unreadable arguments give `{}`.
fn inputs(answer: &Answer<'_>) -> Vec<Value> {
    answer
        .tool_calls
        .iter()
        .map(|call| {
            serde_json::from_str(&call.arguments)
                .unwrap_or_else(|_| Value::Object(serde_json::Map::new()))
        })
        .collect()
}

/// The content blocks: thinking (if reasoning), text (if content), tool uses.
fn blocks<'a>(answer: &'a Answer<'a>, signature: &'a str, inputs: &'a [Value]) -> Vec<Block<'a>> {
    let mut blocks = Vec::with_capacity(2 + answer.tool_calls.len());
    if let Some(thinking) = answer.reasoning {
        blocks.push(Block::Thinking {
            thinking,
            signature,
        });
    }
    if let Some(text) = answer.content.as_deref() {
        blocks.push(Block::Text { text });
    }
    for (call, input) in answer.tool_calls.iter().zip(inputs) {
        blocks.push(Block::ToolUse {
            id: &call.id,
            name: &call.name,
            input,
            arguments: &call.arguments,
        });
    }
    blocks
}

/// The id and thinking signature of message number `number`.
fn ids(number: u64) -> (String, String) {
    (format!("msg_mock_{number}"), format!("sig_mock_{number}"))
}

/// The answer as a `message` object.
pub(crate) fn render_json(answer: &Answer<'_>, number: u64) -> Bytes {
    let (id, signature) = ids(number);
    let inputs = inputs(answer);
    let content = blocks(answer, &signature, &inputs);
    let out = MessageOut {
        id: &id,
        kind: "message",
        role: "assistant",
        model: answer.model,
        content: &content,
        stop_reason: Some(stop_reason(answer.finish_reason)),
        stop_sequence: None,
        usage: usage_of(answer),
    };
    let mut buf = Vec::with_capacity(256 + answer.content.as_deref().map_or(0, str::len));
    write_json(&mut buf, &out);
    Bytes::from(buf)
}

/// The answer as Messages stream events, one `Bytes` per event: `message_start`, `ping`,
/// per block `content_block_start`, deltas, `content_block_stop`, then `message_delta`
/// and `message_stop`. With `error`, an `error` event follows the blocks instead.
pub(crate) fn render_stream(
    answer: &Answer<'_>,
    number: u64,
    shape: StreamShape,
    error: Option<&StreamError>,
) -> Vec<Bytes> {
    let (id, signature) = ids(number);
    let inputs = inputs(answer);
    let content = blocks(answer, &signature, &inputs);
    let empty = Value::Object(serde_json::Map::new());
    let usage = usage_of(answer);

    let text_len = answer.content.as_deref().map_or(0, str::len)
        + answer.reasoning.map_or(0, str::len)
        + answer
            .tool_calls
            .iter()
            .map(|call| call.arguments.len())
            .sum::<usize>();
    let events = 5 + content.len() * (3 + shape.chunks.clamp(1, 64));
    let mut sse = SseBuf::new(2 * text_len + events * 120, events, shape.crlf);
    let mut emit = |event: Event<'_>| sse.json(Some(event.name()), &event);

    emit(Event::MessageStart {
        message: MessageOut {
            id: &id,
            kind: "message",
            role: "assistant",
            model: answer.model,
            content: &[],
            stop_reason: None,
            stop_sequence: None,
            usage: UsageOut {
                output_tokens: 1,
                ..usage
            },
        },
    });
    emit(Event::Ping);
    for (index, block) in content.iter().enumerate() {
        block_events(&mut emit, index, *block, &empty, shape.chunks);
    }
    if let Some(error) = error {
        emit(Event::Error {
            error: ErrorOut {
                kind: &error.kind,
                message: &error.message,
            },
        });
        return sse.into_events();
    }
    emit(Event::MessageDelta {
        delta: StopDelta {
            stop_reason: stop_reason(answer.finish_reason),
            stop_sequence: None,
        },
        usage: OutputUsage {
            output_tokens: usage.output_tokens,
        },
    });
    if shape.done {
        emit(Event::MessageStop);
        if shape.sentinel {
            sse.done();
        }
    }
    sse.into_events()
}

/// One content block's events: its start (empty), its content in `chunks` deltas (and a
/// thinking block's signature), its stop.
fn block_events<'a>(
    emit: &mut impl FnMut(Event<'a>),
    index: usize,
    block: Block<'a>,
    empty: &'a Value,
    chunks: usize,
) {
    match block {
        Block::Thinking {
            thinking,
            signature,
        } => {
            let content_block = Block::Thinking {
                thinking: "",
                signature: "",
            };
            emit(Event::ContentBlockStart {
                index,
                content_block,
            });
            for piece in super::chat::pieces(thinking, chunks) {
                let delta = Delta::Thinking { thinking: piece };
                emit(Event::ContentBlockDelta { index, delta });
            }
            let delta = Delta::Signature { signature };
            emit(Event::ContentBlockDelta { index, delta });
        }
        Block::Text { text } => {
            let content_block = Block::Text { text: "" };
            emit(Event::ContentBlockStart {
                index,
                content_block,
            });
            for piece in super::chat::pieces(text, chunks) {
                let delta = Delta::Text { text: piece };
                emit(Event::ContentBlockDelta { index, delta });
            }
        }
        Block::ToolUse {
            id,
            name,
            arguments,
            ..
        } => {
            let content_block = Block::ToolUse {
                id,
                name,
                input: empty,
                arguments: "",
            };
            emit(Event::ContentBlockStart {
                index,
                content_block,
            });
            for piece in super::chat::pieces(arguments, chunks) {
                let delta = Delta::InputJson {
                    partial_json: piece,
                };
                emit(Event::ContentBlockDelta { index, delta });
            }
        }
    }
    emit(Event::ContentBlockStop { index });
}

/// The `count_tokens` answer, `{"input_tokens": N}`.
pub(crate) fn render_count(input_tokens: u64) -> Bytes {
    #[derive(Serialize)]
    struct Count {
        input_tokens: u64,
    }
    let mut buf = Vec::with_capacity(32);
    write_json(&mut buf, &Count { input_tokens });
    Bytes::from(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_and_counts_words() {
        let body = br#"{"model":"m","system":[{"type":"text","text":"be brief"}],"messages":[
            {"role":"user","content":"hello there"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},
                {"type":"tool_use","id":"t1","name":"search","input":{"q":1}}]},
            {"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":"found it"},
                {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"and this"}]}]}],
            "tools":[{"name":"search","input_schema":{"type":"object"}}]}"#;
        let request: MessagesRequest<'_> = serde_json::from_slice(body).expect("valid");
        // system 2 + 4; messages 2 + 4, 0 + 4, 4 + 4.
        assert_eq!(request.prompt_tokens(), 24);
        assert!(matches!(request.last_turn(),
            LastTurn::ToolResult(text) if text == "found it\nand this"));
        assert_eq!(request.first_tool(), Some("search"));
        assert_eq!(stop_reason("length"), "max_tokens");
        assert_eq!(stop_reason("refusal"), "refusal");
    }
}
