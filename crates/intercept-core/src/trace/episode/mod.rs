//! Training-native episodes: a rollout's calls as a **message graph** whose branches are
//! token-exact training samples. Pure data, no I/O.
//!
//! Every distinct message is stored once, as a node linked to its predecessor. A call's
//! prompt (in any dialect, mapped to [`Message`]) is matched node by node against the
//! existing nodes by a stable content hash ([`Message::hash`]); the unmatched tail becomes
//! new nodes and the response one new `sampled` assistant node. A compacted context, a
//! subagent or an edited history each start a new path, so branches are simply several
//! leaves. A call that failed (or whose response cannot be read) adds nothing and its
//! record names no node; refused calls and answered SDK retries never make a record, so
//! they add nothing either.
//!
//! When the session captures tokens, each sampled node carries the tokens it adds to the
//! sequence: the prompt tokens not already on its path, then its completion tokens, with
//! a `mask` true only on the completion and the completion's `logprobs`. Concatenating
//! the `token_ids` along a path from its last token start reproduces exactly the
//! `prompt_token_ids + completion_token_ids` the engine reported for the leaf's call.
//! A call whose prompt ids do not extend the previous turn's `prompt + completion` ids on
//! its path is never glued to it: its node carries its whole prompt, starts a new token
//! sequence and says why ([`TokenBreak`]).
//!
//! ```
//! use intercept_core::episode::EpisodeBuilder;
//! use intercept_core::{CallRecord, JsonBody, RawJson};
//! # use intercept_core::{DialectKind, Usage};
//! # fn record(seq: u64, request: &str, response: &str) -> CallRecord {
//! #     CallRecord {
//! #         session: "s".into(), seq, dialect: DialectKind::ChatCompletions,
//! #         endpoint: "/chat/completions".into(), model: "m".into(), stream: false,
//! #         sampling: Default::default(),
//! #         request: JsonBody::parse(request.to_owned().into()).unwrap(),
//! #         response: Some(RawJson::new(response.to_owned().into())),
//! #         finish_reason: None, usage: Usage::default(), status: 200, started_at: 0.0,
//! #         ended_at: 0.0, ttfb_ms: None, client_disconnected: false, error: None, epoch: 0,
//! #         engine: None, token_capture: Default::default(), prompt_token_ids: None,
//! #         completion_token_ids: None, completion_logprobs: None, token_path: None,
//! #         token_reason: None, node: None,
//! #         requested_model: None, policy: None, truncated: false, sampled: Default::default(),
//! #     }
//! # }
//!
//! let mut graph = EpisodeBuilder::new();
//! let first = record(0, r#"{"messages":[{"role":"user","content":"hi"}]}"#,
//!     r#"{"choices":[{"message":{"role":"assistant","content":"hello"}}]}"#);
//! let second = record(1, r#"{"messages":[{"role":"user","content":"hi"},
//!     {"role":"assistant","content":"hello"},{"role":"user","content":"bye"}]}"#,
//!     r#"{"choices":[{"message":{"role":"assistant","content":"ciao"}}]}"#);
//! assert_eq!(graph.commit(&first), Some(1));
//! assert_eq!(graph.commit(&second), Some(3));
//! let episode = graph.episode("s");
//! assert_eq!(episode.nodes.len(), 4); // hi, hello, bye, ciao: the prefix is shared
//! assert_eq!(episode.branches.len(), 1);
//! assert_eq!(episode.branches[0].path, vec![0, 1, 2, 3]);
//! ```

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chunked::Chunked;
use crate::dialect_kind::DialectKind;
use crate::trace::record::CallRecord;
use crate::trace::Trace;

/// The conversation of a request in any dialect, as [`Message`]s, in order: the system
/// prompt (Anthropic `system`, Responses `instructions`), then each message. `None` when
/// the body holds no conversation this reader can read (no `messages` or `input` array,
/// or text that is not JSON). A Responses request that continues a stored response
/// (`previous_response_id`) gives only the messages it carries.
pub fn request_messages(kind: DialectKind, body: &crate::body::JsonBody) -> Option<Vec<Message>> {
    let parse = |key: &str| -> Option<Value> { serde_json::from_slice(body.raw(key)?).ok() };
    let mut out = Vec::new();
    match kind {
        DialectKind::ChatCompletions => {
            for m in parse("messages")?.as_array()? {
                out.push(read::from_chat(m));
            }
        }
        DialectKind::Messages => {
            if let Some(system) = parse("system").as_ref().and_then(read::anthropic_system) {
                out.push(system);
            }
            for m in parse("messages")?.as_array()? {
                read::from_anthropic(m, &mut out);
            }
        }
        DialectKind::Responses => {
            if let Some(Value::String(s)) = parse("instructions") {
                if !s.is_empty() {
                    out.push(Message::text(Role::System, s));
                }
            }
            read::from_responses(&parse("input")?, &mut out);
        }
        DialectKind::Completions => return None,
    }
    Some(out)
}

/// The assistant message of a response in `kind`'s dialect (its JSON text), as the
/// episode reads it; `None` when the text is not a response it can read.
pub fn response_message(kind: DialectKind, response: &[u8]) -> Option<Message> {
    let value: Value = serde_json::from_slice(response).ok()?;
    read::response_message(kind, &value)
}

/// A response's sampled message, from its JSON (what [`response_message`] reads).
pub(crate) fn sampled_message(kind: DialectKind, response: &Value) -> Option<Message> {
    read::response_message(kind, response)
}

/// A Chat conversation element as a message (how a Chat prompt joins the graph).
pub(crate) fn chat_message(element: &Value) -> Message {
    read::from_chat(element)
}

/// The messages of conversation elements (Chat and Anthropic `messages` elements,
/// Responses `input` items) in `kind`'s dialect, as a prompt of them joins the graph.
pub(crate) fn conversation_messages(kind: DialectKind, elements: &[Value]) -> Vec<Message> {
    let mut out = Vec::new();
    match kind {
        DialectKind::ChatCompletions => out.extend(elements.iter().map(read::from_chat)),
        DialectKind::Messages => {
            for e in elements {
                read::from_anthropic(e, &mut out);
            }
        }
        DialectKind::Responses => read::from_response_items(elements, &mut out),
        DialectKind::Completions => {}
    }
    out
}

mod read;

pub(crate) use crate::trace::message::hex;
pub use crate::trace::message::{Hash, Message, Part, Role, ToolCall};
pub use read::SampledChat;

/// Why a sampled node starts a new token sequence instead of extending its path's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TokenBreak {
    /// The prompt ids agree with the previous turn's prompt but not with its completion:
    /// the completion text did not tokenise back to the ids that were sampled.
    Retokenized,
    /// The prompt ids differ inside the previous turn's prompt: the chat template
    /// rendered earlier turns differently (dropped reasoning, a rewritten system prompt).
    Rerendered,
    /// The previous turn on the path has no token ids (its engine returned none).
    Untracked,
}

impl TokenBreak {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenBreak::Retokenized => "retokenized",
            TokenBreak::Rerendered => "rerendered",
            TokenBreak::Untracked => "untracked",
        }
    }
}

/// One node of an [`Episode`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Its index in [`Episode::nodes`].
    pub id: u32,
    /// The node before it (`null` for the first message of a path).
    pub parent: Option<u32>,
    /// The message's content hash (32 hex digits).
    pub hash: String,
    /// The message.
    pub message: Message,
    /// Whether the model sampled it (a call's response).
    pub sampled: bool,
    /// The `seq` of the call that sampled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<u64>,
    /// The tokens it adds to its path's sequence: prompt tokens not already on the path,
    /// then the completion (sampled nodes of calls with token ids only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// True on the completion tokens, aligned with `token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Vec<bool>>,
    /// The sampled tokens' logprobs, aligned with `token_ids` (0 where `mask` is false);
    /// absent when the engine returned none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<f64>>,
    /// Whether `token_ids` start a new sequence (the first sampled node of a path, or a
    /// break).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub token_start: bool,
    /// Why the sequence was broken here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_break: Option<TokenBreak>,
}

/// One root-to-leaf path of an [`Episode`]: a training sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Branch {
    /// The leaf node.
    pub leaf: u32,
    /// The node ids from the root to the leaf.
    pub path: Vec<u32>,
    /// Sampled nodes on the path (from `token_start` when tokens are present).
    pub turns: u32,
    /// The node where the token sequence starts (tokens only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_start: Option<u32>,
    /// The sequence: the leaf call's prompt ids followed by its completion ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// True on every sampled completion token of the sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Vec<bool>>,
    /// Logprobs aligned with `token_ids` (0 where `mask` is false); absent when a turn of
    /// the sequence has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<f64>>,
    /// Tokens before the first completion token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<u32>,
    /// Masked (sampled) tokens in the sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u32>,
}

/// Counts over an [`Episode`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpisodeSummary {
    /// Records seen.
    pub calls: u64,
    /// Calls that produced a sampled node.
    pub sampled: u64,
    /// Calls that failed (no node).
    pub failed: u64,
    /// Successful calls whose prompt or response could not be read (no node).
    pub unreadable: u64,
    /// Nodes in the graph.
    pub nodes: u64,
    /// Leaves.
    pub branches: u64,
    /// Token ids held by the graph (each once).
    pub tokens: u64,
    /// Sampled nodes with token ids.
    pub token_turns: u64,
    /// Token breaks, all reasons.
    pub token_breaks: u64,
    /// Token breaks by reason.
    #[serde(default)]
    pub token_breaks_by_reason: BTreeMap<TokenBreak, u64>,
}

/// A rollout as a message graph: what a trainer consumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// The session (rollout) id.
    pub session: String,
    /// Every node, parents before children.
    pub nodes: Vec<Node>,
    /// Every leaf's path, in the order the leaves were made.
    pub branches: Vec<Branch>,
    /// Counts.
    pub summary: EpisodeSummary,
}

/// The tokens a node adds to its sequence.
#[derive(Debug)]
pub(crate) struct Tokens {
    pub(crate) ids: Vec<u32>,
    /// Leading ids that are prompt (unmasked).
    pub(crate) prompt: usize,
    /// Logprobs of the completion ids.
    pub(crate) logprobs: Option<Vec<f64>>,
    /// Whether the node starts a token sequence.
    pub(crate) start: bool,
    /// Why it does, when it breaks one.
    pub(crate) brk: Option<TokenBreak>,
}

/// A node as the builder holds it.
#[derive(Debug)]
pub(crate) struct NodeData {
    pub(crate) parent: Option<u32>,
    pub(crate) hash: Hash,
    pub(crate) message: Message,
    pub(crate) sampled: bool,
    pub(crate) call: Option<u64>,
    /// Boxed: most nodes have none, and a node's size is memory per call.
    pub(crate) tokens: Option<Box<Tokens>>,
}

/// Builds an episode call by call ([`EpisodeBuilder::commit`]); the graph grows with the
/// new messages and new tokens only.
#[derive(Debug, Default)]
pub struct EpisodeBuilder {
    /// Appended to only; a node never learns of its children (that would touch an older
    /// node, out of the cache, on every call): [`EpisodeBuilder::episode`] finds the
    /// leaves.
    nodes: Chunked<NodeData>,
    /// (parent + 1, content hash) → the latest node with that content there.
    by_hash: HashMap<(u32, Hash), u32, Keyed>,
    /// (parent + 1, visible hash) → the latest sampled node with that visible content.
    by_visible: HashMap<(u32, Hash), u32, Keyed>,
    /// (parent + 1, hash of a Chat message's raw bytes, length) → node: a prompt message
    /// sent again byte for byte is matched without parsing it.
    by_raw: HashMap<(u32, u128, usize), u32, Keyed>,
    /// Seed of the raw-bytes hash, random per builder, so that raw matches cannot be
    /// aimed at from outside.
    raw_seed: u64,
    /// The last Chat prompt committed (its `messages` array, shared with its record)
    /// and the node of its last message: a prompt that starts with the same bytes
    /// continues from there, and only its new messages are read.
    last_chat: Option<LastChat>,
    /// Responses `id` → its sampled node (for `previous_response_id`). Boxed, and made
    /// on the first Responses answer: the builder is part of every session, also of the
    /// many that never see one (the box is the point: a map is 48 bytes, its box 8).
    #[allow(clippy::box_collection)]
    responses: Option<Box<HashMap<String, u32>>>,
    /// The last sampled node's entries in `by_hash` and `by_visible`, not written yet.
    /// They are written before the maps are next read, or when the next sampled node
    /// has other keys, so the maps always answer as if written at once. A call whose
    /// sampled node replaces the same keys (the same answer after the same prompt)
    /// never touches the maps, which between two calls of a session have left the cache.
    unindexed: Option<Unindexed>,
    summary: EpisodeSummary,
}

/// A sampled node's map entries, written later (see [`EpisodeBuilder`]'s `unindexed`).
#[derive(Debug, Clone, Copy)]
struct Unindexed {
    key: u32,
    hash: Hash,
    visible: Hash,
    id: u32,
}

/// The maps' hasher: foldhash, seeded at random per map. Their keys are content hashes
/// and small integers, so SipHash's strength buys nothing a random seed does not.
type Keyed = foldhash::fast::RandomState;

fn key(parent: Option<u32>) -> u32 {
    parent.map_or(0, |p| p + 1)
}

fn raw_hash(seed: u64, bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128_with_seed(bytes, seed)
}

#[derive(Debug)]
struct LastChat {
    /// The `messages` array as the request sent it.
    raw: bytes::Bytes,
    /// Its number of messages.
    count: usize,
    /// The node of its last message.
    end: Option<u32>,
}

/// If `new` is the array `prev` with zero or more elements appended (byte for byte,
/// `prev` having at least one), the bytes of the appended elements (`e, e]`, or empty
/// when there are none).
pub(crate) fn appended<'a>(prev: &[u8], new: &'a [u8]) -> Option<&'a [u8]> {
    let body = prev.strip_suffix(b"]")?.trim_ascii_end();
    let rest = new.strip_prefix(body)?.trim_ascii_start();
    match rest.first()? {
        b']' => Some(&[]),
        b',' => Some(&rest[1..]),
        _ => None,
    }
}

impl EpisodeBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        EpisodeBuilder::default()
    }

    fn ensure_seed(&mut self) {
        if self.raw_seed == 0 {
            use std::hash::{BuildHasher as _, RandomState};
            self.raw_seed = RandomState::new().hash_one(0x9e37_79b9_u64) | 1;
        }
    }

    /// Commits one call: matches its prompt, adds the unmatched tail and one sampled node
    /// for its response, and returns that node's id. A failed call, or one whose prompt
    /// or response cannot be read, adds nothing and returns `None`.
    pub fn commit(&mut self, record: &CallRecord) -> Option<u64> {
        self.commit_with(record, record.sampled.get().cloned())
    }

    /// [`EpisodeBuilder::commit`] for a record the caller owns: the sampled message the
    /// server read is taken out of [`CallRecord::sampled`] instead of copied (what a
    /// [`RolloutSession`](crate::RolloutSession) does).
    pub fn commit_taking(&mut self, record: &mut CallRecord) -> Option<u64> {
        let sampled = record.sampled.take();
        self.commit_with(record, sampled)
    }

    /// [`EpisodeBuilder::commit`] with the record's sampled message already taken out of
    /// its [`CallRecord::sampled`] hint.
    fn commit_with(&mut self, record: &CallRecord, sampled: Option<Message>) -> Option<u64> {
        self.summary.calls += 1;
        if record.error.is_some() || record.status >= 400 {
            self.summary.failed += 1;
            return None;
        }
        let node = self.try_commit(record, sampled);
        if node.is_none() {
            self.summary.unreadable += 1;
        }
        node.map(u64::from)
    }

    fn try_commit(&mut self, record: &CallRecord, hint: Option<Message>) -> Option<u32> {
        let (sampled, response) = match hint {
            Some(m) if record.dialect == DialectKind::ChatCompletions => (m, None),
            _ => self.sampled_of(record)?,
        };
        let parent = if record.dialect == DialectKind::ChatCompletions {
            self.chat_prompt(record)?
        } else {
            let (start, messages) = self.prompt_of(record)?;
            let mut parent = start;
            for m in messages {
                parent = Some(self.match_or_add(parent, m));
            }
            parent
        };
        let tokens = self.tokens_for(parent, record);
        let (hash, visible) = sampled.hashes();
        let id = self.push(NodeData {
            parent,
            hash,
            message: sampled,
            sampled: true,
            call: Some(record.seq),
            tokens: tokens.map(Box::new),
        });
        let entry = Unindexed {
            key: key(parent),
            hash,
            visible,
            id,
        };
        match self.unindexed {
            // The same keys: the later node is what both maps would keep.
            Some(old) if (old.key, old.hash, old.visible) == (entry.key, hash, visible) => {}
            _ => self.index_sampled(),
        }
        self.unindexed = Some(entry);
        if let Some(rid) = response.as_ref().and_then(|r| r.get("id")?.as_str()) {
            self.responses
                .get_or_insert_default()
                .insert(rid.to_owned(), id);
        }
        self.summary.sampled += 1;
        Some(id)
    }

    /// The call's sampled message, and for Responses the response itself (its `id`).
    fn sampled_of(&self, record: &CallRecord) -> Option<(Message, Option<Value>)> {
        let bytes = record.response.as_ref()?.bytes();
        if record.dialect == DialectKind::ChatCompletions {
            // A turn that called tools is a shape the one-pass reader leaves to
            // `from_chat`: read it that way at once rather than twice.
            let tools = record.finish_reason.as_deref() == Some("tool_calls");
            let plain = if tools {
                None
            } else {
                let response: read::ChatResponse = crate::body::from_json_bytes(bytes).ok()?;
                match response.choices.into_iter().next()?.message? {
                    read::SampledChat::Plain(msg) => Some(msg),
                    read::SampledChat::Other => None,
                }
            };
            let msg = match plain {
                Some(msg) => msg,
                None => {
                    let response: read::ChatResponseValue = serde_json::from_slice(bytes).ok()?;
                    let mut msg = read::from_chat(response.choices.first()?.message.as_ref()?);
                    msg.role = Role::Assistant;
                    msg
                }
            };
            return Some((msg, None));
        }
        let response: Value = serde_json::from_slice(bytes).ok()?;
        let sampled = read::response_message(record.dialect, &response)?;
        let keep = record.dialect == DialectKind::Responses;
        Some((sampled, keep.then_some(response)))
    }

    /// Matches a Chat prompt and returns the node of its last message. A prompt that
    /// extends the previous one byte for byte continues from that one's last node and
    /// reads only the messages it appends; any other is read message by message, each
    /// matched first by its raw bytes.
    fn chat_prompt(&mut self, record: &CallRecord) -> Option<Option<u32>> {
        self.ensure_seed();
        let raw = record.request.raw_bytes("messages")?;
        let continued = self
            .last_chat
            .as_ref()
            .filter(|last| last.count > 0)
            .and_then(|last| Some((last.end, last.count, appended(&last.raw, &raw)?)));
        let (mut parent, mut count, tail) = match continued {
            Some((end, count, tail)) => {
                let tail: Option<Vec<u8>> = (!tail.is_empty()).then(|| {
                    let mut array = Vec::with_capacity(tail.len() + 1);
                    array.push(b'[');
                    array.extend_from_slice(tail);
                    array
                });
                (end, count, tail)
            }
            None => (None, 0, Some(raw.to_vec())),
        };
        if let Some(array) = tail {
            // The request was read as a JSON object: its elements are found by the
            // log's scan, not parsed twice.
            let text = simdutf8::basic::from_utf8(&array).ok()?;
            for m in crate::json_text::elements(text)? {
                let bytes = m.as_bytes();
                let rk = (key(parent), raw_hash(self.raw_seed, bytes), bytes.len());
                count += 1;
                if let Some(&n) = self.by_raw.get(&rk) {
                    parent = Some(n);
                    continue;
                }
                let value: Value = serde_json::from_str(m).ok()?;
                let n = self.match_or_add(parent, read::from_chat(&value));
                self.by_raw.insert(rk, n);
                parent = Some(n);
            }
        }
        self.last_chat = Some(LastChat {
            raw,
            count,
            end: parent,
        });
        Some(parent)
    }

    fn prompt_of(&self, record: &CallRecord) -> Option<(Option<u32>, Vec<Message>)> {
        let body = &record.request;
        let raw = |key: &str| -> Option<&[u8]> { body.raw(key) };
        let parse = |key: &str| -> Option<Value> { serde_json::from_slice(raw(key)?).ok() };
        match record.dialect {
            DialectKind::ChatCompletions => None,
            DialectKind::Messages => {
                let mut out = Vec::new();
                if let Some(system) = parse("system").as_ref().and_then(read::anthropic_system) {
                    out.push(system);
                }
                let messages = parse("messages")?;
                for m in messages.as_array()? {
                    read::from_anthropic(m, &mut out);
                }
                Some((None, out))
            }
            DialectKind::Responses => {
                let mut out = Vec::new();
                let start = body
                    .str("previous_response_id")
                    .and_then(|id| self.responses.as_ref()?.get(&id).copied());
                if start.is_none() {
                    if let Some(Value::String(s)) = parse("instructions") {
                        if !s.is_empty() {
                            out.push(Message::text(Role::System, s));
                        }
                    }
                }
                if let Some(input) = parse("input") {
                    read::from_responses(&input, &mut out);
                }
                Some((start, out))
            }
            DialectKind::Completions => {
                let prompt = match parse("prompt")? {
                    Value::String(s) => s,
                    other => crate::trace::canonical::canonical(&other),
                };
                Some((None, vec![Message::text(Role::User, prompt)]))
            }
        }
    }

    fn push(&mut self, node: NodeData) -> u32 {
        self.nodes.push(node) as u32
    }

    /// The node for `message` after `parent`: an existing one with the same content (or
    /// a sampled one the harness sent back without its reasoning), else a new one.
    fn match_or_add(&mut self, parent: Option<u32>, message: Message) -> u32 {
        self.index_sampled();
        let (hash, visible) = message.hashes();
        if let Some(&n) = self.by_hash.get(&(key(parent), hash)) {
            if self.nodes[n as usize].message == message {
                return n;
            }
        }
        if message.role == Role::Assistant && message.reasoning.is_none() {
            if let Some(&n) = self.by_visible.get(&(key(parent), visible)) {
                if self.nodes[n as usize].message.same_visible(&message) {
                    return n;
                }
            }
        }
        let id = self.push(NodeData {
            parent,
            hash,
            message,
            sampled: false,
            call: None,
            tokens: None,
        });
        self.by_hash.insert((key(parent), hash), id);
        id
    }

    /// Writes the last sampled node's map entries, if they are not written yet.
    fn index_sampled(&mut self) {
        if let Some(e) = self.unindexed.take() {
            self.by_hash.insert((e.key, e.hash), e.id);
            self.by_visible.insert((e.key, e.visible), e.id);
        }
    }

    /// The nearest sampled node at or above `from`.
    fn sampled_at_or_above(&self, mut from: Option<u32>) -> Option<u32> {
        while let Some(n) = from {
            let node = &self.nodes[n as usize];
            if node.sampled {
                return Some(n);
            }
            from = node.parent;
        }
        None
    }

    /// The sampled nodes of the token sequence ending at `last`, first to last; `None`
    /// when a node on it has no tokens.
    fn sequence(&self, last: u32) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        let mut at = Some(last);
        while let Some(n) = at {
            let tokens = self.nodes[n as usize].tokens.as_ref()?;
            out.push(n);
            if tokens.start {
                break;
            }
            at = self.sampled_at_or_above(self.nodes[n as usize].parent);
        }
        out.reverse();
        Some(out)
    }

    fn tokens_for(&mut self, parent: Option<u32>, record: &CallRecord) -> Option<Tokens> {
        let prompt = record.prompt_token_ids.as_deref()?;
        let completion = record.completion_token_ids.as_deref()?;
        let logprobs = record
            .completion_logprobs
            .as_ref()
            .filter(|l| l.len() == completion.len())
            .cloned();
        self.summary.token_turns += 1;
        self.summary.tokens += (prompt.len() + completion.len()) as u64;
        let whole = |brk: Option<TokenBreak>| Tokens {
            ids: [prompt, completion].concat(),
            prompt: prompt.len(),
            logprobs: logprobs.clone(),
            start: true,
            brk,
        };
        let Some(previous) = self.sampled_at_or_above(parent) else {
            return Some(whole(None));
        };
        let brk = match self.sequence(previous) {
            None => TokenBreak::Untracked,
            Some(seq) => {
                // Compare the prompt with the sequence so far, piece by piece.
                let mut at = 0;
                let mut diverged = None;
                for &n in &seq {
                    let Some(t) = self.nodes[n as usize].tokens.as_ref() else {
                        continue;
                    };
                    let end = at + t.ids.len();
                    let theirs = &t.ids[..];
                    let ours = prompt.get(at..end.min(prompt.len())).unwrap_or_default();
                    if ours != theirs {
                        let same = ours.iter().zip(theirs).take_while(|(a, b)| a == b).count();
                        diverged = Some((n, same));
                        break;
                    }
                    at = end;
                }
                match diverged {
                    None => {
                        self.summary.tokens -= at as u64;
                        return Some(Tokens {
                            ids: [&prompt[at..], completion].concat(),
                            prompt: prompt.len() - at,
                            logprobs,
                            start: false,
                            brk: None,
                        });
                    }
                    Some((n, same)) => {
                        let last = n == previous;
                        let in_prompt = self.nodes[n as usize]
                            .tokens
                            .as_ref()
                            .is_some_and(|t| same < t.prompt);
                        if last && !in_prompt {
                            TokenBreak::Retokenized
                        } else {
                            TokenBreak::Rerendered
                        }
                    }
                }
            }
        };
        self.summary.token_breaks += 1;
        *self.summary.token_breaks_by_reason.entry(brk).or_default() += 1;
        Some(whole(Some(brk)))
    }

    /// The episode so far.
    pub fn episode(&self, session: &str) -> Episode {
        let nodes: Vec<Node> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (token_ids, mask, logprobs) = match &n.tokens {
                    Some(t) => {
                        let mask: Vec<bool> = (0..t.ids.len()).map(|j| j >= t.prompt).collect();
                        let logprobs = t.logprobs.as_ref().map(|l| {
                            let mut out = vec![0.0; t.prompt];
                            out.extend_from_slice(l);
                            out
                        });
                        (Some(t.ids.clone()), Some(mask), logprobs)
                    }
                    None => (None, None, None),
                };
                Node {
                    id: i as u32,
                    parent: n.parent,
                    hash: hex(&n.hash),
                    message: n.message.clone(),
                    sampled: n.sampled,
                    call: n.call,
                    token_ids,
                    mask,
                    logprobs,
                    token_start: n.tokens.as_ref().is_some_and(|t| t.start),
                    token_break: n.tokens.as_ref().and_then(|t| t.brk),
                }
            })
            .collect();
        let mut has_child = vec![false; self.nodes.len()];
        for n in self.nodes.iter() {
            if let Some(p) = n.parent {
                has_child[p as usize] = true;
            }
        }
        let branches: Vec<Branch> = (0..self.nodes.len() as u32)
            .filter(|&i| !has_child[i as usize])
            .map(|leaf| self.branch(leaf))
            .collect();
        let mut summary = self.summary.clone();
        summary.nodes = nodes.len() as u64;
        summary.branches = branches.len() as u64;
        Episode {
            session: session.to_owned(),
            nodes,
            branches,
            summary,
        }
    }

    fn branch(&self, leaf: u32) -> Branch {
        let mut path = Vec::new();
        let mut at = Some(leaf);
        while let Some(n) = at {
            path.push(n);
            at = self.nodes[n as usize].parent;
        }
        path.reverse();
        let mut branch = Branch {
            leaf,
            turns: path
                .iter()
                .filter(|&&n| self.nodes[n as usize].sampled)
                .count() as u32,
            path,
            token_start: None,
            token_ids: None,
            mask: None,
            logprobs: None,
            prompt_len: None,
            completion_tokens: None,
        };
        let seq = self
            .sampled_at_or_above(Some(leaf))
            .filter(|&n| n == leaf)
            .and_then(|n| self.sequence(n));
        let Some(seq) = seq else {
            return branch;
        };
        let mut ids = Vec::new();
        let mut mask = Vec::new();
        let mut logprobs = Some(Vec::new());
        for &n in &seq {
            let Some(t) = self.nodes[n as usize].tokens.as_ref() else {
                continue;
            };
            ids.extend_from_slice(&t.ids);
            mask.extend((0..t.ids.len()).map(|j| j >= t.prompt));
            logprobs = match (logprobs, &t.logprobs) {
                (Some(mut out), Some(l)) => {
                    out.resize(out.len() + t.prompt, 0.0);
                    out.extend_from_slice(l);
                    Some(out)
                }
                _ => None,
            };
        }
        branch.prompt_len = Some(mask.iter().take_while(|m| !**m).count() as u32);
        branch.completion_tokens = Some(mask.iter().filter(|m| **m).count() as u32);
        branch.turns = seq.len() as u32;
        branch.token_start = seq.first().copied();
        branch.token_ids = Some(ids);
        branch.mask = Some(mask);
        branch.logprobs = logprobs;
        branch
    }

    /// Nodes in the graph.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The counts so far, without building the episode.
    pub(crate) fn summary(&self) -> EpisodeSummary {
        let mut summary = self.summary.clone();
        summary.nodes = self.nodes.len() as u64;
        let mut has_child = vec![false; self.nodes.len()];
        for n in self.nodes.iter() {
            if let Some(p) = n.parent {
                has_child[p as usize] = true;
            }
        }
        summary.branches = has_child.iter().filter(|c| !**c).count() as u64;
        summary
    }

    /// Node `id`'s data, as the log writes it.
    pub(crate) fn node_data(&self, id: usize) -> &NodeData {
        &self.nodes[id]
    }

    /// A builder holding `nodes` (as a log or an [`Episode`] gives them), for reading:
    /// [`EpisodeBuilder::episode`] then gives their branches. `calls` counts the
    /// records: (all, failed, unreadable).
    pub(crate) fn restore(nodes: Vec<Node>, calls: (u64, u64, u64)) -> Self {
        let mut b = EpisodeBuilder::new();
        b.summary.calls = calls.0;
        b.summary.failed = calls.1;
        b.summary.unreadable = calls.2;
        for n in nodes {
            let tokens = n.token_ids.map(|ids| {
                let prompt = n
                    .mask
                    .as_ref()
                    .map_or(0, |m| m.iter().take_while(|x| !**x).count());
                Tokens {
                    logprobs: n
                        .logprobs
                        .map(|l| l.get(prompt..).unwrap_or_default().to_vec()),
                    prompt,
                    ids,
                    start: n.token_start,
                    brk: n.token_break,
                }
            });
            if n.sampled {
                b.summary.sampled += 1;
            }
            if let Some(t) = &tokens {
                b.summary.token_turns += 1;
                b.summary.tokens += t.ids.len() as u64;
                if let Some(brk) = t.brk {
                    b.summary.token_breaks += 1;
                    *b.summary.token_breaks_by_reason.entry(brk).or_default() += 1;
                }
            }
            b.nodes.push(NodeData {
                parent: n.parent,
                hash: crate::trace::message::unhex(&n.hash).unwrap_or_default(),
                message: n.message,
                sampled: n.sampled,
                call: n.call,
                tokens: tokens.map(Box::new),
            });
        }
        b
    }

    /// Heap bytes held by the graph's nodes (messages, tokens, logprobs) and indexes: for
    /// memory accounting.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let mut total = self.nodes.capacity() * size_of::<NodeData>();
        for n in self.nodes.iter() {
            total += message_bytes(&n.message);
            if let Some(t) = &n.tokens {
                total += size_of::<Tokens>() + t.ids.capacity() * size_of::<u32>();
                total += t
                    .logprobs
                    .as_ref()
                    .map_or(0, |l| l.capacity() * size_of::<f64>());
            }
        }
        let entry = size_of::<(u32, Hash)>() + size_of::<u32>() + 1;
        total += (self.by_hash.capacity() + self.by_visible.capacity()) * entry;
        total += self.by_raw.capacity() * (size_of::<(u32, u128, usize)>() + size_of::<u32>() + 1);
        total
    }
}

fn message_bytes(m: &Message) -> usize {
    let parts: usize = m
        .content
        .iter()
        .map(|p| match p {
            Part::Text { text } => text.capacity(),
            Part::Image { url } => url.capacity(),
            Part::Data { value } => value.to_string().len(),
        })
        .sum();
    parts
        + m.content.capacity() * std::mem::size_of::<Part>()
        + m.reasoning.as_ref().map_or(0, String::capacity)
        + m.state.as_ref().map_or(0, String::capacity)
        + m.tool_calls
            .iter()
            .map(|c| c.id.capacity() + c.name.capacity() + c.arguments.to_string().len())
            .sum::<usize>()
}

impl Trace {
    /// The trace's calls as an [`Episode`], committed in the order they ended (the order
    /// a [`RolloutSession`](crate::RolloutSession) commits them, so node ids match the
    /// records' `node`).
    pub fn episode(&self) -> Episode {
        let mut builder = EpisodeBuilder::new();
        for call in &self.calls {
            builder.commit(call);
        }
        builder.episode(&self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::appended;
    use super::EpisodeBuilder;
    use crate::{CallRecord, JsonBody, RawJson};

    /// A successful Chat call of `messages` answered by `reply` (both JSON texts).
    fn chat(seq: u64, messages: &str, reply: &str) -> CallRecord {
        let mut record: CallRecord = serde_json::from_value(serde_json::json!({
            "session": "s", "seq": seq, "dialect": "chat_completions",
            "endpoint": "/chat/completions", "model": "m", "stream": false, "sampling": {},
            "request": {}, "response": null, "finish_reason": null, "status": 200,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_input_tokens": 0,
                "reasoning_tokens": 0},
            "started_at": 0.0, "ended_at": 0.0, "ttfb_ms": null, "error": null
        }))
        .expect("record");
        let request = format!(r#"{{"messages":{messages}}}"#);
        record.request = JsonBody::parse(request.into()).expect("request");
        let response = format!(r#"{{"choices":[{{"message":{reply}}}]}}"#);
        record.response = Some(RawJson::new(response.into()));
        record
    }

    /// The last sampled node's map entries are written late (or never, when the next
    /// call's node takes the same keys); the graph must come out as if written at once:
    /// a prompt that sends an answer back continues from the latest node with that
    /// content, or with that visible content when the reasoning was left out.
    #[test]
    fn sampled_nodes_are_matched_as_if_indexed_at_once() {
        let hi = r#"{"role":"user","content":"hi"}"#;
        let hello = r#"{"role":"assistant","content":"hello","reasoning_content":"think"}"#;
        let bare = r#"{"role":"assistant","content":"hello"}"#;
        let other = r#"{"role":"assistant","content":"other"}"#;
        let user = |t: &str| format!(r#"{{"role":"user","content":"{t}"}}"#);
        let list = |m: &[&str]| format!("[{}]", m.join(","));
        let mut b = EpisodeBuilder::new();
        let mut commit = |seq: u64, prompt: &[&str], reply: &str| {
            let node = b.commit(&chat(seq, &list(prompt), reply));
            let e = b.episode("s");
            (node, e)
        };
        // The same call three times: three sampled nodes under "hi" with the same keys,
        // then another answer to it (other keys).
        assert_eq!(commit(0, &[hi], hello).0, Some(1));
        assert_eq!(commit(1, &[hi], hello).0, Some(2));
        assert_eq!(commit(2, &[hi], hello).0, Some(3));
        assert_eq!(commit(3, &[hi], other).0, Some(4));
        // The first answer sent back whole continues from the latest node with it.
        let (node, e) = commit(4, &[hi, hello, &user("go")], other);
        assert_eq!(node, Some(6));
        assert_eq!(e.nodes[5].parent, Some(3), "{:?}", e.nodes[5]);
        // Sent back without its reasoning: matched by its visible content.
        let (node, e) = commit(5, &[hi, bare, &user("again")], other);
        assert_eq!(node, Some(8));
        assert_eq!(e.nodes[7].parent, Some(3), "{:?}", e.nodes[7]);
        // The other answer to "hi" continues from its own node.
        let (node, e) = commit(6, &[hi, other, &user("more")], other);
        assert_eq!(node, Some(10));
        assert_eq!(e.nodes[9].parent, Some(4), "{:?}", e.nodes[9]);
        // The answer of the call just made, sent back at once.
        let (node, e) = commit(7, &[hi, other, &user("more"), other, &user("fin")], other);
        assert_eq!(node, Some(12));
        assert_eq!(e.nodes[11].parent, Some(10), "{:?}", e.nodes[11]);
        assert_eq!(e.nodes.len(), 13);
        // Branches end at 1 and 2 (answered again, never continued), 6, 8 and 12.
        assert_eq!(e.branches.len(), 5);
    }

    #[test]
    fn appended_finds_the_elements_added_to_an_array() {
        assert_eq!(appended(b"[{\"a\":1}]", b"[{\"a\":1}]"), Some(&b""[..]));
        assert_eq!(
            appended(b"[{\"a\":1}]", b"[{\"a\":1},{\"b\":2}]"),
            Some(&b"{\"b\":2}]"[..])
        );
        assert_eq!(
            appended(b"[{\"a\":1} ]", b"[{\"a\":1} , {\"b\":2}]"),
            Some(&b" {\"b\":2}]"[..])
        );
        // Not an extension: another element, a longer last element, another array.
        assert_eq!(appended(b"[{\"a\":1}]", b"[{\"a\":2}]"), None);
        assert_eq!(appended(b"[1,2]", b"[1,23]"), None);
        assert_eq!(appended(b"[\"ab\"]", b"[\"abc\"]"), None);
        assert_eq!(appended(b"[{\"a\":1},{\"b\":2}]", b"[{\"a\":1}]"), None);
        assert_eq!(appended(b"not an array", b"[]"), None);
    }
}
