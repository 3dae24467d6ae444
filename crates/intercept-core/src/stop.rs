//! Why a rollout stopped ([`StopReason`]): a leaf of the crate, so that [`Error`](crate::Error)
//! can say it without depending on the rest of a rollout's data.

use std::fmt;

/// Why a rollout stopped. Its text ([`StopReason::as_str`]) is what traces, records, the
/// control API and the harness's `rollout stopped: <reason>` show.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// A limit of [`Limits`](crate::Limits) was reached (`max_turns`, `max_input_tokens`,
    /// `max_output_tokens`, `max_total_tokens`).
    Limit(&'static str),
    /// The upstream said the prompt exceeds the model's context (`context_length`).
    ContextLength,
    /// A request, response or tool hook stopped the rollout with this condition.
    Hook(String),
    /// The session's owner stopped it ([`RolloutSession::stop`](crate::RolloutSession::stop)) with this
    /// condition.
    Custom(String),
}

impl StopReason {
    /// The condition's name.
    pub fn as_str(&self) -> &str {
        match self {
            StopReason::Limit(name) => name,
            StopReason::ContextLength => "context_length",
            StopReason::Hook(name) | StopReason::Custom(name) => name,
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
