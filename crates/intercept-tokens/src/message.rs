//! Chat messages and tool specs as a renderer reads them.
//!
//! Two readings of the same Chat Completions JSON exist:
//!
//! - [`ChatMessage::parse_array`] and [`ToolSpec::parse_array`] read a request as
//!   verifiers' train client hands it to its renderer (its Chat dialect's
//!   `parse_message` then `message_to_wire`, and `parse_tools` then `tool_to_wire`):
//!   unknown roles are users, reasoning comes from `reasoning`, `reasoning_content` or
//!   `reasoning_details`, tools are rewritten as `{"type": "function", "function":
//!   {"name", "description", "parameters", "strict"?}}`;
//! - [`ChatMessage::parse_raw_array`] and [`ToolSpec::parse_raw_array`] read renderers'
//!   own message and tool dicts as they are.

use std::borrow::Cow;

use crate::pycompat::json::{self, JsonStr, Value};

/// Why messages or tools could not be read. Each message names the element and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The text is not JSON that Python's `json.loads` reads.
    #[error("the {what} are not valid JSON ({message}); send a JSON array of objects")]
    InvalidJson {
        /// `"messages"` or `"tools"`.
        what: &'static str,
        /// Where and why reading stopped.
        message: String,
    },
    /// The JSON is not an array.
    #[error("the {what} must be a JSON array")]
    NotAnArray {
        /// `"messages"` or `"tools"`.
        what: &'static str,
    },
    /// An element is not a JSON object.
    #[error("{what}[{index}] must be a JSON object")]
    NotAnObject {
        /// `"messages"` or `"tools"`.
        what: &'static str,
        /// The element's index.
        index: usize,
    },
    /// A field that must be there is missing.
    #[error("{what}[{index}] has no `{field}`; add it")]
    MissingField {
        /// `"messages"` or `"tools"`.
        what: &'static str,
        /// The element's index.
        index: usize,
        /// The field's path.
        field: &'static str,
    },
    /// A field has a type the renderer cannot use.
    #[error("{what}[{index}].{field} must be {expected}")]
    WrongType {
        /// `"messages"` or `"tools"`.
        what: &'static str,
        /// The element's index.
        index: usize,
        /// The field's path.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A role the renderer does not render (its own dicts only: the Chat reading makes
    /// every other role a user, as verifiers does).
    #[error("messages[{index}] has role {role:?}; the renderer renders system, user, assistant and tool messages")]
    UnknownRole {
        /// The message's index.
        index: usize,
        /// The role it has.
        role: String,
    },
    /// A string holds a lone UTF-16 surrogate (`"\ud800"`), which no tokenizer can encode.
    #[error("{what}[{index}].{field} holds a lone UTF-16 surrogate escape, which cannot be tokenized; send whole characters")]
    LoneSurrogate {
        /// `"messages"` or `"tools"`.
        what: &'static str,
        /// The element's index.
        index: usize,
        /// The field's path.
        field: &'static str,
    },
    /// A tool of a kind the renderer cannot show the model.
    #[error(
        "tools[{index}] is a {kind:?} tool; the renderer renders unnamespaced function tools only"
    )]
    UnsupportedTool {
        /// The tool's index.
        index: usize,
        /// Its type (or namespace).
        kind: String,
    },
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `system`. (`developer` is read as a user, as verifiers' Chat dialect reads it:
    /// see [`ChatMessage::parse_array`].)
    System,
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
    /// `tool`: a tool's result.
    Tool,
}

impl Role {
    /// The role's wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A message's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// `null`, missing, or a value with no text.
    Null,
    /// A string.
    Text(String),
    /// A list of parts.
    Parts(Vec<ContentPart>),
}

/// One part of a list content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentPart {
    /// Text the renderer shows.
    Text(String),
    /// Any other part (an image, a file): its JSON, which Qwen3 does not render.
    Other(String),
}

impl Content {
    /// The text the renderer shows: a string as it is, the text parts joined with
    /// nothing between them, no text otherwise.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Null => Cow::Borrowed(""),
            Content::Text(s) => Cow::Borrowed(s),
            Content::Parts(parts) => {
                let mut texts = parts.iter().filter_map(|p| match p {
                    ContentPart::Text(t) => Some(t.as_str()),
                    ContentPart::Other(_) => None,
                });
                match (texts.next(), texts.next()) {
                    (None, _) => Cow::Borrowed(""),
                    (Some(one), None) => Cow::Borrowed(one),
                    (Some(a), Some(b)) => {
                        let mut s = String::from(a);
                        s.push_str(b);
                        texts.for_each(|t| s.push_str(t));
                        Cow::Owned(s)
                    }
                }
            }
        }
    }
}

/// A tool call of an assistant message, as the renderer writes it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallIn {
    id: Option<String>,
    name: String,
    arguments: String,
}

impl ToolCallIn {
    /// A call whose arguments are a string (the Chat wire's form), written verbatim.
    pub fn new(id: Option<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        ToolCallIn {
            id,
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// A call whose arguments are a JSON value (an object, usually): written as Python's
    /// `json.dumps(arguments, ensure_ascii=False)`, key order kept.
    pub fn with_json_arguments(
        id: Option<String>,
        name: impl Into<String>,
        arguments_json: &str,
    ) -> Result<Self, MessageError> {
        Ok(ToolCallIn {
            id,
            name: name.into(),
            arguments: json_dumps(arguments_json, false)?,
        })
    }

    /// The call's id, if it has one.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The function's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments as the renderer writes them.
    pub fn arguments(&self) -> &str {
        &self.arguments
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    role: Role,
    content: Content,
    reasoning_content: Option<String>,
    tool_calls: Vec<ToolCallIn>,
    tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message of any role with a content, nothing else.
    pub fn new(role: Role, content: Content) -> Self {
        ChatMessage {
            role,
            content,
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        ChatMessage::new(Role::System, Content::Text(text.into()))
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        ChatMessage::new(Role::User, Content::Text(text.into()))
    }

    /// An assistant message: its text (`None` for no content), its reasoning, its calls.
    pub fn assistant(
        content: Option<String>,
        reasoning: Option<String>,
        tool_calls: Vec<ToolCallIn>,
    ) -> Self {
        ChatMessage {
            role: Role::Assistant,
            content: content.map_or(Content::Null, Content::Text),
            reasoning_content: reasoning,
            tool_calls,
            tool_call_id: None,
        }
    }

    /// A tool's result for the call `call_id`.
    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(call_id.into()),
            ..ChatMessage::new(Role::Tool, Content::Text(text.into()))
        }
    }

    /// Who wrote it.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Its content.
    pub fn content(&self) -> &Content {
        &self.content
    }

    /// The text the renderer shows ([`Content::text`]).
    pub fn text(&self) -> Cow<'_, str> {
        self.content.text()
    }

    /// The assistant's reasoning, if the message carries it apart from the content.
    pub fn reasoning_content(&self) -> Option<&str> {
        self.reasoning_content.as_deref()
    }

    /// The assistant's tool calls.
    pub fn tool_calls(&self) -> &[ToolCallIn] {
        &self.tool_calls
    }

    /// The call a tool message answers.
    pub fn tool_call_id(&self) -> Option<&str> {
        self.tool_call_id.as_deref()
    }

    /// Reads a Chat Completions `messages` array as verifiers' train client hands it to
    /// the renderer (verifiers' Chat dialect, `parse_message` then `message_to_wire`):
    ///
    /// - `system`, `assistant` and `tool` keep their role; any other role (`user`,
    ///   `developer`, none) is a user;
    /// - a content list keeps its `text` parts (an assistant's, the `text` of every part);
    /// - an assistant's reasoning is the first non-empty string of `reasoning`,
    ///   `reasoning_content` and `reasoning_details`, else the `text` or `summary` of the
    ///   `reasoning_details` entries joined by newlines; a non-empty `reasoning_details`
    ///   list drops it (verifiers replays those details instead, which Qwen3 does not
    ///   render);
    /// - a tool call is `{"id", "type", "function": {"name", "arguments"}}`; arguments
    ///   that are a JSON value rather than a string are written as Python's `json.dumps`
    ///   (verifiers itself refuses them); a `custom` call renders as renderers render it,
    ///   with no name and `{}`.
    pub fn parse_array(json: &str) -> Result<Vec<ChatMessage>, MessageError> {
        let value = load(json, "messages")?;
        elements(&value, "messages")?
            .iter()
            .enumerate()
            .map(|(index, m)| chat_message(m, index))
            .collect()
    }

    /// Reads renderers' own message dicts as they are (their `role`, `content`,
    /// `reasoning_content`, `tool_calls` with `function` or flat `name`/`arguments`, and
    /// `tool_call_id`). A role other than the four is an error (renderers would drop
    /// the message without a word).
    pub fn parse_raw_array(json: &str) -> Result<Vec<ChatMessage>, MessageError> {
        let value = load(json, "messages")?;
        elements(&value, "messages")?
            .iter()
            .enumerate()
            .map(|(index, m)| raw_message(m, index))
            .collect()
    }
}

/// One tool as the renderer shows it to the model: its JSON, written once as Python's
/// `json.dumps(tool, ensure_ascii=False)`, key order kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    dumped: String,
}

impl ToolSpec {
    /// Reads one tool as it is (any JSON value; renderers dump it whole).
    pub fn from_json(json: &str) -> Result<ToolSpec, MessageError> {
        let value = load(json, "tools")?;
        raw_tool(&value, 0)
    }

    /// Reads renderers' own tool dicts as they are.
    pub fn parse_raw_array(json: &str) -> Result<Vec<ToolSpec>, MessageError> {
        let value = load(json, "tools")?;
        elements(&value, "tools")?
            .iter()
            .enumerate()
            .map(|(index, t)| raw_tool(t, index))
            .collect()
    }

    /// Reads a Chat Completions `tools` array as verifiers' train client hands it to the
    /// renderer (`parse_tools` then `tool_to_wire`): each becomes `{"type": "function",
    /// "function": {"name", "description", "parameters", "strict"?}}` with a missing
    /// description `""` and missing parameters `{}`. Other tool types are refused, as
    /// verifiers refuses them.
    pub fn parse_array(json: &str) -> Result<Vec<ToolSpec>, MessageError> {
        let value = load(json, "tools")?;
        elements(&value, "tools")?
            .iter()
            .enumerate()
            .map(|(index, t)| chat_tool(t, index))
            .collect()
    }

    /// The tool verifiers' `tool_to_wire` writes for a function: `{"type": "function",
    /// "function": {"name", "description", "parameters", "strict"?}}`, with
    /// `parameters_json` (an object's JSON) kept in its key order.
    pub fn function(
        name: &str,
        description: &str,
        parameters_json: &str,
        strict: Option<bool>,
    ) -> Result<ToolSpec, MessageError> {
        let params = load(parameters_json, "tools")?;
        if !matches!(params, Value::Object(_)) {
            return Err(MessageError::WrongType {
                what: "tools",
                index: 0,
                field: "function.parameters",
                expected: "a JSON object",
            });
        }
        let mut dumped = String::from("{\"type\": \"function\", \"function\": {\"name\": ");
        json::dump_text(name, false, &mut dumped);
        dumped.push_str(", \"description\": ");
        json::dump_text(description, false, &mut dumped);
        dumped.push_str(", \"parameters\": ");
        json::dump(&params, false, &mut dumped).map_err(|_| MessageError::LoneSurrogate {
            what: "tools",
            index: 0,
            field: "function.parameters",
        })?;
        if let Some(strict) = strict {
            dumped.push_str(if strict {
                ", \"strict\": true"
            } else {
                ", \"strict\": false"
            });
        }
        dumped.push_str("}}");
        Ok(ToolSpec { dumped })
    }

    /// The tool as the renderer writes it: `json.dumps(tool, ensure_ascii=False)`.
    pub fn dumped(&self) -> &str {
        &self.dumped
    }
}

/// Python's `json.dumps(json.loads(json), ensure_ascii=...)`: the JSON rewritten with
/// Python's separators, escapes and float repr, key order kept (what renderers write for
/// tools and tool-call arguments with `ensure_ascii=False`, and verifiers for parsed
/// arguments with the default `ensure_ascii=True`).
pub fn json_dumps(json: &str, ensure_ascii: bool) -> Result<String, MessageError> {
    let value = json::loads(json).map_err(|e| MessageError::InvalidJson {
        what: "arguments",
        message: e.to_string(),
    })?;
    json::dumps(&value, ensure_ascii).map_err(|_| MessageError::LoneSurrogate {
        what: "arguments",
        index: 0,
        field: "value",
    })
}

fn load<'a>(json: &'a str, what: &'static str) -> Result<Value<'a>, MessageError> {
    json::loads(json).map_err(|e| MessageError::InvalidJson {
        what,
        message: e.to_string(),
    })
}

fn elements<'v, 'a>(
    value: &'v Value<'a>,
    what: &'static str,
) -> Result<&'v [Value<'a>], MessageError> {
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(MessageError::NotAnArray { what }),
    }
}

/// Reads the strings of one element, naming it in errors.
struct Reader<'v, 'a> {
    value: &'v Value<'a>,
    what: &'static str,
    index: usize,
}

impl<'v, 'a> Reader<'v, 'a> {
    fn new(value: &'v Value<'a>, what: &'static str, index: usize) -> Result<Self, MessageError> {
        match value {
            Value::Object(_) => Ok(Reader { value, what, index }),
            _ => Err(MessageError::NotAnObject { what, index }),
        }
    }

    fn get(&self, key: &str) -> Option<&'v Value<'a>> {
        self.value.get(key)
    }

    fn wrong(&self, field: &'static str, expected: &'static str) -> MessageError {
        MessageError::WrongType {
            what: self.what,
            index: self.index,
            field,
            expected,
        }
    }

    fn text(&self, s: JsonStr<'_>, field: &'static str) -> Result<String, MessageError> {
        s.to_str()
            .map(Cow::into_owned)
            .map_err(|_| MessageError::LoneSurrogate {
                what: self.what,
                index: self.index,
                field,
            })
    }

    /// A field that is a string when present (`None` when missing or of another type).
    fn opt_string(&self, key: &str, field: &'static str) -> Result<Option<String>, MessageError> {
        match self.get(key) {
            Some(Value::Str(s)) => self.text(*s, field).map(Some),
            _ => Ok(None),
        }
    }

    fn dumped(&self, value: &Value<'_>, field: &'static str) -> Result<String, MessageError> {
        json::dumps(value, false).map_err(|_| MessageError::LoneSurrogate {
            what: self.what,
            index: self.index,
            field,
        })
    }
}

fn role_of(r: &Reader<'_, '_>) -> Result<Role, MessageError> {
    match r.get("role") {
        Some(Value::Str(s)) => {
            let role = s.to_str_lossy();
            match role.as_ref() {
                "system" => Ok(Role::System),
                "user" => Ok(Role::User),
                "assistant" => Ok(Role::Assistant),
                "tool" => Ok(Role::Tool),
                _ => Err(MessageError::UnknownRole {
                    index: r.index,
                    role: role.into_owned(),
                }),
            }
        }
        Some(_) => Err(r.wrong("role", "a string")),
        None => Err(MessageError::MissingField {
            what: "messages",
            index: r.index,
            field: "role",
        }),
    }
}

/// renderers' `Message` dict, as `Qwen3Renderer` reads it.
fn raw_message(value: &Value<'_>, index: usize) -> Result<ChatMessage, MessageError> {
    let r = Reader::new(value, "messages", index)?;
    let role = role_of(&r)?;
    // `_content_text`: a string; a list's strings and the string `text` of its dicts.
    let content = match r.get("content") {
        Some(Value::Str(s)) => Content::Text(r.text(*s, "content")?),
        Some(Value::Array(items)) => {
            let mut parts = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::Str(s) => parts.push(ContentPart::Text(r.text(*s, "content")?)),
                    Value::Object(_) => match item.get("text") {
                        Some(Value::Str(s)) => {
                            parts.push(ContentPart::Text(r.text(*s, "content.text")?))
                        }
                        _ => parts.push(ContentPart::Other(
                            json::dumps(item, true).unwrap_or_default(),
                        )),
                    },
                    other => parts.push(ContentPart::Other(
                        json::dumps(other, true).unwrap_or_default(),
                    )),
                }
            }
            Content::Parts(parts)
        }
        _ => Content::Null,
    };
    let reasoning_content = r.opt_string("reasoning_content", "reasoning_content")?;
    // `msg.get("tool_calls") or []`
    let mut tool_calls = Vec::new();
    match r.get("tool_calls") {
        Some(Value::Array(calls)) => {
            for call in calls {
                if !matches!(call, Value::Object(_)) {
                    return Err(r.wrong("tool_calls[]", "a JSON object"));
                }
                // `tc.get("function") or tc`
                let func = match call.get("function") {
                    Some(f) if f.truthy() => {
                        if !matches!(f, Value::Object(_)) {
                            return Err(r.wrong("tool_calls[].function", "a JSON object"));
                        }
                        f
                    }
                    _ => call,
                };
                let name = match func.get("name") {
                    None => String::new(),
                    Some(Value::Str(s)) => r.text(*s, "tool_calls[].name")?,
                    Some(_) => return Err(r.wrong("tool_calls[].function.name", "a string")),
                };
                let arguments = match func.get("arguments") {
                    None => String::from("{}"),
                    Some(Value::Str(s)) => r.text(*s, "tool_calls[].arguments")?,
                    Some(v) => r.dumped(v, "tool_calls[].arguments")?,
                };
                let id = match call.get("id") {
                    Some(Value::Str(s)) => Some(s.to_str_lossy().into_owned()),
                    _ => None,
                };
                tool_calls.push(ToolCallIn {
                    id,
                    name,
                    arguments,
                });
            }
        }
        Some(v) if v.truthy() => return Err(r.wrong("tool_calls", "a JSON array")),
        _ => {}
    }
    let tool_call_id = match r.get("tool_call_id") {
        Some(Value::Str(s)) => Some(s.to_str_lossy().into_owned()),
        _ => None,
    };
    Ok(ChatMessage {
        role,
        content,
        reasoning_content,
        tool_calls,
        tool_call_id,
    })
}

/// verifiers' `content_to_parts` then `_content_to_wire`, for a non-assistant message.
fn chat_content(r: &Reader<'_, '_>) -> Result<Content, MessageError> {
    match r.get("content") {
        Some(Value::Array(items)) => {
            let mut parts = Vec::new();
            for item in items {
                if !matches!(item, Value::Object(_)) {
                    continue;
                }
                let kind = item.get("type").and_then(Value::as_str);
                if kind.is_some_and(|k| k.eq_str("text")) {
                    let text = match item.get("text") {
                        None => String::new(),
                        Some(Value::Str(s)) => r.text(*s, "content[].text")?,
                        Some(_) => return Err(r.wrong("content[].text", "a string")),
                    };
                    parts.push(ContentPart::Text(text));
                } else if kind.is_some_and(|k| k.eq_str("image_url")) {
                    parts.push(ContentPart::Other(
                        json::dumps(item, true).unwrap_or_default(),
                    ));
                }
            }
            Ok(Content::Parts(parts))
        }
        Some(Value::Str(s)) => Ok(Content::Text(r.text(*s, "content")?)),
        Some(v) if v.truthy() => Err(r.wrong("content", "a string, a list of parts or null")),
        _ => Ok(Content::Text(String::new())),
    }
}

/// verifiers' `reasoning_text`, and whether `reasoning_details` replaces it on the wire.
fn chat_reasoning(r: &Reader<'_, '_>) -> Result<Option<String>, MessageError> {
    let details = r.get("reasoning_details");
    if let Some(Value::Array(items)) = details {
        if !items.is_empty() {
            return Ok(None);
        }
    }
    for (key, field) in [
        ("reasoning", "reasoning"),
        ("reasoning_content", "reasoning_content"),
        ("reasoning_details", "reasoning_details"),
    ] {
        if let Some(Value::Str(s)) = r.get(key) {
            if !s.is_empty() {
                return r.text(*s, field).map(Some);
            }
        }
    }
    Ok(None)
}

/// verifiers' `parse_message` then `message_to_wire`.
fn chat_message(value: &Value<'_>, index: usize) -> Result<ChatMessage, MessageError> {
    let r = Reader::new(value, "messages", index)?;
    let role = match r.get("role").and_then(Value::as_str) {
        Some(s) if s.eq_str("system") => Role::System,
        Some(s) if s.eq_str("assistant") => Role::Assistant,
        Some(s) if s.eq_str("tool") => Role::Tool,
        _ => Role::User,
    };
    if role != Role::Assistant {
        let content = chat_content(&r)?;
        let tool_call_id = if role == Role::Tool {
            Some(
                r.opt_string("tool_call_id", "tool_call_id")?
                    .unwrap_or_default(),
            )
        } else {
            None
        };
        return Ok(ChatMessage {
            tool_call_id,
            ..ChatMessage::new(role, content)
        });
    }
    let text = match r.get("content") {
        Some(Value::Array(items)) => {
            let mut s = String::new();
            for item in items {
                if matches!(item, Value::Object(_)) {
                    match item.get("text") {
                        None => {}
                        Some(Value::Str(t)) => s.push_str(&r.text(*t, "content[].text")?),
                        Some(_) => return Err(r.wrong("content[].text", "a string")),
                    }
                }
            }
            s
        }
        Some(Value::Str(s)) => r.text(*s, "content")?,
        Some(v) if v.truthy() => {
            return Err(r.wrong("content", "a string, a list of parts or null"))
        }
        _ => String::new(),
    };
    let reasoning_content = chat_reasoning(&r)?;
    let mut tool_calls = Vec::new();
    match r.get("tool_calls") {
        Some(Value::Array(calls)) => {
            for call in calls {
                if !matches!(call, Value::Object(_)) {
                    return Err(r.wrong("tool_calls[]", "a JSON object"));
                }
                let kind = match call.get("type") {
                    Some(v) if v.truthy() => match v.as_str() {
                        Some(k) if k.eq_str("function") => "function",
                        Some(k) if k.eq_str("custom") => "custom",
                        _ => return Err(r.wrong("tool_calls[].type", "\"function\" or \"custom\"")),
                    },
                    _ => match call.get("custom") {
                        Some(v) if *v != Value::Null => "custom",
                        _ => "function",
                    },
                };
                let id = match call.get("id") {
                    Some(Value::Str(s)) => r.text(*s, "tool_calls[].id")?,
                    Some(_) => return Err(r.wrong("tool_calls[].id", "a string")),
                    None => {
                        return Err(MessageError::MissingField {
                            what: "messages",
                            index,
                            field: "tool_calls[].id",
                        })
                    }
                };
                let native = match call.get(kind) {
                    Some(v @ Value::Object(_)) => v,
                    Some(_) => return Err(r.wrong("tool_calls[].function", "a JSON object")),
                    None => {
                        return Err(MessageError::MissingField {
                            what: "messages",
                            index,
                            field: "tool_calls[].function",
                        })
                    }
                };
                let name = match native.get("name") {
                    Some(Value::Str(s)) => r.text(*s, "tool_calls[].function.name")?,
                    Some(_) => return Err(r.wrong("tool_calls[].function.name", "a string")),
                    None => {
                        return Err(MessageError::MissingField {
                            what: "messages",
                            index,
                            field: "tool_calls[].function.name",
                        })
                    }
                };
                let arg_key = if kind == "custom" {
                    "input"
                } else {
                    "arguments"
                };
                let arguments = match native.get(arg_key) {
                    Some(Value::Str(s)) => r.text(*s, "tool_calls[].function.arguments")?,
                    Some(v) => r.dumped(v, "tool_calls[].function.arguments")?,
                    None => {
                        return Err(MessageError::MissingField {
                            what: "messages",
                            index,
                            field: "tool_calls[].function.arguments",
                        })
                    }
                };
                if kind == "custom" {
                    // The wire call has no `function`, so renderers read the call itself:
                    // no `name`, no `arguments`.
                    tool_calls.push(ToolCallIn {
                        id: Some(id),
                        name: String::new(),
                        arguments: String::from("{}"),
                    });
                } else {
                    tool_calls.push(ToolCallIn {
                        id: Some(id),
                        name,
                        arguments,
                    });
                }
            }
        }
        Some(v) if v.truthy() => return Err(r.wrong("tool_calls", "a JSON array")),
        _ => {}
    }
    Ok(ChatMessage {
        role,
        content: if text.is_empty() {
            Content::Null
        } else {
            Content::Text(text)
        },
        reasoning_content,
        tool_calls,
        tool_call_id: None,
    })
}

fn raw_tool(value: &Value<'_>, index: usize) -> Result<ToolSpec, MessageError> {
    let dumped = json::dumps(value, false).map_err(|_| MessageError::LoneSurrogate {
        what: "tools",
        index,
        field: "(tool)",
    })?;
    Ok(ToolSpec { dumped })
}

/// verifiers' `parse_tools` then `tool_to_wire`.
fn chat_tool(value: &Value<'_>, index: usize) -> Result<ToolSpec, MessageError> {
    let r = Reader::new(value, "tools", index)?;
    let kind: Cow<'_, str> = match r.get("type") {
        None => Cow::Borrowed("function"),
        Some(Value::Str(s)) => s.to_str_lossy(),
        Some(_) => return Err(r.wrong("type", "a string")),
    };
    if kind != "function" {
        return Err(MessageError::UnsupportedTool {
            index,
            kind: kind.into_owned(),
        });
    }
    let tool = match r.get("function") {
        None => value,
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err(r.wrong("function", "a JSON object")),
    };
    let name = match tool.get("name") {
        Some(v) if v.truthy() => match v {
            Value::Str(s) => r.text(*s, "function.name")?,
            _ => return Err(r.wrong("function.name", "a string")),
        },
        _ => match tool.get("server_label") {
            Some(Value::Str(s)) if !s.is_empty() => r.text(*s, "function.server_label")?,
            Some(v) if v.truthy() => return Err(r.wrong("function.server_label", "a string")),
            _ => String::from("function"),
        },
    };
    if let Some(ns) = tool.get("namespace") {
        if ns.truthy() {
            return Err(MessageError::UnsupportedTool {
                index,
                kind: format!("namespaced {}", json::dumps(ns, true).unwrap_or_default()),
            });
        }
    }
    let description = match tool.get("description") {
        None => String::new(),
        Some(Value::Str(s)) => r.text(*s, "function.description")?,
        Some(_) => return Err(r.wrong("function.description", "a string")),
    };
    let strict = match tool.get("strict") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(r.wrong("function.strict", "a boolean or null")),
    };
    let mut dumped = String::from("{\"type\": \"function\", \"function\": {\"name\": ");
    json::dump_text(&name, false, &mut dumped);
    dumped.push_str(", \"description\": ");
    json::dump_text(&description, false, &mut dumped);
    dumped.push_str(", \"parameters\": ");
    match tool.get("parameters") {
        None => dumped.push_str("{}"),
        Some(p @ Value::Object(_)) => {
            json::dump(p, false, &mut dumped).map_err(|_| MessageError::LoneSurrogate {
                what: "tools",
                index,
                field: "function.parameters",
            })?
        }
        Some(_) => return Err(r.wrong("function.parameters", "a JSON object")),
    }
    if let Some(strict) = strict {
        dumped.push_str(if strict {
            ", \"strict\": true"
        } else {
            ", \"strict\": false"
        });
    }
    dumped.push_str("}}");
    Ok(ToolSpec { dumped })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_messages_read_as_renderers_reads_them() {
        let msgs = ChatMessage::parse_raw_array(
            r#"[{"role":"system","content":[{"type":"text","text":"a"},"b",{"type":"image_url","image_url":{"url":"x"}}]},
                {"role":"assistant","content":null,"reasoning_content":"","tool_calls":[
                    {"id":"c1","function":{"name":"f","arguments":{"z":1,"a":[1.5,"é"]}}},
                    {"name":"g","arguments":"{\"x\": 1}","function":{}},
                    {"function":{"name":"h"}}]},
                {"role":"tool","tool_call_id":"c1","content":"r"}]"#,
        )
        .expect("valid");
        assert_eq!(msgs[0].text(), "ab");
        assert_eq!(msgs[1].reasoning_content(), Some(""));
        let calls = msgs[1].tool_calls();
        assert_eq!(calls[0].arguments(), r#"{"z": 1, "a": [1.5, "é"]}"#);
        assert_eq!(
            (calls[1].name(), calls[1].arguments()),
            ("g", r#"{"x": 1}"#)
        );
        assert_eq!((calls[2].name(), calls[2].arguments()), ("h", "{}"));
        assert_eq!(msgs[2].tool_call_id(), Some("c1"));
        assert!(matches!(
            ChatMessage::parse_raw_array(r#"[{"role":"developer","content":"x"}]"#),
            Err(MessageError::UnknownRole { index: 0, .. })
        ));
        assert!(matches!(
            ChatMessage::parse_raw_array(r#"[{"content":"x"}]"#),
            Err(MessageError::MissingField { field: "role", .. })
        ));
        assert!(matches!(
            ChatMessage::parse_raw_array(r#"[{"role":"user","content":"\ud800"}]"#),
            Err(MessageError::LoneSurrogate { .. })
        ));
    }

    #[test]
    fn chat_messages_read_as_verifiers_reads_them() {
        let msgs = ChatMessage::parse_array(
            r#"[{"role":"developer","content":"d"},
                {"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"input_text","text":"c"},{"type":"text"}]},
                {"role":"assistant","content":[{"type":"x","text":"p"},{"text":"q"}],"reasoning":"","reasoning_content":"r"},
                {"role":"assistant","content":"","reasoning_details":[{"text":"t"}],"reasoning_content":"r",
                 "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},
                               {"id":"c2","custom":{"name":"g","input":"raw"}}]},
                {"role":"tool","content":null}]"#,
        )
        .expect("valid");
        assert_eq!(msgs[0].role(), Role::User);
        assert_eq!(msgs[1].text(), "a");
        assert_eq!(msgs[2].text(), "pq");
        assert_eq!(msgs[2].reasoning_content(), Some("r"));
        assert_eq!(msgs[3].reasoning_content(), None);
        let calls = msgs[3].tool_calls();
        assert_eq!((calls[0].name(), calls[0].arguments()), ("f", "{}"));
        assert_eq!((calls[1].name(), calls[1].arguments()), ("", "{}"));
        assert_eq!(msgs[4].tool_call_id(), Some(""));
        assert_eq!(msgs[4].text(), "");
    }

    #[test]
    fn tools_are_dumped_once_in_their_order() {
        let raw = ToolSpec::parse_raw_array(
            r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"b":{"type":"integer"},"a":{"enum":[1.0,"ü"]}}}}}]"#,
        )
        .expect("valid");
        assert_eq!(
            raw[0].dumped(),
            r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"enum": [1.0, "ü"]}}}}}"#
        );
        let chat = ToolSpec::parse_array(
            r#"[{"function":{"parameters":{"b":1,"a":2},"name":"f","strict":true},"type":"function"},
                {"type":"function","function":{"name":"g","description":"d\n"}}]"#,
        )
        .expect("valid");
        assert_eq!(
            chat[0].dumped(),
            r#"{"type": "function", "function": {"name": "f", "description": "", "parameters": {"b": 1, "a": 2}, "strict": true}}"#
        );
        assert_eq!(
            chat[1].dumped(),
            r#"{"type": "function", "function": {"name": "g", "description": "d\n", "parameters": {}}}"#
        );
        assert_eq!(
            ToolSpec::function("g", "d\n", "{}", None).expect("valid"),
            chat[1]
        );
        assert!(matches!(
            ToolSpec::parse_array(r#"[{"type":"web_search"}]"#),
            Err(MessageError::UnsupportedTool { .. })
        ));
    }
}
