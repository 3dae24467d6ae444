//! JSON values as the log writes them: long strings and large members written once per
//! session as `value` lines and referenced after that, the rest copied as it stands.
//!
//! The encoder walks raw JSON text (already known to be valid: a request the server
//! parsed, a response it read, a message serde wrote) and writes it compact, with:
//!
//! - every string of at least [`MIN_STRING`] bytes replaced by `{"$v":N}`, the id of a
//!   `value` line holding it (written the first time the string is seen);
//! - a container nested deeper than [`MAX_DEPTH`] in the line written as `{"$j":"…"}`,
//!   its JSON text as a string, so that every line parses with the usual recursion limits;
//! - an object that would read as one of these markers (one member, keyed `$v`, `$a`,
//!   `$e` or `$j`) wrapped as `{"$e":{…}}`, so that nothing is ambiguous.

use std::collections::HashMap;

use crate::json_text;
pub(crate) use crate::json_text::ws;

/// Strings this long (in their JSON text, escapes included) or longer are written once.
pub(crate) const MIN_STRING: usize = 64;

/// Request and response members (objects and arrays) this long or longer are written
/// once as a whole (tool lists, long system blocks, echoed settings).
pub(crate) const MIN_MEMBER: usize = 256;

/// The deepest a container is written as it stands, counted in the line.
pub(crate) const MAX_DEPTH: usize = 100;

/// The keys that make a one-member object a marker.
pub(crate) const MARKERS: [&str; 4] = ["$v", "$a", "$e", "$j"];

/// The hash's domain: a string's text and a member's JSON never share an id.
const TAG_STRING: u64 = 0x5354_5249_4e47;
const TAG_MEMBER: u64 = 0x4d45_4d42_4552;

/// Text that is not the valid JSON the encoder was promised (or not UTF-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invalid;

type Result<T> = std::result::Result<T, Invalid>;

/// The values of one log: content hash → id, and the next id.
#[derive(Debug, Default)]
pub(crate) struct Values {
    seed: u64,
    ids: HashMap<u128, u32, foldhash::fast::RandomState>,
    next: u32,
    /// Bytes of value text written.
    pub(crate) bytes: u64,
}

impl Values {
    fn seed(&mut self) -> u64 {
        if self.seed == 0 {
            use std::hash::{BuildHasher as _, RandomState};
            self.seed = RandomState::new().hash_one(0x006c_6f67_u64) | 1;
        }
        self.seed
    }

    /// The id of the value with this key, or the key to [`Values::insert`] it by.
    fn find(&mut self, tag: u64, text: &[u8]) -> std::result::Result<u32, u128> {
        let seed = self.seed() ^ tag;
        let key = xxhash_rust::xxh3::xxh3_128_with_seed(text, seed);
        self.ids.get(&key).copied().ok_or(key)
    }

    /// A new value's id.
    fn insert(&mut self, key: u128) -> u32 {
        let id = self.next;
        self.next += 1;
        self.ids.insert(key, id);
        id
    }

    /// Heap bytes held (for memory accounting).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.ids.capacity() * (16 + 4 + 1)
    }
}

/// An encoder writing into one line, and the `value` lines it needs into `defs` (which
/// the caller writes before the line).
pub(crate) struct Encoder<'a> {
    pub(crate) values: &'a mut Values,
    pub(crate) defs: &'a mut Vec<u8>,
}

/// The index just after the string that starts at `i` (at its quote).
fn string_end(b: &[u8], i: usize) -> Result<usize> {
    json_text::string_end(b, i).ok_or(Invalid)
}

/// The index just after the value that starts at or after `i`.
pub(crate) fn skip_value(b: &[u8], i: usize) -> Result<usize> {
    json_text::skip_value(b, i).ok_or(Invalid)
}

/// Whether a key's string token (quotes included) decodes to one of the [`MARKERS`].
fn is_marker_key(token: &str) -> Result<bool> {
    let inner = &token[1..token.len() - 1];
    // Every marker starts with `$`, spelled as it stands or escaped (`\u0024`).
    match inner.as_bytes().first() {
        Some(b'$') if !inner.contains('\\') => Ok(MARKERS.contains(&inner)),
        Some(b'$' | b'\\') => {
            let key: String = serde_json::from_str(token).map_err(|_| Invalid)?;
            Ok(MARKERS.contains(&key.as_str()))
        }
        _ => Ok(false),
    }
}

impl Encoder<'_> {
    /// Writes the value starting at or after `i` of `s` into `out`; returns the index
    /// after it. `s` is text, so no string in it needs checking again.
    pub(crate) fn value(
        &mut self,
        s: &str,
        i: usize,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<usize> {
        let b = s.as_bytes();
        let i = ws(b, i);
        match b.get(i).ok_or(Invalid)? {
            b'"' => {
                let end = string_end(b, i)?;
                self.string(&s[i..end], out);
                Ok(end)
            }
            b'{' | b'[' if depth >= MAX_DEPTH => {
                let end = skip_value(b, i)?;
                out.extend_from_slice(b"{\"$j\":");
                json_text::write_str(out, &s[i..end]);
                out.push(b'}');
                Ok(end)
            }
            b'{' => self.object(s, i, out, depth),
            b'[' => {
                out.push(b'[');
                let mut at = ws(b, i + 1);
                if b.get(at) == Some(&b']') {
                    out.push(b']');
                    return Ok(at + 1);
                }
                loop {
                    at = self.value(s, at, out, depth + 1)?;
                    at = ws(b, at);
                    match b.get(at).ok_or(Invalid)? {
                        b',' => {
                            out.push(b',');
                            at += 1;
                        }
                        b']' => {
                            out.push(b']');
                            return Ok(at + 1);
                        }
                        _ => return Err(Invalid),
                    }
                }
            }
            _ => {
                let end = skip_value(b, i)?;
                out.extend_from_slice(&b[i..end]);
                Ok(end)
            }
        }
    }

    fn object(&mut self, s: &str, i: usize, out: &mut Vec<u8>, depth: usize) -> Result<usize> {
        self.object_with(s, i, out, depth, |enc, _, at, out, depth| {
            enc.value(s, at, out, depth)
        })
    }

    /// Writes the object starting at `i` of `s` (its opening brace), each member's value
    /// by `member(encoder, key token, value start, out, depth)`, which returns the index
    /// after the value; a marker-shaped object is escaped. Returns the index after it.
    pub(crate) fn object_with(
        &mut self,
        s: &str,
        i: usize,
        out: &mut Vec<u8>,
        depth: usize,
        mut member: impl FnMut(&mut Self, &[u8], usize, &mut Vec<u8>, usize) -> Result<usize>,
    ) -> Result<usize> {
        let b = s.as_bytes();
        let mut at = ws(b, i + 1);
        if b.get(at) == Some(&b'}') {
            out.extend_from_slice(b"{}");
            return Ok(at + 1);
        }
        if b.get(at) != Some(&b'"') {
            return Err(Invalid);
        }
        // One member keyed like a marker: escaped.
        let escaped = {
            let key_end = string_end(b, at)?;
            is_marker_key(&s[at..key_end])? && {
                let colon = ws(b, key_end);
                let value_end = skip_value(b, colon + 1)?;
                b.get(ws(b, value_end)) == Some(&b'}')
            }
        };
        if escaped {
            out.extend_from_slice(b"{\"$e\":");
        }
        out.push(b'{');
        loop {
            if b.get(at) != Some(&b'"') {
                return Err(Invalid);
            }
            let key_end = string_end(b, at)?;
            let key = &b[at..key_end];
            out.extend_from_slice(key);
            at = ws(b, key_end);
            if b.get(at) != Some(&b':') {
                return Err(Invalid);
            }
            out.push(b':');
            let value = ws(b, at + 1);
            at = member(self, key, value, out, depth + 1 + usize::from(escaped))?;
            at = ws(b, at);
            match b.get(at).ok_or(Invalid)? {
                b',' => {
                    out.push(b',');
                    at = ws(b, at + 1);
                }
                b'}' => {
                    out.push(b'}');
                    if escaped {
                        out.push(b'}');
                    }
                    return Ok(at + 1);
                }
                _ => return Err(Invalid),
            }
        }
    }

    /// A string token (quotes included): as it stands when short, else by reference.
    fn string(&mut self, token: &str, out: &mut Vec<u8>) {
        let inner = &token.as_bytes()[1..token.len() - 1];
        if inner.len() < MIN_STRING {
            out.extend_from_slice(token.as_bytes());
            return;
        }
        // Escapes that writers spell differently (`\u00e9` for `é`, `\/`) are brought to
        // serde_json's spelling, so that the same text is one value.
        let respelled = memchr::memchr_iter(b'\\', inner)
            .any(|at| matches!(inner.get(at + 1), Some(b'u' | b'/')));
        if respelled {
            let mut canonical = Vec::with_capacity(inner.len());
            // A lone surrogate escape is not text: such a string is kept as it stands.
            if json_text::respell(inner, &mut canonical) {
                if canonical.len() < MIN_STRING {
                    out.push(b'"');
                    out.extend_from_slice(&canonical);
                    out.push(b'"');
                } else {
                    self.inner(&canonical, out);
                }
                return;
            }
        }
        self.inner(inner, out);
    }

    /// A string (decoded text): as [`Encoder::string`] writes its JSON token.
    pub(crate) fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        let start = out.len();
        json_text::write_str(out, text);
        if out.len() - start - 2 < MIN_STRING {
            return;
        }
        let id = self.intern(&out[start + 1..out.len() - 1]);
        out.truncate(start);
        reference(out, id);
    }

    /// A long string's JSON text (between its quotes, in serde_json's spelling), by
    /// reference.
    fn inner(&mut self, inner: &[u8], out: &mut Vec<u8>) {
        let id = self.intern(inner);
        reference(out, id);
    }

    /// The id of the value holding this string's JSON text, its line written if new.
    fn intern(&mut self, inner: &[u8]) -> u32 {
        match self.values.find(TAG_STRING, inner) {
            Ok(id) => id,
            Err(key) => {
                let id = self.values.insert(key);
                self.define(id, |defs| {
                    defs.push(b'"');
                    defs.extend_from_slice(inner);
                    defs.push(b'"');
                });
                id
            }
        }
    }

    /// A member's value: a large object or array written once as a whole, anything else
    /// as [`Encoder::value`] writes it.
    pub(crate) fn member(&mut self, raw: &str, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        let b = raw.as_bytes();
        let start = ws(b, 0);
        let large = raw.len() >= MIN_MEMBER && matches!(b.get(start), Some(b'{' | b'['));
        if !large {
            let end = self.value(raw, start, out, depth)?;
            return if ws(b, end) == raw.len() {
                Ok(())
            } else {
                Err(Invalid)
            };
        }
        let id = match self.values.find(TAG_MEMBER, b) {
            Ok(id) => id,
            Err(key) => {
                // The value line's own text: its strings by reference too, written
                // before it.
                let mut text = Vec::with_capacity(raw.len());
                let end = self.value(raw, start, &mut text, 2)?;
                if ws(b, end) != raw.len() {
                    return Err(Invalid);
                }
                let id = self.values.insert(key);
                self.define(id, |defs| defs.extend_from_slice(&text));
                id
            }
        };
        reference(out, id);
        Ok(())
    }

    /// Writes the `value` line of `id`.
    fn define(&mut self, id: u32, value: impl FnOnce(&mut Vec<u8>)) {
        let start = self.defs.len();
        self.defs.extend_from_slice(b"{\"type\":\"value\",\"id\":");
        self.defs
            .extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
        self.defs.extend_from_slice(b",\"value\":");
        value(self.defs);
        self.defs.extend_from_slice(b"}\n");
        self.values.bytes += (self.defs.len() - start) as u64;
    }
}

/// `{"$v":id}`.
fn reference(out: &mut Vec<u8>, id: u32) {
    out.extend_from_slice(b"{\"$v\":");
    out.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(text: &str) -> (String, String) {
        let mut values = Values::default();
        let mut defs = Vec::new();
        let mut out = Vec::new();
        let mut e = Encoder {
            values: &mut values,
            defs: &mut defs,
        };
        e.value(text, 0, &mut out, 0).expect("valid");
        (
            String::from_utf8(out).expect("utf-8"),
            String::from_utf8(defs).expect("utf-8"),
        )
    }

    #[test]
    fn short_values_stand_long_strings_are_referenced_once() {
        let long = "x".repeat(MIN_STRING);
        let (out, defs) = encode(&format!(
            r#"{{ "a" : [1, true, null, "s"], "b": "{long}", "c": ["{long}"] }}"#
        ));
        assert_eq!(
            out,
            r#"{"a":[1,true,null,"s"],"b":{"$v":0},"c":[{"$v":0}]}"#
        );
        assert_eq!(
            defs,
            format!("{{\"type\":\"value\",\"id\":0,\"value\":\"{long}\"}}\n")
        );
    }

    #[test]
    fn marker_shaped_objects_are_escaped_and_spellings_share_a_value() {
        let (out, _) = encode(r#"{"$v": 3}"#);
        assert_eq!(out, r#"{"$e":{"$v":3}}"#);
        let (out, _) = encode(r#"{"\u0024a": {"$j": "x"}}"#);
        assert_eq!(out, r#"{"$e":{"\u0024a":{"$e":{"$j":"x"}}}}"#);
        // Two members: no marker.
        let (out, _) = encode(r#"{"$v": 3, "b": 1}"#);
        assert_eq!(out, r#"{"$v":3,"b":1}"#);
        let long = "é".repeat(40);
        let escaped = "\\u00e9".repeat(40);
        let (out, defs) = encode(&format!(r#"["{long}", "{escaped}"]"#));
        assert_eq!(out, r#"[{"$v":0},{"$v":0}]"#);
        assert_eq!(defs.lines().count(), 1);
    }

    #[test]
    fn deep_values_are_written_as_text() {
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 3),
            "]".repeat(MAX_DEPTH + 3)
        );
        let (out, _) = encode(&deep);
        assert!(out.contains("{\"$j\":\"[[[1]]]\"}"), "{out}");
    }
}
