//! Contracts and data of **intercept**, the interception layer between RL rollouts'
//! agent programs and the policy model. This crate does no I/O and needs no runtime.
//!
//! - [`Slot`]: what a rollout gets (base URL, model secret, state secret).
//! - [`Session`]: one rollout as the server sees it; [`RolloutSession`] is the ready one.
//! - [`Interception`]: start, stop, acquire a [`SlotGuard`] (one server or a pool).
//! - [`Tunnel`] / [`Endpoint`]: how a server is exposed to remote sandboxes.
//! - [`Dialect`]: a wire format ([`ChatDialect`] for OpenAI Chat Completions).
//! - [`CallRecord`]: the per-call trace record; [`Error`]: typed errors with one status.
//! - [`Episode`]: a rollout as a message graph whose branches are token-exact training
//!   samples ([`Trace::episode`], [`RolloutSession::episode`]).
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
pub mod capture;
mod chunked;
pub mod dialect;
pub mod error;
pub mod interception;
mod json_text;
pub mod network;
mod rollout;
pub mod secret;
pub mod session;
pub mod slot;
pub mod sse;
pub mod trace;
pub mod tunnel;

pub use body::{JsonBody, RawJson};
pub use dialect::{
    join_url, Assembled, ChatDialect, CompletionsDialect, Dialect, DialectKind, MessagesDialect,
    Prepared, Relay, ResponsesDialect, StreamAssembler, Summary,
};
pub use episode::{Episode, EpisodeBuilder};
pub use error::{Blame, Error, ErrorKind};
pub use interception::{
    Interception, PauseKind, PauseMode, PauseStatus, ServerStatus, SlotGuard, SlotRelease,
};
pub use network::{mediate_request, NetworkPolicy, OnViolation, PolicyEvent};
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
