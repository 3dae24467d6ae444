//! The plain data of a rollout: where its calls go ([`Upstream`]), the sampling it
//! imposes ([`Sampling`]), its limits and totals ([`Limits`], [`Totals`]), and why it
//! stopped ([`StopReason`]). The [`Session`](crate::Session) trait and
//! [`RolloutSession`](crate::RolloutSession) are built on them.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::stop::StopReason;
use crate::trace::record::Usage;

/// Sampling settings a session imposes (`temperature`, `max_tokens`, ...). Keys the
/// dialect does not know are passed through where the dialect allows extras.
pub type Sampling = serde_json::Map<String, serde_json::Value>;

/// Where a session's calls go: one engine (`base_url`), or several engines of the same
/// model (`base_urls`) among which each session is pinned to one by rendezvous hashing
/// of its id (the server's `routing` module).
///
/// In JSON, `{"base_url": "http://h:8000/v1"}` is one engine and
/// `{"base_urls": ["http://a:8000/v1", "http://b:8000/v1"]}` several (`base_url`, if also
/// given, must be one of them).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "UpstreamRepr")]
pub struct Upstream {
    /// OpenAI-compatible base URL including its version segment, e.g.
    /// `http://127.0.0.1:8000/v1`. With several engines: the first of `base_urls`.
    pub base_url: String,
    /// Several engines serving the same model (empty: just `base_url`). Use
    /// [`Upstream::engines`] to read the effective list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base_urls: Vec<String>,
    /// API key sent upstream (as `Authorization: Bearer` or `x-api-key` per dialect).
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    /// Extra headers sent with every call.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct UpstreamRepr {
    #[serde(default)]
    base_url: String,
    #[serde(default)]
    base_urls: Vec<String>,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

impl TryFrom<UpstreamRepr> for Upstream {
    type Error = String;

    fn try_from(r: UpstreamRepr) -> Result<Self, String> {
        let trim = |u: &str| u.trim_end_matches('/').to_owned();
        let base_urls: Vec<String> = r.base_urls.iter().map(|u| trim(u)).collect();
        let base_url = trim(&r.base_url);
        let base_url = match (base_url.is_empty(), base_urls.first()) {
            (true, None) => return Err("upstream: `base_url` or `base_urls` is required".into()),
            (true, Some(first)) => first.clone(),
            (false, None) => base_url,
            (false, Some(_)) if base_urls.contains(&base_url) => base_url,
            (false, Some(_)) => {
                return Err(format!(
                    "upstream: `base_url` {base_url:?} is not one of `base_urls`; give one or the other"
                ))
            }
        };
        Ok(Upstream {
            base_url,
            base_urls,
            api_key: r.api_key,
            headers: r.headers,
        })
    }
}

impl Upstream {
    /// An upstream without key or extra headers.
    pub fn new(base_url: impl Into<String>) -> Self {
        Upstream {
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            base_urls: Vec::new(),
            api_key: None,
            headers: Vec::new(),
        }
    }

    /// An upstream of several engines serving the same model; each session is pinned to
    /// one of them. With one URL this is [`Upstream::new`]; with none, `base_url` is empty
    /// and every call fails with 503.
    pub fn engines_of<I, S>(base_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls: Vec<String> = base_urls
            .into_iter()
            .map(|u| u.into().trim_end_matches('/').to_owned())
            .collect();
        let mut upstream = Upstream::new(urls.first().cloned().unwrap_or_default());
        if urls.len() > 1 {
            upstream.base_urls = urls;
        }
        upstream
    }

    /// The engines calls may go to: `base_urls`, or `base_url` alone.
    pub fn engines(&self) -> &[String] {
        if self.base_urls.is_empty() {
            std::slice::from_ref(&self.base_url)
        } else {
            &self.base_urls
        }
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("base_urls", &self.base_urls)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field(
                "headers",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Per-rollout limits, checked before each call. Token limits are soft by one call:
/// they are checked between calls, from the usage the upstream reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most successful calls.
    pub max_turns: Option<u64>,
    /// Most input tokens: the sum over calls of each call's new prompt tokens (its prompt
    /// minus the previous call's prompt + completion, floored at 0).
    pub max_input_tokens: Option<u64>,
    /// Most completion tokens, summed over calls.
    pub max_output_tokens: Option<u64>,
    /// Most tokens in the context: the last call's prompt + completion.
    pub max_total_tokens: Option<u64>,
}

/// Token and turn totals of a rollout, derived from its calls' usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Successful calls.
    pub turns: u64,
    /// See [`Limits::max_input_tokens`].
    pub input_tokens: u64,
    /// Sum of completion tokens.
    pub output_tokens: u64,
    /// Last call's prompt + completion.
    pub total_tokens: u64,
}

impl Totals {
    /// Adds one successful call's usage.
    pub fn add(&mut self, usage: &Usage) {
        self.turns += 1;
        self.input_tokens += usage.prompt_tokens.saturating_sub(self.total_tokens);
        self.output_tokens += usage.completion_tokens;
        self.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    }

    /// The first limit reached, by name, in the order turns, input, output, total.
    pub fn exceeded(&self, limits: &Limits) -> Option<&'static str> {
        let hit = |limit: Option<u64>, value: u64| limit.is_some_and(|l| value >= l);
        if hit(limits.max_turns, self.turns) {
            Some("max_turns")
        } else if hit(limits.max_input_tokens, self.input_tokens) {
            Some("max_input_tokens")
        } else if hit(limits.max_output_tokens, self.output_tokens) {
            Some("max_output_tokens")
        } else if hit(limits.max_total_tokens, self.total_tokens) {
            Some("max_total_tokens")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_follow_usage() {
        let mut t = Totals::default();
        t.add(&Usage {
            prompt_tokens: 100,
            completion_tokens: 20,
            ..Usage::default()
        });
        t.add(&Usage {
            prompt_tokens: 150,
            completion_tokens: 30,
            ..Usage::default()
        });
        assert_eq!(
            t,
            Totals {
                turns: 2,
                input_tokens: 130,
                output_tokens: 50,
                total_tokens: 180
            }
        );
        let limits = Limits {
            max_output_tokens: Some(50),
            max_total_tokens: Some(10),
            ..Limits::default()
        };
        assert_eq!(t.exceeded(&limits), Some("max_output_tokens"));
        assert_eq!(
            t.exceeded(&Limits {
                max_turns: Some(2),
                ..Limits::default()
            }),
            Some("max_turns")
        );
        assert_eq!(t.exceeded(&Limits::default()), None);
    }

    #[test]
    fn upstream_json_is_back_compatible_and_takes_engine_lists() {
        let one: Upstream =
            serde_json::from_str(r#"{"base_url":"http://a/v1/","headers":[]}"#).expect("one");
        assert_eq!(one, Upstream::new("http://a/v1"));
        assert_eq!(one.engines(), ["http://a/v1".to_string()]);
        assert_eq!(
            serde_json::to_value(&one).expect("json"),
            serde_json::json!({"base_url": "http://a/v1", "headers": []})
        );
        let many: Upstream =
            serde_json::from_str(r#"{"base_urls":["http://a/v1","http://b/v1/"]}"#).expect("many");
        assert_eq!(many.base_url, "http://a/v1");
        assert_eq!(many.engines(), ["http://a/v1", "http://b/v1"]);
        assert_eq!(many, Upstream::engines_of(["http://a/v1", "http://b/v1"]));
        let back: Upstream =
            serde_json::from_value(serde_json::to_value(&many).expect("json")).expect("back");
        assert_eq!(back, many);
        for bad in [
            r#"{}"#,
            r#"{"base_url":"http://c/v1","base_urls":["http://a/v1"]}"#,
        ] {
            assert!(serde_json::from_str::<Upstream>(bad).is_err(), "{bad}");
        }
    }
}

/// Token-in/token-out for a rollout: intercept renders each call's conversation to token
/// ids itself (bridging from the previous turn's exact ids), generates on the engine's
/// token endpoint and parses the completion ids back into the dialect's answer, so the
/// trace holds the ids the model sampled, never a re-tokenisation (`docs/tokens.md`).
///
/// In a session body: `{"renderer": "qwen3", "tokenizer": "/models/qwen3"}`, plus the
/// optional `engine`, `on_mismatch` and the renderer's options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensConfig {
    /// The renderer (model family): `qwen3`.
    pub renderer: String,
    /// A folder holding `tokenizer.json` (and `tokenizer_config.json`), or the
    /// `tokenizer.json` file itself. Loaded once per process, shared by every session
    /// naming it.
    pub tokenizer: String,
    /// The engine's token endpoint. Default `vllm`.
    #[serde(default)]
    pub engine: TokenEngine,
    /// What a turn that does not extend the previous one's ids does. Default `render`.
    #[serde(default)]
    pub on_mismatch: OnMismatch,
    /// The renderer's `enable_thinking` (Qwen3: default true, as `renderers` defaults it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
}

impl TokensConfig {
    /// Token-in/token-out with `renderer` and the tokenizer at `tokenizer`, on vLLM, a
    /// mismatch rendered in full.
    pub fn new(renderer: impl Into<String>, tokenizer: impl Into<String>) -> Self {
        TokensConfig {
            renderer: renderer.into(),
            tokenizer: tokenizer.into(),
            engine: TokenEngine::default(),
            on_mismatch: OnMismatch::default(),
            enable_thinking: None,
        }
    }
}

/// An engine endpoint that takes token ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TokenEngine {
    /// vLLM: `POST {upstream without /v1}/inference/v1/generate` with `token_ids`.
    #[default]
    Vllm,
    /// SGLang: `POST {upstream without /v1}/generate` with `input_ids`.
    Sglang,
}

impl TokenEngine {
    /// The path of the endpoint, on the upstream's base URL without its `/v1`.
    pub fn path(self) -> &'static str {
        match self {
            TokenEngine::Vllm => "/inference/v1/generate",
            TokenEngine::Sglang => "/generate",
        }
    }
}

/// What a turn that does not extend the previous turn's ids does (a history the harness
/// edited, a new user query under thinking retention, a turn the bridge declines).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnMismatch {
    /// Render the whole conversation; the trace's branch breaks there, with its reason.
    #[default]
    Render,
    /// Send this turn to the upstream's chat endpoint with `return_token_ids` (the
    /// engine renders it), and go on bridging from the ids it returns.
    Chat,
    /// Refuse the call with a 409 that says why.
    Fail,
}
