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

/// Declares [`ErrorKind`] from one table: each kind's doc, variant, snake_case name,
/// HTTP status and blame. `ErrorKind::ALL`, `as_str`, `status`, `blame` and `doc` are made
/// from it, so the list of kinds is written once (the Python package builds its exception
/// classes from `ALL`).
macro_rules! error_kinds {
    ($($(#[doc = $doc:literal])+ $kind:ident = $name:literal, $status:literal, $blame:ident;)+) => {
        /// A stable, machine-readable name for each kind of [`Error`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[non_exhaustive]
        pub enum ErrorKind {
            $($(#[doc = $doc])+ $kind,)+
        }

        impl ErrorKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind),+];

            /// The snake_case name used in call records and error bodies.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => $name,)+
                }
            }

            /// The HTTP status an error of this kind answers with. Two kinds vary per
            /// error ([`Error::status`]): `upstream_status` keeps the upstream's own status
            /// (502 here), and `paused` is 503 when the call was held (429 here).
            pub fn status(self) -> u16 {
                match self {
                    $(ErrorKind::$kind => $status,)+
                }
            }

            /// Who is to blame for an error of this kind.
            pub fn blame(self) -> Blame {
                match self {
                    $(ErrorKind::$kind => Blame::$blame,)+
                }
            }

            /// One line saying what this kind means (its doc).
            pub fn doc(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => concat!($($doc),+).trim_ascii(),)+
                }
            }
        }
    };
}

error_kinds! {
    /// Missing or unknown secret.
    Unauthorized = "unauthorized", 401, Client;
    /// The request is malformed or asks for something unsupported.
    InvalidRequest = "invalid_request", 400, Client;
    /// The request body exceeds the configured cap.
    PayloadTooLarge = "payload_too_large", 413, Client;
    /// No such route.
    NotFound = "not_found", 404, Client;
    /// The route exists but not for this method.
    MethodNotAllowed = "method_not_allowed", 405, Client;
    /// The rollout was released; no further calls are accepted.
    RolloutConcluded = "rollout_concluded", 409, Client;
    /// The rollout stopped (a limit, a hook, a context-length error).
    RolloutStopped = "rollout_stopped", 400, Client;
    /// The upstream answered with an error status.
    UpstreamStatus = "upstream_status", 502, Upstream;
    /// The upstream did not answer in time.
    UpstreamTimeout = "upstream_timeout", 504, Upstream;
    /// The upstream could not be reached or dropped the connection.
    UpstreamUnavailable = "upstream_unavailable", 503, Upstream;
    /// The upstream answered with a body that is not what the dialect expects.
    UpstreamMalformed = "upstream_malformed", 502, Upstream;
    /// The harness went away before the call finished.
    ClientDisconnected = "client_disconnected", 499, Client;
    /// The call was cancelled (rollout released or server shutting down).
    Cancelled = "cancelled", 503, Internal;
    /// A tunnel failed.
    Tunnel = "tunnel", 502, Tunnel;
    /// A conflict with existing state (e.g. a duplicate id).
    Conflict = "conflict", 409, Client;
    /// Model calls are paused (weight sync): rejected at once, or held past the timeout.
    Paused = "paused", 429, Internal;
    /// No capacity: a pool is at its cap, or no server came up in time.
    Unavailable = "unavailable", 503, Internal;
    /// A session hook (request or response) failed with an error of its own.
    HookFailed = "hook_failed", 502, Internal;
    /// intercept failed internally.
    Internal = "internal", 500, Internal;
    /// The client asked to upgrade to a transport the server does not speak (WebSocket).
    UpgradeRequired = "upgrade_required", 426, Client;
    /// What was asked for existed but is no longer held (a released session's trace).
    Gone = "gone", 410, Client;
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
    RolloutStopped(crate::stop::StopReason),
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
        /// (`is_context_length_error` of the status and body, decided when the answer
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

    /// The one HTTP status this error answers with: its kind's ([`ErrorKind::status`]),
    /// except an upstream's own status and a held pause's 503.
    pub fn status(&self) -> u16 {
        match self {
            Error::UpstreamStatus { status, .. } => *status,
            Error::Paused { held: true, .. } => 503,
            other => other.kind().status(),
        }
    }

    /// Who is to blame: its kind's ([`ErrorKind::blame`]).
    pub fn blame(&self) -> Blame {
        self.kind().blame()
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
pub(crate) fn error_type_for_status(status: u16) -> &'static str {
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
pub(crate) const CONTEXT_LENGTH_PHRASES: &[&str] = &[
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
pub(crate) fn is_context_length_error(status: u16, text: &str) -> bool {
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
    fn every_kind_is_listed_once_under_its_serde_name() {
        let mut seen = std::collections::HashSet::new();
        for &kind in ErrorKind::ALL {
            assert!(seen.insert(kind), "{kind:?} twice");
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
            let doc = kind.doc();
            assert!(doc.ends_with('.') && doc.trim() == doc, "{kind:?}: {doc:?}");
        }
        assert_eq!(
            ErrorKind::InvalidRequest.doc(),
            "The request is malformed or asks for something unsupported."
        );
    }

    #[test]
    fn each_error_has_its_status_and_blame() {
        use Blame::*;
        let s = || String::from("x");
        let cases = [
            (Error::Unauthorized, 401, Client),
            (Error::invalid("x"), 400, Client),
            (Error::PayloadTooLarge { limit: 1 }, 413, Client),
            (
                Error::NotFound {
                    method: s(),
                    path: s(),
                },
                404,
                Client,
            ),
            (
                Error::MethodNotAllowed {
                    method: s(),
                    path: s(),
                },
                405,
                Client,
            ),
            (Error::RolloutConcluded, 409, Client),
            (
                Error::RolloutStopped(crate::StopReason::Limit("max_turns")),
                400,
                Client,
            ),
            (Error::upstream_status(418, s(), None), 418, Upstream),
            (Error::UpstreamTimeout(s()), 504, Upstream),
            (Error::UpstreamUnavailable(s()), 503, Upstream),
            (Error::UpstreamMalformed(s()), 502, Upstream),
            (Error::ClientDisconnected(s()), 499, Client),
            (Error::Cancelled(s()), 503, Internal),
            (
                Error::Tunnel {
                    message: s(),
                    retryable: false,
                },
                502,
                Tunnel,
            ),
            (Error::Conflict(s()), 409, Client),
            (Error::Gone(s()), 410, Client),
            (Error::HookFailed(s()), 502, Internal),
            (Error::Internal(s()), 500, Internal),
            (Error::Unavailable(s()), 503, Internal),
            (Error::UpgradeRequired { path: s() }, 426, Client),
            (
                Error::Paused {
                    retry_after_secs: 1,
                    held: false,
                },
                429,
                Internal,
            ),
            (
                Error::Paused {
                    retry_after_secs: 1,
                    held: true,
                },
                503,
                Internal,
            ),
        ];
        let mut kinds = std::collections::HashSet::new();
        for (e, status, blame) in cases {
            assert_eq!((e.status(), e.blame()), (status, blame), "{e:?}");
            kinds.insert(e.kind());
        }
        assert_eq!(kinds.len(), ErrorKind::ALL.len(), "an error of every kind");
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
