//! Qwen3's chat format, id for id as renderers 0.1.12's `Qwen3Renderer` writes and reads
//! it (the reference verifiers' train client trains with).
//!
//! - `render.rs`: full renders and the bridge to the next turn;
//! - `scan.rs`: where the initial reasoning region of a completion (or the end of a
//!   prompt) starts and ends;
//! - `parse.rs`: a completion read back (content, reasoning, tool calls);
//! - `stream.rs`: the same, incrementally.

use std::sync::Arc;

use crate::message::{ChatMessage, ToolSpec};
use crate::render::{
    Decline, Extension, ParsedResponse, RenderError, Rendered, Renderer, RendererError,
    RendererOptions, StreamParser, ThinkingRetention,
};
use crate::Tokenizer;

mod parse;
mod render;
mod scan;
mod stream;

/// The format's special ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    pub(crate) im_start: u32,
    pub(crate) im_end: u32,
    pub(crate) endoftext: u32,
    pub(crate) tool_call: u32,
    pub(crate) tool_call_end: u32,
    pub(crate) tool_response: u32,
    pub(crate) tool_response_end: u32,
    pub(crate) think: u32,
    pub(crate) think_end: u32,
}

impl Ids {
    pub(crate) fn is_stop(&self, id: u32) -> bool {
        id == self.im_end || id == self.endoftext
    }
}

/// Fixed texts, encoded once.
#[derive(Debug)]
struct Encoded {
    /// `"\n"`
    newline: Vec<u32>,
    /// `"assistant\n"`
    assistant: Vec<u32>,
    /// `"user"`
    user: Vec<u32>,
    /// `"<think>\n\n</think>\n\n"`, the generation prompt's end without thinking.
    empty_think: Vec<u32>,
    /// `"<|im_start|>assistant\n"`, the header a completion or prompt tail may start with.
    header: Vec<u32>,
}

/// Qwen3's renderer: renderers 0.1.12's `Qwen3Renderer` with `Qwen3RendererConfig`.
#[derive(Debug)]
pub struct Qwen3Renderer {
    tok: Arc<Tokenizer>,
    ids: Ids,
    stop: [u32; 2],
    enable_thinking: bool,
    retention: ThinkingRetention,
    enc: Encoded,
}

const NAME: &str = "qwen3";

impl Qwen3Renderer {
    /// A renderer over Qwen3's tokenizer. Fails if the tokenizer lacks one of the
    /// format's special tokens (the error names it) or does not decode byte-level.
    pub fn new(tokenizer: Arc<Tokenizer>, options: RendererOptions) -> Result<Self, RendererError> {
        let id = |token: &'static str| {
            tokenizer
                .token_id(token)
                .ok_or_else(|| RendererError::MissingToken {
                    renderer: NAME,
                    token,
                    path: tokenizer.path().display().to_string(),
                })
        };
        let ids = Ids {
            im_start: id("<|im_start|>")?,
            im_end: id("<|im_end|>")?,
            endoftext: id("<|endoftext|>")?,
            tool_call: id("<tool_call>")?,
            tool_call_end: id("</tool_call>")?,
            tool_response: id("<tool_response>")?,
            tool_response_end: id("</tool_response>")?,
            think: id("<think>")?,
            think_end: id("</think>")?,
        };
        if !tokenizer.is_byte_level() {
            return Err(RendererError::NotByteLevel {
                renderer: NAME,
                path: tokenizer.path().display().to_string(),
            });
        }
        let enable_thinking = options.enable_thinking.unwrap_or(true);
        let retention = options.thinking_retention.unwrap_or(if enable_thinking {
            ThinkingRetention::ToolCycle
        } else {
            ThinkingRetention::All
        });
        let enc = Encoded {
            newline: tokenizer.encode("\n"),
            assistant: tokenizer.encode("assistant\n"),
            user: tokenizer.encode("user"),
            empty_think: tokenizer.encode("<think>\n\n</think>\n\n"),
            header: tokenizer.encode("<|im_start|>assistant\n"),
        };
        Ok(Qwen3Renderer {
            stop: [ids.im_end, ids.endoftext],
            tok: tokenizer,
            ids,
            enable_thinking,
            retention,
            enc,
        })
    }

    /// Whether thinking is on.
    pub fn enable_thinking(&self) -> bool {
        self.enable_thinking
    }

    /// The bridge's retention, resolved.
    pub fn thinking_retention(&self) -> ThinkingRetention {
        self.retention
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    /// Whether renderers' `prompt_ends_in_reasoning` holds for `prompt_ids`: the prompt's
    /// last assistant opening leaves a `<think>` open, so the completion starts inside
    /// the reasoning.
    pub fn prompt_ends_in_reasoning(&self, prompt_ids: &[u32]) -> bool {
        scan::prompt_ends_in_reasoning(self.scanner(), prompt_ids)
    }

    fn scanner(&self) -> scan::Scanner<'_> {
        scan::Scanner {
            tok: &self.tok,
            ids: &self.ids,
            header: &self.enc.header,
        }
    }
}

impl Renderer for Qwen3Renderer {
    fn name(&self) -> &'static str {
        NAME
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        add_generation_prompt: bool,
    ) -> Result<Rendered, RenderError> {
        render::render(self, messages, tools, add_generation_prompt)
    }

    fn extend(
        &self,
        previous_prompt_ids: &[u32],
        previous_completion_ids: &[u32],
        new_messages: &[ChatMessage],
        _tools: &[ToolSpec],
    ) -> Result<Extension, Decline> {
        render::extend(
            self,
            previous_prompt_ids,
            previous_completion_ids,
            new_messages,
        )
    }

    fn parse(&self, completion_ids: &[u32], prompt_ids: &[u32]) -> ParsedResponse {
        let prefilled = self.prompt_ends_in_reasoning(prompt_ids);
        parse::parse(self.scanner(), completion_ids, prefilled)
    }

    fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    fn stream(&self, prompt_ids: &[u32]) -> Box<dyn StreamParser> {
        let prefilled = self.prompt_ends_in_reasoning(prompt_ids);
        Box::new(stream::Qwen3Stream::new(
            self.tok.clone(),
            self.ids,
            self.enc.header.clone(),
            prefilled,
        ))
    }
}
