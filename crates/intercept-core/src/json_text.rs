//! JSON strings written straight into a buffer, byte for byte as serde_json writes them,
//! for the text intercept writes itself (trace lines, assembled responses).
//!
//! serde_json looks up every byte of a string in its escape table. Here the bytes are
//! read eight at a time while none needs an escape (no quote, backslash or control
//! character), and runs are copied whole: model text, mostly plain with a few newlines,
//! costs about a third of the instructions.

use bytes::BufMut;

/// Whether eight bytes hold, at once, a quote, a backslash or a control character
/// (below 0x20): what a JSON string must escape.
fn word_needs_escape(word: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte of `x` below `n` (n <= 0x80) sets its high bit here; as a whole, exact.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let zero = |x: u64| below(x, 1);
    let mut w = [0u8; 8];
    w.copy_from_slice(word);
    let x = u64::from_ne_bytes(w);
    let quote = zero(x ^ (ONES * u64::from(b'"')));
    let backslash = zero(x ^ (ONES * u64::from(b'\\')));
    below(x, 0x20) | quote | backslash != 0
}

fn byte_needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Appends `s` as a JSON string, quotes included, exactly as `serde_json::to_writer`
/// writes it.
pub(crate) fn write_str(out: &mut impl BufMut, s: &str) {
    let b = s.as_bytes();
    out.put_u8(b'"');
    let (mut start, mut i) = (0, 0);
    while i < b.len() {
        if b.len() - i >= 8 && !word_needs_escape(&b[i..i + 8]) {
            i += 8;
            continue;
        }
        let c = b[i];
        i += 1;
        if !byte_needs_escape(c) {
            continue;
        }
        out.put_slice(&b[start..i - 1]);
        start = i;
        let escape: &[u8] = match c {
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
                continue;
            }
        };
        out.put_slice(escape);
    }
    out.put_slice(&b[start..]);
    out.put_u8(b'"');
}

/// Appends `s` as a JSON string, or `null`.
pub(crate) fn write_opt_str(out: &mut impl BufMut, s: Option<&str>) {
    match s {
        Some(s) => write_str(out, s),
        None => out.put_slice(b"null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The word test agrees with the byte test, for bytes drawn mostly from the ones
        /// near the limits.
        #[test]
        fn the_word_test_is_the_byte_test(
            word in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(
                        vec![0x00u8, 0x1f, 0x20, 0x21, b'"', b'\\', 0x7f, 0x80, 0xff, b'a']
                    ),
                    proptest::num::u8::ANY,
                ],
                8,
            )
        ) {
            let by_byte = word.iter().any(|&b| byte_needs_escape(b));
            proptest::prop_assert_eq!(word_needs_escape(&word), by_byte);
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
    fn every_byte_is_escaped_as_serde_json_escapes_it() {
        for c in 0u8..=0x7f {
            let s = format!("ab{}cdefghij{}", c as char, c as char);
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            assert_eq!(ours, serde_json::to_vec(&s).unwrap(), "byte {c:#x}");
        }
    }
}
