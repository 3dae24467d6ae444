//! A call's JSON fields, written once: [`CALL_FIELDS`] names each field and when a line
//! leaves it out, and [`write`] writes a record's fields in that order, as a full
//! record's line ([`Shape::Record`]) or as the fields of a log's call line
//! ([`Shape::Log`]). Both lines, and the readers that put back what a line leaves out
//! (the log's reader, the Python package's `CallRecord.to_dict`), follow this table.

use serde::Serialize;

use super::{CallError, CallRecord, TokenCapture};
use crate::json_text::write_str;

/// When a call's line leaves a field out. A log's call line leaves out any field the
/// call line before had the same; before the first, a field that has a default (`InLog`
/// and `WhenDefault`) holds it (format 2 left out `InLog` fields at their defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Omit {
    /// Always in a full record; no default.
    Never,
    /// Always in a full record; has a default, which a log's line stands for.
    InLog,
    /// Left out of a full record when it holds its default.
    WhenDefault,
}

/// One field of a call's JSON ([`CALL_FIELDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallField {
    /// Its key.
    pub name: &'static str,
    /// When a line leaves it out.
    pub omit: Omit,
    /// Its default as JSON text, which a reader puts in for a field left out (empty for
    /// a field that is never left out).
    pub default: &'static str,
    /// Whether a log writes it apart from its call line's fields: the session id in the
    /// header, the request and response through the log's encoder.
    pub apart_in_log: bool,
}

const fn field(name: &'static str, omit: Omit, default: &'static str) -> CallField {
    CallField {
        name,
        omit,
        default,
        apart_in_log: false,
    }
}

const fn always(name: &'static str) -> CallField {
    field(name, Omit::Never, "")
}

const fn apart(name: &'static str) -> CallField {
    CallField {
        apart_in_log: true,
        ..always(name)
    }
}

/// Every field of a call's JSON ([`CallRecord`]'s serde form), in the order a line
/// writes them. Adding a field to [`CallRecord`] is adding it here and to [`write`]
/// (`docs/traces.md` says how); the tests hold serde, both lines and the Python reader
/// to this list.
pub const CALL_FIELDS: [CallField; 29] = [
    apart("session"),
    always("seq"),
    always("dialect"),
    always("endpoint"),
    always("model"),
    field("requested_model", Omit::WhenDefault, "null"),
    always("stream"),
    field("sampling", Omit::InLog, "{}"),
    apart("request"),
    apart("response"),
    field("finish_reason", Omit::InLog, "null"),
    always("usage"),
    always("status"),
    always("started_at"),
    always("ended_at"),
    field("ttfb_ms", Omit::InLog, "null"),
    field("client_disconnected", Omit::InLog, "false"),
    field("error", Omit::InLog, "null"),
    field("epoch", Omit::InLog, "0"),
    field("engine", Omit::WhenDefault, "null"),
    field("token_capture", Omit::WhenDefault, "\"off\""),
    field("prompt_token_ids", Omit::WhenDefault, "null"),
    field("completion_token_ids", Omit::WhenDefault, "null"),
    field("completion_logprobs", Omit::WhenDefault, "null"),
    field("token_path", Omit::WhenDefault, "null"),
    field("token_reason", Omit::WhenDefault, "null"),
    field("node", Omit::WhenDefault, "null"),
    field("policy", Omit::WhenDefault, "null"),
    field("truncated", Omit::WhenDefault, "false"),
];

/// Which line [`write`] writes.
#[derive(Debug)]
pub(crate) enum Shape<'a> {
    /// A full record, whole: `{"session":…, …}` with its bodies (the response already
    /// checked to be UTF-8, `None` for `null`).
    Record {
        /// The response's text.
        response: Option<&'a str>,
    },
    /// A log's call line's fields, without the fields written apart and without the
    /// closing brace; the line starts with `{"type":"call"`. A field whose text is the
    /// same as in the log's last call line (`last`) is left out.
    Log {
        /// The log's last call line's fields.
        last: &'a LastFields,
        /// Gets this line's fields, to be the next line's `last`.
        next: &'a mut LastFields,
        /// The call's token ids are on its node (left out of the line).
        ids_on_node: bool,
        /// The call's logprobs are on its node (left out of the line).
        logprobs_on_node: bool,
        /// The error to write instead of the record's.
        error: Option<&'a CallError>,
    },
}

/// A log's last call line's fields, as their JSON text (`docs/traces.md`): a call line
/// leaves out each field whose text is the same. Before the first call line, a field
/// that has a default holds it.
#[derive(Debug, Default, Clone)]
pub(crate) struct LastFields {
    text: Vec<u8>,
    /// Per field of [`CALL_FIELDS`].
    at: [Slot; CALL_FIELDS.len()],
}

/// What [`LastFields`] knows of a field.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Nothing written yet: its default, if it has one.
    #[default]
    Unset,
    /// Its default.
    Default,
    /// This range of the text.
    Text(u32, u32),
}

impl LastFields {
    /// Field `i`'s text, if known.
    fn get(&self, i: usize) -> Option<&[u8]> {
        match self.at[i] {
            Slot::Text(a, b) => self.text.get(a as usize..b as usize),
            Slot::Unset | Slot::Default => {
                Some(CALL_FIELDS[i].default.as_bytes()).filter(|d| !d.is_empty())
            }
        }
    }

    /// Whether field `i` holds its default.
    fn is_default(&self, i: usize) -> bool {
        match self.at[i] {
            Slot::Default => true,
            Slot::Unset => !CALL_FIELDS[i].default.is_empty(),
            Slot::Text(..) => false,
        }
    }

    fn clear(&mut self) {
        self.text.clear();
        self.at = Default::default();
    }

    fn set(&mut self, i: usize, text: &[u8]) {
        let a = self.text.len() as u32;
        self.text.extend_from_slice(text);
        self.at[i] = Slot::Text(a, self.text.len() as u32);
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.text.capacity()
    }
}

/// The line being written: each field goes through [`Line::field`], which keeps the
/// order of [`CALL_FIELDS`] and leaves out what the shape leaves out.
struct Line<'o> {
    out: &'o mut Vec<u8>,
    /// A log's call line: its last call line's fields, and this line's (see
    /// [`LastFields`]); `None` for a full record.
    delta: Option<(&'o LastFields, &'o mut LastFields)>,
    /// The next field's index in [`CALL_FIELDS`].
    next: usize,
    first: bool,
}

impl Line<'_> {
    /// Writes field `name` (the next one of [`CALL_FIELDS`]) with `value`, unless the
    /// line leaves it out: `default` says it holds its default (or, in a log, that the
    /// line does not carry it).
    fn field(
        &mut self,
        name: &'static str,
        default: bool,
        value: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>,
    ) -> Result<(), serde_json::Error> {
        let i = self.next;
        let f = &CALL_FIELDS[i];
        debug_assert_eq!(f.name, name, "the writer follows CALL_FIELDS");
        self.next += 1;
        if f.apart_in_log && self.delta.is_some() {
            return Ok(());
        }
        if let Some((last, next)) = &mut self.delta {
            let at_default = default && !f.default.is_empty();
            if at_default {
                next.at[i] = Slot::Default;
                if last.is_default(i) {
                    return Ok(());
                }
            }
            let mark = self.out.len();
            self.out.extend_from_slice(b",\"");
            self.out.extend_from_slice(name.as_bytes());
            self.out.extend_from_slice(b"\":");
            if at_default {
                self.out.extend_from_slice(f.default.as_bytes());
                return Ok(());
            }
            let at = self.out.len();
            value(self.out)?;
            let text = &self.out[at..];
            next.set(i, text);
            if last.get(i) == Some(text) {
                self.out.truncate(mark);
            }
            return Ok(());
        }
        // A full record's field: left out only at its default when the table says so.
        if default && f.omit == Omit::WhenDefault {
            return Ok(());
        }
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
        value(self.out)
    }
}

fn int(out: &mut Vec<u8>, n: impl itoa::Integer) -> Result<(), serde_json::Error> {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    Ok(())
}

fn json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut *out, value)
}

fn text(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    write_str(out, s);
    Ok(())
}

/// `usage` as serde writes it, without serde's key escaping (the keys are constants).
fn usage(out: &mut Vec<u8>, u: &super::Usage) -> Result<(), serde_json::Error> {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(b"{\"prompt_tokens\":");
    out.extend_from_slice(buf.format(u.prompt_tokens).as_bytes());
    out.extend_from_slice(b",\"completion_tokens\":");
    out.extend_from_slice(buf.format(u.completion_tokens).as_bytes());
    out.extend_from_slice(b",\"cached_input_tokens\":");
    out.extend_from_slice(buf.format(u.cached_input_tokens).as_bytes());
    out.extend_from_slice(b",\"reasoning_tokens\":");
    out.extend_from_slice(buf.format(u.reasoning_tokens).as_bytes());
    out.push(b'}');
    Ok(())
}

/// An object of JSON values, its keys copied in as strings and its values through
/// serde_json.
fn object(
    out: &mut Vec<u8>,
    map: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), serde_json::Error> {
    out.push(b'{');
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, k);
        out.push(b':');
        json(out, v)?;
    }
    out.push(b'}');
    Ok(())
}

/// Token ids as a JSON array of integers (`null` when absent).
fn ids(out: &mut Vec<u8>, ids: Option<&[u32]>) -> Result<(), serde_json::Error> {
    match ids {
        Some(ids) => crate::json_text::write_ids(out, ids),
        None => out.extend_from_slice(b"null"),
    }
    Ok(())
}

fn boolean(out: &mut Vec<u8>, b: bool) -> Result<(), serde_json::Error> {
    out.extend_from_slice(if b { b"true" } else { b"false" });
    Ok(())
}

/// Writes `r`'s fields as `shape` says: keys are constants, plain strings and integers
/// are copied in, the other values go through serde_json, and the request is copied
/// from its pieces ([`crate::JsonBody::write_to`]).
pub(crate) fn write(
    r: &CallRecord,
    shape: Shape<'_>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let (delta, response, ids_on_node, logprobs_on_node, error) = match shape {
        Shape::Record { response } => (None, response, false, false, r.error.as_ref()),
        Shape::Log {
            last,
            next,
            ids_on_node,
            logprobs_on_node,
            error,
        } => {
            next.clear();
            (
                Some((last, next)),
                None,
                ids_on_node,
                logprobs_on_node,
                error.or(r.error.as_ref()),
            )
        }
    };
    let log = delta.is_some();
    out.push(b'{');
    if log {
        out.extend_from_slice(b"\"type\":\"call\"");
    }
    let mut l = Line {
        out,
        delta,
        next: 0,
        first: !log,
    };
    l.field("session", false, |o| text(o, &r.session))?;
    l.field("seq", false, |o| int(o, r.seq))?;
    l.field("dialect", false, |o| {
        o.push(b'"');
        o.extend_from_slice(r.dialect.as_str().as_bytes());
        o.push(b'"');
        Ok(())
    })?;
    l.field("endpoint", false, |o| text(o, &r.endpoint))?;
    l.field("model", false, |o| text(o, &r.model))?;
    let asked = r.requested_model.as_deref();
    l.field("requested_model", asked.is_none(), |o| {
        text(o, asked.unwrap_or_default())
    })?;
    l.field("stream", false, |o| boolean(o, r.stream))?;
    l.field("sampling", r.sampling.is_empty(), |o| {
        object(o, &r.sampling)
    })?;
    l.field("request", false, |o| {
        r.request.write_to(o);
        Ok(())
    })?;
    l.field("response", false, |o| {
        o.extend_from_slice(response.map_or(&b"null"[..], str::as_bytes));
        Ok(())
    })?;
    let finish = r.finish_reason.as_deref();
    l.field("finish_reason", finish.is_none(), |o| {
        crate::json_text::write_opt_str(o, finish);
        Ok(())
    })?;
    l.field("usage", false, |o| usage(o, &r.usage))?;
    l.field("status", false, |o| int(o, r.status))?;
    l.field("started_at", false, |o| json(o, &r.started_at))?;
    l.field("ended_at", false, |o| json(o, &r.ended_at))?;
    l.field("ttfb_ms", r.ttfb_ms.is_none(), |o| json(o, &r.ttfb_ms))?;
    l.field("client_disconnected", !r.client_disconnected, |o| {
        boolean(o, r.client_disconnected)
    })?;
    l.field("error", error.is_none(), |o| json(o, &error))?;
    l.field("epoch", r.epoch == 0, |o| int(o, r.epoch))?;
    write_tail(r, &mut l, ids_on_node, logprobs_on_node)?;
    debug_assert_eq!(l.next, CALL_FIELDS.len(), "every field is written");
    if !log {
        l.out.push(b'}');
    }
    Ok(())
}

/// The fields after `epoch`: the engine's and the token path's, each left out when
/// unset (see [`write`]).
fn write_tail(
    r: &CallRecord,
    l: &mut Line<'_>,
    ids_on_node: bool,
    logprobs_on_node: bool,
) -> Result<(), serde_json::Error> {
    let engine = r.engine.as_deref();
    l.field("engine", engine.is_none(), |o| {
        text(o, engine.unwrap_or_default())
    })?;
    l.field("token_capture", r.token_capture == TokenCapture::Off, |o| {
        json(o, &r.token_capture)
    })?;
    let prompt = r.prompt_token_ids.as_deref().filter(|_| !ids_on_node);
    l.field("prompt_token_ids", prompt.is_none(), |o| ids(o, prompt))?;
    let completion = r.completion_token_ids.as_deref().filter(|_| !ids_on_node);
    l.field("completion_token_ids", completion.is_none(), |o| {
        ids(o, completion)
    })?;
    let logprobs = r
        .completion_logprobs
        .as_deref()
        .filter(|_| !logprobs_on_node);
    l.field("completion_logprobs", logprobs.is_none(), |o| {
        json(o, &logprobs)
    })?;
    l.field("token_path", r.token_path.is_none(), |o| {
        json(o, &r.token_path)
    })?;
    let reason = r.token_reason.as_deref();
    l.field("token_reason", reason.is_none(), |o| {
        text(o, reason.unwrap_or_default())
    })?;
    l.field("node", r.node.is_none(), |o| json(o, &r.node))?;
    l.field("policy", r.policy.is_none(), |o| json(o, &r.policy))?;
    l.field("truncated", !r.truncated, |o| boolean(o, r.truncated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_field_once_and_defaults_are_json() {
        let mut names: Vec<&str> = CALL_FIELDS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CALL_FIELDS.len());
        for f in CALL_FIELDS {
            if f.omit == Omit::Never {
                assert!(f.default.is_empty(), "{}", f.name);
            } else {
                serde_json::from_str::<serde_json::Value>(f.default)
                    .unwrap_or_else(|e| panic!("{}: {e}", f.name));
            }
        }
    }
}
