//! Which wire format a call spoke ([`DialectKind`]): a leaf of the crate, so that a
//! record can name its dialect without depending on the dialects themselves.

use serde::{Deserialize, Serialize};

/// Which wire format a call spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DialectKind {
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    ChatCompletions,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
    /// Anthropic Messages (`/v1/messages`).
    Messages,
    /// Legacy OpenAI Completions (`/v1/completions`).
    Completions,
}

impl DialectKind {
    /// The snake_case name used in records and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DialectKind::ChatCompletions => "chat_completions",
            DialectKind::Responses => "responses",
            DialectKind::Messages => "messages",
            DialectKind::Completions => "completions",
        }
    }
}
