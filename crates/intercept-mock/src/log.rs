//! The request log.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{HeaderMap, Method, Version};
use serde_json::Value;
use tokio::time::Instant;

/// One request as the mock received it (see
/// [`MockUpstream::requests`](super::MockUpstream::requests)).
#[derive(Debug, Clone)]
pub struct ReceivedRequest {
    /// Position among all requests the server received, from 0 (it keeps counting after
    /// [`MockUpstream::take_requests`](super::MockUpstream::take_requests)).
    pub seq: usize,
    /// The TCP connection it came on: 1 for the first connection accepted, 2 for the
    /// next, ... Equal numbers mean the client reused a connection.
    pub connection: usize,
    /// The HTTP method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query string, if any.
    pub query: Option<String>,
    /// The HTTP version.
    pub version: Version,
    /// Headers by lower-case name; repeated headers are joined with `", "`, and bytes
    /// that are not UTF-8 are replaced.
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub body: RequestBody,
    /// When the request's head arrived.
    pub received_at: Instant,
}

/// The body of a [`ReceivedRequest`].
#[derive(Debug, Clone, PartialEq)]
pub enum RequestBody {
    /// The body parsed as JSON.
    Json(Value),
    /// A body that is not JSON (possibly empty), as text (bytes that are not UTF-8 are
    /// replaced).
    Text(String),
}

impl RequestBody {
    pub(crate) fn from_bytes(body: &Bytes) -> Self {
        match serde_json::from_slice(body) {
            Ok(value) => Self::Json(value),
            Err(_) => Self::Text(String::from_utf8_lossy(body).into_owned()),
        }
    }

    /// The JSON value, if the body was JSON.
    pub fn as_json(&self) -> Option<&Value> {
        match self {
            Self::Json(value) => Some(value),
            Self::Text(_) => None,
        }
    }

    /// The text, if the body was not JSON.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Json(_) => None,
            Self::Text(text) => Some(text),
        }
    }
}

impl ReceivedRequest {
    /// The JSON body, if it was JSON.
    pub fn json(&self) -> Option<&Value> {
        self.body.as_json()
    }

    /// A header's value; `name` is matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        match self.headers.get(name) {
            Some(value) => Some(value),
            None => self
                .headers
                .get(&name.to_ascii_lowercase())
                .map(String::as_str),
        }
    }

    /// Whether the body asked for a stream (`"stream": true`).
    pub fn is_stream(&self) -> bool {
        self.json()
            .and_then(|body| body.get("stream"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// Headers as a map of lower-case names (`http` already lower-cases them) to values.
pub(crate) fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        match map.get_mut(name.as_str()) {
            Some(existing) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            None => {
                map.insert(name.as_str().to_owned(), value.into_owned());
            }
        }
    }
    map
}
