//! Chat Completions mediation.

use serde_json::{json, Value};

use super::{
    check_tool_choice, filter_parts, inline_or_allowed, notice_into, remove_key, str_at, ty, Array,
    Edit, Paths, Remaining, REMOVED_PLACEHOLDER,
};
use crate::body::JsonBody;
use crate::error::Error;
use crate::network::NetworkPolicy;

/// Chat Completions mediation.
pub(crate) fn chat(body: &mut JsonBody, policy: &NetworkPolicy) -> Result<Vec<String>, Error> {
    let mut paths = Paths(Vec::new());
    remove_key(body, "web_search_options", &mut paths);
    remove_key(body, "plugins", &mut paths);
    audio_output(body, &mut paths)?;
    tools(body, &mut paths)?;
    message_contents(body, policy, &mut paths)?;
    Ok(paths.0)
}

/// Removes an audio answer in a stored voice (`audio.voice.id`), and with it the `audio`
/// modality.
fn audio_output(body: &mut JsonBody, paths: &mut Paths) -> Result<(), Error> {
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
    Ok(())
}

/// Keeps the function and custom tools, removes every other kind, and checks
/// `tool_choice` against what remains.
fn tools(body: &mut JsonBody, paths: &mut Paths) -> Result<(), Error> {
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
        paths,
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
    )
}

/// Mediates each message's content, then appends the notice if anything was removed.
fn message_contents(
    body: &mut JsonBody,
    policy: &NetworkPolicy,
    paths: &mut Paths,
) -> Result<(), Error> {
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
            chat_message(m, &format!("messages[{i}]"), policy, paths)
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
    Ok(())
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
