//! The assembled completion, written straight from the assembler's buffers.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::body::RawJson;
use crate::dialect::{Assembled, Summary};
use crate::trace::record::Usage;

use super::WireUsage;

/// The assembled `chat.completion`'s choice, written straight from the assembler's
/// buffers (no `serde_json::Value` tree, no copy of the text) by its
/// [`AssembledChoice`] impl; the derived `Serialize` is what the tests compare it with.
#[derive(Serialize)]
pub(super) struct OutChoice<'a> {
    pub(super) index: u32,
    pub(super) message: OutMessage<'a>,
    pub(super) finish_reason: Option<&'a str>,
    /// Always `null`.
    pub(super) logprobs: (),
}

#[derive(Serialize)]
pub(super) struct OutMessage<'a> {
    pub(super) role: &'static str,
    pub(super) content: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) reasoning_content: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) reasoning: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) tool_calls: Vec<OutToolCall<'a>>,
}

#[derive(Serialize)]
pub(super) struct OutToolCall<'a> {
    pub(super) id: &'a str,
    #[serde(rename = "type")]
    pub(super) kind: &'a str,
    pub(super) function: OutFunction<'a>,
}

#[derive(Serialize)]
pub(super) struct OutFunction<'a> {
    pub(super) name: &'a str,
    pub(super) arguments: &'a str,
}

/// The one choice of an assembled completion, written into the response.
pub(in crate::dialect) trait AssembledChoice {
    fn write_json(&self, out: &mut Vec<u8>);
}

impl AssembledChoice for OutChoice<'_> {
    /// The choice as its derived `Serialize` writes it (the tests' reference), with the
    /// text fields escaped by [`crate::json_text`] (serde_json escapes byte by byte).
    fn write_json(&self, out: &mut Vec<u8>) {
        use crate::json_text::{write_opt_str, write_str};
        let m = &self.message;
        out.extend_from_slice(b"{\"index\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.index).as_bytes());
        out.extend_from_slice(b",\"message\":{\"role\":");
        write_str(out, m.role);
        out.extend_from_slice(b",\"content\":");
        write_opt_str(out, m.content);
        if !m.reasoning_content.is_empty() {
            out.extend_from_slice(b",\"reasoning_content\":");
            write_str(out, m.reasoning_content);
        }
        if !m.reasoning.is_empty() {
            out.extend_from_slice(b",\"reasoning\":");
            write_str(out, m.reasoning);
        }
        if let Some(refusal) = m.refusal {
            out.extend_from_slice(b",\"refusal\":");
            write_str(out, refusal);
        }
        if !m.tool_calls.is_empty() {
            out.extend_from_slice(b",\"tool_calls\":[");
            for (i, call) in m.tool_calls.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"id\":");
                write_str(out, call.id);
                out.extend_from_slice(b",\"type\":");
                write_str(out, call.kind);
                out.extend_from_slice(b",\"function\":{\"name\":");
                write_str(out, call.function.name);
                out.extend_from_slice(b",\"arguments\":");
                write_str(out, call.function.arguments);
                out.extend_from_slice(b"}}");
            }
            out.push(b']');
        }
        out.extend_from_slice(b"},\"finish_reason\":");
        write_opt_str(out, self.finish_reason);
        out.extend_from_slice(b",\"logprobs\":null}");
    }
}

impl AssembledChoice for Value {
    fn write_json(&self, out: &mut Vec<u8>) {
        // A `Value` always serialises.
        let _ = serde_json::to_writer(out, self);
    }
}

/// An assembled OpenAI-style stream (`object` is `chat.completion` or
/// `text_completion`): the response (the stream's head fields, `id` defaulting to
/// `intercept-assembled`, then `object`, one choice and the usage), encoded at once, and
/// its summary (usage read as zero when absent or unreadable).
pub(in crate::dialect) fn assembled_completion<C: AssembledChoice>(
    head: Option<&Map<String, Value>>,
    object: &'static str,
    choice: &C,
    usage: Option<&Value>,
    finish_reason: &str,
) -> Assembled {
    use crate::json_text::write_str;
    // Written as serde_json writes a map of these entries, in this order.
    let mut out = Vec::with_capacity(512);
    out.push(b'{');
    if !head.is_some_and(|h| h.contains_key("id")) {
        out.extend_from_slice(b"\"id\":\"intercept-assembled\",");
    }
    for (key, value) in head
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "object" | "choices" | "usage"))
    {
        write_str(&mut out, key);
        out.push(b':');
        // A `Value` always serialises.
        let _ = serde_json::to_writer(&mut out, value);
        out.push(b',');
    }
    out.extend_from_slice(b"\"object\":");
    write_str(&mut out, object);
    out.extend_from_slice(b",\"choices\":[");
    choice.write_json(&mut out);
    out.push(b']');
    if let Some(u) = usage {
        out.extend_from_slice(b",\"usage\":");
        let _ = serde_json::to_writer(&mut out, u);
    }
    out.push(b'}');
    let response = RawJson::new(bytes::Bytes::from(out));
    Assembled {
        response,
        summary: Summary {
            finish_reason: Some(finish_reason.to_owned()),
            usage: usage
                .and_then(|u| WireUsage::deserialize(u).ok())
                .map(Usage::from)
                .unwrap_or_default(),
            message: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use serde_json::json;

    /// The assembled completion as serde_json writes it from the derived `Serialize`
    /// (the reference for the hand-written encoder).
    fn assembled_by_serde<C: Serialize>(
        head: Option<&Map<String, Value>>,
        object: &'static str,
        choice: &C,
        usage: Option<&Value>,
    ) -> Vec<u8> {
        struct Out<'a, C> {
            head: Option<&'a Map<String, Value>>,
            object: &'static str,
            choice: &'a C,
            usage: Option<&'a Value>,
        }
        impl<C: Serialize> Serialize for Out<'_, C> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap as _;
                let mut map = serializer.serialize_map(None)?;
                if !self.head.is_some_and(|h| h.contains_key("id")) {
                    map.serialize_entry("id", "intercept-assembled")?;
                }
                for (key, value) in self
                    .head
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| !matches!(k.as_str(), "object" | "choices" | "usage"))
                {
                    map.serialize_entry(key, value)?;
                }
                map.serialize_entry("object", self.object)?;
                map.serialize_entry("choices", &[self.choice])?;
                if let Some(u) = self.usage {
                    map.serialize_entry("usage", u)?;
                }
                map.end()
            }
        }
        serde_json::to_vec(&Out {
            head,
            object,
            choice,
            usage,
        })
        .expect("json")
    }

    proptest! {
        /// The hand-written response is byte for byte the derived one: any text (quotes,
        /// controls, non-ASCII), any optional field, tool calls, head fields and usage.
        #[test]
        fn the_assembled_completion_is_what_serde_json_writes(
            content in proptest::option::of("(\\PC|[\u{0}-\u{1f}\"\\\\]){0,30}"),
            reasoning_content in "(\\PC|\n){0,10}",
            reasoning in "(\\PC|\"){0,10}",
            refusal in proptest::option::of("\\PC{0,10}"),
            calls in proptest::collection::vec(("\\PC{0,6}", "[a-z]{0,8}", "\\PC{0,6}", "(\\PC|[{}\":]){0,20}"), 0..3),
            finish in proptest::option::of("[a-z_]{1,12}"),
            head_id in proptest::option::of("\\PC{0,8}"),
            extra in proptest::collection::btree_map("[a-z\"]{1,6}", "\\PC{0,6}", 0..3),
            usage in any::<bool>(),
        ) {
            let choice = OutChoice {
                index: 0,
                message: OutMessage {
                    role: "assistant",
                    content: content.as_deref(),
                    reasoning_content: &reasoning_content,
                    reasoning: &reasoning,
                    refusal: refusal.as_deref(),
                    tool_calls: calls
                        .iter()
                        .map(|(id, kind, name, args)| OutToolCall {
                            id,
                            kind,
                            function: OutFunction { name, arguments: args },
                        })
                        .collect(),
                },
                finish_reason: finish.as_deref(),
                logprobs: (),
            };
            let mut head = Map::new();
            if let Some(id) = head_id {
                head.insert("id".into(), json!(id));
            }
            head.insert("object".into(), json!("chat.completion.chunk"));
            for (k, v) in extra {
                head.insert(k, json!(v));
            }
            let usage = usage.then(|| json!({"prompt_tokens": 3, "completion_tokens": 4}));
            for head in [None, Some(&head)] {
                let ours = assembled_completion(head, "chat.completion", &choice, usage.as_ref(), "");
                let reference = assembled_by_serde(head, "chat.completion", &choice, usage.as_ref());
                prop_assert_eq!(
                    String::from_utf8(ours.response.bytes().to_vec()).unwrap(),
                    String::from_utf8(reference).unwrap()
                );
            }
        }
    }
}
