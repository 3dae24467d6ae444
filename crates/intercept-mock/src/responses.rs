//! OpenAI Responses (`POST /v1/responses`): the parts of a request the mock reads, and the
//! rendering of an answer as a `response` object or a `response.*` event stream.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::chat::{
    first_tool, pieces, words, write_json, Answer, Content, Conversation, LastTurn, Str, Tool,
};
use super::reply::StreamError;
use super::sse::SseBuf;

/// The fields of a Responses request the mock looks at; everything else is ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ResponsesRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    instructions: Option<Content<'a>>,
    #[serde(borrow, default)]
    pub(crate) input: Option<Input<'a>>,
    #[serde(borrow, default)]
    tools: Option<Vec<Tool<'a>>>,
}

impl ResponsesRequest<'_> {
    pub(crate) fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// The `instructions`, when a string (echoed in the response object).
    pub(crate) fn instructions(&self) -> Option<&str> {
        match &self.instructions {
            Some(Content::Text(text)) => Some(text),
            _ => None,
        }
    }
}

/// The `input`: a string, or a list of items.
#[derive(Debug)]
pub(crate) enum Input<'a> {
    Text(Cow<'a, str>),
    Items(Vec<Item<'a>>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Input<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InputVisitor;
        impl<'de> Visitor<'de> for InputVisitor {
            type Value = Input<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of input items")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(1).min(64));
                while let Some(item) = seq.next_element::<Item<'de>>()? {
                    items.push(item);
                }
                Ok(Input::Items(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Input::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Input::Other)
            }
        }
        deserializer.deserialize_any(InputVisitor)
    }
}

/// An input item: a message (`role`, `content`), a `function_call` (`name`,
/// `arguments`), a `function_call_output` (`output`), a reasoning item, ...
#[derive(Debug, Deserialize)]
pub(crate) struct Item<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Str<'a>>,
    #[serde(borrow, default)]
    role: Option<Str<'a>>,
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
    #[serde(borrow, default)]
    output: Option<Content<'a>>,
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    arguments: Option<Str<'a>>,
}

impl Item<'_> {
    fn kind(&self) -> &str {
        self.kind.as_ref().map_or("", |kind| &kind.0)
    }

    fn role(&self) -> &str {
        self.role.as_ref().map_or("", |role| &role.0)
    }

    fn is_tool_output(&self) -> bool {
        self.kind().ends_with("_call_output")
    }

    fn words(&self) -> usize {
        self.content.as_ref().map_or(0, Content::words)
            + self.output.as_ref().map_or(0, Content::words)
            + self.name.as_ref().map_or(0, |name| words(&name.0))
            + self.arguments.as_ref().map_or(0, |args| words(&args.0))
    }
}

impl Conversation for ResponsesRequest<'_> {
    fn has_input(&self) -> bool {
        self.input.is_some()
    }

    fn streams(&self) -> bool {
        self.is_stream()
    }

    fn model(&self) -> Option<&str> {
        self.model.as_ref().map(|model| &*model.0)
    }

    /// Words of the instructions and of every item's texts (content, output, name and
    /// arguments), plus 4 for the instructions and per item (a string input is one item).
    fn prompt_tokens(&self) -> u64 {
        let instructions = self
            .instructions
            .as_ref()
            .map_or(0, |text| text.words() as u64 + 4);
        let input = match &self.input {
            Some(Input::Text(text)) => words(text) as u64 + 4,
            Some(Input::Items(items)) => items.iter().map(|item| item.words() as u64 + 4).sum(),
            Some(Input::Other) | None => 0,
        };
        instructions + input
    }

    fn last_turn(&self) -> LastTurn<'_> {
        match &self.input {
            Some(Input::Text(text)) => LastTurn::User(Cow::Borrowed(text)),
            Some(Input::Items(items)) => {
                if let Some(last) = items.last().filter(|item| item.is_tool_output()) {
                    return LastTurn::ToolResult(
                        last.output
                            .as_ref()
                            .map_or(Cow::Borrowed(""), Content::text),
                    );
                }
                LastTurn::User(
                    items
                        .iter()
                        .rev()
                        .find(|item| item.role() == "user")
                        .and_then(|item| item.content.as_ref())
                        .map_or(Cow::Borrowed(""), Content::text),
                )
            }
            Some(Input::Other) | None => LastTurn::User(Cow::Borrowed("")),
        }
    }

    fn first_tool(&self) -> Option<&str> {
        first_tool(self.tools.as_deref())
    }
}

// ---------------------------------------------------------------------------------------
// Rendering

/// Where a response comes from: its number (for ids), time and echoed instructions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta<'a> {
    pub(crate) number: u64,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) instructions: Option<&'a str>,
}

/// How a stream is cut and framed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamShape {
    pub(crate) chunks: usize,
    pub(crate) crlf: bool,
    /// Send the terminal event.
    pub(crate) done: bool,
    /// Send `data: [DONE]` after the terminal event.
    pub(crate) sentinel: bool,
}

#[derive(Serialize, Clone, Copy)]
struct ResponseOut<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'a str,
    error: Option<ErrorOut<'a>>,
    incomplete_details: Option<Incomplete<'a>>,
    instructions: Option<&'a str>,
    model: &'a str,
    output: &'a [ItemOut<'a>],
    usage: Option<UsageOut>,
}

#[derive(Serialize, Clone, Copy)]
struct ErrorOut<'a> {
    code: &'a str,
    message: &'a str,
}

#[derive(Serialize, Clone, Copy)]
struct Incomplete<'a> {
    reason: &'a str,
}

#[derive(Serialize, Clone, Copy)]
struct UsageOut {
    input_tokens: u64,
    input_tokens_details: InputDetails,
    output_tokens: u64,
    output_tokens_details: OutputDetails,
    total_tokens: u64,
}

#[derive(Serialize, Clone, Copy)]
struct InputDetails {
    cached_tokens: u64,
}

#[derive(Serialize, Clone, Copy)]
struct OutputDetails {
    reasoning_tokens: u64,
}

#[derive(Serialize, Clone, Copy)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ItemOut<'a> {
    Reasoning {
        id: &'a str,
        summary: [u8; 0],
        content: &'a [PartOut<'a>],
    },
    Message {
        id: &'a str,
        status: &'a str,
        role: &'static str,
        content: &'a [PartOut<'a>],
    },
    FunctionCall {
        id: &'a str,
        status: &'a str,
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
}

#[derive(Serialize, Clone, Copy)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartOut<'a> {
    OutputText {
        text: &'a str,
        annotations: [u8; 0],
        logprobs: [u8; 0],
    },
    ReasoningText {
        text: &'a str,
    },
}

impl<'a> PartOut<'a> {
    fn output_text(text: &'a str) -> Self {
        PartOut::OutputText {
            text,
            annotations: [],
            logprobs: [],
        }
    }
}

/// The status and incomplete reason for a finish reason.
fn status_of(finish_reason: &str) -> (&'static str, Option<Incomplete<'static>>) {
    match finish_reason {
        "length" => (
            "incomplete",
            Some(Incomplete {
                reason: "max_output_tokens",
            }),
        ),
        "content_filter" => (
            "incomplete",
            Some(Incomplete {
                reason: "content_filter",
            }),
        ),
        _ => ("completed", None),
    }
}

fn usage_of(answer: &Answer<'_>) -> UsageOut {
    UsageOut {
        input_tokens: answer.usage.prompt_tokens,
        input_tokens_details: InputDetails {
            cached_tokens: answer.cached_tokens,
        },
        output_tokens: answer.usage.completion_tokens,
        output_tokens_details: OutputDetails {
            reasoning_tokens: answer.reasoning_tokens(),
        },
        total_tokens: answer.usage.total_tokens,
    }
}

/// The ids of a response and its items.
struct Ids {
    response: String,
    reasoning: String,
    message: String,
    calls: Vec<String>,
}

impl Ids {
    fn new(number: u64, calls: usize) -> Self {
        Self {
            response: format!("resp_mock_{number}"),
            reasoning: format!("rs_mock_{number}"),
            message: format!("msg_mock_{number}"),
            calls: (0..calls)
                .map(|index| format!("fc_mock_{number}_{index}"))
                .collect(),
        }
    }
}

/// The parts of the finished items (reasoning part, text part), kept apart so items can
/// borrow them.
struct Parts<'a> {
    reasoning: Option<[PartOut<'a>; 1]>,
    text: Option<[PartOut<'a>; 1]>,
}

impl<'a> Parts<'a> {
    fn of(answer: &'a Answer<'a>) -> Self {
        Self {
            reasoning: answer
                .reasoning
                .map(|text| [PartOut::ReasoningText { text }]),
            text: answer
                .content
                .as_deref()
                .map(|text| [PartOut::output_text(text)]),
        }
    }
}

/// The finished output: reasoning item, message item, function-call items.
fn items<'a>(
    answer: &'a Answer<'a>,
    ids: &'a Ids,
    parts: &'a Parts<'a>,
    message_status: &'a str,
) -> Vec<ItemOut<'a>> {
    let mut items = Vec::with_capacity(2 + answer.tool_calls.len());
    if let Some(part) = &parts.reasoning {
        items.push(ItemOut::Reasoning {
            id: &ids.reasoning,
            summary: [],
            content: part,
        });
    }
    if let Some(part) = &parts.text {
        items.push(ItemOut::Message {
            id: &ids.message,
            status: message_status,
            role: "assistant",
            content: part,
        });
    }
    for (call, id) in answer.tool_calls.iter().zip(&ids.calls) {
        items.push(ItemOut::FunctionCall {
            id,
            status: "completed",
            call_id: &call.id,
            name: &call.name,
            arguments: &call.arguments,
        });
    }
    items
}

/// The answer as a `response` object.
pub(crate) fn render_json(answer: &Answer<'_>, meta: Meta<'_>) -> Bytes {
    let ids = Ids::new(meta.number, answer.tool_calls.len());
    let parts = Parts::of(answer);
    let (status, incomplete) = status_of(answer.finish_reason);
    let output = items(answer, &ids, &parts, status);
    let out = ResponseOut {
        id: &ids.response,
        object: "response",
        created_at: meta.created,
        status,
        error: None,
        incomplete_details: incomplete,
        instructions: meta.instructions,
        model: answer.model,
        output: &output,
        usage: Some(usage_of(answer)),
    };
    let mut buf = Vec::with_capacity(512 + answer.content.as_deref().map_or(0, str::len));
    write_json(&mut buf, &out);
    Bytes::from(buf)
}

/// A `failed` response object.
pub(crate) fn render_failed_json(meta: Meta<'_>, code: &str, message: &str) -> Bytes {
    let id = format!("resp_mock_{}", meta.number);
    let mut buf = Vec::with_capacity(256 + message.len());
    write_json(&mut buf, &failed(&id, meta, code, message));
    Bytes::from(buf)
}

fn failed<'a>(id: &'a str, meta: Meta<'a>, code: &'a str, message: &'a str) -> ResponseOut<'a> {
    ResponseOut {
        id,
        object: "response",
        created_at: meta.created,
        status: "failed",
        error: Some(ErrorOut { code, message }),
        incomplete_details: None,
        instructions: meta.instructions,
        model: meta.model,
        output: &[],
        usage: None,
    }
}

/// An event: `type`, `sequence_number`, then the event's own fields.
#[derive(Serialize)]
struct Event<'a, T> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize)]
struct ResponseEvent<'a> {
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
struct ItemEvent<'a> {
    output_index: usize,
    item: ItemOut<'a>,
}

#[derive(Serialize)]
struct PartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    part: PartOut<'a>,
}

#[derive(Serialize)]
struct TextDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    delta: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[u8; 0]>,
}

#[derive(Serialize)]
struct TextDone<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[u8; 0]>,
}

#[derive(Serialize)]
struct ArgumentsDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    delta: &'a str,
}

#[derive(Serialize)]
struct ArgumentsDone<'a> {
    item_id: &'a str,
    output_index: usize,
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ErrorEvent<'a> {
    code: &'a str,
    message: &'a str,
    param: Option<()>,
}

/// Which text a part holds.
#[derive(Clone, Copy)]
enum TextKind {
    Reasoning,
    Output,
}

/// Writes numbered events.
struct Writer {
    sse: SseBuf,
    sequence: u64,
}

impl Writer {
    fn event<T: Serialize>(&mut self, kind: &str, body: T) {
        let event = Event {
            kind,
            sequence_number: self.sequence,
            body,
        };
        self.sse.json(Some(kind), &event);
        self.sequence += 1;
    }

    /// One output item's events: added, its content's parts (text in `chunks` deltas),
    /// done.
    fn item(&mut self, output_index: usize, item: ItemOut<'_>, chunks: usize) {
        match item {
            ItemOut::Reasoning { id, content, .. } => {
                let added = ItemOut::Reasoning {
                    id,
                    summary: [],
                    content: &[],
                };
                let text = (id, part_text(content), TextKind::Reasoning);
                self.text_item(output_index, added, text, chunks);
            }
            ItemOut::Message { id, content, .. } => {
                let added = ItemOut::Message {
                    id,
                    status: "in_progress",
                    role: "assistant",
                    content: &[],
                };
                let text = (id, part_text(content), TextKind::Output);
                self.text_item(output_index, added, text, chunks);
            }
            ItemOut::FunctionCall {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                let added = ItemOut::FunctionCall {
                    id,
                    status: "in_progress",
                    call_id,
                    name,
                    arguments: "",
                };
                self.event(
                    "response.output_item.added",
                    ItemEvent {
                        output_index,
                        item: added,
                    },
                );
                for piece in pieces(arguments, chunks) {
                    let delta = ArgumentsDelta {
                        item_id: id,
                        output_index,
                        delta: piece,
                    };
                    self.event("response.function_call_arguments.delta", delta);
                }
                let done = ArgumentsDone {
                    item_id: id,
                    output_index,
                    name,
                    arguments,
                };
                self.event("response.function_call_arguments.done", done);
            }
        }
        self.event(
            "response.output_item.done",
            ItemEvent { output_index, item },
        );
    }

    /// A text item's start: `added` (the item, empty), then its one text part
    /// (`(id, text, kind)`).
    fn text_item(
        &mut self,
        output_index: usize,
        added: ItemOut<'_>,
        (id, text, kind): (&str, &str, TextKind),
        chunks: usize,
    ) {
        let event = ItemEvent {
            output_index,
            item: added,
        };
        self.event("response.output_item.added", event);
        self.text_part(id, output_index, text, chunks, kind);
    }

    /// A text part's events: added (empty), `text` in `chunks` deltas, the text done, the
    /// part done.
    fn text_part(
        &mut self,
        id: &str,
        output_index: usize,
        text: &str,
        chunks: usize,
        kind: TextKind,
    ) {
        let (delta_kind, done_kind, logprobs) = match kind {
            TextKind::Reasoning => (
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                None,
            ),
            TextKind::Output => (
                "response.output_text.delta",
                "response.output_text.done",
                Some([]),
            ),
        };
        let part = |text| match kind {
            TextKind::Reasoning => PartOut::ReasoningText { text },
            TextKind::Output => PartOut::output_text(text),
        };
        let content_index = 0;
        let added = PartEvent {
            item_id: id,
            output_index,
            content_index,
            part: part(""),
        };
        self.event("response.content_part.added", added);
        for piece in pieces(text, chunks) {
            let delta = TextDelta {
                item_id: id,
                output_index,
                content_index,
                delta: piece,
                logprobs,
            };
            self.event(delta_kind, delta);
        }
        let done = TextDone {
            item_id: id,
            output_index,
            content_index,
            text,
            logprobs,
        };
        self.event(done_kind, done);
        let done = PartEvent {
            item_id: id,
            output_index,
            content_index,
            part: part(text),
        };
        self.event("response.content_part.done", done);
    }

    /// `response.created` and `response.in_progress` with an empty in-progress response.
    fn open(&mut self, mut base: ResponseOut<'_>) {
        base.status = "in_progress";
        base.error = None;
        base.incomplete_details = None;
        base.output = &[];
        base.usage = None;
        for kind in ["response.created", "response.in_progress"] {
            self.event(kind, ResponseEvent { response: base });
        }
    }
}

/// The answer as `response.*` events, one `Bytes` per event (see the module docs of
/// `upstream` for the sequence). With `error`, the stream ends with an `error` event
/// after the output items instead of the terminal event.
pub(crate) fn render_stream(
    answer: &Answer<'_>,
    meta: Meta<'_>,
    shape: StreamShape,
    error: Option<&StreamError>,
) -> Vec<Bytes> {
    let ids = Ids::new(meta.number, answer.tool_calls.len());
    let parts = Parts::of(answer);
    let (status, incomplete) = status_of(answer.finish_reason);
    let output = items(answer, &ids, &parts, status);
    let response = ResponseOut {
        id: &ids.response,
        object: "response",
        created_at: meta.created,
        status,
        error: None,
        incomplete_details: incomplete,
        instructions: meta.instructions,
        model: answer.model,
        output: &output,
        usage: Some(usage_of(answer)),
    };

    let text_len = answer.content.as_deref().map_or(0, str::len)
        + answer.reasoning.map_or(0, str::len)
        + answer
            .tool_calls
            .iter()
            .map(|call| call.arguments.len())
            .sum::<usize>();
    let events = 4 + output.len() * (6 + shape.chunks.clamp(1, 64));
    let mut writer = Writer {
        sse: SseBuf::new(3 * text_len + events * 200, events, shape.crlf),
        sequence: 0,
    };
    writer.open(response);

    for (output_index, item) in output.iter().enumerate() {
        writer.item(output_index, *item, shape.chunks);
    }

    if let Some(error) = error {
        writer.event(
            "error",
            ErrorEvent {
                code: &error.kind,
                message: &error.message,
                param: None,
            },
        );
        return writer.sse.into_events();
    }
    if shape.done {
        let kind = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        writer.event(kind, ResponseEvent { response });
        if shape.sentinel {
            writer.sse.done();
        }
    }
    writer.sse.into_events()
}

/// A failed response as a stream: `response.created`, `response.in_progress`,
/// `response.failed`.
pub(crate) fn render_failed_stream(
    meta: Meta<'_>,
    code: &str,
    message: &str,
    shape: StreamShape,
) -> Vec<Bytes> {
    let id = format!("resp_mock_{}", meta.number);
    let response = failed(&id, meta, code, message);
    let mut writer = Writer {
        sse: SseBuf::new(1024 + 2 * message.len(), 4, shape.crlf),
        sequence: 0,
    };
    writer.open(response);
    if shape.done {
        writer.event("response.failed", ResponseEvent { response });
        if shape.sentinel {
            writer.sse.done();
        }
    }
    writer.sse.into_events()
}

/// The text of an item's (only) part.
fn part_text<'a>(content: &[PartOut<'a>]) -> &'a str {
    match content.first() {
        Some(PartOut::ReasoningText { text } | PartOut::OutputText { text, .. }) => text,
        None => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_items_and_counts_words() {
        let body = br#"{"model":"m","instructions":"be brief","input":[
            {"role":"user","content":[{"type":"input_text","text":"hello there"}]},
            {"type":"function_call","call_id":"c1","name":"search","arguments":"{\"q\":1}"},
            {"type":"function_call_output","call_id":"c1","output":"found it"}],
            "tools":[{"type":"function","name":"search","parameters":{}}]}"#;
        let request: ResponsesRequest<'_> = serde_json::from_slice(body).expect("valid");
        assert_eq!(request.instructions(), Some("be brief"));
        // 2 + 4, 2 + 4, 2 + 4, 2 + 4.
        assert_eq!(request.prompt_tokens(), 24);
        assert!(matches!(request.last_turn(), LastTurn::ToolResult(text) if text == "found it"));
        assert_eq!(request.first_tool(), Some("search"));

        let body = br#"{"input":"just text"}"#;
        let request: ResponsesRequest<'_> = serde_json::from_slice(body).expect("valid");
        assert_eq!(request.prompt_tokens(), 6);
        assert!(matches!(request.last_turn(), LastTurn::User(text) if text == "just text"));
    }
}
