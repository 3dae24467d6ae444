//! Per-rollout secrets: 128 random bits from the OS, url-safe base64, compared in
//! constant time and never printed.

use std::fmt;
use std::hash::{Hash, Hasher};

use base64::Engine as _;
use subtle::ConstantTimeEq;

/// A bearer secret. `Debug` and `Display` never show it; equality is constant-time.
#[derive(Clone)]
pub struct Secret(Box<str>);

impl Secret {
    /// 16 bytes from the operating system's random number generator, url-safe base64
    /// without padding (22 characters).
    ///
    /// # Panics
    /// Only if the operating system has no random number generator at all.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        #[allow(clippy::expect_used)]
        getrandom::fill(&mut bytes).expect("the operating system random number generator failed");
        Secret(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(bytes)
                .into(),
        )
    }

    /// Wraps an existing secret value (for example one read from a header).
    pub fn new(value: impl Into<Box<str>>) -> Self {
        Secret(value.into())
    }

    /// The secret's text. Handle with care: never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison with a candidate string.
    pub fn matches(&self, candidate: &str) -> bool {
        self.0.as_bytes().ct_eq(candidate.as_bytes()).into()
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

impl Eq for Secret {}

impl Hash for Secret {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_distinct_and_hidden() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_eq!(a.expose().len(), 22);
        assert_ne!(a, b);
        assert!(a.matches(a.expose()));
        assert!(!a.matches(b.expose()));
        assert!(!format!("{a:?} {a}").contains(a.expose()));
    }
}
