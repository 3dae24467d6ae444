//! The dialect readers, each into [`Message`](crate::episode::Message)s: Chat Completions
//! messages (`chat.rs`, and `sampled.rs`, a Chat response's message read in the
//! response's own pass), Anthropic Messages blocks (`messages.rs`) and Responses items
//! (`responses.rs`).

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
pub(crate) use self::responses::from_responses;
pub use self::sampled::SampledChat;
use super::canonical::sorted;
use super::message::{hex, Hash, Role};

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
