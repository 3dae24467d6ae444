//! JSON strings written straight into a buffer, byte for byte as serde_json writes them,
//! for the text intercept writes itself (trace lines, assembled responses).
//!
//! serde_json looks up every byte of a string in its escape table. Here whole 32-byte
//! blocks are tested at once for a byte that needs an escape (no quote, backslash or
//! control character: the compiler turns the test into vector compares), and runs are
//! copied whole: model text, mostly plain with a few newlines, costs a fraction of an
//! instruction a byte.

use bytes::BufMut;

fn byte_needs_escape(b: u8) -> bool {
    (b < 0x20) | (b == b'"') | (b == b'\\')
}

/// The length of the longest prefix of `b` in which no byte needs an escape.
fn clean_prefix(b: &[u8]) -> usize {
    let mut i = 0;
    for block in b.chunks_exact(32) {
        // Without early exits, so that it compiles to vector compares.
        let dirty = block
            .iter()
            .fold(false, |dirty, &c| dirty | byte_needs_escape(c));
        if dirty {
            break;
        }
        i += 32;
    }
    while i < b.len() && !byte_needs_escape(b[i]) {
        i += 1;
    }
    i
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
        /// The block test agrees with the byte test, for bytes drawn mostly from the
        /// ones near the limits.
        #[test]
        fn the_clean_prefix_is_where_the_first_escape_is(
            text in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => proptest::sample::select(vec![b'a', b' ', 0x7f, 0x80, 0xff, 0x21]),
                    1 => proptest::sample::select(vec![0x00u8, 0x1f, 0x20, b'"', b'\\']),
                ],
                0..100,
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
    fn every_byte_is_escaped_as_serde_json_escapes_it() {
        for c in 0u8..=0x7f {
            let s = format!("ab{}cdefghij{}", c as char, c as char);
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            assert_eq!(ours, serde_json::to_vec(&s).unwrap(), "byte {c:#x}");
        }
    }
}
