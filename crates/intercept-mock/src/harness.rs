//! The mock's other side: a small HTTP/1.1 JSON client (hyper-util's pooled client) for
//! simulated harnesses (the demo's, the benchmarks', the tests') and the control API,
//! and a parser that reassembles a streamed chat completion.

use std::fmt;

use anyhow::{anyhow, Context as _};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A pooled HTTP client that sends and receives JSON.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

/// A response: status, content type and the whole body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status.
    pub status: StatusCode,
    /// The `content-type` header, if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Bytes,
}

impl HttpResponse {
    /// The body as JSON.
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "the response ({}) is not JSON: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

impl HttpClient {
    /// A client with a connection pool.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        HttpClient {
            inner: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// Sends a request with an optional bearer token and JSON body; reads the whole
    /// response.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        bearer: Option<&str>,
        body: Option<&Value>,
    ) -> anyhow::Result<HttpResponse> {
        let mut req = Request::builder().method(method).uri(url);
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some(v) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(v)?)
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(body))
            .with_context(|| format!("bad request URL {url}"))?;
        let resp = self
            .inner
            .request(req)
            .await
            .with_context(|| format!("request to {url} failed"))?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp
            .into_body()
            .collect()
            .await
            .with_context(|| format!("reading the response of {url} failed"))?
            .to_bytes();
        Ok(HttpResponse {
            status,
            content_type,
            body,
        })
    }
}

/// One tool call of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    /// The call id.
    pub id: String,
    /// The function name.
    pub name: String,
    /// The arguments (JSON text).
    pub arguments: String,
}

/// An assistant message, from a completion or reassembled from a stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assistant {
    /// The text.
    pub content: String,
    /// The tool calls.
    pub tool_calls: Vec<ToolCall>,
    /// The finish reason.
    pub finish_reason: Option<String>,
}

impl Assistant {
    /// The message as the harness appends it to its conversation.
    pub fn to_message(&self) -> Value {
        if self.tool_calls.is_empty() {
            serde_json::json!({"role": "assistant", "content": self.content})
        } else {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    serde_json::json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": calls})
        }
    }
}

/// Reads the first choice of a `chat.completion` object.
pub fn parse_completion(body: &Value) -> anyhow::Result<Assistant> {
    let choice = body
        .pointer("/choices/0")
        .ok_or_else(|| anyhow!("the completion has no choices: {body}"))?;
    let message = &choice["message"];
    let tool_calls = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    id: c["id"].as_str().unwrap_or_default().to_owned(),
                    name: c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    arguments: c["function"]["arguments"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Assistant {
        content: message["content"].as_str().unwrap_or_default().to_owned(),
        tool_calls,
        finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
    })
}

/// Reassembles a streamed chat completion from its SSE body (`data:` lines; comments
/// and the `[DONE]` terminal event are skipped). Fails if `[DONE]` never came.
pub fn parse_stream(body: &[u8]) -> anyhow::Result<Assistant> {
    let text = std::str::from_utf8(body).context("the stream is not UTF-8")?;
    let mut out = Assistant::default();
    let mut done = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value =
            serde_json::from_str(data).with_context(|| format!("bad stream event: {data}"))?;
        if let Some(err) = chunk.get("error") {
            return Err(anyhow!("the stream carried an error: {err}"));
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            continue;
        };
        let delta = &choice["delta"];
        if let Some(s) = delta["content"].as_str() {
            out.content.push_str(s);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = usize::try_from(call["index"].as_u64().unwrap_or(0)).unwrap_or(0);
            if index > 128 {
                return Err(anyhow!("tool call index {index} out of range"));
            }
            while out.tool_calls.len() <= index {
                out.tool_calls.push(ToolCall::default());
            }
            let slot = &mut out.tool_calls[index];
            if let Some(id) = call["id"].as_str() {
                slot.id = id.to_owned();
            }
            if let Some(name) = call["function"]["name"].as_str() {
                slot.name.push_str(name);
            }
            if let Some(args) = call["function"]["arguments"].as_str() {
                slot.arguments.push_str(args);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            out.finish_reason = Some(reason.to_owned());
        }
    }
    if !done {
        return Err(anyhow!("the stream ended without [DONE]"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassembles_content_and_tool_calls() {
        let sse = concat!(
            ": keepalive\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ec\"}}]}\r\n\r\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ho\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"search\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"q\\\":1}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n",
            "data: [DONE]\n\n",
        );
        let a = parse_stream(sse.as_bytes()).unwrap();
        assert_eq!(a.content, "echo");
        assert_eq!(a.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            a.tool_calls,
            [ToolCall {
                id: "call_1".into(),
                name: "search".into(),
                arguments: "{\"q\":1}".into()
            }]
        );
        assert_eq!(
            a.to_message()["tool_calls"][0]["function"]["name"],
            "search"
        );
        assert!(parse_stream(b"data: {\"choices\":[]}\n\n").is_err());
        assert!(
            parse_stream(b"data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n").is_err()
        );
    }

    #[test]
    fn reads_a_completion() {
        let body = serde_json::json!({"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]});
        let a = parse_completion(&body).unwrap();
        assert_eq!(a.content, "hi");
        assert_eq!(
            a.to_message(),
            serde_json::json!({"role":"assistant","content":"hi"})
        );
        assert!(parse_completion(&serde_json::json!({})).is_err());
    }
}
