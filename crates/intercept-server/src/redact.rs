//! Redaction of the upstream's API key from upstream text.
//!
//! An upstream may echo the key it was sent (`invalid key Bearer sk-…` in a 401 body, an
//! error event, a header). Every upstream text passes a [`Redactor`] before it is relayed
//! to the harness, recorded or logged: each occurrence of the key becomes
//! [`REDACTED`]. Keys shorter than [`MIN_REDACTED_KEY_LEN`] bytes (`EMPTY`, `none`: the
//! placeholders local engines accept) are not searched for, as replacing such a common
//! word would corrupt model output.

use std::borrow::Cow;

use bytes::Bytes;
use memchr::memmem::Finder;

/// What stands in for the key.
pub(crate) const REDACTED: &str = "<redacted>";

/// Keys shorter than this many bytes are not redacted (see the module docs).
pub(crate) const MIN_REDACTED_KEY_LEN: usize = 8;

/// Replaces one secret (the upstream's API key) in text; a no-op without a key.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    finder: Option<Finder<'static>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("active", &self.finder.is_some())
            .finish()
    }
}

impl Redactor {
    /// A redactor for `key`; inactive without one or for a key shorter than
    /// [`MIN_REDACTED_KEY_LEN`].
    pub(crate) fn new(key: Option<&str>) -> Self {
        let finder = key
            .filter(|k| k.len() >= MIN_REDACTED_KEY_LEN)
            .map(|k| Finder::new(k.as_bytes()).into_owned());
        Redactor { finder }
    }

    /// Whether there is a key to redact.
    pub(crate) fn is_active(&self) -> bool {
        self.finder.is_some()
    }

    fn replace(finder: &Finder<'_>, input: &[u8]) -> Option<Vec<u8>> {
        let first = finder.find(input)?;
        let n = finder.needle().len();
        let mut out = Vec::with_capacity(input.len());
        out.extend_from_slice(&input[..first]);
        out.extend_from_slice(REDACTED.as_bytes());
        let mut at = first + n;
        while let Some(i) = finder.find(&input[at..]) {
            out.extend_from_slice(&input[at..at + i]);
            out.extend_from_slice(REDACTED.as_bytes());
            at += i + n;
        }
        out.extend_from_slice(&input[at..]);
        Some(out)
    }

    /// `bytes` with the key replaced; the same buffer (no copy) when it does not occur.
    pub(crate) fn bytes(&self, bytes: Bytes) -> Bytes {
        match self.finder.as_ref().and_then(|f| Self::replace(f, &bytes)) {
            Some(out) => Bytes::from(out),
            None => bytes,
        }
    }

    /// `text` with the key replaced.
    pub(crate) fn str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self
            .finder
            .as_ref()
            .and_then(|f| Self::replace(f, text.as_bytes()))
        {
            // The key is valid UTF-8 and so is the replacement: cutting at its bounds
            // keeps the text valid.
            Some(out) => Cow::Owned(String::from_utf8_lossy(&out).into_owned()),
            None => Cow::Borrowed(text),
        }
    }

    /// `text` with the key replaced, in place.
    pub(crate) fn string(&self, text: &mut String) {
        if let Cow::Owned(s) = self.str(text) {
            *text = s;
        }
    }

    /// The error with the key replaced in every text it carries from the upstream.
    pub(crate) fn error(&self, error: intercept_core::Error) -> intercept_core::Error {
        use intercept_core::Error as E;
        if !self.is_active() {
            return error;
        }
        let s = |t: String| self.str(&t).into_owned();
        match error {
            E::UpstreamStatus {
                status,
                body,
                retry_after,
                context_length,
            } => E::UpstreamStatus {
                status,
                body: s(body),
                retry_after: retry_after.map(s),
                context_length,
            },
            E::UpstreamTimeout(m) => E::UpstreamTimeout(s(m)),
            E::UpstreamUnavailable(m) => E::UpstreamUnavailable(s(m)),
            E::UpstreamMalformed(m) => E::UpstreamMalformed(s(m)),
            E::HookFailed(m) => E::HookFailed(s(m)),
            E::Internal(m) => E::Internal(s(m)),
            E::InvalidRequest(m) => E::InvalidRequest(s(m)),
            E::Cancelled(m) => E::Cancelled(s(m)),
            E::ClientDisconnected(m) => E::ClientDisconnected(s(m)),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "sk-live-0123456789";

    #[test]
    fn replaces_every_occurrence_and_keeps_the_rest() {
        let r = Redactor::new(Some(KEY));
        let out = r.bytes(Bytes::from(format!(
            "{{\"error\":\"bad key Bearer {KEY}\",\"again\":\"{KEY}{KEY}\"}}"
        )));
        assert_eq!(
            &out[..],
            b"{\"error\":\"bad key Bearer <redacted>\",\"again\":\"<redacted><redacted>\"}"
        );
        assert_eq!(r.str("nothing here"), "nothing here");
        let e = r.error(intercept_core::Error::upstream_status(
            401,
            format!("invalid {KEY}"),
            Some(KEY.into()),
        ));
        assert!(!format!("{e:?}").contains(KEY), "{e:?}");
    }

    #[test]
    fn short_or_missing_keys_are_not_searched() {
        for key in [None, Some("EMPTY"), Some("")] {
            let r = Redactor::new(key);
            assert!(!r.is_active());
            assert_eq!(
                &r.bytes(Bytes::from_static(b"EMPTY answer"))[..],
                b"EMPTY answer"
            );
        }
    }

    proptest! {
        #[test]
        fn no_occurrence_survives(parts in proptest::collection::vec("[a-z \n]{0,12}", 0..6)) {
            let r = Redactor::new(Some(KEY));
            let text = parts.join(KEY);
            let out = r.str(&text);
            prop_assert!(!out.contains(KEY));
            prop_assert_eq!(out.matches(REDACTED).count(), parts.len().saturating_sub(1));
        }
    }
}
