//! A Qwen3 completion parsed as its ids arrive, with the rules of `parse.rs`.
//!
//! Text comes out as soon as it is certain: the parser holds back only a character split
//! across ids, whitespace that may turn out to end a stripped text, the few ids that may
//! still be the `<|im_start|>assistant\n` header, and (rare) ids after a `<tool_call>`
//! inside a reasoning region that no `</think>` has closed yet, which are reasoning if a
//! `</think>` follows and tool calls if none does.

use std::sync::Arc;

use super::parse;
use super::scan::{is_newlines, Scanner};
use super::Ids;
use crate::decode::TextDecoder;
use crate::pycompat::text;
use crate::render::{StreamEvent, StreamParser};
use crate::Tokenizer;

/// The events of one push, consecutive texts of a kind merged.
#[derive(Default)]
struct Events(Vec<StreamEvent>);

impl Events {
    fn reasoning(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(StreamEvent::Reasoning(r)) => r.push_str(s),
            _ => self.0.push(StreamEvent::Reasoning(s.to_owned())),
        }
    }

    fn content(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(StreamEvent::Content(c)) => c.push_str(s),
            _ => self.0.push(StreamEvent::Content(s.to_owned())),
        }
    }
}

/// Python's `strip()` applied to a text that arrives in pieces: leading whitespace is
/// dropped, trailing whitespace held until more text follows it.
#[derive(Debug, Default)]
struct Strip {
    started: bool,
    held: String,
}

impl Strip {
    fn push(&mut self, piece: &str, out: &mut String) {
        let mut piece = piece;
        if !self.started {
            piece = text::lstrip(piece);
            if piece.is_empty() {
                return;
            }
            self.started = true;
        }
        let body = piece.trim_end_matches(text::is_space).len();
        if body == 0 {
            self.held.push_str(piece);
            return;
        }
        out.push_str(&self.held);
        self.held.clear();
        out.push_str(&piece[..body]);
        self.held.push_str(&piece[body..]);
    }
}

/// A stripped text decoded from ids.
#[derive(Debug, Default)]
struct Channel {
    dec: TextDecoder,
    strip: Strip,
    buf: String,
}

impl Channel {
    fn push_id(&mut self, tok: &Tokenizer, id: u32, out: &mut String) {
        self.buf.clear();
        self.dec.push_id(tok, id, &mut self.buf);
        let buf = std::mem::take(&mut self.buf);
        self.strip.push(&buf, out);
        self.buf = buf;
    }

    fn push_text(&mut self, s: &str, out: &mut String) {
        self.strip.push(s, out);
    }

    /// Ends the text: an unfinished character comes out as U+FFFD; trailing whitespace
    /// is dropped (`strip`) or kept.
    fn end(&mut self, keep_trailing: bool, out: &mut String) {
        self.buf.clear();
        self.dec.finish(&mut self.buf);
        let buf = std::mem::take(&mut self.buf);
        self.strip.push(&buf, out);
        if keep_trailing {
            out.push_str(&self.strip.held);
        }
        self.strip.held.clear();
    }
}

/// The region's text with its `<think>` ids, searched for the first `</think>` written
/// as text: the content starts after it (renderers partition the decoded text there).
#[derive(Debug, Default)]
struct FullText {
    dec: TextDecoder,
    /// The last bytes of the text, which may begin a `</think>`.
    tail: String,
    /// The text after the first `</think>`, once one was written.
    after: Option<String>,
    buf: String,
}

const CLOSE: &str = "</think>";

impl FullText {
    fn push_id(&mut self, tok: &Tokenizer, id: u32) {
        self.buf.clear();
        self.dec.push_id(tok, id, &mut self.buf);
        let buf = std::mem::take(&mut self.buf);
        self.push_text(&buf);
        self.buf = buf;
    }

    fn push_text(&mut self, s: &str) {
        if let Some(after) = &mut self.after {
            after.push_str(s);
            return;
        }
        self.tail.push_str(s);
        if let Some(p) = self.tail.find(CLOSE) {
            self.after = Some(self.tail[p + CLOSE.len()..].to_owned());
            self.tail.clear();
            return;
        }
        let mut cut = self.tail.len().saturating_sub(CLOSE.len() - 1);
        while !self.tail.is_char_boundary(cut) {
            cut += 1;
        }
        self.tail.drain(..cut);
    }

    /// The text after the first written `</think>`, if there was one.
    fn finish(&mut self) -> Option<String> {
        self.buf.clear();
        self.dec.finish(&mut self.buf);
        let buf = std::mem::take(&mut self.buf);
        self.push_text(&buf);
        self.after.take()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the start is known: the header, then blank ids up to a `<think>`.
    Start,
    /// Inside the initial reasoning region.
    Reasoning,
    /// The region met a `<tool_call>` here and no `</think>` yet.
    ToolOrReasoning(usize),
    /// The answer, up to the first `<tool_call>`.
    Content,
    /// Tool-call blocks; one is open from here.
    Tools(Option<usize>),
    /// The completion ended.
    Done,
}

/// renderers' `parse_qwen3`, incrementally.
#[derive(Debug)]
pub(super) struct Qwen3Stream {
    tok: Arc<Tokenizer>,
    ids: Ids,
    header: Vec<u32>,
    prefilled: bool,
    /// The completion's ids so far, up to its first stop id.
    seen: Vec<u32>,
    /// The next id of `seen` to read.
    pos: usize,
    state: State,
    /// Where the ids after the header start (once known).
    body: Option<usize>,
    /// Whether the ids since `body` decode to whitespace only.
    blank: TextDecoder,
    blank_buf: String,
    reasoning: Channel,
    content: Channel,
    full: FullText,
    out: String,
}

impl Qwen3Stream {
    pub(super) fn new(tok: Arc<Tokenizer>, ids: Ids, header: Vec<u32>, prefilled: bool) -> Self {
        Qwen3Stream {
            tok,
            ids,
            header,
            prefilled,
            seen: Vec::new(),
            pos: 0,
            state: State::Start,
            body: None,
            blank: TextDecoder::new(),
            blank_buf: String::new(),
            reasoning: Channel::default(),
            content: Channel::default(),
            full: FullText::default(),
            out: String::new(),
        }
    }

    fn scanner(&self) -> Scanner<'_> {
        Scanner {
            tok: &self.tok,
            ids: &self.ids,
            header: &self.header,
        }
    }

    /// Where the body starts, once the header question is settled (`at_end`: no more
    /// ids will come).
    fn body_start(&mut self, at_end: bool) -> Option<usize> {
        if self.body.is_none() {
            let n = self.header.len();
            if n > 0 && self.seen.len() < n && self.header.starts_with(&self.seen) && !at_end {
                return None;
            }
            self.body = Some(if n > 0 && self.seen.starts_with(&self.header) {
                n
            } else {
                0
            });
        }
        self.body
    }

    /// The start of a region that a prefill opened: past the header and the newline ids
    /// after it.
    fn prefilled_start(&self) -> usize {
        let body = self.body.unwrap_or(0);
        if body == 0 {
            return 0;
        }
        let mut i = body;
        while i < self.seen.len() && is_newlines(&self.tok, self.seen[i]) {
            i += 1;
        }
        i
    }

    /// No `<think>` opens the completion: a prefilled region starts at the body, else
    /// everything is content.
    fn not_explicit(&mut self) {
        if self.prefilled {
            self.pos = self.prefilled_start();
            self.state = State::Reasoning;
        } else {
            self.pos = 0;
            self.state = State::Content;
        }
    }

    fn feed_region(&mut self, id: u32, ev: &mut Events) {
        if id != self.ids.think {
            self.out.clear();
            self.reasoning.push_id(&self.tok, id, &mut self.out);
            ev.reasoning(&self.out);
        }
        self.full.push_id(&self.tok, id);
    }

    /// The region closed at a `</think>`: the content starts after the first written
    /// `</think>`.
    fn close_region(&mut self, ev: &mut Events) {
        self.out.clear();
        self.reasoning.end(false, &mut self.out);
        ev.reasoning(&self.out);
        if let Some(mut after) = self.full.finish() {
            after.push_str(CLOSE);
            self.out.clear();
            self.content.push_text(&after, &mut self.out);
            ev.content(&self.out);
        }
        self.state = State::Content;
    }

    fn end_content(&mut self, ev: &mut Events) {
        self.out.clear();
        self.content.end(false, &mut self.out);
        ev.content(&self.out);
    }

    /// Reads the ids it can.
    fn advance(&mut self, ev: &mut Events, at_end: bool) {
        while self.pos < self.seen.len() {
            let id = self.seen[self.pos];
            match self.state {
                State::Start => {
                    let Some(body) = self.body_start(at_end) else {
                        return;
                    };
                    if self.pos < body {
                        self.pos = body;
                        continue;
                    }
                    if id == self.ids.think {
                        if self.blank.has_pending() {
                            self.not_explicit();
                        } else {
                            self.pos += 1;
                            self.state = State::Reasoning;
                        }
                        continue;
                    }
                    self.blank_buf.clear();
                    self.blank.push_id(&self.tok, id, &mut self.blank_buf);
                    if text::is_blank(&self.blank_buf) {
                        self.pos += 1;
                    } else {
                        self.not_explicit();
                    }
                }
                State::Reasoning => {
                    if id == self.ids.think_end {
                        self.close_region(ev);
                    } else if id == self.ids.tool_call {
                        self.state = State::ToolOrReasoning(self.pos);
                    } else {
                        self.feed_region(id, ev);
                    }
                    self.pos += 1;
                }
                State::ToolOrReasoning(tool) => {
                    if id == self.ids.think_end {
                        // An explicit close wins: the tool markup was reasoning.
                        for j in tool..self.pos {
                            let held = self.seen[j];
                            self.feed_region(held, ev);
                        }
                        self.close_region(ev);
                    }
                    self.pos += 1;
                }
                State::Content => {
                    if id == self.ids.tool_call {
                        self.end_content(ev);
                        self.state = State::Tools(Some(self.pos));
                    } else {
                        self.out.clear();
                        self.content.push_id(&self.tok, id, &mut self.out);
                        ev.content(&self.out);
                    }
                    self.pos += 1;
                }
                State::Tools(open) => {
                    match open {
                        None if id == self.ids.tool_call => {
                            self.state = State::Tools(Some(self.pos));
                        }
                        Some(o) if id == self.ids.tool_call_end => {
                            let call = parse::block(
                                self.scanner(),
                                &self.seen[o + 1..self.pos],
                                (o, self.pos + 1),
                            );
                            ev.0.push(StreamEvent::ToolCall(call));
                            self.state = State::Tools(None);
                        }
                        _ => {}
                    }
                    self.pos += 1;
                }
                State::Done => return,
            }
        }
    }

    /// No more ids: settle what was held back.
    fn end(&mut self, ev: &mut Events) {
        self.advance(ev, true);
        if self.state == State::Start {
            self.not_explicit();
            self.advance(ev, true);
        }
        match self.state {
            State::Start | State::Done => {}
            State::Reasoning => {
                // Left open: renderers keep the region's text unstripped.
                self.out.clear();
                self.reasoning.end(true, &mut self.out);
                ev.reasoning(&self.out);
            }
            State::ToolOrReasoning(tool) => {
                // Closed by the tool call: the content is empty, the calls start there.
                self.out.clear();
                self.reasoning.end(false, &mut self.out);
                ev.reasoning(&self.out);
                self.state = State::Tools(None);
                self.pos = tool;
                self.advance(ev, true);
                self.end_tools(ev);
            }
            State::Content => self.end_content(ev),
            State::Tools(_) => self.end_tools(ev),
        }
        self.state = State::Done;
    }

    fn end_tools(&mut self, ev: &mut Events) {
        if let State::Tools(Some(o)) = self.state {
            let call = parse::unclosed(self.scanner(), &self.seen, o);
            ev.0.push(StreamEvent::ToolCall(call));
        }
    }
}

impl StreamParser for Qwen3Stream {
    fn push(&mut self, ids: &[u32]) -> Vec<StreamEvent> {
        let mut ev = Events::default();
        if self.state == State::Done {
            return ev.0;
        }
        match ids.iter().position(|&t| self.ids.is_stop(t)) {
            Some(stop) => {
                self.seen.extend_from_slice(&ids[..stop]);
                self.end(&mut ev);
            }
            None => {
                self.seen.extend_from_slice(ids);
                self.advance(&mut ev, false);
            }
        }
        ev.0
    }

    fn finish(&mut self) -> Vec<StreamEvent> {
        let mut ev = Events::default();
        if self.state != State::Done {
            self.end(&mut ev);
        }
        ev.0
    }
}
