//! Responses mediation.

use serde_json::{json, Map, Value};

use super::{
    check_tool_choice, filter_parts, inline_or_allowed, notice_into, remove_key, str_at, ty, Array,
    Edit, Paths, Remaining, BLANK_PNG, REMOVED_PLACEHOLDER,
};
use crate::body::JsonBody;
use crate::error::Error;
use crate::network::{NetworkPolicy, NOTICE};

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
