//! The log's own lines written field by field: a node's message and a call line's
//! fields. Their strings go through the [`Encoder`] (long ones by reference), so nothing
//! is serialised first and walked again.

use serde::Serialize;

use super::encode::{Encoder, Invalid};
use super::NodeTokens;
use crate::trace::episode::{EpisodeBuilder, Message, Part, Role};
use crate::trace::record::{CallError, CallRecord, LastFields, Shape};

/// What token data node `id` holds, if any.
pub(crate) fn node_tokens(episode: &EpisodeBuilder, id: usize) -> Option<NodeTokens> {
    episode.node_data(id).tokens.as_ref().map(|t| NodeTokens {
        logprobs: t.logprobs.is_some(),
    })
}

/// Where a node line's reader finds the node's message (see `docs/traces.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// In the line itself.
    Line,
    /// The response of the call line that follows (a sampled node of that call).
    Response,
    /// Message `i` of those read from the elements the following call line's
    /// conversation adds.
    Added(usize),
}

/// Writes node `id` of `episode` as a `node` line (with its newline; see
/// `docs/traces.md`): `parent` left out when it is the node before, `sampled` when it
/// is false, the message when `source` says where else it is.
pub(crate) fn node(
    episode: &EpisodeBuilder,
    id: usize,
    source: Source,
    enc: &mut Encoder<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Invalid> {
    let n = episode.node_data(id);
    out.extend_from_slice(b"{\"type\":\"node\",\"id\":");
    int(out, id as u64);
    match n.parent {
        Some(p) if p as usize + 1 == id => {}
        Some(p) => {
            key(out, "parent");
            int(out, p);
        }
        None => out.extend_from_slice(b",\"parent\":null"),
    }
    if n.sampled {
        out.extend_from_slice(b",\"sampled\":true");
    }
    if let Some(call) = n.call {
        key(out, "call");
        int(out, call);
    }
    if let Some(t) = &n.tokens {
        key(out, "token_ids");
        crate::json_text::write_ids(out, &t.ids);
        key(out, "prompt_tokens");
        int(out, t.prompt);
        if let Some(l) = &t.logprobs {
            key(out, "logprobs");
            plain(out, l)?;
        }
        if t.start {
            out.extend_from_slice(b",\"token_start\":true");
        }
        if let Some(b) = t.brk {
            key(out, "token_break");
            out.push(b'"');
            out.extend_from_slice(b.as_str().as_bytes());
            out.push(b'"');
        }
    }
    match source {
        Source::Line => {
            key(out, "message");
            message(enc, &n.message, out, 2)?;
        }
        Source::Response => {}
        Source::Added(i) => {
            key(out, "from");
            int(out, i);
        }
    }
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// Writes `m` as its serde form (`{"role":…,"content":[…],…}`), strings through `enc`,
/// but for content that is one text part, written as that text (`"content":"…"`).
/// `depth` is the message object's depth in the line.
pub(crate) fn message(
    enc: &mut Encoder<'_>,
    m: &Message,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), Invalid> {
    out.extend_from_slice(b"{\"role\":");
    out.extend_from_slice(match m.role {
        Role::System => b"\"system\"",
        Role::User => b"\"user\"",
        Role::Assistant => b"\"assistant\"",
        Role::Tool => b"\"tool\"",
    });
    if let [Part::Text { text }] = &m.content[..] {
        out.extend_from_slice(b",\"content\":");
        enc.text(text, out);
    } else if !m.content.is_empty() {
        out.extend_from_slice(b",\"content\":[");
        for (i, part) in m.content.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match part {
                Part::Text { text } => {
                    out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
                    enc.text(text, out);
                }
                Part::Image { url } => {
                    out.extend_from_slice(b"{\"type\":\"image\",\"url\":");
                    enc.text(url, out);
                }
                Part::Data { value } => {
                    out.extend_from_slice(b"{\"type\":\"data\",\"value\":");
                    json(enc, value, out, depth + 3)?;
                }
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    if let Some(r) = &m.reasoning {
        out.extend_from_slice(b",\"reasoning\":");
        enc.text(r, out);
    }
    if !m.tool_calls.is_empty() {
        out.extend_from_slice(b",\"tool_calls\":[");
        for (i, call) in m.tool_calls.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"id\":");
            enc.text(&call.id, out);
            out.extend_from_slice(b",\"name\":");
            enc.text(&call.name, out);
            out.extend_from_slice(b",\"arguments\":");
            json(enc, &call.arguments, out, depth + 3)?;
            out.push(b'}');
        }
        out.push(b']');
    }
    if let Some(id) = &m.tool_call_id {
        out.extend_from_slice(b",\"tool_call_id\":");
        enc.text(id, out);
    }
    if let Some(state) = &m.state {
        out.extend_from_slice(b",\"state\":");
        enc.text(state, out);
    }
    out.push(b'}');
    Ok(())
}

/// A JSON value through `enc` (its long strings by reference, markers escaped).
fn json(
    enc: &mut Encoder<'_>,
    value: &serde_json::Value,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), Invalid> {
    match value {
        serde_json::Value::String(s) => {
            enc.text(s, out);
            Ok(())
        }
        serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
            let text = serde_json::to_string(value).map_err(|_| Invalid)?;
            enc.value(&text, 0, out, depth).map(drop)
        }
        scalar => plain(out, scalar),
    }
}

/// Plain data (numbers, enums, small structs) as serde_json writes it.
fn plain<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Invalid> {
    serde_json::to_writer(&mut *out, value).map_err(|_| Invalid)
}

fn key(out: &mut Vec<u8>, key: &str) {
    out.push(b',');
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
}

fn int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Writes a call line's fields before its bodies, without the closing brace: `type`,
/// then the record's fields in the order of [`CALL_FIELDS`](crate::record::CALL_FIELDS),
/// those whose text is the same as in the log's last call line (`last`; before the
/// first, their defaults) left out, as are the bodies and the token data its node holds
/// (`record/fields.rs`). `next` gets this line's fields.
pub(crate) fn call_meta(
    record: &CallRecord,
    tokens_on_node: Option<NodeTokens>,
    error: Option<&CallError>,
    (last, next): (&LastFields, &mut LastFields),
    out: &mut Vec<u8>,
) {
    let start = out.len();
    let shape = Shape::Log {
        last,
        next,
        ids_on_node: tokens_on_node.is_some(),
        logprobs_on_node: tokens_on_node.is_some_and(|t| t.logprobs),
        error,
    };
    if crate::trace::record::fields_write(record, shape, out).is_err() {
        // Plain data: this does not happen; the line keeps what identifies it.
        out.truncate(start);
        out.extend_from_slice(b"{\"type\":\"call\",\"seq\":");
        int(out, record.seq);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_call_line_follows_the_field_table_and_leaves_out_what_the_last_one_said() {
        use crate::record::{Omit, CALL_FIELDS};
        let line = |record: &CallRecord, last: &LastFields, next: &mut LastFields| {
            let mut out = Vec::new();
            call_meta(record, None, None, (last, next), &mut out);
            out.push(b'}');
            (
                crate::trace::record::tests::keys(&out),
                String::from_utf8(out).expect("utf-8"),
            )
        };
        let with = |keep: &dyn Fn(Omit) -> bool| {
            let mut names = vec!["type".to_owned()];
            names.extend(
                CALL_FIELDS
                    .iter()
                    .filter(|f| !f.apart_in_log && keep(f.omit))
                    .map(|f| f.name.to_owned()),
            );
            names
        };
        let none = LastFields::default();
        let (mut first, mut second, mut third) = Default::default();
        // The first line: every field away from its default.
        let full = crate::trace::record::tests::full();
        assert_eq!(line(&full, &none, &mut first).0, with(&|_| true));
        let minimal = CallRecord {
            response: None,
            ..crate::trace::record::tests::minimal()
        };
        let mut scratch = LastFields::default();
        assert_eq!(
            line(&minimal, &none, &mut scratch).0,
            with(&|omit| omit == Omit::Never)
        );
        // The next: what changed only.
        let mut again = full.clone();
        again.seq += 1;
        assert_eq!(line(&again, &first, &mut second).0, ["type", "seq"]);
        // A field back at its default is written, as its default.
        let mut cleared = again.clone();
        cleared.error = None;
        cleared.node = None;
        let (keys, text) = line(&cleared, &second, &mut third);
        assert_eq!(keys, ["type", "error", "node"]);
        assert!(text.contains(r#""error":null,"node":null"#), "{text}");
    }
    use crate::trace::episode::ToolCall;
    use crate::trace::log::encode::Values;

    fn write(m: &Message) -> (String, String) {
        let mut values = Values::default();
        let (mut defs, mut out) = (Vec::new(), Vec::new());
        let mut enc = Encoder {
            values: &mut values,
            defs: &mut defs,
        };
        message(&mut enc, m, &mut out, 2).expect("plain data");
        (
            String::from_utf8(out).expect("utf-8"),
            String::from_utf8(defs).expect("utf-8"),
        )
    }

    fn every_field(text: &str) -> Message {
        Message {
            role: Role::Assistant,
            content: vec![
                Part::Text { text: text.into() },
                Part::Image {
                    url: "data:image/png;blake2b128=00".into(),
                },
                Part::Data {
                    value: json!({"a": [1, "x\n"], "$v": 2}),
                },
            ],
            reasoning: Some("why \"so\"".into()),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "sh".into(),
                arguments: json!({"cmd": "ls\t-l"}),
            }],
            tool_call_id: Some("call_0".into()),
            state: Some("sig".into()),
        }
    }

    #[test]
    fn a_message_of_short_strings_is_its_serde_form() {
        for m in [
            every_field("hi \u{1} é"),
            Message {
                role: Role::Tool,
                content: Vec::new(),
                reasoning: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                state: None,
            },
        ] {
            let (out, defs) = write(&m);
            assert_eq!(out, serde_json::to_string(&m).expect("json"));
            assert_eq!(defs, "");
        }
    }

    #[test]
    fn long_strings_are_values_and_escaped_markers_stay_escaped() {
        let long = "line\n".repeat(20);
        let mut m = every_field(&long);
        m.content[2] = Part::Data {
            value: json!({"$v": 2}),
        };
        let (out, defs) = write(&m);
        assert!(
            out.starts_with(r#"{"role":"assistant","content":[{"type":"text","text":{"$v":0}}"#),
            "{out}"
        );
        assert!(
            out.contains(r#"{"type":"data","value":{"$e":{"$v":2}}}"#),
            "{out}"
        );
        let value: serde_json::Value =
            serde_json::from_str(defs.trim_end()).expect("one value line");
        assert_eq!(value["value"], long.as_str());
    }
}
