//! Token-in/token-out for intercept: the exact token ids of a conversation, rendered once
//! and extended turn by turn, never re-tokenized.
//!
//! - [`Tokenizer`] and [`shared`]: a Hugging Face tokenizer from its files, loaded once per
//!   process.
//!
//! The crate has no HTTP and no runtime: a Rust trainer can use it alone.

mod tokenizer;

pub use tokenizer::{shared, Tokenizer, TokenizerError};
