//! Anthropic Messages mediation (also `count_tokens`, whose body has the same shape).

use serde_json::{json, Value};

use super::{
    check_tool_choice, filter_parts, notice_into, remove_key, str_at, ty, Array, Edit, Paths,
    Remaining, REMOVED_PLACEHOLDER,
};
use crate::body::JsonBody;
use crate::error::Error;
use crate::network::NetworkPolicy;

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
