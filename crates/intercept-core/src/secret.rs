//! Per-rollout secrets: 128 random bits from the OS, url-safe base64, compared in
//! constant time and never printed.
//!
//! A map keyed by [`Secret`] is looked up with a [`SecretStr`] borrowed from a request
//! header, without allocating; both hash like the `str` they hold, and the map's key
//! equality stays constant-time:
//!
//! ```
//! use std::collections::HashMap;
//! use intercept_core::{Secret, SecretStr};
//!
//! let secret = Secret::generate();
//! let header = secret.expose().to_owned();
//! let map = HashMap::from([(secret, "rollout-1")]);
//! assert_eq!(map.get(SecretStr::new(&header)), Some(&"rollout-1"));
//! assert_eq!(map.get(SecretStr::new("not-a-secret")), None);
//! ```

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};

use base64::Engine as _;
use ref_cast::RefCast;

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
        constant_time_eq::constant_time_eq(self.0.as_bytes(), candidate.as_bytes())
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

/// A borrowed secret: a `str` whose equality is constant-time and whose `Debug` never
/// shows it. [`Secret`] borrows as one, so maps keyed by [`Secret`] are looked up with
/// `map.get(SecretStr::new(header_value))`, no allocation on the request path.
#[derive(RefCast)]
#[repr(transparent)]
pub struct SecretStr(str);

impl SecretStr {
    /// Views a candidate string (for example a header's value) as a secret.
    pub fn new(value: &str) -> &SecretStr {
        SecretStr::ref_cast(value)
    }

    /// The secret's text. Handle with care: never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl PartialEq for SecretStr {
    fn eq(&self, other: &Self) -> bool {
        constant_time_eq::constant_time_eq(self.0.as_bytes(), other.0.as_bytes())
    }
}

impl Eq for SecretStr {}

impl Hash for SecretStr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Must hash exactly like `Secret`, which it is borrowed from.
        self.0.hash(state);
    }
}

impl fmt::Debug for SecretStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretStr(<redacted>)")
    }
}

impl Borrow<SecretStr> for Secret {
    fn borrow(&self) -> &SecretStr {
        SecretStr::new(&self.0)
    }
}

impl AsRef<SecretStr> for Secret {
    fn as_ref(&self) -> &SecretStr {
        SecretStr::new(&self.0)
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
        let borrowed = SecretStr::new(a.expose());
        assert!(!format!("{borrowed:?}").contains(a.expose()));
    }

    #[test]
    fn borrowed_secrets_hash_and_compare_like_owned_ones() {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        let a = Secret::generate();
        let text = a.expose().to_owned();
        assert_eq!(state.hash_one(&a), state.hash_one(SecretStr::new(&text)));
        let owned: &SecretStr = a.borrow();
        assert_eq!(owned, SecretStr::new(&text));
        assert_ne!(owned, SecretStr::new(&text[1..]));
        let map = std::collections::HashMap::from([(a.clone(), 1)]);
        assert_eq!(map.get(SecretStr::new(&text)), Some(&1));
        assert!(!map.contains_key(SecretStr::new("x")));
    }
}
