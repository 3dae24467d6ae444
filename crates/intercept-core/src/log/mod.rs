//! The trace log: one append-only JSONL log per rollout, linear in what the rollout adds.
//! Pure data, no I/O: [`LogWriter`] turns each [`CallRecord`] into the lines it adds,
//! [`LogReader`] reads lines back into records and the episode. Writing them to files is
//! the `intercept-trace` crate's; the format is specified in `docs/traces.md`.
//!
//! A log is a sequence of typed lines (`"type"`):
//!
//! - `header`: the [`SCHEMA`], the session id and its settings;
//! - `value`: a long string or a large request/response member, written the first time a
//!   call carries it and referenced as `{"$v":N}` after that (tool lists, system prompts,
//!   images and other base64 data, tool results, the model's answers);
//! - `node`: a message joining the episode's graph ([`crate::episode`]), written once,
//!   with the tokens it adds;
//! - `call`: one per model call: everything a [`CallRecord`] holds, its request's
//!   conversation given as the elements it adds to an earlier call's (`{"$a":…}`), its
//!   bodies' long values by reference, its token ids by the node that holds them;
//! - `end`: written at release, with the summary; a log without one is incomplete.
//!
//! Every line only refers to lines before it, so a log is read in one pass, and a log
//! cut anywhere (a crash) reads up to its last whole line.
//!
//! ```
//! use intercept_core::log::{LogReader, LogWriter};
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
//! #         completion_token_ids: None, completion_logprobs: None, node: None,
//! #         requested_model: None, policy: None, truncated: false, sampled: Default::default(),
//! #     }
//! # }
//! let mut log = LogWriter::new("s");
//! let mut lines = log.header(serde_json::json!({"model": "m"}));
//! let mut first = record(0, r#"{"messages":[{"role":"user","content":"hi"}]}"#,
//!     r#"{"choices":[{"message":{"role":"assistant","content":"hello"}}]}"#);
//! log.record(&mut first, &mut lines);
//! let mut second = record(1, r#"{"messages":[{"role":"user","content":"hi"},
//!     {"role":"assistant","content":"hello"},{"role":"user","content":"bye"}]}"#,
//!     r#"{"choices":[{"message":{"role":"assistant","content":"ciao"}}]}"#);
//! log.record(&mut second, &mut lines);
//!
//! let read = LogReader::from_bytes(&lines).unwrap();
//! assert!(read.incomplete()); // no end line yet
//! assert_eq!(read.calls().len(), 2);
//! let rebuilt = read.record(1).unwrap();
//! assert_eq!(rebuilt.request.to_value(), second.request.to_value());
//! assert_eq!(read.episode().nodes.len(), 4);
//! ```

use std::collections::HashMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::episode::{Episode, EpisodeBuilder, EpisodeSummary};
use crate::record::{CallError, CallRecord, TokenCapture, Usage};
use crate::DialectKind;

pub(crate) mod encode;
mod read;

pub use encode::{MAX_DEPTH, MIN_MEMBER, MIN_STRING};
pub use read::{LogCall, LogError, LogReader};

/// The log format's name and version, the `schema` of its header line. A reader
/// refuses a log whose schema it does not know.
pub const SCHEMA: &str = "intercept.trace/2";

/// The request member that holds a dialect's conversation (written as the elements it
/// adds to an earlier call's).
pub fn conversation_member(dialect: DialectKind) -> Option<&'static str> {
    match dialect {
        DialectKind::ChatCompletions | DialectKind::Messages => Some("messages"),
        DialectKind::Responses => Some("input"),
        DialectKind::Completions => None,
    }
}

/// The `end` line: what a released session adds last.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogEnd {
    /// When the session was released, seconds since the Unix epoch.
    pub ended_at: f64,
    /// Why the rollout stopped, if it did.
    pub stop_condition: Option<String>,
    /// Calls recorded.
    pub calls: u64,
    /// SDK retries answered without an upstream call.
    pub replays: u64,
    /// The episode's counts.
    pub summary: EpisodeSummary,
}

/// Bytes the log wrote, by kind of line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogBytes {
    /// `value` lines.
    pub values: u64,
    /// `node` lines.
    pub nodes: u64,
    /// `call` lines.
    pub calls: u64,
}

/// Writes a session's log, call by call (see the module docs). It holds the episode's
/// graph and what it needs to write each value once and each conversation as what it
/// adds: memory linear in the rollout's unique content, never in its calls' bodies.
#[derive(Debug)]
pub struct LogWriter {
    session: String,
    episode: EpisodeBuilder,
    values: encode::Values,
    wire: Wire,
    /// Nodes of `episode` written so far.
    nodes_written: usize,
    bytes: LogBytes,
}

/// The conversations of the calls so far, as a trie of their elements' raw text, to
/// find the earlier call a conversation extends.
#[derive(Debug, Default)]
struct Wire {
    /// (trie parent + 1, element hash, element length) → trie node.
    trie: HashMap<(u32, u128, u32), u32, foldhash::fast::RandomState>,
    /// Per trie node: a call whose conversation passes through it.
    owner: Vec<u64>,
    /// The last conversation written: one that starts with its bytes is read from there.
    last: Option<LastArray>,
    seed: u64,
}

#[derive(Debug)]
struct LastArray {
    raw: Bytes,
    /// Its elements' trie nodes.
    path: Vec<u32>,
    seq: u64,
}

impl Wire {
    fn hash(&mut self, element: &[u8]) -> u128 {
        if self.seed == 0 {
            use std::hash::{BuildHasher as _, RandomState};
            self.seed = RandomState::new().hash_one(0x7769_7265_u64) | 1;
        }
        xxhash_rust::xxh3::xxh3_128_with_seed(element, self.seed)
    }

    /// The trie node after `parent` for `element`, made (owned by call `seq`) if new.
    fn step(&mut self, parent: Option<u32>, element: &[u8], seq: u64, add: bool) -> Option<u32> {
        let key = (
            parent.map_or(0, |p| p + 1),
            self.hash(element),
            element.len() as u32,
        );
        if let Some(&n) = self.trie.get(&key) {
            return Some(n);
        }
        if !add {
            return None;
        }
        let n = self.owner.len() as u32;
        self.owner.push(seq);
        self.trie.insert(key, n);
        Some(n)
    }
}

impl LogWriter {
    /// An empty log of session `session`.
    pub fn new(session: &str) -> Self {
        LogWriter {
            session: session.to_owned(),
            episode: EpisodeBuilder::new(),
            values: Default::default(),
            wire: Wire::default(),
            nodes_written: 0,
            bytes: LogBytes::default(),
        }
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The header line (with its newline): the schema, the session id, when it was
    /// made and `settings` (the session's model, sampling, limits, ...).
    pub fn header(&self, settings: serde_json::Value) -> Vec<u8> {
        #[derive(Serialize)]
        struct Header<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            schema: &'static str,
            session: &'a str,
            created_at: f64,
            version: &'static str,
            settings: serde_json::Value,
        }
        let header = Header {
            kind: "header",
            schema: SCHEMA,
            session: &self.session,
            created_at: crate::record::epoch_seconds(std::time::SystemTime::now()),
            version: env!("CARGO_PKG_VERSION"),
            settings,
        };
        line_of(&header)
    }

    /// The end line (with its newline).
    pub fn end(&self, end: &LogEnd) -> Vec<u8> {
        #[derive(Serialize)]
        struct End<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            #[serde(flatten)]
            end: &'a LogEnd,
        }
        line_of(&End { kind: "end", end })
    }

    /// Commits one call: adds it to the episode (its node id is returned, and set on the
    /// record) and appends the lines it adds to `out`: new values, new nodes, then its
    /// call line.
    pub fn record(&mut self, record: &mut CallRecord, out: &mut Vec<u8>) -> Option<u64> {
        let node = self.episode.commit_taking(record);
        record.node = node;
        let mut defs = Vec::new();
        // New nodes.
        let mut nodes = Vec::new();
        while self.nodes_written < self.episode.len() {
            let id = self.nodes_written;
            self.nodes_written += 1;
            let mut enc = encode::Encoder {
                values: &mut self.values,
                defs: &mut defs,
            };
            let at = nodes.len();
            if self
                .episode
                .write_node_line(id, &mut enc, &mut nodes)
                .is_err()
            {
                // A message serde wrote is valid JSON: this does not happen; the node is
                // left out rather than written torn.
                nodes.truncate(at);
            }
        }
        // The call: its bodies first (a body that cannot be written changes its error).
        let tokens_on_node = node.and_then(|n| self.episode.node_tokens(n as usize));
        let prompt = node.and_then(|n| self.episode.node_parent(n as usize));
        let mut enc = encode::Encoder {
            values: &mut self.values,
            defs: &mut defs,
        };
        let mut request = Vec::with_capacity(256);
        let mut failed = None;
        if self.wire.request(record, &mut enc, &mut request).is_err() {
            // The request was read as UTF-8 JSON when it arrived: not expected.
            request.clear();
            request.extend_from_slice(b"{}");
            failed = Some("the request");
        }
        let mut answer = Vec::with_capacity(256);
        match &record.response {
            None => answer.extend_from_slice(b"null"),
            Some(r) => {
                if response(r.bytes(), &mut enc, &mut answer).is_err() {
                    answer.clear();
                    answer.extend_from_slice(b"null");
                    failed = failed.or(Some("the response"));
                }
            }
        }
        let error = failed.map(|what| CallError {
            kind: crate::ErrorKind::Internal,
            message: format!(
                "the record of this call could not be serialised: {what} is not UTF-8 JSON"
            ),
            status: record.status,
        });
        let mut call = Vec::with_capacity(512 + request.len() + answer.len());
        call_meta(record, prompt, tokens_on_node, error.as_ref(), &mut call);
        call.extend_from_slice(b",\"request\":");
        call.extend_from_slice(&request);
        call.extend_from_slice(b",\"response\":");
        call.extend_from_slice(&answer);
        call.extend_from_slice(b"}\n");
        self.bytes.values += defs.len() as u64;
        self.bytes.nodes += nodes.len() as u64;
        self.bytes.calls += call.len() as u64;
        out.reserve(defs.len() + nodes.len() + call.len());
        out.extend_from_slice(&defs);
        out.extend_from_slice(&nodes);
        out.extend_from_slice(&call);
        node
    }

    /// The episode so far.
    pub fn episode(&self) -> Episode {
        self.episode.episode(&self.session)
    }

    /// The episode's counts so far.
    pub fn summary(&self) -> EpisodeSummary {
        self.episode.summary()
    }

    /// Bytes written so far, by kind of line.
    pub fn bytes(&self) -> LogBytes {
        self.bytes
    }

    /// Heap bytes held: the graph, the value and conversation indexes.
    pub fn heap_bytes(&self) -> usize {
        self.episode.heap_bytes()
            + self.values.heap_bytes()
            + self.wire.trie.capacity() * 29
            + self.wire.owner.capacity() * 8
            + self.wire.last.as_ref().map_or(0, |l| l.path.capacity() * 4)
    }
}

impl Wire {
    /// Writes a request: its members in order, the conversation by [`Wire::array`], the
    /// others by [`encode::Encoder::member`].
    fn request(
        &mut self,
        record: &CallRecord,
        enc: &mut encode::Encoder<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), encode::Invalid> {
        out.push(b'{');
        let conv = conversation_member(record.dialect);
        for (i, (key, raw)) in record.request.members().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            crate::json_text::write_str(out, key);
            out.push(b':');
            if conv == Some(key) && raw.first() == Some(&b'[') {
                let raw = record.request.raw_bytes(key).unwrap_or_default();
                self.array(record.seq, raw, enc, out)?;
            } else {
                enc.member(raw, out, 3)?;
            }
        }
        out.push(b'}');
        Ok(())
    }

    /// Writes a conversation as `{"$a":{"base":S,"keep":K,"add":[…]}}`: the first `K`
    /// elements of call `S`'s conversation, then the elements added.
    fn array(
        &mut self,
        seq: u64,
        raw: Bytes,
        enc: &mut encode::Encoder<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), encode::Invalid> {
        let wire = self;
        let continued = wire
            .last
            .as_ref()
            .filter(|l| !l.path.is_empty())
            .and_then(|l| {
                let tail = crate::episode::appended(&l.raw, &raw)?;
                Some((l.seq, l.path.clone(), tail))
            });
        let (base, mut path, added): (Option<u64>, Vec<u32>, Vec<u8>) = match continued {
            Some((seq, path, tail)) => {
                let mut array = Vec::with_capacity(tail.len() + 1);
                array.push(b'[');
                if tail.is_empty() {
                    array.push(b']');
                } else {
                    array.extend_from_slice(tail);
                }
                (Some(seq), path, array)
            }
            None => {
                let elements = encode::elements(&raw).ok_or(encode::Invalid)?;
                let mut path = Vec::new();
                let mut parent = None;
                for e in &elements {
                    match wire.step(parent, e, seq, false) {
                        Some(n) => {
                            path.push(n);
                            parent = Some(n);
                        }
                        None => break,
                    }
                }
                let base = path.last().map(|&n| wire.owner[n as usize]);
                let mut rest = Vec::with_capacity(raw.len());
                rest.push(b'[');
                for (i, e) in elements[path.len()..].iter().enumerate() {
                    if i > 0 {
                        rest.push(b',');
                    }
                    rest.extend_from_slice(e);
                }
                rest.push(b']');
                (base, path, rest)
            }
        };
        let keep = path.len();
        out.extend_from_slice(b"{\"$a\":{\"base\":");
        match base {
            Some(s) => out.extend_from_slice(itoa::Buffer::new().format(s).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"keep\":");
        out.extend_from_slice(itoa::Buffer::new().format(keep).as_bytes());
        out.extend_from_slice(b",\"add\":[");
        let elements = encode::elements(&added).ok_or(encode::Invalid)?;
        for (i, e) in elements.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            enc.value(e, 0, out, 6)?;
            let n = wire.step(path.last().copied(), e, seq, true);
            path.extend(n);
        }
        out.extend_from_slice(b"]}}");
        wire.last = Some(LastArray { raw, path, seq });
        Ok(())
    }
}

/// A response: an object's large members written once as a whole, everything else as
/// the encoder writes it.
fn response(
    raw: &[u8],
    enc: &mut encode::Encoder<'_>,
    out: &mut Vec<u8>,
) -> Result<(), encode::Invalid> {
    std::str::from_utf8(raw).map_err(|_| encode::Invalid)?;
    let members = object_members(raw);
    match members {
        Some(members) => {
            out.push(b'{');
            let escaped = members.len() == 1 && {
                let key = serde_json::from_slice::<String>(members[0].0).unwrap_or_default();
                encode::MARKERS.contains(&key.as_str())
            };
            if escaped {
                out.extend_from_slice(b"\"$e\":{");
            }
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(key);
                out.push(b':');
                let depth = 3 + usize::from(escaped);
                if ANSWERS.contains(key) {
                    // The answer itself is new with every call: its long strings are
                    // values (the episode's node and the next request share them), the
                    // rest stands in the line.
                    let end = enc.value(value, 0, out, depth)?;
                    if end != value.len() {
                        return Err(encode::Invalid);
                    }
                } else {
                    enc.member(value, out, depth)?;
                }
            }
            if escaped {
                out.push(b'}');
            }
            out.push(b'}');
            Ok(())
        }
        None => enc.member(raw, out, 2),
    }
}

/// The response members that hold the answer (Chat and Completions `choices`,
/// Responses `output`, Messages `content`), as their keys' JSON text.
const ANSWERS: [&[u8]; 3] = [b"\"choices\"", b"\"output\"", b"\"content\""];

/// An object's members (each key's string token, quotes included, and its value's
/// text); `None` when the text is not an object.
fn object_members(raw: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let ws = |mut i: usize| {
        while i < raw.len() && raw[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut at = ws(0);
    if raw.get(at) != Some(&b'{') {
        return None;
    }
    let mut out = Vec::new();
    at = ws(at + 1);
    if raw.get(at) == Some(&b'}') {
        return Some(out);
    }
    loop {
        let key_end = encode::skip_value(raw, at).ok()?;
        if raw.get(at) != Some(&b'"') {
            return None;
        }
        let key = &raw[at..key_end];
        at = ws(key_end);
        if raw.get(at) != Some(&b':') {
            return None;
        }
        let start = ws(at + 1);
        let end = encode::skip_value(raw, start).ok()?;
        out.push((key, &raw[start..end]));
        at = ws(end);
        match raw.get(at)? {
            b',' => at = ws(at + 1),
            b'}' => return Some(out),
            _ => return None,
        }
    }
}

/// Which token data a sampled node holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeTokens {
    /// Its completion's logprobs.
    pub(crate) logprobs: bool,
}

/// Writes a call line's fields before its bodies, without the closing brace.
fn call_meta(
    record: &CallRecord,
    prompt: Option<u32>,
    tokens_on_node: Option<NodeTokens>,
    error: Option<&CallError>,
    call: &mut Vec<u8>,
) {
    let on_node = tokens_on_node.is_some();
    let logprobs_on_node = tokens_on_node.is_some_and(|t| t.logprobs);
    let meta = CallMeta {
        kind: "call",
        seq: record.seq,
        dialect: record.dialect,
        endpoint: &record.endpoint,
        model: &record.model,
        requested_model: record.requested_model.as_deref(),
        stream: record.stream,
        sampling: &record.sampling,
        finish_reason: record.finish_reason.as_deref(),
        usage: &record.usage,
        status: record.status,
        started_at: record.started_at,
        ended_at: record.ended_at,
        ttfb_ms: record.ttfb_ms,
        client_disconnected: record.client_disconnected,
        error: error.or(record.error.as_ref()),
        epoch: record.epoch,
        engine: record.engine.as_deref(),
        token_capture: record.token_capture,
        prompt_token_ids: record.prompt_token_ids.as_deref().filter(|_| !on_node),
        completion_token_ids: record.completion_token_ids.as_deref().filter(|_| !on_node),
        completion_logprobs: record
            .completion_logprobs
            .as_deref()
            .filter(|_| !logprobs_on_node),
        node: record.node,
        prompt,
        policy: record.policy.as_ref(),
        truncated: record.truncated,
    };
    // Plain data: serialising it cannot fail (a float that is not finite is `null`).
    if serde_json::to_writer(&mut *call, &meta).is_err() {
        call.clear();
        call.extend_from_slice(b"{\"type\":\"call\"}");
    }
    call.pop(); // the closing brace
}

/// A call line's fields before its bodies.
#[derive(Serialize)]
struct CallMeta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    seq: u64,
    dialect: DialectKind,
    endpoint: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    requested_model: Option<&'a str>,
    stream: bool,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    sampling: &'a serde_json::Map<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'a str>,
    usage: &'a Usage,
    status: u16,
    started_at: f64,
    ended_at: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttfb_ms: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    client_disconnected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a CallError>,
    #[serde(skip_serializing_if = "is_zero")]
    epoch: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<&'a str>,
    #[serde(skip_serializing_if = "is_off")]
    token_capture: TokenCapture,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_token_ids: Option<&'a [u32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_logprobs: Option<&'a [f64]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a crate::network::PolicyEvent>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_off(c: &TokenCapture) -> bool {
    *c == TokenCapture::Off
}

/// A line of plain data, with its newline.
fn line_of<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
