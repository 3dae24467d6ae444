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
//! - `node`: a message joining the episode's graph ([`crate::trace::episode`]), written once,
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
//! #         completion_token_ids: None, completion_logprobs: None, token_path: None,
//! #         token_reason: None, node: None,
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

use crate::trace::episode::{Episode, EpisodeBuilder, EpisodeSummary};
use crate::trace::record::{CallError, CallRecord, LastFields};
use crate::DialectKind;

pub(crate) mod encode;
pub(crate) mod lines;
mod read;

pub use read::{LogCall, LogError, LogReader};

/// The log format's name and version, the `schema` of its header line. A reader
/// refuses a log whose schema it does not know.
pub const SCHEMA: &str = "intercept.trace/3";

/// The earlier versions of the format this reader also reads (see `docs/traces.md`).
pub const EARLIER_SCHEMAS: [&str; 1] = ["intercept.trace/2"];

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
    #[serde(default)]
    pub replays: u64,
    /// The episode's counts (not written: a reader counts them from the log).
    #[serde(default)]
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
    /// The last call line's fields (a call line leaves out what it repeats), and the
    /// buffer the next one's are written into.
    last_fields: LastFields,
    spare_fields: LastFields,
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

/// The elements a conversation adds to an earlier call's: how many, and their text (a
/// JSON array).
#[derive(Debug)]
struct Added {
    count: usize,
    text: String,
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
            last_fields: LastFields::default(),
            spare_fields: LastFields::default(),
            bytes: LogBytes::default(),
        }
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The header line (with its newline): the schema, the session id, when it was
    /// made (now) and `settings` (the session's model, sampling, limits, ...).
    pub fn header(&self, settings: serde_json::Value) -> Vec<u8> {
        let now = crate::trace::record::epoch_seconds(std::time::SystemTime::now());
        header_line(&self.session, now, settings)
    }

    /// The end line (with its newline).
    pub fn end(&self, end: &LogEnd) -> Vec<u8> {
        end_line(end)
    }

    /// Commits one call: adds it to the episode (its node id is returned, and set on the
    /// record) and appends the lines it adds to `out`: new values, new nodes, then its
    /// call line.
    pub fn record(&mut self, record: &mut CallRecord, out: &mut Vec<u8>) -> Option<u64> {
        let before = self.episode.len();
        let node = self.episode.commit_taking(record);
        record.node = node;
        let mut defs = Vec::new();
        // The call line first: what it holds decides where the nodes' messages are read.
        let tokens_on_node = node.and_then(|n| lines::node_tokens(&self.episode, n as usize));
        let mut enc = encode::Encoder {
            values: &mut self.values,
            defs: &mut defs,
        };
        let body_len =
            record.request.source().len() + record.response.as_ref().map_or(0, |r| r.bytes().len());
        let mut call = Vec::with_capacity(512 + body_len.min(8192));
        let mut fields = std::mem::take(&mut self.spare_fields);
        let last = &self.last_fields;
        lines::call_meta(record, tokens_on_node, None, (last, &mut fields), &mut call);
        let head = call.len();
        let mut failed = None;
        call.extend_from_slice(b",\"request\":");
        let at = call.len();
        let added = match self.wire.request(record, &mut enc, &mut call) {
            Ok(added) => added,
            Err(_) => {
                // The request was read as UTF-8 JSON when it arrived: not expected.
                call.truncate(at);
                call.extend_from_slice(b"{}");
                failed = Some("the request");
                None
            }
        };
        call.extend_from_slice(b",\"response\":");
        let at = call.len();
        let mut answered = false;
        match &record.response {
            None => call.extend_from_slice(b"null"),
            Some(r) => {
                if response(r.bytes(), &mut enc, &mut call).is_err() {
                    call.truncate(at);
                    call.extend_from_slice(b"null");
                    failed = failed.or(Some("the response"));
                } else {
                    answered = true;
                }
            }
        }
        call.extend_from_slice(b"}\n");
        if let Some(what) = failed {
            // A body that cannot be written changes the call's error.
            let error = CallError {
                kind: crate::ErrorKind::Internal,
                message: format!(
                    "the record of this call could not be serialised: {what} is not UTF-8 JSON"
                ),
                status: record.status,
            };
            let mut meta = Vec::with_capacity(head + 128);
            lines::call_meta(
                record,
                tokens_on_node,
                Some(&error),
                (last, &mut fields),
                &mut meta,
            );
            call.splice(..head, meta);
        }
        self.spare_fields = std::mem::replace(&mut self.last_fields, fields);
        // New nodes. Those this call made take their messages from its line where they
        // are there: the sampled one from the response, a prompt's from the elements its
        // conversation adds.
        let made = before..self.episode.len();
        let from = self.prompt_sources(record, node.is_some(), made.clone(), added.as_ref());
        let mut nodes = Vec::with_capacity(if self.nodes_written < self.episode.len() {
            256
        } else {
            0
        });
        let mut prompt_at = 0;
        while self.nodes_written < self.episode.len() {
            let id = self.nodes_written;
            self.nodes_written += 1;
            let sampled = self.episode.node_data(id).sampled;
            let source = if !made.contains(&id) {
                lines::Source::Line
            } else if sampled {
                if answered && node == Some(id as u64) {
                    lines::Source::Response
                } else {
                    lines::Source::Line
                }
            } else {
                prompt_at += 1;
                from.get(prompt_at - 1)
                    .copied()
                    .flatten()
                    .map_or(lines::Source::Line, lines::Source::Added)
            };
            #[cfg(debug_assertions)]
            self.check_source(record, added.as_ref().map(|a| a.count), id, source);
            let mut enc = encode::Encoder {
                values: &mut self.values,
                defs: &mut defs,
            };
            let at = nodes.len();
            if lines::node(&self.episode, id, source, &mut enc, &mut nodes).is_err() {
                // A message's data is valid JSON: this does not happen; the node is left
                // out rather than written torn.
                nodes.truncate(at);
            }
        }
        self.bytes.values += defs.len() as u64;
        self.bytes.nodes += nodes.len() as u64;
        self.bytes.calls += call.len() as u64;
        out.reserve(defs.len() + nodes.len() + call.len());
        out.extend_from_slice(&defs);
        out.extend_from_slice(&nodes);
        out.extend_from_slice(&call);
        node
    }

    /// Where each prompt node a call made (those of `made` that are not sampled, in
    /// order) reads its message: message `i` of those its conversation's added elements
    /// read as, or `None` (the node line holds it). The new nodes end the prompt; in Chat
    /// an element is one message, so the index says it, in the other dialects (whose
    /// elements and messages do not match one to one) the message read is compared.
    fn prompt_sources(
        &self,
        record: &CallRecord,
        made_node: bool,
        made: std::ops::Range<usize>,
        added: Option<&Added>,
    ) -> Vec<Option<usize>> {
        let prompt = made.filter(|&id| !self.episode.node_data(id).sampled);
        let n = prompt.clone().count();
        let (Some(added), true, false) = (added, made_node, n == 0) else {
            return Vec::new();
        };
        // The k-th of the n new prompt nodes is message `read - n + k` of the `read` ones
        // the added elements give, when there is one (the first new nodes may come from
        // elements kept, or from a system prompt outside the conversation).
        let at = |read: usize, k: usize| (read + k).checked_sub(n);
        match record.dialect {
            DialectKind::ChatCompletions => (0..n).map(|k| at(added.count, k)).collect(),
            DialectKind::Messages | DialectKind::Responses => {
                let Ok(elements) = serde_json::from_str::<Vec<serde_json::Value>>(&added.text)
                else {
                    return Vec::new();
                };
                let read = crate::trace::episode::conversation_messages(record.dialect, &elements);
                prompt
                    .enumerate()
                    .map(|(k, id)| {
                        at(read.len(), k).filter(|&i| read[i] == self.episode.node_data(id).message)
                    })
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// Debug builds: a node's message is what its reader gets from where `source` says
    /// (`added`: how many elements the call's conversation adds).
    #[cfg(debug_assertions)]
    fn check_source(
        &self,
        record: &CallRecord,
        added: Option<usize>,
        id: usize,
        source: lines::Source,
    ) {
        let message = &self.episode.node_data(id).message;
        let read = match source {
            lines::Source::Line => return,
            lines::Source::Response => record.response.as_ref().and_then(|r| {
                let value: serde_json::Value = serde_json::from_slice(r.bytes()).ok()?;
                crate::trace::episode::sampled_message(record.dialect, &value)
            }),
            lines::Source::Added(i) => {
                let key = conversation_member(record.dialect).unwrap_or("messages");
                record
                    .request
                    .raw(key)
                    .and_then(|raw| serde_json::from_slice::<Vec<serde_json::Value>>(raw).ok())
                    .and_then(|all| {
                        let first = all.len().checked_sub(added?)?;
                        crate::trace::episode::conversation_messages(record.dialect, &all[first..])
                            .into_iter()
                            .nth(i)
                    })
            }
        };
        debug_assert!(
            read.as_ref() == Some(message),
            "node {id}: {source:?} reads {read:?}, not {message:?}"
        );
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
            + self.last_fields.heap_bytes()
            + self.spare_fields.heap_bytes()
    }
}

/// The end line, with its newline (see [`LogWriter::end`]). The summary is left out (a
/// reader counts it from the lines before), as are `stop_condition` when there is none
/// and `replays` when 0.
pub fn end_line(end: &LogEnd) -> Vec<u8> {
    #[derive(Serialize)]
    struct End<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        ended_at: f64,
        #[serde(skip_serializing_if = "Option::is_none")]
        stop_condition: &'a Option<String>,
        calls: u64,
        #[serde(skip_serializing_if = "is_zero")]
        replays: u64,
    }
    fn is_zero(n: &u64) -> bool {
        *n == 0
    }
    line_of(&End {
        kind: "end",
        ended_at: end.ended_at,
        stop_condition: &end.stop_condition,
        calls: end.calls,
        replays: end.replays,
    })
}

/// `value` without its members that are `null`, at any depth, nor the objects that
/// leaves empty.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .filter(|(_, v)| v.as_object().is_none_or(|o| !o.is_empty()))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// The header line of session `session` made at `created_at` (seconds since the Unix
/// epoch), with its newline (see [`LogWriter::header`]); members of `settings` that are
/// `null` are left out.
pub(crate) fn header_line(session: &str, created_at: f64, settings: serde_json::Value) -> Vec<u8> {
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
    line_of(&Header {
        kind: "header",
        schema: SCHEMA,
        session,
        created_at,
        version: env!("CARGO_PKG_VERSION"),
        settings: without_nulls(settings),
    })
}

impl Wire {
    /// Writes a request: its members in order, the conversation by [`Wire::array`], the
    /// others by [`encode::Encoder::member`]. Returns what the conversation adds (`None`
    /// without one).
    fn request(
        &mut self,
        record: &CallRecord,
        enc: &mut encode::Encoder<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Option<Added>, encode::Invalid> {
        let mut added = None;
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
                added = Some(self.array(record.seq, raw, enc, out)?);
            } else {
                let raw = simdutf8::basic::from_utf8(raw).map_err(|_| encode::Invalid)?;
                enc.member(raw, out, 3)?;
            }
        }
        out.push(b'}');
        Ok(added)
    }

    /// Writes a conversation as `{"$a":{"base":S,"keep":K,"add":[…]}}`: the first `K`
    /// elements of call `S`'s conversation, then the elements added (`{"$a":{"add":[…]}}`
    /// when it keeps none). Returns what it adds.
    fn array(
        &mut self,
        seq: u64,
        raw: Bytes,
        enc: &mut encode::Encoder<'_>,
        out: &mut Vec<u8>,
    ) -> Result<Added, encode::Invalid> {
        let wire = self;
        // A conversation that extends the last one byte for byte: only its tail is read.
        let last = wire.last.take();
        let continued = last.filter(|l| !l.path.is_empty()).and_then(|l| {
            let tail = crate::trace::episode::appended(&l.raw, &raw)?;
            Some((l.seq, l.path, tail))
        });
        let (base, mut path, added): (Option<u64>, Vec<u32>, String) = match continued {
            Some((seq, path, tail)) => {
                let tail = simdutf8::basic::from_utf8(tail).map_err(|_| encode::Invalid)?;
                let mut array = String::with_capacity(tail.len() + 1);
                array.push('[');
                if tail.is_empty() {
                    array.push(']');
                } else {
                    array.push_str(tail);
                }
                (Some(seq), path, array)
            }
            None => {
                let text = simdutf8::basic::from_utf8(&raw).map_err(|_| encode::Invalid)?;
                let elements = crate::json_text::elements(text).ok_or(encode::Invalid)?;
                let mut path = Vec::new();
                let mut parent = None;
                for e in &elements {
                    match wire.step(parent, e.as_bytes(), seq, false) {
                        Some(n) => {
                            path.push(n);
                            parent = Some(n);
                        }
                        None => break,
                    }
                }
                let base = path.last().map(|&n| wire.owner[n as usize]);
                let mut rest = String::with_capacity(raw.len());
                rest.push('[');
                for (i, e) in elements[path.len()..].iter().enumerate() {
                    if i > 0 {
                        rest.push(',');
                    }
                    rest.push_str(e);
                }
                rest.push(']');
                (base, path, rest)
            }
        };
        let keep = path.len();
        out.extend_from_slice(b"{\"$a\":{");
        if let (Some(s), true) = (base, keep > 0) {
            out.extend_from_slice(b"\"base\":");
            out.extend_from_slice(itoa::Buffer::new().format(s).as_bytes());
            out.extend_from_slice(b",\"keep\":");
            out.extend_from_slice(itoa::Buffer::new().format(keep).as_bytes());
            out.push(b',');
        }
        out.extend_from_slice(b"\"add\":[");
        let elements = crate::json_text::elements(&added).ok_or(encode::Invalid)?;
        let count = elements.len();
        for (i, e) in elements.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            enc.value(e, 0, out, 6)?;
            let n = wire.step(path.last().copied(), e.as_bytes(), seq, true);
            path.extend(n);
        }
        out.extend_from_slice(b"]}}");
        wire.last = Some(LastArray { raw, path, seq });
        Ok(Added { count, text: added })
    }
}

/// A response: an object's large members written once as a whole, everything else as
/// the encoder writes it, in one pass over its text.
fn response(
    raw: &[u8],
    enc: &mut encode::Encoder<'_>,
    out: &mut Vec<u8>,
) -> Result<(), encode::Invalid> {
    use encode::{skip_value, ws, Invalid};
    let text = simdutf8::basic::from_utf8(raw).map_err(|_| Invalid)?;
    let start = ws(raw, 0);
    if raw.get(start) != Some(&b'{') {
        return enc.member(text, out, 2);
    }
    enc.object_with(text, start, out, 2, |enc, key, at, out, depth| {
        if ANSWERS.contains(&key) {
            // The answer itself is new with every call: its long strings are values
            // (the episode's node and the next request share them), the rest stands in
            // the line.
            enc.value(text, at, out, depth)
        } else {
            let end = skip_value(raw, at)?;
            enc.member(&text[at..end], out, depth)?;
            Ok(end)
        }
    })
    .map(drop)
}

/// The response members that hold the answer (Chat and Completions `choices`,
/// Responses `output`, Messages `content`), as their keys' JSON text.
const ANSWERS: [&[u8]; 3] = [b"\"choices\"", b"\"output\"", b"\"content\""];

/// Which token data a sampled node holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeTokens {
    /// Its completion's logprobs.
    pub(crate) logprobs: bool,
}

/// A line of plain data, with its newline.
fn line_of<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
