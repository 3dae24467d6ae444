//! End-to-end tests across crates: real clients, real HTTP, the mock model upstream.

mod anthropic;
mod episodes;
mod network_policy;
mod openai_chat;
mod pool_bore;
mod responses;
#[cfg(target_os = "linux")]
mod stalled_disk;
mod training_capture;

/// The vLLM-like fake engine the server's own tests use.
#[path = "../../../crates/intercept-server/tests/common/fake_engine.rs"]
mod fake_engine;
