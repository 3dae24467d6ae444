//! A fast encoder for byte-level BPE tokenizers of Qwen2's shape (Qwen2, Qwen2.5,
//! Qwen3): the same ids as the Hugging Face `tokenizers` pipeline, several times faster.
//!
//! That pipeline, for such a `tokenizer.json`, is: split the text at added tokens
//! (leftmost-longest), NFC-normalise each other piece, cut it with Qwen2's pre-tokenizer
//! regex, map bytes to GPT-2's byte alphabet, and merge each word by BPE rank. Here:
//!
//! - the added tokens are found with a first-byte filter and a longest-first check;
//! - NFC runs only where `tokenizers`' own normalisation tables say a piece may change,
//!   and then through `tokenizers` itself;
//! - the regex is a hand-written scanner (`pretokenize.rs`) whose character classes
//!   (`\p{L}`, `\p{N}`, `\s`) are read from the Oniguruma build `tokenizers` uses, a
//!   256-character block at a time, so they agree with it by construction;
//! - words merge as `tokenizers`' `Word::merge_all` merges them (the lowest rank, then
//!   the leftmost), with a per-thread cache of words already merged.
//!
//! [`FastBpe::build`] accepts only tokenizers of exactly this shape; any other keeps the
//! `tokenizers` path. The integration tests compare both paths on every character and on
//! generated text.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use serde_json::value::RawValue;
use tokenizers::{AddedToken, Model as _, NormalizedString};
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized};

mod pretokenize;

use pretokenize::Classes;

/// Qwen2's pre-tokenizer pattern, the one this encoder implements.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Words longer than this (in bytes) are merged without the cache.
const CACHED_WORD: usize = 64;
/// The per-thread cache is emptied when it holds this many words.
const CACHE_WORDS: usize = 1 << 15;

/// Words merge through a heap beyond this many symbols (a scan below it).
const SCAN_SYMBOLS: usize = 24;

/// The parts of `tokenizer.json` that decide whether the fast path applies.
#[derive(Deserialize)]
struct File<'a> {
    #[serde(borrow, default)]
    truncation: Option<&'a RawValue>,
    #[serde(borrow, default)]
    padding: Option<&'a RawValue>,
    #[serde(default)]
    normalizer: Option<serde_json::Value>,
    #[serde(default)]
    pre_tokenizer: Option<serde_json::Value>,
    #[serde(borrow)]
    model: Model<'a>,
}

#[derive(Deserialize)]
struct Model<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(borrow)]
    merges: Vec<Merge<'a>>,
}

/// A merge, as `"a b"` or `["a", "b"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Merge<'a> {
    Joined(#[serde(borrow)] std::borrow::Cow<'a, str>),
    Pair(
        #[serde(borrow)] std::borrow::Cow<'a, str>,
        #[serde(borrow)] std::borrow::Cow<'a, str>,
    ),
}

/// The pair `(left, right)` as one key.
fn pair(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Words already merged (their bytes and ids), and the encoder that merged them.
type WordCache = (u64, foldhash::HashMap<Box<[u8]>, Box<[u32]>>);

thread_local! {
    static WORDS: RefCell<WordCache> = RefCell::new((0, foldhash::HashMap::default()));
}

/// An added token the text is split at.
#[derive(Debug)]
struct Added {
    content: Box<[u8]>,
    id: u32,
}

/// The fast encoder of one tokenizer.
pub(crate) struct FastBpe {
    id: u64,
    /// The id of each byte's one-character token.
    byte_ids: [u32; 256],
    /// `(left, right)` → `(rank << 32) | merged id`.
    merges: foldhash::HashMap<u64, u64>,
    /// Added tokens by their first byte, longest first.
    added: Vec<Vec<Added>>,
    /// Which bytes start an added token.
    added_first: [bool; 256],
    classes: Classes,
}

impl std::fmt::Debug for FastBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastBpe")
            .field("merges", &self.merges.len())
            .finish_non_exhaustive()
    }
}

impl FastBpe {
    /// The encoder of the tokenizer read from `json` (its `tokenizer.json`), whose added
    /// tokens (with those of `tokenizer_config.json`) are `added`; `None` when the
    /// tokenizer is not of the shape this encoder reproduces.
    pub(crate) fn build(
        json: &[u8],
        loaded: &tokenizers::Tokenizer,
        added: &[(u32, AddedToken)],
    ) -> Option<FastBpe> {
        let file: File<'_> = serde_json::from_slice(json).ok()?;
        let null = |v: Option<&RawValue>| v.is_none_or(|v| v.get() == "null");
        if !null(file.truncation) || !null(file.padding) {
            return None;
        }
        match &file.normalizer {
            None | Some(serde_json::Value::Null) => {}
            Some(v) if *v == serde_json::json!({"type": "NFC"}) => {}
            Some(_) => return None,
        }
        let pre = file.pre_tokenizer.as_ref()?;
        let steps = pre.get("pretokenizers")?.as_array()?;
        let split_ok = steps.len() == 2
            && pre["type"] == "Sequence"
            && steps[0]["type"] == "Split"
            && steps[0]["pattern"]["Regex"] == QWEN2_PATTERN
            && steps[0]["behavior"] == "Isolated"
            && steps[0]["invert"] == false
            && steps[1]["type"] == "ByteLevel"
            && steps[1]["add_prefix_space"] == false
            && steps[1]["use_regex"] == false;
        if !split_ok {
            return None;
        }
        let m = &file.model;
        if m.kind.as_deref().is_some_and(|k| k != "BPE")
            || m.dropout.is_some_and(|d| d != 0.0)
            || m.unk_token.is_some()
            || m.continuing_subword_prefix
                .as_deref()
                .is_some_and(|p| !p.is_empty())
            || m.end_of_word_suffix
                .as_deref()
                .is_some_and(|s| !s.is_empty())
            || m.byte_fallback
            || m.ignore_merges
        {
            return None;
        }
        // The model's own vocabulary (not the added tokens), as its merges read it.
        let model = loaded.get_model();
        let vocab = |token: &str| model.token_to_id(token);
        let alphabet = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (b, c) in alphabet.iter().enumerate() {
            let mut buf = [0u8; 4];
            byte_ids[b] = vocab(c.encode_utf8(&mut buf))?;
        }
        let mut merges = foldhash::HashMap::default();
        merges.reserve(m.merges.len());
        let mut merged = String::new();
        for (rank, merge) in m.merges.iter().enumerate() {
            let (a, b) = match merge {
                Merge::Joined(s) => s.split_once(' ')?,
                Merge::Pair(a, b) => (a.as_ref(), b.as_ref()),
            };
            merged.clear();
            merged.push_str(a);
            merged.push_str(b);
            let (a, b, new) = (vocab(a)?, vocab(b)?, vocab(&merged)?);
            merges.insert(
                pair(a, b),
                (u64::try_from(rank).ok()? << 32) | u64::from(new),
            );
        }
        let mut by_first: Vec<Vec<Added>> = (0..256).map(|_| Vec::new()).collect();
        let mut added_first = [false; 256];
        for (id, t) in added {
            if t.single_word || t.lstrip || t.rstrip || t.normalized || t.content.is_empty() {
                return None;
            }
            let first = t.content.as_bytes()[0];
            added_first[first as usize] = true;
            by_first[first as usize].push(Added {
                content: t.content.as_bytes().into(),
                id: *id,
            });
        }
        for list in &mut by_first {
            // Longest first; between equal lengths the earlier-declared wins, as in the
            // Aho-Corasick automaton `tokenizers` builds.
            list.sort_by_key(|t| std::cmp::Reverse(t.content.len()));
        }
        Some(FastBpe {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            byte_ids,
            merges,
            added: by_first,
            added_first,
            classes: Classes::new()?,
        })
    }

    /// The bytes its tables hold (the merges, the added tokens, the character classes
    /// read so far), not counting the per-thread word caches.
    pub(crate) fn table_bytes(&self) -> usize {
        let merges = self.merges.capacity() * (2 * std::mem::size_of::<u64>() + 1);
        let added: usize = self
            .added
            .iter()
            .map(|l| {
                l.len() * std::mem::size_of::<Added>()
                    + l.iter().map(|a| a.content.len()).sum::<usize>()
            })
            .sum();
        merges + added + self.classes.table_bytes()
    }

    /// Appends the ids of `text` to `out`.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            if self.added_first[bytes[i] as usize] {
                if let Some(t) = self.added[bytes[i] as usize]
                    .iter()
                    .find(|t| bytes[i..].starts_with(&t.content))
                {
                    self.encode_piece(&text[start..i], out);
                    out.push(t.id);
                    i += t.content.len();
                    start = i;
                    continue;
                }
            }
            i += 1;
        }
        self.encode_piece(&text[start..], out);
    }

    /// A piece between added tokens: normalised, cut into words, each merged.
    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        let normalized;
        let piece = if piece.is_ascii() || is_nfc_quick(piece.chars()) == IsNormalized::Yes {
            piece
        } else {
            let mut n = NormalizedString::from(piece);
            n.nfc();
            normalized = n.get().to_owned();
            normalized.as_str()
        };
        WORDS.with(|cache| {
            let mut cache = cache.borrow_mut();
            let (owner, words) = &mut *cache;
            if *owner != self.id {
                words.clear();
                *owner = self.id;
            }
            self.classes.split(piece, |word| {
                let w = word.as_bytes();
                if w.len() > CACHED_WORD {
                    self.merge(w, out);
                    return;
                }
                if let Some(ids) = words.get(w) {
                    out.extend_from_slice(ids);
                    return;
                }
                let at = out.len();
                self.merge(w, out);
                if words.len() >= CACHE_WORDS {
                    words.clear();
                }
                words.insert(w.into(), out[at..].into());
            });
        });
    }

    fn rank(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.merges
            .get(&pair(a, b))
            .map(|v| ((v >> 32) as u32, *v as u32))
    }

    /// BPE-merges one word's bytes and appends its ids.
    fn merge(&self, word: &[u8], out: &mut Vec<u32>) {
        if word.len() == 1 {
            out.push(self.byte_ids[word[0] as usize]);
            return;
        }
        let mut symbols: Vec<u32> = word.iter().map(|b| self.byte_ids[*b as usize]).collect();
        if symbols.len() > SCAN_SYMBOLS {
            self.merge_heap(&mut symbols);
            out.extend_from_slice(&symbols);
            return;
        }
        loop {
            // The lowest rank among adjacent pairs, the leftmost of equals.
            let mut best: Option<(u32, usize, u32)> = None;
            for k in 0..symbols.len().saturating_sub(1) {
                if let Some((rank, new)) = self.rank(symbols[k], symbols[k + 1]) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, k, new));
                    }
                }
            }
            let Some((_, k, new)) = best else { break };
            symbols[k] = new;
            symbols.remove(k + 1);
        }
        out.extend_from_slice(&symbols);
    }

    /// `tokenizers`' `Word::merge_all`: a heap of candidate merges ordered by rank then
    /// position, stale ones skipped; for long words.
    fn merge_heap(&self, symbols: &mut Vec<u32>) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let n = symbols.len();
        let mut prev: Vec<isize> = (0..n as isize).map(|i| i - 1).collect();
        let mut next: Vec<isize> = (1..=n as isize)
            .map(|i| if i == n as isize { -1 } else { i })
            .collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        for k in 0..n - 1 {
            if let Some((rank, new)) = self.rank(symbols[k], symbols[k + 1]) {
                heap.push(Reverse((rank, k, new)));
            }
        }
        while let Some(Reverse((_, pos, new))) = heap.pop() {
            if !alive[pos] || next[pos] < 0 {
                continue;
            }
            let right = next[pos] as usize;
            match self.rank(symbols[pos], symbols[right]) {
                Some((_, id)) if id == new => {}
                _ => continue,
            }
            symbols[pos] = new;
            alive[right] = false;
            next[pos] = next[right];
            if next[right] >= 0 {
                prev[next[right] as usize] = pos as isize;
            }
            if prev[pos] >= 0 {
                let p = prev[pos] as usize;
                if let Some((rank, id)) = self.rank(symbols[p], symbols[pos]) {
                    heap.push(Reverse((rank, p, id)));
                }
            }
            if next[pos] >= 0 {
                let q = next[pos] as usize;
                if let Some((rank, id)) = self.rank(symbols[pos], symbols[q]) {
                    heap.push(Reverse((rank, pos, id)));
                }
            }
        }
        let mut k = 0;
        symbols.retain(|_| {
            let keep = alive[k];
            k += 1;
            keep
        });
    }
}

/// GPT-2's byte alphabet: the character each byte is written as.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        let c = if printable {
            u32::from(b)
        } else {
            shifted += 1;
            255 + shifted
        };
        out[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    out
}
