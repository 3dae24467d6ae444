//! Anthropic Messages: the `system`, and each message's blocks.

use serde_json::Value;

use super::{arguments, inline_image, role_of, str_of, string_of};
use crate::trace::canonical::{canonical, sorted};
use crate::trace::episode::{Message, Part, Role, ToolCall};

/// The `system` of an Anthropic request.
pub(crate) fn anthropic_system(system: &Value) -> Option<Message> {
    let mut msg = Message::new(Role::System);
    match system {
        Value::String(s) => msg.push_text(s.clone()),
        Value::Array(blocks) => {
            for b in blocks {
                msg.push_text(string_of(b, "text"));
            }
        }
        _ => {}
    }
    (!msg.is_empty()).then_some(msg)
}

/// One Anthropic message: a user message with `tool_result` blocks becomes one `tool`
/// message per result (and a user message for the rest, in order).
pub(crate) fn from_anthropic(m: &Value, out: &mut Vec<Message>) {
    let role = role_of(str_of(m, "role").unwrap_or("user"));
    let mut msg = Message::new(role);
    match m.get("content") {
        Some(Value::String(s)) => msg.push_text(s.clone()),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                match str_of(b, "type") {
                    Some("text") => msg.push_text(string_of(b, "text")),
                    Some("image") => msg.content.push(Part::Image {
                        url: anthropic_image(b.get("source").unwrap_or(&Value::Null)),
                    }),
                    Some("thinking") => {
                        msg.push_reasoning(str_of(b, "thinking").unwrap_or_default());
                        msg.push_state(str_of(b, "signature").unwrap_or_default());
                    }
                    Some("redacted_thinking") => {
                        msg.push_state(str_of(b, "data").unwrap_or_default())
                    }
                    Some("tool_use") | Some("server_tool_use") => msg.tool_calls.push(ToolCall {
                        id: string_of(b, "id"),
                        name: string_of(b, "name"),
                        arguments: arguments(b.get("input")),
                    }),
                    Some("tool_result") => {
                        if !msg.is_empty() {
                            out.push(std::mem::replace(&mut msg, Message::new(role)));
                        }
                        let mut result = Message::new(Role::Tool);
                        result.tool_call_id = str_of(b, "tool_use_id").map(str::to_owned);
                        match b.get("content") {
                            Some(Value::String(s)) => result.push_text(s.clone()),
                            Some(Value::Array(inner)) => {
                                for ib in inner {
                                    match str_of(ib, "type") {
                                        Some("text") => result.push_text(string_of(ib, "text")),
                                        Some("image") => result.content.push(Part::Image {
                                            url: anthropic_image(
                                                ib.get("source").unwrap_or(&Value::Null),
                                            ),
                                        }),
                                        _ => result.content.push(Part::Data { value: sorted(ib) }),
                                    }
                                }
                            }
                            _ => {}
                        }
                        out.push(result);
                    }
                    _ => msg.content.push(Part::Data { value: sorted(b) }),
                }
            }
        }
        _ => {}
    }
    if !msg.is_empty() || out.is_empty() {
        out.push(msg);
    }
}

fn anthropic_image(source: &Value) -> String {
    match str_of(source, "type") {
        Some("base64") => inline_image(
            str_of(source, "media_type").unwrap_or_default(),
            str_of(source, "data").unwrap_or_default(),
        ),
        Some("url") => string_of(source, "url"),
        _ => canonical(source),
    }
}
