//! The pooled upstream client shared by every session of a server.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use intercept_core::{Dialect, Error, JsonBody, Upstream};

use crate::config::ServerConfig;
use crate::h1pool::{DrivenBody, H1Error, H1Pool, Timeouts};
use crate::http_body::SliceBody;

/// Incoming headers never forwarded upstream (auth, framing, hop-by-hop, signatures).
const BLOCKED: &[&str] = &[
    "authorization",
    "x-api-key",
    "accept-encoding",
    "content-encoding",
    "content-length",
    "content-type",
    "host",
    "transfer-encoding",
    "expect",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "session_id",
    "x-session-id",
    "idempotency-key",
    "content-digest",
    "content-md5",
    "digest",
    "repr-digest",
    "signature",
    "signature-input",
    "connection",
];

/// The connector of the general pooled client: TLS (HTTP/1.1 or HTTP/2 by ALPN) with the
/// `tls` feature, else plain TCP (and `https://` upstreams are refused, see
/// [`UpstreamClient::send_to`]).
#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// One HTTP(S) client with a keep-alive pool, shared by all sessions of a server.
/// Connections are pooled per upstream host; no client retries (the harness's SDK
/// retries on the relayed status). Plain `http://` upstreams use HTTP/1.1 connections
/// that each call drives itself ([`H1Pool`]); `https://` ones a general pooled client
/// (TLS, HTTP/1.1 or HTTP/2 by ALPN; only with the crate's `tls` feature).
pub(crate) struct UpstreamClient {
    /// The TLS (or plain) connector, shared by the loops' clients.
    connector: Connector,
    client: Client<Connector, SliceBody>,
    h1: Arc<H1Pool>,
}

/// The upstream URIs calls were last sent to, parsed: a call's URI is its engine's base
/// URL joined with its dialect's path, the same few pairs call after call, and joining
/// and parsing them cost ~1,700 instructions a call. Each thread keeps its own (a call
/// runs on its event loop's thread), so a lookup takes no lock. Bounded: past
/// `URI_CACHE_MAX` pairs, the oldest is forgotten.
mod uri_cache {
    use std::cell::RefCell;
    use std::collections::VecDeque;

    use http::Uri;
    use intercept_core::internal::join_url;
    use intercept_core::Error;

    /// A base URL, a dialect path, and the URI they join to.
    type CachedUri = (Box<str>, Box<str>, Uri);

    /// Pairs kept per thread (a sidecar has one upstream, or a few engines, and four
    /// dialects).
    pub(super) const URI_CACHE_MAX: usize = 32;

    thread_local! {
        pub(super) static URIS: RefCell<VecDeque<CachedUri>> = const { RefCell::new(VecDeque::new()) };
    }

    /// The URI of `path` on `base_url`, from this thread's cache or joined and parsed
    /// (and kept).
    pub(super) fn get(base_url: &str, path: &str) -> Result<Uri, Error> {
        URIS.with(|uris| {
            let mut uris = uris.borrow_mut();
            if let Some((_, _, uri)) = uris
                .iter()
                .find(|(b, p, _)| **b == *base_url && **p == *path)
            {
                return Ok(uri.clone());
            }
            let url = join_url(base_url, path);
            let uri: Uri = url.parse().map_err(|e| {
                Error::Internal(format!(
                    "the session's upstream URL `{url}` is not a valid URL: {e}"
                ))
            })?;
            if uris.len() >= URI_CACHE_MAX {
                uris.pop_front();
            }
            uris.push_back((base_url.into(), path.into(), uri.clone()));
            Ok(uri)
        })
    }
}

/// An upstream response body, from either kind of connection.
#[derive(Debug)]
pub(crate) enum UpstreamBody {
    /// A plain-HTTP/1.1 connection driven by the reader.
    Driven(DrivenBody),
    /// A connection of the general pooled client.
    Pooled(Incoming),
    /// A body made in-process: a session's generated answer, or an engine's token
    /// stream turned into the dialect's wire format.
    Made(MadeBody),
}

/// A response body made in-process ([`UpstreamBody::Made`]).
pub(crate) struct MadeBody(
    std::pin::Pin<Box<dyn http_body::Body<Data = Bytes, Error = BodyError> + Send + Sync>>,
);

impl MadeBody {
    /// A body of one piece.
    pub(crate) fn full(bytes: Bytes) -> Self {
        use http_body_util::BodyExt as _;
        MadeBody(Box::pin(
            http_body_util::Full::new(bytes).map_err(|never| match never {}),
        ))
    }

    /// Any body.
    pub(crate) fn new(
        body: impl http_body::Body<Data = Bytes, Error = BodyError> + Send + Sync + 'static,
    ) -> Self {
        MadeBody(Box::pin(body))
    }
}

impl fmt::Debug for MadeBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MadeBody")
    }
}

/// Why an upstream response body broke off.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            UpstreamBody::Driven(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Pooled(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Made(b) => b.0.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Driven(b) => b.is_end_stream(),
            UpstreamBody::Pooled(b) => b.is_end_stream(),
            UpstreamBody::Made(b) => b.0.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            UpstreamBody::Driven(b) => b.size_hint(),
            UpstreamBody::Pooled(b) => b.size_hint(),
            UpstreamBody::Made(b) => b.0.size_hint(),
        }
    }
}

/// One read of an upstream body.
#[derive(Debug)]
pub(crate) enum Read {
    /// Bytes of the body.
    Data(Bytes),
    /// A frame without data (trailers).
    Other,
    /// The body ended.
    End,
    /// The body broke off.
    Broken(BodyError),
}

impl From<Option<Result<http_body::Frame<Bytes>, BodyError>>> for Read {
    #[inline]
    fn from(frame: Option<Result<http_body::Frame<Bytes>, BodyError>>) -> Self {
        match frame {
            None => Read::End,
            Some(Err(e)) => Read::Broken(e),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => Read::Data(data),
                Err(_) => Read::Other,
            },
        }
    }
}

impl UpstreamBody {
    /// The body's next read, when the upstream sends it.
    pub(crate) async fn read(&mut self) -> Read {
        use http_body_util::BodyExt as _;
        self.frame().await.into()
    }

    /// Hands `first`, then every read the connection already holds, to `take`, while
    /// `take` wants more (it returns `true`) and fewer than `limit` bytes of data were
    /// handed over: a burst of events reaches the harness in one write, and relaying
    /// stays incremental. Never waits for the network.
    ///
    /// A driven connection is read right here, so what it holds is what was already
    /// read from the socket. A pooled connection is read by a task of the client, which
    /// hands its frames over one at a time: that task gets one turn of the scheduler to
    /// pass on what it has already read, so a burst is taken whole, not one frame per
    /// wake.
    pub(crate) async fn burst(
        &mut self,
        first: Read,
        limit: usize,
        mut take: impl FnMut(Read) -> bool,
    ) {
        use futures_util::FutureExt as _;
        use http_body_util::BodyExt as _;
        let mut read = first;
        let mut taken = 0usize;
        loop {
            if let Read::Data(data) = &read {
                taken += data.len();
            }
            if !take(read) || taken >= limit {
                return;
            }
            read = match self.frame().now_or_never() {
                Some(frame) => frame.into(),
                None => match self {
                    UpstreamBody::Driven(_) | UpstreamBody::Made(_) => return,
                    UpstreamBody::Pooled(_) => {
                        tokio::task::yield_now().await;
                        match self.frame().now_or_never() {
                            Some(frame) => frame.into(),
                            None => return,
                        }
                    }
                },
            };
        }
    }
}

impl fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UpstreamClient")
    }
}

impl UpstreamClient {
    pub(crate) fn new(config: &ServerConfig) -> Result<Self, Error> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout));
        #[cfg(feature = "tls")]
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(Arc::new(rustls::crypto::ring::default_provider()))
            .map_err(|e| Error::Internal(format!("TLS setup failed: {e}")))?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        #[cfg(not(feature = "tls"))]
        let connector = http;
        Ok(UpstreamClient::with_connector(connector, config))
    }

    /// A client for one event loop: the same connector, its own connection pools and
    /// pool (a loop's calls never wait on another loop's).
    pub(crate) fn for_loop(&self, config: &ServerConfig) -> Self {
        UpstreamClient::with_connector(self.connector.clone(), config)
    }

    fn with_connector(connector: Connector, config: &ServerConfig) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(config.upstream_idle_per_host)
            .build(connector.clone());
        let h1 = H1Pool::new(
            config.upstream_idle_per_host,
            config.connect_timeout,
            Timeouts {
                write_idle: config.upstream_write_idle,
                read_idle: config.upstream_read_idle,
            },
        );
        UpstreamClient {
            connector,
            client,
            h1,
        }
    }

    /// Builds the upstream request of a model call to one engine of `upstream`
    /// (`base_url`: one of [`Upstream::engines`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request(
        &self,
        dialect: &dyn Dialect,
        upstream: &Upstream,
        base_url: &str,
        session_id: Option<&str>,
        path: &str,
        incoming: &HeaderMap,
        body: &JsonBody,
    ) -> Result<Request<SliceBody>, Error> {
        let uri = uri_cache::get(base_url, path)?;
        let mut headers = forwardable(incoming);
        for (name, value) in &upstream.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                headers.insert(n, v);
            }
        }
        if let Some(Ok(v)) = session_id.map(HeaderValue::try_from) {
            headers.insert(HeaderName::from_static("x-session-id"), v);
        }
        dialect.upstream_headers(&mut headers);
        if let Some(key) = &upstream.api_key {
            dialect.upstream_auth(key, &mut headers);
        }
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut req = Request::post(uri)
            .body(SliceBody::new(body.chunks()))
            .map_err(|e| Error::Internal(format!("cannot build the upstream request: {e}")))?;
        *req.headers_mut() = headers;
        Ok(req)
    }

    /// Builds the request of a call on the token path: `body` posted to the engine's
    /// token endpoint `path` on `base_url` without its `/v1` (vLLM mounts
    /// `/inference/v1/generate` at the server's root), with the upstream's headers and
    /// its key as a bearer token.
    pub(crate) fn engine_request(
        &self,
        upstream: &Upstream,
        base_url: &str,
        path: &str,
        session_id: &str,
        body: Bytes,
    ) -> Result<Request<SliceBody>, Error> {
        let trimmed = base_url.trim_end_matches('/');
        let root = trimmed.strip_suffix("/v1").unwrap_or(trimmed);
        let uri = uri_cache::get(root, path)?;
        let mut headers = HeaderMap::new();
        for (name, value) in &upstream.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                headers.insert(n, v);
            }
        }
        if let Ok(v) = HeaderValue::try_from(session_id) {
            headers.insert(HeaderName::from_static("x-session-id"), v);
        }
        if let Some(Ok(v)) = upstream
            .api_key
            .as_deref()
            .map(|key| HeaderValue::try_from(format!("Bearer {key}")))
        {
            headers.insert(http::header::AUTHORIZATION, v);
        }
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut req = Request::post(uri)
            .body(SliceBody::new(vec![body]))
            .map_err(|e| Error::Internal(format!("cannot build the engine request: {e}")))?;
        *req.headers_mut() = headers;
        Ok(req)
    }

    /// Builds a bodiless `GET` of `path` on `base_url` (one of the upstream's engines),
    /// with the upstream's headers and its key in `dialect`'s auth header.
    pub(crate) fn get(
        &self,
        dialect: &dyn Dialect,
        upstream: &Upstream,
        base_url: &str,
        path: &str,
    ) -> Result<Request<SliceBody>, Error> {
        let uri = uri_cache::get(base_url, path)?;
        let mut headers = HeaderMap::new();
        for (name, value) in &upstream.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                headers.insert(n, v);
            }
        }
        dialect.upstream_headers(&mut headers);
        if let Some(key) = &upstream.api_key {
            dialect.upstream_auth(key, &mut headers);
        }
        let mut req = Request::get(uri)
            .body(SliceBody::new(Vec::new()))
            .map_err(|e| Error::Internal(format!("cannot build the upstream request: {e}")))?;
        *req.headers_mut() = headers;
        Ok(req)
    }

    /// Sends a request; transport failures become typed errors (timeouts 504, the rest 503).
    pub(crate) async fn send(
        &self,
        req: Request<SliceBody>,
    ) -> Result<Response<UpstreamBody>, Error> {
        self.send_to(req).await.map_err(|f| f.error)
    }

    /// Sends a request; a failure says whether the connection could not be made at all
    /// (then the request was never sent, and another engine may take it).
    pub(crate) async fn send_to(
        &self,
        req: Request<SliceBody>,
    ) -> Result<Response<UpstreamBody>, SendFailure> {
        // For errors only: a shared slice of the URI, no copy.
        let authority = req.uri().authority().cloned();
        let host = authority.as_ref().map_or("", |a| a.as_str());
        if req.uri().scheme_str() == Some("http") {
            return match self.h1.send(req).await {
                Ok(resp) => Ok(resp.map(UpstreamBody::Driven)),
                Err(e) => Err(h1_failure(host, e)),
            };
        }
        #[cfg(not(feature = "tls"))]
        if req.uri().scheme_str() == Some("https") {
            return Err(SendFailure {
                error: Error::Internal(format!(
                    "the upstream {host} is `https://`, and this intercept-server was built \
                     without its `tls` feature (plain HTTP only)"
                )),
                // Nothing was sent: another (plain-HTTP) engine may take the call.
                connect: true,
            });
        }
        match self.client.request(req).await {
            Ok(resp) => Ok(resp.map(UpstreamBody::Pooled)),
            Err(e) => Err(SendFailure {
                error: transport_error(host, &e),
                connect: e.is_connect(),
            }),
        }
    }
}

/// A request that got no response.
#[derive(Debug)]
pub(crate) struct SendFailure {
    pub(crate) error: Error,
    /// No connection could be made: the request never left.
    pub(crate) connect: bool,
}

/// Maps a plain-HTTP/1.1 failure like [`transport_error`] does a pooled client's.
fn h1_failure(host: &str, e: H1Error) -> SendFailure {
    let (io, connect) = match e {
        H1Error::Connect(io) => (io, true),
        H1Error::ConnectTimeout => (
            std::io::Error::new(std::io::ErrorKind::TimedOut, "connecting timed out"),
            true,
        ),
        H1Error::Exchange(io) => (io, false),
    };
    let error = if io.kind() == std::io::ErrorKind::TimedOut {
        Error::UpstreamTimeout(format!("no answer from {host}: {io}"))
    } else if connect {
        Error::UpstreamUnavailable(format!("cannot connect to {host}: {io}"))
    } else {
        Error::UpstreamUnavailable(format!("connection to {host} failed: {io}"))
    };
    SendFailure { error, connect }
}

/// Maps a client error to [`Error::UpstreamTimeout`] or [`Error::UpstreamUnavailable`].
fn transport_error(host: &str, e: &(dyn std::error::Error + 'static)) -> Error {
    let mut causes = Vec::new();
    let mut timed_out = false;
    let mut source = e.source();
    while let Some(s) = source {
        timed_out |= is_timeout(s);
        causes.push(s.to_string());
        source = s.source();
    }
    let cause = if causes.is_empty() {
        e.to_string()
    } else {
        causes.join(": ")
    };
    if timed_out {
        Error::UpstreamTimeout(format!("no answer from {host}: {cause}"))
    } else if e
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(|e| e.is_connect())
    {
        Error::UpstreamUnavailable(format!("cannot connect to {host}: {cause}"))
    } else {
        Error::UpstreamUnavailable(format!("connection to {host} failed: {cause}"))
    }
}

/// Whether one cause of a transport failure is a timeout, by its type: an I/O error of
/// kind `TimedOut` (the connector's connect timeout is one), a hyper timeout or an
/// elapsed tokio timer.
fn is_timeout(cause: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(io) = cause.downcast_ref::<std::io::Error>() {
        return io.kind() == std::io::ErrorKind::TimedOut;
    }
    if let Some(h) = cause.downcast_ref::<hyper::Error>() {
        return h.is_timeout();
    }
    cause.is::<tokio::time::error::Elapsed>()
}

/// The incoming headers minus those never forwarded (and those `Connection` names).
fn forwardable(incoming: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = incoming
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(incoming.len());
    for (name, value) in incoming {
        let n = name.as_str();
        if BLOCKED.contains(&n) || named.iter().any(|c| c == n) || n.starts_with("x-intercept-") {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// Reads a whole body into one buffer, sized from its length hint.
pub(crate) async fn read_all<B>(body: B, limit: u64) -> Result<Bytes, ReadError<B::Error>>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let hint = http_body::Body::size_hint(&body);
    if hint.lower() > limit {
        return Err(ReadError::TooLarge {
            received: 0,
            declared: Some(hint.lower()),
        });
    }
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut buf: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ReadError::Body)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let total =
            first.as_ref().map_or(0, Bytes::len) + buf.as_ref().map_or(0, |b| b.len()) + data.len();
        if total as u64 > limit {
            return Err(ReadError::TooLarge {
                received: total as u64,
                declared: None,
            });
        }
        match (&mut first, &mut buf) {
            (None, None) => first = Some(data),
            (Some(f), None) => {
                let cap =
                    (hint.exact().or(hint.upper()).unwrap_or(0) as usize).max(f.len() + data.len());
                let mut b = bytes::BytesMut::with_capacity(cap);
                b.extend_from_slice(f);
                b.extend_from_slice(&data);
                first = None;
                buf = Some(b);
            }
            (_, Some(b)) => b.extend_from_slice(&data),
        }
    }
    Ok(match (first, buf) {
        (_, Some(b)) => b.freeze(),
        // A small body arrived in one frame: that frame is a slice of the connection's
        // read buffer. Copy it, so a record holding the body does not keep the whole
        // buffer alive.
        (Some(f), None) if f.len() < SMALL_BODY => Bytes::copy_from_slice(&f),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    })
}

/// Bodies below this size are copied out of the connection's read buffer.
const SMALL_BODY: usize = 64 * 1024;

/// Why a body could not be read.
#[derive(Debug)]
pub(crate) enum ReadError<E> {
    /// Over the limit: `declared` by the length the body announced (nothing was read),
    /// or after `received` bytes.
    TooLarge {
        received: u64,
        declared: Option<u64>,
    },
    Body(E),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the `tls` feature an `https://` upstream is refused, naming the feature,
    /// and nothing is sent (`cargo test -p intercept-server --no-default-features`).
    #[cfg(not(feature = "tls"))]
    #[tokio::test]
    async fn https_without_the_tls_feature_names_it() {
        let client = UpstreamClient::new(&ServerConfig::default()).expect("client");
        let req = Request::post("https://api.example.invalid/v1/chat/completions")
            .body(SliceBody::new(Vec::new()))
            .expect("request");
        let failure = client.send_to(req).await.expect_err("refused");
        assert!(failure.connect, "nothing was sent");
        let text = failure.error.to_string();
        assert!(text.contains("`tls` feature"), "{text}");
        assert!(text.contains("api.example.invalid"), "{text}");
    }

    #[test]
    fn forwards_feature_headers_and_drops_auth_and_framing() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer secret"),
            ("x-api-key", "secret"),
            ("openai-beta", "assistants=v2"),
            ("x-stainless-retry-count", "0"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("content-length", "10"),
            ("x-intercept-state-route", "r1"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = forwardable(&h);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["openai-beta", "x-stainless-retry-count"]);
    }

    #[test]
    fn request_carries_session_auth_and_body() {
        let mut incoming = HeaderMap::new();
        incoming.insert(
            "authorization",
            HeaderValue::from_static("Bearer harness-secret"),
        );
        let upstream = Upstream::new("http://127.0.0.1:1/v1").with_api_key("sk-up");
        let body = JsonBody::parse(Bytes::from_static(b"{\"messages\":[]}")).expect("body");
        let client = UpstreamClient::new(&ServerConfig::default()).expect("client");
        let req = client
            .request(
                &intercept_core::ChatDialect,
                &upstream,
                &upstream.base_url,
                Some("r-1"),
                "/chat/completions",
                &incoming,
                &body,
            )
            .expect("request");
        assert_eq!(req.uri(), "http://127.0.0.1:1/v1/chat/completions");
        assert_eq!(req.headers()["authorization"], "Bearer sk-up");
        assert_eq!(req.headers()["x-session-id"], "r-1");
        assert_eq!(req.headers()["content-type"], "application/json");
        assert_eq!(http_body::Body::size_hint(req.body()).exact(), Some(15));
    }

    #[test]
    fn upstream_uris_are_joined_once_per_pair_and_the_cache_stays_bounded() {
        use uri_cache::URI_CACHE_MAX;
        let kept = || uri_cache::URIS.with(|u| u.borrow().len());
        let a = uri_cache::get("http://h:1/v1", "/v1/chat/completions").expect("uri");
        assert_eq!(a, "http://h:1/v1/chat/completions");
        let before = kept();
        let again = uri_cache::get("http://h:1/v1", "/v1/chat/completions").expect("uri");
        assert_eq!(again, a);
        assert_eq!(kept(), before, "the second call was served from the cache");
        let other = uri_cache::get("http://h:1/v1", "/v1/messages").expect("uri");
        assert_eq!(other, "http://h:1/v1/messages");
        for port in 0..(URI_CACHE_MAX as u16 + 10) {
            let base = format!("http://h:{port}/v1");
            let uri = uri_cache::get(&base, "/v1/chat/completions").expect("uri");
            assert_eq!(uri.port_u16(), Some(port));
        }
        assert_eq!(kept(), URI_CACHE_MAX);
        let bad = uri_cache::get("http://bad host", "/v1/chat/completions");
        assert!(bad.is_err_and(|e| e.to_string().contains("not a valid URL")));
        assert_eq!(kept(), URI_CACHE_MAX, "an invalid URL is not kept");
    }
}
