//! JSON strings written straight into a buffer, byte for byte as serde_json writes them,
//! for the text intercept writes itself (trace lines, assembled responses).
//!
//! serde_json looks up every byte of a string in its escape table. Here 16 bytes at a
//! time are tested in vector registers for a byte that needs an escape (a quote, a
//! backslash or a control character, through the `wide` crate's portable vectors), and
//! runs are copied whole. The same scan finds where a string ends in JSON text, for the
//! request scanner and the trace log's encoder: model text, mostly plain with a few
//! escapes, costs well under an instruction a byte, and a dense run of escapes no more
//! than a few instructions each.

use bytes::BufMut;
use wide::u8x16;

/// 16 bytes of `b` from `at` (past its end, spaces), as a vector.
fn block(b: &[u8], at: usize) -> u8x16 {
    let mut block = [b' '; 16];
    match b.get(at..at + 16) {
        Some(full) => block.copy_from_slice(full),
        None => {
            let rest = b.get(at..).unwrap_or_default();
            block[..rest.len()].copy_from_slice(rest);
        }
    }
    u8x16::new(block)
}

/// The bytes of a block that end a run of string text, as bits (bit `k` for byte
/// `k`): quotes and backslashes, and with `controls` also control characters.
fn stops(v: u8x16, controls: bool) -> u32 {
    let mut m = v.simd_eq(u8x16::splat(b'"')) | v.simd_eq(u8x16::splat(b'\\'));
    if controls {
        m |= v.min(u8x16::splat(0x1f)).simd_eq(v);
    }
    m.to_bitmask()
}

/// The index of the first byte of `b` at or after `at` that ends a run of string text
/// (see [`stops`]), or `b.len()`: 16 bytes a step, in vector registers.
fn next_stop(b: &[u8], mut at: usize, controls: bool) -> usize {
    while at < b.len() {
        let m = stops(block(b, at), controls);
        if m != 0 {
            return (at + m.trailing_zeros() as usize).min(b.len());
        }
        at += 16;
    }
    b.len()
}

/// The length of the longest prefix of `b` in which no byte needs an escape (the index
/// of the first quote, backslash or control character, or `b.len()`).
pub(crate) fn clean_prefix(b: &[u8]) -> usize {
    next_stop(b, 0, true)
}

/// A JSON string's closing quote: its index, for the string's text starting at `from`
/// (just after its opening quote), and whether the string has escapes; `None` when the
/// text ends first.
///
/// With `check`, the text is also checked as JSON requires (no raw control character,
/// only the escapes JSON has, `\u` with four hex digits) and `None` returned when it
/// is not; without, escapes are only skipped. One pass: the stops of each 16-byte block
/// are read from one bit mask, so an escape costs a few instructions.
pub(crate) fn closing_quote(b: &[u8], from: usize, check: bool) -> Option<(usize, bool)> {
    let mut base = from;
    let mut escaped = false;
    while base < b.len() {
        // Padding past the end of `b` never stops.
        let mut m = stops(block(b, base), check);
        let mut next_block = base + 16;
        while m != 0 {
            let pos = base + m.trailing_zeros() as usize;
            match b[pos] {
                b'"' => return Some((pos, escaped)),
                b'\\' => {
                    escaped = true;
                    let len = match *b.get(pos + 1)? {
                        b'u' => 6,
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                        _ if check => return None,
                        _ => 2,
                    };
                    if check && len == 6 {
                        let hex = b.get(pos + 2..pos + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                    }
                    let after = pos + len;
                    if after >= base + 16 {
                        next_block = after;
                        break;
                    }
                    // The escaped bytes are text, not stops.
                    m &= u32::MAX << (after - base);
                }
                // A raw control character (a stop only with `check`).
                _ => return None,
            }
        }
        base = next_block;
    }
    None
}

/// Appends `s` as a JSON string, quotes included, exactly as `serde_json::to_writer`
/// writes it.
pub(crate) fn write_str(out: &mut impl BufMut, s: &str) {
    let b = s.as_bytes();
    out.put_u8(b'"');
    let mut start = 0;
    loop {
        let clean = start + clean_prefix(&b[start..]);
        out.put_slice(&b[start..clean]);
        let Some(&c) = b.get(clean) else { break };
        start = clean + 1;
        escape(out, c);
    }
    out.put_u8(b'"');
}

/// Appends serde_json's escape of `c` (a quote, a backslash or a control character).
fn escape(out: &mut impl BufMut, c: u8) {
    let short: &[u8] = match c {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        b'\n' => b"\\n",
        b'\r' => b"\\r",
        b'\t' => b"\\t",
        0x08 => b"\\b",
        0x0c => b"\\f",
        _ => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.put_slice(b"\\u00");
            out.put_u8(HEX[usize::from(c >> 4)]);
            out.put_u8(HEX[usize::from(c & 0x0f)]);
            return;
        }
    };
    out.put_slice(short);
}

/// Appends a JSON string's text (`inner`, between its quotes, valid JSON) in serde_json's
/// spelling: `\uXXXX` escapes of characters it writes as they stand become those
/// characters, the others its short escapes or lowercase `\u00xx`, and `\/` becomes
/// `/`. Returns `false` (having appended part of it) for a lone surrogate escape, which
/// no Rust string can hold.
pub(crate) fn respell(inner: &[u8], out: &mut Vec<u8>) -> bool {
    let hex4 = |at: usize| -> Option<u32> {
        let digits = std::str::from_utf8(inner.get(at..at + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let mut at = 0;
    while let Some(k) = memchr::memchr(b'\\', &inner[at..]) {
        out.extend_from_slice(&inner[at..at + k]);
        at += k;
        match inner.get(at + 1) {
            Some(b'/') => {
                out.push(b'/');
                at += 2;
            }
            Some(b'u') => {
                let Some(unit) = hex4(at + 2) else {
                    return false;
                };
                at += 6;
                let code = match unit {
                    0xd800..=0xdbff => {
                        let low = match (inner.get(at..at + 2), hex4(at + 2)) {
                            (Some(b"\\u"), Some(low @ 0xdc00..=0xdfff)) => low,
                            _ => return false,
                        };
                        at += 6;
                        0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
                    }
                    0xdc00..=0xdfff => return false,
                    unit => unit,
                };
                let Some(c) = char::from_u32(code) else {
                    return false;
                };
                match u8::try_from(code) {
                    Ok(b) if b < 0x20 || b == b'"' || b == b'\\' => escape(out, b),
                    _ => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
            _ => {
                out.extend_from_slice(inner.get(at..at + 2).unwrap_or_default());
                at += 2;
            }
        }
    }
    out.extend_from_slice(&inner[at.min(inner.len())..]);
    true
}

/// Appends `s` as a JSON string, or `null`.
pub(crate) fn write_opt_str(out: &mut impl BufMut, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.put_slice(b"null"),
    }
}

/// Token ids as a JSON array of integers.
pub(crate) fn write_ids(out: &mut Vec<u8>, ids: &[u32]) {
    out.push(b'[');
    let mut buf = itoa::Buffer::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(buf.format(*id).as_bytes());
    }
    out.push(b']');
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// The index just after the string that starts at `i` (at its quote).
pub(crate) fn string_end(b: &[u8], i: usize) -> Option<usize> {
    closing_quote(b, i + 1, false).map(|(close, _)| close + 1)
}

/// The index just after the value that starts at or after `i`.
pub(crate) fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    let i = ws(b, i);
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            // Strings are skipped whole, so brackets inside them do not count.
            let mut depth = 0usize;
            let mut at = i;
            loop {
                match b.get(at)? {
                    b'"' => {
                        at = string_end(b, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let mut at = i;
            while at < b.len()
                && !matches!(b[at], b',' | b']' | b'}' | b' ' | b'\n' | b'\r' | b'\t')
            {
                at += 1;
            }
            if at == i {
                return None;
            }
            Some(at)
        }
    }
}

/// The elements of a JSON array's text, each as its raw text (whitespace around it
/// left out); `None` when the text is not an array.
pub(crate) fn elements(text: &str) -> Option<Vec<&str>> {
    let raw = text.as_bytes();
    let mut at = ws(raw, 0);
    if raw.get(at) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    at = ws(raw, at + 1);
    if raw.get(at) == Some(&b']') {
        return (ws(raw, at + 1) == raw.len()).then_some(out);
    }
    loop {
        let start = ws(raw, at);
        let end = skip_value(raw, start)?;
        out.push(&text[start..end]);
        at = ws(raw, end);
        match raw.get(at)? {
            b',' => at += 1,
            b']' => return (ws(raw, at + 1) == raw.len()).then_some(out),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn byte_needs_escape(b: u8) -> bool {
        (b < 0x20) | (b == b'"') | (b == b'\\')
    }

    proptest::proptest! {
        /// The block test agrees with the byte test, for bytes drawn mostly from the
        /// ones near the limits.
        #[test]
        fn the_clean_prefix_is_where_the_first_escape_is(
            text in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => proptest::sample::select(vec![b'a', b' ', 0x7f, 0x80, 0xff, 0x21]),
                    1 => proptest::sample::select(vec![0x00u8, 0x1f, 0x20, b'"', b'\\']),
                ],
                0..300,
            )
        ) {
            let by_byte = text.iter().position(|&b| byte_needs_escape(b)).unwrap_or(text.len());
            proptest::prop_assert_eq!(clean_prefix(&text), by_byte);
        }

        /// Byte for byte what serde_json writes: every control character, quotes,
        /// backslashes, DEL, non-ASCII, runs longer and shorter than a word.
        #[test]
        fn write_str_is_what_serde_json_writes(
            s in "(\\PC|[\u{0}-\u{1f}\"\\\\\u{7f}]|[a-z ]{8,20}){0,40}"
        ) {
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            proptest::prop_assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(&s).unwrap()
            );
        }
    }

    #[test]
    fn the_clean_prefix_ends_at_any_position_in_short_and_long_runs() {
        for len in [0, 1, 7, 8, 9, 31, 32, 33, 40, 100, 300] {
            let clean = vec![b'a'; len];
            assert_eq!(clean_prefix(&clean), len);
            for at in 0..len {
                for bad in [0x00, b'\n', b'\t', 0x1f, b'"', b'\\'] {
                    let mut text = clean.clone();
                    text[at] = bad;
                    // A later dirty byte does not move the answer.
                    if at + 3 < len {
                        text[at + 3] = b'"';
                    }
                    assert_eq!(clean_prefix(&text), at, "len {len}, byte {bad:#x} at {at}");
                }
            }
        }
    }

    proptest::proptest! {
        /// The closing quote of any string serde_json writes, followed by anything.
        #[test]
        fn the_closing_quote_is_where_serde_json_ends_the_string(
            s in "(\\PC|[\u{0}-\u{1f}\"\\\\/]|[a-z ]{8,40}){0,60}",
            after in "[\"\\\\a ]{0,3}",
        ) {
            let token = serde_json::to_string(&s).unwrap();
            let text = format!("{token}{after}");
            for check in [false, true] {
                let got = closing_quote(text.as_bytes(), 1, check);
                proptest::prop_assert_eq!(got, Some((token.len() - 1, token.contains('\\'))));
                // Cut before its closing quote, it has none.
                let cut = &token.as_bytes()[..token.len() - 1];
                proptest::prop_assert_eq!(closing_quote(cut, 1, check), None);
            }
        }
    }

    proptest::proptest! {
        /// Any string, its characters spelled by other writers' escapes (`\\uXXXX` in
        /// either case, surrogate pairs, `\\/`), comes back in serde_json's spelling.
        #[test]
        fn respelled_text_is_serde_json_text(
            s in "(\\PC|[\u{0}-\u{1f}\"\\\\/\u{7f}\u{e9}\u{1d11e}]){0,40}",
            picks in proptest::collection::vec(0u8..4, 40),
        ) {
            let mut other = String::new();
            for (c, pick) in s.chars().zip(picks.iter().cycle()) {
                match (pick, c) {
                    (0, '/') => other.push_str("\\/"),
                    (0 | 1, c) => {
                        let mut units = [0u16; 2];
                        for u in c.encode_utf16(&mut units) {
                            if *pick == 0 {
                                other.push_str(&format!("\\u{u:04x}"));
                            } else {
                                other.push_str(&format!("\\u{u:04X}"));
                            }
                        }
                    }
                    _ => {
                        let token = serde_json::to_string(&c.to_string()).unwrap();
                        other.push_str(&token[1..token.len() - 1]);
                    }
                }
            }
            let mut out = Vec::new();
            proptest::prop_assert!(respell(other.as_bytes(), &mut out));
            let want = serde_json::to_string(&s).unwrap();
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), &want[1..want.len() - 1]);
        }
    }

    #[test]
    fn a_lone_surrogate_is_not_respelled() {
        for text in [r"a\ud800", r"\ud800\u0041", r"\udc00", r"\ud800\ud800"] {
            assert!(!respell(text.as_bytes(), &mut Vec::new()), "{text}");
        }
        let mut out = Vec::new();
        assert!(respell(
            br"\ud83d\ude00 \u00E9\/\u0022\u005c\u001F\n",
            &mut out
        ));
        assert_eq!(out, "\u{1f600} é/\\\"\\\\\\u001f\\n".as_bytes());
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_escapes_it() {
        for c in 0u8..=0x7f {
            let s = format!("ab{}cdefghij{}", c as char, c as char);
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            assert_eq!(ours, serde_json::to_vec(&s).unwrap(), "byte {c:#x}");
        }
    }

    #[test]
    fn elements_of_an_array() {
        assert_eq!(
            elements(" [ 1 , {\"a\": [2]} ,\"x\" ] "),
            Some(vec!["1", "{\"a\": [2]}", "\"x\""])
        );
        assert_eq!(elements("[]"), Some(vec![]));
        assert_eq!(elements("{}"), None);
        assert_eq!(elements("[1,]"), None);
    }
}
