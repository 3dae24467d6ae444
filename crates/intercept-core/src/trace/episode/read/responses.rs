//! Responses `input` and `output` items.

use serde_json::Value;

use super::chat::chat_content;
use super::{arguments, image_ref, role_of, str_of, string_of};
use crate::trace::canonical::sorted;
use crate::trace::episode::{Message, Part, Role, ToolCall};

/// Responses `input` (a string or items) or `output` items. Consecutive assistant-side
/// items (an assistant message, reasoning, function calls) form one assistant message.
pub(crate) fn from_responses(items: &Value, out: &mut Vec<Message>) {
    match items {
        Value::String(s) => out.push(Message::text(Role::User, s.clone())),
        Value::Array(items) => from_response_items(items, out),
        _ => {}
    }
}

/// Responses `input` or `output` items (see [`from_responses`]).
pub(crate) fn from_response_items(items: &[Value], out: &mut Vec<Message>) {
    let mut turn: Option<Message> = None;
    let flush = |turn: &mut Option<Message>, out: &mut Vec<Message>| {
        if let Some(t) = turn.take() {
            out.push(t);
        }
    };
    for item in items {
        let kind = str_of(item, "type").unwrap_or("message");
        match kind {
            "message" => {
                let role = role_of(str_of(item, "role").unwrap_or("user"));
                if role == Role::Assistant {
                    let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                    chat_content(item.get("content"), t);
                } else {
                    flush(&mut turn, out);
                    let mut msg = Message::new(role);
                    responses_content(item.get("content"), &mut msg);
                    out.push(msg);
                }
            }
            "reasoning" => {
                let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                for key in ["summary", "content"] {
                    if let Some(parts) = item.get(key).and_then(Value::as_array) {
                        for p in parts {
                            t.push_reasoning(str_of(p, "text").unwrap_or_default());
                        }
                    }
                }
                t.push_state(str_of(item, "encrypted_content").unwrap_or_default());
            }
            "function_call" | "custom_tool_call" => {
                let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                let args = item.get("arguments").or_else(|| item.get("input"));
                t.tool_calls.push(ToolCall {
                    id: string_of(item, "call_id"),
                    name: string_of(item, "name"),
                    arguments: arguments(args),
                });
            }
            "function_call_output" | "custom_tool_call_output" => {
                flush(&mut turn, out);
                let mut msg = Message::new(Role::Tool);
                msg.tool_call_id = str_of(item, "call_id").map(str::to_owned);
                responses_content(item.get("output"), &mut msg);
                out.push(msg);
            }
            _ => {
                // Another item (a built-in tool call, an image generation): kept whole.
                let t = turn.get_or_insert_with(|| Message::new(Role::Assistant));
                t.content.push(Part::Data {
                    value: sorted(item),
                });
            }
        }
    }
    flush(&mut turn, out);
}

fn responses_content(content: Option<&Value>, msg: &mut Message) {
    match content {
        Some(Value::Array(parts)) => {
            for p in parts {
                match str_of(p, "type") {
                    Some("input_text") | Some("output_text") | Some("text") => {
                        msg.push_text(string_of(p, "text"))
                    }
                    Some("input_image") => {
                        let url = str_of(p, "image_url")
                            .map(image_ref)
                            .or_else(|| str_of(p, "file_id").map(|f| format!("file:{f}")))
                            .unwrap_or_default();
                        msg.content.push(Part::Image { url });
                    }
                    Some("refusal") => msg.push_text(string_of(p, "refusal")),
                    _ => msg.content.push(Part::Data { value: sorted(p) }),
                }
            }
        }
        other => chat_content(other, msg),
    }
}
