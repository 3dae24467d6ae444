//! Reading a log back: records rebuilt on demand, the episode, and what the log is.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::trace::episode::{hex, Episode, EpisodeBuilder, Message, Node, Role, TokenBreak};
use crate::trace::record::{CallRecord, Omit, CALL_FIELDS};
use crate::DialectKind;

use super::{conversation_member, LogEnd, EARLIER_SCHEMAS, SCHEMA};

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

/// Where a node line left its message: in the call line that follows.
#[derive(Debug, Clone, Copy)]
enum Pending {
    /// That call's response.
    Response,
    /// Element `i` of the conversation that call adds.
    Added(usize),
}

/// A log read line by line (see [`super`]): tolerates a torn last line, skips (and
/// reports) lines it cannot read, and rebuilds each call's record on demand.
#[derive(Debug, Default)]
pub struct LogReader {
    header: Option<Value>,
    /// The format's version (3 unless the header names an earlier one).
    earlier: bool,
    values: Vec<Value>,
    nodes: Vec<Node>,
    /// Nodes whose message is in the call line that follows, by index in `nodes`.
    pending: Vec<(usize, Pending)>,
    calls: Vec<LogCall>,
    /// The last call line's fields, whole: a call line leaves out what it repeats.
    last_fields: Option<Map<String, Value>>,
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
        if kind != "node" && kind != "call" {
            self.abandon_pending(&kind);
        }
        match kind.as_str() {
            "header" => {
                let schema = fields.get("schema").and_then(Value::as_str).unwrap_or("");
                if schema != SCHEMA && !EARLIER_SCHEMAS.contains(&schema) {
                    return Err(LogError::Schema {
                        found: schema.to_owned(),
                    });
                }
                self.earlier = schema != SCHEMA;
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
                let (node, pending) = self.node(fields).map_err(|m| self.bad(m))?;
                if node.id as usize != self.nodes.len() {
                    return Err(self.bad(format!(
                        "node {} out of order (the next is {})",
                        node.id,
                        self.nodes.len()
                    )));
                }
                if let Some(p) = pending {
                    self.pending.push((self.nodes.len(), p));
                }
                self.nodes.push(node);
            }
            "call" => {
                let seq = fields
                    .get("seq")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| self.bad("a call without \"seq\""))?;
                let mut fields = fields;
                if !self.earlier {
                    // A field left out is the last call line's (before the first, its
                    // default).
                    let last = self.last_fields.get_or_insert_with(|| {
                        CALL_FIELDS
                            .iter()
                            .filter(|f| !f.default.is_empty())
                            .map(|f| {
                                let v = serde_json::from_str(f.default).unwrap_or(Value::Null);
                                (f.name.to_owned(), v)
                            })
                            .collect()
                    });
                    for (k, v) in fields.iter() {
                        if !matches!(k.as_str(), "request" | "response" | "prompt") {
                            last.insert(k.clone(), v.clone());
                        }
                    }
                    for (k, v) in last.iter() {
                        if !fields.contains_key(k) {
                            fields.insert(k.clone(), v.clone());
                        }
                    }
                }
                let node = fields.get("node").and_then(Value::as_u64);
                let call = LogCall {
                    seq,
                    node,
                    prompt: fields
                        .remove("prompt")
                        .and_then(|p| p.as_u64())
                        .map(|p| p as u32),
                    line: self.lines,
                    fields,
                };
                self.by_seq.insert(seq, self.calls.len());
                self.calls.push(call);
                self.settle(self.calls.len() - 1);
                let last = self.calls.len() - 1;
                if self.calls[last].prompt.is_none() {
                    let parent = node.and_then(|n| self.nodes.get(n as usize)?.parent);
                    self.calls[last].prompt = parent;
                }
            }
            "end" => {
                let counted = !fields.contains_key("summary");
                let mut end: LogEnd = serde_json::from_value(Value::Object(fields))
                    .map_err(|e| self.bad(format!("end: {e}")))?;
                if counted {
                    end.summary = self.episode().summary;
                }
                self.end = Some(end);
            }
            other => return Err(self.bad(format!("unknown line type {other:?}"))),
        }
        Ok(())
    }

    /// A node line; its message, when the line leaves it to the call line that follows,
    /// is pending (an empty message until then).
    fn node(&self, mut f: Map<String, Value>) -> Result<(Node, Option<Pending>), String> {
        let id = f
            .get("id")
            .and_then(Value::as_u64)
            .ok_or("a node without id")? as u32;
        let sampled = f.get("sampled").and_then(Value::as_bool).unwrap_or(false);
        let (message, pending) = match f.remove("message") {
            Some(m) => {
                let mut m = self.decode(m, None)?;
                // One text part is written as its text.
                if let Some(text) = m.get_mut("content").filter(|c| c.is_string()) {
                    let t = text.take();
                    *text = serde_json::json!([{"type": "text", "text": t}]);
                }
                let message: Message =
                    serde_json::from_value(m).map_err(|e| format!("node {id}: message: {e}"))?;
                (message, None)
            }
            None if self.earlier => return Err(format!("node {id} has no message")),
            None => {
                let pending = match f.get("from").and_then(Value::as_u64) {
                    Some(i) => Pending::Added(i as usize),
                    None if sampled => Pending::Response,
                    None => return Err(format!("node {id} has no message and no \"from\"")),
                };
                (Message::new(Role::Assistant), Some(pending))
            }
        };
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
        let parent = match f.get("parent") {
            Some(p) => p.as_u64().map(|p| p as u32),
            // Left out: the node before.
            None if self.earlier => None,
            None => id.checked_sub(1),
        };
        let hash = match f.get("hash").and_then(Value::as_str) {
            Some(h) => h.to_owned(),
            None if pending.is_some() => String::new(),
            None => hex(&message.hashes().0),
        };
        let node = Node {
            id,
            parent,
            hash,
            message,
            sampled,
            call: f.get("call").and_then(Value::as_u64),
            token_ids: ids,
            mask,
            logprobs,
            token_start: f
                .get("token_start")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            token_break,
        };
        Ok((node, pending))
    }

    /// Gives the pending nodes their messages from call `index` (the line just read).
    fn settle(&mut self, index: usize) {
        // The messages the call's conversation adds, read once for all its nodes.
        let mut added: Option<Result<Vec<Message>, String>> = None;
        for (n, pending) in std::mem::take(&mut self.pending) {
            match self.message_in_call(index, n, pending, &mut added) {
                Ok(m) => {
                    self.nodes[n].hash = hex(&m.hashes().0);
                    self.nodes[n].message = m;
                }
                Err(why) => {
                    self.nodes[n].hash = hex(&self.nodes[n].message.hashes().0);
                    let seq = self.calls[index].seq;
                    self.skipped.push((
                        self.lines,
                        format!("node {n}: its message could not be read from call {seq}: {why}"),
                    ));
                }
            }
        }
    }

    /// A pending node's message, from call `index` (`added`: the messages its
    /// conversation adds, once read).
    fn message_in_call(
        &self,
        index: usize,
        node: usize,
        pending: Pending,
        added: &mut Option<Result<Vec<Message>, String>>,
    ) -> Result<Message, String> {
        let call = &self.calls[index];
        let dialect: DialectKind = call
            .fields
            .get("dialect")
            .cloned()
            .and_then(|d| serde_json::from_value(d).ok())
            .ok_or("the call has no dialect")?;
        match pending {
            Pending::Response => {
                if self.nodes[node].call != Some(call.seq) {
                    return Err("the node is not this call's answer".into());
                }
                let response = call.fields.get("response").cloned().unwrap_or(Value::Null);
                let response = self.decode(response, Some(index))?;
                crate::trace::episode::sampled_message(dialect, &response)
                    .ok_or_else(|| "its response holds no answer".into())
            }
            Pending::Added(i) => {
                let elements = conversation_member(dialect)
                    .and_then(|key| call.fields.get("request")?.get(key)?.get("$a")?.get("add"))
                    .ok_or("the call's conversation adds nothing")?;
                if dialect == DialectKind::ChatCompletions {
                    // One message per element: only that one is read.
                    let element = elements
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("its conversation adds no element {i}"))?;
                    let element = self.decode(element, Some(index))?;
                    return Ok(crate::trace::episode::chat_message(&element));
                }
                let read = added.get_or_insert_with(|| {
                    match self.decode(elements.clone(), Some(index))? {
                        Value::Array(elements) => Ok(crate::trace::episode::conversation_messages(
                            dialect, &elements,
                        )),
                        _ => Err("the elements its conversation adds are not an array".into()),
                    }
                });
                let read = read.as_ref().map_err(Clone::clone)?;
                read.get(i)
                    .cloned()
                    .ok_or_else(|| format!("its conversation adds no message {i}"))
            }
        }
    }

    /// Drops the pending nodes: the line after them (`kind`) is not their call's.
    fn abandon_pending(&mut self, kind: &str) {
        let Some(&(first, _)) = self.pending.first() else {
            return;
        };
        self.pending.clear();
        let dropped = self.nodes.len() - first;
        self.nodes.truncate(first);
        self.skipped.push((
            self.lines,
            format!(
                "{dropped} node(s) before this {kind} line are left out: their messages are \
                 in a call line that is not there"
            ),
        ));
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

    /// The nodes, in the order they joined the graph (without those whose message is in
    /// a call line not read yet).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes[..self.pending.first().map_or(self.nodes.len(), |p| p.0)]
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
                // What the line does not carry (left out, or `null`) is on the node.
                let mut put = |key: &str, value: Value| {
                    let at = fields.entry(key).or_insert(Value::Null);
                    if at.is_null() {
                        *at = value;
                    }
                };
                put("prompt_token_ids", prompt.into());
                put("completion_token_ids", completion.into());
                if let Some(l) = logprobs {
                    put("completion_logprobs", l.into());
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
        let nodes = self.nodes();
        let n = nodes.get(node)?;
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
                let pn = &nodes[p];
                chain.push(p);
                if pn.token_start {
                    break;
                }
                at = self.sampled_above(pn.parent);
            }
            for &p in chain.iter().rev() {
                prompt.extend_from_slice(nodes[p].token_ids.as_deref()?);
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
            let node = self.nodes().get(p as usize)?;
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
        EpisodeBuilder::restore(self.nodes().to_vec(), calls).episode(self.session())
    }
}
