//! The one place where an error becomes an HTTP response.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use intercept_core::{ChatDialect, Dialect, Error};

use crate::http_body::ResponseBody;

/// Header on every response the server generates itself (not relayed from the upstream
/// unchanged); its value says who is to blame: `client`, `upstream`, `tunnel`, `internal`.
pub const GENERATED_HEADER: &str = "x-intercept-error";

/// Header the official OpenAI and Anthropic SDKs read before retrying: `false` on every
/// answer a retry cannot change ([`Error::is_final`]), absent on the others.
pub const SHOULD_RETRY_HEADER: &str = "x-should-retry";

/// Adds `x-should-retry: false` when no retry can change the answer.
pub(crate) fn mark_final(error: &Error, headers: &mut http::HeaderMap) {
    if error.is_final() {
        headers.insert(SHOULD_RETRY_HEADER, HeaderValue::from_static("false"));
    }
}

/// An error in the dialect's shape, with its status and the marker header.
pub(crate) fn error_response(dialect: &dyn Dialect, error: &Error) -> Response<ResponseBody> {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = dialect.error_body(status.as_u16(), &error.to_string());
    let mut resp = json_response(status, body);
    let headers = resp.headers_mut();
    headers.insert(
        GENERATED_HEADER,
        HeaderValue::from_static(error.blame().as_str()),
    );
    mark_final(error, headers);
    if let Some(ra) = error.retry_after() {
        if let Ok(v) = HeaderValue::from_str(&ra) {
            headers.insert(http::header::RETRY_AFTER, v);
        }
    }
    resp
}

/// An error outside any dialect's routes, in the OpenAI shape.
pub(crate) fn plain_error(error: &Error) -> Response<ResponseBody> {
    error_response(&ChatDialect, error)
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
