//! The one place where an error becomes an HTTP response: its status, the
//! [`GENERATED_HEADER`] marker, `x-should-retry` and `Retry-After` are decided here for
//! every route (model calls, the state and tool channels, the sidecar's control API);
//! only the body's shape differs ([`Shape`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use intercept_core::{Dialect, Error};

/// Header on every response the server generates itself (not relayed from the upstream
/// unchanged); its value says who is to blame: `client`, `upstream`, `tunnel`, `internal`.
pub const GENERATED_HEADER: &str = "x-intercept-error";

/// Header the official OpenAI and Anthropic SDKs read before retrying: `false` on every
/// answer a retry cannot change ([`Error::is_final`]), absent on the others.
pub const SHOULD_RETRY_HEADER: &str = "x-should-retry";

/// The shape of an error's body.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum Shape<'a> {
    /// The dialect's own error body (the model routes).
    Dialect(&'a dyn Dialect),
    /// `{"error": "<message>"}` (the state, task and tool channels).
    Flat,
    /// `{"error": {"message": ..., "type": ...}}`, with the type names of the sidecar's
    /// control API ([`control_type`]).
    Control,
}

impl std::fmt::Debug for Shape<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Dialect(d) => f.debug_tuple("Dialect").field(&d.kind()).finish(),
            Shape::Flat => f.write_str("Flat"),
            Shape::Control => f.write_str("Control"),
        }
    }
}

/// The error `type` of a control API answer with this status.
pub fn control_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed_error",
        StatusCode::CONFLICT => "conflict_error",
        StatusCode::GONE => "gone_error",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large_error",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
        _ => "internal_error",
    }
}

/// The response for `error`, its body in `shape`, its message the error's text.
pub fn render(error: &Error, shape: Shape<'_>) -> Response<Bytes> {
    render_message(error, &error.to_string(), shape)
}

/// [`render`] with a message of the caller's instead of the error's text (an API that
/// words its own answers); status and headers are still the error's.
pub fn render_message(error: &Error, message: &str, shape: Shape<'_>) -> Response<Bytes> {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body: Bytes = match shape {
        Shape::Dialect(dialect) => dialect.error_body(status.as_u16(), message),
        Shape::Flat => to_json(&serde_json::json!({ "error": message })),
        Shape::Control => to_json(&serde_json::json!({
            "error": { "message": message, "type": control_type(status) }
        })),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    mark(error, headers);
    resp
}

/// The headers an error's answer carries, whatever its shape: the marker, `x-should-retry:
/// false` when no retry can change the answer, and `Retry-After`.
fn mark(error: &Error, headers: &mut HeaderMap) {
    headers.insert(
        GENERATED_HEADER,
        HeaderValue::from_static(error.blame().as_str()),
    );
    if error.is_final() {
        headers.insert(SHOULD_RETRY_HEADER, HeaderValue::from_static("false"));
    }
    if let Some(ra) = error.retry_after() {
        if let Ok(v) = HeaderValue::from_str(&ra) {
            headers.insert(http::header::RETRY_AFTER, v);
        }
    }
}

fn to_json(value: &serde_json::Value) -> Bytes {
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercept_core::ChatDialect;

    #[test]
    fn every_shape_carries_the_same_status_and_headers() {
        let paused = Error::Paused {
            retry_after_secs: 3,
            held: false,
        };
        for shape in [Shape::Dialect(&ChatDialect), Shape::Flat, Shape::Control] {
            let resp = render(&paused, shape);
            assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{shape:?}");
            assert_eq!(resp.headers()[http::header::RETRY_AFTER], "3", "{shape:?}");
            assert_eq!(resp.headers()[GENERATED_HEADER], "internal", "{shape:?}");
            assert!(
                resp.headers().get(SHOULD_RETRY_HEADER).is_none(),
                "{shape:?}"
            );
        }
        let flat = render(&Error::RolloutConcluded, Shape::Flat);
        assert_eq!(flat.headers()[SHOULD_RETRY_HEADER], "false");
        assert_eq!(flat.body().as_ref(), br#"{"error":"rollout concluded"}"#);
        let control = render_message(&Error::Unauthorized, "wrong token", Shape::Control);
        assert_eq!(control.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            control.body().as_ref(),
            br#"{"error":{"message":"wrong token","type":"authentication_error"}}"#
        );
    }
}
