//! A validating scan of a JSON object's top level: each member's key and the span of its
//! value, in one pass over the text, for [`JsonBody::parse`](super::JsonBody::parse).
//!
//! It takes what `serde_json::from_str` takes (RFC 8259: the number grammar, the escapes,
//! no control characters in strings, whitespace of space, tab, CR and LF only) and no
//! more, and refuses nesting deeper than asked. Where serde_json checks strings eight
//! bytes at a time, this reads them 16 bytes a step in vector registers
//! ([`closing_quote`](crate::json_text::closing_quote)): quotes, backslashes and control
//! characters come out of one bit mask, so an escape costs a few instructions.
//! Anything it does not take (invalid JSON, not an object, too deep) returns `None`:
//! the caller then parses with serde_json, which says what is wrong.
//!
//! A scan leaves marks (where each element of each top-level array ends) so that the
//! next body of the same conversation is scanned on from the last element whose bytes
//! did not change ([`scan_from`]): a grown conversation costs what it adds.

use std::ops::Range;

/// A top-level member: its key, inside the quotes, and its value's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopMember {
    pub(super) key: Range<usize>,
    /// Whether the key has escapes (its text is not the key itself).
    pub(super) escaped: bool,
    pub(super) value: Range<usize>,
}

/// The members of the object `text` is, in order, if it is one that nests at most
/// `max_depth` levels (the object itself counting as one).
pub(super) fn scan_object(text: &str, max_depth: usize) -> Option<Vec<TopMember>> {
    scan(text.as_bytes(), max_depth, None).map(|s| s.members)
}

/// A scan's result, and what a later scan of a text that starts with the same bytes can
/// resume from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Scanned {
    pub(super) members: Vec<TopMember>,
    /// The members whose values are arrays of some elements: each one's index, and where
    /// each of its elements ends (just after the element).
    pub(super) marks: Vec<(usize, Vec<u32>)>,
}

/// The members of the object `text` is, like [`scan_object`], and marks for a later
/// scan. With `earlier` (an earlier text and its scan), an array member whose key the
/// earlier text had, and whose value starts with the bytes of the earlier one (a
/// conversation that grew), is scanned on from the last element they share.
pub(super) fn scan_from(
    text: &str,
    max_depth: usize,
    earlier: Option<(&[u8], &Scanned)>,
) -> Option<Scanned> {
    scan(text.as_bytes(), max_depth, earlier)
}

/// Where the array member keyed `key` (a range of `b`) whose value starts at `start`
/// can be scanned on from, after `earlier`: just after an element the earlier value
/// also had, byte for byte; and the marks of the elements before that one.
fn resume_point(
    b: &[u8],
    key: &Range<usize>,
    start: usize,
    (old, scanned): (&[u8], &Scanned),
) -> Option<(usize, Vec<u32>)> {
    let (member, ends) = scanned
        .marks
        .iter()
        .map(|(m, ends)| (&scanned.members[*m], ends))
        .find(|(m, _)| old.get(m.key.clone()) == b.get(key.clone()))?;
    let old_start = member.value.start;
    let common = common_prefix(old.get(member.value.clone())?, b.get(start..)?);
    let shared = ends.partition_point(|&end| end as usize - old_start <= common);
    let last = *ends.get(shared.checked_sub(1)?)? as usize;
    let shift = |end: u32| u32::try_from(end as usize - old_start + start).ok();
    // The walk marks the end it resumes from again.
    let before = ends[..shared - 1]
        .iter()
        .map(|&e| shift(e))
        .collect::<Option<_>>()?;
    Some((last - old_start + start, before))
}

/// How many first bytes `a` and `b` share: 4 KiB at a time, then 64 bytes, then bytes.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    for step in [4096, 64, 1] {
        while i + step <= n && a[i..i + step] == b[i..i + step] {
            i += step;
        }
    }
    i
}

fn scan(b: &[u8], max_depth: usize, earlier: Option<(&[u8], &Scanned)>) -> Option<Scanned> {
    // The open containers are kept as bits (one = an object) of a `u128`.
    if max_depth == 0 || max_depth > 128 {
        return None;
    }
    let mut members = Vec::with_capacity(8);
    let mut marks: Vec<(usize, Vec<u32>)> = Vec::new();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(Scanned { members, marks });
    }
    loop {
        let (key, escaped, after) = key_and_colon(b, i)?;
        let start = skip_ws(b, after);
        let end = if b.get(start) == Some(&b'[') {
            // Scanned on from where the earlier body's array parts from this one; a
            // resumed walk that fails (the earlier body was not this one's prefix in
            // the way its marks say) is walked again from the array's start.
            let resumed = earlier
                .and_then(|e| resume_point(b, &key, start, e))
                .and_then(|(at, mut ends)| {
                    let end = walk(b, at, max_depth - 1, 0, 1, true, Some(&mut ends))?;
                    Some((end, ends))
                });
            let (end, ends) = match resumed {
                Some(resumed) => resumed,
                None => {
                    let mut ends = Vec::new();
                    let end = walk(b, start, max_depth - 1, 0, 0, false, Some(&mut ends))?;
                    (end, ends)
                }
            };
            if !ends.is_empty() {
                marks.push((members.len(), ends));
            }
            end
        } else {
            skip_value(b, start, max_depth - 1)?
        };
        members.push(TopMember {
            key,
            escaped,
            value: start..end,
        });
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => {
                i += 1;
                break;
            }
            _ => return None,
        }
    }
    (skip_ws(b, i) == b.len()).then_some(Scanned { members, marks })
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = b.get(i) {
        i += 1;
    }
    i
}

/// A key at `i` (its opening quote), then `:`: the key's text inside its quotes, whether
/// it has escapes, and where its value may begin (after the colon).
fn key_and_colon(b: &[u8], i: usize) -> Option<(Range<usize>, bool, usize)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let (end, escaped) = skip_string(b, i)?;
    let colon = skip_ws(b, end);
    (b.get(colon) == Some(&b':')).then_some((i + 1..end - 1, escaped, colon + 1))
}

/// A string whose opening quote is at `i`: where it ends (after its closing quote) and
/// whether it has escapes.
fn skip_string(b: &[u8], i: usize) -> Option<(usize, bool)> {
    crate::json_text::closing_quote(b, i + 1, true).map(|(close, escaped)| (close + 1, escaped))
}

/// A value starting at `i`, nesting at most `depth` levels: where it ends.
fn skip_value(b: &[u8], i: usize, depth: usize) -> Option<usize> {
    match b.get(i)? {
        b'{' | b'[' => skip_container(b, i, depth),
        _ => skip_scalar(b, i),
    }
}

/// A string, number or literal at `i`: where it ends.
fn skip_scalar(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i).map(|(end, _)| end),
        b't' => literal(b, i, b"true"),
        b'f' => literal(b, i, b"false"),
        b'n' => literal(b, i, b"null"),
        b'-' | b'0'..=b'9' => skip_number(b, i),
        _ => None,
    }
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (b.get(i..i + word.len())? == word).then_some(i + word.len())
}

/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?` at `i`: where it ends.
fn skip_number(b: &[u8], i: usize) -> Option<usize> {
    let digits = |mut j: usize| {
        let start = j;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        (j > start).then_some(j)
    };
    let mut j = i + usize::from(b[i] == b'-');
    j = match b.get(j)? {
        b'0' => j + 1,
        b'1'..=b'9' => digits(j)?,
        _ => return None,
    };
    if b.get(j) == Some(&b'.') {
        j = digits(j + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(j) {
        j += 1;
        if let Some(b'+' | b'-') = b.get(j) {
            j += 1;
        }
        j = digits(j)?;
    }
    Some(j)
}

/// An array or object at `i`, nesting at most `depth` levels (itself one of them):
/// where it ends.
fn skip_container(b: &[u8], i: usize, depth: usize) -> Option<usize> {
    walk(b, i, depth, 0, 0, false, None)
}

/// Walks values from `i` until the containers open at the start close: where they do.
/// Iterative, the open containers kept as bits: `level` of them are open, bit `n` of
/// `objects` telling whether the one at level `n + 1` is an object; `ended`: a value
/// ended just before `i` (else one begins at `i`). With `ends`, where each value
/// directly inside the outermost container ends is pushed (offsets past `u32::MAX`
/// are not: the marks are for resuming, not for reading).
fn walk(
    b: &[u8],
    mut i: usize,
    depth: usize,
    mut objects: u128,
    mut level: usize,
    mut ended: bool,
    mut ends: Option<&mut Vec<u32>>,
) -> Option<usize> {
    loop {
        if !ended {
            // A value begins at `i`.
            match b.get(i)? {
                open @ (b'{' | b'[') => {
                    if level == depth {
                        return None;
                    }
                    let object = *open == b'{';
                    objects = (objects & !(1 << level)) | (u128::from(object) << level);
                    level += 1;
                    i = skip_ws(b, i + 1);
                    let close = if object { b'}' } else { b']' };
                    if b.get(i) == Some(&close) {
                        i += 1;
                        level -= 1;
                    } else {
                        if object {
                            i = skip_ws(b, key_and_colon(b, i)?.2);
                        }
                        continue;
                    }
                }
                _ => i = skip_scalar(b, i)?,
            }
        }
        ended = false;
        // A value ended at `i`: close containers until one goes on.
        loop {
            if level == 0 {
                return Some(i);
            }
            if level == 1 {
                if let (Some(ends), Ok(at)) = (ends.as_deref_mut(), u32::try_from(i)) {
                    ends.push(at);
                }
            }
            i = skip_ws(b, i);
            let object = objects & (1 << (level - 1)) != 0;
            match (b.get(i)?, object) {
                (b',', _) => {
                    i = skip_ws(b, i + 1);
                    if object {
                        i = skip_ws(b, key_and_colon(b, i)?.2);
                    }
                    break;
                }
                (b'}', true) | (b']', false) => {
                    i += 1;
                    level -= 1;
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use proptest::prelude::*;
    use serde_json::value::RawValue;

    use super::super::tests::arb_json;
    use super::*;

    /// What serde_json makes of `text`: the members' keys and value spans, if it takes
    /// it as an object nesting at most `max_depth` levels.
    fn by_serde(text: &str, max_depth: usize) -> Option<Vec<(String, Range<usize>)>> {
        let map: Vec<(Cow<'_, str>, &RawValue)> =
            serde_json::from_str::<super::super::TopLevel<'_>>(text)
                .ok()?
                .members;
        if super::super::nests_deeper_than(text.as_bytes(), max_depth) {
            return None;
        }
        Some(
            map.into_iter()
                .map(|(k, v)| {
                    let start = v.get().as_ptr() as usize - text.as_ptr() as usize;
                    (k.into_owned(), start..start + v.get().len())
                })
                .collect(),
        )
    }

    /// The same from the scan; a key whose escapes do not decode (a lone surrogate)
    /// sends `JsonBody::parse` to serde_json, as here.
    fn by_scan(text: &str, max_depth: usize) -> Option<Vec<(String, Range<usize>)>> {
        scan_object(text, max_depth)?
            .into_iter()
            .map(|m| {
                let key = if m.escaped {
                    serde_json::from_str(&text[m.key.start - 1..m.key.end + 1]).ok()?
                } else {
                    text[m.key.clone()].to_owned()
                };
                Some((key, m.value))
            })
            .collect()
    }

    #[test]
    fn takes_what_serde_json_takes() {
        for text in [
            r#"{}"#,
            " {\t\"a\" :\r\n1 } \n",
            r#"{"a":-0,"b":0.5e-7,"c":1E+9,"d":[],"e":{},"f":[{}],"g":"\u00e9\n\"\\\/"}"#,
            r#"{"k\"ey":true,"n":null,"f":false,"s":"é ☃ 𝄞"}"#,
            r#"{"a":[1,[2,[3,{"b":[{"c":"d"}]}]]]}"#,
            r#"{"a":1,"a":2}"#,
        ] {
            let fast = by_scan(text, 127);
            assert!(fast.is_some(), "not taken: {text}");
            assert_eq!(fast, by_serde(text, 127), "{text}");
        }
    }

    #[test]
    fn refuses_what_serde_json_refuses() {
        for text in [
            "",
            "[]",
            r#""a""#,
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a":1}x"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":1e}"#,
            r#"{"a":-}"#,
            r#"{"a":+1}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[1}"#,
            r#"{"a":{"b":1]}"#,
            r#"{"a":{1:2}}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12G4"}"#,
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"\u{1}\"}",
            "{\"a\":1}\u{b}",
            r#"{"a":"unterminated}"#,
            r#"{"a":[[[]]"#,
        ] {
            assert_eq!(by_scan(text, 127), None, "taken: {text:?}");
            assert_eq!(by_serde(text, 127), None, "serde_json takes {text:?}");
        }
    }

    #[test]
    fn refuses_nesting_past_the_limit_and_takes_it_up_to_it() {
        let nested = |levels: usize| {
            // The object is one level; `levels - 1` arrays inside it.
            format!(
                "{{\"a\":{}1{}}}",
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            )
        };
        assert!(by_scan(&nested(127), 127).is_some());
        assert_eq!(by_scan(&nested(128), 127), None);
        assert_eq!(by_serde(&nested(128), 127), None);
        assert!(by_scan(&nested(3), 3).is_some());
        assert_eq!(by_scan(&nested(4), 3), None);
        // Far deeper than any limit: refused without recursion.
        assert_eq!(by_scan(&nested(100_000), 127), None);
    }

    proptest! {
        /// Any object serde_json writes, compact or pretty, is taken, with serde_json's
        /// own keys and spans.
        #[test]
        fn objects_are_taken_as_serde_json_takes_them(
            obj in prop::collection::btree_map("[a-z\"\\\\]{1,4}", arb_json(), 0..6),
            pretty in any::<bool>(),
        ) {
            let value = serde_json::Value::Object(obj.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                serde_json::to_string(&value).unwrap()
            };
            let fast = by_scan(&text, 127);
            prop_assert!(fast.is_some(), "not taken: {}", text);
            prop_assert_eq!(fast, by_serde(&text, 127));
        }

        /// The same texts with one byte changed, removed or added: the scan takes what
        /// serde_json takes, the same way, and refuses what it refuses.
        #[test]
        fn an_edited_text_is_taken_exactly_as_serde_json_takes_it(
            obj in prop::collection::btree_map("[a-z]{1,3}", arb_json(), 0..5),
            at in any::<prop::sample::Index>(),
            edit in 0u8..3,
            byte in prop::sample::select(
                b"{}[]\",:\\ \t\n0123456789-+.eEtrufalsn/u\x01\x7f".to_vec()
            ),
        ) {
            let value = serde_json::Value::Object(obj.into_iter().collect());
            let mut bytes = serde_json::to_vec(&value).unwrap();
            let i = at.index(bytes.len() + 1);
            match edit {
                0 if i < bytes.len() => bytes[i] = byte,
                1 if i < bytes.len() => { bytes.remove(i); }
                _ => bytes.insert(i.min(bytes.len()), byte),
            }
            let Ok(text) = std::str::from_utf8(&bytes) else { return Ok(()) };
            prop_assert_eq!(by_scan(text, 127), by_serde(text, 127), "{}", text);
        }

        /// Any text at all over JSON's own bytes, with a low nesting limit: the same.
        #[test]
        fn any_text_is_taken_exactly_as_serde_json_takes_it(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"{}[]\":,\\ 01-.eEtrunlfas\x01".to_vec()), 0..40),
        ) {
            let text = std::str::from_utf8(&bytes).unwrap();
            prop_assert_eq!(by_scan(text, 5), by_serde(text, 5), "{}", text);
        }
    }
}
