//! `str.isspace()` and `str.strip()` as Python defines them.

/// Python's `str.isspace()` for one character: Unicode `White_Space` plus the four
/// information separators U+001C..U+001F (bidirectional class B or S), which Rust's
/// [`char::is_whitespace`] leaves out.
pub(crate) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.strip()`.
pub(crate) fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Python's `s.lstrip()`.
pub(crate) fn lstrip(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

/// Whether Python's `s.strip()` is empty.
pub(crate) fn is_blank(s: &str) -> bool {
    s.chars().all(is_space)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_includes_the_separators() {
        // Python: ''.join(chr(c) for c in range(0x110000) if chr(c).isspace())
        let python: Vec<u32> = vec![
            0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000,
            0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028,
            0x2029, 0x202f, 0x205f, 0x3000,
        ];
        let ours: Vec<u32> = (0..=0x10ffffu32)
            .filter_map(char::from_u32)
            .filter(|c| is_space(*c))
            .map(u32::from)
            .collect();
        assert_eq!(ours, python);
        assert_eq!(strip("\u{1f} a b\u{3000}\n"), "a b");
        assert_eq!(lstrip("\u{85}x "), "x ");
        assert!(is_blank(" \u{2028}"));
        assert!(!is_blank(" \u{200b}"));
    }
}
