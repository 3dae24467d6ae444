//! Chat Completions messages.

use serde_json::Value;

use super::{arguments, image_ref, role_of, str_of, string_of};
use crate::trace::canonical::sorted;
use crate::trace::episode::{Message, Part, Role, ToolCall};

/// One Chat Completions message (request `messages[]` or response `choices[].message`).
pub(crate) fn from_chat(m: &Value) -> Message {
    let role = role_of(str_of(m, "role").unwrap_or("user"));
    let mut msg = Message::new(role);
    chat_content(m.get("content"), &mut msg);
    if let Some(r) = str_of(m, "reasoning_content").or_else(|| str_of(m, "reasoning")) {
        msg.push_reasoning(r);
    }
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            let f = c.get("function").unwrap_or(&Value::Null);
            msg.tool_calls.push(ToolCall {
                id: string_of(c, "id"),
                name: string_of(f, "name"),
                arguments: arguments(f.get("arguments")),
            });
        }
    }
    if role == Role::Tool {
        msg.tool_call_id = str_of(m, "tool_call_id").map(str::to_owned);
    }
    msg
}

pub(super) fn chat_content(content: Option<&Value>, msg: &mut Message) {
    match content {
        Some(Value::String(s)) => msg.push_text(s.clone()),
        Some(Value::Array(parts)) => {
            for p in parts {
                match str_of(p, "type") {
                    Some("text") | Some("input_text") | Some("output_text") => {
                        msg.push_text(string_of(p, "text"))
                    }
                    Some("image_url") => {
                        let url = match p.get("image_url") {
                            Some(Value::String(s)) => s.as_str(),
                            Some(o) => str_of(o, "url").unwrap_or_default(),
                            None => "",
                        };
                        msg.content.push(Part::Image {
                            url: image_ref(url),
                        });
                    }
                    Some("refusal") => msg.push_text(string_of(p, "refusal")),
                    _ => msg.content.push(Part::Data { value: sorted(p) }),
                }
            }
        }
        _ => {}
    }
}
