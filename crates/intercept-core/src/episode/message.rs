//! One message type for every dialect, and its stable content hash.
//!
//! Chat Completions messages, Responses input/output items and Anthropic Messages blocks
//! all map to [`Message`], so the same conversation spoken in any dialect gives the same
//! messages and the same hashes:
//!
//! - roles are `system` (Chat `developer`, Responses `instructions`, Anthropic `system`),
//!   `user`, `assistant` and `tool` (a Chat `tool` message, a Responses
//!   `function_call_output`, each Anthropic `tool_result` block);
//! - an assistant turn is one message: its text, its reasoning (Chat `reasoning_content` /
//!   `reasoning`, Responses `reasoning` items, Anthropic `thinking`), its tool calls (with
//!   canonical JSON arguments) and its opaque provider state (Anthropic thinking
//!   signatures and `redacted_thinking`, Responses `encrypted_content`);
//! - images are references: a URL as it is, inline data as
//!   `data:<media type>;blake2b128=<hex digest>` (the bytes are never kept).

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest as _};
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use xxhash_rust::xxh3::xxh3_128;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions (Chat `system` / `developer`, Responses `instructions`, Anthropic
    /// `system`).
    System,
    /// The user (or the harness speaking for it).
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    fn tag(self) -> u8 {
        match self {
            Role::System => 0,
            Role::User => 1,
            Role::Assistant => 2,
            Role::Tool => 3,
        }
    }
}

/// A piece of a message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by reference: its URL, or for inline data
    /// `data:<media type>;blake2b128=<hex digest of the base64 payload>`.
    Image {
        /// The reference.
        url: String,
    },
    /// Content of another kind (a document, an audio clip, an unknown item), as canonical
    /// JSON.
    Data {
        /// The value, keys sorted.
        value: Value,
    },
}

/// A tool call made by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id the tool's result answers.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments: the JSON value with sorted keys (a string when the model wrote
    /// arguments that are not JSON).
    pub arguments: Value,
}

/// One message of a conversation, in any dialect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Text and image parts, in order (empty text dropped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub content: Vec<Part>,
    /// The model's reasoning text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Tool calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Opaque provider state (reasoning signatures, encrypted reasoning), joined by
    /// newlines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// A 128-bit content hash (XXH3-128 of the canonical encoding, little-endian). It picks
/// the candidate node; a match is confirmed by comparing the messages themselves, so two
/// contents that share a hash are still two nodes.
pub type Hash = [u8; 16];

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The bytes of 32 lowercase or uppercase hex digits.
pub(crate) fn unhex(text: &str) -> Option<Hash> {
    let b = text.as_bytes();
    if b.len() != 32 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 16];
    for (i, pair) in b.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// One field of a message's hashed encoding: its tag, its length (8 bytes, little
/// endian) and its bytes.
fn put(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Message {
    /// An empty message of a role.
    pub fn new(role: Role) -> Self {
        Message {
            role,
            content: Vec::new(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            state: None,
        }
    }

    /// A message with one text part.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        let mut m = Message::new(role);
        m.push_text(text.into());
        m
    }

    pub(crate) fn push_text(&mut self, text: String) {
        if !text.is_empty() {
            self.content.push(Part::Text { text });
        }
    }

    fn push_state(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        match &mut self.state {
            Some(have) => {
                have.push('\n');
                have.push_str(s);
            }
            None => self.state = Some(s.to_owned()),
        }
    }

    pub(crate) fn push_reasoning(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        match &mut self.reasoning {
            Some(have) => {
                have.push('\n');
                have.push_str(s);
            }
            None => self.reasoning = Some(s.to_owned()),
        }
    }

    fn is_empty(&self) -> bool {
        self.content.is_empty()
            && self.reasoning.is_none()
            && self.tool_calls.is_empty()
            && self.state.is_none()
    }

    /// The stable content hash: role, content, reasoning, tool calls (canonical JSON
    /// arguments), tool-call id and provider state. Equal messages from any dialect
    /// hash equal, in every process.
    pub fn hash(&self) -> Hash {
        self.hashes().0
    }

    /// The hash of the message without its reasoning and provider state: a harness that
    /// sends a sampled turn back without its reasoning still continues that turn.
    pub fn visible_hash(&self) -> Hash {
        self.hashes().1
    }

    /// Both hashes in one pass over the message: the visible hash covers role, content,
    /// tool calls and tool-call id; the content hash is the visible hash when there is
    /// no reasoning or provider state, else the hash of the visible hash followed by
    /// them.
    pub fn hashes(&self) -> (Hash, Hash) {
        // The fields are encoded into one buffer and hashed at once: XXH3 of the
        // concatenation, the same value as feeding them one by one, in fewer steps.
        let text: usize = self
            .content
            .iter()
            .map(|p| match p {
                Part::Text { text } => text.len(),
                Part::Image { url } => url.len(),
                Part::Data { .. } => 64,
            })
            .sum();
        let mut buf = Vec::with_capacity(32 + text + 9 * self.content.len());
        put(&mut buf, b'r', &[self.role.tag()]);
        for part in &self.content {
            match part {
                Part::Text { text } => put(&mut buf, b't', text.as_bytes()),
                Part::Image { url } => put(&mut buf, b'i', url.as_bytes()),
                Part::Data { value } => put(&mut buf, b'd', canonical(value).as_bytes()),
            }
        }
        for call in &self.tool_calls {
            put(&mut buf, b'c', call.id.as_bytes());
            put(&mut buf, b'n', call.name.as_bytes());
            put(&mut buf, b'a', canonical(&call.arguments).as_bytes());
        }
        if let Some(id) = &self.tool_call_id {
            put(&mut buf, b'T', id.as_bytes());
        }
        let visible = xxh3_128(&buf).to_le_bytes();
        if self.reasoning.is_none() && self.state.is_none() {
            return (visible, visible);
        }
        buf.clear();
        put(&mut buf, b'v', &visible);
        if let Some(r) = &self.reasoning {
            put(&mut buf, b'R', r.as_bytes());
        }
        if let Some(s) = &self.state {
            put(&mut buf, b'S', s.as_bytes());
        }
        (xxh3_128(&buf).to_le_bytes(), visible)
    }

    /// Whether `other` has the same visible content (what [`Message::visible_hash`]
    /// covers: everything but the reasoning and the provider state).
    pub fn same_visible(&self, other: &Message) -> bool {
        self.role == other.role
            && self.content == other.content
            && self.tool_calls == other.tool_calls
            && self.tool_call_id == other.tool_call_id
    }
}

/// Canonical JSON text: keys sorted at every level, no whitespace.
pub(crate) fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `v` with the keys of every object sorted.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), sorted(&map[k.as_str()]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Tool-call arguments: a JSON string is parsed (and its keys sorted); one that is not
/// JSON stays a string; an object (Anthropic `input`) is sorted.
fn arguments(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(parsed) => sorted(&parsed),
            Err(_) => Value::String(s.clone()),
        },
        Some(Value::Null) | None => Value::Object(Map::new()),
        Some(other) => sorted(other),
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn string_of(v: &Value, key: &str) -> String {
    str_of(v, key).unwrap_or_default().to_owned()
}

/// An image reference: URLs as they are, inline data by digest.
fn image_ref(url: &str) -> String {
    match url.strip_prefix("data:") {
        Some(rest) => {
            let (media, payload) = match rest.split_once(',') {
                Some((head, data)) => (head.split(';').next().unwrap_or_default(), data),
                None => ("", rest),
            };
            inline_image(media, payload)
        }
        None => url.to_owned(),
    }
}

fn inline_image(media: &str, payload: &str) -> String {
    let digest: Hash = Blake2b::<U16>::digest(payload.as_bytes()).into();
    format!("data:{media};blake2b128={}", hex(&digest))
}

fn role_of(name: &str) -> Role {
    match name {
        "system" | "developer" => Role::System,
        "assistant" | "model" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        _ => Role::User,
    }
}

// ---------------------------------------------------------------------------------------
// Chat Completions

/// One Chat Completions message (request `messages[]` or response `choices[].message`).
pub(crate) fn from_chat(m: &Value) -> Message {
    let role = role_of(str_of(m, "role").unwrap_or("user"));
    let mut msg = Message::new(role);
    chat_content(m.get("content"), &mut msg);
    if let Some(r) = str_of(m, "reasoning_content").or_else(|| str_of(m, "reasoning")) {
        msg.push_reasoning(r);
    }
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            let f = c.get("function").unwrap_or(&Value::Null);
            msg.tool_calls.push(ToolCall {
                id: string_of(c, "id"),
                name: string_of(f, "name"),
                arguments: arguments(f.get("arguments")),
            });
        }
    }
    if role == Role::Tool {
        msg.tool_call_id = str_of(m, "tool_call_id").map(str::to_owned);
    }
    msg
}

/// A Chat response's message read in the same pass as the rest of the response, without
/// building a [`Value`]: `Plain` for the usual sampled turn (text or null content,
/// optional reasoning, no tool calls), read exactly as `from_chat` reads it (with the
/// role taken as `assistant`); `Other` for any other shape (tool calls, content parts, a
/// member of an unexpected type), which the caller reads with `from_chat` instead.
#[derive(Debug, Clone, PartialEq)]
pub enum SampledChat {
    /// The message.
    Plain(Message),
    /// A shape this reader leaves to `from_chat`.
    Other,
}

impl SampledChat {
    /// The message, when it was read.
    pub fn into_plain(self) -> Option<Message> {
        match self {
            SampledChat::Plain(m) => Some(m),
            SampledChat::Other => None,
        }
    }
}

/// A string member, `null` (or absent), or something else.
enum TextOrOther<'a> {
    Text(Cow<'a, str>),
    Null,
    Other,
}

/// Reads `T::OTHER` from any value but the ones a visitor reads itself: the shapes both
/// readers below skip.
trait Skipped: Sized {
    const OTHER: Self;
}

impl Skipped for TextOrOther<'_> {
    const OTHER: Self = TextOrOther::Other;
}

impl Skipped for SampledChat {
    const OTHER: Self = SampledChat::Other;
}

fn skip_seq<'de, T: Skipped, A: SeqAccess<'de>>(mut seq: A) -> Result<T, A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(T::OTHER)
}

fn skip_map<'de, T: Skipped, A: MapAccess<'de>>(mut map: A) -> Result<T, A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(T::OTHER)
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = TextOrOther<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(TextOrOther::Text(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(TextOrOther::Text(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(TextOrOther::Text(Cow::Owned(s)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(TextOrOther::Null)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)
    }
}

impl<'de> Deserialize<'de> for TextOrOther<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

/// A member name, borrowed from the input unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }

            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

struct SampledVisitor;

impl<'de> Visitor<'de> for SampledVisitor {
    type Value = SampledChat;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a chat message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SampledChat, A::Error> {
        let mut plain = true;
        let (mut content, mut reasoning_content, mut reasoning) = (None, None, None);
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let slot = match &*key {
                "content" => &mut content,
                "reasoning_content" => &mut reasoning_content,
                "reasoning" => &mut reasoning,
                "tool_calls" => {
                    // Only a null `tool_calls` is plain.
                    if !matches!(map.next_value::<TextOrOther<'de>>()?, TextOrOther::Null) {
                        plain = false;
                    }
                    continue;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            // A repeated member: the last one counts, as in a `Value`.
            *slot = match map.next_value::<TextOrOther<'de>>()? {
                TextOrOther::Text(t) => Some(t),
                TextOrOther::Null => None,
                TextOrOther::Other => {
                    plain = false;
                    None
                }
            };
        }
        if !plain {
            return Ok(SampledChat::Other);
        }
        let mut msg = Message::new(Role::Assistant);
        if let Some(text) = content {
            msg.push_text(text.into_owned());
        }
        if let Some(r) = reasoning_content.or(reasoning) {
            msg.push_reasoning(&r);
        }
        Ok(SampledChat::Plain(msg))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<SampledChat, A::Error> {
        skip_seq(seq)
    }
}

impl<'de> Deserialize<'de> for SampledChat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SampledVisitor)
    }
}

fn chat_content(content: Option<&Value>, msg: &mut Message) {
    match content {
        Some(Value::String(s)) => msg.push_text(s.clone()),
        Some(Value::Array(parts)) => {
            for p in parts {
                match str_of(p, "type") {
                    Some("text") | Some("input_text") | Some("output_text") => {
                        msg.push_text(string_of(p, "text"))
                    }
                    Some("image_url") => {
                        let url = match p.get("image_url") {
                            Some(Value::String(s)) => s.as_str(),
                            Some(o) => str_of(o, "url").unwrap_or_default(),
                            None => "",
                        };
                        msg.content.push(Part::Image {
                            url: image_ref(url),
                        });
                    }
                    Some("refusal") => msg.push_text(string_of(p, "refusal")),
                    _ => msg.content.push(Part::Data { value: sorted(p) }),
                }
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages

/// The `system` of an Anthropic request.
pub(crate) fn anthropic_system(system: &Value) -> Option<Message> {
    let mut msg = Message::new(Role::System);
    match system {
        Value::String(s) => msg.push_text(s.clone()),
        Value::Array(blocks) => {
            for b in blocks {
                msg.push_text(string_of(b, "text"));
            }
        }
        _ => {}
    }
    (!msg.is_empty()).then_some(msg)
}

/// One Anthropic message: a user message with `tool_result` blocks becomes one `tool`
/// message per result (and a user message for the rest, in order).
pub(crate) fn from_anthropic(m: &Value, out: &mut Vec<Message>) {
    let role = role_of(str_of(m, "role").unwrap_or("user"));
    let mut msg = Message::new(role);
    match m.get("content") {
        Some(Value::String(s)) => msg.push_text(s.clone()),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                match str_of(b, "type") {
                    Some("text") => msg.push_text(string_of(b, "text")),
                    Some("image") => msg.content.push(Part::Image {
                        url: anthropic_image(b.get("source").unwrap_or(&Value::Null)),
                    }),
                    Some("thinking") => {
                        msg.push_reasoning(str_of(b, "thinking").unwrap_or_default());
                        msg.push_state(str_of(b, "signature").unwrap_or_default());
                    }
                    Some("redacted_thinking") => {
                        msg.push_state(str_of(b, "data").unwrap_or_default())
                    }
                    Some("tool_use") | Some("server_tool_use") => msg.tool_calls.push(ToolCall {
                        id: string_of(b, "id"),
                        name: string_of(b, "name"),
                        arguments: arguments(b.get("input")),
                    }),
                    Some("tool_result") => {
                        if !msg.is_empty() {
                            out.push(std::mem::replace(&mut msg, Message::new(role)));
                        }
                        let mut result = Message::new(Role::Tool);
                        result.tool_call_id = str_of(b, "tool_use_id").map(str::to_owned);
                        match b.get("content") {
                            Some(Value::String(s)) => result.push_text(s.clone()),
                            Some(Value::Array(inner)) => {
                                for ib in inner {
                                    match str_of(ib, "type") {
                                        Some("text") => result.push_text(string_of(ib, "text")),
                                        Some("image") => result.content.push(Part::Image {
                                            url: anthropic_image(
                                                ib.get("source").unwrap_or(&Value::Null),
                                            ),
                                        }),
                                        _ => result.content.push(Part::Data { value: sorted(ib) }),
                                    }
                                }
                            }
                            _ => {}
                        }
                        out.push(result);
                    }
                    _ => msg.content.push(Part::Data { value: sorted(b) }),
                }
            }
        }
        _ => {}
    }
    if !msg.is_empty() || out.is_empty() {
        out.push(msg);
    }
}

fn anthropic_image(source: &Value) -> String {
    match str_of(source, "type") {
        Some("base64") => inline_image(
            str_of(source, "media_type").unwrap_or_default(),
            str_of(source, "data").unwrap_or_default(),
        ),
        Some("url") => string_of(source, "url"),
        _ => canonical(source),
    }
}

// ---------------------------------------------------------------------------------------
// Responses

/// Responses `input` (a string or items) or `output` items. Consecutive assistant-side
/// items (an assistant message, reasoning, function calls) form one assistant message.
pub(crate) fn from_responses(items: &Value, out: &mut Vec<Message>) {
    let items = match items {
        Value::String(s) => {
            out.push(Message::text(Role::User, s.clone()));
            return;
        }
        Value::Array(items) => items,
        _ => return,
    };
    let mut turn: Option<Message> = None;
    let flush = |turn: &mut Option<Message>, out: &mut Vec<Message>| {
        if let Some(t) = turn.take() {
            out.push(t);
        }
    };
    for item in items {
        let kind = str_of(item, "type").unwrap_or("message");
        match kind {
            "message" => {
                let role = role_of(str_of(item, "role").unwrap_or("user"));
                if role == Role::Assistant {
                    let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                    chat_content(item.get("content"), t);
                } else {
                    flush(&mut turn, out);
                    let mut msg = Message::new(role);
                    responses_content(item.get("content"), &mut msg);
                    out.push(msg);
                }
            }
            "reasoning" => {
                let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                for key in ["summary", "content"] {
                    if let Some(parts) = item.get(key).and_then(Value::as_array) {
                        for p in parts {
                            t.push_reasoning(str_of(p, "text").unwrap_or_default());
                        }
                    }
                }
                t.push_state(str_of(item, "encrypted_content").unwrap_or_default());
            }
            "function_call" | "custom_tool_call" => {
                let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                let args = item.get("arguments").or_else(|| item.get("input"));
                t.tool_calls.push(ToolCall {
                    id: string_of(item, "call_id"),
                    name: string_of(item, "name"),
                    arguments: arguments(args),
                });
            }
            "function_call_output" | "custom_tool_call_output" => {
                flush(&mut turn, out);
                let mut msg = Message::new(Role::Tool);
                msg.tool_call_id = str_of(item, "call_id").map(str::to_owned);
                responses_content(item.get("output"), &mut msg);
                out.push(msg);
            }
            _ => {
                // Another item (a built-in tool call, an image generation): kept whole.
                let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                t.content.push(Part::Data {
                    value: sorted(item),
                });
            }
        }
    }
    flush(&mut turn, out);
}

fn responses_content(content: Option<&Value>, msg: &mut Message) {
    match content {
        Some(Value::Array(parts)) => {
            for p in parts {
                match str_of(p, "type") {
                    Some("input_text") | Some("output_text") | Some("text") => {
                        msg.push_text(string_of(p, "text"))
                    }
                    Some("input_image") => {
                        let url = str_of(p, "image_url")
                            .map(image_ref)
                            .or_else(|| str_of(p, "file_id").map(|f| format!("file:{f}")))
                            .unwrap_or_default();
                        msg.content.push(Part::Image { url });
                    }
                    Some("refusal") => msg.push_text(string_of(p, "refusal")),
                    _ => msg.content.push(Part::Data { value: sorted(p) }),
                }
            }
        }
        other => chat_content(other, msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let with =
            from_chat(&json!({"role": "assistant", "content": "4", "reasoning_content": "2+2"}));
        let without = from_chat(&json!({"role": "assistant", "content": "4"}));
        assert_ne!(with.hash(), without.hash());
        assert_eq!(with.visible_hash(), without.visible_hash());
        assert_eq!(without.hash(), without.visible_hash());
        assert_ne!(
            from_chat(&json!({"role": "user", "content": "4"})).hash(),
            without.hash()
        );
    }
}
