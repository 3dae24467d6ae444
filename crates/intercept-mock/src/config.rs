//! Server-wide settings of the mock.

use std::time::Duration;

/// Settings of a [`MockUpstream`](super::MockUpstream) that apply to every request.
///
/// Settings given on a [`Reply`](super::Reply) take precedence over these. Build one with
/// struct update syntax:
///
/// ```
/// use std::time::Duration;
/// use intercept_mock::MockConfig;
///
/// let config = MockConfig { chunks: 8, chunk_delay: Duration::from_millis(5), ..MockConfig::default() };
/// assert!(config.log_requests);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

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
        }
    }
}
