//! Network-policy mediation, one function per dialect (see [`crate::network`]).
//!
//! Each mediator removes from a request the provider-side capabilities that could reach
//! the network beyond what the policy allows, and returns the value-free JSON paths it
//! removed or narrowed, in body order. When it removed something it appends
//! [`NOTICE`] to the earliest user message (or adds a user message carrying it).
//!
//! Only the top-level values that change are re-encoded: every other member of the body
//! stays a slice of the harness's buffer, and inside a re-encoded array the elements that
//! did not change are copied byte for byte. Mediating a mediated body changes nothing.
//!
//! The shared machinery (arrays edited element by element, content filters, the notice,
//! `tool_choice` checks) is here; each dialect's mediator is in its own file.

mod chat;
mod messages;
mod responses;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::Dialect;
use crate::body::JsonBody;
use crate::error::Error;
use crate::network::{NetworkPolicy, OnViolation, PolicyEvent, NOTICE};

pub(crate) use self::chat::chat;
pub(crate) use self::messages::messages;
pub(crate) use self::responses::responses;

/// Mediates one request under `policy` with its dialect's mediator
/// ([`Dialect::mediate`]): the whole cost for an unrestricted policy is one branch
/// (the body is left as it is, byte for byte). `Ok(None)`: nothing removed; `Ok(Some)`:
/// the record's event; `Err`: [`OnViolation::Reject`] refused the call (400, naming the
/// first path), or a value could not be re-encoded.
pub fn mediate_request(
    dialect: &dyn Dialect,
    policy: &NetworkPolicy,
    body: &mut JsonBody,
) -> Result<Option<PolicyEvent>, Error> {
    if !policy.is_restricted() {
        return Ok(None);
    }
    if policy.on_violation() == OnViolation::Reject {
        // Mediate a copy: a refused body is not touched.
        let mut copy = body.clone();
        let paths = dialect.mediate(&mut copy, policy)?;
        if let Some(first) = paths.first() {
            let more = match paths.len() {
                1 => String::new(),
                n => format!(" (and {} more: {})", n - 1, paths[1..].join(", ")),
            };
            return Err(Error::invalid(format!(
                "network policy: `{first}`{more} asks the model provider to reach the network, \
                 which this rollout's network policy forbids; send the request without it"
            )));
        }
        return Ok(None);
    }
    let paths = dialect.mediate(body, policy)?;
    Ok((!paths.is_empty()).then(|| PolicyEvent::new(paths)))
}

/// What replaces a content list that mediation emptied (providers refuse empty ones).
pub(crate) const REMOVED_PLACEHOLDER: &str = "[content removed by the network policy]";

/// A 1x1 transparent PNG: what replaces a computer screenshot the policy blocks.
pub(crate) const BLANK_PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";

/// What to do with one element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    Keep,
    Changed,
    Remove,
}

/// The paths found so far.
struct Paths(Vec<String>);

impl Paths {
    fn push(&mut self, path: String) {
        if !self.0.contains(&path) {
            self.0.push(path);
        }
    }
}

enum Item {
    Raw(Bytes),
    Val(Value),
}

/// A top-level array being mediated element by element; elements keep their original
/// index (for paths) and their original bytes when unchanged.
struct Array {
    key: &'static str,
    items: Vec<(usize, Item)>,
    changed: bool,
}

impl Array {
    /// `None`: the key is absent or not an array (then the upstream refuses it anyway).
    fn load(body: &JsonBody, key: &'static str) -> Option<Array> {
        let raw = body.raw_bytes(key)?;
        if raw.first() != Some(&b'[') {
            return None;
        }
        let text = std::str::from_utf8(&raw).ok()?;
        let elements: Vec<&RawValue> = serde_json::from_str(text).ok()?;
        let base = text.as_ptr() as usize;
        let items = elements
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let start = e.get().as_ptr() as usize - base;
                (i, Item::Raw(raw.slice(start..start + e.get().len())))
            })
            .collect();
        Some(Array {
            key,
            items,
            changed: false,
        })
    }

    fn value_of(item: &Item) -> Value {
        match item {
            Item::Raw(b) => serde_json::from_slice(b).unwrap_or(Value::Null),
            Item::Val(v) => v.clone(),
        }
    }

    /// Runs `f` on every element, in order.
    fn edit(&mut self, mut f: impl FnMut(usize, &mut Value) -> Edit) {
        let mut out = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.drain(..) {
            let mut v = Array::value_of(&item);
            match f(i, &mut v) {
                Edit::Keep => out.push((i, item)),
                Edit::Changed => {
                    self.changed = true;
                    out.push((i, Item::Val(v)));
                }
                Edit::Remove => self.changed = true,
            }
        }
        self.items = out;
    }

    /// Changes the element of original index `index`.
    fn change(&mut self, index: usize, f: impl FnOnce(&mut Value)) {
        if let Some((_, item)) = self.items.iter_mut().find(|(i, _)| *i == index) {
            let mut v = Array::value_of(item);
            f(&mut v);
            *item = Item::Val(v);
            self.changed = true;
        }
    }

    fn insert(&mut self, at: usize, value: Value) {
        let at = at.min(self.items.len());
        self.items.insert(at, (usize::MAX, Item::Val(value)));
        self.changed = true;
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Writes the array back when it changed; removes the key when it emptied and
    /// `drop_empty`.
    fn store(self, body: &mut JsonBody, drop_empty: bool) -> Result<(), Error> {
        if !self.changed {
            return Ok(());
        }
        if drop_empty && self.items.is_empty() {
            body.remove(self.key);
            return Ok(());
        }
        let mut out = Vec::with_capacity(256);
        out.push(b'[');
        for (n, (_, item)) in self.items.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            match item {
                Item::Raw(b) => out.extend_from_slice(b),
                Item::Val(v) => serde_json::to_writer(&mut out, v)
                    .map_err(|e| Error::Internal(format!("cannot encode `{}`: {e}", self.key)))?,
            }
        }
        out.push(b']');
        body.set_raw(self.key, Bytes::from(out));
        Ok(())
    }
}

fn ty(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Whether a file payload that may be a URL (`file_data`) is allowed: inline data (base64
/// or a `data:` URL) always, a URL only when the policy allows it.
fn inline_or_allowed(policy: &NetworkPolicy, data: &str) -> bool {
    !data.contains(':') || policy.allows_url(data)
}

/// Removes a top-level key, recording it.
fn remove_key(body: &mut JsonBody, key: &str, paths: &mut Paths) {
    if body.remove(key) {
        paths.push(key.to_owned());
    }
}

/// Filters a content list (`content` arrays, tool results) with `part`, which says what
/// to do with one part at `path`. An emptied list gets the placeholder part.
fn filter_parts(
    list: &mut Vec<Value>,
    path: &str,
    paths: &mut Paths,
    placeholder: &dyn Fn() -> Value,
    part: &mut dyn FnMut(&mut Value, &str, &mut Paths) -> Edit,
) -> Edit {
    let mut edit = Edit::Keep;
    let mut j = 0usize;
    list.retain_mut(|p| {
        let at = format!("{path}[{j}]");
        j += 1;
        match part(p, &at, paths) {
            Edit::Keep => true,
            Edit::Changed => {
                edit = Edit::Changed;
                true
            }
            Edit::Remove => {
                edit = Edit::Changed;
                false
            }
        }
    });
    if edit == Edit::Changed && list.is_empty() {
        list.push(placeholder());
    }
    edit
}

/// Appends the notice to a message's `content` (string or parts); `part` makes the text
/// part of the dialect. Nothing changes when the content already ends with it.
fn append_notice(message: &mut Value, part: &dyn Fn(&str) -> Value) {
    let Some(obj) = message.as_object_mut() else {
        return;
    };
    match obj.get_mut("content") {
        Some(Value::String(s)) => {
            if !s.ends_with(NOTICE) {
                if !s.is_empty() {
                    s.push_str("\n\n");
                }
                s.push_str(NOTICE);
            }
        }
        Some(Value::Array(parts)) => {
            let last = parts
                .last()
                .and_then(|p| p.get("text"))
                .and_then(Value::as_str);
            if last != Some(NOTICE) {
                parts.push(part(NOTICE));
            }
        }
        _ => {
            obj.insert("content".into(), Value::String(NOTICE.to_owned()));
        }
    }
}

/// Adds the notice to the earliest user message of `messages` (original index `user`),
/// or inserts a user message carrying it at `insert_at`.
fn notice_into(
    messages: &mut Array,
    user: Option<usize>,
    insert_at: usize,
    part: &dyn Fn(&str) -> Value,
) {
    match user {
        Some(i) => messages.change(i, |m| append_notice(m, part)),
        None => messages.insert(insert_at, json!({"role": "user", "content": NOTICE})),
    }
}

/// What tool choices stay valid: the remaining tools' `(type, name)` pairs.
struct Remaining {
    tools: Vec<(String, String)>,
    removed_any: bool,
}

impl Remaining {
    fn has(&self, kind: &str, name: Option<&str>) -> bool {
        self.tools
            .iter()
            .any(|(t, n)| t == kind && name.is_none_or(|name| n == name))
    }
}

/// Drops a `tool_choice` the removals made invalid: one naming a tool that is gone, or
/// any choice once no tool is left. `name_of` reads `(type, name)` of one choice entry.
fn check_tool_choice(
    body: &mut JsonBody,
    remaining: &Remaining,
    paths: &mut Paths,
    name_of: &dyn Fn(&Value) -> (String, Option<String>),
    allowed_list: &dyn Fn(&mut Value) -> Option<&mut Vec<Value>>,
) -> Result<(), Error> {
    if !remaining.removed_any {
        return Ok(());
    }
    let Some(mut choice) = body.value("tool_choice") else {
        return Ok(());
    };
    if remaining.tools.is_empty() {
        body.remove("tool_choice");
        paths.push("tool_choice".into());
        return Ok(());
    }
    if choice.is_string() {
        return Ok(());
    }
    if let Some(list) = allowed_list(&mut choice) {
        let before = list.len();
        list.retain(|entry| {
            let (kind, name) = name_of(entry);
            remaining.has(&kind, name.as_deref())
        });
        if list.len() == before {
            return Ok(());
        }
        if list.is_empty() {
            body.remove("tool_choice");
        } else {
            body.set("tool_choice", &choice)?;
        }
        paths.push("tool_choice".into());
        return Ok(());
    }
    let (kind, name) = name_of(&choice);
    if !remaining.has(&kind, name.as_deref()) {
        body.remove("tool_choice");
        paths.push("tool_choice".into());
    }
    Ok(())
}
