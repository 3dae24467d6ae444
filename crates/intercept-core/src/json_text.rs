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

/// The bytes of an eight-byte word that need an escape, as the high bit of each (the
/// lowest one exact: a borrow only runs upwards from a byte that is flagged itself).
fn escape_bits(word: [u8; 8]) -> u64 {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let x = u64::from_le_bytes(word);
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let quote = below(x ^ (ONES * u64::from(b'"')), 1);
    let backslash = below(x ^ (ONES * u64::from(b'\\')), 1);
    below(x, 0x20) | quote | backslash
}

/// The index of the first byte of `b` that needs an escape, or `b.len()`.
fn first_dirty(b: &[u8]) -> usize {
    b.iter().position(|&c| byte_needs_escape(c)).unwrap_or(b.len())
}

/// Whether `run` holds a control character, 64 bytes at a time (vectorised).
fn has_control(run: &[u8]) -> bool {
    run.chunks(64)
        .any(|block| block.iter().fold(false, |any, &c| any | (c < 0x20)))
}

/// The length of the longest prefix of `b` in which no byte needs an escape (the index
/// of the first quote, backslash or control character, or `b.len()`).
///
/// The first 32 bytes are read eight at a time: keys and short values end there. A
/// longer run is searched by `memchr2` for the quote and the backslash, then checked
/// for control characters, both at vector speed.
pub(crate) fn clean_prefix(b: &[u8]) -> usize {
    const HEAD: usize = 32;
    let mut i = 0;
    while i < HEAD {
        let Some(word) = b.get(i..i + 8) else {
            return i + first_dirty(&b[i..]);
        };
        let bits = escape_bits(word.try_into().unwrap_or([0; 8]));
        if bits != 0 {
            return i + (bits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let rest = &b[HEAD..];
    let run = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
    if has_control(&rest[..run]) {
        HEAD + first_dirty(rest)
    } else {
        HEAD + run
    }
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
                for bad in [0x00, 0x1f, b'"', b'\\'] {
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
