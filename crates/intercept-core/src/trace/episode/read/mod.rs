//! The dialect readers, each into [`Message`]s: Chat Completions messages (`chat.rs`,
//! and `sampled.rs`, a Chat response's message read in the response's own pass),
//! Anthropic Messages blocks (`messages.rs`) and Responses items (`responses.rs`); and a
//! response's assistant message in any dialect ([`response_message`]).

mod chat;
mod messages;
mod responses;
mod sampled;
#[cfg(test)]
mod tests;

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest as _};
use serde_json::{Map, Value};

pub(crate) use self::chat::from_chat;
pub(crate) use self::messages::{anthropic_system, from_anthropic};
pub(crate) use self::responses::{from_response_items, from_responses};
pub use self::sampled::SampledChat;
pub(super) use self::sampled::{ChatResponse, ChatResponseValue};
use crate::dialect_kind::DialectKind;
use crate::trace::canonical::sorted;
use crate::trace::message::{hex, Hash, Message, Role};

/// Tool-call arguments: a JSON string is parsed (and its keys sorted); one that is not
/// JSON stays a string; an object (Anthropic `input`) is sorted.
fn arguments(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(parsed) => sorted(&parsed),
            Err(_) => Value::String(s.clone()),
        },
        Some(Value::Null) | None => Value::Object(Map::new()),
        Some(other) => sorted(other),
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn string_of(v: &Value, key: &str) -> String {
    str_of(v, key).unwrap_or_default().to_owned()
}

/// An image reference: URLs as they are, inline data by digest.
fn image_ref(url: &str) -> String {
    match url.strip_prefix("data:") {
        Some(rest) => {
            let (media, payload) = match rest.split_once(',') {
                Some((head, data)) => (head.split(';').next().unwrap_or_default(), data),
                None => ("", rest),
            };
            inline_image(media, payload)
        }
        None => url.to_owned(),
    }
}

fn inline_image(media: &str, payload: &str) -> String {
    let digest: Hash = Blake2b::<U16>::digest(payload.as_bytes()).into();
    format!("data:{media};blake2b128={}", hex(&digest))
}

fn role_of(name: &str) -> Role {
    match name {
        "system" | "developer" => Role::System,
        "assistant" | "model" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        _ => Role::User,
    }
}

/// The assistant message of a response in its dialect.
pub(in crate::trace::episode) fn response_message(
    kind: DialectKind,
    response: &Value,
) -> Option<Message> {
    match kind {
        DialectKind::ChatCompletions => {
            let choice = response.get("choices")?.get(0)?;
            let m = choice.get("message")?;
            let mut msg = from_chat(m);
            msg.role = Role::Assistant;
            Some(msg)
        }
        DialectKind::Completions => {
            let text = response.get("choices")?.get(0)?.get("text")?.as_str()?;
            Some(Message::text(Role::Assistant, text))
        }
        DialectKind::Messages => {
            let mut out = Vec::new();
            let mut m = serde_json::Map::new();
            m.insert("role".into(), Value::String("assistant".into()));
            m.insert("content".into(), response.get("content")?.clone());
            from_anthropic(&Value::Object(m), &mut out);
            out.into_iter().next()
        }
        DialectKind::Responses => {
            let mut out = Vec::new();
            from_responses(response.get("output")?, &mut out);
            let mut msg = Message::new(Role::Assistant);
            for m in out {
                msg.content.extend(m.content);
                msg.tool_calls.extend(m.tool_calls);
                if let Some(r) = m.reasoning {
                    msg.reasoning = Some(match msg.reasoning.take() {
                        Some(have) => format!("{have}\n{r}"),
                        None => r,
                    });
                }
                if let Some(s) = m.state {
                    msg.state = Some(match msg.state.take() {
                        Some(have) => format!("{have}\n{s}"),
                        None => s,
                    });
                }
            }
            Some(msg)
        }
    }
}
