//! Python's `json.loads` and `json.dumps`, with object key order kept.
//!
//! The renderers write tools and tool-call arguments with
//! `json.dumps(x, ensure_ascii=False)` and read the model's tool calls with `json.loads`;
//! verifiers writes parsed arguments back with `json.dumps(x)`. Reproducing their bytes
//! takes Python's grammar and printer, not serde's:
//!
//! - loading accepts `NaN`, `Infinity` and `-Infinity`, keeps integers of any size exactly,
//!   reads other numbers as the nearest `f64`, refuses control characters inside strings,
//!   keeps lone surrogates (`"\ud800"`), and on a repeated key keeps the last value at the
//!   first key's place (a `dict` built from pairs);
//! - dumping writes `", "` and `": "` between items, floats as `repr` does (`1e+16`,
//!   `1e-05`, `100.0`), `\"` `\\` `\n` `\r` `\t` `\b` `\f` and `\u00XX` for the other
//!   control characters, and the rest raw (`ensure_ascii=False`) or as lowercase `\uXXXX`
//!   escapes with surrogate pairs (`ensure_ascii=True`).
//!
//! Values borrow their strings from the text they were read from (escapes undecoded), so
//! a tool spec is read and written without copying its strings twice.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

/// Python's default recursion limit: deeper documents make `json.loads` raise.
const MAX_DEPTH: usize = 1000;

/// `int()` refuses to convert longer digit strings (Python 3.11's
/// `sys.int_info.str_digits_check_threshold`), so `json.loads` raises on them.
const MAX_INT_DIGITS: usize = 4300;

/// Objects with more keys than this find repeated keys through a map.
const LINEAR_KEYS: usize = 16;

/// Why a text is not JSON to Python.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// What Python would complain about.
    pub(crate) message: &'static str,
    /// The byte offset where reading stopped.
    pub(crate) offset: usize,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.offset)
    }
}

/// A string holding a lone surrogate cannot be written as UTF-8 (Python raises
/// `UnicodeEncodeError` where it would be encoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoneSurrogate;

/// A JSON string as it appears in its text, between the quotes, escapes undecoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JsonStr<'a> {
    raw: &'a str,
    escaped: bool,
}

/// One code point of a decoded string, or a UTF-16 surrogate left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Char(char),
    Surrogate(u16),
}

impl<'a> JsonStr<'a> {
    /// A string without escapes (its text is its value).
    #[cfg(test)]
    pub(crate) fn plain(raw: &'a str) -> Self {
        JsonStr {
            raw,
            escaped: raw.contains('\\'),
        }
    }

    /// Whether the decoded string is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Calls `f` with each decoded unit. The text was validated when it was read.
    fn for_each_unit(&self, mut f: impl FnMut(Unit)) {
        if !self.escaped {
            self.raw.chars().for_each(|c| f(Unit::Char(c)));
            return;
        }
        let mut chars = self.raw.chars();
        let mut pending_high: Option<u16> = None;
        while let Some(c) = chars.next() {
            if c != '\\' {
                if let Some(h) = pending_high.take() {
                    f(Unit::Surrogate(h));
                }
                f(Unit::Char(c));
                continue;
            }
            let e = chars.next().unwrap_or('\\');
            let decoded = match e {
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'u' => {
                    let mut v: u16 = 0;
                    for _ in 0..4 {
                        let d = chars.next().and_then(|h| h.to_digit(16)).unwrap_or(0);
                        v = v * 16 + d as u16;
                    }
                    match v {
                        0xd800..=0xdbff => {
                            if let Some(h) = pending_high.replace(v) {
                                f(Unit::Surrogate(h));
                            }
                            continue;
                        }
                        0xdc00..=0xdfff => {
                            if let Some(h) = pending_high.take() {
                                let c = 0x10000
                                    + ((u32::from(h) - 0xd800) << 10)
                                    + (u32::from(v) - 0xdc00);
                                f(Unit::Char(char::from_u32(c).unwrap_or('\u{fffd}')));
                            } else {
                                f(Unit::Surrogate(v));
                            }
                            continue;
                        }
                        _ => char::from_u32(u32::from(v)).unwrap_or('\u{fffd}'),
                    }
                }
                other => other, // `"`, `\`, `/`
            };
            if let Some(h) = pending_high.take() {
                f(Unit::Surrogate(h));
            }
            f(Unit::Char(decoded));
        }
        if let Some(h) = pending_high {
            f(Unit::Surrogate(h));
        }
    }

    /// The decoded string; a lone surrogate reads as U+FFFD.
    pub(crate) fn to_str_lossy(self) -> Cow<'a, str> {
        if !self.escaped {
            return Cow::Borrowed(self.raw);
        }
        let mut out = String::with_capacity(self.raw.len());
        self.for_each_unit(|u| match u {
            Unit::Char(c) => out.push(c),
            Unit::Surrogate(_) => out.push('\u{fffd}'),
        });
        Cow::Owned(out)
    }

    /// The decoded string, or [`LoneSurrogate`] if it holds one.
    pub(crate) fn to_str(self) -> Result<Cow<'a, str>, LoneSurrogate> {
        if !self.escaped {
            return Ok(Cow::Borrowed(self.raw));
        }
        let mut out = String::with_capacity(self.raw.len());
        let mut lone = false;
        self.for_each_unit(|u| match u {
            Unit::Char(c) => out.push(c),
            Unit::Surrogate(_) => lone = true,
        });
        if lone {
            Err(LoneSurrogate)
        } else {
            Ok(Cow::Owned(out))
        }
    }

    /// The decoded string as UTF-16 code units (keys compare by these).
    fn units(&self) -> Vec<u16> {
        let mut out = Vec::with_capacity(self.raw.len());
        self.for_each_unit(|u| match u {
            Unit::Char(c) => {
                let mut buf = [0u16; 2];
                out.extend_from_slice(c.encode_utf16(&mut buf));
            }
            Unit::Surrogate(s) => out.push(s),
        });
        out
    }

    /// Whether two strings decode to the same value.
    fn same(&self, other: &JsonStr<'_>) -> bool {
        if !self.escaped && !other.escaped {
            return self.raw == other.raw;
        }
        self.units() == other.units()
    }

    /// Whether this string decodes to `s`.
    pub(crate) fn eq_str(&self, s: &str) -> bool {
        if !self.escaped {
            return self.raw == s;
        }
        self.units().iter().copied().eq(s.encode_utf16())
    }
}

/// A JSON value as Python's `json.loads` builds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value<'a> {
    /// `None`.
    Null,
    /// `True` / `False`.
    Bool(bool),
    /// An `int`: its digits, exactly (`-0` reads as `0`).
    Int(&'a str),
    /// A `float` (a number with a fraction or an exponent, `NaN`, `Infinity`).
    Float(f64),
    /// A `str`.
    Str(JsonStr<'a>),
    /// A `list`.
    Array(Vec<Value<'a>>),
    /// A `dict`, in insertion order, keys unique.
    Object(Vec<(JsonStr<'a>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// Python's truth value: `None`, `False`, `0`, `0.0`, `""`, `[]` and `{}` are false.
    pub(crate) fn truthy(&self) -> bool {
        match self {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Int(digits) => *digits != "0",
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Array(items) => !items.is_empty(),
            Value::Object(members) => !members.is_empty(),
        }
    }

    /// `d.get(key)` on a `dict`; `None` for a missing key or a value that is not a `dict`.
    pub(crate) fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k.eq_str(key)).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub(crate) fn as_str(&self) -> Option<JsonStr<'a>> {
        match self {
            Value::Str(s) => Some(*s),
            _ => None,
        }
    }
}

/// `json.loads(text)`.
pub(crate) fn loads(text: &str) -> Result<Value<'_>, JsonError> {
    let mut p = Parser {
        s: text,
        b: text.as_bytes(),
        depth: 0,
    };
    let start = p.skip_ws(0);
    let (value, end) = p.value(start)?;
    let end = p.skip_ws(end);
    if end != p.b.len() {
        return Err(err("Extra data", end));
    }
    Ok(value)
}

fn err(message: &'static str, offset: usize) -> JsonError {
    JsonError { message, offset }
}

/// One of the parser's readers: from a position to a value and where it ends.
type Read<'a> = Result<(Value<'a>, usize), JsonError>;

struct Parser<'a> {
    s: &'a str,
    b: &'a [u8],
    depth: usize,
}

impl<'a> Parser<'a> {
    fn skip_ws(&self, mut i: usize) -> usize {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(i) {
            i += 1;
        }
        i
    }

    fn literal(&self, i: usize, word: &str) -> bool {
        self.b.get(i..i + word.len()) == Some(word.as_bytes())
    }

    fn value(&mut self, i: usize) -> Result<(Value<'a>, usize), JsonError> {
        match self.b.get(i) {
            Some(b'"') => {
                let (s, end) = self.string(i + 1)?;
                Ok((Value::Str(s), end))
            }
            Some(b'{') => self.nested(i, Self::object),
            Some(b'[') => self.nested(i, Self::array),
            Some(b'n') if self.literal(i, "null") => Ok((Value::Null, i + 4)),
            Some(b't') if self.literal(i, "true") => Ok((Value::Bool(true), i + 4)),
            Some(b'f') if self.literal(i, "false") => Ok((Value::Bool(false), i + 5)),
            Some(b'N') if self.literal(i, "NaN") => Ok((Value::Float(f64::NAN), i + 3)),
            Some(b'I') if self.literal(i, "Infinity") => Ok((Value::Float(f64::INFINITY), i + 8)),
            Some(b'-') if self.literal(i, "-Infinity") => {
                Ok((Value::Float(f64::NEG_INFINITY), i + 9))
            }
            Some(b'-' | b'0'..=b'9') => self.number(i),
            _ => Err(err("Expecting value", i)),
        }
    }

    fn nested(&mut self, i: usize, f: fn(&mut Self, usize) -> Read<'a>) -> Read<'a> {
        if self.depth >= MAX_DEPTH {
            return Err(err("maximum recursion depth exceeded", i));
        }
        self.depth += 1;
        let out = f(self, i + 1);
        self.depth -= 1;
        out
    }

    fn number(&self, start: usize) -> Result<(Value<'a>, usize), JsonError> {
        let b = self.b;
        let mut i = start;
        if b[i] == b'-' {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while let Some(b'0'..=b'9') = b.get(i) {
                    i += 1;
                }
            }
            _ => return Err(err("Expecting value", start)),
        }
        let mut float = false;
        if b.get(i) == Some(&b'.') && matches!(b.get(i + 1), Some(b'0'..=b'9')) {
            float = true;
            i += 1;
            while let Some(b'0'..=b'9') = b.get(i) {
                i += 1;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            let mut j = i + 1;
            if let Some(b'+' | b'-') = b.get(j) {
                j += 1;
            }
            if let Some(b'0'..=b'9') = b.get(j) {
                while let Some(b'0'..=b'9') = b.get(j) {
                    j += 1;
                }
                float = true;
                i = j;
            }
        }
        let text = &self.s[start..i];
        if float {
            let f: f64 = text.parse().map_err(|_| err("Expecting value", start))?;
            return Ok((Value::Float(f), i));
        }
        let digits = text.trim_start_matches('-');
        if digits.len() > MAX_INT_DIGITS {
            return Err(err(
                "Exceeds the limit for integer string conversion",
                start,
            ));
        }
        Ok((Value::Int(if text == "-0" { "0" } else { text }), i))
    }

    /// Reads a string whose opening quote is at `start - 1`.
    fn string(&self, start: usize) -> Result<(JsonStr<'a>, usize), JsonError> {
        let b = self.b;
        let mut i = start;
        let mut escaped = false;
        loop {
            match b.get(i) {
                None => return Err(err("Unterminated string starting at", start - 1)),
                Some(b'"') => {
                    return Ok((
                        JsonStr {
                            raw: &self.s[start..i],
                            escaped,
                        },
                        i + 1,
                    ))
                }
                Some(b'\\') => {
                    escaped = true;
                    match b.get(i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                        Some(b'u') => {
                            let hex = b.get(i + 2..i + 6).unwrap_or_default();
                            if hex.len() != 4 || !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(err("Invalid \\uXXXX escape", i + 1));
                            }
                            i += 6;
                        }
                        None => return Err(err("Unterminated string starting at", start - 1)),
                        Some(_) => return Err(err("Invalid \\escape", i)),
                    }
                }
                Some(c) if *c < 0x20 => return Err(err("Invalid control character at", i)),
                Some(_) => i += 1,
            }
        }
    }

    fn array(&mut self, start: usize) -> Result<(Value<'a>, usize), JsonError> {
        let mut items = Vec::new();
        let mut i = self.skip_ws(start);
        if self.b.get(i) == Some(&b']') {
            return Ok((Value::Array(items), i + 1));
        }
        loop {
            let (v, end) = self.value(i)?;
            items.push(v);
            i = self.skip_ws(end);
            match self.b.get(i) {
                Some(b']') => return Ok((Value::Array(items), i + 1)),
                Some(b',') => i = self.skip_ws(i + 1),
                _ => return Err(err("Expecting ',' delimiter", i)),
            }
        }
    }

    fn object(&mut self, start: usize) -> Result<(Value<'a>, usize), JsonError> {
        let mut members: Vec<(JsonStr<'a>, Value<'a>)> = Vec::new();
        let mut index: Option<HashMap<Vec<u16>, usize>> = None;
        let mut i = self.skip_ws(start);
        if self.b.get(i) == Some(&b'}') {
            return Ok((Value::Object(members), i + 1));
        }
        loop {
            if self.b.get(i) != Some(&b'"') {
                return Err(err("Expecting property name enclosed in double quotes", i));
            }
            let (key, end) = self.string(i + 1)?;
            i = self.skip_ws(end);
            if self.b.get(i) != Some(&b':') {
                return Err(err("Expecting ':' delimiter", i));
            }
            i = self.skip_ws(i + 1);
            let (v, end) = self.value(i)?;
            insert(&mut members, &mut index, key, v);
            i = self.skip_ws(end);
            match self.b.get(i) {
                Some(b'}') => return Ok((Value::Object(members), i + 1)),
                Some(b',') => i = self.skip_ws(i + 1),
                _ => return Err(err("Expecting ',' delimiter", i)),
            }
        }
    }
}

/// `d[key] = value` on a `dict`: a repeated key keeps its place and takes the new value.
fn insert<'a>(
    members: &mut Vec<(JsonStr<'a>, Value<'a>)>,
    index: &mut Option<HashMap<Vec<u16>, usize>>,
    key: JsonStr<'a>,
    value: Value<'a>,
) {
    if index.is_none() && members.len() >= LINEAR_KEYS {
        let map = members
            .iter()
            .enumerate()
            .map(|(n, (k, _))| (k.units(), n))
            .collect();
        *index = Some(map);
    }
    if let Some(map) = index {
        let units = key.units();
        if let Some(&n) = map.get(&units) {
            members[n].1 = value;
        } else {
            map.insert(units, members.len());
            members.push((key, value));
        }
        return;
    }
    if let Some(slot) = members.iter_mut().find(|(k, _)| k.same(&key)) {
        slot.1 = value;
    } else {
        members.push((key, value));
    }
}

/// `json.dumps(value, ensure_ascii=...)` appended to `out`. Without `ensure_ascii`, a
/// lone surrogate cannot be written (Python's output could not be encoded either).
pub(crate) fn dump(
    value: &Value<'_>,
    ensure_ascii: bool,
    out: &mut String,
) -> Result<(), LoneSurrogate> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Int(digits) => out.push_str(digits),
        Value::Float(f) => float_repr(*f, out),
        Value::Str(s) => dump_str(*s, ensure_ascii, out)?,
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push_str(", ");
                }
                dump(item, ensure_ascii, out)?;
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (n, (k, v)) in members.iter().enumerate() {
                if n > 0 {
                    out.push_str(", ");
                }
                dump_str(*k, ensure_ascii, out)?;
                out.push_str(": ");
                dump(v, ensure_ascii, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// `json.dumps(value, ensure_ascii=...)` as a new string.
pub(crate) fn dumps(value: &Value<'_>, ensure_ascii: bool) -> Result<String, LoneSurrogate> {
    let mut out = String::new();
    dump(value, ensure_ascii, &mut out)?;
    Ok(out)
}

/// A JSON string literal as Python writes it.
pub(crate) fn dump_str(
    s: JsonStr<'_>,
    ensure_ascii: bool,
    out: &mut String,
) -> Result<(), LoneSurrogate> {
    out.push('"');
    // Fast path: nothing to escape or to decode.
    if !s.escaped
        && s.raw
            .bytes()
            .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && (!ensure_ascii || b < 0x7f))
    {
        out.push_str(s.raw);
        out.push('"');
        return Ok(());
    }
    let mut lone = false;
    s.for_each_unit(|u| match u {
        Unit::Char(c) => push_char(c, ensure_ascii, out),
        Unit::Surrogate(v) => {
            if ensure_ascii {
                let _ = write!(out, "\\u{v:04x}");
            } else {
                lone = true;
            }
        }
    });
    out.push('"');
    if lone {
        Err(LoneSurrogate)
    } else {
        Ok(())
    }
}

/// A Rust string as a JSON string literal, as Python writes it.
pub(crate) fn dump_text(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        push_char(c, ensure_ascii, out);
    }
    out.push('"');
}

fn push_char(c: char, ensure_ascii: bool, out: &mut String) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if (c as u32) < 0x20 => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c if ensure_ascii && (c as u32) > 0x7e => {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
        c => out.push(c),
    }
}

/// Python's `float.__repr__` as `json.dumps` uses it (`NaN`, `Infinity`, `-Infinity` for
/// the values JSON lacks).
pub(crate) fn float_repr(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("NaN");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    if f.is_sign_negative() {
        out.push('-');
    }
    if f == 0.0 {
        out.push_str("0.0");
        return;
    }
    // The shortest digits that read back as `f` (Rust and Python both pick the closest
    // of the shortest), as `d.ddde±x`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    if !(-4 < decpt && decpt <= 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        for _ in 0..-decpt {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let d = decpt as usize;
        if d >= digits.len() {
            out.push_str(&digits);
            for _ in digits.len()..d {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..d]);
            out.push('.');
            out.push_str(&digits[d..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(text: &str, ensure_ascii: bool) -> String {
        dumps(&loads(text).expect("valid"), ensure_ascii).expect("no lone surrogate")
    }

    fn repr(f: f64) -> String {
        let mut s = String::new();
        float_repr(f, &mut s);
        s
    }

    #[test]
    fn dumps_like_python() {
        // Every expected string below is Python 3.11's
        // json.dumps(json.loads(text), ensure_ascii=False).
        assert_eq!(
            py(
                r#"{"b":1,"a":[true,false,null],"c":{"z":"x","y":[]}}"#,
                false
            ),
            r#"{"b": 1, "a": [true, false, null], "c": {"z": "x", "y": []}}"#
        );
        assert_eq!(py("{}", false), "{}");
        assert_eq!(py("[ ]", false), "[]");
        assert_eq!(
            py(r#""q\"b\\s\/n\nr\rt\tb\bf\fx\u0001\u001fé😀\u007f""#, false),
            "\"q\\\"b\\\\s/n\\nr\\rt\\tb\\bf\\fx\\u0001\\u001fé😀\u{7f}\""
        );
        assert_eq!(
            py(r#""é😀\u007f\ud83d\ude00""#, true),
            r#""\u00e9\ud83d\ude00\u007f\ud83d\ude00""#
        );
        assert_eq!(py(r#""\ud800x""#, true), r#""\ud800x""#);
        assert!(dumps(&loads(r#""\ud800x""#).expect("valid"), false).is_err());
        assert_eq!(
            py("[-0, 0, 12345678901234567890123, -7]", false),
            "[0, 0, 12345678901234567890123, -7]"
        );
        assert_eq!(
            py("[1.0, -0.0, 1e16, 1e15, 1E-5, 0.0001, 1.5e300, 2.5, 1e400, -1e400, NaN]", false),
            "[1.0, -0.0, 1e+16, 1000000000000000.0, 1e-05, 0.0001, 1.5e+300, 2.5, Infinity, -Infinity, NaN]"
        );
        // A repeated key keeps its first place and its last value.
        assert_eq!(py(r#"{"a":1,"b":2,"a":3}"#, false), r#"{"a": 3, "b": 2}"#);
        assert_eq!(py(r#"{"a":1,"\u0061":2}"#, false), r#"{"a": 2}"#);
    }

    #[test]
    fn float_repr_matches_python() {
        // repr() of each, from Python 3.11.
        let cases: &[(f64, &str)] = &[
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e22, "1e+22"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.00012, "0.00012"),
            (0.000012, "1.2e-05"),
            (-2.5e-7, "-2.5e-07"),
            (100.0, "100.0"),
            (1234.5678, "1234.5678"),
        ];
        for (f, want) in cases {
            assert_eq!(repr(*f), *want, "{f:?}");
        }
    }

    #[test]
    fn many_keys_find_repeats() {
        let mut text = String::from("{");
        for n in 0..40 {
            text.push_str(&format!("\"k{n}\": {n}, "));
        }
        text.push_str("\"k3\": \"again\", \"\\u006b7\": null}");
        let v = loads(&text).expect("valid");
        let Value::Object(members) = &v else {
            panic!("an object")
        };
        assert_eq!(members.len(), 40);
        assert_eq!(v.get("k3"), Some(&Value::Str(JsonStr::plain("again"))));
        assert_eq!(v.get("k7"), Some(&Value::Null));
    }

    #[test]
    fn loads_refuses_what_python_refuses() {
        for bad in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "1e",
            "-",
            "+1",
            "nul",
            "\"a\nb\"",
            "\"\\x\"",
            "\"\\u12\"",
            "[1] x",
            "{'a': 1}",
            "{\"a\" 1}",
            "\u{feff}1",
            "\"abc",
            "[1 2]",
            "Infinityx",
            "-NaN",
        ] {
            assert!(loads(bad).is_err(), "{bad:?} should not load");
        }
        for good in [
            " 1 ",
            "\t[\r\n]",
            "-Infinity",
            "\"\u{7f}\"",
            "1E+2",
            "-0.0e-0",
            "\"\\/\"",
        ] {
            assert!(loads(good).is_ok(), "{good:?} should load");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(loads(&deep).is_err());
        let long = "9".repeat(MAX_INT_DIGITS + 1);
        assert!(loads(&long).is_err());
    }

    #[test]
    fn truthiness_is_pythons() {
        for (text, truthy) in [
            ("null", false),
            ("false", false),
            ("0", false),
            ("-0", false),
            ("0.0", false),
            ("-0.0", false),
            ("\"\"", false),
            ("[]", false),
            ("{}", false),
            ("NaN", true),
            ("1", true),
            ("\" \"", true),
            ("[0]", true),
        ] {
            assert_eq!(loads(text).expect("valid").truthy(), truthy, "{text}");
        }
    }

    #[test]
    fn strings_decode() {
        let v = loads(r#""a\u00e9\ud83d\ude00\n""#).expect("valid");
        let s = v.as_str().expect("a string");
        assert_eq!(s.to_str().expect("whole"), "aé😀\n");
        assert!(s.eq_str("aé😀\n"));
        let lone = loads(r#""\udc00z""#).expect("valid");
        let lone = lone.as_str().expect("a string");
        assert_eq!(lone.to_str(), Err(LoneSurrogate));
        assert_eq!(lone.to_str_lossy(), "\u{fffd}z");
    }
}
