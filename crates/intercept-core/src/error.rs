//! Typed errors shared by every intercept crate.
//!
//! Each [`Error`] maps to exactly one HTTP status ([`Error::status`]), says who is to
//! blame ([`Blame`]) and whether retrying can help ([`Error::retryable`]). Callers match
//! on [`Error::kind`], never on message text.

use serde::{Deserialize, Serialize};

/// Who caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Blame {
    /// The harness sent something wrong, or the rollout refuses further calls.
    Client,
    /// The upstream model server failed or answered with an error.
    Upstream,
    /// The tunnel that exposes the server failed.
    Tunnel,
    /// intercept itself failed.
    Internal,
}

impl Blame {
    /// Lower-case name, as written in the `x-intercept-error` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Blame::Client => "client",
            Blame::Upstream => "upstream",
            Blame::Tunnel => "tunnel",
            Blame::Internal => "internal",
        }
    }
}

/// A stable, machine-readable name for each kind of [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Missing or unknown secret.
    Unauthorized,
    /// The request is malformed or asks for something unsupported.
    InvalidRequest,
    /// The request body exceeds the configured cap.
    PayloadTooLarge,
    /// No such route.
    NotFound,
    /// The route exists but not for this method.
    MethodNotAllowed,
    /// The rollout was released; no further calls are accepted.
    RolloutConcluded,
    /// The rollout stopped (a limit, a hook, a context-length error).
    RolloutStopped,
    /// The upstream answered with an error status.
    UpstreamStatus,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// The upstream could not be reached or dropped the connection.
    UpstreamUnavailable,
    /// The upstream answered with a body that is not what the dialect expects.
    UpstreamMalformed,
    /// The harness went away before the call finished.
    ClientDisconnected,
    /// The call was cancelled (rollout released or server shutting down).
    Cancelled,
    /// A tunnel failed.
    Tunnel,
    /// A conflict with existing state (e.g. a duplicate id).
    Conflict,
    /// Model calls are paused (weight sync): rejected at once, or held past the timeout.
    Paused,
    /// No capacity: a pool is at its cap, or no server came up in time.
    Unavailable,
    /// A session hook (request or response) failed with an error of its own.
    HookFailed,
    /// intercept failed internally.
    Internal,
    /// The client asked to upgrade to a transport the server does not speak (WebSocket).
    UpgradeRequired,
    /// What was asked for existed but is no longer held (a released session's trace).
    Gone,
}

impl ErrorKind {
    /// The snake_case name used in call records and error bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::RolloutConcluded => "rollout_concluded",
            ErrorKind::RolloutStopped => "rollout_stopped",
            ErrorKind::UpstreamStatus => "upstream_status",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
            ErrorKind::UpstreamUnavailable => "upstream_unavailable",
            ErrorKind::UpstreamMalformed => "upstream_malformed",
            ErrorKind::ClientDisconnected => "client_disconnected",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Tunnel => "tunnel",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Paused => "paused",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::HookFailed => "hook_failed",
            ErrorKind::Internal => "internal",
            ErrorKind::UpgradeRequired => "upgrade_required",
            ErrorKind::Gone => "gone",
        }
    }
}

/// Every failure intercept reports.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Missing or unknown secret.
    #[error("unauthorized: send the rollout's model secret as `Authorization: Bearer <secret>`")]
    Unauthorized,
    /// The request is malformed.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request body exceeds the cap.
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The configured cap in bytes.
        limit: u64,
    },
    /// No such route.
    #[error("no route for {method} {path}")]
    NotFound {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
    /// Wrong method for an existing route.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
    /// The rollout was released.
    #[error("rollout concluded")]
    RolloutConcluded,
    /// The rollout stopped, for this reason.
    #[error("rollout stopped: {0}")]
    RolloutStopped(crate::rollout::StopReason),
    /// The upstream answered with an error status; `body` is its text. Built with
    /// [`Error::upstream_status`], which classifies it.
    #[error("upstream {status}: {body}")]
    UpstreamStatus {
        /// The upstream's status code.
        status: u16,
        /// The upstream's error body, as text.
        body: String,
        /// The upstream's `retry-after` header, if any.
        retry_after: Option<String>,
        /// The upstream says the prompt exceeds the model's context
        /// ([`is_context_length_error`] of the status and body, decided when the answer
        /// was read).
        context_length: bool,
    },
    /// The upstream did not answer in time.
    #[error("upstream timed out: {0}")]
    UpstreamTimeout(String),
    /// The upstream could not be reached or dropped the connection.
    #[error("upstream unavailable: {0}")]
    UpstreamUnavailable(String),
    /// The upstream sent a body the dialect cannot read.
    #[error("malformed upstream response: {0}")]
    UpstreamMalformed(String),
    /// The harness disconnected.
    #[error("client disconnected: {0}")]
    ClientDisconnected(String),
    /// The call was cancelled.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A tunnel failed.
    #[error("tunnel failed: {message}")]
    Tunnel {
        /// What happened and what to do.
        message: String,
        /// Whether trying again (or re-minting the tunnel) can help.
        retryable: bool,
    },
    /// A conflict with existing state.
    #[error("{0}")]
    Conflict(String),
    /// What was asked for existed but is no longer held (410); the message says why.
    #[error("{0}")]
    Gone(String),
    /// A session's request or response hook failed (an [`Error::Internal`] it returned);
    /// the call is answered 502, like any failure between the harness and the model.
    /// Hooks that mean a particular answer return that error instead (for example
    /// [`Error::InvalidRequest`] for 400).
    #[error("model boundary hook failed: {0}")]
    HookFailed(String),
    /// intercept failed internally.
    #[error("internal error: {0}")]
    Internal(String),
    /// No capacity to seat a rollout (a pool at its cap, or no server up in time); the
    /// message names the cap and what to change.
    #[error("{0}")]
    Unavailable(String),
    /// The client asked for a WebSocket upgrade; the server speaks HTTP only (426, which
    /// Codex takes as "use HTTP" at once).
    #[error("{path} speaks HTTP, not WebSocket: send the request as `POST {path}`")]
    UpgradeRequired {
        /// The request path.
        path: String,
    },
    /// Model calls are paused while the trainer updates the policy's weights.
    #[error("{}", paused_message(*.held, *.retry_after_secs))]
    Paused {
        /// Seconds the harness should wait before retrying (`Retry-After`).
        retry_after_secs: u64,
        /// Whether the call was held (mode `hold`) until the hold timeout: 503; otherwise
        /// it was rejected at once (mode `reject`): 429.
        held: bool,
    },
}

fn paused_message(held: bool, retry_after: u64) -> String {
    if held {
        format!("model calls are paused for a weight update and the call was held past the pause timeout; retry in {retry_after} s")
    } else {
        format!("model calls are paused for a weight update; retry in {retry_after} s")
    }
}

impl Error {
    /// An [`Error::UpstreamStatus`] for an upstream's error answer, classified from its
    /// status and text as it is read (see [`Error::is_context_length`]).
    pub fn upstream_status(status: u16, body: String, retry_after: Option<String>) -> Self {
        Error::UpstreamStatus {
            context_length: is_context_length_error(status, &body),
            status,
            body,
            retry_after,
        }
    }

    /// Whether the upstream said the prompt exceeds the model's context: such an error
    /// stops the rollout with [`crate::StopReason::ContextLength`] (a clean truncation).
    pub fn is_context_length(&self) -> bool {
        matches!(
            self,
            Error::UpstreamStatus {
                context_length: true,
                ..
            }
        )
    }

    /// Builds an [`Error::InvalidRequest`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidRequest(message.into())
    }

    /// What a hook's error answers: an [`Error::Internal`] (the hook itself broke)
    /// becomes [`Error::HookFailed`] (502), prefixed with `what`; any other error is the
    /// answer the hook chose and is kept as it is.
    pub fn from_hook(what: &str, error: Error) -> Self {
        match error {
            Error::Internal(m) => Error::HookFailed(format!("{what}: {m}")),
            other => other,
        }
    }

    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Unauthorized => ErrorKind::Unauthorized,
            Error::InvalidRequest(_) => ErrorKind::InvalidRequest,
            Error::PayloadTooLarge { .. } => ErrorKind::PayloadTooLarge,
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::MethodNotAllowed { .. } => ErrorKind::MethodNotAllowed,
            Error::RolloutConcluded => ErrorKind::RolloutConcluded,
            Error::RolloutStopped(_) => ErrorKind::RolloutStopped,
            Error::UpstreamStatus { .. } => ErrorKind::UpstreamStatus,
            Error::UpstreamTimeout(_) => ErrorKind::UpstreamTimeout,
            Error::UpstreamUnavailable(_) => ErrorKind::UpstreamUnavailable,
            Error::UpstreamMalformed(_) => ErrorKind::UpstreamMalformed,
            Error::ClientDisconnected(_) => ErrorKind::ClientDisconnected,
            Error::Cancelled(_) => ErrorKind::Cancelled,
            Error::Tunnel { .. } => ErrorKind::Tunnel,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::Gone(_) => ErrorKind::Gone,
            Error::HookFailed(_) => ErrorKind::HookFailed,
            Error::Internal(_) => ErrorKind::Internal,
            Error::Paused { .. } => ErrorKind::Paused,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::UpgradeRequired { .. } => ErrorKind::UpgradeRequired,
        }
    }

    /// The one HTTP status this error answers with.
    pub fn status(&self) -> u16 {
        match self {
            Error::Unauthorized => 401,
            Error::InvalidRequest(_) | Error::RolloutStopped(_) => 400,
            Error::PayloadTooLarge { .. } => 413,
            Error::NotFound { .. } => 404,
            Error::MethodNotAllowed { .. } => 405,
            Error::RolloutConcluded | Error::Conflict(_) => 409,
            Error::Gone(_) => 410,
            Error::UpstreamStatus { status, .. } => *status,
            Error::UpstreamTimeout(_) => 504,
            Error::UpstreamUnavailable(_) | Error::Cancelled(_) => 503,
            Error::UpstreamMalformed(_) | Error::Tunnel { .. } | Error::HookFailed(_) => 502,
            Error::ClientDisconnected(_) => 499,
            Error::Internal(_) => 500,
            Error::Paused { held: true, .. } => 503,
            Error::Unavailable(_) => 503,
            Error::Paused { held: false, .. } => 429,
            Error::UpgradeRequired { .. } => 426,
        }
    }

    /// Who is to blame.
    pub fn blame(&self) -> Blame {
        match self {
            Error::Unauthorized
            | Error::InvalidRequest(_)
            | Error::PayloadTooLarge { .. }
            | Error::NotFound { .. }
            | Error::MethodNotAllowed { .. }
            | Error::RolloutConcluded
            | Error::RolloutStopped(_)
            | Error::ClientDisconnected(_)
            | Error::Conflict(_)
            | Error::Gone(_)
            | Error::UpgradeRequired { .. } => Blame::Client,
            Error::UpstreamStatus { .. }
            | Error::UpstreamTimeout(_)
            | Error::UpstreamUnavailable(_)
            | Error::UpstreamMalformed(_) => Blame::Upstream,
            Error::Tunnel { .. } => Blame::Tunnel,
            Error::Cancelled(_)
            | Error::HookFailed(_)
            | Error::Internal(_)
            | Error::Paused { .. }
            | Error::Unavailable(_) => Blame::Internal,
        }
    }

    /// Whether the same request may succeed if tried again.
    pub fn retryable(&self) -> bool {
        match self {
            Error::UpstreamStatus { status, .. } => *status == 429 || *status >= 500,
            Error::UpstreamTimeout(_)
            | Error::UpstreamUnavailable(_)
            | Error::UpstreamMalformed(_)
            | Error::Cancelled(_)
            | Error::Paused { .. }
            | Error::Unavailable(_) => true,
            Error::Tunnel { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether no retry of the same request can get another answer from this server: an
    /// answer intercept generated itself (not an upstream status), not retryable, and
    /// not a 5xx. Such answers carry `x-should-retry: false`, which the official OpenAI
    /// and Anthropic SDKs (and Claude Code, Codex) honour instead of backing off: a
    /// released rollout's 409, a stopped rollout's 400, a 401. Answers a retry can change
    /// (429, 5xx, a paused server's 503, an upstream's own status) never carry it.
    pub fn is_final(&self) -> bool {
        !matches!(self, Error::UpstreamStatus { .. }) && !self.retryable() && self.status() < 500
    }

    /// The `Retry-After` value (seconds) a response for this error carries, if any.
    pub fn retry_after(&self) -> Option<String> {
        match self {
            Error::UpstreamStatus { retry_after, .. } => retry_after.clone(),
            Error::Paused {
                retry_after_secs, ..
            } => Some(retry_after_secs.to_string()),
            _ => None,
        }
    }

    /// The error `type` an OpenAI or Anthropic SDK expects for this error's status.
    pub fn type_name(&self) -> &'static str {
        error_type_for_status(self.status())
    }
}

/// The error `type` string the OpenAI and Anthropic SDKs associate with an HTTP status.
pub fn error_type_for_status(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Phrases by which upstream servers say that a prompt exceeds the model's context.
pub const CONTEXT_LENGTH_PHRASES: &[&str] = &[
    "this model's maximum context length is",
    "is longer than the model's context length",
    "is longer than the maximum model length",
    "exceeds the model's context length",
    "exceed the configured limit",
    "exceeds the configured limit",
    "exceeded model",
    "prompt_too_long",
    "context_length_exceeded",
    "context length",
    "maximum model length",
];

/// Whether an upstream error says the prompt was too long for the model: a 4xx status
/// whose text holds one of [`CONTEXT_LENGTH_PHRASES`]. A 429 or 5xx that mentions the
/// context length is a transient failure (a retry can succeed), never a stop.
pub fn is_context_length_error(status: u16, text: &str) -> bool {
    if !(400..500).contains(&status) || status == 429 {
        return false;
    }
    let lower = text.to_ascii_lowercase();
    CONTEXT_LENGTH_PHRASES.iter().any(|p| lower.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_blame() {
        assert_eq!(Error::Unauthorized.status(), 401);
        assert_eq!(Error::RolloutConcluded.status(), 409);
        assert_eq!(
            Error::RolloutStopped(crate::StopReason::Limit("max_turns")).to_string(),
            "rollout stopped: max_turns"
        );
        let e = Error::upstream_status(429, "slow down".into(), None);
        assert_eq!(e.status(), 429);
        assert_eq!(e.blame(), Blame::Upstream);
        assert!(e.retryable());
        assert_eq!(e.type_name(), "rate_limit_error");
        assert!(!Error::invalid("bad").retryable());
        assert_eq!(Error::UpstreamTimeout("x".into()).status(), 504);
        assert_eq!(Error::UpstreamUnavailable("x".into()).status(), 503);
        assert_eq!(Error::UpstreamMalformed("x".into()).status(), 502);
        let hook = Error::HookFailed("boom".into());
        assert_eq!(hook.status(), 502);
        assert_eq!(hook.kind().as_str(), "hook_failed");
        assert_eq!(hook.to_string(), "model boundary hook failed: boom");
        assert!(!hook.retryable());
        let rejected = Error::Paused {
            retry_after_secs: 2,
            held: false,
        };
        assert_eq!(rejected.status(), 429);
        assert_eq!(rejected.kind().as_str(), "paused");
        assert_eq!(rejected.retry_after().as_deref(), Some("2"));
        assert!(rejected.retryable());
        let held = Error::Paused {
            retry_after_secs: 1,
            held: true,
        };
        assert_eq!(held.status(), 503);
        assert!(held.to_string().contains("pause timeout"), "{held}");
        // `x-should-retry: false` goes on final answers only.
        for e in [
            Error::RolloutConcluded,
            Error::RolloutStopped(crate::StopReason::Limit("max_turns")),
            Error::Unauthorized,
            Error::invalid("bad"),
        ] {
            assert!(e.is_final(), "{e}");
        }
        for e in [
            rejected,
            held,
            Error::upstream_status(400, "x".into(), None),
            Error::UpstreamUnavailable("x".into()),
            Error::Internal("x".into()),
            Error::HookFailed("x".into()),
            Error::Cancelled("x".into()),
        ] {
            assert!(!e.is_final(), "{e}");
        }
    }

    #[test]
    fn context_length_phrases() {
        assert!(is_context_length_error(
            400,
            "This model's maximum context length is 4096 tokens. However, you requested 5000"
        ));
        assert!(is_context_length_error(
            413,
            "prompt is too long: prompt_too_long"
        ));
        assert!(!is_context_length_error(400, "rate limit exceeded"));
        // Only 4xx answers stop a rollout: a 429 or 5xx may succeed when retried.
        for status in [429, 500, 502, 503, 504, 200] {
            assert!(
                !is_context_length_error(status, "context length exceeded on this replica"),
                "{status}"
            );
        }
    }
}
