//! Request bodies parsed only at their top level.
//!
//! A model request can be hundreds of megabytes (long transcripts, images), yet intercept
//! only ever touches a handful of top-level keys (`model`, sampling keys, `stream`).
//! [`JsonBody`] validates the whole document once, remembers where each top-level value
//! lies in the original bytes, and re-emits the object as a list of [`Bytes`] slices that
//! share the original buffer: unchanged values are never copied.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::error::Error;

mod scan;

/// One top-level member of a [`JsonBody`].
#[derive(Clone)]
struct Member {
    key: Box<str>,
    value: Value,
}

#[derive(Clone)]
enum Value {
    /// Unchanged: `span` covers `"key": value` in the source (when the key needed no
    /// unescaping), `value` covers the value alone.
    Source {
        span: Option<Range<usize>>,
        value: Range<usize>,
    },
    /// Replaced: serialised JSON.
    Owned(Bytes),
}

/// A JSON object whose top-level members are known and whose nested values stay as the
/// bytes they arrived as. Cloning is cheap (the source buffer is shared).
#[derive(Clone)]
pub struct JsonBody {
    source: Bytes,
    members: Vec<Member>,
}

/// An object key, borrowed from the input when it needed no unescaping.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(V)
    }
}

struct TopLevel<'a> {
    members: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'de> Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLevel<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(TopLevel { members })
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// The members of the object `text` from its scan; `None` if a key's escapes do not
/// decode (a lone surrogate), which serde_json's parse then reports.
fn members_of(text: &str, scanned: &[scan::TopMember]) -> Option<Vec<Member>> {
    let mut members = Vec::with_capacity(scanned.len());
    for m in scanned {
        let (key, span): (Box<str>, _) = if m.escaped {
            // The scan checked the escapes; only their decoding is left.
            let quoted = &text[m.key.start - 1..m.key.end + 1];
            (serde_json::from_str::<String>(quoted).ok()?.into(), None)
        } else {
            (
                text[m.key.clone()].into(),
                Some(m.key.start - 1..m.value.end),
            )
        };
        add_member(&mut members, key, span, m.value.clone());
    }
    Some(members)
}

/// Adds a member read from the source (`span`: its key and value's text, when the key
/// stands in it unescaped). Duplicate keys: the last one wins, at the position of the
/// first.
fn add_member(
    members: &mut Vec<Member>,
    key: Box<str>,
    span: Option<Range<usize>>,
    value: Range<usize>,
) {
    match members.iter_mut().find(|m| m.key == key) {
        Some(existing) => existing.value = Value::Source { span: None, value },
        None => members.push(Member {
            key,
            value: Value::Source { span, value },
        }),
    }
}

fn offset_in(outer: &[u8], inner: &[u8]) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

/// `serde_json::from_slice`, faster: the bytes are checked as UTF-8 once, in bulk, and
/// parsed as a `str`, instead of every string (kept or skipped) being checked on its
/// own. Invalid UTF-8 goes through `from_slice`, for its error (with line and column).
pub(crate) fn from_json_bytes<'a, T: serde::Deserialize<'a>>(
    bytes: &'a [u8],
) -> serde_json::Result<T> {
    match simdutf8::basic::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

/// How deep a request body may nest arrays and objects, the top-level object counting as
/// one level. It is the deepest document serde_json turns into a value (its recursion
/// limit of 128 admits 127 levels): a deeper body could be proxied but its record could
/// not be read as a value, so it is refused when the request is read instead.
pub const MAX_JSON_DEPTH: usize = 127;

/// Whether `bytes` nest arrays and objects more than `limit` levels deep, counting only
/// brackets outside strings. Strings are skipped with `memchr`, not byte by byte.
fn nests_deeper_than(bytes: &[u8], limit: usize) -> bool {
    // Nesting can be no deeper than the number of `{` and `[`: most bodies have fewer
    // than the limit, and counting them is one vectorised pass.
    if memchr::memchr2_iter(b'{', b'[', bytes).count() <= limit {
        return false;
    }
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            // A string: jump to its closing quote, over escapes.
            b'"' => {
                i += 1;
                loop {
                    let Some(j) = bytes
                        .get(i..)
                        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                    else {
                        return false;
                    };
                    if bytes[i + j] == b'\\' {
                        i += j + 2;
                    } else {
                        i += j + 1;
                        break;
                    }
                }
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

/// Why `source` is not a JSON object, in words a person can act on.
fn not_an_object(source: &[u8], parse_error: &serde_json::Error) -> Error {
    if let Err(e) = std::str::from_utf8(source) {
        return Error::invalid(format!(
            "request body is not valid UTF-8 (invalid byte at offset {}); JSON must be UTF-8",
            e.valid_up_to()
        ));
    }
    if nests_deeper_than(source, MAX_JSON_DEPTH) {
        return Error::invalid(format!(
            "request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
        ));
    }
    let first = source.iter().find(|b| !b.is_ascii_whitespace());
    // Not JSON; or an object that does not read as one although it is JSON: a key that
    // does not decode (a lone surrogate escape).
    if first == Some(&b'{') || serde_json::from_slice::<serde::de::IgnoredAny>(source).is_err() {
        return Error::invalid(format!("request body is not valid JSON: {parse_error}"));
    }
    let found = match first {
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    };
    Error::invalid(format!("request body must be a JSON object, not {found}"))
}

/// What parsing one request body leaves for parsing the next body of the same
/// conversation ([`JsonBody::parse_after`]): that body, and where the elements of its
/// arrays end.
#[derive(Debug, Default)]
pub struct ParseMemo {
    source: Bytes,
    scanned: Option<scan::Scanned>,
}

impl JsonBody {
    /// Parses `source`, which must be one JSON object nesting at most
    /// [`MAX_JSON_DEPTH`] levels. The error says what is wrong (not UTF-8, not JSON at
    /// all, JSON but not an object, too deep) in words a person can act on.
    pub fn parse(source: Bytes) -> Result<Self, Error> {
        if let Some(members) = simdutf8::basic::from_utf8(&source)
            .ok()
            .and_then(|text| members_of(text, &scan::scan_object(text, MAX_JSON_DEPTH)?))
        {
            return Ok(JsonBody { source, members });
        }
        Self::parse_slow(source)
    }

    /// [`JsonBody::parse`] for the next body of a conversation: `memo` holds what
    /// parsing the previous one left, and is given what parsing this one leaves. An
    /// array member that starts with the bytes it had in the previous body (a
    /// conversation that grew by a few messages, wherever it stands among the members)
    /// is scanned on from the last element they share, so parsing costs what the call
    /// adds rather than what the conversation holds.
    ///
    /// ```
    /// use intercept_core::body::{JsonBody, ParseMemo};
    /// let mut memo = ParseMemo::default();
    /// let first = JsonBody::parse_after(
    ///     br#"{"messages":[{"role":"user","content":"hi"}]}"#.to_vec().into(), &mut memo)?;
    /// let next = JsonBody::parse_after(br#"{"messages":[{"role":"user","content":"hi"},
    ///     {"role":"assistant","content":"hello"}]}"#.to_vec().into(), &mut memo)?;
    /// assert_eq!(next.to_value()["messages"][1]["content"], "hello");
    /// # let _ = first;
    /// # Ok::<(), intercept_core::Error>(())
    /// ```
    pub fn parse_after(source: Bytes, memo: &mut ParseMemo) -> Result<Self, Error> {
        let earlier = std::mem::take(memo);
        let scanned = simdutf8::basic::from_utf8(&source).ok().and_then(|text| {
            let at = earlier.scanned.as_ref().map(|s| (&earlier.source[..], s));
            let scanned = scan::scan_from(text, MAX_JSON_DEPTH, at)?;
            Some((members_of(text, &scanned.members)?, scanned))
        });
        match scanned {
            Some((members, scanned)) => {
                *memo = ParseMemo {
                    source: source.clone(),
                    scanned: Some(scanned),
                };
                Ok(JsonBody { source, members })
            }
            None => Self::parse_slow(source),
        }
    }

    /// Parses what the scan did not take, with serde_json, whose error says what is
    /// wrong.
    fn parse_slow(source: Bytes) -> Result<Self, Error> {
        // Not a JSON object within the limits: serde_json's parse says what is wrong.
        let top: TopLevel<'_> = match from_json_bytes(&source) {
            Ok(top) => top,
            Err(e) => return Err(not_an_object(&source, &e)),
        };
        if nests_deeper_than(&source, MAX_JSON_DEPTH) {
            return Err(Error::invalid(format!(
                "request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
            )));
        }
        let mut members: Vec<Member> = Vec::with_capacity(top.members.len());
        for (key, raw) in top.members {
            let value_start = offset_in(&source, raw.get().as_bytes());
            let value = value_start..value_start + raw.get().len();
            let span = match &key {
                // A borrowed key sits in the source right after its opening quote.
                Cow::Borrowed(k) => {
                    let key_start = offset_in(&source, k.as_bytes());
                    key_start.checked_sub(1).map(|s| s..value.end)
                }
                Cow::Owned(_) => None,
            };
            add_member(&mut members, key.into_owned().into(), span, value);
        }
        Ok(JsonBody { source, members })
    }

    /// The empty object `{}`.
    pub fn empty() -> Self {
        JsonBody {
            source: Bytes::from_static(b"{}"),
            members: Vec::new(),
        }
    }

    /// The bytes the body was parsed from (as the harness sent them).
    pub fn source(&self) -> &Bytes {
        &self.source
    }

    /// The number of bytes this body serialises to.
    pub fn encoded_len(&self) -> usize {
        self.chunks().iter().map(Bytes::len).sum()
    }

    /// The top-level keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| &*m.key)
    }

    /// The top-level members, in order: each key with its value's raw JSON text.
    pub fn members(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.members.iter().map(|m| (&*m.key, self.raw_of(m)))
    }

    /// A member's value as raw JSON text.
    fn raw_of<'s>(&'s self, m: &'s Member) -> &'s [u8] {
        match &m.value {
            Value::Source { value, .. } => &self.source[value.clone()],
            Value::Owned(b) => &b[..],
        }
    }

    /// Whether a top-level key is present.
    pub fn contains(&self, key: &str) -> bool {
        self.members.iter().any(|m| &*m.key == key)
    }

    /// The raw JSON text of a top-level value.
    pub fn raw(&self, key: &str) -> Option<&[u8]> {
        self.members
            .iter()
            .find(|m| &*m.key == key)
            .map(|m| self.raw_of(m))
    }

    /// The raw JSON text of a top-level value as a shared slice (no copy).
    pub fn raw_bytes(&self, key: &str) -> Option<Bytes> {
        self.members
            .iter()
            .find(|m| &*m.key == key)
            .map(|m| match &m.value {
                Value::Source { value, .. } => self.source.slice(value.clone()),
                Value::Owned(b) => b.clone(),
            })
    }

    /// Deserialises a top-level value; `None` when absent.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Option<Result<T, serde_json::Error>> {
        self.raw(key).map(from_json_bytes)
    }

    /// A top-level value as a [`serde_json::Value`]; `None` when absent.
    pub fn value(&self, key: &str) -> Option<serde_json::Value> {
        self.get(key).and_then(Result::ok)
    }

    /// Whether a top-level value is JSON `true` (other values, and absence, are false).
    pub fn is_true(&self, key: &str) -> bool {
        self.raw(key) == Some(b"true")
    }

    /// A top-level string value.
    pub fn str(&self, key: &str) -> Option<String> {
        self.get::<String>(key).and_then(Result::ok)
    }

    /// Sets a top-level value (replacing it in place, or appending it).
    pub fn set<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), Error> {
        let encoded = serde_json::to_vec(value)
            .map_err(|e| Error::Internal(format!("cannot encode `{key}`: {e}")))?;
        self.set_raw(key, Bytes::from(encoded));
        Ok(())
    }

    /// Sets a top-level value to already-encoded JSON. The caller guarantees `json` is
    /// one valid JSON value.
    pub fn set_raw(&mut self, key: &str, json: Bytes) {
        match self.members.iter_mut().find(|m| &*m.key == key) {
            Some(m) => m.value = Value::Owned(json),
            None => self.members.push(Member {
                key: key.into(),
                value: Value::Owned(json),
            }),
        }
    }

    /// Removes a top-level key; returns whether it was there.
    pub fn remove(&mut self, key: &str) -> bool {
        let before = self.members.len();
        self.members.retain(|m| &*m.key != key);
        before != self.members.len()
    }

    /// About how many bytes the object takes when written: the source plus what was set
    /// (a capacity hint, never less than the output of an unchanged body).
    pub fn size_hint(&self) -> usize {
        let owned: usize = self
            .members
            .iter()
            .map(|m| match &m.value {
                Value::Owned(b) => b.len() + m.key.len() + 4,
                Value::Source { .. } => 0,
            })
            .sum();
        self.source.len() + owned
    }

    /// The object as a list of byte slices, unchanged members shared with the source.
    /// Runs of unchanged, adjacent members are emitted as one slice.
    pub fn chunks(&self) -> Vec<Bytes> {
        let mut sink = Chunks {
            out: Vec::with_capacity(4),
            glue: BytesMut::with_capacity(64),
        };
        self.walk(&mut sink);
        let Chunks { mut out, glue } = sink;
        out.push(glue.freeze());
        out.retain(|b| !b.is_empty());
        out
    }

    /// Appends the object's JSON to `out`: what [`JsonBody::chunks`] holds, one piece
    /// after the other, without making the pieces.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        self.walk(out);
    }

    /// Sends the object to `sink` piece by piece: runs of unchanged, adjacent members
    /// as one slice of the source, the rest (braces, commas, keys, set values) as they
    /// come.
    fn walk(&self, sink: &mut impl Pieces) {
        sink.glue(b"{");
        // The source run being extended: (start, end, index of its last member).
        let mut run: Option<(usize, usize, usize)> = None;
        let mut first = true;
        for (i, m) in self.members.iter().enumerate() {
            if let Value::Source {
                span: Some(span), ..
            } = &m.value
            {
                if let Some((start, _, last)) = run {
                    if last + 1 == i && self.adjacent(last, span.start) {
                        run = Some((start, span.end, i));
                        continue;
                    }
                }
                self.flush_run(&mut run, sink);
                if !first {
                    sink.glue(b",");
                }
                first = false;
                run = Some((span.start, span.end, i));
                continue;
            }
            self.flush_run(&mut run, sink);
            if !first {
                sink.glue(b",");
            }
            first = false;
            sink.key(&m.key);
            match &m.value {
                Value::Source { value, .. } => sink.source(&self.source, value.clone()),
                Value::Owned(b) => sink.owned(b),
            }
        }
        self.flush_run(&mut run, sink);
        sink.glue(b"}");
    }

    fn flush_run(&self, run: &mut Option<(usize, usize, usize)>, sink: &mut impl Pieces) {
        if let Some((start, end, _)) = run.take() {
            sink.source(&self.source, start..end);
        }
    }

    /// Whether the source text between member `last`'s end and `next_start` is only
    /// whitespace and one comma (so both can be emitted as one slice).
    fn adjacent(&self, last: usize, next_start: usize) -> bool {
        let Value::Source {
            span: Some(prev), ..
        } = &self.members[last].value
        else {
            return false;
        };
        if prev.end > next_start {
            return false;
        }
        let between = &self.source[prev.end..next_start];
        between.iter().filter(|b| **b == b',').count() == 1
            && between
                .iter()
                .all(|b| matches!(b, b',' | b' ' | b'\t' | b'\n' | b'\r'))
    }

    /// The object as one contiguous buffer (copies).
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.size_hint());
        self.write_to(&mut out);
        Bytes::from(out)
    }

    /// The whole object as a [`serde_json::Value`] (parses everything: not for hot paths).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_slice(&self.to_bytes()).unwrap_or(serde_json::Value::Null)
    }
}

/// Where [`JsonBody::walk`] sends the pieces of an object.
trait Pieces {
    /// Bytes of the object's frame: braces and commas.
    fn glue(&mut self, bytes: &[u8]);
    /// A member's key and its colon.
    fn key(&mut self, key: &str);
    /// A range of the source: a run of members, or one member's value.
    fn source(&mut self, source: &Bytes, range: Range<usize>);
    /// A set value (serialised JSON).
    fn owned(&mut self, value: &Bytes);
}

/// [`JsonBody::chunks`]: the source's runs and large set values shared, everything
/// between them gathered in `glue`.
struct Chunks {
    out: Vec<Bytes>,
    glue: BytesMut,
}

impl Chunks {
    fn push(&mut self, shared: Bytes) {
        self.out.push(self.glue.split().freeze());
        self.out.push(shared);
    }
}

impl Pieces for Chunks {
    fn glue(&mut self, bytes: &[u8]) {
        self.glue.extend_from_slice(bytes);
    }

    fn key(&mut self, key: &str) {
        crate::json_text::write_str(&mut self.glue, key);
        self.glue.put_u8(b':');
    }

    fn source(&mut self, source: &Bytes, range: Range<usize>) {
        self.push(source.slice(range));
    }

    fn owned(&mut self, value: &Bytes) {
        if value.len() <= 256 {
            self.glue.extend_from_slice(value);
        } else {
            self.push(value.clone());
        }
    }
}

/// [`JsonBody::write_to`]: every piece copied into one buffer.
impl Pieces for Vec<u8> {
    fn glue(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn key(&mut self, key: &str) {
        crate::json_text::write_str(self, key);
        self.push(b':');
    }

    fn source(&mut self, source: &Bytes, range: Range<usize>) {
        self.extend_from_slice(&source[range]);
    }

    fn owned(&mut self, value: &Bytes) {
        self.extend_from_slice(value);
    }
}

impl fmt::Debug for JsonBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonBody")
            .field("keys", &self.keys().collect::<Vec<_>>())
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl Serialize for JsonBody {
    /// Writes the body's bytes as they stand: it was validated when it was parsed, and
    /// what was set since was encoded by serde_json.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        verbatim(&self.to_bytes(), serializer)
    }
}

/// Writes bytes known to be one JSON value as they stand: no parse, no re-escaping.
///
/// This is what `serde_json::value::RawValue`'s own `Serialize` does: serde_json's
/// serializers (to bytes and to `Value`) recognise a one-field struct named by its raw
/// value token and write (or parse) the field's text as JSON. `RawValue` offers no
/// constructor that skips validation, and validating here would parse every recorded
/// body a second time. The bytes must still be UTF-8 (checked; a failure is the
/// serializer's error); a test pins the token against serde_json's own output.
fn verbatim<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct as _;
    let text = std::str::from_utf8(bytes).map_err(serde::ser::Error::custom)?;
    let mut s = serializer.serialize_struct(RAW_VALUE_TOKEN, 1)?;
    s.serialize_field(RAW_VALUE_TOKEN, text)?;
    s.end()
}

/// serde_json's name for a raw value in its serializer protocol.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de> Deserialize<'de> for JsonBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw: Box<RawValue> = Deserialize::deserialize(deserializer)?;
        let text: Box<str> = raw.into();
        JsonBody::parse(Bytes::from(text.into_string())).map_err(serde::de::Error::custom)
    }
}

impl PartialEq for JsonBody {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

/// Raw JSON bytes kept as they arrived (a response body), serialised verbatim.
#[derive(Clone, PartialEq, Eq)]
pub struct RawJson(Bytes);

impl RawJson {
    /// Wraps bytes the caller has checked to be one valid JSON value (a body its dialect
    /// read whole, or serde_json's own output). They are recorded as they stand, without
    /// a second parse; bytes that are not UTF-8 fail to serialise.
    pub fn new(bytes: Bytes) -> Self {
        debug_assert!(
            serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok(),
            "RawJson::new takes one valid JSON value"
        );
        RawJson(bytes)
    }

    /// Encodes a value.
    pub fn from_value(value: &serde_json::Value) -> Self {
        RawJson(Bytes::from(
            serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec()),
        ))
    }

    /// The bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// Parses the bytes.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_slice(&self.0).unwrap_or(serde_json::Value::Null)
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawJson({} bytes)", self.0.len())
    }
}

impl Serialize for RawJson {
    /// Writes the bytes as they stand (see [`RawJson::new`]: they are one JSON value).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        verbatim(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw: Box<RawValue> = Deserialize::deserialize(deserializer)?;
        let text: Box<str> = raw.into();
        Ok(RawJson(Bytes::from(text.into_string())))
    }
}

#[cfg(test)]
mod tests;
