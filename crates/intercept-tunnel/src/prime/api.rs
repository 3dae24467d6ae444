//! The Prime tunnel HTTP API (as `prime_tunnel` 0.1.15 calls it): create, get and delete
//! a registration.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use super::account::PrimeAccount;
use crate::error::TunnelError;

/// A tunnel registration as the API returns it (fields intercept does not use are kept
/// optional).
#[derive(Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default)]
pub struct TunnelInfo {
    /// The tunnel id (also the frp user and subdomain).
    pub tunnel_id: String,
    /// The public URL.
    pub url: String,
    /// The public host name.
    pub hostname: String,
    /// Token frpc logs in with (secret).
    pub frp_token: String,
    /// Secret binding frpc to this registration (secret).
    pub binding_secret: String,
    /// frps host.
    pub server_host: String,
    /// frps port.
    #[serde(default = "default_server_port")]
    pub server_port: u16,
    /// The local port the tunnel forwards to.
    pub local_port: u16,
    /// `pending`, `connected`, `disconnected`, `expired` or `terminated`.
    pub status: Option<String>,
    /// When the registration expires.
    pub expires_at: Option<String>,
}

fn default_server_port() -> u16 {
    7000
}

impl fmt::Debug for TunnelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TunnelInfo")
            .field("tunnel_id", &self.tunnel_id)
            .field("url", &self.url)
            .field("server_host", &self.server_host)
            .field("server_port", &self.server_port)
            .field("local_port", &self.local_port)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// The HTTP client used for the API and the frpc download (HTTPS with webpki roots, or
/// plain HTTP; plain HTTP only without the `tls` feature).
#[cfg(feature = "tls")]
pub(crate) type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;
/// The HTTP client used for the API and the frpc download (plain HTTP: the crate was
/// built without its `tls` feature).
#[cfg(not(feature = "tls"))]
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[cfg(feature = "tls")]
pub(crate) fn https_client() -> Result<HttpClient, TunnelError> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|e| TunnelError::Config(format!("TLS setup failed: {e}")))?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

#[cfg(not(feature = "tls"))]
pub(crate) fn https_client() -> Result<HttpClient, TunnelError> {
    Ok(Client::builder(TokioExecutor::new()).build(HttpConnector::new()))
}

/// Refuses an `https://` URL when the crate was built without its `tls` feature, with
/// an error that says so (instead of the connector's "invalid URL").
pub(crate) fn require_tls_for(url: &str) -> Result<(), TunnelError> {
    if cfg!(not(feature = "tls")) && url.starts_with("https://") {
        return Err(TunnelError::Config(format!(
            "{url} is `https://`, and intercept-tunnel was built without its `tls` feature \
             (plain HTTP only)"
        )));
    }
    Ok(())
}

/// A client of the Prime tunnel API. Cheap to clone.
#[derive(Clone)]
pub(crate) struct PrimeApi {
    client: HttpClient,
    account: PrimeAccount,
    timeout: Duration,
}

impl fmt::Debug for PrimeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimeApi")
            .field("base_url", &self.account.base_url)
            .finish()
    }
}

/// One request's failure before any status: connecting, or timing out.
enum Transport {
    Connect(String),
    Timeout,
}

impl PrimeApi {
    pub(crate) fn new(account: PrimeAccount, timeout: Duration) -> Result<Self, TunnelError> {
        require_tls_for(&account.base_url)?;
        let client = https_client()?;
        Ok(PrimeApi {
            client,
            account,
            timeout,
        })
    }

    pub(crate) fn account(&self) -> &PrimeAccount {
        &self.account
    }

    /// `POST /api/v1/tunnel`.
    pub(crate) async fn create(
        &self,
        local_port: u16,
        name: Option<&str>,
    ) -> Result<TunnelInfo, TunnelError> {
        let mut body = serde_json::json!({ "local_port": local_port });
        if let Some(name) = name {
            body["name"] = name.into();
        }
        if let Some(team) = &self.account.team_id {
            body["teamId"] = team.as_str().into();
        }
        let (status, text) = self
            .send(
                Method::POST,
                "/api/v1/tunnel",
                Some(body),
                "register tunnel",
            )
            .await?;
        if status == StatusCode::NOT_FOUND || text.trim().is_empty() {
            return Err(TunnelError::Api {
                status: status.as_u16(),
                message: "tunnel registration got an unexpected empty response; check \
                          PRIME_API_BASE_URL"
                    .into(),
            });
        }
        check(status, &text, "register tunnel")?;
        let info: TunnelInfo = serde_json::from_str(&text).map_err(|e| TunnelError::Api {
            status: status.as_u16(),
            message: format!("tunnel registration answered an unreadable body: {e}"),
        })?;
        if info.tunnel_id.is_empty() || info.url.is_empty() {
            return Err(TunnelError::Api {
                status: status.as_u16(),
                message: "tunnel registration answered without a tunnel id or URL".into(),
            });
        }
        Ok(info)
    }

    /// `GET /api/v1/tunnel/{id}`; `None` when the registration does not exist.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<TunnelInfo>, TunnelError> {
        let (status, text) = self
            .send(
                Method::GET,
                &format!("/api/v1/tunnel/{id}"),
                None,
                "get tunnel",
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        check(status, &text, "get tunnel")?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| TunnelError::Api {
                status: status.as_u16(),
                message: format!("tunnel status answered an unreadable body: {e}"),
            })
    }

    /// `DELETE /api/v1/tunnel/{id}`; `false` when it did not exist.
    pub(crate) async fn delete(&self, id: &str) -> Result<bool, TunnelError> {
        let (status, text) = self
            .send(
                Method::DELETE,
                &format!("/api/v1/tunnel/{id}"),
                None,
                "delete tunnel",
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        check(status, &text, "delete tunnel")?;
        Ok(true)
    }

    /// Sends with retries: connect errors are retried for every method (nothing reached
    /// the server), timeouts only for GET and DELETE (a POST may have acted).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        op: &str,
    ) -> Result<(StatusCode, String), TunnelError> {
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.send_once(method.clone(), path, body.as_ref()).await {
                Ok(done) => return Ok(done),
                Err(t) => {
                    let retry = match t {
                        Transport::Connect(_) => true,
                        Transport::Timeout => method != Method::POST,
                    };
                    if !retry || attempt >= 3 {
                        return Err(match t {
                            Transport::Connect(e) => TunnelError::Connection(format!(
                                "failed to {op}: cannot reach the Prime API at {}: {e}",
                                self.account.base_url
                            )),
                            Transport::Timeout => TunnelError::Timeout(format!(
                                "failed to {op}: the Prime API did not answer within {:?}",
                                self.timeout
                            )),
                        });
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    async fn send_once(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, String), Transport> {
        let uri = format!("{}{path}", self.account.base_url);
        let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(&uri)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", self.account.api_key))
            .header(
                "user-agent",
                concat!("intercept-tunnel/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(bytes))
            .map_err(|e| Transport::Connect(format!("invalid request to {uri}: {e}")))?;
        let fut = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| Transport::Connect(format!("{e}")))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| Transport::Connect(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| Transport::Timeout)?
    }
}

/// What the Prime edge answers on the public URL of a tunnel the service has reaped.
pub const REAPED: &str = "Tunnel not found or no longer active";

/// Whether `text` (an answer of the public URL, a harness's stderr or exception) shows
/// the Prime edge's answer for a reaped tunnel ([`REAPED`], in any case).
pub fn shows_reaped(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains(&REAPED.to_ascii_lowercase())
}

impl PrimeApi {
    /// Asks the tunnel's public URL (`GET {url}/`, without credentials) whether the edge
    /// still routes it: `Some(true)` when the edge answers 404 with [`REAPED`]. `None`
    /// when the URL cannot be reached or does not answer within the API timeout (capped
    /// at 10 s): no verdict. At most 4 KiB of the answer is read.
    pub(crate) async fn edge_reaped(&self, url: &str) -> Option<bool> {
        let uri = format!("{}/", url.trim_end_matches('/'));
        let req = Request::builder()
            .method(Method::GET)
            .uri(&uri)
            // A fresh connection each time: a kept one may still be routed by the edge.
            .header("connection", "close")
            .header(
                "user-agent",
                concat!("intercept-tunnel/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::new()))
            .ok()?;
        let fut = async {
            let resp = self.client.request(req).await.ok()?;
            let status = resp.status();
            if status != StatusCode::NOT_FOUND {
                return Some(false);
            }
            let limited = http_body_util::Limited::new(resp.into_body(), 4096);
            let text = match limited.collect().await {
                Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
                // Longer than any edge answer: the tunnel's own server answered.
                Err(_) => return Some(false),
            };
            Some(shows_reaped(&text))
        };
        tokio::time::timeout(self.timeout.min(Duration::from_secs(10)), fut)
            .await
            .ok()
            .flatten()
    }
}

/// Maps an error status to a typed error with an actionable message.
pub(crate) fn check(status: StatusCode, text: &str, op: &str) -> Result<(), TunnelError> {
    if status.is_success() {
        return Ok(());
    }
    let detail = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| {
            v.get("detail")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error"))
                .map(|d| {
                    d.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| d.to_string())
                })
        })
        .unwrap_or_else(|| text.chars().take(300).collect());
    let code = status.as_u16();
    Err(match code {
        401 => TunnelError::Auth(format!(
            "failed to {op} (401): API key unauthorized; check PRIME_API_KEY or run `prime login`"
        )),
        402 => TunnelError::Payment(format!(
            "failed to {op} (402): payment required; check the billing status of the Prime account"
        )),
        400 if detail.to_ascii_lowercase().contains("maximum number of") => {
            TunnelError::LimitReached(format!(
                "failed to {op} (400): {detail}; delete unused tunnels or serve more rollouts \
                 per tunnel (raise multiplex)"
            ))
        }
        _ => TunnelError::Api {
            status: code,
            message: format!("failed to {op}: {detail}"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TunnelErrorKind;

    fn kind(status: u16, body: &str) -> (TunnelErrorKind, String) {
        let e = check(
            StatusCode::from_u16(status).unwrap(),
            body,
            "register tunnel",
        )
        .unwrap_err();
        (e.kind(), e.to_string())
    }

    #[test]
    fn status_mapping() {
        assert!(check(StatusCode::OK, "", "x").is_ok());
        assert!(check(StatusCode::NO_CONTENT, "", "x").is_ok());
        let (k, m) = kind(401, "{}");
        assert_eq!(k, TunnelErrorKind::Auth);
        assert!(m.contains("PRIME_API_KEY"), "{m}");
        let (k, m) = kind(402, "");
        assert_eq!(k, TunnelErrorKind::Payment);
        assert!(m.contains("billing"), "{m}");
        let (k, m) = kind(
            400,
            r#"{"detail":"You have reached the Maximum number of tunnels"}"#,
        );
        assert_eq!(k, TunnelErrorKind::LimitReached);
        assert!(m.contains("delete unused tunnels"), "{m}");
        let (k, m) = kind(400, r#"{"detail":"bad port"}"#);
        assert_eq!(k, TunnelErrorKind::Api);
        assert_eq!(
            m,
            "tunnel API answered 400: failed to register tunnel: bad port"
        );
        let e = check(StatusCode::BAD_GATEWAY, "<html>oops</html>", "get tunnel").unwrap_err();
        assert!(e.retryable());
        assert!(e.to_string().contains("<html>oops"), "{e}");
    }

    #[test]
    fn tunnel_info_debug_hides_secrets() {
        let info: TunnelInfo = serde_json::from_str(
            r#"{"tunnel_id":"t1","url":"https://t1.example","frp_token":"TOK","binding_secret":"BS","server_host":"h"}"#,
        )
        .unwrap();
        assert_eq!(info.server_port, 7000);
        let dbg = format!("{info:?}");
        assert!(!dbg.contains("TOK") && !dbg.contains("BS"), "{dbg}");
    }
}
