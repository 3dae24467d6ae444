//! Reading a log back: records rebuilt on demand, the episode, and what the log is.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::trace::episode::{Episode, EpisodeBuilder, Message, Node, TokenBreak};
use crate::trace::record::{CallRecord, Omit, CALL_FIELDS};

use super::{LogEnd, SCHEMA};

/// A call's prompt ids, completion ids and completion logprobs.
type CallTokens = (Vec<u32>, Vec<u32>, Option<Vec<f64>>);
/// What is wrong with a log (or with one of its lines).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// A line is not JSON, or not a line of this format.
    #[error("line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The header names a schema this reader does not know.
    #[error(
        "the log's schema is {found:?}, which this reader does not know (it reads {SCHEMA:?}); \
         read it with the intercept version that wrote it, or a newer one"
    )]
    Schema {
        /// The schema the header names.
        found: String,
    },
    /// A call cannot be rebuilt from the lines before it.
    #[error("call {seq}: {message}")]
    Call {
        /// The call's `seq`.
        seq: u64,
        /// What is missing.
        message: String,
    },
    /// No call has this index.
    #[error("the log has {calls} calls; there is no call {index}")]
    NoCall {
        /// The index asked for.
        index: usize,
        /// Calls in the log.
        calls: usize,
    },
}

/// One `call` line, as read: its record is rebuilt by [`LogReader::record`].
#[derive(Debug, Clone)]
pub struct LogCall {
    /// The call's `seq`.
    pub seq: u64,
    /// The node of its sampled answer (`None`: failed, unreadable, or no episode).
    pub node: Option<u64>,
    /// The node of its prompt's last message (`None` when it made no node).
    pub prompt: Option<u32>,
    /// 1-based line number in the log.
    pub line: usize,
    /// The line's fields, bodies encoded.
    fields: Map<String, Value>,
}

/// A log read line by line (see [`super`]): tolerates a torn last line, skips (and
/// reports) lines it cannot read, and rebuilds each call's record on demand.
#[derive(Debug, Default)]
pub struct LogReader {
    header: Option<Value>,
    values: Vec<Value>,
    nodes: Vec<Node>,
    calls: Vec<LogCall>,
    by_seq: HashMap<u64, usize>,
    end: Option<LogEnd>,
    lines: usize,
    skipped: Vec<(usize, String)>,
    torn: bool,
    bytes: u64,
}

impl LogReader {
    /// An empty reader; feed it lines with [`LogReader::push_line`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a whole log's text. A last line without its newline is torn (a crash, or a
    /// writer still writing): it is left out, and the log reads as incomplete. Lines that
    /// cannot be read are skipped and listed ([`LogReader::skipped`]); a header of an
    /// unknown schema is an error.
    pub fn from_bytes(text: &[u8]) -> Result<Self, LogError> {
        let mut reader = LogReader::new();
        let mut rest = text;
        while !rest.is_empty() {
            match memchr::memchr(b'\n', rest) {
                Some(i) => {
                    reader.push_line(&rest[..i])?;
                    rest = &rest[i + 1..];
                }
                None => {
                    reader.lines += 1;
                    reader.torn = true;
                    reader.bytes += rest.len() as u64;
                    reader
                        .skipped
                        .push((reader.lines, "torn: the line has no end".into()));
                    break;
                }
            }
        }
        Ok(reader)
    }

    /// Reads one line (without its newline). A line that cannot be read is skipped and
    /// listed; only a header of an unknown schema fails.
    pub fn push_line(&mut self, line: &[u8]) -> Result<(), LogError> {
        self.lines += 1;
        self.bytes += line.len() as u64 + 1;
        let n = self.lines;
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        match self.read_line(line) {
            Ok(()) => Ok(()),
            Err(e @ LogError::Schema { .. }) => Err(e),
            Err(e) => {
                self.skipped.push((n, e.to_string()));
                Ok(())
            }
        }
    }

    fn bad(&self, message: impl Into<String>) -> LogError {
        LogError::Line {
            line: self.lines,
            message: message.into(),
        }
    }

    fn read_line(&mut self, line: &[u8]) -> Result<(), LogError> {
        let value: Value =
            serde_json::from_slice(line).map_err(|e| self.bad(format!("not JSON: {e}")))?;
        let Value::Object(mut fields) = value else {
            return Err(self.bad("not a JSON object"));
        };
        let kind = match fields.remove("type") {
            Some(Value::String(s)) => s,
            _ => return Err(self.bad("no \"type\"")),
        };
        match kind.as_str() {
            "header" => {
                let schema = fields.get("schema").and_then(Value::as_str).unwrap_or("");
                if schema != SCHEMA {
                    return Err(LogError::Schema {
                        found: schema.to_owned(),
                    });
                }
                self.header = Some(Value::Object(fields));
            }
            "value" => {
                let id = fields.get("id").and_then(Value::as_u64);
                if id != Some(self.values.len() as u64) {
                    return Err(self.bad(format!(
                        "value {id:?} out of order (the next is {})",
                        self.values.len()
                    )));
                }
                let value = fields.remove("value").unwrap_or(Value::Null);
                let value = self.decode(value, None).map_err(|m| self.bad(m))?;
                self.values.push(value);
            }
            "node" => {
                let node = self.node(fields).map_err(|m| self.bad(m))?;
                if node.id as usize != self.nodes.len() {
                    return Err(self.bad(format!(
                        "node {} out of order (the next is {})",
                        node.id,
                        self.nodes.len()
                    )));
                }
                self.nodes.push(node);
            }
            "call" => {
                let seq = fields
                    .get("seq")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| self.bad("a call without \"seq\""))?;
                let call = LogCall {
                    seq,
                    node: fields.get("node").and_then(Value::as_u64),
                    prompt: fields
                        .get("prompt")
                        .and_then(Value::as_u64)
                        .map(|p| p as u32),
                    line: self.lines,
                    fields,
                };
                self.by_seq.insert(seq, self.calls.len());
                self.calls.push(call);
            }
            "end" => {
                let end: LogEnd = serde_json::from_value(Value::Object(fields))
                    .map_err(|e| self.bad(format!("end: {e}")))?;
                self.end = Some(end);
            }
            other => return Err(self.bad(format!("unknown line type {other:?}"))),
        }
        Ok(())
    }

    fn node(&self, mut f: Map<String, Value>) -> Result<Node, String> {
        let id = f
            .get("id")
            .and_then(Value::as_u64)
            .ok_or("a node without id")? as u32;
        let message = self.decode(f.remove("message").unwrap_or(Value::Null), None)?;
        let message: Message =
            serde_json::from_value(message).map_err(|e| format!("node {id}: message: {e}"))?;
        let ids: Option<Vec<u32>> = match f.remove("token_ids") {
            Some(v) => Some(serde_json::from_value(v).map_err(|e| e.to_string())?),
            None => None,
        };
        let prompt = f.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
        let completion_logprobs: Option<Vec<f64>> = match f.remove("logprobs") {
            Some(v) => Some(serde_json::from_value(v).map_err(|e| e.to_string())?),
            None => None,
        };
        let token_break: Option<TokenBreak> = match f.remove("token_break") {
            Some(v) => Some(serde_json::from_value(v).map_err(|e| e.to_string())?),
            None => None,
        };
        let (mask, logprobs) = match &ids {
            Some(ids) => {
                let prompt = prompt.min(ids.len());
                let mask = (0..ids.len()).map(|j| j >= prompt).collect();
                let logprobs = completion_logprobs.map(|l| {
                    let mut out = vec![0.0; prompt];
                    out.extend(l);
                    out
                });
                (Some(mask), logprobs)
            }
            None => (None, None),
        };
        Ok(Node {
            id,
            parent: f.get("parent").and_then(Value::as_u64).map(|p| p as u32),
            hash: f
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            message,
            sampled: f.get("sampled").and_then(Value::as_bool).unwrap_or(false),
            call: f.get("call").and_then(Value::as_u64),
            token_ids: ids,
            mask,
            logprobs,
            token_start: f
                .get("token_start")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            token_break,
        })
    }

    /// Decodes an encoded value: references, escapes, text, and (within `call`, the
    /// index of the call being rebuilt) conversations.
    fn decode(&self, value: Value, call: Option<usize>) -> Result<Value, String> {
        match value {
            Value::Array(items) => items
                .into_iter()
                .map(|v| self.decode(v, call))
                .collect::<Result<_, _>>()
                .map(Value::Array),
            Value::Object(map) if map.len() == 1 => {
                let (key, inner) = map.into_iter().next().unwrap_or_default();
                match key.as_str() {
                    "$v" => {
                        let id = inner.as_u64().ok_or("a reference that is not a number")?;
                        self.values
                            .get(id as usize)
                            .cloned()
                            .ok_or_else(|| format!("value {id} is referenced before it is written"))
                    }
                    "$e" => match inner {
                        Value::Object(members) => {
                            let mut out = Map::new();
                            for (k, v) in members {
                                out.insert(k, self.decode(v, call)?);
                            }
                            Ok(Value::Object(out))
                        }
                        _ => Err("an escape that is not an object".into()),
                    },
                    "$j" => {
                        let text = inner.as_str().ok_or("a text value that is not a string")?;
                        serde_json::from_str(text).map_err(|e| format!("a text value: {e}"))
                    }
                    "$a" => self.conversation(&inner, call),
                    _ => {
                        let mut out = Map::new();
                        out.insert(key, self.decode(inner, call)?);
                        Ok(Value::Object(out))
                    }
                }
            }
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    out.insert(k, self.decode(v, call)?);
                }
                Ok(Value::Object(out))
            }
            other => Ok(other),
        }
    }

    /// A conversation `{"base":S,"keep":K,"add":[…]}`: the first `K` elements of call
    /// `S`'s, then the elements added.
    fn conversation(&self, spec: &Value, call: Option<usize>) -> Result<Value, String> {
        let mut items = Vec::new();
        let mut chain = Vec::new();
        let mut at = Some(spec.clone());
        let mut guard = call;
        // Follow the bases back to the first (iteratively: a long rollout is a long chain).
        while let Some(spec) = at.take() {
            let keep = spec.get("keep").and_then(Value::as_u64).unwrap_or(0) as usize;
            let add = spec.get("add").cloned().unwrap_or(Value::Array(Vec::new()));
            chain.push((keep, add));
            let Some(base) = spec.get("base").and_then(Value::as_u64) else {
                break;
            };
            let &index = self.by_seq.get(&base).ok_or_else(|| {
                format!("the conversation extends call {base}, which is not in the log")
            })?;
            if guard.is_some_and(|g| index >= g) {
                return Err(format!(
                    "the conversation extends call {base}, which is not before it"
                ));
            }
            guard = Some(index);
            let base_spec = self.calls[index]
                .fields
                .get("request")
                .and_then(|r| r.as_object())
                .and_then(|r| {
                    r.values()
                        .find_map(|v| v.as_object().filter(|o| o.len() == 1)?.get("$a"))
                })
                .ok_or_else(|| format!("call {base} has no conversation"))?;
            at = Some(base_spec.clone());
        }
        for (keep, add) in chain.into_iter().rev() {
            if keep > items.len() {
                return Err(format!(
                    "the conversation keeps {keep} elements of one that has {}",
                    items.len()
                ));
            }
            items.truncate(keep);
            match self.decode(add, call)? {
                Value::Array(added) => items.extend(added),
                _ => return Err("a conversation's added elements are not an array".into()),
            }
        }
        Ok(Value::Array(items))
    }

    /// The header's fields (`schema`, `session`, `created_at`, `settings`), if read.
    pub fn header(&self) -> Option<&Value> {
        self.header.as_ref()
    }

    /// The session id (from the header, else `""`).
    pub fn session(&self) -> &str {
        self.header
            .as_ref()
            .and_then(|h| h.get("session"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The calls, in the order they were recorded.
    pub fn calls(&self) -> &[LogCall] {
        &self.calls
    }

    /// The nodes, in the order they joined the graph.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The end line, if the log has one.
    pub fn end(&self) -> Option<&LogEnd> {
        self.end.as_ref()
    }

    /// Whether the log is incomplete: no end line (the session crashed or still runs),
    /// no header, or a torn last line.
    pub fn incomplete(&self) -> bool {
        self.end.is_none() || self.header.is_none() || self.torn
    }

    /// Lines skipped: their 1-based numbers and why.
    pub fn skipped(&self) -> &[(usize, String)] {
        &self.skipped
    }

    /// Lines read (whole or torn).
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// Bytes read.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The values, decoded, in the order they were written.
    pub fn values(&self) -> &[Value] {
        &self.values
    }

    /// Call `index`'s record, rebuilt: its request and response JSON-equal to what went
    /// upstream and came back, its token ids from the nodes that hold them.
    pub fn record(&self, index: usize) -> Result<CallRecord, LogError> {
        let call = self.calls.get(index).ok_or(LogError::NoCall {
            index,
            calls: self.calls.len(),
        })?;
        let fail = |message: String| LogError::Call {
            seq: call.seq,
            message,
        };
        let mut fields = call.fields.clone();
        fields.remove("prompt");
        for key in ["request", "response"] {
            let v = fields.remove(key).unwrap_or(Value::Null);
            let v = self.decode(v, Some(index)).map_err(fail)?;
            fields.insert(key.into(), v);
        }
        fields.insert("session".into(), Value::String(self.session().to_owned()));
        // Fields a call line leaves out at their defaults (record/fields.rs).
        for f in CALL_FIELDS.iter().filter(|f| f.omit == Omit::InLog) {
            if !fields.contains_key(f.name) {
                let default = serde_json::from_str(f.default).unwrap_or(Value::Null);
                fields.insert(f.name.into(), default);
            }
        }
        if let Some(node) = call.node {
            let node = node as usize;
            if let Some((prompt, completion, logprobs)) = self.tokens_of(node) {
                fields
                    .entry("prompt_token_ids")
                    .or_insert_with(|| prompt.into());
                fields
                    .entry("completion_token_ids")
                    .or_insert_with(|| completion.into());
                if let Some(l) = logprobs {
                    fields
                        .entry("completion_logprobs")
                        .or_insert_with(|| l.into());
                }
            }
        }
        serde_json::from_value(Value::Object(fields)).map_err(|e| fail(e.to_string()))
    }

    /// Every call's record, rebuilt (see [`LogReader::record`]).
    pub fn records(&self) -> Result<Vec<CallRecord>, LogError> {
        (0..self.calls.len()).map(|i| self.record(i)).collect()
    }

    /// A sampled node's call's prompt ids, completion ids and completion logprobs, from
    /// the token data of the nodes of its sequence (see `docs/training-capture.md`).
    fn tokens_of(&self, node: usize) -> Option<CallTokens> {
        let n = self.nodes.get(node)?;
        let ids = n.token_ids.as_ref()?;
        let split = n
            .mask
            .as_ref()
            .map_or(0, |m| m.iter().take_while(|x| !**x).count());
        let mut prompt = Vec::new();
        if !n.token_start {
            // The sequence before it: the nearest sampled node above, whole.
            let mut chain = Vec::new();
            let mut at = self.sampled_above(n.parent);
            while let Some(p) = at {
                let pn = &self.nodes[p];
                chain.push(p);
                if pn.token_start {
                    break;
                }
                at = self.sampled_above(pn.parent);
            }
            for &p in chain.iter().rev() {
                prompt.extend_from_slice(self.nodes[p].token_ids.as_deref()?);
            }
        }
        prompt.extend_from_slice(&ids[..split]);
        let logprobs = n
            .logprobs
            .as_ref()
            .map(|l| l[split.min(l.len())..].to_vec());
        Some((prompt, ids[split..].to_vec(), logprobs))
    }

    fn sampled_above(&self, mut from: Option<u32>) -> Option<usize> {
        while let Some(p) = from {
            let node = self.nodes.get(p as usize)?;
            if node.sampled {
                return Some(p as usize);
            }
            from = node.parent;
        }
        None
    }

    /// The episode: the nodes with their branches, as [`crate::RolloutSession::episode`]
    /// gives it.
    pub fn episode(&self) -> Episode {
        let (mut failed, mut unreadable) = (0, 0);
        for c in &self.calls {
            let status = c.fields.get("status").and_then(Value::as_u64).unwrap_or(0);
            let error = c.fields.get("error").is_some_and(|e| !e.is_null());
            if error || status >= 400 {
                failed += 1;
            } else if c.node.is_none() {
                unreadable += 1;
            }
        }
        let calls = (self.calls.len() as u64, failed, unreadable);
        EpisodeBuilder::restore(self.nodes.clone(), calls).episode(self.session())
    }
}
