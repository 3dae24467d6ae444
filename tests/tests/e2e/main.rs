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

/// An `async-openai` client for `config`, on rustls with ring: async-openai is built
/// without a crypto provider of its own, and takes the process's default, installed here
/// (a second call finds it installed).
fn openai(
    config: async_openai::config::OpenAIConfig,
) -> async_openai::Client<async_openai::config::OpenAIConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    async_openai::Client::with_config(config)
}

/// The vLLM-like fake engine the server's own tests use.
#[path = "../../../crates/intercept-server/tests/common/fake_engine.rs"]
mod fake_engine;
