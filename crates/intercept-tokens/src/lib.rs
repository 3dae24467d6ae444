//! Token-in/token-out for intercept: the exact token ids of a conversation, rendered once
//! and extended turn by turn, never re-tokenized.
//!
//! - [`Tokenizer`] and [`shared`]: a Hugging Face tokenizer from its files, loaded once per
//!   process; [`TextDecoder`] decodes its ids as they arrive.
//! - [`ChatMessage`] and [`ToolSpec`]: a conversation and its tools, read from Chat
//!   Completions JSON with their key order kept.
//! - [`Renderer`] and [`renderer`]: a model family's chat format in ids: full renders,
//!   [`Renderer::bridge`] (the next turn's prompt from the previous prompt and completion
//!   ids plus the new messages, or the [`Decline`] that says why not; [`Renderer::extend`]
//!   gives the same as the ids to append, copying nothing of the context),
//!   [`Renderer::parse`] and [`Renderer::stream`] (a completion read back as content,
//!   reasoning and tool calls), the stop ids. [`Qwen3Renderer`] is renderers 0.1.12's
//!   `Qwen3Renderer` id for id, the reference verifiers' train client trains with;
//!   [`is_incremental_tail`] says which tails that client tries to bridge at all.
//!
//! For byte-level BPE tokenizers of Qwen2's shape (Qwen3's among them) [`Tokenizer::encode`]
//! runs the crate's own encoder, which gives the Hugging Face pipeline's ids many times
//! faster; any other tokenizer goes through that pipeline.
//!
//! The crate has no HTTP and no runtime: a Rust trainer can use it alone.
//!
//! ```
//! use intercept_tokens::{renderer, shared, ChatMessage, Renderer, RendererOptions, ToolSpec};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A folder with Qwen3's tokenizer.json and tokenizer_config.json.
//! let Ok(folder) = std::env::var("INTERCEPT_QWEN3_TOKENIZER") else {
//!     return Ok(()); // (the example needs the tokenizer's files)
//! };
//! let tokenizer = shared(folder)?;
//! let qwen3 = renderer("qwen3", tokenizer.clone(), &RendererOptions::default())?;
//!
//! let messages = ChatMessage::parse_array(
//!     r#"[{"role": "system", "content": "You are helpful."},
//!         {"role": "user", "content": "Weather in Paris?"}]"#,
//! )?;
//! let tools = ToolSpec::parse_array(
//!     r#"[{"type": "function", "function": {"name": "get_weather",
//!          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]"#,
//! )?;
//! let prompt = qwen3.render(&messages, &tools, true)?;
//!
//! // The engine samples; here, a completion written by hand.
//! let completion = tokenizer.encode(
//!     "<think>\nI should call the tool.\n</think>\n\n<tool_call>\n\
//!      {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
//! );
//! let parsed = qwen3.parse(&completion, &prompt.token_ids);
//! assert_eq!(parsed.tool_calls[0].name.as_deref(), Some("get_weather"));
//!
//! // The next turn: the previous ids as they are, plus the tool's result.
//! let next = qwen3.bridge(
//!     &prompt.token_ids,
//!     &completion,
//!     &[ChatMessage::tool("call_0", "Sunny, 21 °C")],
//!     &tools,
//! )?;
//! assert!(next.token_ids.starts_with(&prompt.token_ids));
//! # Ok(())
//! # }
//! ```

mod bpe;
mod decode;
mod factory;
mod message;
mod pycompat;
mod qwen3;
mod render;
mod tokenizer;

pub use decode::TextDecoder;
pub use factory::{renderer, RENDERERS};
pub use message::{
    json_dumps, ChatMessage, Content, ContentPart, MessageError, Role, ToolCallIn, ToolSpec,
};
pub use qwen3::Qwen3Renderer;
pub use render::{
    is_incremental_tail, Decline, Extension, ParsedResponse, ParsedToolCall, RenderError, Rendered,
    Renderer, RendererError, RendererOptions, StreamEvent, StreamParser, ThinkingRetention,
    ToolCallStatus,
};
pub use tokenizer::{shared, Tokenizer, TokenizerError};
