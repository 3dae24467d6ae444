//! What a rollout receives: where the server is and the two secrets.

use std::fmt;

use crate::secret::Secret;

/// A rollout's handle on an interception server: the base URL, the model secret (for
/// model routes) and the state secret (for `/state` and `/task`). The two secrets are
/// separate capabilities: neither opens the other's routes.
#[derive(Clone, PartialEq, Eq)]
pub struct Slot {
    /// The server's public base URL, without a trailing slash (e.g. `http://127.0.0.1:4100`).
    pub base_url: String,
    /// Authenticates model routes (`/v1/...`).
    pub model_secret: Secret,
    /// Authenticates the state and task channels.
    pub state_secret: Secret,
}

impl Slot {
    /// The environment a harness needs to reach the server with the OpenAI and Anthropic
    /// SDKs: `OPENAI_BASE_URL` (base URL + `/v1`), `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`
    /// (the bare base URL; that SDK appends `/v1/messages`) and `ANTHROPIC_API_KEY`.
    pub fn harness_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OPENAI_BASE_URL", self.openai_base_url()),
            ("OPENAI_API_KEY", self.model_secret.expose().to_owned()),
            ("ANTHROPIC_BASE_URL", self.base_url.clone()),
            ("ANTHROPIC_API_KEY", self.model_secret.expose().to_owned()),
        ]
    }

    /// The OpenAI-style base URL (`base_url` + `/v1`).
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url)
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("base_url", &self.base_url)
            .field("model_secret", &self.model_secret)
            .field("state_secret", &self.state_secret)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_debug() {
        let slot = Slot {
            base_url: "http://127.0.0.1:9".into(),
            model_secret: Secret::new("m-secret"),
            state_secret: Secret::new("s-secret"),
        };
        let env = slot.harness_env();
        assert_eq!(
            env[0],
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1".to_string())
        );
        assert_eq!(env[1], ("OPENAI_API_KEY", "m-secret".to_string()));
        assert_eq!(
            env[2],
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9".to_string())
        );
        assert_eq!(env[3], ("ANTHROPIC_API_KEY", "m-secret".to_string()));
        let dbg = format!("{slot:?}");
        assert!(
            !dbg.contains("m-secret") && !dbg.contains("s-secret"),
            "{dbg}"
        );
    }
}
