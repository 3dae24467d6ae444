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

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::body::JsonBody;
use crate::error::Error;
use crate::network::{NetworkPolicy, NOTICE};

/// What replaces a content list that mediation emptied (providers refuse empty ones).
pub const REMOVED_PLACEHOLDER: &str = "[content removed by the network policy]";

/// A 1x1 transparent PNG: what replaces a computer screenshot the policy blocks.
pub const BLANK_PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";

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

// ---------------------------------------------------------------------------------------
// Chat Completions
// ---------------------------------------------------------------------------------------

/// Chat Completions mediation.
pub(crate) fn chat(body: &mut JsonBody, policy: &NetworkPolicy) -> Result<Vec<String>, Error> {
    let mut paths = Paths(Vec::new());
    remove_key(body, "web_search_options", &mut paths);
    remove_key(body, "plugins", &mut paths);
    if let Some(audio) = body.value("audio") {
        if audio.get("voice").is_some_and(|v| v.get("id").is_some()) {
            body.remove("audio");
            paths.push("audio.voice.id".into());
            if let Some(Value::Array(mut modalities)) = body.value("modalities") {
                let mut k = 0usize;
                modalities.retain(|m| {
                    let keep = m.as_str() != Some("audio");
                    if !keep {
                        paths.push(format!("modalities[{k}]"));
                    }
                    k += 1;
                    keep
                });
                if modalities.is_empty() {
                    modalities.push(json!("text"));
                }
                body.set("modalities", &modalities)?;
            }
        }
    }

    let mut remaining = Remaining {
        tools: Vec::new(),
        removed_any: false,
    };
    if let Some(mut tools) = Array::load(body, "tools") {
        tools.edit(|i, tool| match ty(tool) {
            kind @ ("function" | "custom") => {
                let name = tool
                    .get(kind)
                    .and_then(|f| str_at(f, "name"))
                    .unwrap_or("")
                    .to_owned();
                remaining.tools.push((kind.to_owned(), name));
                Edit::Keep
            }
            _ => {
                paths.push(format!("tools[{i}].type"));
                remaining.removed_any = true;
                Edit::Remove
            }
        });
        let emptied = tools.changed && tools.is_empty();
        tools.store(body, true)?;
        if emptied && body.remove("parallel_tool_calls") {
            paths.push("parallel_tool_calls".into());
        }
    }
    check_tool_choice(
        body,
        &remaining,
        &mut paths,
        &|c| {
            let kind = ty(c).to_owned();
            let name = c
                .get(&kind)
                .and_then(|f| str_at(f, "name"))
                .map(str::to_owned);
            (kind, name)
        },
        &|c| {
            if ty(c) != "allowed_tools" {
                return None;
            }
            c.get_mut("allowed_tools")?.get_mut("tools")?.as_array_mut()
        },
    )?;

    let mut earliest_user = None;
    let mut first_non_system = None;
    let mut messages = Array::load(body, "messages");
    if let Some(messages) = &mut messages {
        let mut position = 0usize;
        messages.edit(|i, m| {
            let role = str_at(m, "role").unwrap_or("");
            if role == "user" && earliest_user.is_none() {
                earliest_user = Some(i);
            }
            if !matches!(role, "system" | "developer") && first_non_system.is_none() {
                first_non_system = Some(position);
            }
            position += 1;
            chat_message(m, &format!("messages[{i}]"), policy, &mut paths)
        });
    }
    if !paths.0.is_empty() {
        if let Some(messages) = &mut messages {
            notice_into(
                messages,
                earliest_user,
                first_non_system.unwrap_or(usize::MAX),
                &|t| json!({"type": "text", "text": t}),
            );
        }
    }
    if let Some(messages) = messages {
        messages.store(body, false)?;
    }
    Ok(paths.0)
}

fn chat_message(m: &mut Value, path: &str, policy: &NetworkPolicy, paths: &mut Paths) -> Edit {
    let mut edit = Edit::Keep;
    let Some(obj) = m.as_object_mut() else {
        return edit;
    };
    if obj.get("audio").is_some_and(|a| a.get("id").is_some()) {
        obj.remove("audio");
        paths.push(format!("{path}.audio.id"));
        edit = Edit::Changed;
    }
    if let Some(Value::Array(parts)) = obj.get_mut("content") {
        let e = filter_parts(
            parts,
            &format!("{path}.content"),
            paths,
            &|| json!({"type": "text", "text": REMOVED_PLACEHOLDER}),
            &mut |p, at, paths| chat_part(p, at, policy, paths),
        );
        if e != Edit::Keep {
            edit = Edit::Changed;
        }
    }
    edit
}

fn chat_part(p: &mut Value, at: &str, policy: &NetworkPolicy, paths: &mut Paths) -> Edit {
    match ty(p) {
        "text" | "refusal" | "input_audio" => Edit::Keep,
        "image_url" => {
            let url = match p.get("image_url") {
                Some(Value::String(s)) => Some((s.as_str(), format!("{at}.image_url"))),
                Some(o) => str_at(o, "url").map(|u| (u, format!("{at}.image_url.url"))),
                None => None,
            };
            match url {
                Some((u, _)) if policy.allows_url(u) => Edit::Keep,
                Some((_, path)) => {
                    paths.push(path);
                    Edit::Remove
                }
                None => {
                    paths.push(format!("{at}.image_url"));
                    Edit::Remove
                }
            }
        }
        "file" => {
            let Some(file) = p.get("file") else {
                paths.push(format!("{at}.file"));
                return Edit::Remove;
            };
            if file.get("file_id").is_some() {
                paths.push(format!("{at}.file.file_id"));
                return Edit::Remove;
            }
            if let Some(u) = str_at(file, "file_url") {
                if !policy.allows_url(u) {
                    paths.push(format!("{at}.file.file_url"));
                    return Edit::Remove;
                }
            }
            if let Some(d) = str_at(file, "file_data") {
                if !inline_or_allowed(policy, d) {
                    paths.push(format!("{at}.file.file_data"));
                    return Edit::Remove;
                }
            }
            Edit::Keep
        }
        _ => {
            paths.push(format!("{at}.type"));
            Edit::Remove
        }
    }
}

// ---------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------

/// Responses mediation.
pub(crate) fn responses(body: &mut JsonBody, policy: &NetworkPolicy) -> Result<Vec<String>, Error> {
    let mut paths = Paths(Vec::new());
    for key in ["previous_response_id", "conversation", "prompt", "plugins"] {
        remove_key(body, key, &mut paths);
    }
    let mut remaining = Remaining {
        tools: Vec::new(),
        removed_any: false,
    };
    if let Some(mut tools) = Array::load(body, "tools") {
        tools.edit(|i, tool| {
            let e = responses_tool(
                tool,
                &format!("tools[{i}]"),
                policy,
                &mut paths,
                &mut remaining,
            );
            if e != Edit::Keep {
                remaining.removed_any = true;
            }
            e
        });
        tools.store(body, true)?;
    }
    check_tool_choice(
        body,
        &remaining,
        &mut paths,
        &|c| {
            let kind = ty(c).to_owned();
            let name = match kind.as_str() {
                "function" | "custom" => str_at(c, "name").map(str::to_owned),
                _ => None,
            };
            (kind, name)
        },
        &|c| {
            if ty(c) != "allowed_tools" {
                return None;
            }
            c.get_mut("tools")?.as_array_mut()
        },
    )?;

    match body.raw("input").and_then(|r| r.first().copied()) {
        Some(b'"') if !paths.0.is_empty() => {
            if let Some(Value::String(mut s)) = body.value("input") {
                if !s.ends_with(NOTICE) {
                    s.push_str("\n\n");
                    s.push_str(NOTICE);
                    body.set("input", &s)?;
                }
            }
        }
        Some(b'[') => {
            if let Some(mut input) = Array::load(body, "input") {
                let mut earliest_user = None;
                let mut first_non_system = None;
                let mut position = 0usize;
                input.edit(|i, item| {
                    let role = str_at(item, "role").unwrap_or("");
                    let is_message = item.get("type").is_none() || ty(item) == "message";
                    if is_message && role == "user" && earliest_user.is_none() {
                        earliest_user = Some(i);
                    }
                    if !(is_message && matches!(role, "system" | "developer"))
                        && first_non_system.is_none()
                    {
                        first_non_system = Some(position);
                    }
                    position += 1;
                    responses_item(item, &format!("input[{i}]"), policy, &mut paths)
                });
                if !paths.0.is_empty() {
                    notice_into(
                        &mut input,
                        earliest_user,
                        first_non_system.unwrap_or(usize::MAX),
                        &|t| json!({"type": "input_text", "text": t}),
                    );
                }
                input.store(body, false)?;
            }
        }
        None if !paths.0.is_empty() => {
            body.set("input", &json!([{"role": "user", "content": NOTICE}]))?;
        }
        _ => {}
    }
    Ok(paths.0)
}

fn responses_tool(
    tool: &mut Value,
    at: &str,
    policy: &NetworkPolicy,
    paths: &mut Paths,
    remaining: &mut Remaining,
) -> Edit {
    let kind = ty(tool).to_owned();
    let keep = |remaining: &mut Remaining, tool: &Value| {
        remaining
            .tools
            .push((kind.clone(), str_at(tool, "name").unwrap_or("").to_owned()));
        Edit::Keep
    };
    match kind.as_str() {
        "function"
        | "custom"
        | "local_shell"
        | "apply_patch"
        | "computer"
        | "computer_use_preview" => keep(remaining, tool),
        "shell" => {
            let local = tool
                .get("environment")
                .is_none_or(|e| e.is_null() || ty(e) == "local");
            if local {
                keep(remaining, tool)
            } else {
                paths.push(format!("{at}.environment.type"));
                Edit::Remove
            }
        }
        "tool_search" => {
            if str_at(tool, "execution") == Some("client") {
                keep(remaining, tool)
            } else {
                paths.push(format!("{at}.execution"));
                Edit::Remove
            }
        }
        "namespace" => {
            let Some(Value::Array(nested)) = tool.get_mut("tools") else {
                paths.push(format!("{at}.tools"));
                return Edit::Remove;
            };
            let mut edit = Edit::Keep;
            let mut k = 0usize;
            nested.retain_mut(|t| {
                let e = responses_tool(t, &format!("{at}.tools[{k}]"), policy, paths, remaining);
                k += 1;
                if e != Edit::Keep {
                    edit = Edit::Changed;
                }
                e != Edit::Remove
            });
            if nested.is_empty() {
                return Edit::Remove;
            }
            edit
        }
        "web_search" | "web_search_2025_08_26" => {
            let requested: Option<Vec<String>> = tool
                .get("filters")
                .and_then(|f| f.get("allowed_domains"))
                .and_then(|d| serde_json::from_value(d.clone()).ok());
            match policy.domain_filter(requested.as_deref()) {
                Some(domains) if Some(&domains) == requested.as_ref() => keep(remaining, tool),
                Some(domains) => {
                    let Some(obj) = tool.as_object_mut() else {
                        return Edit::Remove;
                    };
                    let filters = obj
                        .entry("filters")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if !filters.is_object() {
                        *filters = Value::Object(Map::new());
                    }
                    filters["allowed_domains"] = json!(domains);
                    paths.push(format!("{at}.filters.allowed_domains"));
                    keep(remaining, tool);
                    Edit::Changed
                }
                None => {
                    paths.push(format!("{at}.type"));
                    Edit::Remove
                }
            }
        }
        _ => {
            paths.push(format!("{at}.type"));
            Edit::Remove
        }
    }
}

fn responses_item(item: &mut Value, at: &str, policy: &NetworkPolicy, paths: &mut Paths) -> Edit {
    let kind = match item.get("type") {
        None => "message".to_owned(),
        Some(_) => ty(item).to_owned(),
    };
    match kind.as_str() {
        "message" => {
            let assistant = str_at(item, "role") == Some("assistant");
            let Some(Value::Array(parts)) = item.get_mut("content") else {
                return Edit::Keep;
            };
            filter_parts(
                parts,
                &format!("{at}.content"),
                paths,
                &|| {
                    let t = if assistant {
                        "output_text"
                    } else {
                        "input_text"
                    };
                    json!({"type": t, "text": REMOVED_PLACEHOLDER})
                },
                &mut |p, at, paths| responses_part(p, at, policy, paths),
            )
        }
        "function_call_output" | "custom_tool_call_output" => {
            let Some(Value::Array(parts)) = item.get_mut("output") else {
                return Edit::Keep;
            };
            filter_parts(
                parts,
                &format!("{at}.output"),
                paths,
                &|| json!({"type": "input_text", "text": REMOVED_PLACEHOLDER}),
                &mut |p, at, paths| responses_part(p, at, policy, paths),
            )
        }
        "computer_call_output" => {
            let Some(output) = item.get_mut("output") else {
                return Edit::Keep;
            };
            let blocked = if output.get("file_id").is_some() {
                Some(format!("{at}.output.file_id"))
            } else {
                match str_at(output, "image_url") {
                    Some(u) if !policy.allows_url(u) => Some(format!("{at}.output.image_url")),
                    _ => None,
                }
            };
            match blocked {
                Some(path) => {
                    paths.push(path);
                    *output = json!({"type": "computer_screenshot", "image_url": BLANK_PNG});
                    Edit::Changed
                }
                None => Edit::Keep,
            }
        }
        "function_call"
        | "custom_tool_call"
        | "computer_call"
        | "local_shell_call"
        | "local_shell_call_output"
        | "shell_call"
        | "shell_call_output"
        | "apply_patch_call"
        | "apply_patch_call_output" => Edit::Keep,
        "reasoning" | "compaction" => {
            let encrypted = str_at(item, "encrypted_content").is_some_and(|s| !s.is_empty());
            if encrypted {
                Edit::Keep
            } else {
                paths.push(format!("{at}.encrypted_content"));
                Edit::Remove
            }
        }
        "item_reference" => {
            paths.push(format!("{at}.id"));
            Edit::Remove
        }
        _ => {
            paths.push(format!("{at}.type"));
            Edit::Remove
        }
    }
}

fn responses_part(p: &mut Value, at: &str, policy: &NetworkPolicy, paths: &mut Paths) -> Edit {
    match ty(p) {
        "input_text" | "output_text" | "refusal" | "input_audio" | "summary_text"
        | "reasoning_text" | "text" => Edit::Keep,
        "input_image" => {
            if p.get("file_id").is_some_and(|f| !f.is_null()) {
                paths.push(format!("{at}.file_id"));
                return Edit::Remove;
            }
            match str_at(p, "image_url") {
                Some(u) if policy.allows_url(u) => Edit::Keep,
                _ => {
                    paths.push(format!("{at}.image_url"));
                    Edit::Remove
                }
            }
        }
        "input_file" => {
            if p.get("file_id").is_some_and(|f| !f.is_null()) {
                paths.push(format!("{at}.file_id"));
                return Edit::Remove;
            }
            if let Some(u) = str_at(p, "file_url") {
                if !policy.allows_url(u) {
                    paths.push(format!("{at}.file_url"));
                    return Edit::Remove;
                }
            }
            if let Some(d) = str_at(p, "file_data") {
                if !inline_or_allowed(policy, d) {
                    paths.push(format!("{at}.file_data"));
                    return Edit::Remove;
                }
            }
            Edit::Keep
        }
        _ => {
            paths.push(format!("{at}.type"));
            Edit::Remove
        }
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages (and count_tokens, whose body has the same shape)
// ---------------------------------------------------------------------------------------

/// Whether `kind` is `<prefix>_<8 digits>` for one of `prefixes`.
fn versioned(kind: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| {
        kind.strip_prefix(p)
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|d| d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Anthropic Messages mediation (also `count_tokens`).
pub(crate) fn messages(body: &mut JsonBody, policy: &NetworkPolicy) -> Result<Vec<String>, Error> {
    let mut paths = Paths(Vec::new());
    remove_key(body, "container", &mut paths);
    remove_key(body, "mcp_servers", &mut paths);
    let mut remaining = Remaining {
        tools: Vec::new(),
        removed_any: false,
    };
    if let Some(mut tools) = Array::load(body, "tools") {
        tools.edit(|i, tool| {
            let e = messages_tool(tool, &format!("tools[{i}]"), policy, &mut paths);
            if e != Edit::Keep {
                remaining.removed_any = true;
            }
            if e != Edit::Remove {
                remaining
                    .tools
                    .push(("tool".into(), str_at(tool, "name").unwrap_or("").to_owned()));
            }
            e
        });
        tools.store(body, true)?;
    }
    check_tool_choice(
        body,
        &remaining,
        &mut paths,
        &|c| match ty(c) {
            "tool" => ("tool".into(), str_at(c, "name").map(str::to_owned)),
            // auto / any / none name no tool: valid while some tool is left.
            _ => ("tool".into(), None),
        },
        &|_| None,
    )?;
    if let Some(mut system) = Array::load(body, "system") {
        system.edit(|k, block| messages_block(block, &format!("system[{k}]"), policy, &mut paths));
        system.store(body, true)?;
    }
    let mut earliest_user = None;
    let mut messages = Array::load(body, "messages");
    if let Some(messages) = &mut messages {
        messages.edit(|i, m| {
            if str_at(m, "role") == Some("user") && earliest_user.is_none() {
                earliest_user = Some(i);
            }
            let Some(Value::Array(blocks)) = m.get_mut("content") else {
                return Edit::Keep;
            };
            filter_parts(
                blocks,
                &format!("messages[{i}].content"),
                &mut paths,
                &|| json!({"type": "text", "text": REMOVED_PLACEHOLDER}),
                &mut |b, at, paths| messages_block(b, at, policy, paths),
            )
        });
        if !paths.0.is_empty() {
            notice_into(
                messages,
                earliest_user,
                0,
                &|t| json!({"type": "text", "text": t}),
            );
        }
    }
    if let Some(messages) = messages {
        messages.store(body, false)?;
    }
    Ok(paths.0)
}

fn messages_tool(tool: &mut Value, at: &str, policy: &NetworkPolicy, paths: &mut Paths) -> Edit {
    let kind = ty(tool).to_owned();
    if kind.is_empty() || kind == "custom" {
        return if tool.get("input_schema").is_some() {
            Edit::Keep
        } else {
            paths.push(format!("{at}.input_schema"));
            Edit::Remove
        };
    }
    if versioned(&kind, &["bash", "text_editor", "computer", "memory"]) {
        return Edit::Keep;
    }
    if !versioned(&kind, &["web_search", "web_fetch"]) {
        paths.push(format!("{at}.type"));
        return Edit::Remove;
    }
    let requested: Option<Vec<String>> = tool
        .get("allowed_domains")
        .filter(|d| !d.is_null())
        .and_then(|d| serde_json::from_value(d.clone()).ok());
    let Some(domains) = policy.domain_filter(requested.as_deref()) else {
        paths.push(format!("{at}.type"));
        return Edit::Remove;
    };
    let Some(obj) = tool.as_object_mut() else {
        return Edit::Remove;
    };
    let mut edit = Edit::Keep;
    if requested.as_ref() != Some(&domains) {
        obj.insert("allowed_domains".into(), json!(domains));
        paths.push(format!("{at}.allowed_domains"));
        edit = Edit::Changed;
    }
    if obj.remove("blocked_domains").is_some() {
        paths.push(format!("{at}.blocked_domains"));
        edit = Edit::Changed;
    }
    if obj
        .get("allowed_callers")
        .is_some_and(|c| *c != json!(["direct"]))
    {
        obj.insert("allowed_callers".into(), json!(["direct"]));
        paths.push(format!("{at}.allowed_callers"));
        edit = Edit::Changed;
    }
    edit
}

fn messages_block(b: &mut Value, at: &str, policy: &NetworkPolicy, paths: &mut Paths) -> Edit {
    match ty(b) {
        "text" | "thinking" | "redacted_thinking" | "tool_use" | "search_result" => Edit::Keep,
        "tool_result" => {
            let Some(Value::Array(blocks)) = b.get_mut("content") else {
                return Edit::Keep;
            };
            filter_parts(
                blocks,
                &format!("{at}.content"),
                paths,
                &|| json!({"type": "text", "text": REMOVED_PLACEHOLDER}),
                &mut |b, at, paths| messages_block(b, at, policy, paths),
            )
        }
        "image" | "document" => {
            let Some(source) = b.get("source") else {
                paths.push(format!("{at}.source"));
                return Edit::Remove;
            };
            match ty(source) {
                "base64" | "text" | "content" => Edit::Keep,
                "url" => match str_at(source, "url") {
                    Some(u) if policy.allows_url(u) => Edit::Keep,
                    _ => {
                        paths.push(format!("{at}.source.url"));
                        Edit::Remove
                    }
                },
                "file" => {
                    paths.push(format!("{at}.source.file_id"));
                    Edit::Remove
                }
                _ => {
                    paths.push(format!("{at}.source.type"));
                    Edit::Remove
                }
            }
        }
        _ => {
            paths.push(format!("{at}.type"));
            Edit::Remove
        }
    }
}
