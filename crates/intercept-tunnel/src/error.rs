//! Typed tunnel failures and their mapping onto [`intercept_core::Error`].

use std::time::Duration;

/// A stable, machine-readable name for each kind of [`TunnelError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TunnelErrorKind {
    /// The tunnel is misconfigured (missing API key, bad URL, unreadable config file).
    Config,
    /// The host-wide creation rate limit would make the caller wait longer than allowed.
    RateLimited,
    /// The tunnel service refused the credentials (HTTP 401).
    Auth,
    /// The tunnel service wants payment (HTTP 402).
    Payment,
    /// The account reached its maximum number of tunnels.
    LimitReached,
    /// An API call or the connection of the tunnel client timed out.
    Timeout,
    /// The tunnel was deleted, expired or disconnected too long; only a new one helps.
    Gone,
    /// The tunnel client could not connect or died.
    Connection,
    /// The tunnel server rejected the client's token or binding secret.
    Rejected,
    /// The tunnel server refused to start the proxy.
    ProxyRefused,
    /// The tunnel service answered with another error status.
    Api,
    /// Downloading or verifying the tunnel client binary failed.
    Download,
    /// A local I/O operation failed (config file, child process).
    Io,
    /// The fleet-wide rate limiter (Redis) cannot be reached or does not answer: the
    /// limiter fails closed and no tunnel starts.
    LimiterUnavailable,
}

/// A tunnel failure. Every message says what happened and what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TunnelError {
    /// The tunnel is misconfigured.
    #[error("{0}")]
    Config(String),
    /// The creation rate limiter would make the caller wait longer than its bound.
    #[error(
        "tunnel creation rate limit reached: the next start is {wait:?} away, over the bound \
         of {bound:?}; lower the number of tunnels (raise multiplexing) or raise the bound"
    )]
    RateLimited {
        /// How long the caller would have had to wait.
        wait: Duration,
        /// The configured bound.
        bound: Duration,
    },
    /// The tunnel service refused the credentials.
    #[error("{0}")]
    Auth(String),
    /// The tunnel service wants payment.
    #[error("{0}")]
    Payment(String),
    /// The account reached its maximum number of tunnels.
    #[error("{0}")]
    LimitReached(String),
    /// Something timed out.
    #[error("{0}")]
    Timeout(String),
    /// The tunnel is gone for good.
    #[error("{0}")]
    Gone(String),
    /// The tunnel client could not connect or died.
    #[error("{0}")]
    Connection(String),
    /// The tunnel server rejected the client's credentials.
    #[error("{0}")]
    Rejected(String),
    /// The tunnel server refused to start the proxy.
    #[error("{0}")]
    ProxyRefused(String),
    /// The tunnel service answered with an error status.
    #[error("tunnel API answered {status}: {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// What the service said.
        message: String,
    },
    /// Downloading or verifying the tunnel client binary failed.
    #[error("{0}")]
    Download(String),
    /// A local I/O operation failed.
    #[error("{0}")]
    Io(String),
    /// The fleet-wide rate limiter cannot be checked (Redis unreachable or silent), so
    /// the start is refused rather than let through unlimited.
    #[error("{0}")]
    LimiterUnavailable(String),
}

impl TunnelError {
    /// The kind of this error.
    pub fn kind(&self) -> TunnelErrorKind {
        match self {
            TunnelError::Config(_) => TunnelErrorKind::Config,
            TunnelError::RateLimited { .. } => TunnelErrorKind::RateLimited,
            TunnelError::Auth(_) => TunnelErrorKind::Auth,
            TunnelError::Payment(_) => TunnelErrorKind::Payment,
            TunnelError::LimitReached(_) => TunnelErrorKind::LimitReached,
            TunnelError::Timeout(_) => TunnelErrorKind::Timeout,
            TunnelError::Gone(_) => TunnelErrorKind::Gone,
            TunnelError::Connection(_) => TunnelErrorKind::Connection,
            TunnelError::Rejected(_) => TunnelErrorKind::Rejected,
            TunnelError::ProxyRefused(_) => TunnelErrorKind::ProxyRefused,
            TunnelError::Api { .. } => TunnelErrorKind::Api,
            TunnelError::Download(_) => TunnelErrorKind::Download,
            TunnelError::Io(_) => TunnelErrorKind::Io,
            TunnelError::LimiterUnavailable(_) => TunnelErrorKind::LimiterUnavailable,
        }
    }

    /// Whether trying again (with a fresh tunnel) can help.
    pub fn retryable(&self) -> bool {
        match self {
            TunnelError::Config(_)
            | TunnelError::Auth(_)
            | TunnelError::Payment(_)
            | TunnelError::LimitReached(_)
            | TunnelError::Rejected(_)
            | TunnelError::Download(_)
            | TunnelError::RateLimited { .. } => false,
            TunnelError::Api { status, .. } => *status == 429 || *status >= 500,
            TunnelError::Timeout(_)
            | TunnelError::Gone(_)
            | TunnelError::Connection(_)
            | TunnelError::ProxyRefused(_)
            | TunnelError::Io(_)
            | TunnelError::LimiterUnavailable(_) => true,
        }
    }

    pub(crate) fn io(what: &str, err: &std::io::Error) -> Self {
        TunnelError::Io(format!("{what}: {err}"))
    }
}

impl From<TunnelError> for intercept_core::Error {
    /// A tunnel failure is a 502 ([`intercept_core::Error::Tunnel`]); a limiter that
    /// cannot be checked is no capacity to start one, a 503
    /// ([`intercept_core::Error::Unavailable`]).
    fn from(err: TunnelError) -> Self {
        if let TunnelError::LimiterUnavailable(message) = err {
            return intercept_core::Error::Unavailable(message);
        }
        intercept_core::Error::Tunnel {
            retryable: err.retryable(),
            message: err.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_to_core_tunnel_error() {
        let core: intercept_core::Error = TunnelError::Gone("tunnel t1 is gone".into()).into();
        assert_eq!(core.kind(), intercept_core::ErrorKind::Tunnel);
        assert!(core.retryable());
        assert_eq!(core.to_string(), "tunnel failed: tunnel t1 is gone");
        let core: intercept_core::Error = TunnelError::Auth("check PRIME_API_KEY".into()).into();
        assert!(!core.retryable());
        assert!(TunnelError::Api {
            status: 503,
            message: "x".into()
        }
        .retryable());
        assert!(!TunnelError::Api {
            status: 400,
            message: "x".into()
        }
        .retryable());
        let core: intercept_core::Error =
            TunnelError::LimiterUnavailable("Redis at redis://h/ did not answer".into()).into();
        assert_eq!(core.status(), 503);
        assert!(core.retryable());
        assert!(core.to_string().contains("did not answer"), "{core}");
    }
}
