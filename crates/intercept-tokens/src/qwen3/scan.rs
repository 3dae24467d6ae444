//! The initial reasoning region (renderers' `reasoning.scan_reasoning` with atomic
//! `<think>`/`</think>` ids, and `prompt_ends_in_reasoning`).

use std::ops::Range;

use super::Ids;
use crate::decode::TextDecoder;
use crate::pycompat::text;
use crate::Tokenizer;

/// What a scan needs of the renderer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scanner<'r> {
    pub(crate) tok: &'r Tokenizer,
    pub(crate) ids: &'r Ids,
    pub(crate) header: &'r [u32],
}

/// Where the initial reasoning region of a completion lies. Positions are indices into
/// the ids the scan was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Boundary {
    /// No region was opened (no `<think>` after leading whitespace, no prefill).
    None,
    /// A region: its ids (`<think>` ids inside it are not part of its text), and how it
    /// ended.
    Region { ids: Range<usize>, end: RegionEnd },
}

/// How a reasoning region ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionEnd {
    /// At this `</think>`.
    Close(usize),
    /// At this `<tool_call>`, with no `</think>` anywhere after the region's start.
    Tool(usize),
    /// Not at all: the ids end inside it.
    Open,
}

impl Boundary {
    pub(crate) fn is_open(&self) -> bool {
        matches!(
            self,
            Boundary::Region {
                end: RegionEnd::Open,
                ..
            }
        )
    }
}

/// Whether a token decodes, alone, to newlines only (or to nothing).
pub(crate) fn is_newlines(tok: &Tokenizer, id: u32) -> bool {
    tok.token_bytes(id)
        .is_some_and(|b| b.iter().all(|&c| c == b'\n'))
}

impl Scanner<'_> {
    /// renderers' `_after_header` with `last=False`: past a leading
    /// `<|im_start|>assistant\n` and the newline-only tokens after it. Returns where the
    /// ids start.
    pub(crate) fn after_header(&self, ids: &[u32]) -> usize {
        if self.header.is_empty() || !ids.starts_with(self.header) {
            return 0;
        }
        let mut i = self.header.len();
        while i < ids.len() && is_newlines(self.tok, ids[i]) {
            i += 1;
        }
        i
    }

    /// renderers' `_after_header` with `last=True`: past the last
    /// `<|im_start|>assistant\n` in the ids and the newline-only tokens after it.
    fn after_last_header(&self, ids: &[u32]) -> usize {
        let n = self.header.len();
        if n == 0 || ids.len() < n {
            return 0;
        }
        for i in (0..=ids.len() - n).rev() {
            if &ids[i..i + n] == self.header {
                let mut j = i + n;
                while j < ids.len() && is_newlines(self.tok, ids[j]) {
                    j += 1;
                }
                return j;
            }
        }
        0
    }

    /// The position of the first `<think>` of `ids` if nothing but whitespace comes
    /// before it (renderers' "explicit" opening), reading no further than needed.
    pub(crate) fn explicit_opening(&self, ids: &[u32]) -> Option<usize> {
        let mut dec = TextDecoder::new();
        let mut buf = String::new();
        for (i, &id) in ids.iter().enumerate() {
            if id == self.ids.think {
                return (!dec.has_pending()).then_some(i);
            }
            buf.clear();
            dec.push_id(self.tok, id, &mut buf);
            if !text::is_blank(&buf) {
                return None;
            }
        }
        None
    }

    /// `scan_reasoning(ids, prefilled=..., tool_start_closes_reasoning=...)` with atomic
    /// markers, the ids cut at the first stop id.
    pub(crate) fn initial(&self, ids: &[u32], prefilled: bool, tool_closes: bool) -> Boundary {
        let end = ids
            .iter()
            .position(|&t| self.ids.is_stop(t))
            .unwrap_or(ids.len());
        let ids = &ids[..end];
        let h = self.after_header(ids);
        let body = &ids[h..];
        let start = match self.explicit_opening(body) {
            Some(opening) => opening + 1,
            None if prefilled => 0,
            None => return Boundary::None,
        };
        let find = |target: u32| {
            body[start..]
                .iter()
                .position(|&t| t == target)
                .map(|p| start + p)
        };
        let region_end = match find(self.ids.think_end) {
            Some(close) => RegionEnd::Close(h + close),
            None => match tool_closes.then(|| find(self.ids.tool_call)).flatten() {
                Some(tool) => RegionEnd::Tool(h + tool),
                None => RegionEnd::Open,
            },
        };
        let stop = match region_end {
            RegionEnd::Close(p) | RegionEnd::Tool(p) => p,
            RegionEnd::Open => ids.len(),
        };
        Boundary::Region {
            ids: h + start..stop,
            end: region_end,
        }
    }

    /// The text of a region: its ids but the `<think>` ids, decoded.
    pub(crate) fn region_text(&self, ids: &[u32]) -> String {
        let think = self.ids.think;
        if !ids.contains(&think) {
            return self.tok.decode(ids);
        }
        let kept: Vec<u32> = ids.iter().copied().filter(|&t| t != think).collect();
        self.tok.decode(&kept)
    }
}

/// renderers' `prompt_ends_in_reasoning`: after the prompt's last stop id and its last
/// assistant header, a `<think>` is left open (or the prompt ends inside a region).
pub(crate) fn prompt_ends_in_reasoning(sc: Scanner<'_>, prompt_ids: &[u32]) -> bool {
    if prompt_ids.is_empty() {
        return false;
    }
    let start = prompt_ids
        .iter()
        .rposition(|&t| sc.ids.is_stop(t))
        .map_or(0, |i| i + 1);
    let tail = &prompt_ids[start..];
    let tail = &tail[sc.after_last_header(tail)..];
    // The scan itself cuts at no stop id here (there is none left) and is not prefilled.
    sc.initial(tail, false, false).is_open()
}
