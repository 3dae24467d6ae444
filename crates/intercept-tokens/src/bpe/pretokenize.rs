//! Qwen2's pre-tokenizer regex as a scanner:
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! At each position Oniguruma tries the alternatives in order and keeps the first that
//! matches (with backtracking inside it); matches follow each other with no gap, as every
//! character is a letter, a number, whitespace or something else. The classes are
//! Oniguruma's own, read from it one 256-character block at a time.

use std::sync::OnceLock;

use tokenizers::utils::SysRegex;

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 4;

const BLOCKS: usize = 0x110000 >> 8;

/// `\p{L}`, `\p{N}` and `\s` as the Oniguruma behind `tokenizers` reads them.
pub(crate) struct Classes {
    letter: SysRegex,
    number: SysRegex,
    space: SysRegex,
    blocks: Box<[OnceLock<Box<[u8; 256]>>]>,
}

impl Classes {
    pub(crate) fn new() -> Option<Classes> {
        let classes = Classes {
            letter: SysRegex::new(r"\p{L}").ok()?,
            number: SysRegex::new(r"\p{N}").ok()?,
            space: SysRegex::new(r"\s").ok()?,
            blocks: (0..BLOCKS).map(|_| OnceLock::new()).collect(),
        };
        // Verify the probes on a few known characters before trusting them.
        let ok = classes.of('a') == LETTER
            && classes.of('7') == NUMBER
            && classes.of(' ') == SPACE
            && classes.of('\n') == SPACE
            && classes.of('!') == 0;
        ok.then_some(classes)
    }

    /// The bytes of the block table and of the blocks read so far.
    pub(crate) fn table_bytes(&self) -> usize {
        let read = self.blocks.iter().filter(|b| b.get().is_some()).count();
        self.blocks.len() * std::mem::size_of::<OnceLock<Box<[u8; 256]>>>() + read * 256
    }

    /// Reads one block's classes from the regexes.
    fn probe(&self, block: usize) -> Box<[u8; 256]> {
        let mut text = String::with_capacity(256 * 4);
        let mut starts = Vec::with_capacity(256);
        for low in 0..256u32 {
            if let Some(c) = char::from_u32(((block as u32) << 8) | low) {
                starts.push((text.len(), low as usize));
                text.push(c);
            }
        }
        let mut out = Box::new([0u8; 256]);
        for (regex, bit) in [
            (&self.letter, LETTER),
            (&self.number, NUMBER),
            (&self.space, SPACE),
        ] {
            for (start, _) in regex.find_iter(&text) {
                if let Ok(k) = starts.binary_search_by_key(&start, |(s, _)| *s) {
                    out[starts[k].1] |= bit;
                }
            }
        }
        out
    }

    fn of(&self, c: char) -> u8 {
        let c = c as usize;
        let block = self.blocks[c >> 8].get_or_init(|| self.probe(c >> 8));
        block[c & 0xff]
    }

    /// Calls `f` with each piece of `s`, in order.
    pub(crate) fn split(&self, s: &str, mut f: impl FnMut(&str)) {
        let mut p = 0;
        while p < s.len() {
            let end = self.piece(s, p);
            f(&s[p..end]);
            p = end;
        }
    }

    /// The end of the piece that starts at `p`.
    fn piece(&self, s: &str, p: usize) -> usize {
        let rest = &s[p..];
        let mut chars = rest.chars();
        let Some(c0) = chars.next() else {
            return s.len();
        };
        let after0 = p + c0.len_utf8();
        let c1 = chars.next();
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c0 == '\'' {
            if let Some(n) = contraction(&s[after0..]) {
                return after0 + n;
            }
        }
        let k0 = self.of(c0);
        let k1 = c1.map(|c| self.of(c));
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if c0 != '\r' && c0 != '\n' && k0 & (LETTER | NUMBER) == 0 && k1 == Some(LETTER) {
            return self.run(s, after0, |k, _| k == LETTER);
        }
        if k0 == LETTER {
            return self.run(s, after0, |k, _| k == LETTER);
        }
        // \p{N}
        if k0 == NUMBER {
            return after0;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let other_from = if c0 == ' ' && k1 == Some(0) {
            Some(after0)
        } else if k0 == 0 {
            Some(p)
        } else {
            None
        };
        if let Some(q) = other_from {
            let q = self.run(s, q, |k, _| k == 0);
            return self.run(s, q, |_, c| c == '\r' || c == '\n');
        }
        // Whitespace from here.
        let run_end = self.run(s, p, |k, _| k == SPACE);
        let run = &s[p..run_end];
        // \s*[\r\n]+ : up to the run's last line break.
        if let Some(last) = run.rfind(['\r', '\n']) {
            return p + last + 1;
        }
        // \s+(?!\S) : the run, but its last character when one follows.
        if run_end == s.len() {
            return run_end;
        }
        match run.char_indices().next_back() {
            Some((last, _)) if last > 0 => p + last,
            // \s+
            _ => run_end,
        }
    }

    /// The end of the run of characters from `from` that `keep` accepts.
    fn run(&self, s: &str, from: usize, keep: impl Fn(u8, char) -> bool) -> usize {
        for (i, c) in s[from..].char_indices() {
            if !keep(self.of(c), c) {
                return from + i;
            }
        }
        s.len()
    }
}

/// After an apostrophe: the length of `s`, `t`, `re`, `ve`, `m`, `ll` or `d` (any case;
/// `ſ` folds to `s`) if `rest` starts with one.
fn contraction(rest: &str) -> Option<usize> {
    let mut chars = rest.chars();
    let a = chars.next()?;
    let b = chars.next();
    let is = |c: Option<char>, lower: char| {
        c.is_some_and(|c| c.to_ascii_lowercase() == lower && c.is_ascii())
    };
    match a {
        's' | 'S' => Some(1),
        '\u{17f}' => Some(a.len_utf8()),
        't' | 'T' | 'm' | 'M' | 'd' | 'D' => Some(1),
        'r' | 'R' | 'v' | 'V' if is(b, 'e') => Some(2),
        'l' | 'L' if is(b, 'l') => Some(2),
        _ => None,
    }
}
