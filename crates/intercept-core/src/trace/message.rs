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
//!
//! The readers of each dialect are in `read/`; canonical JSON is in `canonical.rs`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_128;

use super::canonical::canonical;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
    pub(super) fn tag(self) -> u8 {
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
#[non_exhaustive]
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
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
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

    pub(crate) fn push_state(&mut self, s: &str) {
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

    pub(crate) fn is_empty(&self) -> bool {
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

#[cfg(test)]
mod hex_tests {
    use super::{hex, unhex};

    #[test]
    fn hex_is_lowercase_two_digits_a_byte_and_unhex_reads_it_back() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        let hash: [u8; 16] = std::array::from_fn(|i| (i as u8).wrapping_mul(37));
        assert_eq!(unhex(&hex(&hash)), Some(hash));
    }
}
