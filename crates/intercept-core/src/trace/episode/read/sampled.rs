//! A Chat response's message read in the same pass as the rest of the response, by a
//! serde visitor, without building a `Value`; and the Chat response read down to its
//! first choice's message.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::trace::episode::{Message, Role};

/// A Chat response's message read in the same pass as the rest of the response, without
/// building a [`Value`]: `Plain` for the usual sampled turn (text or null content,
/// optional reasoning, no tool calls), read exactly as `from_chat` reads it (with the
/// role taken as `assistant`); `Other` for any other shape (tool calls, content parts, a
/// member of an unexpected type), which the caller reads with `from_chat` instead.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SampledChat {
    /// The message.
    Plain(Message),
    /// A shape this reader leaves to `from_chat`.
    Other,
}

impl SampledChat {
    /// The message, when it was read.
    pub fn into_plain(self) -> Option<Message> {
        match self {
            SampledChat::Plain(m) => Some(m),
            SampledChat::Other => None,
        }
    }
}

/// A string member, `null` (or absent), or something else.
enum TextOrOther<'a> {
    Text(Cow<'a, str>),
    Null,
    Other,
}

/// Reads `T::OTHER` from any value but the ones a visitor reads itself: the shapes both
/// readers below skip.
trait Skipped: Sized {
    const OTHER: Self;
}

impl Skipped for TextOrOther<'_> {
    const OTHER: Self = TextOrOther::Other;
}

impl Skipped for SampledChat {
    const OTHER: Self = SampledChat::Other;
}

fn skip_seq<'de, T: Skipped, A: SeqAccess<'de>>(mut seq: A) -> Result<T, A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(T::OTHER)
}

fn skip_map<'de, T: Skipped, A: MapAccess<'de>>(mut map: A) -> Result<T, A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(T::OTHER)
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = TextOrOther<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(TextOrOther::Text(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(TextOrOther::Text(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(TextOrOther::Text(Cow::Owned(s)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(TextOrOther::Null)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(TextOrOther::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)
    }
}

impl<'de> Deserialize<'de> for TextOrOther<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

/// A member name, borrowed from the input unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }

            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

struct SampledVisitor;

impl<'de> Visitor<'de> for SampledVisitor {
    type Value = SampledChat;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a chat message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SampledChat, A::Error> {
        let mut plain = true;
        let (mut content, mut reasoning_content, mut reasoning) = (None, None, None);
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            let slot = match &*key {
                "content" => &mut content,
                "reasoning_content" => &mut reasoning_content,
                "reasoning" => &mut reasoning,
                "tool_calls" => {
                    // Only a null `tool_calls` is plain.
                    if !matches!(map.next_value::<TextOrOther<'de>>()?, TextOrOther::Null) {
                        plain = false;
                    }
                    continue;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            // A repeated member: the last one counts, as in a `Value`.
            *slot = match map.next_value::<TextOrOther<'de>>()? {
                TextOrOther::Text(t) => Some(t),
                TextOrOther::Null => None,
                TextOrOther::Other => {
                    plain = false;
                    None
                }
            };
        }
        if !plain {
            return Ok(SampledChat::Other);
        }
        let mut msg = Message::new(Role::Assistant);
        if let Some(text) = content {
            msg.push_text(text.into_owned());
        }
        if let Some(r) = reasoning_content.or(reasoning) {
            msg.push_reasoning(&r);
        }
        Ok(SampledChat::Plain(msg))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<SampledChat, E> {
        Ok(SampledChat::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<SampledChat, A::Error> {
        skip_seq(seq)
    }
}

impl<'de> Deserialize<'de> for SampledChat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SampledVisitor)
    }
}

/// A Chat response's first choice's message, read without building the rest: the usual
/// shape as it stands, any other as a [`Value`] (see [`SampledChat`]).
#[derive(Deserialize)]
pub(in crate::trace::episode) struct ChatResponse {
    pub(in crate::trace::episode) choices: Vec<ChatChoice>,
}

#[derive(Deserialize)]
pub(in crate::trace::episode) struct ChatChoice {
    #[serde(default)]
    pub(in crate::trace::episode) message: Option<SampledChat>,
}

/// The same, for a message [`SampledChat`] leaves to the general reader.
#[derive(Deserialize)]
pub(in crate::trace::episode) struct ChatResponseValue {
    pub(in crate::trace::episode) choices: Vec<ChatChoiceValue>,
}

#[derive(Deserialize)]
pub(in crate::trace::episode) struct ChatChoiceValue {
    pub(in crate::trace::episode) message: Option<Value>,
}
