//! Server-wide settings of the mock.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intercept_tokens::Tokenizer;

/// Settings of a [`MockUpstream`](super::MockUpstream) that apply to every request.
///
/// Settings given on a [`Reply`](super::Reply) take precedence over these. Build one with
/// struct update syntax:
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use intercept_mock::MockConfig;
///
/// let config = MockConfig { chunks: 8, chunk_delay: Duration::from_millis(5), ..MockConfig::default() };
/// assert!(config.log_requests);
/// ```
#[derive(Clone)]
pub struct MockConfig {
    /// Keep a log of every request ([`MockUpstream::requests`](super::MockUpstream::requests)).
    /// Default `true`. Turn it off for benchmarks: bodies are then neither parsed into a
    /// `serde_json::Value` nor stored; the request and connection counters still work.
    pub log_requests: bool,
    /// Number of pieces each streamed text (reasoning, content, tool-call arguments) is
    /// split into. Default 4; 0 counts as 1. A text shorter than this gives fewer pieces
    /// (never an empty one).
    pub chunks: usize,
    /// Pause between two events of a stream. Default zero (no timer at all).
    pub chunk_delay: Duration,
    /// Pause before the response headers are sent. Default zero.
    pub header_delay: Duration,
    /// The `created` timestamp of every completion: `Some(fixed)` (default
    /// [`MockConfig::FIXED_CREATED`], so responses are deterministic) or `None` for the
    /// current Unix time.
    pub created: Option<u64>,
    /// Model name answered when the request names none. Default `"mock-model"`.
    pub default_model: String,
    /// Largest request body accepted; larger bodies get a 413. Default 64 MiB.
    pub max_body_bytes: usize,
    /// The tokenizer of the token-in/token-out routes (`POST /inference/v1/generate`,
    /// `POST /generate`): it reads the prompt ids and turns the answer's text into ids.
    /// Default `None`: those routes then answer 501 to a completion. Load one with
    /// [`intercept_tokens::shared`].
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The vLLM release whose `/inference/v1/generate` answer the mock speaks. Default
    /// [`VllmVersion::V0_31`], the shape `renderers`' client parses.
    pub vllm_version: VllmVersion,
}

/// The vLLM release whose `POST /inference/v1/generate` answer the mock speaks; the
/// two differ in how they give per-token logprobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VllmVersion {
    /// vLLM 0.31.0 (and the releases before it): `logprobs` is OpenAI's shape,
    /// `{"content": [{"token": "token_id:<id>", "logprob", "bytes": null,
    /// "top_logprobs": [...]}]}`, the shape `renderers` 0.1.12 (verifiers' train client)
    /// requires.
    #[default]
    V0_31,
    /// vLLM 0.34.0 (0.32.0 on): `output_mode: "tokens"` answers, `logprobs` is
    /// `{"content": [{"token_id", "logprob", "rank", "top_logprobs": [...]}]}`, and each
    /// choice carries `stop_reason` and `weight_versions`.
    V0_34,
}

impl fmt::Debug for MockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockConfig")
            .field("log_requests", &self.log_requests)
            .field("chunks", &self.chunks)
            .field("chunk_delay", &self.chunk_delay)
            .field("header_delay", &self.header_delay)
            .field("created", &self.created)
            .field("default_model", &self.default_model)
            .field("max_body_bytes", &self.max_body_bytes)
            .field(
                "tokenizer",
                &self.tokenizer.as_ref().map(|tokenizer| tokenizer.path()),
            )
            .field("vllm_version", &self.vllm_version)
            .finish()
    }
}

/// Equal settings; two tokenizers are equal when they are the same loaded tokenizer.
impl PartialEq for MockConfig {
    fn eq(&self, other: &Self) -> bool {
        let same_tokenizer = match (&self.tokenizer, &other.tokenizer) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_tokenizer
            && self.log_requests == other.log_requests
            && self.chunks == other.chunks
            && self.chunk_delay == other.chunk_delay
            && self.header_delay == other.header_delay
            && self.created == other.created
            && self.default_model == other.default_model
            && self.max_body_bytes == other.max_body_bytes
            && self.vllm_version == other.vllm_version
    }
}

impl Eq for MockConfig {}

impl MockConfig {
    /// The default `created` timestamp (2023-11-14T22:13:20Z).
    pub const FIXED_CREATED: u64 = 1_700_000_000;

    /// The configuration for benchmarks: like the default, but without a request log.
    pub fn fast() -> Self {
        Self {
            log_requests: false,
            ..Self::default()
        }
    }
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            log_requests: true,
            chunks: 4,
            chunk_delay: Duration::ZERO,
            header_delay: Duration::ZERO,
            created: Some(Self::FIXED_CREATED),
            default_model: "mock-model".to_owned(),
            max_body_bytes: 64 << 20,
            tokenizer: None,
            vllm_version: VllmVersion::default(),
        }
    }
}

/// Seconds since the Unix epoch: a response's `created` when the config sets none.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
