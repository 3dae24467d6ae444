//! Contracts and data of **intercept**, the interception layer between RL rollouts'
//! agent programs and the policy model. This crate does no I/O and needs no runtime.
//!
//! What a trainer uses:
//!
//! - A rollout: [`RolloutSession`] made from a [`SessionConfig`] (its [`Upstream`],
//!   [`Sampling`], [`Limits`], [`NetworkPolicy`], [`TokensConfig`]); the [`Session`]
//!   trait for one of its own, whose hooks answer with [`HookAction`] and [`ToolAction`]
//!   and see [`CallInfo`].
//! - Serving it: an [`Interception`] (one server or a pool) hands out a [`SlotGuard`];
//!   its [`Slot`] is a base URL and two [`Secret`]s ([`Slot::harness_env`]).
//! - What it recorded: [`Trace`] (one [`CallRecord`] per call, with its [`Usage`]),
//!   [`Totals`] and [`StopReason`]; the [`Episode`], a message graph whose branches are
//!   token-exact training samples ([`RolloutSession::episode`]).
//! - Failures: [`Error`], with one [`ErrorKind`] and HTTP status each.
//! - Exposing a server to remote sandboxes: [`Tunnel`] and its [`Endpoint`].
//!
//! The wire formats are the sealed [`Dialect`] trait's four implementations
//! ([`DialectKind`]); their helper types live in [`dialect`].
//!
//! ```
//! use std::sync::Arc;
//! use intercept_core::{RolloutSession, SessionConfig, Upstream, Limits, Slot, Secret};
//!
//! let upstream = Upstream::new("http://127.0.0.1:8000/v1");
//! let session = Arc::new(RolloutSession::new(
//!     SessionConfig::new("rollout-7", "policy-model", upstream)
//!         .with_limits(Limits { max_turns: Some(16), ..Limits::default() }),
//! ));
//! // A server registers the session and hands the rollout a slot:
//! let slot = Slot {
//!     base_url: "http://127.0.0.1:4100".into(),
//!     model_secret: Secret::generate(),
//!     state_secret: Secret::generate(),
//! };
//! let env = slot.harness_env();
//! assert_eq!(env[0].1, "http://127.0.0.1:4100/v1");
//! assert!(!format!("{slot:?}").contains(slot.model_secret.expose()));
//! # let _ = session;
//! ```

pub mod body;
mod capture;
mod chunked;
pub mod dialect;
mod dialect_kind;
pub mod error;
pub mod interception;
mod json_text;
pub mod network;
mod rollout;
pub mod secret;
pub mod session;
pub mod slot;
mod sse;
mod stop;
pub mod trace;
pub mod tunnel;

pub use body::{JsonBody, RawJson};
pub use dialect::{
    mediate_request, ChatDialect, CompletionsDialect, Dialect, MessagesDialect, ResponsesDialect,
};
pub use dialect_kind::DialectKind;
pub use episode::{Episode, EpisodeBuilder};
pub use error::{Blame, Error, ErrorKind};
pub use interception::{
    Interception, PauseKind, PauseMode, PauseStatus, ServerStatus, SlotGuard, SlotRelease,
};
pub use network::{NetworkPolicy, OnViolation, PolicyEvent};
pub use record::{CallError, CallRecord, TokenCapture, TokenPath, TurnTokens, Usage};
pub use secret::{Secret, SecretStr};
pub use session::{
    tool_by_phase, CallInfo, Generated, HookAction, Limits, OnMismatch, RecordSink, RecordWait,
    RolloutSession, Sampling, Session, SessionConfig, SessionStatus, StopReason, TokenEngine,
    TokensConfig, ToolAction, ToolPhase, Totals, Trace, Upstream, SECRET_HEADERS,
};
pub use slot::Slot;
// The record's modules, where they were before `trace` held them.
pub use trace::{episode, log, record};
pub use tunnel::{BindAddr, Endpoint, Health, Tunnel};

/// What the other crates of this workspace (the server, the pools, the command line, the
/// mock model) share with this one to serve the dialects: no API to build on, and no
/// promise that it stays.
#[doc(hidden)]
pub mod internal {
    pub use crate::body::{ParseMemo, MAX_JSON_DEPTH};
    pub use crate::capture::{CapturedTokens, TokenCollector};
    pub use crate::dialect::heartbeat::CHAT_HEARTBEAT_ID;
    pub use crate::dialect::{
        bearer, join_url, Assembled, Heartbeat, Prepared, Relay, StreamAssembler, Summary,
    };
    pub use crate::interception::join_errors;
    pub use crate::sse::{SseEvent, SseSplitter};
}
